package kv_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// leaseTTL is short so expiry tests finish quickly; 1s is the floor.
const leaseTTL = time.Second

// expiryTimeout bounds a wait for the server to expire a lease: the TTL plus
// the server's expiry timer granularity, with a generous margin.
const expiryTimeout = 10 * time.Second

// leases returns lane leases on a connection of their own.
func (e *env) leases(t *testing.T, ttl time.Duration) *kv.Leases {
	t.Helper()
	js, res := e.connect(t)
	return kv.NewLeases(js, res, names, ttl)
}

// waitExpired waits until the server has expired the lane's lease.
func waitExpired(t *testing.T, l *kv.Leases, lane string) {
	t.Helper()
	natstest.WaitFor(t, expiryTimeout, "lease "+lane+" to expire", func() error {
		owner, rev, err := l.Holder(context.Background(), lane)
		if errors.Is(err, kv.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("still held by %s at %d", owner, rev)
	})
}

func wantHeld(t *testing.T, err error, owner string) *kv.HeldError {
	t.Helper()
	var held *kv.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("err = %v, want *HeldError", err)
	}
	if held.Owner != owner {
		t.Fatalf("HeldError names %q, want %q", held.Owner, owner)
	}
	if !errors.Is(err, kv.ErrExists) {
		t.Errorf("errors.Is(%v, ErrExists) = false", err)
	}
	return held
}

func TestLeaseAcquireHeld(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	a, b := ev.leases(t, 5*time.Second), ev.leases(t, 5*time.Second)
	lane := "lease.held"

	before := time.Now()
	la, err := a.Acquire(ctx, lane, "wA/1")
	if err != nil {
		t.Fatal(err)
	}
	if la.Lane != lane || la.Owner != "wA/1" || la.Epoch == 0 || la.Rev != la.Epoch {
		t.Fatalf("lease = %+v", la)
	}
	if la.Renewed.Before(before) || la.Renewed.After(time.Now()) {
		t.Errorf("Renewed = %v, want the local time of the acquire", la.Renewed)
	}
	if got, want := a.TTL(), 5*time.Second; got != want {
		t.Errorf("TTL() = %v, want %v", got, want)
	}

	_, err = b.Acquire(ctx, lane, "wB/1")
	held := wantHeld(t, err, "wA/1")
	if held.Lane != lane || held.Rev != la.Rev {
		t.Errorf("HeldError = %+v, want lane %s rev %d", held, lane, la.Rev)
	}
	// The holder itself (e.g. a previous incarnation with the same id) is
	// refused too.
	_, err = a.Acquire(ctx, lane, "wA/1")
	wantHeld(t, err, "wA/1")

	owner, rev, err := b.Holder(ctx, lane)
	if err != nil || owner != "wA/1" || rev != la.Rev {
		t.Errorf("Holder = %q, %d, %v", owner, rev, err)
	}
	if _, _, err := b.Holder(ctx, "lease.nobody"); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("Holder of a free lane: %v, want ErrNotFound", err)
	}
	if got := kv.NewLeases(ev.js, ev.res, names, 10*time.Millisecond).TTL(); got != time.Second {
		t.Errorf("TTL below the floor = %v, want 1s", got)
	}
}

// TestLeaseRenewExpireTakeover: renewals every TTL/3 keep a lease alive well
// past its TTL; without them the server expires it; the next owner gets a
// higher epoch; the old owner's Renew and Release then fail or do nothing.
func TestLeaseRenewExpireTakeover(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	a, b := ev.leases(t, leaseTTL), ev.leases(t, leaseTTL)
	lane := "lease.renew"

	la, err := a.Acquire(ctx, lane, "wA/1")
	if err != nil {
		t.Fatal(err)
	}
	// Renew on a ticker for three TTLs; between renewals another owner
	// can't take the lease.
	tick := time.NewTicker(leaseTTL / 3)
	renewals := 0
	for until := time.Now().Add(3 * leaseTTL); time.Now().Before(until); {
		<-tick.C
		prev := la.Rev
		if err := a.Renew(ctx, la); err != nil {
			t.Fatalf("renewal %d: %v", renewals+1, err)
		}
		renewals++
		if la.Rev <= prev || la.Epoch == la.Rev {
			t.Fatalf("renewal %d: rev %d -> %d, epoch %d", renewals, prev, la.Rev, la.Epoch)
		}
		_, err := b.Acquire(ctx, lane, "wB/1")
		wantHeld(t, err, "wA/1")
	}
	tick.Stop()
	if renewals < 6 {
		t.Fatalf("only %d renewals in three TTLs", renewals)
	}

	// No more renewals: the server expires the lease, never before the TTL.
	lastRenewal := la.Renewed
	waitExpired(t, b, lane)
	if age := time.Since(lastRenewal); age < leaseTTL {
		t.Errorf("lease expired %v after its last renewal, before the TTL %v", age, leaseTTL)
	}

	lb, err := b.Acquire(ctx, lane, "wB/1")
	if err != nil {
		t.Fatalf("takeover after expiry: %v", err)
	}
	if lb.Epoch <= la.Rev {
		t.Errorf("new epoch %d is not above the old lease's last revision %d", lb.Epoch, la.Rev)
	}
	if err := a.Renew(ctx, la); !errors.Is(err, kv.ErrLeaseLost) {
		t.Errorf("Renew after takeover: %v, want ErrLeaseLost", err)
	}
	if err := a.Release(ctx, la); err != nil {
		t.Errorf("Release of a lost lease: %v", err)
	}
	if owner, rev, err := a.Holder(ctx, lane); err != nil || owner != "wB/1" || rev != lb.Rev {
		t.Errorf("after the old owner's Renew and Release: holder %q rev %d err %v, want wB/1 at %d", owner, rev, err, lb.Rev)
	}
	if err := b.Renew(ctx, lb); err != nil {
		t.Errorf("new owner's renewal: %v", err)
	}
}

