package worker

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestPullRestartRetried: the inbox stream is deleted and made again under a
// running worker, and its pull on the new incarnation does not start at
// first (the first two tries fail). It is tried again, with no change of
// the map to prompt it, and a message of the new stream is answered.
func TestPullRestartRetried(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	srv, _, js, names, res := provisionFleet(t, ttl)
	lanes := drainLanes{t: t, js: js, store: kv.NewStore(res, nil), names: names}

	wnc := srv.Connect(t)
	w, err := New(wnc, natstest.JetStream(t, wnc), res, Config{ID: "w1", Names: names, Backend: echo.Backend(echo.Options{}),
		LeaseTTL: ttl, Linger: 200 * time.Millisecond, DrainTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	oldID := res.InboxID
	var failed atomic.Int32
	start := w.pullInbox
	w.pullInbox = func(in *broker.Inbox) (jetstream.MessagesContext, error) {
		if in.ID != oldID && failed.Add(1) <= 2 {
			return nil, errors.New("test: the pull does not start")
		}
		return start(in)
	}
	runWorker(t, w, "worker w1")

	lane, seq := lanes.post("a", "before")
	lanes.waitCommitted(lane, seq)
	// Released: only a delivery (the pull) takes the lane again.
	natstest.WaitFor(t, 20*time.Second, "lane released", func() error {
		if n := w.LanesOwned(); n != 0 {
			return fmt.Errorf("%d lanes owned", n)
		}
		return nil
	})

	if err := js.DeleteStream(t.Context(), names.InboxStream()); err != nil {
		t.Fatal(err)
	}
	pnc := srv.Connect(t)
	again, err := broker.Provision(t.Context(), natstest.JetStream(t, pnc), broker.ProvisionConfig{Names: names, LeaseTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	newID := again.InboxID
	if newID == oldID || newID == "" {
		t.Fatalf("recreated inbox has identity %q (was %q)", newID, oldID)
	}

	_, seq = lanes.post("a", "after")
	natstest.WaitFor(t, 30*time.Second, "the new stream's message committed", func() error {
		e, err := lanes.entry(lane)
		if err != nil {
			return err
		}
		if e.InboxID != newID || e.CommittedSeq < seq || e.Turn != nil {
			return fmt.Errorf("entry inbox %s (want %s), committed %d (want %d), turn %t", e.InboxID, newID, e.CommittedSeq, seq, e.Turn != nil)
		}
		return nil
	})
	if n := failed.Load(); n < 3 {
		t.Fatalf("%d tries to pull from the new stream, want 2 failed and one more", n)
	}
}
