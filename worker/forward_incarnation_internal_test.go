package worker

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestForwardOfAnotherIncarnation: a delivery forwarded to a worker is
// judged against the incarnation of the inbox stream it came from, which
// the forward names, not against whichever incarnation the receiver has.
// The lane's entry counts committed seq 4 in the stream's first
// incarnation, and the forwarded delivery has seq 1:
//   - from an incarnation the receiver does not have (the sender's view is
//     not current): handed back, not acked as committed;
//   - from the stream's new incarnation, which the receiver has not noticed
//     yet (the stream was deleted and made again, seqs from 1): the
//     receiver hands the delivery back, rather than ack a new message as
//     committed in the old stream, and its watcher reads the stream's
//     identity and takes the new incarnation;
//   - a forward without the incarnation (a worker that predates it) is
//     judged by the receiver's view, as before: acked as committed.
//
// The receiver runs no pull loop (its Run is not started; only its forward
// subscription and its watcher are), and its watcher follows no advisories
// and checks the streams only every hour, so nothing but the forward can
// tell it the stream was made again.
func TestForwardOfAnotherIncarnation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		recreate bool
		header   func(oldID, newID string) string
		want     string
	}{
		{"sender's incarnation not current", false, func(string, string) string { return "0123456789abcdef0123456789abcdef" }, "-NAK"},
		{"receiver's view older", true, func(_, newID string) string { return newID }, "-NAK"},
		{"no incarnation header", false, func(string, string) string { return "" }, "+ACK"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, _, js, names, res := provisionFleet(t, 3*time.Second)
			nc := srv.Connect(t)
			wjs := natstest.JetStream(t, nc)
			wres, err := broker.Provision(t.Context(), wjs, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			cfg := Config{ID: "receiver", Names: names, Backend: echo.Backend(echo.Options{}), LeaseTTL: 3 * time.Second}
			cfg.inboxCheck = inboxCheckConfig{live: time.Hour, poll: time.Hour, noAdvisories: true}
			w, err := New(nc, wjs, wres, cfg)
			if err != nil {
				t.Fatal(err)
			}
			unsub, err := w.subscribeForwards()
			if err != nil {
				t.Fatal(err)
			}
			// The subscription is on the server before a forward is
			// sent from another connection.
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			stopWatch := startWatch(w)
			t.Cleanup(func() {
				unsub()
				stopWatch()
				w.hardStop()
				w.wg.Wait()
				w.ajs.CleanupPublisher()
			})

			key, lane := chatLane("fwd-" + strings.ReplaceAll(tc.name, " ", "-"))
			oldID := res.InboxID
			store := kv.NewStore(res, nil)
			if _, _, err := store.Mutate(t.Context(), lane, nil, 0, nil, func(*session.SessionEntry) (*session.SessionEntry, error) {
				return &session.SessionEntry{SessionKey: key, InboxID: oldID, CommittedSeq: 4}, nil
			}); err != nil {
				t.Fatal(err)
			}
			newID := oldID
			if tc.recreate {
				if err := js.DeleteStream(t.Context(), names.InboxStream()); err != nil {
					t.Fatal(err)
				}
				rres, err := broker.Provision(t.Context(), natstest.JetStream(t, srv.Connect(t)), broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				if newID = rres.InboxID; newID == oldID {
					t.Fatal("the recreated stream kept its identity")
				}
			}
			if cur := w.inboxes.ForLane(lane); cur.ID != oldID || cur.Stale() {
				t.Fatalf("the receiver's view changed before the forward (%s, stale %v): the case was not made", cur.ID, cur.Stale())
			}

			// The delivery of seq 1, as the sender got it from the
			// workers consumer; the test watches its acknowledgements.
			obs := srv.Connect(t)
			reply := fmt.Sprintf("$JS.ACK.%s.%s.1.1.1.%d.0", names.InboxStream(), names.WorkersConsumer(), time.Now().UnixNano())
			acks, err := obs.SubscribeSync(reply)
			if err != nil {
				t.Fatal(err)
			}
			if err := obs.Flush(); err != nil {
				t.Fatal(err)
			}
			fm := nats.NewMsg(w.forwardSubject(w.Owner()))
			fm.Data = []byte(reply)
			fm.Header.Set(hdrFwdLane, lane)
			fm.Header.Set(hdrFwdSubject, names.InboxSubject(session.Partition(names.Prefix(), lane), lane))
			fm.Header.Set(broker.HdrSessionKey, key)
			fm.Header.Set(broker.HdrKind, session.KindMessage)
			if id := tc.header(oldID, newID); id != "" {
				fm.Header.Set(hdrFwdInbox, id)
			}
			if err := obs.PublishMsg(fm); err != nil {
				t.Fatal(err)
			}
			var got string
			for got == "" || got == "+WPI" {
				m, err := acks.NextMsg(30 * time.Second)
				if err != nil {
					t.Fatalf("no acknowledgement of the forwarded delivery: %v", err)
				}
				got = string(m.Data)
			}
			if !strings.HasPrefix(got, tc.want) {
				t.Fatalf("the forwarded delivery was answered %q, want %s", got, tc.want)
			}
			if tc.recreate {
				natstest.WaitFor(t, 30*time.Second, "the receiver on the new incarnation", func() error {
					if cur := w.inboxes.ForLane(lane); cur.ID != newID || cur.Stale() {
						return fmt.Errorf("the receiver's incarnation is %s (stale %v), want the new %s", cur.ID, cur.Stale(), newID)
					}
					return nil
				})
			}
		})
	}
}

