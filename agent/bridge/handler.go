package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"sync"

	"github.com/agentfleet/agentfleet/agent"
)

// MaxRequestBytes bounds the body of a turn request Handler accepts.
const MaxRequestBytes = 64 << 20

// Handler serves a Go agent over the bridge protocol: each POST runs one
// turn of a, streaming its emitter calls as events and ending with the
// final or error event. A client that closes the request cancels the turn.
// a is asked for nothing else (no Close): its owner closes it. A panic in
// a's Run ends the turn with an error event. Steering is not part of the
// protocol: Turn.Steer is nil.
func Handler(a agent.Agent, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "POST a turn", http.StatusMethodNotAllowed)
			return
		}
		var req Request
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxRequestBytes)).Decode(&req); err != nil {
			http.Error(w, "bad turn request: "+err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", EventsContentType)
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
		e := &eventWriter{w: w, rc: http.NewResponseController(w)}
		_ = e.rc.Flush() // the answer starts now, whatever the agent takes
		res, err := run(r.Context(), a, turnOf(&req), e)
		switch {
		case err != nil:
			if r.Context().Err() == nil {
				log.WarnContext(r.Context(), "bridge turn failed", slog.String("turn_id", req.TurnID), slog.Any("error", err))
			}
			_ = e.write(Event{Type: EventError, Message: err.Error()})
		case res == nil:
			_ = e.write(Event{Type: EventFinal})
		default:
			_ = e.write(Event{Type: EventFinal, Text: res.Text, Reasoning: res.Reasoning, FinishReason: res.FinishReason})
		}
	})
}

func run(ctx context.Context, a agent.Agent, t *agent.Turn, emit agent.Emitter) (res *agent.Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &agent.PanicError{Value: p, Stack: debug.Stack()}
		}
	}()
	return a.Run(ctx, t, emit)
}

// eventWriter writes events as lines, each flushed at once.
type eventWriter struct {
	mu sync.Mutex
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (e *eventWriter) write(ev Event) error {
	line, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := e.w.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("bridge: write event: %w", err)
	}
	if err := e.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return fmt.Errorf("bridge: flush event: %w", err)
	}
	return nil
}

func (e *eventWriter) checked(ctx context.Context, ev Event) error {
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	return e.write(ev)
}

func (e *eventWriter) Delta(ctx context.Context, text string) error {
	return e.checked(ctx, Event{Type: EventDelta, Text: text})
}

func (e *eventWriter) Message(ctx context.Context, text string) error {
	return e.checked(ctx, Event{Type: EventMessage, Text: text})
}

func (e *eventWriter) ToolCall(ctx context.Context, c agent.ToolCall) error {
	return e.checked(ctx, Event{Type: EventToolCall, ID: c.ID, Name: c.Name, Arguments: c.Arguments})
}

func (e *eventWriter) ToolResult(ctx context.Context, callID, name, content string) error {
	return e.checked(ctx, Event{Type: EventToolResult, ID: callID, Name: name, Content: content})
}

func (e *eventWriter) Usage(ctx context.Context, u agent.Usage) error {
	return e.checked(ctx, Event{Type: EventUsage, InputTokens: u.InputTokens, OutputTokens: u.OutputTokens,
		CacheReadTokens: u.CacheReadTokens, CacheWriteTokens: u.CacheWriteTokens, EstimatedCostUSD: u.EstimatedCostUSD,
		CostStatus: u.CostStatus, PromptTokens: u.PromptTokens})
}
