// Package bridge runs agents written in any language behind the fleet. For
// each turn the worker POSTs the turn as JSON (a Request) to the agent's
// URL and reads newline-delimited JSON events (Event) back from the
// response body while the agent works; closing the request is the
// cancellation. docs/agents.md is the protocol's reference.
//
// New returns the backend the worker uses (the client side); Handler serves
// an agent.Agent written in Go over the same protocol (the agent side).
package bridge

import (
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/session"
)

// Content types of the protocol.
const (
	// RequestContentType is the type of a turn request's body.
	RequestContentType = "application/json"
	// EventsContentType is the type of a response body of events.
	EventsContentType = "application/x-ndjson"
)

// Request is the body of a turn request.
type Request struct {
	SessionKey string `json:"session_key"`
	SessionID  string `json:"session_id"`
	TurnID     string `json:"turn_id"`
	// Attempt is 1, then one more each time an interrupted run of the same
	// turn is resumed (on any worker).
	Attempt int                   `json:"attempt"`
	Source  session.SessionSource `json:"source"`
	// ContextPrompt is the session context section of the system prompt.
	ContextPrompt string `json:"context_prompt"`
	// Notes are system notes for this turn only (restart resume, reset).
	Notes      []string `json:"notes"`
	FreshReset bool     `json:"fresh_reset,omitempty"`
	// History is the session's conversation, oldest first, ending with the
	// turn's user messages.
	History []Message `json:"history"`
	// Messages are the user messages the turn answers, in order.
	Messages []UserMessage `json:"messages"`
	// Quote is the turn's reply context: the newest quote of Messages.
	Quote *session.Quote `json:"quote,omitempty"`
}

// Message is one history entry.
type Message struct {
	Role       string           `json:"role"`
	Content    string           `json:"content,omitempty"`
	ToolCalls  []agent.ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string           `json:"tool_call_id,omitempty"`
	ToolName   string           `json:"tool_name,omitempty"`
	Reasoning  string           `json:"reasoning,omitempty"`
	SenderName string           `json:"sender_name,omitempty"`
	// Attachments and Quote of a user message (see UserMessage).
	Attachments []session.Attachment `json:"attachments,omitempty"`
	Quote       *session.Quote       `json:"quote,omitempty"`
	InboxSeq    uint64               `json:"inbox_seq,omitempty"`
	TurnID      string               `json:"turn_id,omitempty"`
	Seq         uint64               `json:"seq,omitempty"`
	Timestamp   time.Time            `json:"timestamp"`
}

// UserMessage is one user message of the turn.
type UserMessage struct {
	InboxSeq   uint64 `json:"inbox_seq"`
	Text       string `json:"text"`
	SenderName string `json:"sender_name,omitempty"`
	// MessageID is the platform's id of the message.
	MessageID string `json:"message_id,omitempty"`
	// Attachments are the files the message carries, by reference: fetch
	// the bytes from each one's url.
	Attachments []session.Attachment `json:"attachments,omitempty"`
	// Quote is the message this one replies to.
	Quote *session.Quote `json:"quote,omitempty"`
}

// Event types.
const (
	// EventDelta streams a piece of the reply (text).
	EventDelta = "delta"
	// EventMessage is an interim message delivered at once (text).
	EventMessage = "message"
	// EventToolCall records a tool call before it runs (id, name, arguments).
	EventToolCall = "tool_call"
	// EventToolResult records a tool's result (id, name, content).
	EventToolResult = "tool_result"
	// EventUsage reports a model call's usage (the token and cost fields).
	EventUsage = "usage"
	// EventFinal ends the turn with its reply (text, reasoning, finish_reason).
	EventFinal = "final"
	// EventError ends the turn as failed (message).
	EventError = "error"
)

// Event is one line of a response body. Type says which fields count.
type Event struct {
	Type string `json:"type"`
	// Text of delta, message and final.
	Text string `json:"text,omitempty"`
	// ID, Name and Arguments of tool_call; ID, Name and Content of
	// tool_result.
	ID        string `json:"id,omitempty"`
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments,omitempty"`
	Content   string `json:"content,omitempty"`
	// Reasoning and FinishReason of final.
	Reasoning    string `json:"reasoning,omitempty"`
	FinishReason string `json:"finish_reason,omitempty"`
	// Usage fields.
	InputTokens      int64   `json:"input_tokens,omitempty"`
	OutputTokens     int64   `json:"output_tokens,omitempty"`
	CacheReadTokens  int64   `json:"cache_read_tokens,omitempty"`
	CacheWriteTokens int64   `json:"cache_write_tokens,omitempty"`
	EstimatedCostUSD float64 `json:"estimated_cost_usd,omitempty"`
	CostStatus       string  `json:"cost_status,omitempty"`
	PromptTokens     int64   `json:"prompt_tokens,omitempty"`
	// Message of error.
	Message string `json:"message,omitempty"`
}

// requestOf builds the request of a turn.
func requestOf(t *agent.Turn) Request {
	r := Request{SessionKey: t.SessionKey, SessionID: t.SessionID, TurnID: t.TurnID, Attempt: t.Attempt, Source: t.Source,
		ContextPrompt: t.ContextPrompt, Notes: t.Notes, FreshReset: t.FreshReset, Quote: t.Quote,
		History: make([]Message, len(t.History)), Messages: make([]UserMessage, len(t.Messages))}
	if r.Notes == nil {
		r.Notes = []string{}
	}
	for i, m := range t.History {
		r.History[i] = Message{Role: m.Role, Content: m.Content, ToolCalls: m.ToolCalls, ToolCallID: m.ToolCallID, ToolName: m.ToolName,
			Reasoning: m.Reasoning, SenderName: m.SenderName, Attachments: m.Attachments, Quote: m.Quote,
			InboxSeq: m.InboxSeq, TurnID: m.TurnID, Seq: m.Seq, Timestamp: m.Timestamp}
	}
	for i, m := range t.Messages {
		r.Messages[i] = UserMessage(m)
	}
	return r
}

// turnOf is requestOf's inverse, for Handler.
func turnOf(r *Request) *agent.Turn {
	t := &agent.Turn{SessionKey: r.SessionKey, SessionID: r.SessionID, TurnID: r.TurnID, Attempt: r.Attempt, Source: r.Source,
		ContextPrompt: r.ContextPrompt, Notes: r.Notes, FreshReset: r.FreshReset, Quote: r.Quote,
		History: make([]agent.Message, len(r.History)), Messages: make([]agent.UserMessage, len(r.Messages))}
	for i, m := range r.History {
		t.History[i] = agent.Message{Role: m.Role, Content: m.Content, ToolCalls: m.ToolCalls, ToolCallID: m.ToolCallID, ToolName: m.ToolName,
			Reasoning: m.Reasoning, SenderName: m.SenderName, Attachments: m.Attachments, Quote: m.Quote,
			InboxSeq: m.InboxSeq, TurnID: m.TurnID, Seq: m.Seq, Timestamp: m.Timestamp}
	}
	for i, m := range r.Messages {
		t.Messages[i] = agent.UserMessage(m)
	}
	return t
}
