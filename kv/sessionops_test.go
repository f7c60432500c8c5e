package kv_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
)

// TestGetOrCreateSession walks the priority order of seeds/session-lifecycle.md
// §2 (suspended → new; fresh resume_pending → keep; policy → new; else keep
// and bump updated_at) plus forceNew and the fleet's "a turn in flight never
// expires", each against a real bucket. The lane's first session is created
// at t0; prep then shapes the stored entry and the store's clock moves to
// t0+at before GetOrCreateSession runs.
func TestGetOrCreateSession(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)

	tests := []struct {
		name     string
		fresh    bool // no entry before the call
		prep     func(e *session.SessionEntry)
		policy   session.ResetPolicy
		at       time.Duration
		forceNew bool

		wantReset  bool
		wantReason string
		wantKept   bool // Decision.KeptForResume
		check      func(t *testing.T, old, got *session.SessionEntry)
	}{
		{
			name: "new entry", fresh: true, policy: idle60,
			wantReset: true, wantReason: "",
			check: func(t *testing.T, _, got *session.SessionEntry) {
				if got.WasAutoReset || got.IsFreshReset || got.ParentSessionID != "" {
					t.Errorf("first session carries reset flags: %+v", got)
				}
				if got.CostStatus != "unknown" {
					t.Errorf("cost_status = %q, want unknown", got.CostStatus)
				}
			},
		},
		{
			name: "suspended starts a new session linked to the old one",
			prep: func(e *session.SessionEntry) {
				e.Suspended = true
				e.TotalTokens = 10
			},
			policy: noReset, at: time.Minute,
			wantReset: true, wantReason: session.ReasonSuspended,
			check: func(t *testing.T, old, got *session.SessionEntry) {
				if got.ParentSessionID != old.SessionID {
					t.Errorf("parent_session_id = %q, want %q", got.ParentSessionID, old.SessionID)
				}
				if !got.WasAutoReset || got.AutoResetReason != session.ReasonSuspended || !got.ResetHadActivity {
					t.Errorf("reset flags = was_auto_reset %v reason %q had_activity %v", got.WasAutoReset, got.AutoResetReason, got.ResetHadActivity)
				}
				if got.Suspended || got.TotalTokens != 0 {
					t.Errorf("suspended=%v total_tokens=%d after the reset", got.Suspended, got.TotalTokens)
				}
			},
		},
		{
			name: "suspended wins over a fresh resume_pending (escalation)",
			prep: func(e *session.SessionEntry) {
				e.Suspended = true
				e.ResumePending = true
				e.ResumeReason = "restart_interrupted"
				e.LastResumeMarkedAt = timePtr(t0)
				e.InterruptedTurns = 3
			},
			policy: noReset, at: time.Minute,
			wantReset: true, wantReason: session.ReasonSuspended,
			check: func(t *testing.T, old, got *session.SessionEntry) {
				if got.ParentSessionID != old.SessionID {
					t.Errorf("parent_session_id = %q, want %q", got.ParentSessionID, old.SessionID)
				}
				if got.ResumePending || got.InterruptedTurns != 0 {
					t.Errorf("resume_pending=%v interrupted_turns=%d survive the reset", got.ResumePending, got.InterruptedTurns)
				}
			},
		},
		{
			name: "fresh resume_pending keeps the session",
			prep: func(e *session.SessionEntry) {
				e.ResumePending = true
				e.ResumeReason = "restart_timeout"
				e.LastResumeMarkedAt = timePtr(t0.Add(10 * time.Minute))
			},
			policy: noReset, at: 30 * time.Minute,
			wantKept: true,
			check: func(t *testing.T, _, got *session.SessionEntry) {
				if !got.ResumePending || got.ResumeReason != "restart_timeout" {
					t.Errorf("marker cleared at turn start: resume_pending=%v reason=%q", got.ResumePending, got.ResumeReason)
				}
				if got.WasAutoReset {
					t.Error("was_auto_reset set on a resumed session")
				}
			},
		},
		{
			name: "fresh resume_pending beats an expired idle policy",
			prep: func(e *session.SessionEntry) {
				e.ResumePending = true
				e.ResumeReason = "restart_timeout"
				e.LastResumeMarkedAt = timePtr(t0.Add(90 * time.Minute))
			},
			policy: idle60, at: 2 * time.Hour,
			wantKept: true,
		},
		{
			name: "stale resume_pending falls through to the idle policy",
			prep: func(e *session.SessionEntry) {
				e.ResumePending = true
				e.ResumeReason = "restart_timeout"
				e.LastResumeMarkedAt = timePtr(t0)
			},
			policy: idle60, at: 2 * time.Hour,
			wantReset: true, wantReason: session.ReasonIdle,
			check: func(t *testing.T, _, got *session.SessionEntry) {
				if got.ResumePending || got.LastResumeMarkedAt != nil {
					t.Errorf("stale marker survives the reset: %+v", got)
				}
			},
		},
		{
			name: "stale resume_pending with no policy keeps the session for the resume, with the note",
			prep: func(e *session.SessionEntry) {
				e.ResumePending = true
				e.ResumeReason = "restart_timeout"
				e.LastResumeMarkedAt = timePtr(t0)
			},
			policy: noReset, at: 2 * time.Hour,
			wantKept: true,
		},
		{
			name: "idle policy resets after idle_minutes",
			prep: func(e *session.SessionEntry) {
				e.TotalTokens = 5
			},
			policy: idle60, at: 61 * time.Minute,
			wantReset: true, wantReason: session.ReasonIdle,
			check: func(t *testing.T, old, got *session.SessionEntry) {
				if !got.WasAutoReset || got.AutoResetReason != session.ReasonIdle || !got.ResetHadActivity {
					t.Errorf("reset flags = was_auto_reset %v reason %q had_activity %v", got.WasAutoReset, got.AutoResetReason, got.ResetHadActivity)
				}
				if got.ParentSessionID != old.SessionID {
					t.Errorf("parent_session_id = %q, want %q", got.ParentSessionID, old.SessionID)
				}
			},
		},
		{
			name: "idle policy keeps within idle_minutes", policy: idle60, at: 59 * time.Minute,
		},
		{
			name: "daily policy resets after the at_hour boundary", policy: daily4, at: 17 * time.Hour, // next day 05:00
			wantReset: true, wantReason: session.ReasonDaily,
			check: func(t *testing.T, _, got *session.SessionEntry) {
				if got.ResetHadActivity {
					t.Error("reset_had_activity set for a session without tokens")
				}
			},
		},
		{
			name: "daily policy keeps before the at_hour boundary", policy: daily4, at: 15 * time.Hour, // next day 03:00
		},
		{
			name: "a turn in flight never expires",
			prep: func(e *session.SessionEntry) {
				e.Turn = &session.TurnIntent{ID: "turn-1", FirstSeq: 1, LastSeq: 1, Attempt: 1, SessionID: e.SessionID}
			},
			policy: idle60, at: 48 * time.Hour,
		},
		{
			name: "forceNew starts a new session", policy: noReset, at: time.Minute, forceNew: true,
			wantReset: true, wantReason: session.ReasonNew,
			check: func(t *testing.T, old, got *session.SessionEntry) {
				if !got.IsFreshReset || got.WasAutoReset {
					t.Errorf("is_fresh_reset=%v was_auto_reset=%v, want true/false", got.IsFreshReset, got.WasAutoReset)
				}
				if got.ParentSessionID != old.SessionID {
					t.Errorf("parent_session_id = %q, want %q", got.ParentSessionID, old.SessionID)
				}
			},
		},
		{
			name: "forceNew on a new lane", fresh: true, policy: noReset, forceNew: true,
			wantReset: true,
		},
		{
			name: "keep bumps updated_at and keeps counters",
			prep: func(e *session.SessionEntry) {
				e.InputTokens, e.TotalTokens = 7, 9
				e.IsFreshReset = true
			},
			policy: session.ResetPolicy{Mode: session.ResetBoth, AtHour: 4, IdleMinutes: 600}, at: 3 * time.Hour,
			check: func(t *testing.T, _, got *session.SessionEntry) {
				if got.InputTokens != 7 || got.TotalTokens != 9 || !got.IsFreshReset {
					t.Errorf("kept entry changed: input=%d total=%d is_fresh_reset=%v", got.InputTokens, got.TotalTokens, got.IsFreshReset)
				}
			},
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock(t0)
			st := ev.store(t, clk.Now)
			s := src("goc" + string(rune('a'+i)))
			lane := laneOf(s)
			var old *session.SessionEntry
			if !tc.fresh {
				old = create(t, st, s)
				if tc.prep != nil {
					old = edit(t, st, lane, tc.prep)
				}
			}
			now := t0.Add(tc.at)
			clk.Set(now)

			got, dec, err := st.GetOrCreateSession(ctx, s, policy(tc.policy), tc.forceNew)
			if err != nil {
				t.Fatalf("GetOrCreateSession: %v", err)
			}
			if got, want := dec.Reset, tc.wantReset; got != want {
				t.Errorf("Reset = %v, want %v", got, want)
			}
			if got, want := dec.Reason, tc.wantReason; got != want {
				t.Errorf("Reason = %q, want %q", got, want)
			}
			if got, want := dec.KeptForResume, tc.wantKept; got != want {
				t.Errorf("KeptForResume = %v, want %v", got, want)
			}
			if got, want := got.SessionID, dec.SessionID; got != want {
				t.Errorf("entry session id %q, decision %q", got, want)
			}
			stored, _ := mustGet(t, st, lane)
			if got, want := stored.SessionID, got.SessionID; got != want {
				t.Errorf("stored session id %q, returned %q", got, want)
			}
			if !stored.UpdatedAt.Equal(now) {
				t.Errorf("updated_at = %v, want %v", stored.UpdatedAt, now)
			}
			if got, want := stored.SessionKey, keyOf(s); got != want {
				t.Errorf("session_key = %q, want %q", got, want)
			}
			if stored.Origin == nil || stored.Origin.ChatID != s.ChatID || stored.DisplayName != s.ChatName {
				t.Errorf("origin %+v display name %q not from the source", stored.Origin, stored.DisplayName)
			}
			if tc.wantReset {
				if !session.ValidSessionID(stored.SessionID) {
					t.Errorf("new session id %q is not valid", stored.SessionID)
				}
				if old != nil && stored.SessionID == old.SessionID {
					t.Errorf("session id %q kept, want a new one", stored.SessionID)
				}
				if old != nil && dec.PreviousSessionID != old.SessionID {
					t.Errorf("PreviousSessionID = %q, want %q", dec.PreviousSessionID, old.SessionID)
				}
				if !stored.CreatedAt.Equal(now) {
					t.Errorf("created_at = %v, want %v", stored.CreatedAt, now)
				}
				rec, err := st.LookupIndex(ctx, stored.SessionID)
				if err != nil {
					t.Fatalf("new session id not indexed: %v", err)
				}
				if rec.Lane != lane || rec.SessionKey != keyOf(s) || rec.ParentSessionID != stored.ParentSessionID {
					t.Errorf("index record %+v, want lane %s key %s parent %q", rec, lane, keyOf(s), stored.ParentSessionID)
				}
			} else {
				if stored.SessionID != old.SessionID {
					t.Errorf("session id %q, want the kept %q", stored.SessionID, old.SessionID)
				}
				if !stored.CreatedAt.Equal(old.CreatedAt) {
					t.Errorf("created_at moved from %v to %v", old.CreatedAt, stored.CreatedAt)
				}
			}
			if tc.check != nil {
				tc.check(t, old, stored)
			}
		})
	}
}