// TestForwardNamesItsIncarnation: a forward carries the identity of the
// incarnation its delivery came from; a delivery of no known incarnation
// is not forwarded (the caller hands it back).
func TestForwardNamesItsIncarnation(t *testing.T) {
	t.Parallel()
	_, nc, js, names, res := provisionFleet(t, 3*time.Second)
	w, err := New(nc, js, res, Config{ID: "sender", Names: names, Backend: echo.Backend(echo.Options{}), LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.ajs.CleanupPublisher)
	const target = "target/00000000"
	sub, err := nc.SubscribeSync(w.forwardSubject(target))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	w.fwd.inbox = nc.NewInbox()
	_, lane := chatLane("names")
	d := &fwdDelivery{m: &nats.Msg{Subject: names.InboxSubject(session.Partition(names.Prefix(), lane), lane),
		Reply: "$JS.ACK.x.y.1.1.1.1.0", Header: nats.Header{}}}
	in := &broker.Inbox{Name: names.InboxStream(), ID: "incarnation-1"}
	if !w.forward(target, lane, d, in) {
		t.Fatal("not forwarded")
	}
	m, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Header.Get(hdrFwdInbox); got != in.ID {
		t.Fatalf("forward names incarnation %q, want %q", got, in.ID)
	}
	if w.forward(target, lane, d, nil) {
		t.Error("a delivery of no known incarnation was forwarded")
	}
}

// startWatch runs w's watcher of its inbox streams (watchInboxes) until
// the returned stop.
func startWatch(w *Worker) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.watchInboxes(ctx) }()
	return func() { cancel(); <-done }
}

