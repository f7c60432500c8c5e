package worker

import (
	"errors"
	"log/slog"
	"time"

	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
)

// lane runs the lane protocol for one lane on this worker: the runner
// goroutine (run) takes the lane's lease, then runs its steps (step.go) one
// at a time through the step units (turn.go, commands.go, internal.go,
// recover.go) and settles each outcome (settle) until it releases or loses
// the lane. Everything durable goes through the embedded owner layer
// (owner.go).
//
// Goroutines: the fields below belong to the runner goroutine alone. The
// agent goroutine of a running turn (runAgent) touches only what its
// emitter was given and the owner's append/publish, which are safe for it
// (see owner).
type lane struct {
	*owner

	// turnStarted is when the running turn started (its duration metric).
	turnStarted time.Time
	// prompt is the last context prompt built (see contextPrompt).
	prompt promptMemo
	// msgids are the platform message id claims of the step being run.
	msgids msgidClaims
	// holdsGate is set while the lane runs a last-attempt turn that took
	// its place in the worker's turn gate before it was recorded (see
	// turnGate).
	holdsGate bool
	// autoCheck asks the runner, once it has nothing to do, whether the
	// lane is due an automatic resume (set when the lane is taken and when
	// an admin command marked it resume_pending).
	autoCheck bool
	// failures counts the steps that failed in a row (see settle).
	failures int
	// retrying is the turn in flight that this owner itself left behind
	// after a failed write and retries in place (see settle): its attempt
	// was not interrupted by a crash, so recovering it is not counted (see
	// interruptedCount) until the retries outlast the store retry budget.
	retrying inPlaceRetry
}

// inPlaceRetry names the attempt of a turn a live owner retries in place
// after a failed write, and since when the turn has been retried so.
type inPlaceRetry struct {
	turnID  string
	attempt int
	epoch   uint64
	since   time.Time
}

func newLane(w *Worker, laneTok string) *lane {
	return &lane{owner: newOwner(w, laneTok)}
}

// run is the runner goroutine of a lane.
func (l *lane) run() {
	defer func() {
		left := l.w.laneExit(l)
		committed := uint64(0)
		in := l.inbox()
		if l.entry != nil && l.entry.InboxID == in.ID {
			committed = l.entry.CommittedSeq
		}
		for _, m := range left {
			if streamOf(m) != in.Name {
				_ = m.NakWithDelay(time.Second) // its seq counts in another stream
			} else if seqOf(m) <= committed {
				_ = m.Ack()
			} else if d := l.handBackDelay(); d > 0 {
				_ = m.NakWithDelay(d) // the lease could not be deleted
			} else {
				_ = m.Nak()
			}
		}
	}()
	ctx := l.w.hardCtx
	entry, rev, err := l.w.store.Get(ctx, l.lane)
	switch {
	case errors.Is(err, kv.ErrNotFound):
	case err != nil:
		l.log.Warn("read entry", slog.Any("error", err))
		l.nakHeld(time.Second)
		return
	default:
		l.entry, l.rev = entry, rev
	}
	// Wake-up step 1: deliveries whose effects are already durable.
	if l.entry != nil && l.entry.InboxID == l.inbox().ID {
		if !l.ackUpTo(l.entry.CommittedSeq) && l.entry.Turn == nil {
			if l.entry.Owner == "" || !l.w.draining() {
				// Nothing newer was handed to us. A sweep may still need
				// us if the lane has unprocessed messages: check below.
				if next, err := l.peek(ctx, l.entry.CommittedSeq+1); err != nil || next == nil {
					return
				}
			}
		}
	}
	vanished := 0
	for {
		if l.w.draining() {
			l.nakHeld(0)
			return
		}
		if l.w.inboxes.ForLane(l.lane).Stale() {
			// The lane's inbox stream is being recreated: its new
			// incarnation's deliveries take the lane once the worker
			// has it.
			l.nakHeld(time.Second)
			return
		}
		live := l.w.live.epoch.Load()
		if !l.w.live.fresh(live) {
			// No liveness lease to bind a lane lease to (yet, or lost):
			// leave the lane to others for now.
			l.log.Debug("no fresh liveness lease: lane handed back")
			l.nakHeld(time.Second)
			return
		}
		lease, err := l.w.acquireLease(ctx, l.lane, l.w.owner, live)
		var held *kv.HeldError
		if errors.As(err, &held) && held.Owner == "" && vanished < maxLeaseVanished {
			// The lease was there when the create was refused and gone
			// when it was read: released (a drain, the end of a linger)
			// or run out in between, which a rolling restart makes
			// common. AcquireBound tries again itself; this error means
			// the key kept coming and going through all its attempts.
			// The lane may well be free: try again now, rather than hand
			// the deliveries back for a whole lease TTL (the retry delay
			// of a holder whose expiry is unknown).
			vanished++
			continue
		}
		if errors.As(err, &held) && l.reclaimKept(held) {
			// This worker's own lease, which its release could not
			// delete: deleted now, take the lane.
			continue
		}
		if errors.As(err, &held) {
			// Wake-up step 2: another worker owns the lane.
			l.log.Debug("lane held elsewhere", slog.String("holder", held.Owner), slog.Uint64("rev", held.Rev))
			l.w.stats.HeldElsewhere.Add(1)
			l.w.heldElsewhere.Store(l.lane, heldInfo{until: time.Now().Add(heldElsewhereFor), owner: held.Owner})
			delay := time.Duration(-1)
			if l.entry != nil && l.entry.Turn != nil {
				// A turn in flight under someone else's lease: if that
				// owner died, the lane is ours to resume when the lease
				// runs out. Come back just after that, not a whole TTL on.
				delay = heldRetryDelay(held.Expires, l.w.cfg.LeaseTTL)
			}
			// The holder was alive a moment ago (AcquireBound takes over
			// the lease of an owner whose liveness lease is gone) and
			// reads the lane itself: the deliveries go to it (forward.go),
			// or, when that cannot be done, back to the consumer.
			l.forwardHeld(held.Owner, delay)
			return
		}
		if err != nil {
			l.log.Warn("acquire lease", slog.Any("error", err))
			l.nakHeld(time.Second)
			return
		}
		if lease.TookOver {
			l.w.stats.DeadOwnerTakeovers.Add(1)
			l.log.Info("lane taken over from an owner whose liveness lease is gone", slog.Uint64("epoch", lease.Epoch))
		}
		vanished = 0
		again := l.own(lease)
		if !again {
			return
		}
	}
}

