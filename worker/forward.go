package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
)

// Forwarded deliveries.
//
// The workers share one pull consumer, so with N workers a lane's wake-up
// lands on a worker that does not own it about (N-1)/N of the time. Such a
// worker used to hand it back (a NAK with a delay), and the server delivered
// it again to any worker, until it reached the owner or the owner's commit
// made it stale: a NAK and one or more redeliveries per message. A worker
// that knows which worker holds the lane (it saw the lease a moment ago, see
// heldElsewhere) now forwards the delivery to that worker instead, as a core
// message carrying the delivery's reply subject; the owner holds it as its
// own and acks, NAKs or extends it exactly as one it pulled itself (an ack is
// a publish to that reply subject, whoever sends it).
//
// The lease stays the only judge of ownership: a forward is a wake-up and
// nothing more. If the forward is lost or its target no longer runs the lane,
// nothing is lost either way: a target that does not run the lane starts a
// runner for it (or NAKs the delivery at once), and a forward to a worker
// that is gone comes back as the server's "no responders" status on the
// forward's reply subject (the target sends nothing back otherwise): the
// delivery is NAKed at once and its redelivery looks at the lease. A forward
// lost any other way (a worker cut off without its connection closing)
// leaves the delivery unacknowledged, so the server delivers it again after
// the consumer's ack wait, as it does with the deliveries a dead owner held
// itself; the lease-expiry wake-ups do not depend on it.
//
// A forward names the incarnation of the inbox stream its delivery came
// from (hdrFwdInbox: the identity of the sender's broker.Inbox). An inbox
// stream deleted and made again under the same name counts its seqs from 1
// again, and the two workers may not have noticed it at the same moment: the
// receiver judges the delivery's seq only against that same incarnation,
// and hands it back otherwise, as it does a delivery it pulled itself from
// an incarnation that is not current, and has the stream's identity read
// (see checkForwardedIncarnation). A
// forward without the header (from a worker that predates it) is taken as
// of the receiver's incarnation of the stream, as before.

// Headers of a forwarded delivery. The data is the delivery's reply subject.
const (
	hdrFwdLane    = "Fleet-Fwd-Lane"
	hdrFwdSubject = "Fleet-Fwd-Subject"
	// hdrFwdInbox is the identity (fleet_inbox_id) of the incarnation of
	// the inbox stream the delivery came from.
	hdrFwdInbox = "Fleet-Fwd-Inbox"
)

// forwardToken is the subject token of a worker's forward subject: a hash
// of its owner id (owner ids may hold characters a subject cannot).
func forwardToken(owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return hex.EncodeToString(sum[:12])
}

// forwardSubject is the core subject on which the worker with owner id
// owner receives the deliveries other workers forward to it.
func (w *Worker) forwardSubject(owner string) string {
	return w.names.ForwardSubject(forwardToken(owner))
}

// heldInfo is what a worker remembers of a lane another worker holds.
type heldInfo struct {
	until time.Time // remembered until then
	owner string    // the holder's owner id ("" when unknown)
}

// forward sends msg, a delivery of lane laneTok from incarnation from of its
// inbox stream, to the worker with owner id owner. It reports false when it
// could not be sent, or from is not known or no longer current (the caller
// hands the delivery back instead).
func (w *Worker) forward(owner, laneTok string, msg jetstream.Msg, from *broker.Inbox) bool {
	reply := msg.Reply()
	if reply == "" || owner == "" || owner == w.owner || from == nil || from.Stale() {
		return false
	}
	if v, ok := w.fwd.gone.Load(owner); ok {
		if time.Now().Before(v.(time.Time)) {
			return false // a forward to it bounced a moment ago
		}
		w.fwd.gone.Delete(owner)
	}
	fm := nats.NewMsg(w.forwardSubject(owner))
	fm.Data = []byte(reply)
	id := w.fwd.add(msg, laneTok, owner)
	fm.Reply = w.fwd.inbox + "." + id
	fm.Header.Set(hdrFwdLane, laneTok)
	fm.Header.Set(hdrFwdSubject, msg.Subject())
	fm.Header.Set(hdrFwdInbox, from.ID)
	if k := msg.Headers().Get(broker.HdrSessionKey); k != "" {
		fm.Header.Set(broker.HdrSessionKey, k)
	}
	if k := msg.Headers().Get(broker.HdrKind); k != "" {
		fm.Header.Set(broker.HdrKind, k)
	}
	if err := w.nc.PublishMsg(fm); err != nil {
		w.fwd.take(id)
		w.log.Debug("forward delivery", slog.String("lane", laneTok), slog.Any("error", err))
		return false
	}
	w.stats.Forwarded.Add(1)
	return true
}

