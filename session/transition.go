package session

import "time"

// MaxRecentSessions bounds SessionEntry.RecentSessions.
const MaxRecentSessions = 20

// Reasons a lane starts a new session, beyond the automatic ones.
const (
	ReasonNew    = "new"    // explicit /new
	ReasonReset  = "reset"  // explicit /reset
	ReasonResume = "resume" // /resume switched to another session
	ReasonFresh  = "fresh"  // the lane's first session
	ReasonFork   = "fork"   // /resume of another lane's session, forked into this lane
)

// StartSession moves the entry to a new session id, as the seed's reset
// effects describe: token counters start from zero, the one-shot flags are
// set for the reason (was_auto_reset for idle, daily and suspended;
// is_fresh_reset for /new and /reset), and the recovery flags are cleared.
// The fleet fields that belong to the lane (owner, epoch, inbox position,
// busy mode) are kept. A suspended reset links the old session as parent.
func (e *SessionEntry) StartSession(id, reason string, now time.Time) {
	old := e.SessionID
	if old != "" && old != id {
		recent := []string{old}
		for _, s := range e.RecentSessions {
			if s != old && s != id && len(recent) < MaxRecentSessions {
				recent = append(recent, s)
			}
		}
		e.RecentSessions = recent
	}
	hadActivity := e.TotalTokens > 0
	e.SessionID = id
	e.CreatedAt = now
	e.UpdatedAt = now
	e.InputTokens, e.OutputTokens, e.CacheReadTokens, e.CacheWriteTokens = 0, 0, 0, 0
	e.TotalTokens, e.LastPromptTokens = 0, 0
	e.EstimatedCostUSD = 0
	e.CostStatus = "unknown"
	e.WasAutoReset = false
	e.AutoResetReason = ""
	e.IsFreshReset = false
	e.ResetHadActivity = false
	switch reason {
	case ReasonIdle, ReasonDaily, ReasonSuspended:
		e.WasAutoReset = true
		e.AutoResetReason = reason
		e.ResetHadActivity = hadActivity
	case ReasonNew, ReasonReset:
		e.IsFreshReset = true
	}
	e.ParentSessionID = ""
	if old != "" && old != id && (reason == ReasonSuspended || reason == ReasonNew || reason == ReasonReset || reason == ReasonIdle || reason == ReasonDaily) {
		e.ParentSessionID = old
	}
	e.Suspended = false
	e.ResumePending = false
	e.ResumeReason = ""
	e.LastResumeMarkedAt = nil
	e.ExpiryFinalized = false
	e.ExpiryFailures = 0
	e.InterruptedTurns = 0
}

// MarkResumePending sets the soft recovery marker unless the entry is
// suspended (a hard wipe always wins). It reports whether it changed anything.
func (e *SessionEntry) MarkResumePending(reason string, now time.Time) bool {
	if e.Suspended {
		return false
	}
	// Marking again refreshes the marker's time: the freshness window runs
	// from the latest interruption.
	if e.ResumePending && e.ResumeReason == reason && e.LastResumeMarkedAt != nil && e.LastResumeMarkedAt.Equal(now) {
		return false
	}
	e.ResumePending = true
	e.ResumeReason = reason
	t := now
	e.LastResumeMarkedAt = &t
	return true
}

// ClearResumePending clears the soft recovery marker.
func (e *SessionEntry) ClearResumePending() bool {
	if !e.ResumePending && e.ResumeReason == "" && e.LastResumeMarkedAt == nil {
		return false
	}
	e.ResumePending = false
	e.ResumeReason = ""
	e.LastResumeMarkedAt = nil
	return true
}
