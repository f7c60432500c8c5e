package worker_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/transcript"
	"github.com/agentfleet/agentfleet/worker"
)

// recreateInbox deletes the inbox stream (its workers consumer goes with
// it) and provisions the fleet again from another connection, as a process
// starting then would: the stream comes back empty, with a new identity,
// its seqs starting again at 1. It returns the new identity.
func (f *fleet) recreateInbox() string {
	f.t.Helper()
	return f.recreateInboxAfter(nil)
}

// recreateInboxAfter is recreateInbox that calls away, when not nil, while
// the stream is deleted, before it is made again.
func (f *fleet) recreateInboxAfter(away func()) string {
	f.t.Helper()
	old := f.inboxID()
	if err := f.js.DeleteStream(f.t.Context(), f.names.InboxStream()); err != nil {
		f.t.Fatal(err)
	}
	if away != nil {
		away()
	}
	nc := f.srv.Connect(f.t)
	res, err := broker.Provision(f.t.Context(), natstest.JetStream(f.t, nc), broker.ProvisionConfig{Names: f.names, LeaseTTL: testTTL})
	if err != nil {
		f.t.Fatal(err)
	}
	if res.InboxID == old || res.InboxID == "" {
		f.t.Fatalf("recreated inbox has identity %q (was %q)", res.InboxID, old)
	}
	return res.InboxID
}

// heldBackend is an echo agent backend whose turns with a message "!hold"
// wait until open is called (or their context ends) before they echo. open
// may be called more than once; the test's cleanup calls it.
func heldBackend(t *testing.T) (backend agent.Backend, open func()) {
	gate := make(chan struct{})
	var once sync.Once
	open = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open)
	e := echo.New(echo.Options{})
	a := agent.AgentFunc(func(ctx context.Context, tn *agent.Turn, emit agent.Emitter) (*agent.Result, error) {
		for _, m := range tn.Messages {
			if m.Text == "!hold" {
				select {
				case <-gate:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
		}
		return e.Run(ctx, tn, emit)
	})
	return agent.BackendFunc(func(context.Context, string, string) (agent.Agent, error) { return a, nil }), open
}

// waitCommittedIn waits up to timeout, as what, until lane's entry names
// the inbox stream incarnation inboxID, has committed seq or a later one and
// has no turn, and returns the entry.
func (f *fleet) waitCommittedIn(lane string, seq uint64, inboxID, what string, timeout time.Duration) *session.SessionEntry {
	f.t.Helper()
	var e *session.SessionEntry
	natstest.WaitFor(f.t, timeout, what, func() error {
		var err error
		if e, _, err = f.store.Get(f.t.Context(), lane); err != nil {
			return err
		}
		if e.InboxID != inboxID || e.CommittedSeq < seq || e.Turn != nil {
			return fmt.Errorf("entry inbox %s (want %s), committed %d (want %d), turn %v", e.InboxID, inboxID, e.CommittedSeq, seq, e.Turn != nil)
		}
		return nil
	})
	return e
}

func (f *fleet) inboxID() string {
	f.t.Helper()
	id, err := broker.InboxID(f.t.Context(), f.res.Inbox)
	if err != nil {
		f.t.Fatal(err)
	}
	return id
}

// waitNoPullWaiting waits until the workers' consumer has no pull waiting
// on the server and nothing pending, with at least minAckPending
// deliveries unacknowledged: a worker at capacity, its pull loop waiting
// for a slot.
func (f *fleet) waitNoPullWaiting(minAckPending int) {
	t := f.t
	t.Helper()
	cons, err := f.res.Inbox.Consumer(t.Context(), f.names.WorkersConsumer())
	if err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 20*time.Second, "no pull waiting on the server", func() error {
		info, err := cons.Info(t.Context())
		if err != nil {
			return err
		}
		if info.NumWaiting != 0 || info.NumPending != 0 || info.NumAckPending < minAckPending {
			return fmt.Errorf("waiting %d, pending %d, ack pending %d", info.NumWaiting, info.NumPending, info.NumAckPending)
		}
		return nil
	})
}