func TestLeaseRelease(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	a, b := ev.leases(t, 5*time.Second), ev.leases(t, 5*time.Second)
	lane := "lease.release"

	la, err := a.Acquire(ctx, lane, "wA/1")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Renew(ctx, la); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, la); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Holder(ctx, lane); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("Holder after release: %v, want ErrNotFound", err)
	}
	if err := a.Release(ctx, la); err != nil {
		t.Errorf("second Release: %v", err)
	}
	lb, err := b.Acquire(ctx, lane, "wB/1")
	if err != nil {
		t.Fatalf("Acquire after release: %v", err)
	}
	if lb.Epoch <= la.Rev {
		t.Errorf("epoch %d after release is not above %d", lb.Epoch, la.Rev)
	}
	if err := a.Renew(ctx, la); !errors.Is(err, kv.ErrLeaseLost) {
		t.Errorf("Renew of a released lease: %v, want ErrLeaseLost", err)
	}
	// Releasing the old lease again leaves the new owner's alone.
	if err := a.Release(ctx, la); err != nil {
		t.Errorf("Release of a lease taken by another: %v", err)
	}
	if owner, _, err := b.Holder(ctx, lane); err != nil || owner != "wB/1" {
		t.Errorf("holder after a stale release: %q, %v", owner, err)
	}
}

// TestLeaseReleaseLeavesNoTombstone: a released lane's key disappears from
// the leases stream once the release marker expires, as an expired lease's
// does, so the bucket doesn't keep one tombstone per lane ever released.
func TestLeaseReleaseLeavesNoTombstone(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	l := ev.leases(t, 5*time.Second)
	lanes := []string{"tomb.a", "tomb.b", "tomb.c"}
	var last uint64
	for _, lane := range lanes {
		lease, err := l.Acquire(ctx, lane, "w/1")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Renew(ctx, lease); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx, lease); err != nil {
			t.Fatal(err)
		}
		last = lease.Rev
	}
	stream, err := ev.js.Stream(ctx, "KV_"+names.LeasesBucket())
	if err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, expiryTimeout, "release markers to expire", func() error {
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(">"))
		if err != nil {
			return err
		}
		if n := info.State.Msgs; n != 0 {
			return fmt.Errorf("%d messages left: %v", n, info.State.Subjects)
		}
		return nil
	})
	// The lanes are free and epochs keep growing.
	lease, err := l.Acquire(ctx, lanes[0], "w/2")
	if err != nil {
		t.Fatal(err)
	}
	if lease.Epoch <= last {
		t.Errorf("epoch %d after release, want above %d", lease.Epoch, last)
	}
}

// TestLeaseLostAck: a renewal whose acknowledgement was lost landed on the
// server while the owner's Lease still holds the previous revision. The next
// Renew must recognise the landed write as its own and keep the lease, and
// a Release must still delete it.
func TestLeaseLostAck(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	a, b := ev.leases(t, 5*time.Second), ev.leases(t, 5*time.Second)

	la, err := a.Acquire(ctx, "lease.lostack", "wA/1")
	if err != nil {
		t.Fatal(err)
	}
	landed := *la // the renewal that landed; la never learns its revision
	if err := a.Renew(ctx, &landed); err != nil {
		t.Fatal(err)
	}
	if err := a.Renew(ctx, la); err != nil {
		t.Fatalf("Renew after a renewal whose ack was lost: %v", err)
	}
	if la.Rev <= landed.Rev || la.Epoch != landed.Epoch {
		t.Errorf("lease rev %d epoch %d after renewing past %d", la.Rev, la.Epoch, landed.Rev)
	}

	lr, err := a.Acquire(ctx, "lease.lostack.release", "wA/1")
	if err != nil {
		t.Fatal(err)
	}
	landed = *lr
	if err := a.Renew(ctx, &landed); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, lr); err != nil {
		t.Fatal(err)
	}
	if owner, _, err := b.Holder(ctx, "lease.lostack.release"); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("Release with a stale revision left the lease held by %q (err %v)", owner, err)
	}
}