// TestForwardIncarnationCheckedAtMostOncePerSecond: a forwarded delivery
// of another incarnation than the receiver's hands the stream to the
// watcher, to read its identity; a burst of such forwards (a lagging
// sender's held deliveries) hands it over once a second, whatever
// incarnation they name.
func TestForwardIncarnationCheckedAtMostOncePerSecond(t *testing.T) {
	t.Parallel()
	_, nc, js, names, res := provisionFleet(t, 3*time.Second)
	w, err := New(nc, js, res, Config{ID: "receiver", Names: names, Backend: echo.Backend(echo.Options{}), LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.ajs.CleanupPublisher)
	_, lane := chatLane("fwd-burst")
	cur := w.inboxes.ForLane(lane)
	handed := func() bool { return w.inboxNotes.takeRechecks()[cur.Name] }
	w.checkForwardedIncarnation(cur)
	first := time.Now()
	if !handed() {
		t.Fatal("the stream was not handed to the watcher")
	}
	calls := 0
	for ; time.Since(first) < 500*time.Millisecond && calls < 20; calls++ {
		w.checkForwardedIncarnation(cur)
		if handed() && time.Since(first) < time.Second {
			t.Fatalf("forward %d, %v after the first: the stream was handed to the watcher again", calls+2, time.Since(first))
		}
	}
	if calls < 1 {
		t.Fatal("no forward within half a second of the first: the case was not made")
	}
	natstest.WaitFor(t, 30*time.Second, "the stream handed over again a second later", func() error {
		w.checkForwardedIncarnation(cur)
		if !handed() {
			return fmt.Errorf("not handed over")
		}
		return nil
	})
	if time.Since(first) < time.Second {
		t.Fatalf("handed over again %v after the first", time.Since(first))
	}
}

// heldStreamsJS is a JetStream whose stream reads, once held, wait until
// released, whatever their context.
type heldStreamsJS struct {
	jetstream.JetStream
	mu      sync.Mutex
	held    chan struct{} // closed by release; nil while not held
	reached chan struct{} // a read waits (one value per read)
}

func (js *heldStreamsJS) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	js.mu.Lock()
	held := js.held
	js.mu.Unlock()
	if held != nil {
		select {
		case js.reached <- struct{}{}:
		default:
		}
		<-held
	}
	return js.JetStream.Stream(ctx, name)
}

func (js *heldStreamsJS) hold() (release func()) {
	ch := make(chan struct{})
	js.mu.Lock()
	js.held = ch
	js.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			js.mu.Lock()
			js.held = nil
			js.mu.Unlock()
			close(ch)
		})
	}
}