// TestInboxConsumerRecreatedUnderARunningWorker: the workers consumer alone
// is deleted and provisioning makes it again (the stream and its identity
// stay): the worker pulls from the new consumer, and what it hands out
// again (the whole stream: it delivers from the first seq) is acked as
// committed, not answered twice.
func TestInboxConsumerRecreatedUnderARunningWorker(t *testing.T) {
	f := newFleet(t)
	w := f.startWorker("w1", nil)
	var sent []string
	var lane string
	for i := 0; i < 3; i++ {
		text := fmt.Sprintf("before %d", i)
		var seq uint64
		lane, seq = f.post("k1", text, fmt.Sprintf("b%d", i))
		sent = append(sent, text)
		f.waitCommitted(lane, seq)
	}
	id := f.inboxID()
	if err := f.js.DeleteConsumer(t.Context(), f.names.InboxStream(), f.names.WorkersConsumer()); err != nil {
		t.Fatal(err)
	}
	nc := f.srv.Connect(t)
	if _, err := broker.Provision(t.Context(), natstest.JetStream(t, nc), broker.ProvisionConfig{Names: f.names, LeaseTTL: testTTL}); err != nil {
		t.Fatal(err)
	}
	if got := f.inboxID(); got != id {
		t.Fatalf("identity changed %s -> %s", id, got)
	}
	// The lane released: only a delivery takes it again.
	natstest.WaitFor(t, 20*time.Second, "lane released", func() error {
		if n := w.LanesOwned(); n != 0 {
			return fmt.Errorf("%d lanes owned", n)
		}
		return nil
	})
	// One at a time: a message that comes while the turn of the one
	// before runs would interrupt it (busy mode interrupt), and its answer
	// would cover only the later one.
	for i := 0; i < 2; i++ {
		text := fmt.Sprintf("after %d", i)
		_, seq := f.post("k1", text, fmt.Sprintf("a%d", i))
		sent = append(sent, text)
		f.waitCommitted(lane, seq)
	}
	f.checkAnsweredOnce(lane, sent...)
}

// TestInboxRecreatedUnderARunningWorker: an operator deletes the inbox
// stream and provisioning recreates it (new identity, seqs from 1) while a
// worker runs, with lanes whose entries committed seqs above what the new
// stream will reach. Every message sent after that is answered once, in
// order: none is taken for committed because its seq is at most the
// committed seq of the old stream. Both a lane the worker no longer owns
// and one it still owns (lingering) when the stream goes are covered.
func TestInboxRecreatedUnderARunningWorker(t *testing.T) {
	for _, tc := range []struct {
		name    string
		linger  time.Duration
		workers int
	}{
		{"idle lanes", 200 * time.Millisecond, 1},
		{"owned lanes", time.Minute, 1},
		{"two workers", 200 * time.Millisecond, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t)
			var ws []*worker.Worker
			for i := 0; i < tc.workers; i++ {
				ws = append(ws, f.startWorker(fmt.Sprintf("w%d", i+1), func(c *worker.Config) { c.Linger = tc.linger }))
			}
			owned := func() int {
				n := 0
				for _, w := range ws {
					n += w.LanesOwned()
				}
				return n
			}
			chats := []string{"r1", "r2"}
			sent := map[string][]string{}
			lanes := map[string]string{}
			for i := 0; i < 4; i++ {
				for _, c := range chats {
					text := fmt.Sprintf("before %s %d", c, i)
					lane, seq := f.post(c, text, fmt.Sprintf("b%d", i))
					lanes[c] = lane
					sent[c] = append(sent[c], text)
					f.waitCommitted(lane, seq)
				}
			}
			if tc.linger < time.Second {
				natstest.WaitFor(t, 20*time.Second, "lanes released", func() error {
					if n := owned(); n != 0 {
						return fmt.Errorf("%d lanes owned", n)
					}
					return nil
				})
			} else if n := owned(); n != len(chats) {
				t.Fatalf("%d lanes owned, want %d", n, len(chats))
			}
			newID := f.recreateInbox()
			// Seqs 1..4 of the new stream: each at most the committed seq
			// (7 or 8) that the lanes' entries hold for the old stream.
			// One at a time (see TestInboxConsumerRecreatedUnderARunningWorker).
			for i := 0; i < 2; i++ {
				for _, c := range chats {
					text := fmt.Sprintf("after %s %d", c, i)
					lane, seq := f.post(c, text, fmt.Sprintf("a%d", i))
					if seq > 4 {
						t.Fatalf("new stream seq %d", seq)
					}
					sent[c] = append(sent[c], text)
					f.waitCommittedIn(lane, seq, newID, fmt.Sprintf("%q committed", text), 30*time.Second)
				}
			}
			for _, c := range chats {
				f.checkAnsweredOnce(lanes[c], sent[c]...)
			}
		})
	}
}

