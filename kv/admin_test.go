package kv_test

import (
	"slices"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
)

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