// fwdBackDelay is how long a forwarded delivery this worker cannot take
// (no lane slot free, or, while draining, a lane whose lease it may still
// hold with no runner) waits before it is delivered again.
const fwdBackDelay = time.Second

// subscribeForwards receives the deliveries other workers forward to this
// one. A forward for a lane this worker runs is held by that lane; one for
// a lane it does not run (released meanwhile) starts a runner, as a
// delivery would; with no lane slot free it is handed back with a delay
// (fwdBackDelay). While draining, see drainingForward.
func (w *Worker) subscribeForwards() (unsub func(), err error) {
	w.fwd.inbox = w.nc.NewInbox()
	back, err := w.nc.Subscribe(w.fwd.inbox+".*", func(m *nats.Msg) {
		// Only the server writes here: "no responders" for a forward whose
		// target is gone.
		if m.Header.Get("Status") != "503" {
			return
		}
		id := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
		if p, ok := w.fwd.take(id); ok {
			// Its target is gone: forward nothing more to it for a while
			// (if it died holding leases, the deliveries of its lanes are
			// handed back with a delay until its liveness lease runs out),
			// and hand this delivery back at once: if the target stopped
			// cleanly, its lanes are free now.
			w.stats.ForwardsBounced.Add(1)
			w.fwd.markGone(p.owner, time.Now())
			w.heldElsewhere.Delete(p.lane)
			_ = p.msg.Nak()
		}
	})
	if err != nil {
		return nil, err
	}
	sub, err := w.nc.Subscribe(w.forwardSubject(w.owner), func(m *nats.Msg) {
		laneTok := m.Header.Get(hdrFwdLane)
		d := &fwdDelivery{m: &nats.Msg{Subject: m.Header.Get(hdrFwdSubject), Reply: string(m.Data), Header: m.Header, Sub: m.Sub}}
		if laneTok == "" || d.m.Reply == "" {
			return
		}
		w.stats.ForwardsReceived.Add(1)
		from := w.inboxes.ByName(streamOf(d))
		id := m.Header.Get(hdrFwdInbox)
		mismatch := id != "" && (from == nil || from.ID != id || from.Stale())
		if w.draining() {
			if mismatch {
				// Of another incarnation than this worker's: handed back
				// (a draining worker takes no new view of the stream).
				from = nil
			}
			w.drainingForward(laneTok, d, from)
			return
		}
		if mismatch {
			// Of an incarnation that is not this worker's current one:
			// either the sender's view is the older or this worker's
			// is. Handed back at once, as a delivery of a stale
			// incarnation pulled here is, and the stream's identity
			// read by the watcher, not here: the read would hold up
			// every forward behind this one.
			w.checkForwardedIncarnation(from)
			w.stats.ForwardsStale.Add(1)
			_ = d.NakWithDelay(time.Second)
			return
		}
		// Never forwarded again from here: a lane this worker does not run
		// gets a runner, which judges by the lease (and forwards to its
		// holder, if another worker took it meanwhile).
		if !w.runLocal(laneTok, d, from, false) {
			_ = d.NakWithDelay(fwdBackDelay)
		}
	})
	if err != nil {
		back.Unsubscribe() //nolint:errcheck
		return nil, err
	}
	return func() {
		sub.Unsubscribe()  //nolint:errcheck
		back.Unsubscribe() //nolint:errcheck
	}, nil
}

