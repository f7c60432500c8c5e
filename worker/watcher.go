package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
)

// WakeCommand is the internal command that wakes a lane no worker holds,
// and WakeMsgID its Msg-Id for a lane's state: the expiry watch, the sweep
// and `fleetctl lane break-lease` send the same one, so a lane is woken
// once for a given state.
const WakeCommand = session.CmdWake

// WakeMsgID is the Msg-Id of the wake-up of lane at committed seq and epoch.
func WakeMsgID(lane string, committed, epoch uint64) string {
	return fmt.Sprintf("wake:%s:%d:%d", lane, committed, epoch)
}

// watcherLoop competes for the watcher lease. The leader follows lease
// expiries (watchLeaseExpiries), sweeps every WatchInterval for expired
// sessions and stranded lanes, and prunes old entries every PruneInterval.
// Sweeps and prunes run beside the loop, so the lead is renewed while they
// take their time; losing the lead cancels them.
func (w *Worker) watcherLoop(stop <-chan struct{}) {
	key := w.names.WatcherLeaseKey()
	tick := time.NewTicker(w.cfg.LeaseTTL / 3)
	defer tick.Stop()
	var lease *kv.Lease
	var lastSweep, lastPrune time.Time
	var lead context.Context
	var endLead context.CancelFunc
	var wg sync.WaitGroup
	busy := make(chan struct{}, 1) // one sweep or prune at a time
	ctx := w.hardCtx
	resign := func() {
		if endLead != nil {
			endLead()
			wg.Wait()
			endLead = nil
		}
		w.watcherLeader.Store(false)
	}
	defer func() {
		resign()
		if lease != nil {
			_ = w.leases.Release(context.Background(), lease)
		}
	}()
	for {
		select {
		case <-stop:
			return
		case <-w.drainCh:
			return
		case <-tick.C:
		}
		if lease == nil {
			l, err := w.leases.Acquire(ctx, key, w.owner)
			if err != nil {
				continue
			}
			lease = l
			w.watcherLeader.Store(true)
			w.log.Info("expiry watcher: this worker leads")
			lastSweep = time.Now().Add(-w.cfg.WatchInterval + w.cfg.LeaseTTL) // first sweep soon, not at once
			leadCtx, cancelLead := context.WithCancel(ctx)
			lead, endLead = leadCtx, cancelLead
			wg.Add(1)
			go func(lead context.Context) {
				defer wg.Done()
				w.followExpiries(lead)
			}(lead)
		} else if err := w.leases.Renew(ctx, lease); err != nil {
			w.log.Info("expiry watcher: lost the lead", "err", err)
			lease = nil
			resign()
			continue
		}
		if time.Since(lastSweep) >= w.cfg.WatchInterval && w.tryBusy(busy) {
			lastSweep = time.Now()
			wg.Add(1)
			go func(lead context.Context) {
				defer wg.Done()
				defer func() { <-busy }()
				n, err := w.Sweep(lead)
				w.stats.Sweeps.Add(1)
				switch {
				case err != nil && lead.Err() == nil:
					w.log.Warn("sweep", "err", err)
				case n > 0:
					w.log.Info("sweep woke lanes", "count", n)
				}
			}(lead)
		}
		if w.cfg.MaxAgeDays > 0 && time.Since(lastPrune) >= w.cfg.PruneInterval && w.tryBusy(busy) {
			lastPrune = time.Now()
			wg.Add(1)
			go func(lead context.Context) {
				defer wg.Done()
				defer func() { <-busy }()
				n, err := w.Prune(lead)
				switch {
				case err != nil && lead.Err() == nil:
					w.log.Warn("prune", "err", err)
				case n > 0:
					w.log.Info("pruned old sessions", "count", n)
				}
			}(lead)
		}
	}
}

func (w *Worker) tryBusy(busy chan struct{}) bool {
	select {
	case busy <- struct{}{}:
		return true
	default:
		return false
	}
}

// followExpiries runs watchLeaseExpiries for as long as lead lasts,
// starting it again after a failure.
func (w *Worker) followExpiries(lead context.Context) {
	for lead.Err() == nil {
		if err := w.watchLeaseExpiries(lead); err != nil {
			w.log.Warn("lease expiries", "err", err)
		}
		select {
		case <-lead.Done():
		case <-time.After(time.Second):
		}
	}
}

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

func (w *Worker) publishInternal(ctx context.Context, lane, key, cmd, args, msgID string) error {
	body, err := json.Marshal(session.Inbound{SessionKey: key, Kind: session.KindInternal, Command: cmd, Args: args, ReceivedAt: time.Now()})
	if err != nil {
		return err
	}
	msg := nats.NewMsg(w.names.InboxSubject(session.Partition(w.names.Prefix(), lane), lane))
	msg.Data = body
	msg.Header.Set(broker.HdrSessionKey, key)
	msg.Header.Set(broker.HdrKind, session.KindInternal)
	_, err = w.js.PublishMsg(ctx, msg, jetstream.WithMsgID(msgID))
	return err
}

