package ingress

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
)

var (
	// ErrRejected wraps a message a Publisher refuses for good (invalid
	// source, blank text, too large): retrying it cannot help.
	ErrRejected = errors.New("message rejected")
	// ErrUnavailable wraps a publish that failed but may succeed when
	// retried (NATS unreachable or slow): a webhook answers 5xx so the
	// platform retries, a poll loop does not confirm the update.
	ErrUnavailable = errors.New("inbox unavailable")
	// ErrTooLarge wraps a rejection for size (with ErrRejected).
	ErrTooLarge = errors.New("message too large")
)

// Message is one platform message for a Publisher: where it came from, its
// text, and the platform's de-duplication id.
type Message struct {
	// Source is the normalized origin: platform, chat type and id, thread,
	// user, names, the bot flag and the platform message id.
	Source session.SessionSource
	// Text is the user's text (a command such as "/new@mybot" included).
	Text string
	// ReplyTo is the platform id of the message this one answers, if any.
	// When Quote is set, its MessageID is used and ReplyTo may stay empty.
	ReplyTo string
	// Quote is the message this one replies to or quotes (id, text,
	// sender), when the platform gives it.
	Quote *session.Quote
	// Attachments are the files the message carries, as references: a
	// platform file id and a URL the agent can fetch (never the bytes).
	// With attachments, Text is the caption and may be blank; it is never
	// read as a command.
	Attachments []session.Attachment
	// MediaGroup is the platform's album id (Telegram media_group_id).
	MediaGroup string
	// DedupID is the platform's id of this delivery, the same on every
	// retry of it, e.g. PlatformMsgID(telegram, chat, message). It becomes
	// the Nats-Msg-Id and the key in the msgids bucket. Empty means the
	// platform gives none: a random id, no de-duplication.
	DedupID string
}

// Accepted is the outcome of a publish: the lane, the inbox seq that holds
// the message, and whether it was a duplicate of an earlier delivery (then
// Seq is the original's; a copy stored beyond the stream's de-duplication
// window is not run by the worker).
type Accepted struct {
	SessionKey string
	Seq        uint64
	Duplicate  bool
}

// Publisher accepts platform messages into the lane inboxes: the same path
// as POST /v1/messages (session key, lane, partition, command classification,
// size check against the server's payload limit, publish with Nats-Msg-Id
// and the msgids lookup at once), for adapters that are not the HTTP API.
// Publish returns only once JetStream acknowledged the message.
type Publisher struct {
	s *Server
}

// NewPublisher returns a Publisher over the resources res. cfg is read as by
// New (Names, KeyOptions, PublishTimeout, Logger); its HTTP settings are
// not used.
func NewPublisher(js jetstream.JetStream, res *broker.Resources, cfg Config) (*Publisher, error) {
	s, err := New(js, res, cfg)
	if err != nil {
		return nil, err
	}
	return &Publisher{s: s}, nil
}

// Publisher returns a Publisher sharing s's connection and settings.
func (s *Server) Publisher() *Publisher { return &Publisher{s: s} }

// Names returns the fleet names the publisher writes under.
func (p *Publisher) Names() broker.Names { return p.s.names }

// SessionKey returns the session key a message from src is published
// under: the derivation Publish uses, WhatsApp canonicalization included.
func (p *Publisher) SessionKey(src session.SessionSource) string {
	src.Normalize()
	return session.BuildSessionKey(src, p.s.cfg.KeyOptions)
}