// TestGetOrCreateSessionValidates refuses a source the session key can't be
// built from, and writes nothing.
func TestGetOrCreateSessionValidates(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	st := ev.store(t, nil)
	bad := session.SessionSource{Platform: "nope", ChatID: "x"}
	if _, _, err := st.GetOrCreateSession(testCtx(t), bad, policy(noReset), false); !errors.Is(err, session.ErrUnknownPlatform) {
		t.Fatalf("err = %v, want ErrUnknownPlatform", err)
	}
	if has, err := st.HasAnySessions(testCtx(t)); err != nil || has {
		t.Fatalf("HasAnySessions = %v, %v after a refused source", has, err)
	}
}

func TestUpdateSession(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	clk := newClock(t0)
	st := ev.store(t, clk.Now)
	s := src("upd")
	old := create(t, st, s)

	clk.Set(t0.Add(time.Minute))
	got, err := st.UpdateSession(ctx, keyOf(s), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !got.UpdatedAt.Equal(t0.Add(time.Minute)) || got.LastPromptTokens != 0 || got.SessionID != old.SessionID {
		t.Errorf("after UpdateSession(nil): %+v", got)
	}

	clk.Set(t0.Add(2 * time.Minute))
	n := int64(1234)
	if _, err := st.UpdateSession(ctx, keyOf(s), &n); err != nil {
		t.Fatal(err)
	}
	stored, _ := mustGet(t, st, laneOf(s))
	if got, want := stored.LastPromptTokens, n; got != want {
		t.Errorf("last_prompt_tokens = %d, want %d", got, want)
	}
	if !stored.UpdatedAt.Equal(t0.Add(2 * time.Minute)) {
		t.Errorf("updated_at = %v", stored.UpdatedAt)
	}

	if _, err := st.UpdateSession(ctx, keyOf(src("nobody")), nil); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("UpdateSession of an unknown key: %v, want ErrNotFound", err)
	}
	if got := revOf(t, st, laneOf(src("nobody"))); got != 0 {
		t.Errorf("UpdateSession of an unknown key created an entry (rev %d)", got)
	}
}

