package kv

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/agentfleet/agentfleet/session"
)

// Policy is what get_or_create needs to evaluate resets.
type Policy struct {
	Reset     session.ResetConfig
	Location  *time.Location
	Freshness time.Duration
	Keys      session.KeyOptions
}

// GetOrCreateSession is the seed's get_or_create_session as one CAS: it
// returns the lane's entry after applying, in priority order, suspended →
// new session; fresh resume_pending → keep; policy expiry → new session;
// otherwise keep and bump updated_at. forceNew always starts a new session.
// A lane with a turn in flight never expires. A new session id is indexed.
func (s *Store) GetOrCreateSession(ctx context.Context, src session.SessionSource, p Policy, forceNew bool) (*session.SessionEntry, session.Decision, error) {
	src.Normalize()
	if err := src.Validate(); err != nil {
		return nil, session.Decision{}, err
	}
	key := session.BuildSessionKey(src, p.Keys)
	lane := session.LaneToken(key)
	var dec session.Decision
	// A new session id is minted once per call: if fn runs again after a
	// write whose outcome was ambiguous and that did land, it finds its own
	// id stored and keeps it instead of minting a second session.
	minted := ""
	var mintedDec session.Decision
	entry, _, err := s.Mutate(ctx, lane, nil, 0, nil, func(e *session.SessionEntry) (*session.SessionEntry, error) {
		if minted != "" && e != nil && e.SessionID == minted {
			dec = mintedDec
			return nil, ErrNoChange
		}
		now := s.now()
		mint := func() string {
			if minted == "" {
				minted = session.NewSessionID(now)
			}
			return minted
		}
		policy := p.Reset.PolicyFor(src.Platform, src.ChatType)
		dec = session.Decide(e, policy, now, p.Location, p.Freshness, mint)
		if forceNew && !dec.Reset {
			dec = session.Decision{SessionID: mint(), Reset: true, Reason: session.ReasonNew, PreviousSessionID: e.SessionID}
		}
		if dec.Reset {
			mintedDec = dec
		}
		if e == nil {
			e = &session.SessionEntry{SessionKey: key, Platform: src.Platform, ChatType: src.ChatType, CostStatus: "unknown"}
		}
		e.DisplayName = ""
		e.SetOrigin(src)
		if dec.Reset {
			e.StartSession(dec.SessionID, dec.Reason, now)
		} else {
			e.UpdatedAt = now
		}
		return e, nil
	})
	if err != nil {
		return nil, dec, err
	}
	if dec.Reset {
		if err := s.Index(ctx, dec.SessionID, IndexRecord{Lane: lane, SessionKey: key, CreatedAt: entry.CreatedAt, ParentSessionID: entry.ParentSessionID}); err != nil {
			return entry, dec, err
		}
	}
	return entry, dec, nil
}

func (s *Store) mutateKey(ctx context.Context, sessionKey string, fn func(e *session.SessionEntry) error) (*session.SessionEntry, error) {
	lane := session.LaneToken(sessionKey)
	e, _, err := s.Mutate(ctx, lane, nil, 0, nil, func(e *session.SessionEntry) (*session.SessionEntry, error) {
		if e == nil {
			return nil, fmt.Errorf("session %s: %w", sessionKey, ErrNotFound)
		}
		if err := fn(e); err != nil {
			return nil, err
		}
		return e, nil
	})
	return e, err
}

// UpdateSession bumps updated_at and optionally records last_prompt_tokens.
func (s *Store) UpdateSession(ctx context.Context, sessionKey string, lastPromptTokens *int64) (*session.SessionEntry, error) {
	return s.mutateKey(ctx, sessionKey, func(e *session.SessionEntry) error {
		e.UpdatedAt = s.now()
		if lastPromptTokens != nil {
			e.LastPromptTokens = *lastPromptTokens
		}
		return nil
	})
}

