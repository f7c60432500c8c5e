package worker

import (
	"context"
	"fmt"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
)

// emitter persists what the agent produces during a turn.
type emitter struct {
	l      *lane
	st     *txState
	intent *session.TurnIntent
	src    session.SessionSource
	// sessionKey is the lane's, read once by the runner (the agent
	// goroutine must not read l.entry).
	sessionKey string
	n          int
	deltas     int
	usage      agent.Usage
	err        error // the first durable-write failure, set by the agent goroutine
}

func (e *emitter) fail(err error) error {
	if err != nil && e.err == nil {
		e.err = err
	}
	return err
}

func (e *emitter) nextID(kind string) string {
	e.n++
	return fmt.Sprintf("%s:a%d:%s%d", e.intent.ID, e.intent.Attempt, kind, e.n)
}

func (e *emitter) Delta(ctx context.Context, text string) error {
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	if text == "" || !e.l.alive() {
		return nil
	}
	e.deltas++
	data, err := jsonMarshal(session.Delta{SessionKey: e.sessionKey, SessionID: e.st.sessionID, TurnID: e.intent.ID,
		Attempt: e.intent.Attempt, N: e.deltas, Text: text})
	if err != nil {
		return nil
	}
	// Ephemeral: a failed publish costs a listener some typing, nothing else.
	_ = e.l.w.nc.Publish(e.l.w.names.DeltaSubject(e.l.lane), data)
	return nil
}

func (e *emitter) Message(ctx context.Context, text string) error {
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	if text == "" {
		return nil
	}
	en := transcript.Entry{ID: e.nextID(interimTag), Kind: transcript.KindMessage, Role: transcript.RoleAssistant, Content: text,
		FinishReason: "interim", TurnID: e.intent.ID, Timestamp: e.l.w.cfg.Now()}
	if err := e.l.append(e.st, &en); err != nil {
		return e.fail(err)
	}
	return e.fail(e.l.publishReplyAs(e.sessionKey, e.st, e.intent, en, session.ReplyKindReply, e.src))
}

func (e *emitter) ToolCall(ctx context.Context, call agent.ToolCall) error {
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	en := transcript.Entry{ID: e.nextID("e"), Kind: transcript.KindMessage, Role: "assistant", ToolCalls: []transcript.ToolCall{{ID: call.ID, Name: call.Name, Arguments: call.Arguments}},
		TurnID: e.intent.ID, Timestamp: e.l.w.cfg.Now()}
	return e.fail(e.l.append(e.st, &en))
}

func (e *emitter) ToolResult(ctx context.Context, callID, name, content string) error {
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	en := transcript.Entry{ID: e.nextID("e"), Kind: transcript.KindMessage, Role: "tool", ToolCallID: callID, ToolName: name,
		Content: content, TurnID: e.intent.ID, Timestamp: e.l.w.cfg.Now()}
	return e.fail(e.l.append(e.st, &en))
}

func (e *emitter) Usage(_ context.Context, u agent.Usage) error {
	e.usage.Add(u)
	return nil
}
