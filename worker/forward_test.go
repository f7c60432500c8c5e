package worker_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

// TestDeliveriesForwardedToTheOwner: a worker that meets a delivery of a
// lane another worker holds forwards it to that worker, which acks it as one
// of its own: every delivery is acknowledged without a NAK or a redelivery,
// and every message is answered once, in order, by the owner.
func TestDeliveriesForwardedToTheOwner(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	linger := func(c *worker.Config) {
		c.Reset.Default = session.ResetPolicy{Mode: session.ResetNone}
		c.Linger = time.Minute
	}
	a, stopA := f.startStoppable("owner", linger)
	lane, seq := f.post("fwd", "m0", "m0")
	f.waitCommitted(lane, seq)
	b := f.startWorker("other", linger)

	n := 0
	natstest.WaitFor(t, 60*time.Second, "a delivery forwarded to the owner", func() error {
		n++
		_, s := f.post("fwd", fmt.Sprintf("m%d", n), fmt.Sprintf("m%d", n))
		f.waitCommitted(lane, s)
		if b.Stats().Forwarded.Load() == 0 || a.Stats().ForwardsReceived.Load() == 0 {
			return fmt.Errorf("forwarded %d, received %d", b.Stats().Forwarded.Load(), a.Stats().ForwardsReceived.Load())
		}
		return nil
	})
	if e, _, _ := f.store.Get(t.Context(), lane); e.Owner != a.Owner() {
		t.Fatalf("lane owned by %q, want %q", e.Owner, a.Owner())
	}
	want := make([]string, 0, n+1)
	for i := 0; i <= n; i++ {
		want = append(want, fmt.Sprintf("echo: m%d", i))
	}
	if got := texts(f.waitReplies(lane, n+1), session.ReplyKindReply); !slices.Equal(got, want) {
		t.Fatalf("replies %q, want %q", got, want)
	}

	// The owner stops: it acks what it holds at or below its commit, the
	// forwarded deliveries included. Nothing stays pending, and nothing came
	// back through a redelivery (an unacknowledged forward would, after the
	// ack wait, to the other worker).
	stopA()
	natstest.WaitFor(t, 30*time.Second, "every delivery acknowledged", func() error {
		info, err := f.res.Consumer.Info(t.Context())
		if err != nil {
			return err
		}
		if info.NumAckPending != 0 || info.NumPending != 0 {
			return fmt.Errorf("%d unacknowledged, %d undelivered", info.NumAckPending, info.NumPending)
		}
		return nil
	})
	if r := a.Stats().Redelivered.Load() + b.Stats().Redelivered.Load(); r != 0 {
		t.Fatalf("%d deliveries were redelivered", r)
	}
}