// Publish validates m, derives its lane and publishes it. When m.DedupID is
// known it returns the original's seq with Duplicate set. An error wraps
// ErrRejected or ErrUnavailable.
func (p *Publisher) Publish(ctx context.Context, m Message) (Accepted, error) {
	src := m.Source
	if !src.Platform.Known() {
		return Accepted{}, fmt.Errorf("%w: unknown platform %q", ErrRejected, src.Platform)
	}
	src.Normalize()
	if err := src.Validate(); err != nil {
		return Accepted{}, fmt.Errorf("%w: %s", ErrRejected, strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	if strings.TrimSpace(m.Text) == "" && len(m.Attachments) == 0 {
		return Accepted{}, fmt.Errorf("%w: text is blank", ErrRejected)
	}
	q := m.Quote
	if q == nil && m.ReplyTo != "" {
		q = &session.Quote{MessageID: m.ReplyTo}
	}
	if q != nil {
		c := *q
		c.Trim()
		q = &c
	}
	if err := session.ValidateMedia(m.Attachments, q); err != nil {
		return Accepted{}, fmt.Errorf("%w: %s", ErrRejected, strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	if err := session.ValidateID("media_group", m.MediaGroup); err != nil {
		return Accepted{}, fmt.Errorf("%w: %v", ErrRejected, err)
	}
	im, e := p.s.newInbound(src, m.Text, m.DedupID, time.Now().UTC(), m.Attachments)
	if e != nil {
		return Accepted{}, publishError(e)
	}
	im.setMedia(q, m.Attachments, m.MediaGroup)
	resp, e := p.s.acceptCtx(ctx, im)
	if e != nil {
		return Accepted{}, publishError(e)
	}
	return Accepted{SessionKey: resp.SessionKey, Seq: resp.Seq, Duplicate: resp.Duplicate}, nil
}

// publishError turns an HTTP-shaped error into ErrUnavailable (5xx) or
// ErrRejected (anything else).
func publishError(e *apiError) error {
	var kind error = ErrRejected
	switch {
	case e.status >= http.StatusInternalServerError:
		kind = ErrUnavailable
	case e.status == http.StatusRequestEntityTooLarge:
		kind = fmt.Errorf("%w: %w", ErrRejected, ErrTooLarge)
	}
	if e.err != nil {
		return fmt.Errorf("%w: %s: %w", kind, e.msg, e.err)
	}
	return fmt.Errorf("%w: %s", kind, e.msg)
}

// PlatformMsgID is "<platform>:<chat_id>:<message_id>", the de-duplication
// id of a platform message; '%' and ':' inside the ids are escaped, so two
// different pairs never give the same id.
func PlatformMsgID(p session.Platform, chatID, messageID string) string {
	return platformMsgID(p, chatID, messageID)
}

// newInbound derives everything the inbox message of a validated source
// needs: session key, lane, subject, kind. pmid is the platform message id
// (empty: a random Msg-Id).
func (s *Server) newInbound(src session.SessionSource, text, pmid string, now time.Time, atts []session.Attachment) (*inboxMessage, *apiError) {
	key := session.BuildSessionKey(src, s.cfg.KeyOptions)
	lane := session.LaneToken(key)
	kind, command, args := session.ClassifyMessage(text, atts)
	if command == session.CmdQueue {
		if strings.TrimSpace(args) == "" {
			return nil, badRequest("/%s needs the text to queue, as in \"/%s <text>\"", command, command)
		}
		text = args
	}
	m := &inboxMessage{
		inbound: session.Inbound{
			Source:     src,
			SessionKey: key,
			Kind:       kind,
			Text:       text,
			Command:    command,
			Args:       args,
			ReceivedAt: now,
		},
		lane:    lane,
		subject: s.names.InboxSubject(session.Partition(s.names.Prefix(), lane), lane),
	}
	if pmid != "" {
		m.inbound.PlatformMsgID = pmid
		m.msgID = pmid
	} else {
		m.msgID = randomID()
	}
	return m, nil
}

// setMedia puts the quote, attachments and album id of a message into its
// inbox body; the quote's id is also the body's reply_to.
func (m *inboxMessage) setMedia(q *session.Quote, atts []session.Attachment, group string) {
	m.inbound.Quote = q
	if q != nil {
		m.inbound.ReplyTo = q.MessageID
	}
	if len(atts) > 0 {
		m.inbound.Attachments = append([]session.Attachment(nil), atts...)
	}
	m.inbound.MediaGroup = group
}
