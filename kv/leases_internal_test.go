package kv

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
)

// vanishingKV is the leases bucket seen by an acquisition whose lease
// vanishes between the refused create and the read of its holder: each of
// the next vanish reads of a key is preceded by a purge of it (as a release,
// or the server's expiry, in between would leave it). With retake, every
// create is preceded by another owner taking the key again.
type vanishingKV struct {
	jetstream.KeyValue
	other *Leases // writes the other owner's lease, on the same bucket

	mu      sync.Mutex
	vanish  int
	retake  bool
	creates int
}

func (v *vanishingKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	v.mu.Lock()
	v.creates++
	retake := v.retake
	v.mu.Unlock()
	if retake {
		if _, err := v.other.Acquire(ctx, key, "other/1"); err != nil {
			return 0, err
		}
	}
	return v.KeyValue.Create(ctx, key, value, opts...)
}

func (v *vanishingKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	v.mu.Lock()
	purge := v.vanish > 0
	if purge {
		v.vanish--
	}
	v.mu.Unlock()
	if purge {
		if err := v.KeyValue.Purge(ctx, key); err != nil {
			return nil, err
		}
	}
	return v.KeyValue.Get(ctx, key)
}

// TestAcquireRetriesALeaseGoneWhenRead: an acquisition whose create was
// refused but which found the lease gone when it read its holder (released,
// or run out, in between) takes the lane at once. It used to return a
// HeldError naming no owner, and its callers handed the lane's deliveries
// back, to try again a lease TTL later. A key that keeps coming back and
// vanishing is tried a bounded number of times.
func TestAcquireRetriesALeaseGoneWhenRead(t *testing.T) {
	t.Parallel()
	a := newAmbEnv(t)
	ctx := t.Context()
	names := broker.MustNames("fleet")
	other := NewLeases(a.js, a.res, names, 30*time.Second)
	v := &vanishingKV{KeyValue: a.res.Leases, other: other}
	l := NewLeases(a.js, a.res, names, 30*time.Second)
	l.kv = v

	const lane = "vanish.once"
	if _, err := other.Acquire(ctx, lane, "other/1"); err != nil {
		t.Fatal(err)
	}
	v.vanish = 1
	lease, err := l.AcquireBound(ctx, lane, "w/1", 7)
	if err != nil {
		t.Fatalf("AcquireBound of a lease gone when read: %v, want the lease", err)
	}
	if lease.Owner != "w/1" || lease.Live != 7 || lease.TookOver {
		t.Errorf("lease = %+v", lease)
	}
	owner, rev, err := other.Holder(ctx, lane)
	if err != nil || owner != "w/1" || rev != lease.Epoch {
		t.Errorf("holder %q at %d (%v), want w/1 at %d", owner, rev, err, lease.Epoch)
	}
	if v.creates != 2 {
		t.Errorf("%d creates, want 2", v.creates)
	}

	// Retaken before every create, gone at every read: a bounded number of
	// attempts, then a HeldError naming no owner.
	const lane2 = "vanish.always"
	v.mu.Lock()
	v.vanish, v.retake, v.creates = 1000, true, 0
	v.mu.Unlock()
	_, err = l.AcquireBound(ctx, lane2, "w/1", 7)
	var held *HeldError
	if !errors.As(err, &held) || held.Owner != "" {
		t.Fatalf("AcquireBound of a lease that keeps vanishing: %v, want a HeldError naming no owner", err)
	}
	if got, want := v.creates, maxLeaseConflicts+1; got != want {
		t.Errorf("%d creates, want %d", got, want)
	}
}

// TestHeldErrorNamesTheEpoch: a HeldError names the epoch of the lease
// holding the key (the revision of its create), not only the revision of
// its last renewal.
func TestHeldErrorNamesTheEpoch(t *testing.T) {
	t.Parallel()
	a := newAmbEnv(t)
	ctx := t.Context()
	names := broker.MustNames("fleet")
	l := NewLeases(a.js, a.res, names, 30*time.Second)
	const lane = "held.epoch"
	lease, err := l.Acquire(ctx, lane, "w/1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Acquire(ctx, lane, "w/2")
	var held *HeldError
	if !errors.As(err, &held) || held.Owner != "w/1" || held.Epoch != lease.Epoch || held.Rev != lease.Rev {
		t.Fatalf("Acquire of a held lane: %v (%+v), want held by w/1 at epoch and rev %d", err, held, lease.Epoch)
	}
	if err := l.Renew(ctx, lease); err != nil {
		t.Fatal(err)
	}
	_, err = l.Acquire(ctx, lane, "w/2")
	if !errors.As(err, &held) || held.Epoch != lease.Epoch || held.Rev != lease.Rev || held.Rev == held.Epoch {
		t.Fatalf("Acquire of a renewed lease: %v (%+v), want epoch %d rev %d", err, held, lease.Epoch, lease.Rev)
	}
}
