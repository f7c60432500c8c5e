// Package agent is the contract between the fleet and an agent: what a
// backend implements (Backend, Agent) and what it is given (Turn, Message,
// Emitter). It imports only the standard library and the session domain,
// so a backend built on it imports nothing of the fleet (no NATS, no KV, no
// worker).
//
// A worker asks its Backend for one Agent per session (session key and
// session id) and keeps it in a bounded cache; each turn of that session
// calls Agent.Run with the Turn and an Emitter. Everything the agent wants
// recorded before the turn ends (tool calls and their results, interim
// messages) goes through the Emitter, which returns only once the entry is
// durable; the final reply is the Result.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/agentfleet/agentfleet/session"
)

// Agent runs turns for one session.
//
// Run must return promptly when ctx is cancelled (a user interrupt, a lost
// lease, a drain, the turn's deadline), returning context.Cause(ctx) or an
// error wrapping it; what it emitted so far stays in the transcript. An
// error that is not the context's ends the turn as failed: the user is
// told, and the turn is not retried.
//
// A panic in Run is contained by the worker and reported as a *PanicError
// (a failed turn), never a crash of the worker.
//
// Close releases what the agent holds (connections, processes). The worker
// calls it once, when the agent leaves its cache, never during Run.
type Agent interface {
	Run(ctx context.Context, t *Turn, emit Emitter) (*Result, error)
	io.Closer
}

// AgentFunc adapts a function to Agent; its Close does nothing.
type AgentFunc func(ctx context.Context, t *Turn, emit Emitter) (*Result, error)

// Run calls f.
func (f AgentFunc) Run(ctx context.Context, t *Turn, emit Emitter) (*Result, error) {
	return f(ctx, t, emit)
}

// Close does nothing.
func (AgentFunc) Close() error { return nil }

// Backend creates the agent of a session.
//
// NewAgent is called when a worker first runs a turn of a session it has no
// cached agent for (a new session, or one last served by another worker):
// ctx bounds the creation only. The agent must not depend on having seen
// earlier turns: every Turn carries the session's history.
//
// Close releases what the backend shares between its agents (tool servers,
// HTTP clients). Whoever created the backend closes it, after every worker
// using it has stopped; workers never close their backend.
type Backend interface {
	NewAgent(ctx context.Context, sessionKey, sessionID string) (Agent, error)
	io.Closer
}

// BackendFunc adapts a function to Backend; its Close does nothing.
type BackendFunc func(ctx context.Context, sessionKey, sessionID string) (Agent, error)

// NewAgent calls f.
func (f BackendFunc) NewAgent(ctx context.Context, sessionKey, sessionID string) (Agent, error) {
	return f(ctx, sessionKey, sessionID)
}

// Close does nothing.
func (BackendFunc) Close() error { return nil }

// Turn is what an agent gets for one turn.
type Turn struct {
	SessionKey string
	SessionID  string
	TurnID     string
	// Attempt counts the runs of this turn: 1, then one more each time an
	// interrupted run (a crash, a drain, a lost lease) is resumed.
	Attempt int
	Source  session.SessionSource
	// ContextPrompt is the session context section of the system prompt.
	ContextPrompt string
	// Notes are system notes for this turn only (restart resume, auto-reset).
	Notes []string
	// FreshReset marks the first turn after an explicit /new or /reset (the
	// entry's is_fresh_reset): the moment to inject topic or channel context
	// again. Commands in between (a /status) do not consume it.
	FreshReset bool
	// History is the effective conversation of the session, oldest first,
	// ending with this turn's user messages (on a resumed turn it also holds
	// what the interrupted attempt produced). It is shared: read it, never
	// modify it.
	History []Message
	// Messages are the user messages this turn incorporates, in inbox order.
	Messages []UserMessage
	// Quote is the reply context of the turn: the newest quote among
	// Messages (a merged turn takes the latest quote fields), or nil. The
	// turn's reply anchor is its newest message, Source.MessageID.
	Quote *session.Quote
	// Steer is set when the lane's busy mode is steer: it returns the plain
	// messages that arrived since the turn started (or since the last call),
	// after recording them in the turn (their user entries are durable before
	// it returns). Messages an agent never takes are the next turn's.
	Steer func(ctx context.Context) ([]UserMessage, error)
}

// Message roles.
const (
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
	RoleSystem    = "system"
)

// Message is one entry of a session's conversation history.
type Message struct {
	// Role is RoleUser, RoleAssistant, RoleTool or RoleSystem.
	Role    string
	Content string
	// ToolCalls are the tool calls of an assistant message.
	ToolCalls []ToolCall
	// ToolCallID and ToolName identify the call a tool message answers.
	ToolCallID string
	ToolName   string
	Reasoning  string
	// SenderName is the display name of a user message's sender.
	SenderName string
	// Attachments and Quote are, on user messages, the files the message
	// carried and the message it replied to (see UserMessage).
	Attachments []session.Attachment
	Quote       *session.Quote
	// InboxSeq is, on user messages, the inbox sequence they came from.
	InboxSeq uint64
	// TurnID is the turn that wrote the message.
	TurnID string
	// Seq is the message's position in the session's transcript: it grows
	// with every entry, so an agent may key state of its own by it.
	Seq       uint64
	Timestamp time.Time
}

