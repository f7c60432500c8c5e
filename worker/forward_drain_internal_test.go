package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestForwardToADrainingWorkerGoesBackAtOnce: deliveries forwarded to a
// worker that is draining are handed back without a delay once that worker
// no longer holds their lane, so the lane's next owner takes them at once
// (a rolling restart used to add the whole hand-back delay, 1 s, to a turn
// whose message came in while its lane was being released):
//   - "held": the draining worker still runs the lane (its turn is
//     finishing): it holds the delivery and hands it back when it releases
//     the lane (the lease is gone by then);
//   - "released": the draining worker released the lane already (the
//     forwarding worker's memory of the holder is a moment old): it hands
//     the delivery back at once.
//
// Each delivery's acknowledgements are watched on the server: no NAK with a
// delay, and the other worker answers the message.
func TestForwardToADrainingWorkerGoesBackAtOnce(t *testing.T) {
	t.Parallel()
	const ttl = 30 * time.Second
	srv, nc, js, names, res := provisionFleet(t, ttl)
	store := kv.NewStore(res, nil)

	acksOf := watchAcks(t, nc, names)

	lanes := drainLanes{t: t, js: js, store: store, names: names}
	post, entry, waitCommitted := lanes.post, lanes.entry, lanes.waitCommitted

	// The holder's agent: the turns of "stuck" (which keeps the holder
	// draining to the end) and "held" wait for their gate; the others
	// echo.
	backend, open := gatedBackend("stuck", "held")
	echoBackend := echo.Backend(echo.Options{})
	t.Cleanup(func() { open("stuck"); open("held") })
	start := func(id string, be agent.Backend) (*Worker, func()) {
		wnc := srv.Connect(t)
		w, err := New(wnc, natstest.JetStream(t, wnc), res, Config{ID: id, Names: names, Backend: be, LeaseTTL: ttl,
			DrainTimeout: 2 * time.Minute, Linger: time.Minute,
			Reset: session.ResetConfig{Default: session.ResetPolicy{Mode: session.ResetNone}}})
		if err != nil {
			t.Fatal(err)
		}
		return w, runWorker(t, w, "worker "+id)
	}

	// The holder runs the three lanes: "stuck" and "held" in a turn,
	// "released" idle.
	b, stopB := start("holder", backend)
	stuck, _ := post("stuck", "s1")
	released, r1 := post("released", "r1")
	waitCommitted(released, r1)
	held, _ := post("held", "h1")
	for _, lane := range []string{stuck, held} {
		lanes.waitTurnOnHolder(lane, b.Owner())
	}

	// The other worker saw the holder hold "held" and "released" a moment
	// ago: it forwards their new deliveries to it.
	a, _ := start("other", echoBackend)
	for _, lane := range []string{held, released} {
		a.heldElsewhere.Store(lane, heldInfo{until: time.Now().Add(time.Hour), owner: b.Owner()})
	}

	stopped := make(chan struct{})
	go func() { defer close(stopped); stopB() }()
	natstest.WaitFor(t, 30*time.Second, "the holder draining, \"released\" released", func() error {
		rs, err := ListWorkers(t.Context(), res.Workers)
		if err != nil {
			return err
		}
		draining := false
		for _, r := range rs {
			draining = draining || (r.Owner == b.Owner() && r.State == StateDraining)
		}
		e, err := entry(released)
		if err != nil {
			return err
		}
		if !draining || e.Owner != "" || b.LanesOwned() != 2 {
			return fmt.Errorf("draining %t, owner of %s %q, holder runs %d lanes", draining, released, e.Owner, b.LanesOwned())
		}
		return nil
	})

	// "held": forwarded while the holder still runs it.
	_, h2 := post("held", "h2")
	natstest.WaitFor(t, 30*time.Second, "the delivery of h2 forwarded to the holder", func() error {
		if n := b.Stats().ForwardsReceived.Load(); n < 1 {
			return fmt.Errorf("%d forwards received", n)
		}
		return nil
	})
	// "released": forwarded after the holder released it.
	_, r2 := post("released", "r2")
	natstest.WaitFor(t, 30*time.Second, "the delivery of r2 forwarded to the holder", func() error {
		if n := b.Stats().ForwardsReceived.Load(); n < 2 {
			return fmt.Errorf("%d forwards received", n)
		}
		return nil
	})
	waitCommitted(released, r2)
	open("held")
	waitCommitted(held, h2)

	for _, c := range []struct {
		lane string
		seq  uint64
	}{{held, h2}, {released, r2}} {
		e, err := entry(c.lane)
		if err != nil {
			t.Fatal(err)
		}
		if e.Owner != a.Owner() {
			t.Errorf("%s: owned by %q after the holder's release, want %q", c.lane, e.Owner, a.Owner())
		}
		checkNoDelayedNak(t, c.lane, c.seq, acksOf(c.seq))
	}
	open("stuck")
	<-stopped
}

