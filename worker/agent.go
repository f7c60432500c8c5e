package worker

import (
	"context"
	"errors"
	"fmt"

	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
)

// Agent runs turns for one session. Implementations must return promptly
// when ctx is cancelled (a user interrupt, a lost lease, a drain timeout);
// what they emitted so far stays in the transcript.
type Agent interface {
	Run(ctx context.Context, t *Turn, emit Emitter) (*Result, error)
}

// AgentFunc adapts a function to Agent.
type AgentFunc func(ctx context.Context, t *Turn, emit Emitter) (*Result, error)

// Run calls f.
func (f AgentFunc) Run(ctx context.Context, t *Turn, emit Emitter) (*Result, error) {
	return f(ctx, t, emit)
}

// Backend creates the agent of a session. The worker caches agents by
// (session key, session id); an agent that implements Close is closed when
// it leaves the cache.
type Backend interface {
	NewAgent(sessionKey, sessionID string) (Agent, error)
}

// BackendFunc adapts a function to Backend.
type BackendFunc func(sessionKey, sessionID string) (Agent, error)

// NewAgent calls f.
func (f BackendFunc) NewAgent(sessionKey, sessionID string) (Agent, error) {
	return f(sessionKey, sessionID)
}

// Turn is what an agent gets for one turn.
type Turn struct {
	SessionKey string
	SessionID  string
	TurnID     string
	Source     session.SessionSource
	// ContextPrompt is the session context section of the system prompt.
	ContextPrompt string
	// Notes are system notes for this turn only (restart resume, auto-reset).
	Notes []string
	// FreshReset marks the first turn after an explicit /new or /reset (the
	// entry's is_fresh_reset): the moment to inject topic or channel context
	// again. Commands in between (a /status) do not consume it.
	FreshReset bool
	// History is the effective transcript of the session, ending with this
	// turn's user messages (on a resumed turn it also holds what the
	// interrupted attempt produced).
	History []transcript.Entry
	// Messages are the user messages this turn incorporates, in inbox order.
	Messages []UserMessage
	// Steer is set when the lane's busy mode is steer: it returns the plain
	// messages that arrived since the turn started (or since the last call),
	// after recording them in the turn (their user entries are durable before
	// it returns). Messages an agent never takes are the next turn's.
	Steer func(ctx context.Context) ([]UserMessage, error)
}

// UserMessage is one user message of a turn.
type UserMessage struct {
	InboxSeq   uint64
	Text       string
	SenderName string
}

// Emitter persists what an agent produces, in order, each entry durable
// before the call returns. An error means the turn must stop (the lease was
// lost or the store failed); the agent returns it.
type Emitter interface {
	// ToolCall records a tool call before the tool runs.
	ToolCall(ctx context.Context, call transcript.ToolCall) error
	// ToolResult records a tool's result.
	ToolResult(ctx context.Context, callID, name, content string) error
}

// Result is a finished turn's outcome.
type Result struct {
	// Text is the assistant's reply to the user; empty sends nothing.
	Text         string
	Reasoning    string
	FinishReason string
	InputTokens  int64
	OutputTokens int64
}

// PanicError is returned for an agent that panicked.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("agent panicked: %v", e.Value) }

// ErrTurnInterrupted is the cancellation cause of a turn interrupted by the user.
var ErrTurnInterrupted = errors.New("turn interrupted by a newer message")
