package session_test

import (
	"errors"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // the zone database, also where the system has none

	"github.com/agentfleet/agentfleet/session"
)

func TestDefaultResetPolicy(t *testing.T) {
	t.Parallel()
	got := session.DefaultResetPolicy()
	want := session.ResetPolicy{Mode: session.ResetBoth, AtHour: 4, IdleMinutes: 1440, Notify: true}
	if got != want {
		t.Errorf("DefaultResetPolicy() = %+v, want %+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("DefaultResetPolicy().Validate() = %v", err)
	}
}

func TestResetPolicyValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		p       session.ResetPolicy
		wantErr []string // substrings; none means valid
	}{
		{name: "default", p: session.DefaultResetPolicy()},
		{name: "none ignores idle minutes", p: session.ResetPolicy{Mode: session.ResetNone}},
		{name: "daily ignores idle minutes", p: session.ResetPolicy{Mode: session.ResetDaily, AtHour: 0}},
		{name: "daily at 23", p: session.ResetPolicy{Mode: session.ResetDaily, AtHour: 23}},
		{name: "idle 1 minute", p: session.ResetPolicy{Mode: session.ResetIdle, IdleMinutes: 1}},
		{name: "empty mode", p: session.ResetPolicy{}, wantErr: []string{`mode ""`}},
		{name: "unknown mode", p: session.ResetPolicy{Mode: "weekly"}, wantErr: []string{`mode "weekly"`}},
		{name: "hour 24", p: session.ResetPolicy{Mode: session.ResetDaily, AtHour: 24}, wantErr: []string{"at_hour 24"}},
		{name: "hour -1", p: session.ResetPolicy{Mode: session.ResetNone, AtHour: -1}, wantErr: []string{"at_hour -1"}},
		{name: "idle 0", p: session.ResetPolicy{Mode: session.ResetIdle}, wantErr: []string{"idle_minutes 0"}},
		{name: "both idle -5", p: session.ResetPolicy{Mode: session.ResetBoth, AtHour: 4, IdleMinutes: -5}, wantErr: []string{"idle_minutes -5"}},
		{
			name: "every problem", p: session.ResetPolicy{Mode: "x", AtHour: 99, IdleMinutes: 0},
			wantErr: []string{`mode "x"`, "at_hour 99"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.p.Validate()
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, session.ErrInvalidResetPolicy) {
				t.Fatalf("Validate() = %v, want ErrInvalidResetPolicy", err)
			}
			for _, sub := range tt.wantErr {
				if !strings.Contains(err.Error(), sub) {
					t.Errorf("Validate() = %q, want it to mention %q", err, sub)
				}
			}
		})
	}
}

func TestResetConfigPolicyFor(t *testing.T) {
	t.Parallel()
	pol := func(h int) session.ResetPolicy {
		return session.ResetPolicy{Mode: session.ResetDaily, AtHour: h}
	}
	cfg := session.ResetConfig{
		Default:    pol(1),
		ByPlatform: map[session.Platform]session.ResetPolicy{"telegram": pol(2), "slack": pol(3)},
		ByChatType: map[string]session.ResetPolicy{"group": pol(4), "dm": pol(5)},
		ByPlatformChatType: map[session.Platform]map[string]session.ResetPolicy{
			"telegram": {"dm": pol(6)},
			"discord":  {"thread": pol(7)},
		},
	}
	tests := []struct {
		platform session.Platform
		chatType string
		want     int
	}{
		{"telegram", "dm", 6},      // platform + chat type
		{"telegram", "", 6},        // empty chat type is dm
		{"telegram", "group", 2},   // platform beats chat type
		{"slack", "dm", 3},         // platform
		{"discord", "thread", 7},   // platform + chat type
		{"discord", "group", 4},    // chat type
		{"discord", "dm", 5},       // chat type
		{"discord", "channel", 1},  // default
		{"whatsapp", "channel", 1}, // default
	}
	for _, tt := range tests {
		if got := cfg.PolicyFor(tt.platform, tt.chatType); got.AtHour != tt.want {
			t.Errorf("PolicyFor(%q, %q) = %+v, want at_hour %d", tt.platform, tt.chatType, got, tt.want)
		}
	}
	// An empty config resolves to the default policy.
	if got, want := (session.ResetConfig{}).PolicyFor("telegram", "dm"), session.DefaultResetPolicy(); got != want {
		t.Errorf("zero config PolicyFor() = %+v, want %+v", got, want)
	}
	// A none default is honoured.
	none := session.ResetConfig{Default: session.ResetPolicy{Mode: session.ResetNone}}
	if got, want := none.PolicyFor("telegram", "dm").Mode, session.ResetNone; got != want {
		t.Errorf("PolicyFor() mode = %q, want %q", got, want)
	}
}

