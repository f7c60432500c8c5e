package worker

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/agentfleet/agentfleet/session"
)

// autoResumeDue reports whether the lane is due an automatic turn: its
// session is resume_pending for a reason in the automatic set, the marker is
// fresh and has not had its automatic turn yet, the session has an origin
// to answer to, is not suspended, and no turn is in flight.
func (l *lane) autoResumeDue() bool {
	return autoResumeDue(l.entry, l.w.cfg.Now(), l.w.cfg.Freshness)
}

// autoResumeDue is lane.autoResumeDue for an entry at now.
func autoResumeDue(e *session.SessionEntry, now time.Time, freshness time.Duration) bool {
	if e == nil || e.Turn != nil || e.Suspended || !e.ResumePending || e.SessionID == "" || e.Origin == nil ||
		!autoResumeReason(e.ResumeReason) || !session.ResumeFresh(e.LastResumeMarkedAt, now, freshness) {
		return false
	}
	return e.AutoResumedAt == nil || e.LastResumeMarkedAt == nil || !e.AutoResumedAt.Equal(*e.LastResumeMarkedAt)
}

// publishAutoResume puts the internal event of an automatic resume into the
// lane's inbox, so that it takes its place in order. Its Msg-Id names the
// marker: one marker, one event.
func (l *lane) publishAutoResume() error {
	e := l.entry
	marker := int64(0)
	if e.LastResumeMarkedAt != nil {
		marker = e.LastResumeMarkedAt.UnixNano()
	}
	id := fmt.Sprintf("resume:%s:%s:%d", l.lane, e.SessionID, marker)
	l.log.Info("resume pending with no turn in flight: automatic resume", slog.String("session", e.SessionID), slog.String("reason", e.ResumeReason))
	return l.w.publishInternal(context.WithoutCancel(l.ctx), l.lane, e.SessionKey, session.CmdAutoResume, e.SessionID, id)
}

// runAutoResume runs the automatic turn of a resume_pending session: an
// event with empty text, answered in the session with the resume note. It
// only commits past the event when the lane is no longer due one (a message
// already continued the session, or it was reset).
func (l *lane) runAutoResume(m inboxMsg) error {
	if !l.autoResumeDue() || m.body.Args != l.entry.SessionID {
		return l.commit(m.seq)
	}
	st := &step{kind: session.KindInternal, msgs: []inboxMsg{m}}
	if l.startTurnTrace(st.msgs, "") {
		defer l.endTurnTrace()
	}
	intent, err := l.recordIntent(st)
	if err != nil {
		l.log.Warn("record intent", slog.Any("error", err))
		return l.failed(err)
	}
	l.w.event("resume", l.lane, map[string]any{"turn_id": intent.ID, "session_id": intent.SessionID, "attempt": intent.Attempt,
		"reason": l.entry.ResumeReason, "automatic": true})
	l.w.cfg.Metrics.TurnResumed(context.Background())
	return l.execute(intent, st.msgs, false)
}

// runInternal applies an internal command as the lane's owner.
func (l *lane) runInternal(m inboxMsg) error {
	if m.body.Command == session.CmdAutoResume {
		return l.runAutoResume(m)
	}
	if m.body.Command != session.CmdExpire {
		return l.commit(m.seq)
	}
	w := l.w
	e := l.entry
	policy := w.cfg.Reset.PolicyFor(e.Platform, e.ChatType)
	expired := e.SessionID == m.body.Args && !e.ExpiryFinalized && e.Turn == nil &&
		session.ShouldReset(e, policy, w.cfg.Now(), w.cfg.Location, false) != ""
	if !expired {
		return l.commit(m.seq)
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
		return l.failed(err)
	}
	l.ackUpTo(l.entry.CommittedSeq)
	return nil
}
