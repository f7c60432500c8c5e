package session

import "slices"

// Clone returns a deep copy of e: the copy shares no pointer or slice with e
// (Origin, Turn with its Notices and Notes, LastResumeMarkedAt,
// AutoResumedAt). Nil stays
// nil, and an empty non-nil slice stays empty and non-nil. Clone of a nil
// entry is nil.
func (e *SessionEntry) Clone() *SessionEntry {
	if e == nil {
		return nil
	}
	c := *e
	if e.Origin != nil {
		origin := *e.Origin
		c.Origin = &origin
	}
	if e.LastResumeMarkedAt != nil {
		at := *e.LastResumeMarkedAt
		c.LastResumeMarkedAt = &at
	}
	if e.AutoResumedAt != nil {
		at := *e.AutoResumedAt
		c.AutoResumedAt = &at
	}
	c.Turn = e.Turn.Clone()
	if e.RecentSessions != nil {
		c.RecentSessions = slices.Clone(e.RecentSessions)
	}
	return &c
}

// Clone returns a deep copy of t (its Notices and Notes included), or nil.
func (t *TurnIntent) Clone() *TurnIntent {
	if t == nil {
		return nil
	}
	c := *t
	c.Notices = slices.Clone(t.Notices)
	c.Notes = slices.Clone(t.Notes)
	return &c
}