// watchAcks records every acknowledgement of an inbox delivery (acks, NAKs,
// in-progress signals: publishes to the delivery's reply subject) and
// returns those of a stream seq so far.
// chatLane is the session key and lane of an HTTP DM chat with user "u".
func chatLane(chat string) (key, lane string) {
	src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: chat, ChatType: session.ChatDM, UserID: "u"}
	key = session.BuildSessionKey(src, session.DefaultKeyOptions())
	return key, session.LaneToken(key)
}

// drainLanes posts to chatLane's lanes and reads their entries, for the
// draining-forward tests.
type drainLanes struct {
	t     *testing.T
	js    jetstream.JetStream
	store *kv.Store
	names broker.Names
}

// post publishes text to chat's lane and returns the lane and its seq.
func (d drainLanes) post(chat, text string) (lane string, seq uint64) {
	d.t.Helper()
	_, lane = chatLane(chat)
	seq, err := postTo(d.t.Context(), d.js, d.names, chat, text)
	if err != nil {
		d.t.Fatal(err)
	}
	return lane, seq
}

func (d drainLanes) entry(lane string) (*session.SessionEntry, error) {
	e, _, err := d.store.Get(d.t.Context(), lane)
	return e, err
}

// waitTurnOnHolder waits until a turn of lane runs on the holder, the
// worker whose owner name is owner.
func (d drainLanes) waitTurnOnHolder(lane, owner string) {
	d.t.Helper()
	natstest.WaitFor(d.t, 30*time.Second, "a turn of "+lane+" running on the holder", func() error {
		e, err := d.entry(lane)
		if err != nil {
			return err
		}
		if e.Turn == nil || e.Owner != owner {
			return fmt.Errorf("turn %t, owner %q", e.Turn != nil, e.Owner)
		}
		return nil
	})
}

// waitCommitted waits until lane's entry has committed seq.
func (d drainLanes) waitCommitted(lane string, seq uint64) {
	d.t.Helper()
	natstest.WaitFor(d.t, 60*time.Second, "lane "+lane+" committed", func() error {
		e, err := d.entry(lane)
		if err != nil {
			return err
		}
		if e.CommittedSeq < seq {
			return fmt.Errorf("committed %d < %d", e.CommittedSeq, seq)
		}
		return nil
	})
}

func watchAcks(t *testing.T, nc *nats.Conn, names broker.Names) func(seq uint64) []string {
	var mu sync.Mutex
	acks := map[uint64][]string{}
	sub, err := nc.Subscribe("$JS.ACK.>", func(m *nats.Msg) {
		md, err := (&nats.Msg{Reply: m.Subject, Sub: m.Sub}).Metadata()
		if err != nil || md.Stream != names.InboxStream() {
			return
		}
		mu.Lock()
		acks[md.Sequence.Stream] = append(acks[md.Sequence.Stream], string(m.Data))
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() }) //nolint:errcheck
	return func(seq uint64) []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(acks[seq])
	}
}