func TestResetSession(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	clk := newClock(t0)
	st := ev.store(t, clk.Now)
	s := src("reset")
	lane := laneOf(s)
	old := create(t, st, s)
	edit(t, st, lane, func(e *session.SessionEntry) {
		e.TotalTokens, e.InputTokens = 50, 40
		e.ResumePending, e.ResumeReason = true, "restart_timeout"
		e.Owner, e.LeaseEpoch, e.CommittedSeq = "w1/abc", 9, 77
	})

	clk.Set(t0.Add(5 * time.Minute))
	got, err := st.ResetSession(ctx, keyOf(s), "Renamed")
	if err != nil {
		t.Fatal(err)
	}
	stored, _ := mustGet(t, st, lane)
	if got.SessionID != stored.SessionID {
		t.Errorf("returned %q, stored %q", got.SessionID, stored.SessionID)
	}
	if stored.SessionID == old.SessionID || !session.ValidSessionID(stored.SessionID) {
		t.Errorf("session id %q after reset of %q", stored.SessionID, old.SessionID)
	}
	if !stored.IsFreshReset || stored.WasAutoReset {
		t.Errorf("is_fresh_reset=%v was_auto_reset=%v, want true/false", stored.IsFreshReset, stored.WasAutoReset)
	}
	if stored.ParentSessionID != old.SessionID {
		t.Errorf("parent_session_id = %q, want %q", stored.ParentSessionID, old.SessionID)
	}
	if stored.TotalTokens != 0 || stored.InputTokens != 0 || stored.ResumePending {
		t.Errorf("counters or markers survive the reset: %+v", stored)
	}
	if stored.Owner != "w1/abc" || stored.LeaseEpoch != 9 || stored.CommittedSeq != 77 {
		t.Errorf("lane fields lost: owner %q epoch %d committed %d", stored.Owner, stored.LeaseEpoch, stored.CommittedSeq)
	}
	if stored.DisplayName != "Renamed" {
		t.Errorf("display_name = %q, want Renamed", stored.DisplayName)
	}
	if !stored.CreatedAt.Equal(t0.Add(5 * time.Minute)) {
		t.Errorf("created_at = %v", stored.CreatedAt)
	}
	rec, err := st.LookupIndex(ctx, stored.SessionID)
	if err != nil {
		t.Fatalf("reset session not indexed: %v", err)
	}
	if rec.Lane != lane || rec.SessionKey != keyOf(s) || rec.ParentSessionID != old.SessionID || !rec.CreatedAt.Equal(stored.CreatedAt) {
		t.Errorf("index record %+v", rec)
	}

	// An empty display name keeps the current one.
	if _, err := st.ResetSession(ctx, keyOf(s), ""); err != nil {
		t.Fatal(err)
	}
	if again, _ := mustGet(t, st, lane); again.DisplayName != "Renamed" || again.SessionID == stored.SessionID {
		t.Errorf("second reset: display %q session %q", again.DisplayName, again.SessionID)
	}

	if _, err := st.ResetSession(ctx, keyOf(src("nobody")), ""); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("ResetSession of an unknown key: %v, want ErrNotFound", err)
	}
}