// TestInboxRecreatedWhileAtCapacity: the worker is at capacity (its one lane
// slot held by a long turn), so its pull loop waits to hand a delivery over
// and its pull on the server runs out: when the inbox stream is deleted,
// no pull of it is waiting, and no word of the deletion reaches it through
// the pull. The next pull, once the slot frees, is served by the new
// incarnation's consumer. Its deliveries must not be taken for the old
// stream's. The worker learns of the new stream:
//   - "advisory": from JetStream's advisories of the stream deleted and
//     made again, at once (the periodic check is an hour away);
//   - "periodic check": without the advisories, from its periodic read of
//     the stream's identity (every second here);
//   - "away check": with neither, from the check of the stream's identity
//     its pull loop makes before it pulls again.
//
// In the first two, the worker stops using the old stream while it is away,
// and takes the new one while the long turn still holds the slot.
func TestInboxRecreatedWhileAtCapacity(t *testing.T) {
	for _, tc := range []struct {
		name             string
		live, poll       time.Duration
		advisories, soon bool
	}{
		{"advisory", time.Hour, time.Hour, true, true},
		{"periodic check", time.Hour, time.Second, false, true},
		{"away check", time.Hour, time.Hour, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t)
			backend, release := heldBackend(t)
			w := f.startWorker("w1", func(c *worker.Config) {
				c.Backend = backend
				c.MaxLanes = 1
				c.Linger = 200 * time.Millisecond
				worker.SetInboxCheck(c, tc.live, tc.poll, tc.advisories)
			})
			var sent []string
			var lane string
			for i := 0; i < 4; i++ {
				text := fmt.Sprintf("before %d", i)
				var seq uint64
				lane, seq = f.post("z", text, fmt.Sprintf("b%d", i))
				sent = append(sent, text)
				f.waitCommitted(lane, seq)
			}
			// The slot is held by a long turn, held until the case is
			// made, and a delivery of another lane waits for it in the
			// pull loop.
			long, _ := f.post("x", "!hold", "x1")
			longRuns := func() error {
				e, _, err := f.store.Get(t.Context(), long)
				if err != nil {
					return err
				}
				if e.Turn == nil {
					return fmt.Errorf("no turn")
				}
				return nil
			}
			natstest.WaitFor(t, 20*time.Second, "the long turn running", longRuns)
			f.post("y", "waits for a slot", "y1")
			f.waitNoPullWaiting(2)
			var away func()
			if tc.soon {
				// The worker stops using the old stream while it is away.
				away = func() {
					natstest.WaitFor(t, 30*time.Second, "the worker knowing the old stream gone", func() error {
						if _, stale := worker.InboxIDOf(w, f.names.InboxStream()); !stale {
							return fmt.Errorf("not stale")
						}
						return nil
					})
				}
			}
			newID := f.recreateInboxAfter(away)
			if tc.soon {
				natstest.WaitFor(t, 30*time.Second, "the worker taking the new stream", func() error {
					if id, stale := worker.InboxIDOf(w, f.names.InboxStream()); id != newID || stale {
						return fmt.Errorf("the worker knows stream %s (stale %t), want %s", id, stale, newID)
					}
					return nil
				})
				if err := longRuns(); err != nil {
					t.Fatalf("the long turn ended before the worker took the new stream (%v): the case was not made", err)
				}
			}
			var seqs []uint64
			for i := 0; i < 2; i++ {
				text := fmt.Sprintf("after %d", i)
				_, seq := f.post("z", text, fmt.Sprintf("a%d", i))
				sent = append(sent, text)
				seqs = append(seqs, seq)
			}
			if err := longRuns(); err != nil {
				t.Fatalf("the long turn ended before the stream was recreated (%v): the case was not made", err)
			}
			release()
			f.waitCommittedIn(lane, seqs[1], newID, "the new messages committed", 60*time.Second)
			// The two new messages may make one turn (both wait while the
			// slot is held): each is answered once, in order, all the same.
			f.checkAnsweredOnce(lane, sent...)
		})
	}
}