// checkNoDelayedNak fails the test if the acknowledgements got of the
// delivery of seq hold a NAK with a delay, or are none.
func checkNoDelayedNak(t *testing.T, lane string, seq uint64, got []string) {
	t.Helper()
	for _, s := range got {
		if strings.HasPrefix(s, "-NAK") && strings.Contains(s, "delay") {
			t.Errorf("%s: the delivery of seq %d was handed back with a delay (%q; all: %q)", lane, seq, s, got)
		}
	}
	if len(got) == 0 {
		t.Errorf("%s: no acknowledgement seen for seq %d", lane, seq)
	}
}

// TestLeaseGoneWhenReadIsTaken: a lease acquisition whose create was
// refused but which found no lease when it read the holder (it was
// released, or ran out, in between: common in a rolling restart) takes the
// lane at once. It used to count as held by nobody in particular, and the
// delivery went back with a delay (a whole lease TTL with a turn in
// flight), its turn waiting that long.
func TestLeaseGoneWhenReadIsTaken(t *testing.T) {
	t.Parallel()
	const ttl = 30 * time.Second
	_, nc, js, names, res := provisionFleet(t, ttl)
	acksOf := watchAcks(t, nc, names)
	w, err := New(nc, js, res, Config{ID: "w", Names: names, Backend: echo.Backend(echo.Options{}), LeaseTTL: ttl,
		Reset: session.ResetConfig{Default: session.ResetPolicy{Mode: session.ResetNone}}})
	if err != nil {
		t.Fatal(err)
	}
	// The first acquisition meets the lease gone by the time it reads it.
	var vanished sync.Once
	acquire := w.acquireLease
	w.acquireLease = func(ctx context.Context, lane, owner string, live uint64) (*kv.Lease, error) {
		gone := false
		vanished.Do(func() { gone = true })
		if gone {
			return nil, &kv.HeldError{Lane: lane}
		}
		return acquire(ctx, lane, owner, live)
	}
	runWorker(t, w, "worker")

	src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: "vanished", ChatType: session.ChatDM, UserID: "u"}
	key := session.BuildSessionKey(src, session.DefaultKeyOptions())
	lane := session.LaneToken(key)
	data, _ := json.Marshal(session.Inbound{Source: src, SessionKey: key, Kind: session.KindMessage, Text: "hello", ReceivedAt: time.Now()})
	msg := nats.NewMsg(names.InboxSubject(session.Partition(names.Prefix(), lane), lane))
	msg.Data = data
	msg.Header.Set(broker.HdrSessionKey, key)
	msg.Header.Set(broker.HdrKind, session.KindMessage)
	ack, err := js.PublishMsg(t.Context(), msg)
	if err != nil {
		t.Fatal(err)
	}
	store := kv.NewStore(res, nil)
	natstest.WaitFor(t, 60*time.Second, "the message to be run", func() error {
		e, _, err := store.Get(t.Context(), lane)
		if err != nil {
			return err
		}
		if e.CommittedSeq < ack.Sequence {
			return fmt.Errorf("committed %d < %d", e.CommittedSeq, ack.Sequence)
		}
		return nil
	})
	natstest.WaitFor(t, 30*time.Second, "the delivery acknowledged", func() error {
		if len(acksOf(ack.Sequence)) == 0 {
			return fmt.Errorf("no acknowledgement yet")
		}
		return nil
	})
	checkNoDelayedNak(t, lane, ack.Sequence, acksOf(ack.Sequence))
	if n := w.Stats().HeldElsewhere.Load(); n != 0 {
		t.Errorf("the lane counted %d times as held elsewhere", n)
	}
}

// fakeMsg records how a delivery was handed back.
type fakeMsg struct {
	jetstream.Msg
	naks []time.Duration // -1: a NAK without delay
}

