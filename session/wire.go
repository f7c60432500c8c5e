package session

import (
	"strings"
	"time"
	"unicode"
)

// Inbound is the body of an inbox message: one accepted user message or
// command, with the source it came from. Ingress builds it; workers read it.
type Inbound struct {
	Source     SessionSource `json:"source"`
	SessionKey string        `json:"session_key"`
	// Kind is message, queue, command or internal (the Fleet-Kind header
	// carries the same value so workers can cut turns before parsing bodies).
	Kind string `json:"kind"`
	// Text is the user text; for a /queue item the text after the command.
	Text string `json:"text"`
	// Command and Args are set for commands: "/busy queue" -> "busy", "queue".
	Command string `json:"command,omitempty"`
	Args    string `json:"args,omitempty"`
	// PlatformMsgID is platform + chat + message id, when the platform gave one.
	PlatformMsgID string `json:"platform_msg_id,omitempty"`
	// ReplyTo is the platform id of the message this one replies to, when
	// the user replied to one.
	ReplyTo string `json:"reply_to,omitempty"`
	// Quote is the message this one replies to or quotes, with its text
	// and sender when the platform gives them (Quote.MessageID == ReplyTo).
	Quote *Quote `json:"quote,omitempty"`
	// Attachments are the files the message carries, as references (see
	// Attachment): the bytes are never in the inbox. Text then holds the
	// caption, if any.
	Attachments []Attachment `json:"attachments,omitempty"`
	// MediaGroup is the platform's id of the album this message belongs to
	// (Telegram media_group_id), when it is one of several sent together.
	MediaGroup string    `json:"media_group,omitempty"`
	ReceivedAt time.Time `json:"received_at"`
}

// Reply is one outbound reply or notice, derived from a transcript entry.
type Reply struct {
	// ID is "<session_id>:<transcript seq>", the Msg-Id everywhere downstream.
	ID         string    `json:"id"`
	SessionKey string    `json:"session_key"`
	SessionID  string    `json:"session_id"`
	TurnID     string    `json:"turn_id"`
	TxSeq      uint64    `json:"tx_seq"`
	Kind       string    `json:"kind"` // reply or notice
	Text       string    `json:"text"`
	Platform   Platform  `json:"platform"`
	ChatID     string    `json:"chat_id,omitempty"`
	ThreadID   string    `json:"thread_id,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	// PossibleDuplicate marks a reply whose earlier send was ambiguous.
	PossibleDuplicate bool `json:"possible_duplicate,omitempty"`

	// ReplyTo is the platform id of the message the reply answers: the
	// newest message of its turn (the reply anchor of a merged turn).
	ReplyTo string `json:"reply_to,omitempty"`
}

// Delta is a piece of a reply being written, streamed while a turn runs.
// It is ephemeral (core NATS, never stored): a listener that misses deltas
// still gets the turn's replies. N counts the deltas of one attempt of a
// turn from 1, so a listener can tell a gap.
type Delta struct {
	SessionKey string `json:"session_key"`
	SessionID  string `json:"session_id"`
	TurnID     string `json:"turn_id"`
	Attempt    int    `json:"attempt"`
	N          int    `json:"n"`
	Text       string `json:"text"`
}

// Values of Inbound.Kind (the same strings as the Fleet-Kind header).
const (
	KindMessage  = "message"
	KindQueue    = "queue"
	KindCommand  = "command"
	KindInternal = "internal"
)

// Values of Reply.Kind.
const (
	ReplyKindReply  = "reply"
	ReplyKindNotice = "notice"
)

// Names of the commands the fleet handles itself (Inbound.Command).
const (
	CmdStop   = "stop"
	CmdNew    = "new"
	CmdReset  = "reset"
	CmdResume = "resume"
	CmdUndo   = "undo"
	CmdRetry  = "retry"
	CmdStatus = "status"
	CmdHelp   = "help"
	CmdBusy   = "busy"
	CmdTitle  = "title"
	CmdQueue  = "queue"
)

// Names of the admin commands fleetctl publishes into a lane's inbox
// (Inbound.Command of a KindCommand message no user text classifies to).
const (
	CmdSuspend       = "suspend"
	CmdResumePending = "resume_pending"
)

// Names of the internal commands the fleet itself publishes into a lane's
// inbox (Inbound.Command of a KindInternal message), so that the lane's
// owner applies them in order with everything else.
const (
	// CmdWake wakes a lane no worker holds.
	CmdWake = "wake"
	// CmdExpire ends a session whose reset policy expired it.
	CmdExpire = "expire"
	// CmdAutoResume runs the automatic turn of a resume_pending lane with
	// no turn in flight; its Args name the session.
	CmdAutoResume = "resume"
)

// Commands the fleet handles itself. Any other /word is passed to the agent
// as text.
var commands = map[string]string{
	"stop": CmdStop, "new": CmdNew, "reset": CmdReset, "resume": CmdResume,
	"undo": CmdUndo, "retry": CmdRetry, "status": CmdStatus, "help": CmdHelp,
	"busy": CmdBusy, "title": CmdTitle, "queue": CmdQueue, "q": CmdQueue,
}

// ReadOnlyCommand reports whether a command only reports (/status, /help):
// it changes nothing, so it is answered at once even while a turn runs.
func ReadOnlyCommand(name string) bool { return name == CmdStatus || name == CmdHelp }

// Classify decides what a user text is: a plain message, a /queue item or a
// fleet command. It returns the kind, the canonical command name and its
// arguments (for a /queue item, args is the queued text).
func Classify(text string) (kind, command, args string) {
	t := strings.TrimSpace(text)
	if !strings.HasPrefix(t, "/") {
		return KindMessage, "", ""
	}
	// The command word ends at the first white space of any kind: "/q" on
	// a line of its own, with the text on the next, is a /queue item.
	word, rest := t[1:], ""
	if i := strings.IndexFunc(word, unicode.IsSpace); i >= 0 {
		word, rest = word[:i], word[i:]
	}
	word, _, _ = strings.Cut(word, "@") // Telegram's /cmd@botname
	name, ok := commands[strings.ToLower(word)]
	if !ok {
		return KindMessage, "", ""
	}
	rest = strings.TrimSpace(rest)
	if name == "queue" {
		return KindQueue, name, rest
	}
	return KindCommand, name, rest
}