// Prune deletes entries not updated for session_store_max_age_days: the
// lane's inbox is purged up to committed_seq, then the entry is deleted at
// the revision read, only when no lease is held and no turn is set. The
// candidates' round trips run on a bounded pool, as in Sweep; each entry's
// own steps stay in order (read, purge, then the CAS delete).
func (w *Worker) Prune(ctx context.Context) (int, error) {
	cutoff := w.cfg.Now().Add(-time.Duration(w.cfg.MaxAgeDays) * 24 * time.Hour)
	// The live leases, listed at the first candidate (most prunes have
	// none). A lane taken after the listing is no worse off than with a
	// check of its lease right before the delete: its new owner writes
	// owner and epoch into the entry right after taking the lease, so the
	// delete at the revision read here fails unless it lands between those
	// two writes (the window such a check leaves open too), and the purge
	// only removes messages at or below the committed_seq read here, which
	// no owner reads again.
	var held map[string]struct{}
	p := newSweepPool(ctx, sweepWorkers)
	err := w.store.Each(ctx, func(r kv.Record) error {
		e := r.Entry
		if err := p.ctx.Err(); err != nil {
			return err
		}
		if e.Suspended || e.Turn != nil || e.Owner != "" || !e.UpdatedAt.Before(cutoff) {
			return nil
		}
		if held == nil {
			var err error
			if held, err = w.leases.Live(p.ctx); err != nil {
				return err
			}
		}
		if _, ok := held[r.Lane]; ok {
			return nil
		}
		return p.submit(func(ctx context.Context) (bool, error) { return w.pruneEntry(ctx, r) })
	})
	return p.wait(err)
}

// pruneEntry deletes an old entry with no live lease unless its inbox holds
// unprocessed work, and reports whether it deleted it.
func (w *Worker) pruneEntry(ctx context.Context, r kv.Record) (bool, error) {
	e := r.Entry
	subject := w.names.InboxSubject(session.Partition(w.names.Prefix(), r.Lane), r.Lane)
	if last, err := w.res.Inbox.GetLastMsgForSubject(ctx, subject); err == nil && last.Sequence > e.CommittedSeq {
		return false, nil // unprocessed work: not prunable
	}
	if e.InboxID == w.res.InboxID && e.CommittedSeq > 0 {
		if err := w.res.Inbox.Purge(ctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(e.CommittedSeq+1)); err != nil {
			return false, err
		}
	}
	if err := w.store.Delete(ctx, r.Lane, r.Revision); err != nil {
		if errors.Is(err, kv.ErrRevisionMismatch) {
			return false, nil
		}
		return false, err
	}
	w.event("pruned", r.Lane, map[string]any{"session_id": e.SessionID, "updated_at": e.UpdatedAt})
	return true, nil
}

// runInternal applies an internal command as the lane's owner.
func (l *lane) runInternal(m inboxMsg) bool {
	if m.body.Command == session.CmdAutoResume {
		return l.runAutoResume(m)
	}
	if m.body.Command != session.CmdExpire {
		return l.commitSimple(m.seq)
	}
	w := l.w
	e := l.entry
	policy := w.cfg.Reset.PolicyFor(e.Platform, e.ChatType)
	expired := e.SessionID == m.body.Args && !e.ExpiryFinalized && e.Turn == nil &&
		session.ShouldReset(e, policy, w.cfg.Now(), w.cfg.Location, false) != ""
	if !expired {
		return l.commitSimple(m.seq)
	}
	// Finalize: the lifecycle event for hooks, and cache eviction on every
	// worker (this one included) through the broadcast subject.
	w.event("finalize", l.lane, map[string]any{"session_id": e.SessionID, "session_key": e.SessionKey, "reason": "expired"})
	ferr := w.nc.Publish(w.names.EvictSubject(), []byte(e.SessionKey))
	err := l.mutate(func(e *session.SessionEntry) (*session.SessionEntry, error) {
		if m.seq > e.CommittedSeq {
			e.CommittedSeq = m.seq
		}
		if ferr != nil && e.ExpiryFailures+1 < 3 {
			e.ExpiryFailures++
			return e, nil
		}
		e.ExpiryFinalized = true
		e.ExpiryFailures = 0
		return e, nil
	}, true)
	if err != nil {
		return false
	}
	l.ackUpTo(l.entry.CommittedSeq)
	return true
}
