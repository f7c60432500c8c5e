package worker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
)

// sweepWorkers bounds the round trips (inbox reads, internal publishes,
// purges, deletes) a sweep or a prune has in flight at once.
const sweepWorkers = 32

// Sweep wakes stranded lanes (no live lease, but a turn in flight or inbox
// messages above committed_seq) and asks owners to finalize expired
// sessions. It returns how many commands it published.
//
// It streams the entries (kv.Store.Each) and holds none beyond the bounded
// queue of a pool of sweepWorkers goroutines, which do the per-entry round
// trips concurrently. The first error cancels the round trips still queued
// or in flight and is returned, with the number of commands published until
// then.
func (w *Worker) Sweep(ctx context.Context) (int, error) {
	// The live leases, read once: lanes owned right now, a small set. A
	// lane taken after this listing is treated as free and may get a wake
	// it does not need (harmless: the owner commits it like any internal
	// command, and its Msg-Id dedups repeats); a lease that runs out during
	// the sweep leaves its lane to the next sweep, or to the redelivery of
	// the delivery its owner held.
	held, err := w.leases.Live(ctx)
	if err != nil {
		return 0, err
	}
	now := w.cfg.Now()
	p := newSweepPool(ctx, sweepWorkers)
	err = w.store.Each(ctx, func(r kv.Record) error {
		if _, ok := held[r.Lane]; ok {
			return nil // owned: the owner handles it
		}
		return p.submit(func(ctx context.Context) (bool, error) { return w.sweepEntry(ctx, r, now) })
	})
	return p.wait(err)
}

// sweepEntry publishes the command an entry with no live lease needs, if
// any, and reports whether it published one.
func (w *Worker) sweepEntry(ctx context.Context, r kv.Record, now time.Time) (bool, error) {
	e := r.Entry
	if woke, err := w.wakeStranded(ctx, r.Lane, e); woke || err != nil {
		return woke, err
	}
	if e.ExpiryFinalized || e.SessionID == "" {
		return false, nil
	}
	policy := w.cfg.Reset.PolicyFor(e.Platform, e.ChatType)
	if session.ShouldReset(e, policy, now, w.cfg.Location, false) == "" {
		return false, nil
	}
	if err := w.publishInternal(ctx, r.Lane, e.SessionKey, session.CmdExpire, e.SessionID, "expire:"+e.SessionID); err != nil {
		return false, err
	}
	return true, nil
}

// sweepPool runs the per-entry work of a sweep or a prune on a fixed set of
// goroutines fed through a bounded queue, so that many round trips are in
// flight at once while memory stays bounded: the scan blocks in submit when
// the queue is full. The first error cancels the pool's ctx (every job
// queued or in flight) and is what wait returns.
//
// A job's error also ends the scan: submit returns it to the scan's
// callback.
type sweepPool struct {
	ctx    context.Context
	cancel context.CancelFunc
	jobs   chan func(context.Context) (bool, error)
	wg     sync.WaitGroup
	once   sync.Once
	err    error // the first error; read only after wg.Wait
	n      atomic.Int64
}

func newSweepPool(ctx context.Context, workers int) *sweepPool {
	ctx, cancel := context.WithCancel(ctx)
	p := &sweepPool{ctx: ctx, cancel: cancel, jobs: make(chan func(context.Context) (bool, error), workers)}
	p.wg.Add(workers)
	for range workers {
		go func() {
			defer p.wg.Done()
			for job := range p.jobs {
				if p.ctx.Err() != nil {
					continue // failed or cancelled: drop what is queued
				}
				done, err := job(p.ctx)
				if done {
					p.n.Add(1)
				}
				if err != nil {
					p.fail(err)
				}
			}
		}()
	}
	return p
}

func (p *sweepPool) fail(err error) {
	p.once.Do(func() {
		p.err = err
		p.cancel()
	})
}

// submit queues a job; a job that returns true counts one. It blocks while
// the queue is full; once the pool failed or ctx ended it drops the job and
// returns the pool's ctx error, which ends the scan.
func (p *sweepPool) submit(job func(context.Context) (bool, error)) error {
	if err := p.ctx.Err(); err != nil {
		return err
	}
	select {
	case p.jobs <- job:
		return nil
	case <-p.ctx.Done():
		return p.ctx.Err()
	}
}

// wait ends the pool after the scan returned scanErr: a scan error cancels
// the jobs still queued or running. It returns once every goroutine has
// ended, with the count of jobs that returned true and the first error (a
// job's error wins over the cancellation it caused in the scan).
func (p *sweepPool) wait(scanErr error) (int, error) {
	if scanErr != nil {
		p.fail(scanErr)
	}
	close(p.jobs)
	p.wg.Wait()
	p.cancel()
	return int(p.n.Load()), p.err
}
