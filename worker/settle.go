package worker

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
)

// Backoff of a lane whose step failed a durable write while its lease is
// still good: the owner keeps the lane and tries again in place, waiting
// longer each time, rather than handing it to another worker at once (which
// made a write that keeps failing cycle the lease, and its epoch, dozens of
// times a second).
const (
	stepRetryMin = 250 * time.Millisecond
	stepRetryMax = 30 * time.Second
)

// stepRetryDelay is the wait before in-place attempt n (1, 2, ...).
func stepRetryDelay(n int) time.Duration {
	d := stepRetryMin
	for i := 1; i < n && d < stepRetryMax; i++ {
		d *= 2
	}
	return min(d, stepRetryMax)
}

// noticeUnrecordable tells the user a message was dropped because no retry
// could store what its turn needs.
const noticeUnrecordable = "⚠️ Sorry, I could not process that message: it is too large to be stored. Please send a shorter one."

// outcome is what the owner does after a step: keep owning the lane, or
// end the ownership by giving it up (nothing written: the lease was lost or
// the worker stops hard) or by releasing it (a drain).
type outcome int

const (
	keepOwning outcome = iota
	gaveUp
	released
)

func (o outcome) String() string {
	switch o {
	case keepOwning:
		return "keep"
	case gaveUp:
		return "give up"
	case released:
		return "release"
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// failed is the error of a step that did not complete: err when the
// failure had one, else the cause that ended the ownership, else the last
// failed durable write.
func (l *lane) failed(err error) error {
	if err == nil {
		err = context.Cause(l.ctx)
	}
	if err == nil {
		err = l.lastWriteErr
	}
	if err == nil {
		return errStepFailed
	}
	return fmt.Errorf("%w: %w", errStepFailed, err)
}

// ended ends the ownership when it is over whatever the last step did: a
// cancelled ownership (a lost lease, a hard stop) is given up, a drain
// releases the lane. It reports keepOwning when neither happened.
func (l *lane) ended() outcome {
	if l.ctx.Err() != nil {
		l.giveUp()
		return gaveUp
	}
	if l.w.draining() {
		// A drain cut it: the turn record (if any) stays; hand the lane
		// over at once.
		l.release()
		return released
	}
	return keepOwning
}

// settle is the one place where the outcome of a step (st) or of a
// recovery (st nil) is decided and carried out, from the error its handler
// returned:
//   - nil: keep owning (the failures in a row start again), unless the
//     ownership is over anyway (see ended);
//   - the lease could have expired or the ownership was cancelled: give up;
//   - a drain: release;
//   - otherwise (a failed write while the lease is good) keep the lane and
//     retry in place after a growing delay, still renewing, rather than
//     hand it to another worker at once (which made a write that keeps
//     failing cycle the lease, and its epoch, dozens of times a second).
//     A step whose writes are refused for good (too large for the store) is
//     dead-lettered with a notice instead of being retried for ever.
//
// After keepOwning the caller runs the lane again from its entry.
func (l *lane) settle(st *step, err error) outcome {
	if err == nil {
		if o := l.ended(); o != keepOwning {
			return o
		}
		l.failures = 0
		return keepOwning
	}
	if l.checkAlive() != nil {
		// The lease is lost or could have expired (checkAlive waits for
		// a late or rebound liveness lease).
		l.giveUp()
		return gaveUp
	}
	if o := l.ended(); o != keepOwning {
		return o
	}
	cause := l.lastWriteErr
	l.lastWriteErr = nil
	if st != nil && tooLarge(cause) && (l.entry == nil || l.entry.Turn == nil) {
		// Nothing of the step is recorded and no retry can record it.
		if derr := l.dropUnrecordable(st, cause); derr == nil {
			l.failures = 0
			return keepOwning
		} else {
			l.log.Warn("dead-letter an unrecordable step", slog.Any("error", derr))
		}
	}
	l.failures++
	l.noteInPlaceRetry()
	d := stepRetryDelay(l.failures)
	l.log.Warn("lane step failed; retrying in place", slog.Int("failures", l.failures), slog.Duration("retry_in", d), slog.Any("error", err))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-l.w.drainCh:
	case <-l.ctx.Done():
	}
	if l.checkAlive() != nil {
		// The lease is lost or could have expired (checkAlive waits for
		// a late or rebound liveness lease).
		l.giveUp()
		return gaveUp
	}
	return l.ended()
}

// noteInPlaceRetry remembers the turn in flight that this owner, alive,
// retries in place after a failed step: the attempt it recorded ended by a
// failed write, not by a crash, so its recovery is not an interruption.
// The first failure of a turn starts its retry budget.
func (l *lane) noteInPlaceRetry() {
	t := l.entry.Turn
	if t == nil || t.Owner != l.w.owner || t.Epoch != l.lease.Epoch {
		// No turn of ours in flight (a step failed before its intent was
		// recorded): the next attempt starts from the inbox.
		return
	}
	since := l.retrying.since
	if l.retrying.turnID != t.ID || since.IsZero() {
		since = time.Now()
	}
	l.retrying = inPlaceRetry{turnID: t.ID, attempt: t.Attempt, epoch: t.Epoch, since: since}
}

// retriedInPlace reports whether t, found in flight, is the attempt this
// owner left behind after a failed write (see noteInPlaceRetry) within the
// store retry budget. Past the budget a write that keeps failing is
// counted again, so that such a turn ends (dead-lettered with a notice)
// rather than being retried for ever.
func (l *lane) retriedInPlace(t *session.TurnIntent) bool {
	r := l.retrying
	if r.turnID == "" || r.turnID != t.ID || r.attempt != t.Attempt || r.epoch != t.Epoch ||
		t.Owner != l.w.owner || t.Epoch != l.lease.Epoch {
		return false
	}
	if waited := time.Since(r.since); waited > l.w.cfg.StoreRetryBudget {
		l.log.Warn("turn's writes have failed for longer than the store retry budget; counting its attempt as interrupted",
			slog.String("turn", t.ID), slog.Int("attempt", t.Attempt), slog.Duration("failing_for", waited.Round(time.Millisecond)), slog.Duration("budget", l.w.cfg.StoreRetryBudget))
		return false
	}
	return true
}

// dropUnrecordable dead-letters the first message of a step that cannot be
// recorded (the write is larger than the store takes: the turn records the
// source of its first message), tells the user when the lane has a session
// to tell it in, and commits past it. The step's other messages make the
// next turn.
func (l *lane) dropUnrecordable(st *step, cause error) error {
	w := l.w
	reason := fmt.Sprintf("cannot be recorded: %v", cause)
	last := st.msgs[0].seq
	for _, m := range st.msgs[:1] {
		raw, err := l.inbox().Stream.GetMsg(context.WithoutCancel(l.ctx), m.seq)
		if err != nil {
			l.log.Warn("read message to dead-letter", slog.Uint64("seq", m.seq), slog.Any("error", err))
			return l.failed(err)
		}
		dl := nats.NewMsg(w.names.DeadLetterSubject(l.lane))
		dl.Data = raw.Data
		for k, v := range raw.Header {
			if strings.HasPrefix(k, "Fleet-") {
				dl.Header[k] = v
			}
		}
		dl.Header.Set(broker.HdrReason, reason)
		dl.Header.Set(broker.HdrInboxSeq, seqString(m.seq))
		ctx, cancel := context.WithTimeout(context.WithoutCancel(l.ctx), 5*time.Second)
		_, err = w.js.PublishMsg(ctx, dl, jetstream.WithMsgID(fmt.Sprintf("dlq:%s:%d", l.inbox().ID, m.seq)))
		cancel()
		if err != nil {
			l.log.Warn("dead-letter publish", slog.Uint64("seq", m.seq), slog.Any("error", err))
			return l.failed(err)
		}
	}
	if sid := l.entry.SessionID; sid != "" {
		tx, err := l.txFor(sid)
		if err != nil {
			return l.failed(err)
		}
		intent := &session.TurnIntent{ID: fmt.Sprintf("drop:%s:%d", l.inbox().ID, st.msgs[0].seq), SessionID: sid,
			FirstSeq: st.msgs[0].seq, LastSeq: last}
		src := sourceOf(l.entry, nil)
		if err := l.emitNotice(tx, intent, intent.ID+":notice", noticeUnrecordable, src); err != nil {
			return l.failed(err)
		}
	}
	w.stats.DeadLetters.Add(1)
	l.log.Warn("step dead-lettered: it cannot be recorded", slog.Uint64("first_seq", st.msgs[0].seq), slog.Uint64("last_seq", last), slog.Any("error", cause))
	w.event("deadletter", l.lane, map[string]any{"first_seq": st.msgs[0].seq, "last_seq": last, "reason": reason})
	return l.commit(last)
}
