package worker

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

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
	// The lead is tried for (and renewed) often enough that a dead
	// leader's successor follows expiries within about one liveness TTL:
	// the watcher lease is bound to the leader's liveness lease.
	tick := time.NewTicker(min(w.cfg.LeaseTTL/3, w.cfg.LivenessTTL/2))
	defer tick.Stop()
	var lease *kv.Lease
	var lastSweep, lastPrune time.Time
	var lead context.Context
	var endLead context.CancelFunc
	var wg sync.WaitGroup
	busy := make(chan struct{}, 1) // one sweep or prune at a time
	ctx := w.hardCtx
	defer w.observeBacklog()()
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
			if err := w.leases.Release(context.Background(), lease); err != nil {
				w.log.Warn("release the watcher lease", slog.Any("error", err))
			}
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
			live := w.live.epoch.Load()
			if !w.live.fresh(live) {
				continue
			}
			l, err := w.leases.AcquireBound(ctx, key, w.owner, live)
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
			wg.Add(1)
			go func(lead context.Context) {
				defer wg.Done()
				w.backlogLoop(lead)
			}(lead)
		} else if err := w.leases.Renew(ctx, lease); err != nil {
			w.log.Info("expiry watcher: lost the lead", slog.Any("error", err))
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
					w.log.Warn("sweep", slog.Any("error", err))
				case n > 0:
					w.log.Info("sweep woke lanes", slog.Int("count", n))
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
					w.log.Warn("prune", slog.Any("error", err))
				case n > 0:
					w.log.Info("pruned old sessions", slog.Int("count", n))
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
			w.log.Warn("lease expiries", slog.Any("error", err))
		}
		select {
		case <-lead.Done():
		case <-time.After(time.Second):
		}
	}
}