func TestSwitchSession(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	clk := newClock(t0)
	st := ev.store(t, clk.Now)
	a, b := src("swa"), src("swb")
	laneA := laneOf(a)
	first := create(t, st, a)
	clk.Set(t0.Add(time.Hour))
	second, err := st.ResetSession(ctx, keyOf(a), "")
	if err != nil {
		t.Fatal(err)
	}
	other := create(t, st, b)

	t.Run("same lane", func(t *testing.T) {
		clk.Set(t0.Add(2 * time.Hour))
		got, err := st.SwitchSession(ctx, keyOf(a), first.SessionID)
		if err != nil {
			t.Fatal(err)
		}
		stored, rev := mustGet(t, st, laneA)
		if stored.SessionID != first.SessionID || got.SessionID != first.SessionID {
			t.Fatalf("session id %q, want %q", stored.SessionID, first.SessionID)
		}
		if !stored.CreatedAt.Equal(first.CreatedAt) {
			t.Errorf("created_at = %v, want the target's %v", stored.CreatedAt, first.CreatedAt)
		}
		if !stored.UpdatedAt.Equal(t0.Add(2 * time.Hour)) {
			t.Errorf("updated_at = %v", stored.UpdatedAt)
		}
		if stored.WasAutoReset || stored.IsFreshReset {
			t.Errorf("switch set reset flags: %+v", stored)
		}

		// Switching to the current session writes nothing.
		if _, err := st.SwitchSession(ctx, keyOf(a), first.SessionID); err != nil {
			t.Fatal(err)
		}
		if got := revOf(t, st, laneA); got != rev {
			t.Errorf("no-op switch wrote: revision %d -> %d", rev, got)
		}
		if _, err := st.SwitchSession(ctx, keyOf(a), second.SessionID); err != nil {
			t.Fatal(err)
		}
		if e, _ := mustGet(t, st, laneA); e.SessionID != second.SessionID || e.ParentSessionID != first.SessionID {
			t.Errorf("switch back: session %q parent %q, want %q parent %q", e.SessionID, e.ParentSessionID, second.SessionID, first.SessionID)
		}
	})
	t.Run("another lane is refused", func(t *testing.T) {
		before := revOf(t, st, laneA)
		if _, err := st.SwitchSession(ctx, keyOf(a), other.SessionID); err == nil {
			t.Fatal("switch to another lane's session succeeded")
		}
		if got := revOf(t, st, laneA); got != before {
			t.Errorf("refused switch wrote: revision %d -> %d", before, got)
		}
	})
	t.Run("unknown id", func(t *testing.T) {
		for _, id := range []string{session.NewSessionID(t0), "not-a-session-id", ""} {
			if _, err := st.SwitchSession(ctx, keyOf(a), id); !errors.Is(err, kv.ErrNotFound) {
				t.Errorf("SwitchSession(%q): %v, want ErrNotFound", id, err)
			}
		}
	})
}