// ResetSession starts a new session id for an explicit /new or /reset and
// sets is_fresh_reset. displayName, when non-empty, replaces the display name.
func (s *Store) ResetSession(ctx context.Context, sessionKey, displayName string) (*session.SessionEntry, error) {
	minted := "" // once per call, as in GetOrCreateSession
	e, err := s.mutateKey(ctx, sessionKey, func(e *session.SessionEntry) error {
		if minted != "" && e.SessionID == minted {
			return ErrNoChange
		}
		now := s.now()
		if minted == "" {
			minted = session.NewSessionID(now)
		}
		e.StartSession(minted, session.ReasonReset, now)
		if displayName != "" {
			e.DisplayName = displayName
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	lane := session.LaneToken(sessionKey)
	return e, s.Index(ctx, e.SessionID, IndexRecord{Lane: lane, SessionKey: sessionKey, CreatedAt: e.CreatedAt, ParentSessionID: e.ParentSessionID})
}

// SwitchSession points the lane at an existing session id of the same lane
// (/resume). A session that belongs to another lane is refused.
func (s *Store) SwitchSession(ctx context.Context, sessionKey, target string) (*session.SessionEntry, error) {
	rec, err := s.LookupIndex(ctx, target)
	if err != nil {
		return nil, err
	}
	lane := session.LaneToken(sessionKey)
	if rec.Lane != lane {
		return nil, fmt.Errorf("session %s belongs to another conversation", target)
	}
	return s.mutateKey(ctx, sessionKey, func(e *session.SessionEntry) error {
		if e.SessionID == target {
			return ErrNoChange
		}
		e.StartSession(target, session.ReasonResume, s.now())
		e.CreatedAt = rec.CreatedAt
		e.ParentSessionID = rec.ParentSessionID
		return nil
	})
}

// SuspendSession marks the lane suspended (/stop): the next access starts a
// new session whatever else is set.
func (s *Store) SuspendSession(ctx context.Context, sessionKey string) (*session.SessionEntry, error) {
	return s.mutateKey(ctx, sessionKey, func(e *session.SessionEntry) error {
		if e.Suspended {
			return ErrNoChange
		}
		e.Suspended = true
		return nil
	})
}

// MarkResumePending sets the soft recovery marker; it never overrides suspended.
func (s *Store) MarkResumePending(ctx context.Context, sessionKey, reason string) (*session.SessionEntry, error) {
	return s.mutateKey(ctx, sessionKey, func(e *session.SessionEntry) error {
		if !e.MarkResumePending(reason, s.now()) {
			return ErrNoChange
		}
		return nil
	})
}

// ClearResumePending clears the marker after a resumed turn completed.
func (s *Store) ClearResumePending(ctx context.Context, sessionKey string) (*session.SessionEntry, error) {
	return s.mutateKey(ctx, sessionKey, func(e *session.SessionEntry) error {
		if !e.ClearResumePending() {
			return ErrNoChange
		}
		return nil
	})
}

// SuspendRecentlyActive is the seed's crash-recovery fallback for a fleet
// stopped uncleanly without markers: entries updated within maxAge are marked
// resume_pending (reason restart_interrupted), skipping ones already pending
// or suspended. It returns the session keys it marked.
func (s *Store) SuspendRecentlyActive(ctx context.Context, maxAge time.Duration) ([]string, error) {
	recs, err := s.All(ctx)
	if err != nil {
		return nil, err
	}
	cutoff := s.now().Add(-maxAge)
	var marked []string
	for _, r := range recs {
		if r.Entry.ResumePending || r.Entry.Suspended || r.Entry.UpdatedAt.Before(cutoff) {
			continue
		}
		changed := false
		_, _, err := s.Mutate(ctx, r.Lane, r.Entry, r.Revision, nil, func(e *session.SessionEntry) (*session.SessionEntry, error) {
			// fn runs again after a conflict: decide afresh each time.
			changed = false
			if e == nil || e.ResumePending || e.Suspended || e.UpdatedAt.Before(cutoff) {
				return nil, ErrNoChange
			}
			changed = e.MarkResumePending("restart_interrupted", s.now())
			if !changed {
				return nil, ErrNoChange
			}
			return e, nil
		})
		if err != nil {
			return marked, err
		}
		if changed {
			marked = append(marked, r.Entry.SessionKey)
		}
	}
	return marked, nil
}

// PruneOldEntries deletes entries not updated for maxAgeDays, skipping
// suspended entries, lanes with an owner or a turn in flight, and those for
// which busy reports true (a held lease). Deletes are conditional on the
// revision read. It returns the pruned lanes. maxAgeDays ≤ 0 prunes nothing.
func (s *Store) PruneOldEntries(ctx context.Context, maxAgeDays int, busy func(lane string) bool) ([]string, error) {
	if maxAgeDays <= 0 {
		return nil, nil
	}
	recs, err := s.All(ctx)
	if err != nil {
		return nil, err
	}
	cutoff := s.now().Add(-time.Duration(maxAgeDays) * 24 * time.Hour)
	var pruned []string
	for _, r := range recs {
		e := r.Entry
		if e.Suspended || e.Owner != "" || e.Turn != nil || !e.UpdatedAt.Before(cutoff) {
			continue
		}
		if busy != nil && busy(r.Lane) {
			continue
		}
		if err := s.Delete(ctx, r.Lane, r.Revision); err != nil {
			if errors.Is(err, ErrRevisionMismatch) {
				continue
			}
			return pruned, err
		}
		pruned = append(pruned, r.Lane)
	}
	return pruned, nil
}

// ListSessions returns every entry, newest updated_at first; activeMinutes > 0
// keeps only those updated within that many minutes.
func (s *Store) ListSessions(ctx context.Context, activeMinutes int) ([]*session.SessionEntry, error) {
	recs, err := s.All(ctx)
	if err != nil {
		return nil, err
	}
	var out []*session.SessionEntry
	cutoff := s.now().Add(-time.Duration(activeMinutes) * time.Minute)
	for _, r := range recs {
		if activeMinutes > 0 && r.Entry.UpdatedAt.Before(cutoff) {
			continue
		}
		out = append(out, r.Entry)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].UpdatedAt.After(out[j].UpdatedAt) })
	return out, nil
}

// LookupBySessionID returns the entry whose current session is sessionID.
func (s *Store) LookupBySessionID(ctx context.Context, sessionID string) (*session.SessionEntry, error) {
	rec, err := s.LookupIndex(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	e, _, err := s.Get(ctx, rec.Lane)
	if err != nil {
		return nil, err
	}
	if e.SessionID != sessionID {
		return nil, fmt.Errorf("session id %s is not the active session of its lane: %w", sessionID, ErrNotFound)
	}
	return e, nil
}

// HasAnySessions reports whether any session was ever created (the index
// remembers sessions whose lanes were since pruned).
func (s *Store) HasAnySessions(ctx context.Context) (bool, error) {
	st, err := s.index.Status(ctx)
	if err != nil {
		return false, err
	}
	if st.Values() > 0 {
		return true, nil
	}
	st, err = s.sessions.Status(ctx)
	if err != nil {
		return false, err
	}
	return st.Values() > 0, nil
}