// TestLeaseSameOwnerNewEpoch: the owner id is per process incarnation, but
// the same incarnation can take a lane again after its lease expired. The old
// Lease is then dead: renewing it must not adopt the new epoch's key, and
// releasing it must not delete the new lease.
func TestLeaseSameOwnerNewEpoch(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	a := ev.leases(t, leaseTTL)
	lane := "lease.sameowner"

	old, err := a.Acquire(ctx, lane, "wA/1")
	if err != nil {
		t.Fatal(err)
	}
	waitExpired(t, a, lane)
	cur, err := a.Acquire(ctx, lane, "wA/1")
	if err != nil {
		t.Fatal(err)
	}
	if cur.Epoch <= old.Epoch {
		t.Fatalf("new epoch %d not above %d", cur.Epoch, old.Epoch)
	}
	if err := a.Renew(ctx, old); !errors.Is(err, kv.ErrLeaseLost) {
		t.Errorf("Renew of the expired epoch %d: %v, want ErrLeaseLost", old.Epoch, err)
	}
	if err := a.Release(ctx, old); err != nil {
		t.Errorf("Release of the expired epoch: %v", err)
	}
	if owner, rev, err := a.Holder(ctx, lane); err != nil || owner != "wA/1" || rev != cur.Rev {
		t.Fatalf("new lease after the old one's Renew and Release: %q at %d (%v), want rev %d", owner, rev, err, cur.Rev)
	}
	if err := a.Renew(ctx, cur); err != nil {
		t.Errorf("Renew of the live epoch: %v", err)
	}
}

// TestLeaseClockSkew: a contender whose clock runs a day ahead cannot take a
// live lease. Leases has no clock to inject: Acquire is a server-side Create
// that succeeds only when the key is absent, and expiry is the server's
// per-key TTL, so no local clock is consulted (Lease.Renewed is only the
// owner's own monotonic self-fence). The only clock kv takes is
// StoreOptions.Now; the contender runs with one 24h ahead, uses it on the
// same lane, and still gets HeldError on every attempt while the holder
// renews every TTL/3.
func TestLeaseClockSkew(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	holder := ev.leases(t, leaseTTL)
	lane := laneOf(src("skew"))

	js, res := ev.connect(t)
	skewed := kv.NewStore(res, &kv.StoreOptions{Now: func() time.Time { return time.Now().Add(24 * time.Hour) }})
	contender := kv.NewLeases(js, res, names, leaseTTL)
	if d := time.Until(skewed.Now()); d < 23*time.Hour {
		t.Fatalf("contender clock is only %v ahead", d)
	}

	lease, err := holder.Acquire(ctx, lane, "holder/1")
	if err != nil {
		t.Fatal(err)
	}
	// The contender's view of the lane is a day in the future: by its clock
	// the lane has been idle for a day.
	create(t, skewed, src("skew"))

	stop := make(chan struct{})
	renewErr := make(chan error, 1)
	go func() {
		tick := time.NewTicker(leaseTTL / 3)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				renewErr <- nil
				return
			case <-tick.C:
				if err := holder.Renew(ctx, lease); err != nil {
					renewErr <- err
					return
				}
			}
		}
	}()
	attempts := 0
	tick := time.NewTicker(leaseTTL / 10)
	for until := time.Now().Add(3 * leaseTTL); time.Now().Before(until); {
		<-tick.C
		_, err := contender.Acquire(ctx, lane, "contender/1")
		wantHeld(t, err, "holder/1")
		attempts++
	}
	tick.Stop()
	close(stop)
	if err := <-renewErr; err != nil {
		t.Fatalf("holder renewal: %v", err)
	}
	if attempts < 10 {
		t.Errorf("only %d contender attempts", attempts)
	}
}

