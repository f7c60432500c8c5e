package worker_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/worker"
)

// TestSweepWakesStrandedLane: a lane whose wake-up was lost (its delivery
// acked by nobody that ran it) is found by the expiry watcher's sweep and
// woken through its inbox, so its message is still answered.
func TestSweepWakesStrandedLane(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (waits for a watcher sweep); skipped under -short")
	}
	f := newFleet(t)
	// The lane exists (an earlier turn), then a message's only wake-up is lost.
	lane, _ := f.post("stranded", "first", "s1")
	src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: "stranded", ChatType: session.ChatDM}
	if _, _, err := f.store.Mutate(t.Context(), lane, nil, 0, nil, func(e *session.SessionEntry) (*session.SessionEntry, error) {
		return &session.SessionEntry{SessionKey: session.BuildSessionKey(src, session.DefaultKeyOptions()), InboxID: f.res.InboxID}, nil
	}); err != nil {
		t.Fatal(err)
	}
	b, err := f.res.Consumer.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range b.Messages() {
		if err := m.DoubleAck(t.Context()); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 1 {
		t.Fatalf("fetched %d wake-ups, want the one to lose", n)
	}

	f.startWorker("sweeper", func(c *worker.Config) { c.WatchInterval = time.Second })
	r := f.waitReplies(lane, 1)
	if got, want := r[0].Text, "echo: first"; got != want {
		t.Fatalf("reply %q, want %q", got, want)
	}
}