func (m *fakeMsg) Nak() error { m.naks = append(m.naks, -1); return nil }
func (m *fakeMsg) NakWithDelay(d time.Duration) error {
	m.naks = append(m.naks, d)
	return nil
}

// TestDrainingForwardMayStillHold: a draining worker hands a forwarded
// delivery of a lane it does not run back at once, unless it may still
// hold the lane's lease (a failed release, a give-up with the lease not
// proven taken): then with the delay, until the lease could have run out.
// TestForwardToADrainingWorkerThatMayHoldTheLease drives the paths that
// set it.
func TestDrainingForwardMayStillHold(t *testing.T) {
	w := &Worker{lanes: map[string]*lane{}}
	handBack := func() []time.Duration {
		m := &fakeMsg{}
		w.drainingForward("l", m, nil)
		return m.naks
	}
	if got := handBack(); !slices.Equal(got, []time.Duration{-1}) {
		t.Fatalf("a lane it does not hold: %v, want a NAK without delay", got)
	}
	w.mayHold.Store("l", time.Now().Add(time.Hour))
	if got := handBack(); !slices.Equal(got, []time.Duration{fwdBackDelay}) {
		t.Fatalf("a lane whose lease it may hold: %v, want a NAK after %s", got, fwdBackDelay)
	}
	w.mayHold.Store("l", time.Now().Add(-time.Second))
	if got := handBack(); !slices.Equal(got, []time.Duration{-1}) {
		t.Fatalf("a lane whose lease ran out: %v, want a NAK without delay", got)
	}
	if _, ok := w.mayHold.Load("l"); ok {
		t.Fatal("the lane whose lease ran out is still remembered")
	}
}

