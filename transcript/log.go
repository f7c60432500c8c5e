package transcript

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
)

const (
	defaultWriteTimeout = 5 * time.Second
	defaultReadTimeout  = 5 * time.Second

	// loadBatch is how many entries Load lets the server push ahead of it.
	loadBatch = 256
	// loadInactive is the backstop after which the server removes the
	// ephemeral consumer of a Load that could not delete it.
	loadInactive = 30 * time.Second
	// loadResets bounds the attempts to create each replacement of a
	// Load's ordered consumer (after a gap or missed heartbeats).
	loadResets = 3
	// loadHeartbeatMin and loadHeartbeatMax bound the idle heartbeat a Load
	// asks for (ReadTimeout/5 in between); see read.
	loadHeartbeatMin = 500 * time.Millisecond
	loadHeartbeatMax = 5 * time.Second

	// retryMin and retryMax bound the pause between the attempts of one
	// Append (re-reading a lagging tail, or resending after a 10164).
	retryMin = 5 * time.Millisecond
	retryMax = 200 * time.Millisecond
)

// Options tunes a Log. The zero value (or nil) gives the defaults.
type Options struct {
	// WriteTimeout bounds one Append, resolving an ambiguous outcome
	// included. It runs on its own clock: cancelling the caller's context
	// does not abandon a durable write halfway.
	//
	// Defaults to 5s.
	WriteTimeout time.Duration
	// ReadTimeout bounds each read round trip (and, in Load, the wait for
	// the next entry) when the caller's context has no earlier deadline.
	//
	// Defaults to 5s.
	ReadTimeout time.Duration
}

// Log is the transcript log of every session of a fleet: the stream
// FLEET_TX, one subject per session id. It is safe for concurrent use; a
// session's appends must still be issued one at a time (each names the
// lastSeq the previous one returned).
type Log struct {
	js           jetstream.JetStream
	names        broker.Names
	writeTimeout time.Duration
	readTimeout  time.Duration

	namePrefix func() string // tests only: see loadNamePrefix
}

