package worker_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
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

// TestForwardToADrainingHolderIsNotALoop: a worker stopping gracefully
// keeps a lane's lease while its agent call ends (here an agent that does
// not return at once when cancelled), and the other workers forward the
// lane's new deliveries to it. It keeps them with the lane's deliveries
// until it releases the lane: an immediate NAK came straight back as a
// redelivery, which looked at the lease, found the draining holder and
// forwarded to it again, a loop of NAKs and redeliveries for as long as the
// call took. Counted over a window of the drain: at most about one forward
// a second. The message is answered once the holder is gone.
func TestForwardToADrainingHolderIsNotALoop(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	stuck := agent.AgentFunc(func(ctx context.Context, tn *agent.Turn, emit agent.Emitter) (*agent.Result, error) {
		select {
		case <-release: // deaf to ctx: a call that takes its time to stop
		case <-time.After(60 * time.Second):
		}
		return &agent.Result{Text: "done"}, nil
	})
	b, stopB := f.startStoppable("holder", mods(noReset, func(c *worker.Config) {
		c.DrainTimeout = 60 * time.Second
		c.Backend = agent.BackendFunc(func(context.Context, string, string) (agent.Agent, error) { return stuck, nil })
	}))
	lane, _ := f.post("drainfwd", "stuck", "d1")
	natstest.WaitFor(t, 20*time.Second, "the holder's turn to run", func() error {
		e, _, err := f.store.Get(t.Context(), lane)
		if err != nil {
			return err
		}
		if e.Turn == nil || e.Owner != b.Owner() {
			return fmt.Errorf("turn %v, owner %q", e.Turn != nil, e.Owner)
		}
		return nil
	})
	a := f.startWorker("other", noReset)
	stopped := make(chan struct{})
	go func() { defer close(stopped); stopB() }()
	natstest.WaitFor(t, 20*time.Second, "the holder to drain (it pulls nothing more), its call running", func() error {
		rs, err := worker.ListWorkers(t.Context(), f.res.Workers)
		if err != nil {
			return err
		}
		for _, r := range rs {
			if r.Owner == b.Owner() && r.State == worker.StateDraining {
				return nil
			}
		}
		return fmt.Errorf("not draining yet")
	})
	_, seq := f.post("drainfwd", "after", "d2")
	natstest.WaitFor(t, 20*time.Second, "a delivery forwarded to the draining holder", func() error {
		if n := b.Stats().ForwardsReceived.Load(); n == 0 {
			return fmt.Errorf("none yet")
		}
		return nil
	})
	before := b.Stats().ForwardsReceived.Load()
	window := 2 * time.Second
	<-time.After(window)
	n := b.Stats().ForwardsReceived.Load() - before
	t.Logf("%d forwards to the draining holder in %s (the other worker saw %d redeliveries)", n, window, a.Stats().Redelivered.Load())
	unblock()
	<-stopped
	if n > 4 {
		t.Fatalf("%d forwards to the draining holder in %s: a NAK loop", n, window)
	}
	f.waitCommitted(lane, seq)
}