// UserMessage is one user message of a turn.
type UserMessage struct {
	InboxSeq uint64
	// Text is the user's text; on a message with attachments, the caption
	// (possibly empty).
	Text       string
	SenderName string
	// MessageID is the platform's id of the message, when it gave one.
	MessageID string
	// Attachments are the files the message carries, as references: Kind,
	// the platform FileID, a URL the agent can fetch the bytes from (for
	// Telegram, Slack and WhatsApp, the ingress's media endpoint, so no token is
	// ever in it), MimeType, Size, Name and Caption. Photos of a burst
	// arrive together in one turn; a voice note, audio, a video or a
	// document is always a turn of its own.
	Attachments []session.Attachment
	// Quote is the message this one replies to or quotes (id, text,
	// sender), when there is one.
	Quote *session.Quote
}

// ToolCall is one tool call of an assistant message. Arguments is the
// call's JSON arguments as the model wrote them.
type ToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Emitter persists what an agent produces, in order, each durable entry
// stored before the call returns. An error means the turn must stop (the
// lease was lost or the store failed): the agent returns it. An Emitter is
// for the turn it was given with only, and not safe for concurrent use.
type Emitter interface {
	// Delta streams a piece of the reply being written, for clients that
	// render typing. It is ephemeral: published to the lane's live
	// listeners, never stored, never a reply of its own; the reply is still
	// the Result's Text (or the Messages). It does not wait for listeners
	// and fails only when ctx is done.
	Delta(ctx context.Context, text string) error
	// Message records an interim assistant message ("looking that up…") and
	// delivers it to the user as a reply of its own, before the turn ends.
	Message(ctx context.Context, text string) error
	// ToolCall records a tool call before the tool runs.
	ToolCall(ctx context.Context, call ToolCall) error
	// ToolResult records a tool's result.
	ToolResult(ctx context.Context, callID, name, content string) error
	// Usage reports what a model call consumed. Calls add up; the turn's
	// total lands in the session's counters when the turn ends (completed,
	// failed or interrupted), so report each call as soon as it is known.
	Usage(ctx context.Context, u Usage) error
}

// Cost statuses of a Usage (the session entry's cost_status).
const (
	// CostEstimated: EstimatedCostUSD was computed from a price table.
	CostEstimated = "estimated"
	// CostIncluded: the provider reported the cost itself.
	CostIncluded = "included"
	// CostUnknown: no price is known for the model.
	CostUnknown = "unknown"
)

// Usage is what one or more model calls consumed.
type Usage struct {
	InputTokens      int64
	OutputTokens     int64
	CacheReadTokens  int64
	CacheWriteTokens int64
	// EstimatedCostUSD is the cost in US dollars, when known.
	EstimatedCostUSD float64
	// CostStatus is CostEstimated, CostIncluded or CostUnknown (empty
	// reads as unknown).
	CostStatus string
	// PromptTokens is the size of the latest prompt sent to the model (its
	// context window use); the session keeps the last one reported.
	PromptTokens int64
}

// Add adds u2 to u: token counts and cost add up, the latest non-zero
// PromptTokens wins, and a cost status other than estimated or included
// on either side makes the sum unknown.
func (u *Usage) Add(u2 Usage) {
	u.InputTokens += u2.InputTokens
	u.OutputTokens += u2.OutputTokens
	u.CacheReadTokens += u2.CacheReadTokens
	u.CacheWriteTokens += u2.CacheWriteTokens
	u.EstimatedCostUSD += u2.EstimatedCostUSD
	if u2.PromptTokens > 0 {
		u.PromptTokens = u2.PromptTokens
	}
	u.CostStatus = MergeCostStatus(u.CostStatus, u2.CostStatus)
}

// MergeCostStatus is the cost status of a sum of two costs: empty counts
// for nothing, equal statuses stay, estimated with included is estimated,
// anything else is unknown.
func MergeCostStatus(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "" || a == b:
		return a
	case known(a) && known(b):
		return CostEstimated
	}
	return CostUnknown
}

func known(s string) bool { return s == CostEstimated || s == CostIncluded }

// Result is a finished turn's outcome.
//
// Returned together with an error caused by the turn's cancellation (the
// user interrupted it, or its deadline passed), a Result whose Text is not
// empty is the partial reply: the worker keeps it in the transcript.
type Result struct {
	// Text is the assistant's reply to the user; empty sends nothing.
	Text         string
	Reasoning    string
	FinishReason string
}

// PanicError is the error of a turn whose agent panicked.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("agent panicked: %v", e.Value) }

// ErrTurnInterrupted is the cancellation cause of a turn interrupted by the
// user (a newer message in busy mode interrupt): the turn ends with what it
// produced so far, and the next turn takes the newer messages.
var ErrTurnInterrupted = errors.New("turn interrupted by a newer message")