// New returns the log of the fleet named by names. The stream must exist
// (broker.Provision creates it); New does no I/O.
func New(js jetstream.JetStream, names broker.Names, opts *Options) (*Log, error) {
	if js == nil {
		return nil, errors.New("transcript: nil JetStream")
	}
	if names.Prefix() == "" {
		return nil, errors.New("transcript: zero broker.Names; use broker.NewNames")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.WriteTimeout < 0 {
		return nil, fmt.Errorf("transcript: Options.WriteTimeout %v: must not be negative", o.WriteTimeout)
	}
	if o.ReadTimeout < 0 {
		return nil, fmt.Errorf("transcript: Options.ReadTimeout %v: must not be negative", o.ReadTimeout)
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = defaultWriteTimeout
	}
	if o.ReadTimeout == 0 {
		o.ReadTimeout = defaultReadTimeout
	}
	return &Log{
		js:           js,
		names:        names,
		writeTimeout: o.WriteTimeout,
		readTimeout:  o.ReadTimeout,
	}, nil
}

// Append stores e on the session's subject only if the subject's last
// sequence is still lastSeq (0: the subject must be empty), and returns the
// new sequence (also set in e.Seq). It fills e.ID and e.Timestamp when they
// are empty, so that a retry with the same e is recognised.
//
// When another writer got there first, the error wraps ErrConflict and is a
// *ConflictError with the actual tail. An ambiguous outcome (a timeout, a
// lost connection, a rejection of a resend of this very entry) is resolved
// here by reading the subject's last entry: if it is e (same ID) Append
// succeeds with its sequence, if the tail is still lastSeq the entry is sent
// again (with Nats-Msg-Id = e.ID, so the stream drops a duplicate), and
// otherwise it is a conflict. Only when the server stays unreachable for the
// whole WriteTimeout does Append return an error wrapping ErrOutcomeUnknown;
// calling Append again with the same e and lastSeq then resolves it.
//
// Append runs on its own WriteTimeout, derived from ctx without its
// cancellation.
func (l *Log) Append(ctx context.Context, sessionID string, lastSeq uint64, e *Entry) (uint64, error) {
	if e == nil {
		return 0, fmt.Errorf("append: %w: nil entry", ErrInvalidEntry)
	}
	if err := checkSessionID(sessionID); err != nil {
		return 0, fmt.Errorf("append: %w", err)
	}
	if err := e.validate(); err != nil {
		return 0, fmt.Errorf("append to %s: %w", sessionID, err)
	}
	if e.TurnID != "" && !validID(e.TurnID) {
		return 0, fmt.Errorf("append to %s: %w: turn id %q is not a valid header value", sessionID, ErrInvalidEntry, e.TurnID)
	}
	reused := e.ID != ""
	if !reused {
		e.ID = NewID()
	}
	if e.Timestamp.IsZero() {
		e.Timestamp = time.Now().UTC()
	}
	data, err := json.Marshal(e)
	if err != nil {
		return 0, fmt.Errorf("append to %s: encode entry: %w", sessionID, err)
	}

	wctx, cancel := context.WithTimeout(withoutCancel(ctx), l.writeTimeout)
	defer cancel()
	a := &appendOp{
		log:       l,
		sessionID: sessionID,
		subject:   l.names.TranscriptSubject(sessionID),
		lastSeq:   lastSeq,
		entry:     e,
		data:      data,
		mayExist:  reused,
		tail:      lastSeq,
	}
	seq, err := a.run(wctx)
	if err != nil {
		return 0, err
	}
	e.Seq = seq
	return seq, nil
}

// withoutCancel is context.WithoutCancel(ctx), or ctx itself when nothing
// can cancel it (Done is nil: no cancellation and no deadline), as for the
// worker's appends, whose context is already one without cancellation.
func withoutCancel(ctx context.Context) context.Context {
	if ctx.Done() == nil {
		return ctx
	}
	return context.WithoutCancel(ctx)
}

// appendOp is one Append, with what it has learnt so far.
type appendOp struct {
	log       *Log
	sessionID string
	subject   string
	lastSeq   uint64
	entry     *Entry
	data      []byte

	// mayExist is true once an entry with this ID may be stored: the
	// caller passed an ID (it may be retrying), or a send of ours had an
	// unknown outcome.
	mayExist bool
	// tail is the subject's last sequence as last read (lastSeq until then).
	tail uint64
}

// outcome classifies a publish error.
type outcome int

const (
	outcomeFailed     outcome = iota // definitely not stored, and retrying will not help
	outcomeWrongLast                 // 10071: the subject's tail is not lastSeq
	outcomeBusy                      // 10164: rejected, another write to the subject is in flight (R3)
	outcomeAmbiguous                 // may or may not be stored
	outcomeConnClosed                // may or may not be stored, and the connection is gone for good
)

func (a *appendOp) run(ctx context.Context) (uint64, error) {
	var lastErr error
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if err := pause(ctx, attempt); err != nil {
				return a.giveUp(lastErr)
			}
		}
		ack, err := a.publish(ctx)
		if err == nil {
			// A Duplicate ack names the sequence of the stored original.
			return ack.Sequence, nil
		}
		lastErr = err
		kind, actual, actualKnown := classify(err)
		floor := uint64(0) // the tail is at least this (from the server's own words)
		switch kind {
		case outcomeFailed:
			return 0, fmt.Errorf("append to %s: %w", a.subject, err)
		case outcomeWrongLast:
			if !a.mayExist {
				// A fresh id on its first send: the entry is not stored.
				if !actualKnown {
					actual = a.readTail(ctx)
				}
				return 0, a.conflict(actual)
			}
			if actualKnown {
				floor = actual
			}
		case outcomeBusy:
			// Not stored; whether the subject moved is learnt below.
		case outcomeAmbiguous:
			a.mayExist = true
		case outcomeConnClosed:
			a.mayExist = true
			return a.giveUp(err)
		}

		// Resolve: what is the subject's last entry now?
		for read := 0; ; read++ {
			if read > 0 {
				if err := pause(ctx, read); err != nil {
					return a.giveUp(lastErr)
				}
			}
			raw, err := a.log.lastRaw(ctx, a.subject)
			var apiErr *jetstream.APIError
			if errors.As(err, &apiErr) && apiErr.Code < 500 {
				return a.giveUp(err) // e.g. no such stream: waiting will not help
			}
			if err != nil {
				lastErr = err
				continue
			}
			var seq uint64
			var id string
			if raw != nil {
				seq, id = raw.Sequence, raw.Header.Get(broker.HdrEntryID)
			}
			a.tail = seq
			if seq < floor {
				continue // a replica that lags behind the leader answered
			}
			if id == a.entry.ID {
				return seq, nil // our entry is the tail: the write went through
			}
			if seq != a.lastSeq {
				return 0, a.conflict(seq)
			}
			break // still at lastSeq: send the same entry again
		}
	}
}

