package worker

import (
	"context"
	"fmt"
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

// retryInPlace is what the owner does after a step or a recovery failed
// while it still holds the lease: unless a drain or a lost lease ends the
// ownership (then it returns false, having released or given up), it waits
// out a growing delay, still renewing, and reports true so the caller runs
// the lane again from its entry. A step whose writes are refused for good
// (too large for the store) is dead-lettered with a notice instead of being
// retried for ever.
func (l *lane) retryInPlace(st *step) bool {
	w := l.w
	if !l.alive() || l.ctx.Err() != nil {
		l.giveUp()
		return false
	}
	if w.draining() {
		// A drain cut it: the turn record (if any) stays; hand the lane
		// over at once.
		l.release()
		return false
	}
	cause := l.lastWriteErr
	l.lastWriteErr = nil
	if st != nil && tooLarge(cause) && (l.entry == nil || l.entry.Turn == nil) {
		// Nothing of the step is recorded and no retry can record it.
		if l.dropUnrecordable(st, cause) {
			l.failures = 0
			return true
		}
	}
	l.failures++
	d := stepRetryDelay(l.failures)
	l.log.Warn("lane step failed; retrying in place", "failures", l.failures, "retry_in", d, "err", cause)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-w.drainCh:
	case <-l.ctx.Done():
	}
	if !l.alive() || l.ctx.Err() != nil {
		l.giveUp()
		return false
	}
	if w.draining() {
		l.release()
		return false
	}
	return true
}

// dropUnrecordable dead-letters the first message of a step that cannot be
// recorded (the write is larger than the store takes: the turn records the
// source of its first message), tells the user when the lane has a session
// to tell it in, and commits past it. The step's other messages make the
// next turn.
func (l *lane) dropUnrecordable(st *step, cause error) bool {
	w := l.w
	reason := fmt.Sprintf("cannot be recorded: %v", cause)
	last := st.msgs[0].seq
	for _, m := range st.msgs[:1] {
		raw, err := w.res.Inbox.GetMsg(context.WithoutCancel(l.ctx), m.seq)
		if err != nil {
			l.log.Warn("read message to dead-letter", "seq", m.seq, "err", err)
			return false
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
		_, err = w.js.PublishMsg(ctx, dl, jetstream.WithMsgID(fmt.Sprintf("dlq:%s:%d", w.res.InboxID, m.seq)))
		cancel()
		if err != nil {
			l.log.Warn("dead-letter publish", "seq", m.seq, "err", err)
			return false
		}
	}
	if sid := l.entry.SessionID; sid != "" {
		tx, err := l.txFor(sid)
		if err != nil {
			return false
		}
		intent := &session.TurnIntent{ID: fmt.Sprintf("drop:%s:%d", w.res.InboxID, st.msgs[0].seq), SessionID: sid,
			FirstSeq: st.msgs[0].seq, LastSeq: last}
		src := sourceOf(l.entry, nil)
		if err := l.emitNotice(tx, intent, intent.ID+":notice", noticeUnrecordable, src); err != nil {
			return false
		}
	}
	w.stats.DeadLetters.Add(1)
	l.log.Warn("step dead-lettered: it cannot be recorded", "first_seq", st.msgs[0].seq, "last_seq", last, "err", cause)
	w.event("deadletter", l.lane, map[string]any{"first_seq": st.msgs[0].seq, "last_seq": last, "reason": reason})
	return l.commit(last) == nil
}
