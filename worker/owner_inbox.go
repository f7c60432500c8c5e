package worker

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/telemetry"
)

// The owner's view of the lane's inbox: the deliveries held for it, the
// hints that announce its messages, and peek, which reads them.

// inboxMsg is one lane message read from the inbox stream.
type inboxMsg struct {
	seq uint64
	// inboxID is the identity of the inbox stream seq counts in.
	inboxID string
	kind    string
	body    session.Inbound
	// trace is the span context of the message's publish, if traced.
	trace trace.SpanContext
}

// peek returns the lane's first inbox message at or after seq, or nil.
//
// A message a hint carried answers without a read when it is exactly that
// message: the hint's Nats-Last-Sequence is the lane subject's previous seq
// at the time it was stored, so a hinted message m is the first at or after
// seq iff m.last < seq <= m.seq. Otherwise it is a direct get.
func (o *owner) peek(ctx context.Context, seq uint64) (*inboxMsg, error) {
	if seq == 0 {
		seq = 1
	}
	if in := o.in.Load(); in != nil && o.suspect.Swap(false) {
		if _, err := o.w.inboxes.Reopen(context.WithoutCancel(ctx), in, false); err != nil {
			o.suspect.Store(true)
			return nil, err
		}
	}
	if in := o.in.Load(); in != nil && in.Stale() {
		// The stream was deleted (and maybe made again): what a read by
		// its name finds now is not the ownership's stream. The lane is
		// released (moved) and taken again on the new incarnation.
		return nil, errInboxGone
	}
	if m := o.hintedAt(seq); m != nil {
		return m, nil
	}
	raw, err := o.inbox().Stream.GetMsg(context.WithoutCancel(ctx), seq, jetstream.WithGetMsgSubject(o.subject))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return o.decodeInbox(raw.Sequence, raw.Header, raw.Data), nil
}

func (o *owner) decodeInbox(seq uint64, hdr nats.Header, data []byte) *inboxMsg {
	m := &inboxMsg{seq: seq, kind: hdr.Get(broker.HdrKind), trace: telemetry.SpanContextOf(hdr)}
	if in := o.in.Load(); in != nil {
		m.inboxID = in.ID
	} else if o.w != nil {
		m.inboxID = o.inbox().ID
	}
	if err := json.Unmarshal(data, &m.body); err != nil {
		// Ingress never writes this; keep the lane moving with an empty
		// message rather than wedging it.
		o.log.Error("undecodable inbox message", slog.Uint64("seq", seq), slog.Any("error", err))
		m.body = session.Inbound{Kind: session.KindMessage}
	}
	if m.kind == "" {
		m.kind = m.body.Kind
	}
	if m.kind == "" {
		m.kind = session.KindMessage
	}
	if m.body.SessionKey == "" {
		m.body.SessionKey = hdr.Get(broker.HdrSessionKey)
	}
	return m
}

func seqOf(m jetstream.Msg) uint64 {
	md, err := m.Metadata()
	if err != nil {
		return 0
	}
	return md.Sequence.Stream
}

func seqString(s uint64) string { return strconv.FormatUint(s, 10) }

// inbox is the lane's inbox stream: the one bound to the ownership, or,
// before one, the one the inbox map names now.
func (o *owner) inbox() *broker.Inbox {
	if in := o.in.Load(); in != nil {
		return in
	}
	return o.w.inboxes.ForLane(o.lane)
}

// bind fixes the lane's inbox stream for an ownership: the one the map names
// now. Held deliveries of another stream or incarnation (the map changed,
// or the stream was recreated, since they were offered) are handed back:
// their seqs count in another stream.
func (o *owner) bind() *broker.Inbox {
	in := o.w.inboxes.ForLane(o.lane)
	o.in.Store(in)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.heldOf(in)
	return in
}

// heldOf hands back the held deliveries unless they are of inbox stream in
// (o.mu held), and records that those held from now on are.
func (o *owner) heldOf(in *broker.Inbox) {
	if o.heldFrom == in {
		return
	}
	for s, m := range o.held {
		o.settled("nak", s, m.NakWithDelay(time.Second))
		delete(o.held, s)
	}
	o.heldFrom = in
}