// giveUp ends an Append that ran out of time.
func (a *appendOp) giveUp(cause error) (uint64, error) {
	if !a.mayExist {
		// Every send was rejected (10164 while the subject stayed busy):
		// nothing was stored, so this is a conflict, not an unknown.
		return 0, a.conflict(a.tail)
	}
	return 0, fmt.Errorf("append to %s (entry %s, expected last seq %d): %w: %w", a.subject, a.entry.ID, a.lastSeq, ErrOutcomeUnknown, cause)
}

func (a *appendOp) conflict(actual uint64) error {
	return &ConflictError{SessionID: a.sessionID, Expected: a.lastSeq, Actual: actual}
}

// readTail returns the subject's last sequence, or lastSeq if it cannot be
// read (a conflict's Actual is advice; the caller reloads anyway).
func (a *appendOp) readTail(ctx context.Context) uint64 {
	raw, err := a.log.lastRaw(ctx, a.subject)
	if err != nil {
		return a.lastSeq
	}
	if raw == nil {
		return 0
	}
	return raw.Sequence
}

func (a *appendOp) publish(ctx context.Context) (*jetstream.PubAck, error) {
	// The expected last subject sequence and the Msg-Id are the headers
	// jetstream.WithExpectLastSequencePerSubject and WithMsgID would set,
	// set here without the options' allocations (see broker.NewMsg).
	var buf [12]string
	h := append(buf[:0],
		broker.HdrEntryID, a.entry.ID,
		broker.HdrSessionID, a.sessionID,
		jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(a.lastSeq, 10),
		jetstream.MsgIDHeader, a.entry.ID)
	if a.entry.TurnID != "" {
		h = append(h, broker.HdrTurnID, a.entry.TurnID)
	}
	if a.entry.InboxSeq != 0 {
		h = append(h, broker.HdrInboxSeq, strconv.FormatUint(a.entry.InboxSeq, 10))
	}
	return a.log.js.PublishMsg(ctx, broker.NewMsg(a.subject, a.data, h...))
}

// wrongLastSeqPrefix starts the description of err_code 10071.
const wrongLastSeqPrefix = "wrong last sequence: "

// classify sorts a publish error; for 10071 it also returns the actual last
// sequence the server reported, when it could be parsed.
func classify(err error) (kind outcome, actual uint64, actualKnown bool) {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch {
		case apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence:
			if rest, ok := strings.CutPrefix(apiErr.Description, wrongLastSeqPrefix); ok {
				if n, perr := strconv.ParseUint(strings.TrimSpace(rest), 10, 64); perr == nil {
					return outcomeWrongLast, n, true
				}
			}
			return outcomeWrongLast, 0, false
		case apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant:
			return outcomeBusy, 0, false
		case apiErr.Code >= 500:
			return outcomeAmbiguous, 0, false // e.g. a leader change in flight
		default:
			return outcomeFailed, 0, false // the stream refused the message
		}
	}
	switch {
	case errors.Is(err, nats.ErrConnectionClosed):
		return outcomeConnClosed, 0, false
	case errors.Is(err, nats.ErrMaxPayload),
		errors.Is(err, nats.ErrBadSubject),
		errors.Is(err, nats.ErrHeadersNotSupported),
		errors.Is(err, jetstream.ErrInvalidOption):
		return outcomeFailed, 0, false // refused before it was sent
	}
	// Timeouts, deadlines, no responders, disconnects, garbled acks.
	return outcomeAmbiguous, 0, false
}