// own runs the lane as its owner until it releases the lease (returning true
// when new work appeared right after the release) or loses it.
func (l *lane) own(lease *kv.Lease) bool {
	w := l.w
	end, err := l.begin(lease)
	defer end()
	if err != nil {
		l.log.Warn("take ownership", slog.Any("error", err))
		l.giveUp()
		return false
	}

	// A lane taken with a turn in flight resumes that turn (the previous
	// owner died, or, after a failed step, see settle, this one could
	// not finish it); one taken without may be due an automatic resume (see
	// autoResumeDue).
	l.autoCheck = l.entry.Turn == nil
	if !l.recoverAll(true) {
		return false
	}

	lingerUntil := time.Now().Add(w.cfg.Linger)
	for {
		if l.ended() != keepOwning {
			return false
		}
		st, err := l.nextStep(l.ctx)
		if err != nil {
			if l.ctx.Err() != nil {
				continue
			}
			if l.moved() {
				// The bound stream may be gone (a migration moved the
				// partition and removed the stream): hand the lane over to
				// its new stream.
				return l.releaseAndRecheck()
			}
			l.log.Warn("peek", slog.Any("error", err))
			l.wait(time.Second)
			continue
		}
		if st == nil && l.autoCheck {
			l.autoCheck = false
			if l.autoResumeDue() {
				if err := l.publishAutoResume(); err != nil {
					l.log.Warn("publish automatic resume", slog.Any("error", err))
				}
				continue
			}
		}
		if st != nil {
			if st.kind == session.KindCommand && st.msgs[0].body.Command == session.CmdResumePending {
				l.autoCheck = true
			}
			l.lastWriteErr = nil
			err := l.runStep(st)
			if l.settle(st, err) != keepOwning {
				return false
			}
			if err != nil {
				// A drain timeout, a lost lease or a failed write, and
				// the lane kept: whatever of the step was recorded is
				// recovered first.
				if !l.recoverAll(false) {
					return false
				}
			}
			lingerUntil = time.Now().Add(w.cfg.Linger)
			continue
		}
		remaining := time.Until(lingerUntil)
		if remaining <= 0 || l.moved() {
			return l.releaseAndRecheck()
		}
		if remaining > w.cfg.PeekInterval {
			remaining = w.cfg.PeekInterval
		}
		l.wait(remaining)
	}
}

// recoverAll recovers the turn in flight, if any, until none is: a lane
// taken with one (the previous owner died) or left with one by a failed
// step resumes it first. reset starts the failures in a row again when
// it succeeds. It reports false when the ownership ended.
func (l *lane) recoverAll(reset bool) bool {
	for l.entry.Turn != nil {
		err := l.recoverTurn()
		if err == nil {
			if reset {
				l.failures = 0
			}
			return true
		}
		if in := l.in.Load(); in != nil && in.Stale() && l.ctx.Err() == nil && !l.w.draining() {
			// The stream the ownership reads was deleted (and maybe made
			// again) under the turn: no retry here can read it. The lane
			// is released with its turn record, and its next owner, on
			// the new incarnation, ends the turn (endGoneTurn).
			l.log.Warn("recover turn: the lane's inbox stream is gone; lane released", slog.Any("error", err))
			l.release()
			return false
		}
		if l.settle(nil, err) != keepOwning {
			return false
		}
	}
	return true
}

// wait blocks until a hint, a delivery, a drain, the lane's end or d.
func (l *lane) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-l.hints:
		return true
	case <-l.signal:
		return true
	case <-l.w.drainCh:
		return true
	case <-l.w.inboxes.Changed():
		return true // the lane's partition may have moved (see moved)
	case <-l.ctx.Done():
		return false
	case <-t.C:
		l.blind.Store(true)
		return true
	}
}

// heldRetryDelay is how long to hand a delivery back for when its lane's
// lease, held by another worker, runs out at expires: a little past that
// moment, within [250ms, ttl].
func heldRetryDelay(expires time.Time, ttl time.Duration) time.Duration {
	const slack = 250 * time.Millisecond
	if expires.IsZero() {
		return ttl
	}
	d := time.Until(expires) + slack
	return min(max(d, slack), ttl)
}

// maxLeaseVanished bounds the immediate retries of a lease acquisition
// that found the lease gone by the time it read it (see run).
const maxLeaseVanished = 3

// heldElsewhereFor is how long a worker trusts that another worker holds a
// lane after the lease said so: its deliveries meanwhile are forwarded to
// that worker without a look at the lease (see forward.go).
const heldElsewhereFor = 2 * time.Second