func TestResetConfigValidate(t *testing.T) {
	t.Parallel()
	if err := (session.ResetConfig{}).Validate(); err != nil {
		t.Errorf("zero config Validate() = %v", err)
	}
	good := session.ResetConfig{
		Default:            session.DefaultResetPolicy(),
		ByPlatform:         map[session.Platform]session.ResetPolicy{"slack": {Mode: session.ResetNone}},
		ByChatType:         map[string]session.ResetPolicy{"group": {Mode: session.ResetIdle, IdleMinutes: 60}},
		ByPlatformChatType: map[session.Platform]map[string]session.ResetPolicy{"telegram": {"dm": {Mode: session.ResetDaily, AtHour: 3}}},
	}
	if err := good.Validate(); err != nil {
		t.Errorf("Validate() = %v", err)
	}
	bad := session.ResetConfig{
		Default:            session.ResetPolicy{AtHour: 5},
		ByPlatform:         map[session.Platform]session.ResetPolicy{"myspace": {Mode: session.ResetNone}, "slack": {Mode: "x"}},
		ByChatType:         map[string]session.ResetPolicy{"forum": {Mode: session.ResetNone}},
		ByPlatformChatType: map[session.Platform]map[string]session.ResetPolicy{"telegram": {"dm": {Mode: session.ResetIdle}}},
	}
	err := bad.Validate()
	for _, want := range []error{session.ErrInvalidResetPolicy, session.ErrUnknownPlatform, session.ErrInvalidChatType} {
		if !errors.Is(err, want) {
			t.Errorf("Validate() = %v, want it to wrap %v", err, want)
		}
	}
	for _, sub := range []string{"default", "myspace", "platform slack", "chat type forum", "platform telegram chat type dm"} {
		if err == nil || !strings.Contains(err.Error(), sub) {
			t.Errorf("Validate() = %v, want it to mention %q", err, sub)
		}
	}
}

