package session_test

import (
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 6, 16, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) *time.Time { t := now.Add(-d); return &t }
	policy := session.ResetPolicy{Mode: session.ResetIdle, IdleMinutes: 60}
	const freshness = time.Hour
	const old = "20260616_090000_aaaaaaaa"
	const minted = "20260616_120000_bbbbbbbb"

	entry := func(mut func(*session.SessionEntry)) *session.SessionEntry {
		e := &session.SessionEntry{SessionKey: "k", SessionID: old, CreatedAt: now.Add(-3 * time.Hour), UpdatedAt: now.Add(-10 * time.Minute)}
		if mut != nil {
			mut(e)
		}
		return e
	}
	idleEntry := func(mut func(*session.SessionEntry)) *session.SessionEntry {
		return entry(func(e *session.SessionEntry) {
			e.UpdatedAt = now.Add(-2 * time.Hour)
			if mut != nil {
				mut(e)
			}
		})
	}
	keep := session.Decision{SessionID: old}
	tests := []struct {
		name      string
		entry     *session.SessionEntry
		policy    session.ResetPolicy
		freshness time.Duration
		want      session.Decision
	}{
		{name: "no entry", entry: nil, want: session.Decision{SessionID: minted, Reset: true}},
		{name: "entry without session id", entry: entry(func(e *session.SessionEntry) { e.SessionID = "" }), want: session.Decision{SessionID: minted, Reset: true}},
		{name: "active session is kept", entry: entry(nil), want: keep},
		{
			name: "suspended", entry: entry(func(e *session.SessionEntry) { e.Suspended = true }),
			want: session.Decision{SessionID: minted, Reset: true, Reason: "suspended", PreviousSessionID: old},
		},
		{
			name: "suspended beats fresh resume_pending",
			entry: entry(func(e *session.SessionEntry) {
				e.Suspended, e.ResumePending, e.LastResumeMarkedAt = true, true, ago(time.Minute)
			}),
			want: session.Decision{SessionID: minted, Reset: true, Reason: "suspended", PreviousSessionID: old},
		},
		{
			name: "suspended beats a turn in flight",
			entry: entry(func(e *session.SessionEntry) {
				e.Suspended, e.Turn = true, &session.TurnIntent{ID: "t"}
			}),
			want: session.Decision{SessionID: minted, Reset: true, Reason: "suspended", PreviousSessionID: old},
		},
		{
			name:  "fresh resume_pending beats the policy",
			entry: idleEntry(func(e *session.SessionEntry) { e.ResumePending, e.LastResumeMarkedAt = true, ago(time.Minute) }),
			want:  session.Decision{SessionID: old, KeptForResume: true},
		},
		{
			name:  "resume_pending without marker counts as fresh",
			entry: idleEntry(func(e *session.SessionEntry) { e.ResumePending = true }),
			want:  session.Decision{SessionID: old, KeptForResume: true},
		},
		{
			name:  "resume_pending marked exactly freshness ago is fresh",
			entry: idleEntry(func(e *session.SessionEntry) { e.ResumePending, e.LastResumeMarkedAt = true, ago(freshness) }),
			want:  session.Decision{SessionID: old, KeptForResume: true},
		},
		{
			name: "stale resume_pending falls through to the policy",
			entry: idleEntry(func(e *session.SessionEntry) {
				e.ResumePending, e.LastResumeMarkedAt = true, ago(freshness+time.Second)
			}),
			want: session.Decision{SessionID: minted, Reset: true, Reason: "idle", PreviousSessionID: old},
		},
		{
			name:  "stale resume_pending with no policy trigger keeps the session for the resume",
			entry: entry(func(e *session.SessionEntry) { e.ResumePending, e.LastResumeMarkedAt = true, ago(2*time.Hour) }),
			want:  session.Decision{SessionID: old, KeptForResume: true},
		},
		{
			name:   "stale resume_pending under policy none keeps the session for the resume",
			entry:  idleEntry(func(e *session.SessionEntry) { e.ResumePending, e.LastResumeMarkedAt = true, ago(2*time.Hour) }),
			policy: session.ResetPolicy{Mode: session.ResetNone},
			want:   session.Decision{SessionID: old, KeptForResume: true},
		},
		{
			name: "stale resume_pending at the daily boundary resets",
			entry: entry(func(e *session.SessionEntry) {
				e.UpdatedAt = time.Date(2026, 6, 16, 3, 0, 0, 0, time.UTC)
				e.ResumePending, e.LastResumeMarkedAt = true, ago(2*time.Hour)
			}),
			policy: session.ResetPolicy{Mode: session.ResetDaily, AtHour: 4},
			want:   session.Decision{SessionID: minted, Reset: true, Reason: "daily", PreviousSessionID: old},
		},
		{
			name:      "zero freshness means the default hour",
			entry:     idleEntry(func(e *session.SessionEntry) { e.ResumePending, e.LastResumeMarkedAt = true, ago(59*time.Minute) }),
			freshness: -1, // replaced below by 0
			want:      session.Decision{SessionID: old, KeptForResume: true},
		},
		{
			name:  "marker in the future is fresh",
			entry: idleEntry(func(e *session.SessionEntry) { e.ResumePending, e.LastResumeMarkedAt = true, ago(-time.Minute) }),
			want:  session.Decision{SessionID: old, KeptForResume: true},
		},
		{
			name:  "idle policy",
			entry: idleEntry(nil),
			want:  session.Decision{SessionID: minted, Reset: true, Reason: "idle", PreviousSessionID: old},
		},
		{
			name:   "daily policy",
			entry:  entry(func(e *session.SessionEntry) { e.UpdatedAt = time.Date(2026, 6, 16, 3, 0, 0, 0, time.UTC) }),
			policy: session.ResetPolicy{Mode: session.ResetDaily, AtHour: 4},
			want:   session.Decision{SessionID: minted, Reset: true, Reason: "daily", PreviousSessionID: old},
		},
		{
			name:   "none policy keeps an old session",
			entry:  idleEntry(nil),
			policy: session.ResetPolicy{Mode: session.ResetNone},
			want:   keep,
		},
		{
			name:  "turn in flight never expires",
			entry: idleEntry(func(e *session.SessionEntry) { e.Turn = &session.TurnIntent{ID: "t", SessionID: old} }),
			want:  keep,
		},
		{
			name:  "other flags do not matter",
			entry: entry(func(e *session.SessionEntry) { e.WasAutoReset, e.IsFreshReset, e.ExpiryFinalized = true, true, true }),
			want:  keep,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := tt.policy
			if p.Mode == "" {
				p = policy
			}
			f := tt.freshness
			switch f {
			case 0:
				f = freshness
			case -1:
				f = 0
			}
			calls := 0
			newID := func() string { calls++; return minted }
			got := session.Decide(tt.entry, p, now, time.UTC, f, newID)
			if got != tt.want {
				t.Errorf("Decide() = %+v, want %+v", got, tt.want)
			}
			if wantCalls := map[bool]int{true: 1, false: 0}[tt.want.Reset]; calls != wantCalls {
				t.Errorf("newID called %d times, want %d", calls, wantCalls)
			}
		})
	}
}

func TestDecideDefaultIDs(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 6, 16, 12, 0, 0, 0, time.UTC)
	d := session.Decide(nil, session.DefaultResetPolicy(), now, time.UTC, 0, nil)
	if !d.Reset || !session.ValidSessionID(d.SessionID) || d.SessionID[:15] != "20260616_120000" {
		t.Errorf("Decide(nil, newID nil) = %+v, want a new session id minted at now", d)
	}
}