// TestInboxRecreatedUnderAnOwnerAtCapacity: the worker is at capacity (its
// one slot held by a lane that lingers), so its pull loop waits and learns
// nothing of the stream's deletion. The owner reads its lane by the
// stream's name, which reaches the new incarnation, whose seqs soon pass
// the lane's committed seq: a hint whose lane subject's previous seq is
// below the committed one makes it check the stream's identity before it
// reads, so it never runs the new stream's messages as the old one's. The
// worker follows no advisories and makes no periodic check here: the hint
// alone shows the owner the new stream (the advisory would have it release
// the lane at once, and another lane take the slot).
func TestInboxRecreatedUnderAnOwnerAtCapacity(t *testing.T) {
	f := newFleet(t)
	w := f.startWorker("w1", func(c *worker.Config) {
		c.MaxLanes = 1
		c.Linger = time.Minute
		worker.SetInboxCheck(c, time.Hour, time.Hour, false)
	})
	var sent []string
	var lane string
	var seq uint64
	for i := 0; i < 4; i++ {
		text := fmt.Sprintf("before %d", i)
		lane, seq = f.post("z", text, fmt.Sprintf("b%d", i))
		sent = append(sent, text)
		f.waitCommitted(lane, seq)
	}
	if n := w.LanesOwned(); n != 1 {
		t.Fatalf("%d lanes owned", n)
	}
	f.post("y", "waits for a slot", "y1")
	f.waitNoPullWaiting(1)
	newID := f.recreateInbox()
	// Other lanes' messages take the new stream's first seqs, so the
	// lane's next one comes above its committed seq.
	for i := 0; i < 5; i++ {
		f.post(fmt.Sprintf("other%d", i), "hi", "o1")
	}
	text := "after"
	_, seq = f.post("z", text, "a1")
	sent = append(sent, text)
	if e, _, err := f.store.Get(t.Context(), lane); err != nil || seq <= e.CommittedSeq {
		t.Fatalf("new seq %d, entry %+v (%v)", seq, e, err)
	}
	natstest.WaitFor(t, 30*time.Second, "the new message committed", func() error {
		e, _, err := f.store.Get(t.Context(), lane)
		if err != nil {
			return err
		}
		if e.CommittedSeq < seq || e.Turn != nil {
			return fmt.Errorf("committed %d (want %d), turn %v", e.CommittedSeq, seq, e.Turn != nil)
		}
		if e.InboxID != newID {
			t.Fatalf("the new message was committed as the old stream's: entry inbox %s, want %s", e.InboxID, newID)
		}
		return nil
	})
	f.checkAnsweredOnce(lane, sent...)
}

