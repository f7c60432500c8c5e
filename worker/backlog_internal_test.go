package worker

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// backlogFixture is a provisioned fleet with a worker that is not run: the
// tests drive its backlog counter by hand.
type backlogFixture struct {
	t     *testing.T
	js    jetstream.JetStream
	names broker.Names
	res   *broker.Resources
	w     *Worker
	c     *backlogCounter
}

func newBacklogFixture(t *testing.T, inboxStreams int) *backlogFixture {
	srv := natstest.RunServer(t)
	nc := srv.Connect(t)
	js := natstest.JetStream(t, nc)
	names := broker.MustNames("fleet")
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second, InboxStreams: inboxStreams})
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(nc, js, res, Config{ID: "b1", Names: names, Backend: echo.Backend(echo.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	return &backlogFixture{t: t, js: js, names: names, res: res, w: w, c: newBacklogCounter(w)}
}

func (f *backlogFixture) part(lane string) int { return session.Partition(f.names.Prefix(), lane) }

// laneIn returns a lane named after base whose partition p satisfies ok.
func (f *backlogFixture) laneIn(base string, ok func(p int) bool) string {
	for i := 0; ; i++ {
		lane := fmt.Sprintf("%s%d", base, i)
		if ok(f.part(lane)) {
			return lane
		}
	}
}

// publish publishes n messages to lane and returns the seq of the last one
// in its stream.
func (f *backlogFixture) publish(lane string, n int) uint64 {
	f.t.Helper()
	var last uint64
	for range n {
		ack, err := f.js.Publish(f.t.Context(), f.names.InboxSubject(f.part(lane), lane), []byte("m"))
		if err != nil {
			f.t.Fatal(err)
		}
		last = ack.Sequence
	}
	return last
}

// commit writes lane's entry as committed up to seq in the inbox stream of
// identity inboxID.
func (f *backlogFixture) commit(lane, inboxID string, seq uint64) {
	f.t.Helper()
	_, rev, err := f.w.store.Get(f.t.Context(), lane)
	if err != nil {
		rev = 0
	}
	if _, _, err := f.w.store.Mutate(f.t.Context(), lane, nil, rev, nil, func(e *session.SessionEntry) (*session.SessionEntry, error) {
		if e == nil {
			e = &session.SessionEntry{SessionKey: "k:" + lane}
		}
		e.InboxID, e.CommittedSeq = inboxID, seq
		return e, nil
	}); err != nil {
		f.t.Fatal(err)
	}
}

// check counts once and compares every partition's messages and lanes with
// want (partition: messages; each a lane of its own).
func (f *backlogFixture) check(what string, want map[int]int64) {
	f.t.Helper()
	b, err := f.c.count(f.t.Context())
	if err != nil {
		f.t.Fatalf("%s: %v", what, err)
	}
	for p := range broker.Partitions {
		wantLanes := int64(0)
		if want[p] > 0 {
			wantLanes = 1
		}
		if b.Messages[p] != want[p] || b.Lanes[p] != wantLanes {
			f.t.Fatalf("%s: partition %d holds %d on %d lanes; want %d on %d (want per partition %v)",
				what, p, b.Messages[p], b.Lanes[p], want[p], wantLanes, want)
		}
	}
}

// TestBacklogCount counts the inbox backlog of lanes in known states: a
// lane with no entry (every message waits), a lane committed up to its last
// message (nothing waits), the same lane after a prune-like purge of its
// handled messages and as many new ones (its message count unchanged: the
// new ones wait), and a lane whose commit caught up.
func TestBacklogCount(t *testing.T) {
	f := newBacklogFixture(t, 1)
	laneA := f.laneIn("done", func(int) bool { return true })
	laneB := f.laneIn("waiting", func(p int) bool { return p != f.part(laneA) })
	pa, pb := f.part(laneA), f.part(laneB)

	f.commit(laneA, f.res.InboxID, f.publish(laneA, 3))
	lastB := f.publish(laneB, 2)
	f.check("one lane committed, one with no entry", map[int]int64{pb: 2})
	f.check("the same, from the last count", map[int]int64{pb: 2})

	// A prune purges the committed lane's handled messages; three new ones
	// arrive: the subject holds three messages again.
	if err := f.res.Inbox.Purge(t.Context(), jetstream.WithPurgeSubject(f.names.InboxSubject(pa, laneA))); err != nil {
		t.Fatal(err)
	}
	f.publish(laneA, 3)
	f.check("after a purge and as many new messages", map[int]int64{pa: 3, pb: 2})

	f.commit(laneB, f.res.InboxID, lastB)
	f.check("the waiting lane committed", map[int]int64{pa: 3})
}

// TestBacklogCountInboxStreams counts the backlog of an inbox split over
// three streams (partition p in stream p mod 3): each lane's messages are
// counted in its own stream against the committed seq of that stream, on
// its own partition; a lane whose entry counts in another stream has all its
// messages waiting. Then one partition is moved from stream 1 to stream 2
// step by step as the migration does it: until the flip its messages count
// in stream 1; between the flip and the purge what is left in stream 1 (all
// committed) counts nowhere; once it takes publishes in stream 2, the lane's
// entry still counts in stream 1, so every new message waits.
func TestBacklogCountInboxStreams(t *testing.T) {
	f := newBacklogFixture(t, 3)
	in := f.w.inboxes.All()
	if len(in) != 3 {
		t.Fatalf("%d inbox streams, want 3", len(in))
	}
	// Two lanes in stream 0 (different partitions), one in stream 1, one
	// in stream 2.
	lane0 := f.laneIn("zero", func(p int) bool { return p%3 == 0 })
	lane0b := f.laneIn("zerob", func(p int) bool { return p%3 == 0 && p != f.part(lane0) })
	lane1 := f.laneIn("one", func(p int) bool { return p%3 == 1 })
	lane2 := f.laneIn("two", func(p int) bool { return p%3 == 2 })
	p0, p0b, p1, p2 := f.part(lane0), f.part(lane0b), f.part(lane1), f.part(lane2)
	for lane, want := range map[string]*broker.Inbox{lane0: in[0], lane0b: in[0], lane1: in[1], lane2: in[2]} {
		if got := f.w.inboxes.ForLane(lane); got.Name != want.Name {
			t.Fatalf("lane %s in %s, want %s", lane, got.Name, want.Name)
		}
	}

	// Streams number their messages each from 1: the committed seqs below
	// overlap, and only counting each lane in its own stream gets them
	// right.
	f.publish(lane0, 2)
	f.commit(lane0, in[0].ID, f.publish(lane0, 2)) // 4 messages, all committed
	f.publish(lane0, 1)                            // one waits
	f.publish(lane0b, 3)                           // no entry: 3 wait
	last1 := f.publish(lane1, 4)
	f.commit(lane1, in[1].ID, last1-3) // 3 wait
	f.publish(lane2, 2)
	f.commit(lane2, in[0].ID, 1) // counts in stream 0: both wait
	f.check("three streams", map[int]int64{p0: 1, p0b: 3, p1: 3, p2: 2})

	f.commit(lane2, in[2].ID, 1)
	f.check("lane2's entry now counts in its stream", map[int]int64{p0: 1, p0b: 3, p1: 3, p2: 1})

	// Move p1 from stream 1 to stream 2 as admin.MigrateInbox does.
	bucket := f.res.InboxMap
	setMap := func(what string, change func(m *broker.InboxMap), subjects ...int) {
		t.Helper()
		m, rev := f.w.inboxes.Map()
		change(&m)
		if _, err := bucket.Update(t.Context(), broker.InboxMapKey, m.Encode(), rev); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		for _, i := range subjects {
			if err := broker.SetInboxSubjects(t.Context(), f.js, f.names, m, i); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
		if err := f.w.inboxes.Refresh(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	mv := broker.Move{P: p1, From: 1, To: 2}
	setMap("close", func(m *broker.InboxMap) { m.Moving = []broker.Move{mv} }, 1)
	f.check("p1 closed, draining in stream 1", map[int]int64{p0: 1, p0b: 3, p1: 3, p2: 1})
	f.commit(lane1, in[1].ID, last1)
	f.check("p1 drained", map[int]int64{p0: 1, p0b: 3, p2: 1})
	setMap("flip", func(m *broker.InboxMap) { m.Assign[p1] = 2 })
	// What is left of p1 in stream 1 is committed there; were it counted
	// in stream 1 against an entry that counts in stream 2, it would wait.
	f.commit(lane1, in[2].ID, 0)
	f.check("p1 flipped, not purged yet", map[int]int64{p0: 1, p0b: 3, p2: 1})
	f.commit(lane1, in[1].ID, last1)
	if err := in[1].Stream.Purge(t.Context(), jetstream.WithPurgeSubject(f.names.InboxPartitionSubject(p1))); err != nil {
		t.Fatal(err)
	}
	setMap("open", func(m *broker.InboxMap) { m.Moving = nil }, 2)
	if got := f.w.inboxes.ForLane(lane1); got.Name != in[2].Name {
		t.Fatalf("lane %s in %s after the move, want %s", lane1, got.Name, in[2].Name)
	}
	f.publish(lane1, 2)
	f.check("p1 in stream 2, lane1's entry still counts in stream 1", map[int]int64{p0: 1, p0b: 3, p1: 2, p2: 1})
	f.commit(lane1, in[2].ID, f.publish(lane1, 1))
	f.check("lane1 committed in stream 2", map[int]int64{p0: 1, p0b: 3, p2: 1})
}
