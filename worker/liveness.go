package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentfleet/agentfleet/kv"
)

// liveness is the worker's liveness lease: one key per worker process
// (kv.LivenessKey of its owner id) in the leases bucket, with a short
// server-side TTL, renewed every quarter of it. Every lane lease the worker
// takes is bound to the liveness lease's epoch, and is void once that
// liveness lease is gone: the server's expiry marker wakes the dead
// worker's lanes (watchLeaseExpiries) and the next worker to acquire one
// takes its lease over by a conditional write (kv.Leases.AcquireBound). So
// a dead worker's lanes wait for one short TTL, not for their own lane
// leases, which are still renewed only every lease.ttl/3 each.
//
// The self-fence covers it like the lane lease: an owner writes only while
// the last confirmed renewal of the liveness lease its lane lease is bound
// to (counted from when it was sent) is younger than the TTL less a quarter
// of it (owner.alive). A write that finds it older waits (checkAlive), so a
// slow renewal on a loaded machine delays writes rather than losing the
// lanes. A liveness lease found expired (a store stall, a pause) is
// replaced by a new epoch, and every lane renews its lease at once to bind
// it to the new epoch; that renewal is a CAS on the lane lease, so it fails
// if another worker took the lane over in between (kv.Leases only takes
// over the lanes of an owner with no liveness lease at all).
type liveness struct {
	leases *kv.Leases
	ttl    time.Duration

	// lease is the current liveness lease; only the renew loop replaces it
	// after Start.
	lease *kv.Lease
	// epoch is lease's epoch (0: none yet); renewedAt the monoBase nanos of
	// the start of its last confirmed write.
	epoch     atomic.Uint64
	renewedAt atomic.Int64

	// changed is closed and replaced after every renewal (guarded by mu).
	mu      sync.Mutex
	changed chan struct{}
}

func newLiveness(leases *kv.Leases, ttl time.Duration) *liveness {
	return &liveness{leases: leases, ttl: ttl, changed: make(chan struct{})}
}

// margin is how long before the liveness lease could expire the owners
// stop writing.
func (lv *liveness) margin() time.Duration { return lv.ttl / 4 }

// set records a confirmed write of lease.
func (lv *liveness) set(lease *kv.Lease) {
	lv.lease = lease
	lv.renewedAt.Store(int64(lease.Renewed.Sub(monoBase)))
	lv.epoch.Store(lease.Epoch)
	lv.mu.Lock()
	close(lv.changed)
	lv.changed = make(chan struct{})
	lv.mu.Unlock()
}

// fresh reports whether the liveness lease of epoch is ours and was
// renewed recently enough to write.
func (lv *liveness) fresh(epoch uint64) bool {
	return epoch != 0 && lv.epoch.Load() == epoch &&
		mono()-lv.renewedAt.Load() < int64(lv.ttl-lv.margin())
}

// changedCh returns a channel closed at the next renewal.
func (lv *liveness) changedCh() <-chan struct{} {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	return lv.changed
}

// startLiveness takes the worker's liveness lease; Run calls it before it
// takes any lane.
func (w *Worker) startLiveness(ctx context.Context) error {
	var err error
	for attempt := 0; attempt < 10; attempt++ {
		var lease *kv.Lease
		lease, err = w.live.leases.Acquire(ctx, kv.LivenessKey(w.owner), w.owner)
		if err == nil {
			w.live.set(lease)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(w.live.ttl / 4):
		}
	}
	return fmt.Errorf("worker: take the liveness lease: %w", err)
}

// livenessLoop renews the liveness lease every TTL/4 until stop, then
// releases it (Run stops it only after every lane ended). A liveness
// lease found lost (it expired while this worker was alive, e.g. paused
// past its TTL) is counted and logged: the lanes bound to it lose their
// lease at their next write (a spurious takeover if the worker was not
// dead), and a new liveness lease is taken for the lanes to come.
func (w *Worker) livenessLoop(stop <-chan struct{}) {
	lv := w.live
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	t := time.NewTicker(lv.ttl / 4)
	defer t.Stop()
	lost := false
	for {
		select {
		case <-ctx.Done():
			if lost {
				return
			}
			if err := lv.leases.Release(context.Background(), lv.lease); err != nil {
				w.log.Warn("release the liveness lease", slog.Any("error", err))
			}
			return
		case <-t.C:
		}
		if lost {
			if nl, err := lv.leases.Acquire(ctx, kv.LivenessKey(w.owner), w.owner); err == nil {
				lv.set(nl)
				lost = false
			} else if ctx.Err() == nil {
				w.log.Warn("take a new liveness lease", slog.Any("error", err))
			}
			continue
		}
		lease := lv.lease
		err := lv.leases.Renew(ctx, lease)
		switch {
		case err == nil:
			lv.set(lease)
		case errors.Is(err, kv.ErrLeaseLost):
			lost = true
			w.stats.LivenessLost.Add(1)
			w.log.Warn("liveness lease lost while running: this worker's lanes may be taken over (spurious takeover)",
				slog.Uint64("epoch", lease.Epoch), slog.Duration("since_renewal", time.Duration(mono()-lv.renewedAt.Load())))
		case ctx.Err() == nil:
			w.log.Warn("renew the liveness lease", slog.Any("error", err))
		}
	}
}