// TestLeaseContentionR3: on an R3 bucket, contenders on their own
// connections hammering Acquire never get a lease whose holder keeps
// renewing, and never make a renewal fail. (A contender's Create fails the
// server's expected-sequence check at once, so it doesn't cause 10164; the
// 10164 case is TestLeaseConcurrentRenewR3.)
func TestLeaseContentionR3(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster; skipped with -short")
	}
	t.Parallel()
	c := natstest.RunCluster(t, 3)
	ctx := testCtx(t)
	const contenders = 4
	mk := func() *kv.Leases {
		js, res := provisionOn(t, natstest.JetStream(t, c.Connect(t)), 3)
		return kv.NewLeases(js, res, names, 5*time.Second)
	}
	holder := mk()
	others := make([]*kv.Leases, contenders)
	for i := range others {
		others[i] = mk()
	}
	lane := "lease.r3"
	lease, err := holder.Acquire(ctx, lane, "holder/1")
	if err != nil {
		t.Fatal(err)
	}

	var stop atomic.Bool
	var tries, stolen atomic.Int64
	var wg sync.WaitGroup
	for i, o := range others {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				_, err := o.Acquire(ctx, lane, fmt.Sprintf("contender/%d", i))
				tries.Add(1)
				var held *kv.HeldError
				if !errors.As(err, &held) {
					stolen.Add(1)
				}
			}
		}()
	}
	renewals := 0
	var renewErr error
	for until := time.Now().Add(2 * time.Second); time.Now().Before(until); renewals++ {
		if renewErr = holder.Renew(ctx, lease); renewErr != nil {
			break
		}
	}
	stop.Store(true)
	wg.Wait()
	if renewErr != nil {
		t.Fatalf("renewal %d under contention: %v", renewals+1, renewErr)
	}
	if n := stolen.Load(); n != 0 {
		t.Errorf("%d contender acquires did not fail with HeldError", n)
	}
	if owner, _, err := holder.Holder(ctx, lane); err != nil || owner != "holder/1" {
		t.Errorf("holder after contention: %q, %v", owner, err)
	}
	t.Logf("%d renewals against %d contender acquires", renewals, tries.Load())
}

// TestLeaseConcurrentRenewR3: a renewal retried while the previous one is
// still in flight (its ack timed out) races it. On R3 the server refuses the
// later one with err_code 10164 while the first is being replicated, even
// though both carry the right revision. Both copies belong to the live
// lease, so neither may report ErrLeaseLost.
func TestLeaseConcurrentRenewR3(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster; skipped with -short")
	}
	t.Parallel()
	c := natstest.RunCluster(t, 3)
	ctx := testCtx(t)
	mk := func() *kv.Leases {
		js, res := provisionOn(t, natstest.JetStream(t, c.Connect(t)), 3)
		return kv.NewLeases(js, res, names, 5*time.Second)
	}
	l1, l2 := mk(), mk()
	lease, err := l1.Acquire(ctx, "lease.r3.dup", "holder/1")
	if err != nil {
		t.Fatal(err)
	}
	for round := range 200 {
		retry := *lease
		var wg sync.WaitGroup
		var e1, e2 error
		wg.Add(2)
		go func() { defer wg.Done(); e1 = l1.Renew(ctx, lease) }()
		go func() { defer wg.Done(); e2 = l2.Renew(ctx, &retry) }()
		wg.Wait()
		if e1 != nil || e2 != nil {
			t.Fatalf("round %d: concurrent renewals of the live lease: %v / %v", round, e1, e2)
		}
		if retry.Rev > lease.Rev {
			lease.Rev = retry.Rev
		}
	}
	// Any replica may answer the read; wait for a lagging one to catch up.
	natstest.WaitFor(t, 10*time.Second, "the last renewal on every replica", func() error {
		for _, l := range []*kv.Leases{l1, l2} {
			if owner, rev, err := l.Holder(ctx, "lease.r3.dup"); err != nil || owner != "holder/1" || rev != lease.Rev {
				return fmt.Errorf("holder %q at %d (%v), want holder/1 at %d", owner, rev, err, lease.Rev)
			}
		}
		return nil
	})
}

// TestLiveLeases: Live lists the held leases only; released and expired
// ones (purge and expiry markers) are not in it.
func TestLiveLeases(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	l := ev.leases(t, leaseTTL)
	ctx := context.Background()
	var held []*kv.Lease
	for _, lane := range []string{"live.held", "live.released", "live.expired"} {
		lease, err := l.Acquire(ctx, lane, "w/one")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, lease)
	}
	if err := l.Release(ctx, held[1]); err != nil {
		t.Fatal(err)
	}
	// Keep the first one alive while the third runs out.
	stop := make(chan struct{})
	renewed := make(chan error, 1)
	go func() {
		tick := time.NewTicker(leaseTTL / 4)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				renewed <- nil
				return
			case <-tick.C:
				if err := l.Renew(ctx, held[0]); err != nil {
					renewed <- err
					return
				}
			}
		}
	}()
	waitExpired(t, l, "live.expired")
	live, err := l.Live(ctx)
	close(stop)
	if rerr := <-renewed; rerr != nil {
		t.Fatalf("renewing live.held: %v", rerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := live["live.held"]; !ok || len(live) != 1 {
		t.Fatalf("live leases %v, want only live.held", live)
	}
}