// pause waits a little longer on each attempt, or until ctx is done.
func pause(ctx context.Context, attempt int) error {
	d := retryMin << min(attempt-1, 10)
	d = min(d, retryMax)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// LastSeq returns the session's last sequence and entry, or 0 and nil when
// the transcript is empty. It is one get, answered by the stream leader, so
// it reflects every acknowledged append (see lastRaw).
func (l *Log) LastSeq(ctx context.Context, sessionID string) (uint64, *Entry, error) {
	if err := checkSessionID(sessionID); err != nil {
		return 0, nil, fmt.Errorf("last seq: %w", err)
	}
	raw, err := l.lastRaw(ctx, l.names.TranscriptSubject(sessionID))
	if err != nil {
		return 0, nil, fmt.Errorf("last seq of %s: %w", sessionID, err)
	}
	if raw == nil {
		return 0, nil, nil
	}
	e, err := decode(raw.Sequence, raw.Data, raw.Header)
	if err != nil {
		return 0, nil, fmt.Errorf("last seq of %s: %w", sessionID, err)
	}
	return raw.Sequence, e, nil
}

// Get returns the entry at seq of the session. Deleted is not set: only Load
// sees the rewinds. ErrNotFound when seq holds no entry of this session.
func (l *Log) Get(ctx context.Context, sessionID string, seq uint64) (*Entry, error) {
	if err := checkSessionID(sessionID); err != nil {
		return nil, fmt.Errorf("get: %w", err)
	}
	if seq == 0 {
		return nil, fmt.Errorf("get %s seq 0: %w", sessionID, ErrNotFound)
	}
	raw, err := l.msgGet(ctx, broker.LeaderGetRequest{Seq: seq})
	if err != nil {
		return nil, fmt.Errorf("get %s seq %d: %w", sessionID, seq, err)
	}
	if raw == nil {
		return nil, fmt.Errorf("get %s seq %d: %w", sessionID, seq, ErrNotFound)
	}
	if raw.Subject != l.names.TranscriptSubject(sessionID) {
		return nil, fmt.Errorf("get %s seq %d: %w (it belongs to %s)", sessionID, seq, ErrNotFound, raw.Subject)
	}
	e, err := decode(raw.Sequence, raw.Data, raw.Header)
	if err != nil {
		return nil, fmt.Errorf("get %s seq %d: %w", sessionID, seq, err)
	}
	return e, nil
}

// Load returns every entry of the session in order, with Seq set and Deleted
// applied from the rewind entries, and the last sequence it read up to (0
// for an empty transcript): pass it to the next Append.
//
// It reads the tail first, then streams the subject through an ephemeral
// ordered consumer up to that tail, so its cost grows with the transcript,
// not with round trips per entry. Entries appended meanwhile are left for
// the next Load.
func (l *Log) Load(ctx context.Context, sessionID string) ([]Entry, uint64, error) {
	if err := checkSessionID(sessionID); err != nil {
		return nil, 0, fmt.Errorf("load: %w", err)
	}
	subject := l.names.TranscriptSubject(sessionID)
	tail, err := l.lastRaw(ctx, subject)
	if err != nil {
		return nil, 0, fmt.Errorf("load %s: %w", sessionID, err)
	}
	if tail == nil {
		return nil, 0, nil
	}
	entries, lastSeq, err := l.read(ctx, subject, tail.Sequence)
	if err != nil {
		return nil, 0, fmt.Errorf("load %s: %w", sessionID, err)
	}
	applyRewinds(entries)
	return entries, lastSeq, nil
}

// read streams subject from its first entry up to upTo. The consumer may
// live on a replica that is still catching up, so it waits for upTo rather
// than trusting NumPending; if upTo was removed meanwhile (a purge), the wait
// runs into ReadTimeout and the Load fails, to be retried.
//
// On a cluster the ordered consumer (R1) is placed on any replica of the
// stream, and the first pull request, sent right after the consumer was
// created on another server than ours, is sometimes lost (most likely our
// server does not know that server's interest in the pull subject yet): the
// consumer then shows no waiting request and delivers nothing. Only the
// missing idle heartbeats reveal it, after two heartbeat intervals, and the
// ordered consumer is then recreated and pulls again. With nats.go's
// default heartbeat for an ordered consumer (5s) that came after our
// ReadTimeout; read asks for a heartbeat of ReadTimeout/5, so a lost pull
// costs about two fifths of it (see loadHeartbeat).
func (l *Log) read(ctx context.Context, subject string, upTo uint64) (entries []Entry, lastSeq uint64, err error) {
	cctx, cancel := l.readCtx(ctx)
	cons, err := l.js.OrderedConsumer(cctx, l.names.TranscriptStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{subject},
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: loadInactive,
		MaxResetAttempts:  loadResets,
		NamePrefix:        l.loadNamePrefix(),
	})
	cancel()
	if err != nil {
		return nil, 0, fmt.Errorf("create reader: %w", err)
	}
	defer l.deleteConsumer(ctx, cons)
	hb := l.loadHeartbeat()
	it, err := cons.Messages(jetstream.PullMaxMessages(loadBatch),
		jetstream.PullHeartbeat(hb), jetstream.PullExpiry(4*hb))
	if err != nil {
		return nil, 0, fmt.Errorf("start reader: %w", err)
	}
	defer it.Stop()

	for {
		nctx, cancel := l.readCtx(ctx)
		m, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		if err != nil {
			return nil, 0, fmt.Errorf("read after seq %d of %d: %w", lastSeq, upTo, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return nil, 0, fmt.Errorf("read after seq %d: %w", lastSeq, err)
		}
		seq := md.Sequence.Stream
		if seq > upTo {
			break // appended after the tail was read: the next Load gets it
		}
		e, err := decode(seq, m.Data(), m.Headers())
		if err != nil {
			return nil, 0, err
		}
		entries = append(entries, *e)
		lastSeq = seq
		if seq == upTo {
			break
		}
	}
	return entries, lastSeq, nil
}

// loadHeartbeat is the idle heartbeat of a Load's pull requests:
// ReadTimeout/5 within [loadHeartbeatMin, loadHeartbeatMax]. Two missed
// heartbeats recreate the consumer, so a lost pull request is retried well
// within one ReadTimeout.
func (l *Log) loadHeartbeat() time.Duration {
	return min(max(l.readTimeout/5, loadHeartbeatMin), loadHeartbeatMax)
}

// loadNamePrefix names a Load's ordered consumers: "" (nats.go picks a
// unique name) unless a test set namePrefix to aim at one consumer.
func (l *Log) loadNamePrefix() string {
	if l.namePrefix == nil {
		return ""
	}
	return l.namePrefix()
}

// deleteConsumer removes a Load's ephemeral consumer at once instead of
// leaving it to InactiveThreshold. Failure is harmless.
func (l *Log) deleteConsumer(ctx context.Context, cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.readTimeout)
	defer cancel()
	_ = l.js.DeleteConsumer(dctx, l.names.TranscriptStream(), info.Name)
}

