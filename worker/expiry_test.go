package worker_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

// TestLeaseExpiryWakesLane: a lane whose owner died holds a message that no
// delivery will bring back (its delivery was acked, as a lost wake-up
// would leave it). The watcher's leader follows the leases bucket and wakes
// the lane when the lease expires, long before any sweep.
func TestLeaseExpiryWakesLane(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (waits out a lease expiry); skipped under -short")
	}
	f := newFleet(t)
	ctx := t.Context()
	lane := session.LaneToken(session.BuildSessionKey(session.SessionSource{Platform: session.PlatformHTTP, ChatID: "orphan", ChatType: session.ChatDM, UserID: "u-orphan"}, session.DefaultKeyOptions()))

	// A ghost owner takes the lane and keeps renewing it for now.
	leases := kv.NewLeases(f.js, f.res, f.names, testTTL)
	ghost, err := leases.Acquire(ctx, lane, "ghost/00000000")
	if err != nil {
		t.Fatal(err)
	}
	renewing, stopRenewing := context.WithCancel(ctx)
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		tick := time.NewTicker(testTTL / 3)
		defer tick.Stop()
		for {
			select {
			case <-renewing.Done():
				return
			case <-tick.C:
				if err := leases.Renew(renewing, ghost); err != nil && renewing.Err() == nil {
					t.Errorf("ghost renewal: %v", err)
					return
				}
			}
		}
	}()
	defer func() { stopRenewing(); <-renewed }()

	got, seq := f.post("orphan", "are you there?", "o1")
	if got != lane {
		t.Fatalf("lane %s, want %s", got, lane)
	}
	// The message's delivery is consumed and acked here: nothing will
	// redeliver it.
	batch, err := f.res.Consumer.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range batch.Messages() {
		n++
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if n != 1 {
		t.Fatalf("fetched %d deliveries, want 1", n)
	}

	w := f.startWorker("w1", func(c *worker.Config) { c.WatchInterval = time.Hour })
	// Let the new leader's first sweep pass while the ghost still holds the
	// lane: only the expiry can wake it now.
	natstest.WaitFor(t, 20*time.Second, "the watcher's first sweep", func() error {
		if w.Stats().Sweeps.Load() == 0 {
			return errors.New("no sweep yet")
		}
		return nil
	})
	stopRenewing()
	<-renewed
	expiresBy := time.Now().Add(testTTL)

	f.waitReplies(lane, 1)
	f.waitCommitted(lane, seq)
	answered := time.Now()
	if n := w.Stats().ExpiryWakes.Load(); n != 1 {
		t.Errorf("expiry wakes %d, want 1", n)
	}
	t.Logf("answered %v after the ghost's lease expired at the latest", answered.Sub(expiresBy).Round(time.Millisecond))
	// Operators see it in the registry (fleetctl worker ls).
	natstest.WaitFor(t, 10*time.Second, "the registry to show the expiry wake-up", func() error {
		recs, err := worker.ListWorkers(ctx, f.res.Workers)
		if err != nil {
			return err
		}
		for _, r := range recs {
			if r.Owner == w.Owner() && r.ExpiryWakes == 1 && r.Sweeps >= 1 && r.Watcher {
				return nil
			}
		}
		return fmt.Errorf("records %+v", recs)
	})
}
