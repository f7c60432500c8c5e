package bridge

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/agentfleet/agentfleet/agent"
)

// Defaults of Config.
const (
	DefaultMaxLineBytes = 8 << 20
	DefaultMaxTries     = 5
)

// Config configures the bridge backend.
type Config struct {
	// URL is where each turn is POSTed (http or https). Required.
	URL string
	// Token, when set, is sent as "Authorization: Bearer <Token>". It is
	// never logged.
	Token string
	// Client sends the requests. Defaults to a client without a timeout:
	// the turn's deadline bounds each request.
	Client *http.Client
	// MaxLineBytes bounds one event line. Defaults to DefaultMaxLineBytes.
	MaxLineBytes int
	// MaxTries bounds the tries of a turn request that fails before the
	// agent answered (a refused connection, 429, 502, 503, 504), with
	// exponential backoff, within the turn's deadline. Defaults to
	// DefaultMaxTries.
	MaxTries int
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// Backend is the bridge backend: every session's agent is the same
// stateless client of the agent at Config.URL.
type Backend struct {
	cfg   Config
	agent *Agent
}

var _ agent.Backend = (*Backend)(nil)

// New checks cfg and returns the backend.
func New(cfg Config) (*Backend, error) {
	u, err := url.Parse(cfg.URL)
	if cfg.URL == "" {
		return nil, errors.New("bridge: the agent URL (agent.bridge.url) is required")
	}
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("bridge: agent URL %q: want an http or https URL", cfg.URL)
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	if cfg.MaxLineBytes <= 0 {
		cfg.MaxLineBytes = DefaultMaxLineBytes
	}
	if cfg.MaxTries <= 0 {
		cfg.MaxTries = DefaultMaxTries
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Backend{cfg: cfg, agent: &Agent{cfg: cfg}}, nil
}

// NewAgent implements agent.Backend.
func (b *Backend) NewAgent(context.Context, string, string) (agent.Agent, error) { return b.agent, nil }

// Close closes the idle connections to the agent.
func (b *Backend) Close() error {
	b.cfg.Client.CloseIdleConnections()
	return nil
}

// Agent runs turns through the agent at the configured URL. It is safe for
// concurrent use.
type Agent struct {
	cfg Config
}

var _ agent.Agent = (*Agent)(nil)

// Close does nothing: the backend owns the connections.
func (a *Agent) Close() error { return nil }

// AgentError is the error of a turn the agent ended with an error event,
// or answered with an HTTP error.
type AgentError struct {
	// Status is the HTTP status of a refused request, 0 for an error event.
	Status  int
	Message string
}

func (e *AgentError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("bridge agent answered %d: %s", e.Status, e.Message)
	}
	return "bridge agent error: " + e.Message
}

// ErrNoFinal is the error of a response that ended without a final or an
// error event.
var ErrNoFinal = errors.New("bridge agent ended its answer without a final or error event")

// Run implements agent.Agent: it POSTs the turn and turns the events it
// reads back into emitter calls, until the final or error event.
func (a *Agent) Run(ctx context.Context, t *agent.Turn, emit agent.Emitter) (*agent.Result, error) {
	body, err := json.Marshal(requestOf(t))
	if err != nil {
		return nil, fmt.Errorf("bridge: encode turn: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // closing the request is the agent's cancellation
	resp, err := backoff.Retry(ctx, func() (*http.Response, error) { return a.post(ctx, body) },
		backoff.WithMaxTries(uint(a.cfg.MaxTries)), backoff.WithMaxElapsedTime(0),
		backoff.WithNotify(func(err error, d time.Duration) {
			a.cfg.Logger.WarnContext(ctx, "bridge agent not reachable; retrying", slog.String("turn_id", t.TurnID),
				slog.Duration("in", d), slog.Any("error", err))
		}))
	if err != nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, err
	}
	defer resp.Body.Close()

	var partial strings.Builder
	cut := func(err error) (*agent.Result, error) {
		var res *agent.Result
		if partial.Len() > 0 {
			res = &agent.Result{Text: partial.String(), FinishReason: "interrupted"}
		}
		return res, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), a.cfg.MaxLineBytes)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var ev Event
		if err := json.Unmarshal(line, &ev); err != nil {
			return cut(fmt.Errorf("bridge: bad event line %.200q: %w", line, err))
		}
		var err error
		switch ev.Type {
		case EventDelta:
			partial.WriteString(ev.Text)
			err = emit.Delta(ctx, ev.Text)
		case EventMessage:
			err = emit.Message(ctx, ev.Text)
		case EventToolCall:
			if ev.ID == "" || ev.Name == "" {
				return cut(fmt.Errorf("bridge: tool_call event without an id or a name: %.200q", line))
			}
			err = emit.ToolCall(ctx, agent.ToolCall{ID: ev.ID, Name: ev.Name, Arguments: ev.Arguments})
		case EventToolResult:
			if ev.ID == "" {
				return cut(fmt.Errorf("bridge: tool_result event without an id: %.200q", line))
			}
			err = emit.ToolResult(ctx, ev.ID, ev.Name, ev.Content)
		case EventUsage:
			err = emit.Usage(ctx, agent.Usage{InputTokens: ev.InputTokens, OutputTokens: ev.OutputTokens,
				CacheReadTokens: ev.CacheReadTokens, CacheWriteTokens: ev.CacheWriteTokens,
				EstimatedCostUSD: ev.EstimatedCostUSD, CostStatus: ev.CostStatus, PromptTokens: ev.PromptTokens})
		case EventFinal:
			return &agent.Result{Text: ev.Text, Reasoning: ev.Reasoning, FinishReason: ev.FinishReason}, nil
		case EventError:
			msg := ev.Message
			if msg == "" {
				msg = "(no message)"
			}
			return cut(&AgentError{Message: msg})
		default:
			// An event type of a newer protocol: skipped.
		}
		if err != nil {
			return cut(err)
		}
	}
	if ctx.Err() != nil {
		return cut(context.Cause(ctx))
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			err = fmt.Errorf("an event line is longer than %d bytes", a.cfg.MaxLineBytes)
		}
		return cut(fmt.Errorf("bridge: reading events: %w", err))
	}
	return cut(ErrNoFinal)
}

// post sends one try of the turn request. Errors worth another try are
// returned as they are; the others are permanent.
func (a *Agent) post(ctx context.Context, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return nil, backoff.Permanent(err)
	}
	req.Header.Set("Content-Type", RequestContentType)
	req.Header.Set("Accept", EventsContentType)
	if a.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+a.cfg.Token)
	}
	resp, err := a.cfg.Client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, backoff.Permanent(context.Cause(ctx))
		}
		return nil, fmt.Errorf("bridge: %w", err) // the agent may be restarting
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	resp.Body.Close()
	aerr := &AgentError{Status: resp.StatusCode, Message: strings.TrimSpace(string(msg))}
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			return nil, backoff.RetryAfter(s)
		}
		return nil, aerr
	}
	return nil, backoff.Permanent(aerr)
}
