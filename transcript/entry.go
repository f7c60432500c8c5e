package transcript

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/agentfleet/agentfleet/session"
)

// Entry kinds.
const (
	// KindMessage is a conversation message (user, assistant, tool or system).
	KindMessage = "message"
	// KindFence is written by a new owner right after it takes the lane's
	// lease; any append prepared before it fails.
	KindFence = "fence"
	// KindClosed ends a transcript when the lane switches to another session.
	KindClosed = "closed"
	// KindRewind soft-deletes earlier message entries (/undo, /retry).
	KindRewind = "rewind"
	// KindTurnEnd records how a turn ended.
	KindTurnEnd = "turn_end"
	// KindNotice records a notice sent to the user; the agent does not see it.
	KindNotice = "notice"
)

// Message roles.
const (
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
	RoleSystem    = "system"
)

// Turn end statuses.
const (
	StatusCompleted   = "completed"
	StatusFailed      = "failed"
	StatusInterrupted = "interrupted"
	StatusStopped     = "stopped"
	// StatusCommand ends the step of a fleet command (/status, /new, ...).
	StatusCommand = "command"
	// StatusDuplicate ends a turn whose every message was a duplicate.
	StatusDuplicate = "duplicate"
	// StatusDeadLettered ends a turn whose messages were dead-lettered.
	StatusDeadLettered = "dead_lettered"
)

// Entry is one transcript entry: one message on the session's subject, JSON
// in the body. Seq and Deleted are not stored: Load, Get, LastSeq and Append
// set Seq to the stream sequence, and Load sets Deleted.
type Entry struct {
	// Seq is the stream sequence of the entry.
	Seq uint64 `json:"-"`
	// ID is unique per entry and also travels in the Fleet-Entry-Id header.
	// Append fills it when empty; reuse it to retry an append.
	ID string `json:"id"`
	// Kind is one of KindMessage, KindFence, KindClosed, KindRewind,
	// KindTurnEnd and KindNotice.
	Kind string `json:"kind"`
	// Role is user, assistant, tool or system (KindMessage).
	Role             string          `json:"role,omitempty"`
	Content          string          `json:"content,omitempty"`
	ToolCalls        []ToolCall      `json:"tool_calls,omitempty"`
	ToolCallID       string          `json:"tool_call_id,omitempty"`
	ToolName         string          `json:"tool_name,omitempty"`
	Reasoning        string          `json:"reasoning,omitempty"`
	ReasoningDetails json.RawMessage `json:"reasoning_details,omitempty"`
	// Timestamp is set by Append when zero.
	Timestamp    time.Time `json:"timestamp"`
	TokenCount   int       `json:"token_count,omitempty"`
	FinishReason string    `json:"finish_reason,omitempty"`
	// InboxSeq is, on user entries, the inbox stream sequence they came from.
	InboxSeq uint64 `json:"inbox_seq,omitempty"`
	// InboxID is, on user entries, the identity of the inbox stream
	// InboxSeq counts in: a lane's partition can move to another inbox
	// stream (docs/scaling.md), whose seqs may repeat the old one's. Empty
	// on entries written before there were several inbox streams.
	InboxID string `json:"inbox_id,omitempty"`
	// TurnID is the turn that wrote the entry (also header Fleet-Turn-Id).
	TurnID     string `json:"turn_id,omitempty"`
	SenderName string `json:"sender_name,omitempty"`
	// Attachments and Quote are, on user entries, the files the message
	// carried (references, never bytes) and the message it replied to.
	Attachments []session.Attachment `json:"attachments,omitempty"`
	Quote       *session.Quote       `json:"quote,omitempty"`

	// Epoch and Owner are the new owner's lease epoch and id (KindFence).
	Epoch uint64 `json:"epoch,omitempty"`
	Owner string `json:"owner,omitempty"`

	// Status is completed, failed, interrupted, stopped, command, duplicate or dead_lettered (KindTurnEnd).
	Status string `json:"status,omitempty"`
	// ResumeReason and InterruptedAt are, on the turn end of a turn that a
	// recovery ended interrupted without running it again (its messages
	// gone with a deleted inbox stream, or its interruption stale), the
	// resume marker its commit sets: written with the end, so that an
	// owner that finds the end but not its commit (a crash between the
	// two) sets the same marker.
	ResumeReason  string     `json:"resume_reason,omitempty"`
	InterruptedAt *time.Time `json:"interrupted_at,omitempty"`

	// Rewound are the seqs this control entry soft-deletes, kept for audit
	// (KindRewind).
	Rewound []uint64 `json:"rewound,omitempty"`

	// NextSessionID is the session this one was switched to, and Reason why
	// (KindClosed).
	NextSessionID string `json:"next_session_id,omitempty"`
	Reason        string `json:"reason,omitempty"`

	// Deleted is set by Load when a rewind entry covers this entry.
	Deleted bool `json:"-"`
}

// ToolCall is one tool call of an assistant message.
type ToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// NewID returns a new random entry id: 16 random bytes in hex.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// validate checks what Append relies on; kinds it does not know pass, so
// that older code can carry entries of newer kinds.
func (e *Entry) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidEntry, fmt.Sprintf(format, args...))
	}
	if e.ID != "" && !validID(e.ID) {
		return bad("id %q: want at most %d printable bytes without spaces", e.ID, maxIDLen)
	}
	switch e.Kind {
	case "":
		return bad("kind is empty")
	case KindMessage:
		if !isRole(e.Role) {
			return bad("message role %q: want user, assistant, tool or system", e.Role)
		}
	case KindFence:
		if e.Epoch == 0 || e.Owner == "" {
			return bad("fence needs an epoch and an owner, have epoch %d owner %q", e.Epoch, e.Owner)
		}
	case KindTurnEnd:
		switch e.Status {
		case StatusCompleted, StatusFailed, StatusInterrupted, StatusStopped, StatusCommand, StatusDuplicate, StatusDeadLettered:
		default:
			return bad("turn_end status %q: want completed, failed, interrupted, stopped, command, duplicate or dead_lettered", e.Status)
		}
		if e.TurnID == "" {
			return bad("turn_end needs a turn id")
		}
	case KindRewind:
		if len(e.Rewound) == 0 {
			return bad("rewind lists no seqs")
		}
	}
	return nil
}

func isRole(r string) bool {
	switch r {
	case RoleUser, RoleAssistant, RoleTool, RoleSystem:
		return true
	}
	return false
}

// maxIDLen bounds entry ids (they are a header and the stream's Msg-Id).
const maxIDLen = 128

// validID reports whether s can travel as a header value and a Msg-Id.
func validID(s string) bool {
	if s == "" || len(s) > maxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] == 0x7f {
			return false
		}
	}
	return true
}

// checkSessionID rejects ids that are not a single subject token.
func checkSessionID(id string) error {
	if id == "" || strings.ContainsAny(id, ".*> \t\r\n") {
		return fmt.Errorf("%w: %q is not a single subject token", ErrInvalidSessionID, id)
	}
	return nil
}
