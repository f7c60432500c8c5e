package session

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Defaults of the reset policy (seeds/session-lifecycle.md §6).
const (
	DefaultResetAtHour      = 4
	DefaultResetIdleMinutes = 1440
)

// DefaultResetPolicy returns the default policy: reset on whichever comes
// first, the daily boundary at 04:00 local time or 1440 idle minutes, and
// notify the user.
func DefaultResetPolicy() ResetPolicy {
	return ResetPolicy{Mode: ResetBoth, AtHour: DefaultResetAtHour, IdleMinutes: DefaultResetIdleMinutes, Notify: true}
}

// Valid reports whether m is none, idle, daily or both.
func (m ResetMode) Valid() bool {
	switch m {
	case ResetNone, ResetIdle, ResetDaily, ResetBoth:
		return true
	}
	return false
}

func (m ResetMode) usesIdle() bool  { return m == ResetIdle || m == ResetBoth }
func (m ResetMode) usesDaily() bool { return m == ResetDaily || m == ResetBoth }

// MaxIdleMinutes bounds idle_minutes (100 years): beyond it the deadline
// would overflow a time.Duration.
const MaxIdleMinutes = 100 * 366 * 24 * 60

// Validate reports every problem of p, joined, each wrapping
// ErrInvalidResetPolicy: a mode other than none, idle, daily or both; an
// at_hour outside 0..23; idle_minutes below 1 when the mode uses the idle
// timeout, or above MaxIdleMinutes.
func (p ResetPolicy) Validate() error {
	var errs []error
	if !p.Mode.Valid() {
		errs = append(errs, fmt.Errorf("%w: mode %q: must be none, idle, daily or both", ErrInvalidResetPolicy, p.Mode))
	}
	if p.AtHour < 0 || p.AtHour > 23 {
		errs = append(errs, fmt.Errorf("%w: at_hour %d: must be within 0..23", ErrInvalidResetPolicy, p.AtHour))
	}
	if p.Mode.usesIdle() && p.IdleMinutes < 1 {
		errs = append(errs, fmt.Errorf("%w: idle_minutes %d: must be at least 1 with mode %q", ErrInvalidResetPolicy, p.IdleMinutes, p.Mode))
	}
	if p.IdleMinutes > MaxIdleMinutes {
		errs = append(errs, fmt.Errorf("%w: idle_minutes %d: must be at most %d (100 years; use mode daily or none for no idle reset)", ErrInvalidResetPolicy, p.IdleMinutes, MaxIdleMinutes))
	}
	return errors.Join(errs...)
}

// PolicyFor resolves the policy of a platform and chat type (an empty chat
// type is "dm"). The most specific match wins: ByPlatformChatType, then
// ByPlatform, then ByChatType, then Default. A Default with an empty mode is
// unset and resolves to DefaultResetPolicy().
func (c ResetConfig) PolicyFor(p Platform, chatType string) ResetPolicy {
	chatType = chatTypeOrDM(chatType)
	if pol, ok := c.ByPlatformChatType[p][chatType]; ok {
		return pol
	}
	if pol, ok := c.ByPlatform[p]; ok {
		return pol
	}
	if pol, ok := c.ByChatType[chatType]; ok {
		return pol
	}
	if c.Default.Mode == "" {
		return DefaultResetPolicy()
	}
	return c.Default
}

// Validate checks every policy of c (an unset Default is fine) and every
// platform and chat type it is keyed by, and reports all problems, joined.
func (c ResetConfig) Validate() error {
	var errs []error
	check := func(where string, p ResetPolicy) {
		if err := p.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
		}
	}
	checkPlatform := func(where string, p Platform) {
		if !p.Known() {
			errs = append(errs, fmt.Errorf("%s: %w %q", where, ErrUnknownPlatform, string(p)))
		}
	}
	checkChatType := func(where, t string) {
		if !ValidChatType(t) {
			errs = append(errs, fmt.Errorf("%s: %w %q: must be dm, group, channel or thread", where, ErrInvalidChatType, t))
		}
	}
	if c.Default != (ResetPolicy{}) {
		check("default", c.Default)
	}
	for _, p := range slices.Sorted(maps.Keys(c.ByPlatform)) {
		where := "platform " + string(p)
		checkPlatform(where, p)
		check(where, c.ByPlatform[p])
	}
	for _, t := range slices.Sorted(maps.Keys(c.ByChatType)) {
		where := "chat type " + t
		checkChatType(where, t)
		check(where, c.ByChatType[t])
	}
	for _, p := range slices.Sorted(maps.Keys(c.ByPlatformChatType)) {
		checkPlatform("platform "+string(p), p)
		byType := c.ByPlatformChatType[p]
		for _, t := range slices.Sorted(maps.Keys(byType)) {
			where := "platform " + string(p) + " chat type " + t
			checkChatType(where, t)
			check(where, byType[t])
		}
	}
	return errors.Join(errs...)
}