// TestForwardToADrainingWorkerThatMayHoldTheLease drives the paths that
// leave a lane's lease possibly naming a worker that no longer runs the
// lane, and checks that a delivery forwarded to that worker while it drains
// goes back with the delay (at once, its redelivery would read the lease,
// still naming this live worker, and be forwarded back here: a loop), and
// at once when the lease is proven gone:
//   - "relfail": the release's delete of the lease fails: the delivery the
//     lane held goes back with the delay, and so does one forwarded after
//     the release;
//   - "renewfail": the renewals fail until the lease could have expired
//     (lost, but not proven taken: the key may still be there): the lane
//     is given up and left as possibly held;
//   - "taken": the lease key is deleted under the owner (its renewal is
//     refused): given up, not possibly held, handed back at once.
func TestForwardToADrainingWorkerThatMayHoldTheLease(t *testing.T) {
	t.Parallel()
	const ttl = 9 * time.Second
	srv, nc, js, names, res := provisionFleet(t, ttl)
	store := kv.NewStore(res, nil)
	acksOf := watchAcks(t, nc, names)

	lanes := drainLanes{t: t, js: js, store: store, names: names}
	keyOf, post, waitCommitted := chatLane, lanes.post, lanes.waitCommitted
	subjectOf := func(lane string) string {
		return names.InboxSubject(session.Partition(names.Prefix(), lane), lane)
	}

	// The turns of "stuck" (which keeps the holder draining to the end)
	// and "relfail" wait for their gate; the others echo.
	backend, open := gatedBackend("stuck", "relfail")

	_, relfail := keyOf("relfail")
	_, renewfail := keyOf("renewfail")
	bnc := srv.Connect(t)
	b, err := New(bnc, natstest.JetStream(t, bnc), res, Config{ID: "holder", Names: names, Backend: backend, LeaseTTL: ttl,
		LeaseMargin: ttl / 3, DrainTimeout: 2 * time.Minute, Linger: time.Minute,
		Reset: session.ResetConfig{Default: session.ResetPolicy{Mode: session.ResetNone}}})
	if err != nil {
		t.Fatal(err)
	}
	// The faults: the release of "relfail" cannot delete its lease; the
	// renewals of "renewfail" fail once failRenew is set (as timeouts do:
	// the worker cannot tell whether they landed).
	var failRenew atomic.Bool
	renew, release := b.renewLease, b.releaseLease
	b.renewLease = func(ctx context.Context, lease *kv.Lease) error {
		if lease.Lane == renewfail && failRenew.Load() {
			return errors.New("injected: renewal timed out")
		}
		return renew(ctx, lease)
	}
	b.releaseLease = func(ctx context.Context, lease *kv.Lease) error {
		if lease.Lane == relfail {
			return errors.New("injected: release timed out")
		}
		return release(ctx, lease)
	}
	stopB := runWorker(t, b, "holder")
	// Runs before stopB: a drain waits for the gated turns.
	t.Cleanup(func() { open("stuck"); open("relfail") })
	runs := func(lane string) bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.lanes[lane] != nil
	}

	// The holder runs the four lanes: "stuck" and "relfail" in a turn,
	// "renewfail" and "taken" idle (lingering).
	stuck, _ := post("stuck", "s1")
	post("relfail", "f1")
	_, n1 := post("renewfail", "n1")
	taken, t1 := post("taken", "t1")
	waitCommitted(renewfail, n1)
	waitCommitted(taken, t1)
	for _, lane := range []string{stuck, relfail} {
		lanes.waitTurnOnHolder(lane, b.Owner())
	}

	// "taken": its lease key deleted under the holder; "renewfail": its
	// renewals fail from now on.
	if err := res.Leases.Purge(t.Context(), taken); err != nil {
		t.Fatal(err)
	}
	failRenew.Store(true)
	for _, lane := range []string{taken, renewfail} {
		natstest.WaitFor(t, 60*time.Second, "the holder to give "+lane+" up", func() error {
			if runs(lane) {
				return errors.New("still running")
			}
			return nil
		})
	}
	if b.mayHoldLease(taken, time.Now()) {
		t.Error("taken: a lane whose lease was deleted is remembered as possibly held")
	}
	if !b.mayHoldLease(renewfail, time.Now()) {
		t.Error("renewfail: a lane given up with its lease possibly still there is not remembered as possibly held")
	}

	// The holder drains (kept draining by "stuck"); "relfail" still runs
	// its turn.
	stopped := make(chan struct{})
	go func() { defer close(stopped); stopB() }()
	natstest.WaitFor(t, 30*time.Second, "the holder draining", func() error {
		rs, err := ListWorkers(t.Context(), res.Workers)
		if err != nil {
			return err
		}
		for _, r := range rs {
			if r.Owner == b.Owner() && r.State == StateDraining {
				return nil
			}
		}
		return errors.New("not draining")
	})

	// forward posts a message to the lane, takes a delivery of it (from a
	// consumer of the test's own) and forwards it to the holder, as a
	// worker that saw the holder hold the lane would.
	forward := func(chat string) (lane string, seq uint64) {
		t.Helper()
		lane, seq = post(chat, "forwarded")
		cons, err := js.CreateConsumer(t.Context(), names.InboxStream(), jetstream.ConsumerConfig{
			FilterSubject: subjectOf(lane), AckPolicy: jetstream.AckExplicitPolicy,
			DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: seq, InactiveThreshold: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		m, err := cons.Next(jetstream.FetchMaxWait(30 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		fm := nats.NewMsg(b.forwardSubject(b.Owner()))
		fm.Data = []byte(m.Reply())
		fm.Header.Set(hdrFwdLane, lane)
		fm.Header.Set(hdrFwdSubject, m.Subject())
		fm.Header.Set(broker.HdrSessionKey, m.Headers().Get(broker.HdrSessionKey))
		fm.Header.Set(broker.HdrKind, m.Headers().Get(broker.HdrKind))
		if err := nc.PublishMsg(fm); err != nil {
			t.Fatal(err)
		}
		return lane, seq
	}
	// answer is the first acknowledgement of the delivery of seq other
	// than an in-progress signal (a lane renews those it holds).
	answer := func(seq uint64) string {
		for _, a := range acksOf(seq) {
			if a != "+WPI" {
				return a
			}
		}
		return ""
	}
	handedBack := func(lane string, seq uint64) string {
		t.Helper()
		var got string
		natstest.WaitFor(t, 30*time.Second, fmt.Sprintf("the forward of %s seq %d handed back", lane, seq), func() error {
			if got = answer(seq); got == "" {
				return errors.New("no acknowledgement yet")
			}
			return nil
		})
		return got
	}
	checkHandedBack := func(what, got string, delayed bool) {
		t.Helper()
		switch {
		case !strings.HasPrefix(got, "-NAK"):
			t.Errorf("%s: the forward was answered with %q, want a NAK", what, got)
		case strings.Contains(got, "delay") != delayed:
			t.Errorf("%s: the forward was handed back with %q, want a delay: %t", what, got, delayed)
		}
	}

	// Forwards of the lanes the holder gave up (first: "renewfail" is
	// possibly held only for a lease TTL and a second after its loss).
	for _, c := range []struct {
		chat    string
		delayed bool
	}{{"renewfail", true}, {"taken", false}} {
		lane, seq := forward(c.chat)
		checkHandedBack(c.chat, handedBack(lane, seq), c.delayed)
	}

	// "relfail": a forward the running lane holds, handed back by the
	// release that cannot delete the lease.
	received := b.Stats().ForwardsReceived.Load()
	_, fwdHeld := forward("relfail")
	natstest.WaitFor(t, 30*time.Second, "the forward of relfail received", func() error {
		if n := b.Stats().ForwardsReceived.Load(); n <= received {
			return fmt.Errorf("%d forwards received", n)
		}
		return nil
	})
	if got := answer(fwdHeld); got != "" {
		t.Fatalf("relfail: the forward was answered with %q while the lane runs, want it held", got)
	}
	open("relfail")
	checkHandedBack("relfail (held)", handedBack(relfail, fwdHeld), true)
	natstest.WaitFor(t, 30*time.Second, "the holder to release relfail", func() error {
		if runs(relfail) {
			return errors.New("still running")
		}
		return nil
	})
	if !b.mayHoldLease(relfail, time.Now()) {
		t.Error("relfail: a lane whose lease could not be deleted is not remembered as possibly held")
	}

	// A forward of "relfail" after its release.
	lane, seq := forward("relfail")
	checkHandedBack("relfail (released)", handedBack(lane, seq), true)
	open("stuck")
	<-stopped
}

// TestLeftHeldCountsTheLastRenewalSent: a lane left possibly held is so
// until a TTL (plus leaseExpirySlack) after its last renewal sent, not only
// after its last confirmed one: a renewal that failed (a timeout) may have
// landed, and the key then lives a TTL from it.
func TestLeftHeldCountsTheLastRenewalSent(t *testing.T) {
	const ttl = 10 * time.Second
	w := &Worker{cfg: Config{LeaseTTL: ttl}}
	o := &owner{w: w, lane: "l", lease: &kv.Lease{}}
	confirmed := mono()
	o.renewedAt.Store(confirmed)
	until := func() time.Time {
		o.leftHeld()
		v, _ := w.mayHold.Load("l")
		return v.(time.Time)
	}
	if got, want := until(), monoBase.Add(time.Duration(confirmed)+ttl+leaseExpirySlack); !got.Equal(want) {
		t.Errorf("after a confirmed renewal: possibly held until %v, want %v", got, want)
	}
	tried := confirmed + int64(ttl/3)
	o.triedAt.Store(tried)
	if got, want := until(), monoBase.Add(time.Duration(tried)+ttl+leaseExpirySlack); !got.Equal(want) {
		t.Errorf("after a failed renewal: possibly held until %v, want %v", got, want)
	}
}