// TestForwardOfAnUnknownIncarnationHoldsUpNoOther: a forward naming an
// incarnation of the inbox stream the receiver does not know is handed
// back at once, and the stream's identity read elsewhere than in the
// forward subscription's callback: while that read waits (the server slow
// to answer), a forward for another lane that follows it is taken and
// answered.
func TestForwardOfAnUnknownIncarnationHoldsUpNoOther(t *testing.T) {
	t.Parallel()
	srv, _, _, names, res := provisionFleet(t, 3*time.Second)
	nc := srv.Connect(t)
	wjs := &heldStreamsJS{JetStream: natstest.JetStream(t, nc), reached: make(chan struct{}, 1)}
	wres, err := broker.Provision(t.Context(), wjs, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{ID: "receiver", Names: names, Backend: echo.Backend(echo.Options{}), LeaseTTL: 3 * time.Second}
	cfg.inboxCheck = inboxCheckConfig{live: time.Hour, poll: time.Hour, noAdvisories: true}
	w, err := New(nc, natstest.JetStream(t, nc), wres, cfg)
	if err != nil {
		t.Fatal(err)
	}
	unsub, err := w.subscribeForwards()
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	stopWatch := startWatch(w)
	release := wjs.hold()
	t.Cleanup(func() {
		release()
		unsub()
		stopWatch()
		w.hardStop()
		w.wg.Wait()
		w.ajs.CleanupPublisher()
	})

	// Two lanes whose entries count committed seq 4 in the stream's
	// incarnation.
	store := kv.NewStore(res, nil)
	obs := srv.Connect(t)
	type fwd struct {
		lane, key, inbox string
		acks             *nats.Subscription
		reply            string
	}
	var fwds []*fwd
	for i, inbox := range []string{"0123456789abcdef0123456789abcdef", res.InboxID} {
		key, lane := chatLane(fmt.Sprintf("fwd-unknown-%d", i))
		if _, _, err := store.Mutate(t.Context(), lane, nil, 0, nil, func(*session.SessionEntry) (*session.SessionEntry, error) {
			return &session.SessionEntry{SessionKey: key, InboxID: res.InboxID, CommittedSeq: 4}, nil
		}); err != nil {
			t.Fatal(err)
		}
		f := &fwd{lane: lane, key: key, inbox: inbox,
			reply: fmt.Sprintf("$JS.ACK.%s.%s.1.1.%d.%d.0", names.InboxStream(), names.WorkersConsumer(), i+1, time.Now().UnixNano())}
		if f.acks, err = obs.SubscribeSync(f.reply); err != nil {
			t.Fatal(err)
		}
		fwds = append(fwds, f)
	}
	if err := obs.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, f := range fwds {
		fm := nats.NewMsg(w.forwardSubject(w.Owner()))
		fm.Data = []byte(f.reply)
		fm.Header.Set(hdrFwdLane, f.lane)
		fm.Header.Set(hdrFwdSubject, names.InboxSubject(session.Partition(names.Prefix(), f.lane), f.lane))
		fm.Header.Set(broker.HdrSessionKey, f.key)
		fm.Header.Set(broker.HdrKind, session.KindMessage)
		fm.Header.Set(hdrFwdInbox, f.inbox)
		if err := obs.PublishMsg(fm); err != nil {
			t.Fatal(err)
		}
	}
	// The stream's identity is read, and the read waits.
	select {
	case <-wjs.reached:
	case <-time.After(30 * time.Second):
		t.Fatal("the stream's identity was not read for the forward of an unknown incarnation")
	}
	for i, want := range []string{"-NAK", "+ACK"} {
		var got string
		for got == "" || got == "+WPI" {
			m, err := fwds[i].acks.NextMsg(30 * time.Second)
			if err != nil {
				t.Fatalf("forward %d (incarnation %s): no answer while the stream's read waits: %v", i+1, fwds[i].inbox, err)
			}
			got = string(m.Data)
		}
		if !strings.HasPrefix(got, want) {
			t.Fatalf("forward %d (incarnation %s) was answered %q, want %s", i+1, fwds[i].inbox, got, want)
		}
	}
}

// settleMsg is a held delivery of a stream that records how it was settled.
type settleMsg struct {
	jetstream.Msg
	stream string
	seq    uint64
	got    []string
}

func (m *settleMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{Stream: m.stream, Sequence: jetstream.SequencePair{Stream: m.seq}}, nil
}
func (m *settleMsg) Ack() error                       { m.got = append(m.got, "ack"); return nil }
func (m *settleMsg) Nak() error                       { m.got = append(m.got, "nak"); return nil }
func (m *settleMsg) NakWithDelay(time.Duration) error { m.got = append(m.got, "nak"); return nil }

// TestAckUpToStaleIncarnation: a lane whose inbox stream incarnation went
// stale (the stream was deleted and made again) hands its held deliveries
// back when it acks up to its committed seq (a release does), even those
// at or below it: an ack names the consumer, not its incarnation, so the
// new stream's consumer could take it for its own delivery of that seq.
// While the incarnation is current, those are acked.
func TestAckUpToStaleIncarnation(t *testing.T) {
	t.Parallel()
	_, nc, js, names, res := provisionFleet(t, 30*time.Second)
	w, err := New(nc, js, res, Config{ID: "w", Names: names, Backend: echo.Backend(echo.Options{}), LeaseTTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, lane := chatLane("ack-stale")
	o := newOwner(w, lane)
	in := o.bind()
	hold := func() (*settleMsg, *settleMsg) {
		below, above := &settleMsg{stream: in.Name, seq: 3}, &settleMsg{stream: in.Name, seq: 7}
		o.mu.Lock()
		o.held[3], o.held[7] = below, above
		o.mu.Unlock()
		return below, above
	}
	below, above := hold()
	if o.ackUpTo(5); !slices.Equal(below.got, []string{"ack"}) || len(above.got) != 0 {
		t.Fatalf("current incarnation: seq 3 %v, seq 7 %v; want seq 3 acked, seq 7 held", below.got, above.got)
	}
	o.mu.Lock()
	delete(o.held, 7)
	o.mu.Unlock()
	// The incarnation found gone: stale.
	if _, err := w.inboxes.Reopen(t.Context(), in, true); err != nil {
		t.Fatal(err)
	}
	if !in.Stale() {
		t.Fatal("the incarnation is not stale: the case was not made")
	}
	below, above = hold()
	if held := o.ackUpTo(5); held || !slices.Equal(below.got, []string{"nak"}) || !slices.Equal(above.got, []string{"nak"}) {
		t.Fatalf("stale incarnation: seq 3 %v, seq 7 %v, still held %v; want both handed back", below.got, above.got, held)
	}
}
