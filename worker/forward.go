package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
// nothing is lost either way: a target that does not run the lane NAKs the
// delivery at once (it goes back to the shared consumer), and a forward that
// reaches nobody (the target died) leaves the delivery unacknowledged, so the
// server delivers it again after the consumer's ack wait, as it does with the
// deliveries a dead owner held itself; the lease-expiry wake-ups do not
// depend on it.

// Headers of a forwarded delivery. The data is the delivery's reply subject.
const (
	hdrFwdLane    = "Fleet-Fwd-Lane"
	hdrFwdSubject = "Fleet-Fwd-Subject"
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
	return w.names.Prefix() + ".ctl.fwd." + forwardToken(owner)
}

// heldInfo is what a worker remembers of a lane another worker holds.
type heldInfo struct {
	until time.Time // remembered until then
	owner string    // the holder's owner id ("" when unknown)
}

// forward sends msg, a delivery of lane laneTok, to the worker with owner id
// owner. It reports false when it could not be sent (the caller hands the
// delivery back instead).
func (w *Worker) forward(owner, laneTok string, msg jetstream.Msg) bool {
	reply := msg.Reply()
	if reply == "" || owner == "" || owner == w.owner {
		return false
	}
	fm := nats.NewMsg(w.forwardSubject(owner))
	fm.Data = []byte(reply)
	fm.Header.Set(hdrFwdLane, laneTok)
	fm.Header.Set(hdrFwdSubject, msg.Subject())
	if k := msg.Headers().Get(broker.HdrSessionKey); k != "" {
		fm.Header.Set(broker.HdrSessionKey, k)
	}
	if k := msg.Headers().Get(broker.HdrKind); k != "" {
		fm.Header.Set(broker.HdrKind, k)
	}
	if err := w.nc.PublishMsg(fm); err != nil {
		w.log.Debug("forward delivery", "lane", laneTok, "error", err)
		return false
	}
	w.stats.Forwarded.Add(1)
	return true
}

// subscribeForwards receives the deliveries other workers forward to this
// one. A forward for a lane this worker runs is held by that lane; one for
// a lane it does not run (released meanwhile) starts a runner, as a
// delivery would; with no lane slot free, or while draining, it is handed
// back at once.
func (w *Worker) subscribeForwards() (*nats.Subscription, error) {
	return w.nc.Subscribe(w.forwardSubject(w.owner), func(m *nats.Msg) {
		laneTok := m.Header.Get(hdrFwdLane)
		d := &fwdDelivery{m: &nats.Msg{Subject: m.Header.Get(hdrFwdSubject), Reply: string(m.Data), Header: m.Header, Sub: m.Sub}}
		if laneTok == "" || d.m.Reply == "" {
			return
		}
		w.stats.ForwardsReceived.Add(1)
		// Never forwarded again from here: a lane this worker does not run
		// gets a runner, which judges by the lease (and forwards to its
		// holder, if another worker took it meanwhile).
		if w.draining() || !w.runLocal(laneTok, d, false) {
			_ = d.Nak()
		}
	})
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
		if !o.w.forward(owner, o.lane, m) {
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
