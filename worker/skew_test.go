package worker_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

// TestClockSkewTakesNoLiveLease: lease expiry is judged by the server, so a
// worker whose clock runs a day ahead takes no lease that its owner renews.
func TestClockSkewTakesNoLiveLease(t *testing.T) {
	f := newFleet(t)
	noPolicy := func(c *worker.Config) {
		c.Reset.Default = session.ResetPolicy{Mode: session.ResetNone}
		c.Linger = 10 * time.Second
	}
	a := f.startWorker("honest", noPolicy)

	var mu sync.Mutex
	owners := map[string]int{}
	sub, err := f.nc.Subscribe("fleet.ev.turn.>", func(m *nats.Msg) {
		var ev worker.TurnEvent
		if json.Unmarshal(m.Data, &ev) == nil && ev.Type == "start" {
			mu.Lock()
			owners[ev.Owner]++
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck

	lane, seq := f.post("skew", "first", "m0")
	f.waitCommitted(lane, seq)
	if e, _, _ := f.store.Get(t.Context(), lane); e.Owner != a.Owner() {
		t.Fatalf("lane owned by %q, want %q", e.Owner, a.Owner())
	}

	// Now the skewed worker joins and keeps receiving wake-ups for the lane
	// while the honest owner holds it (lingering, renewing).
	b := f.startWorker("skewed", func(c *worker.Config) {
		noPolicy(c)
		c.Now = func() time.Time { return time.Now().Add(24 * time.Hour) }
	})
	var last uint64
	for i := 1; i <= 20; i++ {
		_, last = f.post("skew", fmt.Sprintf("m%d", i), fmt.Sprintf("m%d", i))
	}
	e := f.waitCommitted(lane, last)
	if e.Owner != a.Owner() {
		t.Fatalf("after the burst the lane is owned by %q, want the honest %q", e.Owner, a.Owner())
	}
	// The skewed worker did try: deliveries of the lane reached it and the
	// server's lease refused it the lane.
	natstest.WaitFor(t, 20*time.Second, "the skewed worker to be refused the live lease", func() error {
		if b.Stats().HeldElsewhere.Load() == 0 && b.Stats().Takeovers.Load() == 0 {
			// It may have got no delivery of the lane yet: post more.
			f.post("skew", "more", "")
			return fmt.Errorf("no refused delivery yet")
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if n := owners[b.Owner()]; n != 0 {
		t.Fatalf("the skewed worker ran %d turns on a lane whose lease was live: %v", n, owners)
	}
	if b.Stats().Takeovers.Load() != 0 {
		t.Fatalf("the skewed worker took %d leases", b.Stats().Takeovers.Load())
	}
}