func TestShouldReset(t *testing.T) {
	t.Parallel()
	loc := time.FixedZone("UTC+2", 2*3600)
	at := func(day, hour, min int) time.Time { return time.Date(2026, 6, day, hour, min, 0, 0, loc) }
	idle := session.ResetPolicy{Mode: session.ResetIdle, IdleMinutes: 60, AtHour: 4}
	daily := session.ResetPolicy{Mode: session.ResetDaily, AtHour: 4, IdleMinutes: 60}
	both := session.ResetPolicy{Mode: session.ResetBoth, AtHour: 4, IdleMinutes: 60}
	none := session.ResetPolicy{Mode: session.ResetNone, AtHour: 4, IdleMinutes: 1}

	tests := []struct {
		name     string
		updated  time.Time
		policy   session.ResetPolicy
		now      time.Time
		inFlight bool
		want     string
	}{
		// Idle boundaries: deadline is updated + 60 min.
		{name: "idle: a minute before the deadline", updated: at(16, 10, 0), policy: idle, now: at(16, 10, 59), want: ""},
		{name: "idle: at the deadline", updated: at(16, 10, 0), policy: idle, now: at(16, 11, 0), want: ""},
		{name: "idle: a nanosecond after the deadline", updated: at(16, 10, 0), policy: idle, now: at(16, 11, 0).Add(time.Nanosecond), want: "idle"},
		{name: "idle: a minute after the deadline", updated: at(16, 10, 0), policy: idle, now: at(16, 11, 1), want: "idle"},
		{name: "idle mode ignores the daily boundary", updated: at(16, 3, 59), policy: idle, now: at(16, 4, 30), want: ""},

		// Daily boundaries at 04:00 local.
		{name: "daily: updated and now before the hour", updated: at(16, 1, 0), policy: daily, now: at(16, 3, 59), want: ""},
		{name: "daily: updated before the hour, now after", updated: at(16, 3, 59), policy: daily, now: at(16, 4, 1), want: "daily"},
		{name: "daily: updated before the hour, now exactly at it", updated: at(16, 3, 59), policy: daily, now: at(16, 4, 0), want: "daily"},
		{name: "daily: updated exactly at the hour", updated: at(16, 4, 0), policy: daily, now: at(16, 23, 0), want: ""},
		{name: "daily: updated after the hour", updated: at(16, 4, 1), policy: daily, now: at(16, 23, 59), want: ""},
		{name: "daily: updated yesterday after the hour, now before today's", updated: at(15, 22, 0), policy: daily, now: at(16, 3, 0), want: ""},
		{name: "daily: updated yesterday before the hour, now before today's", updated: at(15, 3, 0), policy: daily, now: at(16, 3, 0), want: "daily"},
		{name: "daily: updated yesterday before the hour, now after today's", updated: at(15, 3, 0), policy: daily, now: at(16, 5, 0), want: "daily"},
		{name: "daily: updated yesterday after the hour, now after today's", updated: at(15, 5, 0), policy: daily, now: at(16, 5, 0), want: "daily"},
		{name: "daily mode ignores idle time", updated: at(16, 4, 30), policy: daily, now: at(16, 23, 0), want: ""},
		{
			name: "daily: at_hour 0", updated: at(15, 23, 59),
			policy: session.ResetPolicy{Mode: session.ResetDaily}, now: at(16, 0, 0), want: "daily",
		},
		{
			name: "daily: month boundary", updated: time.Date(2026, 6, 30, 3, 0, 0, 0, loc),
			policy: daily, now: time.Date(2026, 7, 1, 2, 0, 0, 0, loc), want: "daily",
		},
		{
			name: "daily: the hour is local, not UTC", updated: at(16, 3, 30), // 01:30 UTC
			policy: daily, now: at(16, 5, 30), want: "daily", // 03:30 UTC, before 04:00 UTC
		},

		// Both: idle first, then daily.
		{name: "both: idle wins", updated: at(15, 3, 0), policy: both, now: at(16, 5, 0), want: "idle"},
		{name: "both: daily within the idle window", updated: at(16, 3, 30), policy: both, now: at(16, 4, 10), want: "daily"},
		{name: "both: neither", updated: at(16, 4, 10), policy: both, now: at(16, 4, 50), want: ""},

		// Exclusions.
		{name: "none never resets", updated: at(1, 0, 0), policy: none, now: at(16, 5, 0), want: ""},
		{name: "in flight never resets", updated: at(1, 0, 0), policy: both, now: at(16, 5, 0), inFlight: true, want: ""},
		{name: "invalid mode never resets", updated: at(1, 0, 0), policy: session.ResetPolicy{Mode: "x", IdleMinutes: 1}, now: at(16, 5, 0), want: ""},
		{name: "idle minutes 0 skips the idle check", updated: at(1, 0, 0), policy: session.ResetPolicy{Mode: session.ResetIdle}, now: at(16, 5, 0), want: ""},
		{name: "at_hour out of range skips the daily check", updated: at(1, 0, 0), policy: session.ResetPolicy{Mode: session.ResetDaily, AtHour: 24}, now: at(16, 5, 0), want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := &session.SessionEntry{SessionID: "s", CreatedAt: tt.updated.Add(-time.Hour), UpdatedAt: tt.updated}
			if got := session.ShouldReset(e, tt.policy, tt.now, loc, tt.inFlight); got != tt.want {
				t.Errorf("ShouldReset(updated %v, now %v) = %q, want %q", tt.updated, tt.now, got, tt.want)
			}
			// The instant is what counts, not the zone it is written in.
			if got := session.ShouldReset(e, tt.policy, tt.now.UTC(), loc, tt.inFlight); got != tt.want {
				t.Errorf("ShouldReset(now in UTC) = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestShouldResetEdgeCases(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 6, 16, 12, 0, 0, 0, time.UTC)
	if got := session.ShouldReset(nil, session.DefaultResetPolicy(), now, time.UTC, false); got != "" {
		t.Errorf("ShouldReset(nil) = %q", got)
	}
	// No updated_at: judged by created_at.
	e := &session.SessionEntry{CreatedAt: now.Add(-time.Minute)}
	if got := session.ShouldReset(e, session.ResetPolicy{Mode: session.ResetIdle, IdleMinutes: 5}, now, time.UTC, false); got != "" {
		t.Errorf("ShouldReset(no updated_at, fresh created_at) = %q, want \"\"", got)
	}
	e = &session.SessionEntry{CreatedAt: now.Add(-10 * time.Minute)}
	if got := session.ShouldReset(e, session.ResetPolicy{Mode: session.ResetIdle, IdleMinutes: 5}, now, time.UTC, false); got != "idle" {
		t.Errorf("ShouldReset(no updated_at, old created_at) = %q, want idle", got)
	}
	// A nil location is time.Local.
	e = &session.SessionEntry{UpdatedAt: now.Add(-48 * time.Hour)}
	if got := session.ShouldReset(e, session.ResetPolicy{Mode: session.ResetDaily, AtHour: 4}, now, nil, false); got != "daily" {
		t.Errorf("ShouldReset(nil loc) = %q, want daily", got)
	}
}

// TestShouldResetInOtherZones checks the daily boundary in a zone behind UTC,
// where the local date differs from the UTC date.
func TestShouldResetInOtherZones(t *testing.T) {
	t.Parallel()
	ny := time.FixedZone("UTC-5", -5*3600)
	policy := session.ResetPolicy{Mode: session.ResetDaily, AtHour: 4}
	// 02:00 UTC on the 17th is 21:00 on the 16th in UTC-5: the last boundary
	// is 04:00 on the 16th local = 09:00 UTC on the 16th.
	now := time.Date(2026, 6, 17, 2, 0, 0, 0, time.UTC)
	before := &session.SessionEntry{UpdatedAt: time.Date(2026, 6, 16, 8, 59, 0, 0, time.UTC)}
	after := &session.SessionEntry{UpdatedAt: time.Date(2026, 6, 16, 9, 0, 0, 0, time.UTC)}
	if got := session.ShouldReset(before, policy, now, ny, false); got != "daily" {
		t.Errorf("ShouldReset(before boundary) = %q, want daily", got)
	}
	if got := session.ShouldReset(after, policy, now, ny, false); got != "" {
		t.Errorf("ShouldReset(at boundary) = %q, want \"\"", got)
	}
}

// TestShouldResetAcrossClockChanges: on the days the clocks change, the
// daily boundary is the first moment the local clock shows at_hour:00 —
// the first occurrence of a repeated hour, the moment of the change for a
// skipped one — so no session resets on every message of a repeated hour,
// and no daily reset is skipped.
func TestShouldResetAcrossClockChanges(t *testing.T) {
	t.Parallel()
	load := func(name string) *time.Location {
		loc, err := time.LoadLocation(name)
		if err != nil {
			t.Fatal(err)
		}
		return loc
	}
	berlin, newYork, santiago := load("Europe/Berlin"), load("America/New_York"), load("America/Santiago")
	utc := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		name         string
		loc          *time.Location
		atHour       int
		updated, now string // UTC
		want         string
		boundaryUTC  string // the boundary of now's local day
	}{
		// Berlin, 2026-10-25: 03:00 CEST (01:00 UTC) becomes 02:00 CET; 02:xx
		// happens twice. The boundary is the first 02:00, 00:00 UTC.
		{"repeated hour, updated after its first start", berlin, 2, "2026-10-25T00:05:00Z", "2026-10-25T00:10:00Z", "", "2026-10-25T00:00:00Z"},
		{"repeated hour, second occurrence", berlin, 2, "2026-10-25T00:05:00Z", "2026-10-25T01:30:00Z", "", "2026-10-25T00:00:00Z"},
		{"repeated hour, updated the day before", berlin, 2, "2026-10-24T23:59:00Z", "2026-10-25T00:10:00Z", "daily", "2026-10-25T00:00:00Z"},
		// New York, 2026-03-08: 02:00 EST (07:00 UTC) becomes 03:00 EDT; 02:xx
		// does not exist. The boundary is the change, 07:00 UTC.
		{"skipped hour, updated before the change", newYork, 2, "2026-03-08T06:30:00Z", "2026-03-08T07:30:00Z", "daily", "2026-03-08T07:00:00Z"},
		{"skipped hour, updated after the change", newYork, 2, "2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z", "", "2026-03-08T07:00:00Z"},
		// Santiago, 2026-09-06: midnight (04:00 UTC) becomes 01:00; the day
		// starts at 01:00 -04, the boundary of at_hour 0 is that moment.
		{"skipped midnight", santiago, 0, "2026-09-06T03:59:00Z", "2026-09-06T04:30:00Z", "daily", "2026-09-06T04:00:00Z"},
	} {
		policy := session.ResetPolicy{Mode: session.ResetDaily, AtHour: tc.atHour}
		e := &session.SessionEntry{UpdatedAt: utc(tc.updated)}
		if got := session.ShouldReset(e, policy, utc(tc.now), tc.loc, false); got != tc.want {
			t.Errorf("%s: ShouldReset = %q, want %q", tc.name, got, tc.want)
		}
		// Just before and at the boundary.
		b := utc(tc.boundaryUTC)
		if got := session.ShouldReset(&session.SessionEntry{UpdatedAt: b.Add(-time.Second)}, policy, b, tc.loc, false); got != "daily" {
			t.Errorf("%s: updated a second before the boundary %s, at it: %q, want daily", tc.name, b, got)
		}
		if got := session.ShouldReset(&session.SessionEntry{UpdatedAt: b}, policy, b.Add(time.Minute), tc.loc, false); got != "" {
			t.Errorf("%s: updated at the boundary %s: %q, want none", tc.name, b, got)
		}
	}
	// Every minute of a clocks-back day: a session updated a minute ago
	// never resets.
	policy := session.ResetPolicy{Mode: session.ResetDaily, AtHour: 2}
	for now := utc("2026-10-24T22:00:00Z"); now.Before(utc("2026-10-25T23:00:00Z")); now = now.Add(time.Minute) {
		e := &session.SessionEntry{UpdatedAt: now.Add(-time.Minute)}
		if got := session.ShouldReset(e, policy, now, berlin, false); got != "" && !now.Equal(utc("2026-10-25T00:00:00Z")) {
			t.Fatalf("now %s (%s): a session updated a minute before reset (%q)", now, now.In(berlin), got)
		}
	}
}

func TestIdleMinutesBounded(t *testing.T) {
	t.Parallel()
	p := session.ResetPolicy{Mode: session.ResetIdle, AtHour: 4, IdleMinutes: session.MaxIdleMinutes + 1}
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "idle_minutes") {
		t.Fatalf("idle_minutes above the maximum: %v", err)
	}
	p.IdleMinutes = session.MaxIdleMinutes
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	e := &session.SessionEntry{UpdatedAt: time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)}
	if got := session.ShouldReset(e, p, e.UpdatedAt.Add(time.Minute), time.UTC, false); got != "" {
		t.Fatalf("a session updated a minute ago with the largest idle_minutes: %q", got)
	}
}