// drainingForward hands back a delivery forwarded to this worker while it
// drains. It must not come straight back: the redelivery of a NAK looks at
// the lane's lease, and while this worker holds it, forwards to it again (a
// loop of NAKs and redeliveries for as long as its turn takes to end).
// Nor may it wait longer than the lane takes to change hands: a rolling
// restart forwards the messages that arrive while a lane is released to
// the stopping worker, and a delay there is added to the turn (the lane's
// handover wake can sit in the same forward).
//   - A lane this worker still runs holds the delivery as its own: the
//     lane hands it back when it releases the lease (at once, the lease
//     deleted first: see release), or acks it if its commit covers it.
//   - A lane it does not run is handed back at once, unless this worker
//     may still hold its lease (mayHold): then with a delay, as before.
//
// from is this worker's incarnation of the delivery's inbox stream, nil
// when the delivery is of another (a lane it runs hands it back).
func (w *Worker) drainingForward(laneTok string, d jetstream.Msg, from *broker.Inbox) {
	w.mu.Lock()
	l := w.lanes[laneTok]
	held := l != nil && l.offer(d, from)
	w.mu.Unlock()
	switch {
	case held:
	case w.mayHoldLease(laneTok, time.Now()):
		_ = d.NakWithDelay(fwdBackDelay)
	default:
		_ = d.Nak()
	}
}

// checkForwardedIncarnation has the identity of inbox stream cur's stream
// read, for a forwarded delivery of another incarnation than cur, the set's
// now (or of cur, stale): either the sender's is the older (this worker
// already took the stream's new incarnation, or found it gone) or this
// worker's is (it has not noticed yet). The watcher reads it (see
// inboxAdvisories.recheck) and the set takes a newer incarnation found, as
// a check of the pull loop would; the sender's next forward of the
// delivery, handed back meanwhile, then finds it. An older sender's held
// deliveries come in a burst: the stream is handed over at most once a
// second for forwards.
func (w *Worker) checkForwardedIncarnation(cur *broker.Inbox) {
	if cur == nil {
		return // a stream the inbox map does not name here
	}
	now := time.Now()
	w.fwd.mu.Lock()
	if w.fwd.checked == nil {
		w.fwd.checked = map[string]time.Time{}
	}
	asked := now.Before(w.fwd.checked[cur.Name])
	if !asked {
		w.fwd.checked[cur.Name] = now.Add(time.Second)
	}
	w.fwd.mu.Unlock()
	if !asked {
		w.inboxNotes.recheck(cur.Name)
	}
}

// mayHoldLease reports whether this worker may hold the lease of a lane it
// no longer runs at now (see owner.leftHeld).
func (w *Worker) mayHoldLease(laneTok string, now time.Time) bool {
	v, ok := w.mayHold.Load(laneTok)
	if !ok {
		return false
	}
	if now.Before(v.(time.Time)) {
		return true
	}
	w.mayHold.CompareAndDelete(laneTok, v)
	return false
}

// markGone remembers that forwards to owner bounced at now, for
// heldElsewhereFor, and forgets the owners whose time ran out: each
// stopped incarnation of a peer leaves an owner id here, and one that is
// never forwarded to again would otherwise stay for good.
func (f *forwards) markGone(owner string, now time.Time) {
	f.gone.Range(func(k, v any) bool {
		if !now.Before(v.(time.Time)) {
			f.gone.Delete(k)
		}
		return true
	})
	f.gone.Store(owner, now.Add(heldElsewhereFor))
}

// fwdBounceWait is how long a forward is remembered for a "no responders"
// answer; the server sends it at once, as it routes the forward.
const fwdBounceWait = 2 * time.Second