// moved reports whether the inbox map now puts the lane in another stream
// than the ownership's (a migration moved its partition), or the
// ownership's stream was recreated (a new incarnation, seqs from 1): the
// owner then releases the lane as soon as it is idle, and the next owner
// reads the new stream.
func (o *owner) moved() bool {
	in := o.in.Load()
	return in != nil && (in.Stale() || o.w.inboxes.ForLane(o.lane) != in)
}

func streamOf(m jetstream.Msg) string {
	md, err := m.Metadata()
	if err != nil {
		return ""
	}
	return md.Stream
}

// offer hands a delivery of inbox stream from to the lane; false when the
// runner has stopped.
func (o *owner) offer(m jetstream.Msg, from *broker.Inbox) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return false
	}
	if in := o.inbox(); from != in || in.Stale() {
		// A delivery of another inbox stream than the lane is read from
		// (its partition moved), or of another incarnation of it (it was
		// recreated): its seq means nothing here. Handed back for the
		// lane's next owner, once this one released.
		o.settled("nak", seqOf(m), m.NakWithDelay(time.Second))
		return true
	}
	// Deliveries held before the set took a newer incarnation of the
	// stream (before the lane was bound) go back.
	o.heldOf(from)
	// A redelivery of a delivery we hold supersedes it.
	seq := seqOf(m)
	o.held[seq] = m
	o.heard(seq)
	select {
	case o.signal <- struct{}{}:
	default:
	}
	return true
}

func (o *owner) closeInbox() []jetstream.Msg {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	o.heldOf(o.inbox())
	out := make([]jetstream.Msg, 0, len(o.held))
	for _, m := range o.held {
		out = append(out, m)
	}
	o.held = map[uint64]jetstream.Msg{}
	return out
}

// ackUpTo acks held deliveries at or below seq; it reports whether any
// deliveries remain held.
func (o *owner) ackUpTo(seq uint64) bool {
	o.dropHinted(seq)
	in := o.inbox()
	name := in.Name
	o.mu.Lock()
	defer o.mu.Unlock()
	// Held deliveries of another incarnation of the stream than the one
	// seq counts in are handed back, never acked.
	o.heldOf(in)
	stale := in.Stale()
	for s, m := range o.held {
		if stale || streamOf(m) != name {
			// Of another stream (the map changed since it was held): seq
			// counts elsewhere, so it is handed back, never acked here.
			// Nor is one of a stale incarnation (the stream was deleted
			// and made again; the lane releases): an ack subject names
			// the consumer, not its incarnation, so the new stream's
			// consumer, of the same name, could take the ack for its own
			// delivery of the same seq, a message not run.
			o.settled("nak", s, m.NakWithDelay(time.Second))
			delete(o.held, s)
			continue
		}
		if s <= seq {
			o.settled("ack", s, m.Ack())
			delete(o.held, s)
		}
	}
	return len(o.held) > 0
}

func (o *owner) heldCount() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.held)
}

func (o *owner) firstHeldKey() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, m := range o.held {
		if k := m.Headers().Get(broker.HdrSessionKey); k != "" {
			return k
		}
	}
	return ""
}

// nakHeld hands every held delivery back, after delay.
func (o *owner) nakHeld(delay time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for s, m := range o.held {
		d := delay
		if d < 0 {
			// Short and doubling with the delivery count, capped at the TTL.
			d = time.Second
			if md, err := m.Metadata(); err == nil && md.NumDelivered > 1 {
				for i := uint64(1); i < md.NumDelivered && d < o.w.cfg.LeaseTTL; i++ {
					d *= 2
				}
			}
			if d > o.w.cfg.LeaseTTL {
				d = o.w.cfg.LeaseTTL
			}
		}
		if d == 0 {
			o.settled("nak", s, m.Nak())
		} else {
			o.settled("nak", s, m.NakWithDelay(d))
		}
		delete(o.held, s)
	}
}

func (o *owner) inProgressHeld() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for s, m := range o.held {
		o.settled("in progress", s, m.InProgress())
	}
}