func TestSuspendSession(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	clk := newClock(t0)
	st := ev.store(t, clk.Now)
	s := src("susp")
	lane := laneOf(s)
	old := create(t, st, s)

	got, err := st.SuspendSession(ctx, keyOf(s))
	if err != nil {
		t.Fatal(err)
	}
	stored, rev := mustGet(t, st, lane)
	if !got.Suspended || !stored.Suspended || stored.SessionID != old.SessionID {
		t.Fatalf("after SuspendSession: %+v", stored)
	}
	if _, err := st.SuspendSession(ctx, keyOf(s)); err != nil {
		t.Fatal(err)
	}
	if got := revOf(t, st, lane); got != rev {
		t.Errorf("second suspend wrote: revision %d -> %d", rev, got)
	}
	if _, err := st.SuspendSession(ctx, keyOf(src("nobody"))); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("SuspendSession of an unknown key: %v, want ErrNotFound", err)
	}

	clk.Set(t0.Add(time.Minute))
	next, dec, err := st.GetOrCreateSession(ctx, s, policy(noReset), false)
	if err != nil {
		t.Fatal(err)
	}
	if !dec.Reset || dec.Reason != session.ReasonSuspended || next.ParentSessionID != old.SessionID || next.Suspended {
		t.Errorf("next access after suspend: decision %+v entry %+v", dec, next)
	}
}

func TestMarkAndClearResumePending(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	clk := newClock(t0)
	st := ev.store(t, clk.Now)

	t.Run("mark persists and clear clears", func(t *testing.T) {
		s := src("mark")
		lane := laneOf(s)
		create(t, st, s)
		clk.Set(t0.Add(time.Minute))
		if _, err := st.MarkResumePending(ctx, keyOf(s), "restart_timeout"); err != nil {
			t.Fatal(err)
		}
		// Another process (its own connection and store) sees the marker.
		other := ev.store(t, nil)
		stored, rev := mustGet(t, other, lane)
		if !stored.ResumePending || stored.ResumeReason != "restart_timeout" || stored.LastResumeMarkedAt == nil || !stored.LastResumeMarkedAt.Equal(t0.Add(time.Minute)) {
			t.Fatalf("marker not persisted: pending %v reason %q at %v", stored.ResumePending, stored.ResumeReason, stored.LastResumeMarkedAt)
		}
		// The same mark again writes nothing.
		if _, err := st.MarkResumePending(ctx, keyOf(s), "restart_timeout"); err != nil {
			t.Fatal(err)
		}
		if got := revOf(t, st, lane); got != rev {
			t.Errorf("repeated mark wrote: revision %d -> %d", rev, got)
		}

		got, err := st.ClearResumePending(ctx, keyOf(s))
		if err != nil {
			t.Fatal(err)
		}
		stored, rev = mustGet(t, st, lane)
		if got.ResumePending || stored.ResumePending || stored.ResumeReason != "" || stored.LastResumeMarkedAt != nil {
			t.Errorf("after clear: %+v", stored)
		}
		if _, err := st.ClearResumePending(ctx, keyOf(s)); err != nil {
			t.Fatal(err)
		}
		if got := revOf(t, st, lane); got != rev {
			t.Errorf("clear of a clear entry wrote: revision %d -> %d", rev, got)
		}
	})
	t.Run("never overrides suspended", func(t *testing.T) {
		s := src("marksusp")
		lane := laneOf(s)
		create(t, st, s)
		if _, err := st.SuspendSession(ctx, keyOf(s)); err != nil {
			t.Fatal(err)
		}
		rev := revOf(t, st, lane)
		got, err := st.MarkResumePending(ctx, keyOf(s), "restart_timeout")
		if err != nil {
			t.Fatal(err)
		}
		stored, _ := mustGet(t, st, lane)
		if got.ResumePending || stored.ResumePending || !stored.Suspended {
			t.Errorf("suspended entry after mark: pending %v suspended %v", stored.ResumePending, stored.Suspended)
		}
		if got := revOf(t, st, lane); got != rev {
			t.Errorf("refused mark wrote: revision %d -> %d", rev, got)
		}
	})
	t.Run("unknown key", func(t *testing.T) {
		if _, err := st.MarkResumePending(ctx, keyOf(src("nobody")), "restart_timeout"); !errors.Is(err, kv.ErrNotFound) {
			t.Errorf("MarkResumePending: %v, want ErrNotFound", err)
		}
		if _, err := st.ClearResumePending(ctx, keyOf(src("nobody"))); !errors.Is(err, kv.ErrNotFound) {
			t.Errorf("ClearResumePending: %v, want ErrNotFound", err)
		}
	})
}

