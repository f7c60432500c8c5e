package ingress

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/telemetry"
)

// messageRequest is the body of POST /v1/messages.
type messageRequest struct {
	Platform  string `json:"platform"`
	ChatID    string `json:"chat_id"`
	ChatType  string `json:"chat_type"`
	UserID    string `json:"user_id"`
	UserIDAlt string `json:"user_id_alt"`
	UserName  string `json:"user_name"`
	ThreadID  string `json:"thread_id"`
	ChatName  string `json:"chat_name"`
	MessageID string `json:"message_id"`
	Text      string `json:"text"`
	// Attachments are files by reference (an http or https URL the agent
	// fetches); ReplyTo is the message this one replies to.
	Attachments []session.Attachment `json:"attachments"`
	ReplyTo     *session.Quote       `json:"reply_to"`
	// MediaGroup names the album a photo belongs to: in busy mode queue
	// the photos of one album make one turn.
	MediaGroup string `json:"media_group"`
}

// acceptResponse is the 202 answer of POST /v1/messages.
type acceptResponse struct {
	SessionKey string `json:"session_key"`
	Seq        uint64 `json:"seq"`
	Duplicate  bool   `json:"duplicate"`
}

// inboxMessage is an accepted message, ready to publish.
type inboxMessage struct {
	inbound session.Inbound
	lane    string
	subject string
	// msgID is the Nats-Msg-Id: the platform message id, or a random id.
	msgID string
}

func (s *Server) handlePostMessage(w http.ResponseWriter, r *http.Request) {
	req, e := decodeMessage(w, r, s.cfg.MaxBodyBytes)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	m, e := s.buildInbound(req, time.Now().UTC())
	if e == nil {
		e = allowKey(r, m.inbound.SessionKey)
	}
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	resp, e := s.accept(r, m)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	if s.log.Enabled(r.Context(), slog.LevelDebug) {
		s.log.LogAttrs(r.Context(), slog.LevelDebug, "message accepted",
			slog.String("session_key", resp.SessionKey),
			slog.String("subject", m.subject),
			slog.String("kind", m.inbound.Kind),
			slog.String("platform_msg_id", m.inbound.PlatformMsgID),
			slog.Uint64("seq", resp.Seq),
			slog.Bool("duplicate", resp.Duplicate))
	}
	writeJSON(w, http.StatusAccepted, resp)
}

// decodeMessage reads exactly one JSON object of known fields, at most max
// bytes long (see decodeMessageBody).
func decodeMessage(w http.ResponseWriter, r *http.Request, max int64) (*messageRequest, *apiError) {
	tooLarge := func() *apiError {
		return errorf(http.StatusRequestEntityTooLarge, "request body is larger than %d bytes", max)
	}
	if r.ContentLength > max {
		return nil, tooLarge()
	}
	// A client trickling its body in byte by byte must not hold a handler
	// for ever. (Not a server-wide ReadTimeout: it would also end long polls.)
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(BodyReadTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, max))
	if err != nil {
		return nil, decodeError(err, tooLarge)
	}
	return decodeMessageBody(body)
}

// messageFields are the JSON names of messageRequest's fields.
var messageFields = jsonFieldNames(reflect.TypeFor[messageRequest]())

func jsonFieldNames(t reflect.Type) map[string]bool {
	out := map[string]bool{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		out[name] = true
	}
	return out
}

// decodeMessageBody decodes a POST /v1/messages body strictly: valid UTF-8
// (encoding/json would turn invalid bytes into U+FFFD, and two different
// ids into one), exactly one JSON object, each field named exactly as
// documented (encoding/json would also take "Chat_ID" for chat_id) and at
// most once (it would keep the last of two), nothing but white space after
// it.
func decodeMessageBody(body []byte) (*messageRequest, *apiError) {
	if !utf8.Valid(body) {
		at := 0
		for at < len(body) {
			r, size := utf8.DecodeRune(body[at:])
			if r == utf8.RuneError && size <= 1 {
				break
			}
			at += size
		}
		return nil, badRequest("request body is not valid UTF-8 (at byte %d)", at)
	}
	if req, ok := decodeFlatMessage(body); ok {
		return req, nil
	}
	return decodeStrict(body)
}