// settled logs an ack, nak or in-progress signal that did not reach the
// server. Nothing else is done about it: the delivery comes back after its
// ack wait (or its delay), and a lane reads its inbox from the stream, so a
// lost signal costs a redelivery, never a message.
func (o *owner) settled(what string, seq uint64, err error) {
	if err != nil {
		o.log.Debug("delivery signal failed", slog.String("signal", what), slog.Uint64("seq", seq), slog.Any("error", err))
	}
}

// heard records that inbox seq exists on the lane.
func (o *owner) heard(seq uint64) { raise(&o.known, seq) }

// raise sets v to seq if that is higher.
func raise(v *atomic.Uint64, seq uint64) {
	for {
		cur := v.Load()
		if seq <= cur || v.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// hintGrace is how long a read waits for the hint of a message only its
// delivery announced so far: the server sends both at once, and the hint
// carries the message, which saves the read.
const hintGrace = 20 * time.Millisecond

// awaitHint waits up to hintGrace for a hint above seq.
func (o *owner) awaitHint(seq uint64) {
	if o.hintKnown.Load() > seq {
		return
	}
	t := time.NewTimer(hintGrace)
	defer t.Stop()
	for o.hintKnown.Load() <= seq {
		select {
		case <-o.hints:
		case <-t.C:
			return
		case <-o.ctx.Done():
			return
		}
	}
}

// mayHaveAfter reports whether the inbox may hold a message of the lane
// after seq: always when blind, otherwise only when one was heard of.
func (o *owner) mayHaveAfter(seq uint64) bool {
	return o.blind.Load() || o.known.Load() > seq
}

// hintedMsg is a message a hint carried, with the lane subject's previous
// seq when it was stored.
type hintedMsg struct {
	last uint64
	msg  *inboxMsg
}

// maxHinted bounds the hinted messages kept per lane; beyond it the oldest
// go, and peek reads them from the stream.
const maxHinted = 64

// keepHint records the message a hint carries and returns its seq; false
// when the hint lacks the sequence headers.
func (o *owner) keepHint(m *nats.Msg) (uint64, bool) {
	if in, from := o.in.Load(), m.Header.Get(jetstream.StreamHeader); in != nil && from != "" && from != in.Name {
		return 0, false // a hint of another inbox stream: its seqs count there
	}
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil || seq == 0 {
		return 0, false
	}
	last, err := strconv.ParseUint(m.Header.Get(jetstream.LastSequenceHeader), 10, 64)
	if err == nil && last < o.committed.Load() {
		// The lane subject's previous message is below the committed
		// one: in the stream committed_seq counts in, that one is still
		// there (only prune purges it, with no owner). The stream was
		// most likely recreated: the next read checks (see peek).
		o.suspect.Store(true)
		return 0, false
	}
	if err != nil || last >= seq || m.Header.Get("Nats-Msg-Size") != "" {
		return seq, true // usable as a hint, not as the message
	}
	h := hintedMsg{last: last, msg: o.decodeInbox(seq, m.Header, m.Data)}
	o.hintMu.Lock()
	defer o.hintMu.Unlock()
	if n := len(o.hinted); n > 0 && o.hinted[n-1].msg.seq >= seq {
		return seq, true // out of order or repeated: ignore
	}
	if len(o.hinted) == maxHinted {
		o.hinted = append(o.hinted[:0], o.hinted[1:]...)
	}
	o.hinted = append(o.hinted, h)
	return seq, true
}

// hintedAt returns the hinted message that is the lane's first at or after
// seq, or nil.
func (o *owner) hintedAt(seq uint64) *inboxMsg {
	o.hintMu.Lock()
	defer o.hintMu.Unlock()
	for _, h := range o.hinted {
		if h.last < seq && seq <= h.msg.seq {
			return h.msg
		}
	}
	return nil
}

// dropHinted forgets the hinted messages at or below seq.
func (o *owner) dropHinted(seq uint64) {
	o.hintMu.Lock()
	defer o.hintMu.Unlock()
	i := 0
	for i < len(o.hinted) && o.hinted[i].msg.seq <= seq {
		i++
	}
	o.hinted = append(o.hinted[:0], o.hinted[i:]...)
}