func TestSuspendRecentlyActive(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	clk := newClock(t0)
	st := ev.store(t, clk.Now)
	now := t0.Add(time.Hour)

	entries := []struct {
		chat    string
		updated time.Duration // before now
		prep    func(e *session.SessionEntry)
		mark    bool
	}{
		{chat: "recent", updated: 30 * time.Second, mark: true},
		{chat: "edge", updated: 119 * time.Second, mark: true},
		{chat: "old", updated: 10 * time.Minute},
		{chat: "pending", updated: 10 * time.Second, prep: func(e *session.SessionEntry) {
			e.ResumePending, e.ResumeReason, e.LastResumeMarkedAt = true, "restart_timeout", timePtr(t0)
		}},
		{chat: "suspended", updated: 10 * time.Second, prep: func(e *session.SessionEntry) { e.Suspended = true }},
	}
	var want []string
	revs := map[string]uint64{}
	for _, c := range entries {
		s := src("sra-" + c.chat)
		create(t, st, s)
		edit(t, st, laneOf(s), func(e *session.SessionEntry) {
			e.UpdatedAt = now.Add(-c.updated)
			if c.prep != nil {
				c.prep(e)
			}
		})
		revs[c.chat] = revOf(t, st, laneOf(s))
		if c.mark {
			want = append(want, keyOf(s))
		}
	}
	clk.Set(now)
	marked, err := st.SuspendRecentlyActive(ctx, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(marked)
	slices.Sort(want)
	if !slices.Equal(marked, want) {
		t.Errorf("marked %v, want %v", marked, want)
	}
	for _, c := range entries {
		s := src("sra-" + c.chat)
		e, rev := mustGet(t, st, laneOf(s))
		switch {
		case c.mark:
			if !e.ResumePending || e.ResumeReason != "restart_interrupted" || e.LastResumeMarkedAt == nil || !e.LastResumeMarkedAt.Equal(now) {
				t.Errorf("%s: pending %v reason %q at %v", c.chat, e.ResumePending, e.ResumeReason, e.LastResumeMarkedAt)
			}
			if e.Suspended {
				t.Errorf("%s: suspended", c.chat)
			}
		default:
			if rev != revs[c.chat] {
				t.Errorf("%s: written (revision %d -> %d)", c.chat, revs[c.chat], rev)
			}
		}
	}
	// A second pass marks nothing: everything recent is pending or suspended.
	again, err := st.SuspendRecentlyActive(ctx, 2*time.Minute)
	if err != nil || len(again) != 0 {
		t.Errorf("second pass marked %v, %v", again, err)
	}
}

func TestPruneOldEntries(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	clk := newClock(t0)
	st := ev.store(t, clk.Now)
	now := t0.Add(30 * 24 * time.Hour)

	entries := []struct {
		chat  string
		age   time.Duration
		prep  func(e *session.SessionEntry)
		busy  bool
		prune bool
	}{
		{chat: "old", age: 8 * 24 * time.Hour, prune: true},
		{chat: "old2", age: 20 * 24 * time.Hour, prune: true},
		{chat: "recent", age: 6 * 24 * time.Hour},
		{chat: "suspended", age: 8 * 24 * time.Hour, prep: func(e *session.SessionEntry) { e.Suspended = true }},
		{chat: "owned", age: 8 * 24 * time.Hour, prep: func(e *session.SessionEntry) { e.Owner, e.LeaseEpoch = "w1/x", 3 }},
		{chat: "turn", age: 8 * 24 * time.Hour, prep: func(e *session.SessionEntry) {
			e.Turn = &session.TurnIntent{ID: "t", FirstSeq: 1, LastSeq: 1, Attempt: 1, SessionID: e.SessionID}
		}},
		{chat: "busy", age: 8 * 24 * time.Hour, busy: true},
	}
	busyLanes := map[string]bool{}
	var want []string
	for _, c := range entries {
		s := src("prune-" + c.chat)
		create(t, st, s)
		edit(t, st, laneOf(s), func(e *session.SessionEntry) {
			e.UpdatedAt = now.Add(-c.age)
			if c.prep != nil {
				c.prep(e)
			}
		})
		if c.busy {
			busyLanes[laneOf(s)] = true
		}
		if c.prune {
			want = append(want, laneOf(s))
		}
	}
	clk.Set(now)

	if pruned, err := st.PruneOldEntries(ctx, 0, nil); err != nil || len(pruned) != 0 {
		t.Fatalf("PruneOldEntries(0) = %v, %v; want nothing", pruned, err)
	}
	var asked []string
	pruned, err := st.PruneOldEntries(ctx, 7, func(lane string) bool {
		asked = append(asked, lane)
		return busyLanes[lane]
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(pruned)
	slices.Sort(want)
	if !slices.Equal(pruned, want) {
		t.Errorf("pruned %v, want %v", pruned, want)
	}
	for lane := range busyLanes {
		if !slices.Contains(asked, lane) {
			t.Errorf("busy callback not asked about %s", lane)
		}
	}
	for _, c := range entries {
		lane := laneOf(src("prune-" + c.chat))
		_, _, err := st.Get(ctx, lane)
		if c.prune && !errors.Is(err, kv.ErrNotFound) {
			t.Errorf("%s: still there after prune (err %v)", c.chat, err)
		}
		if !c.prune && err != nil {
			t.Errorf("%s: gone after prune: %v", c.chat, err)
		}
	}
	// The index remembers pruned sessions.
	if has, err := st.HasAnySessions(ctx); err != nil || !has {
		t.Errorf("HasAnySessions after prune = %v, %v", has, err)
	}
	// A pruned lane starts over with a fresh session.
	e, dec, err := st.GetOrCreateSession(ctx, src("prune-old"), policy(noReset), false)
	if err != nil || !dec.Reset || dec.Reason != "" || e.ParentSessionID != "" {
		t.Errorf("after prune: decision %+v err %v", dec, err)
	}
}

func TestListSessions(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	clk := newClock(t0)
	st := ev.store(t, clk.Now)

	if got, err := st.ListSessions(ctx, 0); err != nil || len(got) != 0 {
		t.Fatalf("ListSessions on an empty bucket = %v, %v", got, err)
	}
	ages := map[string]time.Duration{"l-a": 90 * time.Minute, "l-b": 5 * time.Minute, "l-c": 30 * time.Minute, "l-d": 0}
	for chat, age := range ages {
		clk.Set(t0.Add(2*time.Hour - age))
		create(t, st, src(chat))
	}
	clk.Set(t0.Add(2 * time.Hour))

	tests := []struct {
		active int
		want   []string
	}{
		{0, []string{"l-d", "l-b", "l-c", "l-a"}},
		{-5, []string{"l-d", "l-b", "l-c", "l-a"}},
		{60, []string{"l-d", "l-b", "l-c"}},
		{10, []string{"l-d", "l-b"}},
	}
	for _, tc := range tests {
		got, err := st.ListSessions(ctx, tc.active)
		if err != nil {
			t.Fatal(err)
		}
		var chats []string
		for _, e := range got {
			chats = append(chats, e.Origin.ChatID)
		}
		if !slices.Equal(chats, tc.want) {
			t.Errorf("ListSessions(%d) = %v, want %v", tc.active, chats, tc.want)
		}
	}
}

func TestLookupBySessionID(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	clk := newClock(t0)
	st := ev.store(t, clk.Now)
	s := src("lookup")
	first := create(t, st, s)

	got, err := st.LookupBySessionID(ctx, first.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	if got.SessionID != first.SessionID || got.SessionKey != keyOf(s) {
		t.Errorf("lookup = %+v", got)
	}
	clk.Set(t0.Add(time.Minute))
	second, err := st.ResetSession(ctx, keyOf(s), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.LookupBySessionID(ctx, first.SessionID); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("lookup of a no longer active session: %v, want ErrNotFound", err)
	}
	if got, err := st.LookupBySessionID(ctx, second.SessionID); err != nil || got.SessionID != second.SessionID {
		t.Errorf("lookup of the active session: %v, %v", got, err)
	}
	for _, id := range []string{session.NewSessionID(t0), "garbage", ""} {
		if _, err := st.LookupBySessionID(ctx, id); !errors.Is(err, kv.ErrNotFound) {
			t.Errorf("LookupBySessionID(%q): %v, want ErrNotFound", id, err)
		}
	}
}

func TestHasAnySessions(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	st := ev.store(t, nil)
	if has, err := st.HasAnySessions(ctx); err != nil || has {
		t.Fatalf("HasAnySessions on a new fleet = %v, %v", has, err)
	}
	create(t, st, src("has"))
	if has, err := st.HasAnySessions(ctx); err != nil || !has {
		t.Fatalf("HasAnySessions after a session = %v, %v", has, err)
	}
}

// TestResumeAfterRestart is the unit test plan of
// seeds/resume-after-restart-spec.md against the store. A "restart" is a new
// Store on a new connection reading what the old one left.
func TestResumeAfterRestart(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)

	t.Run("same session resumes after an interrupted restart", func(t *testing.T) {
		clk := newClock(t0)
		before := ev.store(t, clk.Now)
		s := src("rs-same")
		first := create(t, before, s)
		edit(t, before, laneOf(s), func(e *session.SessionEntry) { e.TotalTokens = 42 })
		clk.Set(t0.Add(time.Minute))
		if _, err := before.MarkResumePending(ctx, keyOf(s), "restart_timeout"); err != nil {
			t.Fatal(err)
		}

		clk.Set(t0.Add(3 * time.Minute))
		after := ev.store(t, clk.Now)
		// Even a policy that would reset (idle 1 minute) keeps the session.
		e, dec, err := after.GetOrCreateSession(ctx, s, policy(session.ResetPolicy{Mode: session.ResetIdle, IdleMinutes: 1}), false)
		if err != nil {
			t.Fatal(err)
		}
		if dec.Reset || !dec.KeptForResume || e.SessionID != first.SessionID {
			t.Fatalf("resume: decision %+v session %q, want %q kept for resume", dec, e.SessionID, first.SessionID)
		}
		if e.WasAutoReset || e.TotalTokens != 42 {
			t.Errorf("resumed entry: was_auto_reset %v total_tokens %d", e.WasAutoReset, e.TotalTokens)
		}
		// The turn completes: the marker is cleared, and the next access is a
		// plain keep.
		if _, err := after.ClearResumePending(ctx, keyOf(s)); err != nil {
			t.Fatal(err)
		}
		e, dec, err = after.GetOrCreateSession(ctx, s, policy(noReset), false)
		if err != nil {
			t.Fatal(err)
		}
		if dec.Reset || dec.KeptForResume || e.SessionID != first.SessionID || e.ResumePending {
			t.Errorf("after the resumed turn: decision %+v entry pending %v", dec, e.ResumePending)
		}
	})
	t.Run("repeated failures escalate to a fresh session", func(t *testing.T) {
		clk := newClock(t0)
		st := ev.store(t, clk.Now)
		s := src("rs-escalate")
		first := create(t, st, s)
		// Interrupted turns are counted by the worker; at the threshold it
		// suspends the lane while the marker is still set.
		for i := 1; i <= 3; i++ {
			clk.Set(t0.Add(time.Duration(i) * time.Minute))
			if _, err := st.MarkResumePending(ctx, keyOf(s), "restart_interrupted"); err != nil {
				t.Fatal(err)
			}
			edit(t, st, laneOf(s), func(e *session.SessionEntry) { e.InterruptedTurns = i })
			e, dec, err := st.GetOrCreateSession(ctx, s, policy(noReset), false)
			if err != nil {
				t.Fatal(err)
			}
			if i < 3 && (dec.Reset || e.SessionID != first.SessionID) {
				t.Fatalf("attempt %d: session changed before the threshold: %+v", i, dec)
			}
			if i == 3 {
				if _, err := st.SuspendSession(ctx, keyOf(s)); err != nil {
					t.Fatal(err)
				}
			}
		}
		// A late drain marker must not bring the suspended session back.
		if _, err := st.MarkResumePending(ctx, keyOf(s), "shutdown_timeout"); err != nil {
			t.Fatal(err)
		}
		e, dec, err := st.GetOrCreateSession(ctx, s, policy(noReset), false)
		if err != nil {
			t.Fatal(err)
		}
		if !dec.Reset || dec.Reason != session.ReasonSuspended || e.SessionID == first.SessionID {
			t.Fatalf("after escalation: decision %+v", dec)
		}
		if e.ParentSessionID != first.SessionID || e.ResumePending || e.InterruptedTurns != 0 {
			t.Errorf("fresh session: parent %q pending %v interrupted %d", e.ParentSessionID, e.ResumePending, e.InterruptedTurns)
		}
	})
	t.Run("clean restart is unchanged", func(t *testing.T) {
		clk := newClock(t0)
		st := ev.store(t, clk.Now)
		s := src("rs-clean")
		first := create(t, st, s)
		clk.Set(t0.Add(10 * time.Minute))
		after := ev.store(t, clk.Now)
		e, dec, err := after.GetOrCreateSession(ctx, s, policy(idle60), false)
		if err != nil {
			t.Fatal(err)
		}
		if dec.Reset || dec.KeptForResume || e.SessionID != first.SessionID || e.ResumePending || e.WasAutoReset {
			t.Errorf("clean restart: decision %+v entry %+v", dec, e)
		}
	})
}