// TestInboxRecreatedUnderAnInterruptedTurn: a turn was in flight when the
// inbox stream was deleted, and its worker died before the turn ended: the
// lane's entry keeps the turn's record, whose seqs count in the old stream.
// The worker that takes the lane on the new stream (seqs from 1) must not
// read or settle the new stream's messages by those seqs: the turn's
// messages are gone, so it ends the turn (interrupted, the session resume
// pending) without running it again, and the new stream's messages, whose
// seqs are below the old turn's, are each answered once, in order. The
// record may name its stream, or, written by an older worker, not (then
// it counts in the entry's).
func TestInboxRecreatedUnderAnInterruptedTurn(t *testing.T) {
	for _, named := range []bool{false, true} {
		t.Run(fmt.Sprintf("record names its stream %v", named), func(t *testing.T) {
			f := newFleet(t)
			_, stop := f.startStoppable("first", nil)
			var sent []string
			var lane string
			var seq uint64
			for i := 0; i < 3; i++ {
				text := fmt.Sprintf("before %d", i)
				lane, seq = f.post("it", text, fmt.Sprintf("b%d", i))
				sent = append(sent, text)
				f.waitCommitted(lane, seq)
			}
			stop()
			// The worker that ran the turn of seq 4 died: its record stays.
			_, seq = f.post("it", "lost with the stream", "lost")
			turn := f.crashedTurn(lane, seq, time.Now())
			if named {
				old := f.inboxID()
				e, rev, err := f.store.Get(t.Context(), lane)
				if err != nil {
					t.Fatal(err)
				}
				if _, _, err := f.store.Mutate(t.Context(), lane, e, rev, nil, func(e *session.SessionEntry) (*session.SessionEntry, error) {
					e.Turn.InboxID = old
					return e, nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			newID := f.recreateInbox()
			var last uint64
			for i := 0; i < 2; i++ {
				text := fmt.Sprintf("after %d", i)
				_, last = f.post("it", text, fmt.Sprintf("a%d", i))
				sent = append(sent, text)
			}
			if last >= turn.LastSeq {
				t.Fatalf("new stream seq %d, old turn's last seq %d: the case was not made", last, turn.LastSeq)
			}
			f.startWorker("back", nil)
			e := f.waitCommittedIn(lane, last, newID, "the new messages committed", 30*time.Second)
			if e.CommittedSeq != last {
				t.Errorf("committed seq %d in the new stream, which holds %d messages of the lane: settled by the old turn's seqs", e.CommittedSeq, last)
			}
			f.checkAnsweredOnce(lane, sent...)
			ended := false
			for _, en := range f.load(e.SessionID) {
				if en.Kind == transcript.KindTurnEnd && en.TurnID == turn.ID {
					ended = true
					if en.Status != transcript.StatusInterrupted {
						t.Errorf("the old turn ended %q, want %q", en.Status, transcript.StatusInterrupted)
					}
					// Its end names the marker its commit sets (for an owner
					// that finds the end without the commit).
					if en.ResumeReason != worker.ResumeRestartInterrupted || en.InterruptedAt == nil {
						t.Errorf("the old turn's end names resume reason %q, interrupted at %v", en.ResumeReason, en.InterruptedAt)
					}
				}
			}
			if !ended {
				t.Error("the old turn has no turn end in the transcript")
			}
		})
	}
}

// TestInboxRecreatedUnderATurnCutByADrain: the same window as
// TestInboxRecreatedUnderAnInterruptedTurn, reached the common way: a turn
// runs when the inbox stream is deleted and made again, and its worker is
// stopped before the turn ends, so the drain cuts it and keeps its record
// (which names the old stream). The worker that takes the lane on the new
// stream ends that turn without running it again and answers each of the
// new stream's messages once, in order.
func TestInboxRecreatedUnderATurnCutByADrain(t *testing.T) {
	f := newFleet(t)
	_, stop := f.startStoppable("first", func(c *worker.Config) { c.DrainTimeout = 500 * time.Millisecond })
	var sent []string
	var lane string
	var seq uint64
	for i := 0; i < 4; i++ {
		text := fmt.Sprintf("before %d", i)
		lane, seq = f.post("dr", text, fmt.Sprintf("b%d", i))
		sent = append(sent, text)
		f.waitCommitted(lane, seq)
	}
	_, seq = f.post("dr", "!sleep 60s", "long")
	natstest.WaitFor(t, 20*time.Second, "the long turn running", func() error {
		e, _, err := f.store.Get(t.Context(), lane)
		if err != nil {
			return err
		}
		if e.Turn == nil {
			return fmt.Errorf("no turn")
		}
		return nil
	})
	newID := f.recreateInbox()
	stop()
	e, _, err := f.store.Get(t.Context(), lane)
	if err != nil || e.Turn == nil || e.Turn.LastSeq != seq {
		t.Fatalf("the drain left no record of the cut turn (%v): the case was not made", err)
	}
	turnID := e.Turn.ID
	var last uint64
	for i := 0; i < 2; i++ {
		text := fmt.Sprintf("after %d", i)
		_, last = f.post("dr", text, fmt.Sprintf("a%d", i))
		sent = append(sent, text)
	}
	if last >= seq {
		t.Fatalf("new stream seq %d, the cut turn's seq %d: the case was not made", last, seq)
	}
	f.startWorker("back", nil)
	e = f.waitCommittedIn(lane, last, newID, "the new messages committed", 30*time.Second)
	// The drain told the user the turn was cut (no other worker ran):
	// notices aside, the answers are each message's, once, in order.
	var got []string
	for _, r := range f.replies(lane) {
		if r.Kind == session.ReplyKindReply {
			got = append(got, strings.Split(strings.TrimPrefix(r.Text, "echo: "), "\n")...)
		}
	}
	if !slices.Equal(got, sent) {
		t.Errorf("answers %q, want %q (each message once, in inbox order)", got, sent)
	}
	ended := false
	for _, en := range f.load(e.SessionID) {
		if en.Kind == transcript.KindTurnEnd && en.TurnID == turnID {
			ended = en.Status == transcript.StatusInterrupted
		}
	}
	if !ended {
		t.Error("the cut turn did not end interrupted in the transcript")
	}
}

// TestInboxRecreatedWhileDisconnected: the inbox stream is deleted and made
// again while the worker's connection to NATS is down, so no advisory of it
// reaches the worker. The worker does not follow the advisories, and its
// periodic check is an hour away (and so is not run after a reconnect
// either). When the connection comes back, the worker's pull is served by
// the new incarnation's consumer at once: the pull loop checks the stream's
// identity before it takes those deliveries for the old stream's, and the
// new messages, whose seqs are below the lane's committed seq in the old
// stream, are answered once.
func TestInboxRecreatedWhileDisconnected(t *testing.T) {
	f := newFleet(t)
	p := newTCPProxy(t, f.srv.URL())
	w := f.startWorkerViaWith("w1", p.URL(), func(c *worker.Config) {
		c.Linger = 200 * time.Millisecond
		worker.SetInboxCheck(c, time.Hour, time.Hour, false)
	})
	var sent []string
	var lane string
	var committed uint64
	for i := 0; i < 4; i++ {
		text := fmt.Sprintf("before %d", i)
		var seq uint64
		lane, seq = f.post("z", text, fmt.Sprintf("b%d", i))
		sent = append(sent, text)
		committed = f.waitCommitted(lane, seq).CommittedSeq
	}
	// Released: only a delivery takes the lane again.
	natstest.WaitFor(t, 20*time.Second, "lane released", func() error {
		if n := w.LanesOwned(); n != 0 {
			return fmt.Errorf("%d lanes owned", n)
		}
		return nil
	})
	p.Cut()
	// The worker's connection is down before the stream goes: nothing of
	// the recreation reaches it.
	nc := worker.ConnOf(w)
	natstest.WaitFor(t, 30*time.Second, "the worker's connection down", func() error {
		if nc.IsConnected() {
			return fmt.Errorf("connection %v", nc.Status())
		}
		return nil
	})
	newID := f.recreateInbox()
	var seqs []uint64
	for i := 0; i < 2; i++ {
		text := fmt.Sprintf("after %d", i)
		_, seq := f.post("z", text, fmt.Sprintf("a%d", i))
		sent = append(sent, text)
		seqs = append(seqs, seq)
	}
	if seqs[1] >= committed {
		t.Fatalf("new stream seq %d, the lane's committed seq %d in the old stream: the case was not made", seqs[1], committed)
	}
	p.Heal()
	f.waitCommittedIn(lane, seqs[1], newID, "the new messages committed", 60*time.Second)
	f.checkAnsweredOnce(lane, sent...)
}

// TestInterruptedEndFoundWithoutItsCommit: a recovery that ends a turn
// interrupted without running it again (its messages gone with a deleted
// inbox stream, or its interruption stale) appends the turn_end, then
// commits with the resume marker and the interrupted count; its worker
// died between the two. The next owner finds the turn ended and must set
// the same marker and count in its commit (the turn_end names them), not
// commit the turn as if nothing were pending.
func TestInterruptedEndFoundWithoutItsCommit(t *testing.T) {
	for _, gone := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream gone %v", gone), func(t *testing.T) {
			f := newFleet(t)
			_, stop := f.startStoppable("first", noReset)
			chat := fmt.Sprintf("endcut-%v", gone)
			lane, seq := f.post(chat, "hello", "h")
			f.waitCommitted(lane, seq)
			stop()
			_, seq = f.post(chat, "long task", "long")
			at := time.Now().Add(-2 * time.Hour).UTC().Truncate(time.Second)
			turn := f.crashedTurn(lane, seq, at)
			e, rev, err := f.store.Get(t.Context(), lane)
			if err != nil {
				t.Fatal(err)
			}
			if gone {
				old := f.inboxID()
				if _, _, err := f.store.Mutate(t.Context(), lane, e, rev, nil, func(e *session.SessionEntry) (*session.SessionEntry, error) {
					e.Turn.InboxID = old
					return e, nil
				}); err != nil {
					t.Fatal(err)
				}
				f.recreateInbox()
			}
			// What the dead worker's recovery wrote before its commit.
			last, _, err := f.tx.LastSeq(t.Context(), e.SessionID)
			if err != nil {
				t.Fatal(err)
			}
			end := transcript.Entry{ID: turn.ID + ":end", Kind: transcript.KindTurnEnd, TurnID: turn.ID, Status: transcript.StatusInterrupted,
				ResumeReason: worker.ResumeRestartInterrupted, InterruptedAt: &at}
			if _, err := f.tx.Append(t.Context(), e.SessionID, last, &end); err != nil {
				t.Fatal(err)
			}
			f.startWorker("back", func(c *worker.Config) {
				c.Reset.Default, c.Freshness = session.ResetPolicy{Mode: session.ResetNone}, time.Hour
			})
			natstest.WaitFor(t, 30*time.Second, "the ended turn committed", func() error {
				if e, _, err = f.store.Get(t.Context(), lane); err != nil {
					return err
				}
				if e.Turn != nil || e.LastTurnID != turn.ID {
					return fmt.Errorf("turn %v, last turn %q", e.Turn != nil, e.LastTurnID)
				}
				return nil
			})
			if !e.ResumePending || e.ResumeReason != worker.ResumeRestartInterrupted || e.InterruptedTurns != 1 {
				t.Errorf("resume_pending %v %q, interrupted_turns %d; want pending (%s), 1",
					e.ResumePending, e.ResumeReason, e.InterruptedTurns, worker.ResumeRestartInterrupted)
			}
			if e.LastResumeMarkedAt == nil || !e.LastResumeMarkedAt.Equal(at) {
				t.Errorf("marker %v, want the interruption's time %v", e.LastResumeMarkedAt, at)
			}
		})
	}
}