// decodeStrict is decodeMessageBody for any valid UTF-8 body, without the
// fast path: it checks the member names, then decodes with encoding/json.
func decodeStrict(body []byte) (*messageRequest, *apiError) {
	if e := checkObjectFields(body, messageFields, ""); e != nil {
		return nil, e
	}
	if e := checkMediaFields(body); e != nil {
		return nil, e
	}
	var req messageRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return nil, decodeError(err, nil)
	}
	return &req, nil
}

// Field names of the objects nested in a POST /v1/messages body.
var (
	attachmentFields = jsonFieldNames(reflect.TypeFor[session.Attachment]())
	quoteFields      = jsonFieldNames(reflect.TypeFor[session.Quote]())
)

// checkMediaFields applies checkObjectFields to the objects nested in a
// body that checkObjectFields accepted: each element of "attachments" and
// the "reply_to" object (null stands for none).
func checkMediaFields(body []byte) *apiError {
	var raw struct {
		Attachments json.RawMessage `json:"attachments"`
		ReplyTo     json.RawMessage `json:"reply_to"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return decodeError(err, nil)
	}
	if len(raw.Attachments) > 0 && string(raw.Attachments) != "null" {
		var items []json.RawMessage
		if err := json.Unmarshal(raw.Attachments, &items); err != nil {
			return badRequest("attachments must be an array of objects")
		}
		if len(items) > session.MaxAttachments {
			return badRequest("attachments: %d items, at most %d per message", len(items), session.MaxAttachments)
		}
		for i, item := range items {
			if e := checkObjectFields(item, attachmentFields, fmt.Sprintf("attachments[%d]", i)); e != nil {
				return e
			}
		}
	}
	if len(raw.ReplyTo) > 0 && string(raw.ReplyTo) != "null" {
		if e := checkObjectFields(raw.ReplyTo, quoteFields, "reply_to"); e != nil {
			return e
		}
	}
	return nil
}

// checkObjectFields makes sure body is one JSON object whose member names
// are all in known, spelled exactly so (letter case included), each at most
// once, followed by nothing but white space. where names a nested object
// in the errors ("" for the request body).
func checkObjectFields(body []byte, known map[string]bool, where string) *apiError {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return decodeError(err, nil)
	}
	badRequest := badRequest
	if where != "" {
		badRequest = func(format string, args ...any) *apiError {
			return errorf(http.StatusBadRequest, "%s: %s", where, fmt.Sprintf(format, args...))
		}
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		if where != "" {
			return badRequest("must be a JSON object, not %s", jsonKind(tok))
		}
		return badRequest("request body must be a JSON object, not %s", jsonKind(tok))
	}
	// Past the opening brace, the end of the body is a truncated object.
	inside := func(err error) *apiError {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return decodeError(err, nil)
	}
	seen := make(map[string]bool, len(known))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return inside(err)
		}
		name, ok := tok.(string)
		if !ok {
			return badRequest("malformed JSON: want a field name, found %s", jsonKind(tok))
		}
		if !known[name] {
			for k := range known {
				if strings.EqualFold(k, name) {
					return badRequest("unknown field %q: field names are case-sensitive (did you mean %q?)", name, k)
				}
			}
			return badRequest("unknown field %q", name)
		}
		if seen[name] {
			return badRequest("field %q appears more than once", name)
		}
		seen[name] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return inside(err)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return inside(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return badRequest("request body must hold exactly one JSON object; found more data after it")
	}
	return nil
}

// jsonKind names the kind of JSON value a token starts.
func jsonKind(tok json.Token) string {
	switch v := tok.(type) {
	case json.Delim:
		if v == '[' {
			return "an array"
		}
		return fmt.Sprintf("%q", string(v))
	case string:
		return "a string"
	case json.Number, float64:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", tok)
}

// decodeError turns a JSON decoding error into a message naming the problem.
func decodeError(err error, tooLarge func() *apiError) *apiError {
	var (
		maxErr    *http.MaxBytesError
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &maxErr) && tooLarge != nil:
		return tooLarge()
	case errors.Is(err, io.EOF):
		return badRequest("request body is empty; want a JSON object with chat_id and text")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("malformed JSON: the body ends in the middle of a value")
	case errors.As(err, &syntaxErr):
		return badRequest("malformed JSON at byte %d: %v", syntaxErr.Offset, syntaxErr)
	case errors.As(err, &typeErr):
		if typeErr.Field == "" {
			return badRequest("request body must be a JSON object, not %s", typeErr.Value)
		}
		return badRequest("field %s must be a %s, not %s", typeErr.Field, typeErr.Type, typeErr.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		// encoding/json has no typed error for DisallowUnknownFields.
		return badRequest("unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	default:
		return badRequest("malformed JSON: %v", err)
	}
}

// buildInbound validates req and derives everything the inbox message needs.
func (s *Server) buildInbound(req *messageRequest, now time.Time) (*inboxMessage, *apiError) {
	if strings.TrimSpace(req.Text) == "" && len(req.Attachments) == 0 {
		return nil, badRequest("text is required and must not be blank (unless the message has attachments)")
	}
	if err := session.ValidateMedia(req.Attachments, req.ReplyTo); err != nil {
		return nil, badRequest("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	if err := session.ValidateID("media_group", req.MediaGroup); err != nil {
		return nil, badRequest("%v", err)
	}
	for i, a := range req.Attachments {
		if a.URL == "" {
			// Nothing else could resolve an HTTP client's file.
			return nil, badRequest("attachments[%d]: url is required: the agent fetches the file from it", i)
		}
	}
	if strings.TrimSpace(req.ChatID) == "" {
		return nil, badRequest("chat_id is required")
	}
	platform := session.PlatformHTTP
	if req.Platform != "" {
		p, err := session.ParsePlatform(req.Platform)
		if err != nil {
			return nil, badRequest("platform: %v", err)
		}
		// Replies go to the platform's own outbox and only the http
		// mailboxes are readable here: a message of another platform would
		// be answered where this client can never read it, and could take
		// that platform's message ids away from its real adapter.
		if p != session.PlatformHTTP {
			return nil, badRequest("platform %q: this endpoint takes messages of platform %q only; %s messages come through their own adapter", p, session.PlatformHTTP, p)
		}
	}
	src := session.SessionSource{
		Platform:  platform,
		ChatID:    req.ChatID,
		ChatName:  req.ChatName,
		ChatType:  req.ChatType,
		UserID:    req.UserID,
		UserName:  req.UserName,
		ThreadID:  req.ThreadID,
		UserIDAlt: req.UserIDAlt,
		MessageID: req.MessageID,
	}
	src.Normalize()
	if err := src.Validate(); err != nil {
		return nil, badRequest("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}

	var pmid string
	if req.MessageID != "" {
		pmid = platformMsgID(platform, req.ChatID, req.MessageID)
	}
	m, e := s.newInbound(src, req.Text, pmid, now, req.Attachments)
	if e != nil {
		return nil, e
	}
	m.setMedia(req.ReplyTo, req.Attachments, req.MediaGroup)
	return m, nil
}

// accept publishes m unless it is a known duplicate, and answers only once
// the inbox holds it.
func (s *Server) accept(r *http.Request, m *inboxMessage) (*acceptResponse, *apiError) {
	return s.acceptCtx(r.Context(), m)
}

// acceptCtx is accept for a caller without a request (a platform adapter's
// poll loop); ctx only carries values and logging, never a cancellation of
// a write that has started.
func (s *Server) acceptCtx(rctx context.Context, m *inboxMessage) (resp *acceptResponse, e *apiError) {
	if s.tracer == nil {
		return s.accepted(rctx, m)
	}
	// The span of the publish: a child of the request's span (HTTP or
	// webhook) or, for a poll loop, the trace's root. Its context travels
	// in the inbox message's headers to the worker.
	rctx, span := s.tracer.Start(rctx, "inbox publish", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(telemetry.AttrLane.String(m.lane), telemetry.AttrSessionKey.String(m.inbound.SessionKey),
			semconv.MessagingSystemKey.String("nats"), semconv.MessagingDestinationName(m.subject)))
	defer func() {
		switch {
		case e != nil:
			span.SetStatus(codes.Error, e.msg)
		case resp != nil:
			span.SetAttributes(telemetry.AttrInboxSeq.Int64(int64(resp.Seq)), attribute.Bool("agentfleet.duplicate", resp.Duplicate))
		}
		span.End()
	}()
	return s.accepted(rctx, m)
}

// accepted is acceptCtx without its span.
//
// A message with a platform message id is published while its msgids
// record is read (lookupMsgID), not after: the answer waits for one round
// trip, not two. The record names the inbox message that incorporated the
// id, and a retry that comes after that (beyond the stream's
// de-duplication window) is answered as a duplicate of it, as when the
// record was read first; the copy the publish stored is skipped by the
// worker's msgids claim (worker/msgids.go), so nothing runs or is answered
// twice. The claim skips it only while the record lives (the bucket's
// TTL), so the record is written again, as it is, when such a copy is
// stored: its age starts with the copy's.
func (s *Server) accepted(rctx context.Context, m *inboxMessage) (*acceptResponse, *apiError) {
	// One bound for both, which run at once.
	ctx, cancel := s.opCtx(rctx)
	defer cancel()
	var lookup chan msgIDLookup
	if m.inbound.PlatformMsgID != "" {
		lookup = make(chan msgIDLookup, 1)
		go func() { lookup <- s.lookupMsgID(ctx, m.inbound.PlatformMsgID) }()
	}
	ack, e, err := s.publishInbox(ctx, m)
	if lookup == nil {
		if e != nil {
			return nil, e
		}
		return s.published(rctx, m, ack, err)
	}
	l := <-lookup
	if l.err != nil {
		// The publish may have stored the message: the client's retry,
		// with the same id, is a duplicate of it.
		return nil, unavailable("cannot check the message id for duplicates; retry", l.err)
	}
	// A record of this very publish (the worker incorporated the message
	// before the record was read) is not an earlier delivery: its seq and,
	// when it names one, its stream are the publish's (two inbox streams
	// use the same seqs).
	if l.found && !s.ownRecord(ctx, l.ref, ack, e, err) {
		if e == nil && err == nil && !ack.Duplicate {
			// The publish stored a copy, which the worker's claim skips
			// while the record lives: its age starts again, so that it
			// outlives the copy's wait in the lane (the bucket's TTL is
			// counted from the last write).
			rnctx, rncancel := s.opCtx(rctx)
			rerr := s.msgIDs.Renew(rnctx, m.inbound.PlatformMsgID, l.entry.Value(), l.entry.Revision())
			rncancel()
			if rerr != nil {
				return nil, unavailable("the message is a duplicate, but its id record could not be renewed; retry", rerr)
			}
		}
		ref := l.ref
		key := s.keyAt(rctx, m, ref.Seq, func(ctx context.Context) *broker.Inbox { return s.recordInbox(ctx, m.lane, ref.Inbox) })
		return &acceptResponse{SessionKey: key, Seq: ref.Seq, Duplicate: true}, nil
	}
	if e != nil {
		return nil, e
	}
	resp, e := s.published(rctx, m, ack, err)
	if e != nil || !l.corrupt {
		// The id is recorded past the stream's window by the worker that
		// incorporates the message (its claim: worker/msgids.go), not here:
		// the answer does not wait for a second write.
		return resp, e
	}
	// An unreadable record would make the worker's claim fail: replace it
	// with the record the claim would write.
	pctx, pcancel := s.opCtx(rctx)
	ref := kv.MsgRef{Seq: ack.Sequence}
	if in := s.inboxNamed(pctx, ack.Stream); in != nil {
		// The identity read again (a rare path): one this process read
		// before the stream was recreated would name another stream, and
		// the worker's claim would take the message for a duplicate of it.
		in, err = s.recheckInbox(pctx, in)
		if err != nil {
			pcancel()
			return nil, unavailable("the message was stored but its inbox stream could not be read to replace its unreadable id record; retry", err)
		}
		ref.Inbox = in.ID
	}
	_, err = s.res.MsgIDs.Put(pctx, s.msgIDs.Key(m.inbound.PlatformMsgID), ref.Encode())
	pcancel()
	if err != nil {
		return nil, unavailable("the message was stored but its unreadable id record could not be replaced; retry", err)
	}
	return resp, nil
}

// ownRecord reports whether ref, the msgids record read during a publish,
// names the message that publish stored (ack, when e and err are nil): the
// same seq, in the stream that stored it unless the record names no stream
// (written before records did).
func (s *Server) ownRecord(ctx context.Context, ref kv.MsgRef, ack *jetstream.PubAck, e *apiError, err error) bool {
	if e != nil || err != nil || ack.Duplicate || ack.Sequence != ref.Seq {
		return false
	}
	if ref.Inbox == "" {
		return true
	}
	in := s.inboxNamed(ctx, ack.Stream)
	if in != nil && in.ID != ref.Inbox {
		// The same seq and another identity: of another stream, or of
		// this one recreated since this process read its identity. Read
		// it again (a rare path) before answering a duplicate.
		if fresh, err := s.recheckInbox(ctx, in); err == nil {
			in = fresh
		}
	}
	return in != nil && in.ID == ref.Inbox
}

// recheckInbox reads the identity of inbox stream in again: the set takes
// the stream's new incarnation if it was recreated (see
// broker.InboxSet.Reopen).
func (s *Server) recheckInbox(ctx context.Context, in *broker.Inbox) (*broker.Inbox, error) {
	if s.res.Inboxes == nil {
		id, err := broker.InboxID(ctx, s.res.Inbox)
		if err != nil {
			return nil, err
		}
		return &broker.Inbox{Name: in.Name, ID: id, Stream: s.res.Inbox}, nil
	}
	return s.res.Inboxes.Reopen(ctx, in, false)
}

// publishInbox publishes m to its inbox subject within ctx (an opCtx): e
// when m cannot be encoded or is too large (nothing was published), else
// the publish's PubAck or error.
func (s *Server) publishInbox(ctx context.Context, m *inboxMessage) (*jetstream.PubAck, *apiError, error) {
	msg, e := s.inboxMsg(ctx, m)
	if e != nil {
		return nil, e, nil
	}
	// No stream takes the subject while a migration moves the lane's
	// partition between inbox streams (seconds): the publish is retried
	// until the request's publish timeout, then answered 503 (the client's
	// retry, with the same message id, is de-duplicated).
	opts := append(s.inboxOpts[:len(s.inboxOpts):len(s.inboxOpts)], jetstream.WithMsgID(m.msgID))
	ack, err := s.js.PublishMsg(ctx, msg, opts...)
	if err == nil {
		if _, ok := s.names.InboxStreamIndex(ack.Stream); !ok {
			err = fmt.Errorf("stored by stream %s, not an inbox stream of prefix %q", ack.Stream, s.names.Prefix())
		}
	}
	return ack, nil, err
}

// published is the answer to m's publish (ack or err).
func (s *Server) published(rctx context.Context, m *inboxMessage, ack *jetstream.PubAck, err error) (*acceptResponse, *apiError) {
	if errors.Is(err, nats.ErrMaxPayload) {
		return nil, errorf(http.StatusRequestEntityTooLarge, "the message is too large for the inbox (the server takes at most %d bytes per message, envelope included)", s.maxPayload())
	}
	if err != nil {
		return nil, unavailable("the message could not be stored; retry", fmt.Errorf("publish to %s: %w", m.subject, err))
	}
	resp := &acceptResponse{SessionKey: m.inbound.SessionKey, Seq: ack.Sequence, Duplicate: ack.Duplicate}
	if ack.Duplicate {
		resp.SessionKey = s.keyAt(rctx, m, ack.Sequence, func(ctx context.Context) *broker.Inbox { return s.inboxNamed(ctx, ack.Stream) })
	}
	return resp, nil
}

// keyAt is the session key of the inbox message at seq of the stream find
// gives, for the answer to m, a duplicate of it: a retry that reused a
// message id with another thread or user derives another key, but the
// message that holds the id went to the first one, and that is where its
// replies are. m's own key when that message cannot be read or is not one
// with m's id: a seq counts in one stream only, and after a migration or a
// recreated stream it may hold another chat's message, whose key must not
// be told.
func (s *Server) keyAt(rctx context.Context, m *inboxMessage, seq uint64, find func(context.Context) *broker.Inbox) string {
	fallback := m.inbound.SessionKey
	ctx, cancel := s.opCtx(rctx)
	defer cancel()
	in := find(ctx)
	if in == nil {
		return fallback
	}
	raw, err := in.Stream.GetMsg(ctx, seq)
	if err != nil {
		return fallback
	}
	hdr, want := broker.HdrPlatformMsgID, m.inbound.PlatformMsgID
	if want == "" {
		hdr, want = jetstream.MsgIDHeader, m.msgID
	}
	if raw.Header.Get(hdr) != want {
		return fallback
	}
	if k := raw.Header.Get(broker.HdrSessionKey); k != "" {
		return k
	}
	return fallback
}

// inboxMsg encodes m as the inbox message. A message the server would not
// take (its payload limit, envelope and headers included) is refused with
// 413: retrying it cannot help.
func (s *Server) inboxMsg(ctx context.Context, m *inboxMessage) (*nats.Msg, *apiError) {
	// Encoded as the transcript will store the text (encoding/json escapes
	// '<', '>' and '&' as six bytes each): a message that fits here then
	// fits in its transcript entry, which carries the same text and less
	// around it.
	body, err := json.Marshal(m.inbound)
	if err != nil {
		return nil, &apiError{status: http.StatusInternalServerError, msg: "cannot encode the message", err: err}
	}
	// One array holds the header values, and the map has room for the
	// publish's own headers (Msg-Id, expected stream) and a traceparent.
	vals := [3]string{m.inbound.SessionKey, m.inbound.Kind, m.inbound.PlatformMsgID}
	msg := &nats.Msg{Subject: m.subject, Data: body, Header: make(nats.Header, 6)}
	msg.Header[broker.HdrSessionKey] = vals[0:1:1]
	msg.Header[broker.HdrKind] = vals[1:2:2]
	if m.inbound.PlatformMsgID != "" {
		msg.Header[broker.HdrPlatformMsgID] = vals[2:3:3]
	}
	telemetry.Inject(ctx, msg.Header)
	if limit := s.maxPayload(); limit > 0 {
		// The payload limit counts the data and the header block, which
		// also gets the Msg-Id and expected-stream headers of the publish.
		size := len(msg.Data) + len("NATS/1.0\r\n\r\n") +
			len(jetstream.MsgIDHeader) + len(m.msgID) + 4
		for k, vs := range msg.Header {
			for _, v := range vs {
				size += len(k) + len(v) + 4 // "k: v\r\n"
			}
		}
		if int64(size) > limit {
			return nil, errorf(http.StatusRequestEntityTooLarge, "the message is too large for the inbox: %d bytes with its envelope, the server takes at most %d", size, limit)
		}
	}
	return msg, nil
}

// maxPayload is the connection's payload limit, 0 when unknown.
func (s *Server) maxPayload() int64 {
	if nc := s.js.Conn(); nc != nil {
		return nc.MaxPayload()
	}
	return 0
}

// msgIDLookup is the answer of lookupMsgID.
type msgIDLookup struct {
	// ref is the inbox message the record names, entry the record read.
	ref   kv.MsgRef
	entry jetstream.KeyValueEntry
	// found: the record names ref; corrupt: the record is not a seq and
	// says nothing (the stream's Msg-Id window decides, and the caller
	// overwrites it).
	found, corrupt bool
	err            error
}

// lookupMsgID reads the inbox seq recorded for pmid, if any, within ctx
// (an opCtx).
func (s *Server) lookupMsgID(ctx context.Context, pmid string) msgIDLookup {
	e, err := s.res.MsgIDs.Get(ctx, s.msgIDs.Key(pmid))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return msgIDLookup{}
	}
	if err != nil {
		return msgIDLookup{err: fmt.Errorf("get msgid %s: %w", pmid, err)}
	}
	r, err := kv.ParseMsgRef(e.Value())
	if err != nil {
		s.log.LogAttrs(ctx, slog.LevelWarn, "replacing unreadable msgids record",
			slog.String("platform_msg_id", pmid), slog.String("value", string(e.Value())))
		return msgIDLookup{corrupt: true}
	}
	return msgIDLookup{ref: r, entry: e, found: true}
}

// platformMsgID is "<platform>:<chat_id>:<message_id>". '%' and ':' inside
// the ids are percent-escaped, so two different (chat, message) pairs never
// give the same id; ids without them read as is.
func platformMsgID(p session.Platform, chatID, messageID string) string {
	return string(p) + ":" + escapeColon(chatID) + ":" + escapeColon(messageID)
}

// escapeColon escapes an id as a session-key segment is escaped.
func escapeColon(s string) string { return session.EscapeKeySegment(s) }

// randomID is a Nats-Msg-Id for a message without a platform id.
func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return "rand:" + hex.EncodeToString(b[:])
}

// inboxNamed is the inbox stream named name, nil when it is not known
// (the map is read again first when older than a second: a migration may
// have added it).
func (s *Server) inboxNamed(ctx context.Context, name string) *broker.Inbox {
	if s.res.Inboxes == nil {
		if name != s.names.InboxStream() {
			return nil
		}
		return &broker.Inbox{Name: name, ID: s.res.InboxID, Stream: s.res.Inbox}
	}
	if in := s.res.Inboxes.ByName(name); in != nil {
		return in
	}
	return s.res.Inboxes.Fresh(ctx, time.Second).ByName(name)
}

// recordInbox is the inbox stream a msgids record's seq counts in: the one
// of identity id, nil when none has it; for a record that names no stream
// (written before records did), the one that holds lane's messages now.
// The map is read again when older than a second (one KV get; this is only
// asked for duplicates), since a migration may have moved the lane's
// partition.
func (s *Server) recordInbox(ctx context.Context, lane, id string) *broker.Inbox {
	if s.res.Inboxes == nil {
		if id != "" && id != s.res.InboxID {
			return nil
		}
		return &broker.Inbox{Name: s.names.InboxStream(), ID: s.res.InboxID, Stream: s.res.Inbox}
	}
	set := s.res.Inboxes.Fresh(ctx, time.Second)
	if id == "" {
		return set.ForLane(lane)
	}
	for _, in := range set.All() {
		if in.ID == id {
			return in
		}
	}
	return nil
}
