package session

import "time"

// DefaultResumeFreshness is how long a resume_pending marker keeps a session
// alive against the reset policy (agent.gateway_auto_continue_freshness).
const DefaultResumeFreshness = time.Hour

// Decision is the outcome of get_or_create for one turn: which session the
// turn writes to, and why a new one was started. The worker records it in
// the turn's intent and reuses it verbatim on recovery.
type Decision struct {
	// SessionID is the session the turn writes to: the entry's, or a new one.
	SessionID string
	// Reset is true when SessionID is new (also for a lane's first session).
	Reset bool
	// Reason is why an existing session was replaced: ReasonSuspended,
	// ReasonIdle or ReasonDaily; empty for a lane's first session and when
	// the session is kept.
	Reason string
	// KeptForResume is true when the session was kept because of a fresh
	// resume_pending marker (the turn gets the restart-resume note).
	KeptForResume bool
	// PreviousSessionID is the session a reset switched away from, if any.
	PreviousSessionID string
}

// Decide takes the get_or_create decision of seeds/session-lifecycle.md §2
// for entry at now, in priority order:
//
//  1. no entry, or one without a session id: a new session (Reset, no reason);
//  2. suspended: a new session, reason "suspended", whatever else is set;
//  3. resume_pending while fresh (last_resume_marked_at no more than
//     freshness before now; a missing marker counts as fresh): keep the
//     session, KeptForResume; a stale marker falls through to the policy;
//  4. ShouldReset says idle or daily: a new session with that reason (a
//     lane whose entry records a turn in flight never resets);
//  5. otherwise keep the session; KeptForResume when a stale
//     resume_pending marker is still set (the policy did not reset it, so
//     this turn continues the interrupted work, with the resume note).
//
// A freshness of zero or less means DefaultResumeFreshness. newID mints
// session ids; nil means NewSessionID(now).
func Decide(entry *SessionEntry, policy ResetPolicy, now time.Time, loc *time.Location, freshness time.Duration, newID func() string) Decision {
	if newID == nil {
		newID = func() string { return NewSessionID(now) }
	}
	if entry == nil || entry.SessionID == "" {
		return Decision{SessionID: newID(), Reset: true}
	}
	if entry.Suspended {
		return Decision{SessionID: newID(), Reset: true, Reason: ReasonSuspended, PreviousSessionID: entry.SessionID}
	}
	if entry.ResumePending && ResumeFresh(entry.LastResumeMarkedAt, now, freshness) {
		return Decision{SessionID: entry.SessionID, KeptForResume: true}
	}
	if reason := ShouldReset(entry, policy, now, loc, entry.Turn != nil); reason != "" {
		return Decision{SessionID: newID(), Reset: true, Reason: reason, PreviousSessionID: entry.SessionID}
	}
	// A stale marker the policy did not reset: the interrupted work is
	// still pending in this session, and this turn continues it.
	return Decision{SessionID: entry.SessionID, KeptForResume: entry.ResumePending}
}

// ResumeFresh reports whether a resume marker set at markedAt is still within
// the freshness window at now (a nil marker counts as fresh; a freshness of
// zero or less means DefaultResumeFreshness).
func ResumeFresh(markedAt *time.Time, now time.Time, freshness time.Duration) bool {
	if markedAt == nil {
		return true
	}
	if freshness <= 0 {
		freshness = DefaultResumeFreshness
	}
	return !now.After(markedAt.Add(freshness))
}
