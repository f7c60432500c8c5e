package kv_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestLeaseTakeoverFromDeadOwner: a lane lease bound to an owner's liveness
// lease is held while that liveness lease lives, and taken over, with a
// higher epoch and long before the lane lease's own TTL, once it expired
// and the owner has none.
// The old owner's renewal then fails. Orphans lists the lane only while its
// owner is dead.
func TestLeaseTakeoverFromDeadOwner(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	lanes := e.leases(t, time.Minute) // the lane lease TTL: never reached here
	live := e.leases(t, leaseTTL)

	liveA, err := live.Acquire(ctx, kv.LivenessKey("a"), "a")
	if err != nil {
		t.Fatal(err)
	}
	liveB, err := live.Acquire(ctx, kv.LivenessKey("b"), "b")
	if err != nil {
		t.Fatal(err)
	}
	leaseA, err := lanes.AcquireBound(ctx, "lane1", "a", liveA.Epoch)
	if err != nil {
		t.Fatal(err)
	}
	if err := lanes.Renew(ctx, leaseA); err != nil {
		t.Fatal(err)
	}

	// A's liveness lives: B is refused, and the lane is no orphan.
	_, err = lanes.AcquireBound(ctx, "lane1", "b", liveB.Epoch)
	wantHeld(t, err, "a")
	if o, err := lanes.Orphans(ctx, ""); err != nil || len(o) != 0 {
		t.Fatalf("Orphans = %v, %v while A lives", o, err)
	}

	// A stops renewing its liveness (B keeps renewing its own): the server
	// expires it, and the lane becomes an orphan.
	natstest.WaitFor(t, expiryTimeout, "A's liveness lease to expire", func() error {
		if err := live.Renew(ctx, liveB); err != nil {
			return err
		}
		alive, err := lanes.OwnerAlive(ctx, "a")
		if err != nil || alive {
			return errors.New("A's liveness lease still lives")
		}
		return nil
	})
	if o, err := lanes.Orphans(ctx, kv.LivenessKey("a")); err != nil || !slices.Equal(o, []string{"lane1"}) {
		t.Fatalf("Orphans(A) = %v, %v; want [lane1]", o, err)
	}
	if o, err := lanes.Orphans(ctx, kv.LivenessKey("b")); err != nil || len(o) != 0 {
		t.Fatalf("Orphans(B) = %v, %v; want none", o, err)
	}

	leaseB, err := lanes.AcquireBound(ctx, "lane1", "b", liveB.Epoch)
	if err != nil {
		t.Fatalf("B's takeover: %v", err)
	}
	if !leaseB.TookOver || leaseB.Epoch <= leaseA.Rev || leaseB.Live != liveB.Epoch {
		t.Fatalf("B's lease %+v; want a takeover above A's revision %d bound to %d", leaseB, leaseA.Rev, liveB.Epoch)
	}
	if owner, rev, err := lanes.Holder(ctx, "lane1"); err != nil || owner != "b" || rev != leaseB.Epoch {
		t.Fatalf("holder %q at %d (%v); want b at %d", owner, rev, err, leaseB.Epoch)
	}
	// A, paused and resumed, cannot renew, and its release changes nothing.
	if err := lanes.Renew(ctx, leaseA); !errors.Is(err, kv.ErrLeaseLost) {
		t.Fatalf("A's renewal after the takeover: %v, want ErrLeaseLost", err)
	}
	if err := lanes.Release(ctx, leaseA); err != nil {
		t.Fatal(err)
	}
	if owner, _, err := lanes.Holder(ctx, "lane1"); err != nil || owner != "b" {
		t.Fatalf("holder %q (%v) after A's release; want b", owner, err)
	}
	// A takes a new liveness lease: it counts as alive again, but its old
	// lane lease stays B's (A could only rebind it by a renewal, a CAS on
	// its own last write, which the takeover moved).
	if _, err := live.Acquire(ctx, kv.LivenessKey("a"), "a"); err != nil {
		t.Fatal(err)
	}
	if alive, err := lanes.OwnerAlive(ctx, "a"); err != nil || !alive {
		t.Fatalf("OwnerAlive(a) = %v, %v after its new liveness lease; want true", alive, err)
	}
	leaseA.Live = 99
	if err := lanes.Renew(ctx, leaseA); !errors.Is(err, kv.ErrLeaseLost) {
		t.Fatalf("A's rebinding renewal after the takeover: %v, want ErrLeaseLost", err)
	}
	if err := lanes.Renew(ctx, leaseB); err != nil {
		t.Fatalf("B's renewal: %v", err)
	}
}
