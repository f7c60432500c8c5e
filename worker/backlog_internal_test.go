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

// TestBacklogCount counts the inbox backlog of lanes in known states: a
// lane with no entry (every message waits), a lane committed up to its last
// message (nothing waits), the same lane after a prune-like purge of its
// handled messages and as many new ones (its message count unchanged: the
// new ones wait), and a lane whose commit caught up.
func TestBacklogCount(t *testing.T) {
	srv := natstest.RunServer(t)
	nc := srv.Connect(t)
	js := natstest.JetStream(t, nc)
	names := broker.MustNames("fleet")
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(nc, js, res, Config{ID: "b1", Names: names, Backend: echo.Backend(echo.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	part := func(lane string) int { return session.Partition(names.Prefix(), lane) }
	laneA, laneB := "done", "waiting"
	for i := 0; part(laneA) == part(laneB); i++ {
		laneB = fmt.Sprintf("waiting%d", i)
	}
	pa, pb := part(laneA), part(laneB)
	publish := func(lane string, n int) uint64 {
		var last uint64
		for range n {
			ack, err := js.Publish(t.Context(), names.InboxSubject(part(lane), lane), []byte("m"))
			if err != nil {
				t.Fatal(err)
			}
			last = ack.Sequence
		}
		return last
	}
	commit := func(lane string, seq uint64) {
		_, rev, err := w.store.Get(t.Context(), lane)
		if err != nil {
			rev = 0
		}
		if _, _, err := w.store.Mutate(t.Context(), lane, nil, rev, nil, func(e *session.SessionEntry) (*session.SessionEntry, error) {
			if e == nil {
				e = &session.SessionEntry{SessionKey: "k:" + lane}
			}
			e.InboxID, e.CommittedSeq = res.InboxID, seq
			return e, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	c := &backlogCounter{w: w, lanes: map[string]backlogLane{}}
	check := func(what string, wantA, wantB int64) {
		t.Helper()
		b, err := c.count(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var total, lanes int64
		for p := range broker.Partitions {
			total += b.Messages[p]
			lanes += b.Lanes[p]
		}
		wantLanes := int64(0)
		for _, n := range []int64{wantA, wantB} {
			if n > 0 {
				wantLanes++
			}
		}
		if b.Messages[pa] != wantA || b.Messages[pb] != wantB || total != wantA+wantB || lanes != wantLanes {
			t.Fatalf("%s: partition %d holds %d, partition %d holds %d, %d in all on %d lanes; want %d, %d, on %d lanes",
				what, pa, b.Messages[pa], pb, b.Messages[pb], total, lanes, wantA, wantB, wantLanes)
		}
	}

	commit(laneA, publish(laneA, 3))
	lastB := publish(laneB, 2)
	check("one lane committed, one with no entry", 0, 2)
	check("the same, from the last count", 0, 2)

	// A prune purges the committed lane's handled messages; three new ones
	// arrive: the subject holds three messages again.
	if err := res.Inbox.Purge(t.Context(), jetstream.WithPurgeSubject(names.InboxSubject(pa, laneA))); err != nil {
		t.Fatal(err)
	}
	publish(laneA, 3)
	check("after a purge and as many new messages", 3, 2)

	commit(laneB, lastB)
	check("the waiting lane committed", 3, 0)
}