// forwards are the forwards sent in the last fwdBounceWait, by id, so that
// a bounced one can be handed back.
type forwards struct {
	inbox string // reply subjects are inbox.<id>
	mu    sync.Mutex
	seq   uint64
	byID  map[string]pendingFwd
	order []string // ids in the order sent
	// gone holds the owner ids a forward to which bounced: owner -> time
	// until which nothing is forwarded to it.
	gone sync.Map
	// checked is, by inbox stream name, until when a forwarded
	// delivery's incarnation does not hand the stream to the watcher
	// again (checkForwardedIncarnation; guarded by mu). One entry per
	// stream.
	checked map[string]time.Time
}

type pendingFwd struct {
	msg   jetstream.Msg
	lane  string
	owner string
	at    time.Time
}

// add remembers a forward of msg and returns its id, forgetting those sent
// longer than fwdBounceWait ago.
func (f *forwards) add(msg jetstream.Msg, lane, owner string) string {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byID == nil {
		f.byID = map[string]pendingFwd{}
	}
	n := 0
	for n < len(f.order) {
		p, ok := f.byID[f.order[n]]
		if ok && now.Sub(p.at) < fwdBounceWait {
			break
		}
		delete(f.byID, f.order[n])
		n++
	}
	f.order = append(f.order[:0], f.order[n:]...)
	f.seq++
	id := strconv.FormatUint(f.seq, 36)
	f.byID[id] = pendingFwd{msg: msg, lane: lane, owner: owner, at: now}
	f.order = append(f.order, id)
	return id
}

// take forgets forward id and returns it, if it was still remembered.
func (f *forwards) take(id string) (pendingFwd, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.byID[id]
	delete(f.byID, id)
	return p, ok
}

// fwdDelivery is a delivery another worker forwarded: its acknowledgements
// are publishes to its reply subject on this worker's connection.
type fwdDelivery struct {
	m *nats.Msg // Reply is the delivery's reply subject; Sub is the forward subscription
}

var _ jetstream.Msg = (*fwdDelivery)(nil)

func (d *fwdDelivery) Metadata() (*jetstream.MsgMetadata, error) {
	md, err := d.m.Metadata()
	if err != nil {
		return nil, err
	}
	out := &jetstream.MsgMetadata{NumDelivered: md.NumDelivered, NumPending: md.NumPending, Timestamp: md.Timestamp,
		Stream: md.Stream, Consumer: md.Consumer, Domain: md.Domain}
	out.Sequence.Stream = md.Sequence.Stream
	out.Sequence.Consumer = md.Sequence.Consumer
	return out, nil
}

func (d *fwdDelivery) Data() []byte                        { return nil }
func (d *fwdDelivery) Headers() nats.Header                { return d.m.Header }
func (d *fwdDelivery) Subject() string                     { return d.m.Subject }
func (d *fwdDelivery) Reply() string                       { return d.m.Reply }
func (d *fwdDelivery) Ack() error                          { return d.m.Ack() }
func (d *fwdDelivery) DoubleAck(ctx context.Context) error { return d.m.AckSync(nats.Context(ctx)) }
func (d *fwdDelivery) Nak() error                          { return d.m.Nak() }
func (d *fwdDelivery) NakWithDelay(delay time.Duration) error {
	return d.m.NakWithDelay(delay)
}
func (d *fwdDelivery) InProgress() error                  { return d.m.InProgress() }
func (d *fwdDelivery) Term() error                        { return d.m.Term() }
func (d *fwdDelivery) TermWithReason(reason string) error { return d.m.Term() }

// forwardHeld forwards every held delivery to the worker with owner id
// owner; those that cannot be forwarded are handed back with nakHeld(delay).
func (o *owner) forwardHeld(owner string, delay time.Duration) {
	o.mu.Lock()
	var back bool
	for s, m := range o.held {
		if !o.w.forward(owner, o.lane, m, o.heldFrom) {
			back = true
			continue
		}
		delete(o.held, s)
	}
	o.mu.Unlock()
	if back {
		o.nakHeld(delay)
	}
}