// lastRaw returns the last message of subject, nil when there is none.
//
// It asks the stream leader (STREAM.MSG.GET), not DIRECT.GET: with
// AllowDirect any replica answers a direct get, and on R3 a follower that
// has not applied the last append yet answers with the one before it (the
// R3 contention test saw Load miss an acknowledged entry that way). Append
// resolves ambiguous outcomes and Load picks its end with this read, so it
// must see every acknowledged write. On R1 both are served by the one server.
func (l *Log) lastRaw(ctx context.Context, subject string) (*storedMsg, error) {
	return l.msgGet(ctx, broker.LeaderGetRequest{LastBySubject: subject})
}

// storedMsg is a message as the stream leader returns it, headers decoded.
type storedMsg struct {
	Subject  string
	Sequence uint64
	Data     []byte
	Header   nats.Header
}

// msgGet asks the stream leader for one message; nil when there is none.
func (l *Log) msgGet(ctx context.Context, req broker.LeaderGetRequest) (*storedMsg, error) {
	ctx, cancel := l.readCtx(ctx)
	defer cancel()
	stream := l.names.TranscriptStream()
	m, err := broker.LeaderGet(ctx, l.js, stream, req)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", stream, err)
	}
	sm := &storedMsg{Subject: m.Subject, Sequence: m.Sequence, Data: m.Data}
	if len(m.Header) > 0 {
		if sm.Header, err = nats.DecodeHeadersMsg(m.Header); err != nil {
			return nil, fmt.Errorf("read %s: decode headers of seq %d: %w", stream, m.Sequence, err)
		}
	}
	return sm, nil
}

// readCtx bounds one read by ReadTimeout unless ctx ends sooner.
func (l *Log) readCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, l.readTimeout)
}

// decode builds an Entry from a stored message.
func decode(seq uint64, data []byte, hdr nats.Header) (*Entry, error) {
	var e Entry
	if err := json.Unmarshal(data, &e); err != nil {
		return nil, fmt.Errorf("decode entry at seq %d: %w", seq, err)
	}
	if e.ID == "" {
		e.ID = hdr.Get(broker.HdrEntryID)
	}
	e.Seq = seq
	return &e, nil
}