// ShouldReset evaluates policy for entry at now and returns ReasonIdle,
// ReasonDaily or "" (no reset).
//
// Nothing resets when entry is nil, when inFlight (a turn or a background
// process is running on the lane), or when the mode is none (or invalid).
// The idle timeout is checked first: now after updated_at + idle_minutes is
// "idle". Then the daily boundary: the most recent at_hour:00 in loc at or
// before now (today's, or yesterday's when now is before at_hour); an entry
// last updated before it is "daily". A nil loc is time.Local. An entry with
// no updated_at is judged by its created_at.
func ShouldReset(entry *SessionEntry, policy ResetPolicy, now time.Time, loc *time.Location, inFlight bool) string {
	if entry == nil || inFlight {
		return ""
	}
	if loc == nil {
		loc = time.Local
	}
	last := entry.UpdatedAt
	if last.IsZero() {
		last = entry.CreatedAt
	}
	if policy.Mode.usesIdle() && policy.IdleMinutes > 0 {
		deadline := last.Add(time.Duration(policy.IdleMinutes) * time.Minute)
		if now.After(deadline) {
			return ReasonIdle
		}
	}
	if policy.Mode.usesDaily() && policy.AtHour >= 0 && policy.AtHour <= 23 {
		if last.Before(lastDailyBoundary(now, policy.AtHour, loc)) {
			return ReasonDaily
		}
	}
	return ""
}

// lastDailyBoundary returns the most recent daily boundary in loc at or
// before now: today's, or yesterday's when today's is still ahead.
func lastDailyBoundary(now time.Time, atHour int, loc *time.Location) time.Time {
	local := now.In(loc)
	y, m, d := local.Date()
	if b := dailyBoundaryOn(y, m, d, atHour, loc); !b.After(now) {
		return b
	}
	y, m, d = time.Date(y, m, d-1, 12, 0, 0, 0, loc).Date()
	return dailyBoundaryOn(y, m, d, atHour, loc)
}

// dailyBoundaryOn is the boundary of the local day y-m-d: the first instant
// whose local wall clock shows atHour:00 or later on that day. On days when
// the clocks change it is not what time.Date returns for atHour:00 (which
// is unspecified for a repeated or skipped hour): when the hour is repeated
// (clocks go back) it is its first occurrence; when it is skipped (clocks go
// forward) it is the moment of the change. Whether the wall clock reached
// the boundary only ever goes from false to true as time passes, so a
// binary search over whole seconds finds it.
func dailyBoundaryOn(y int, m time.Month, d, atHour int, loc *time.Location) time.Time {
	reached := func(sec int64) bool {
		l := time.Unix(sec, 0).In(loc)
		ly, lm, ld := l.Date()
		if ly != y || lm != m || ld != d {
			return ly > y || ly == y && (lm > m || lm == m && ld > d)
		}
		return l.Hour() >= atHour
	}
	// The day lies within [its nominal midnight - 3h, + 27h] whatever the
	// offsets around it.
	lo := time.Date(y, m, d, 0, 0, 0, 0, loc).Unix() - 3*3600
	hi := lo + 30*3600
	for hi-lo > 1 { // invariant: !reached(lo), reached(hi)
		mid := lo + (hi-lo)/2
		if reached(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return time.Unix(hi, 0).In(loc)
}

// NotifyReset reports whether the first turn after an automatic reset for
// reason tells the user (seeds/session-lifecycle.md §6). No platform in
// NotifyExcludePlatforms is ever told. A suspended reset (a /stop, or a turn
// interrupted repeatedly) always tells the user otherwise. An idle or daily
// reset tells the user only when the policy's notify is on and the old
// session had any activity (reset_had_activity).
func (c ResetConfig) NotifyReset(policy ResetPolicy, reason string, hadActivity bool, p Platform) bool {
	if slices.Contains(c.NotifyExcludePlatforms, p) {
		return false
	}
	switch reason {
	case ReasonSuspended:
		return true
	case ReasonIdle, ReasonDaily:
		return policy.Notify && hadActivity
	}
	return false
}
