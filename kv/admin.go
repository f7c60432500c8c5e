package kv

import (
	"context"
	"sort"
	"time"

	"github.com/agentfleet/agentfleet/session"
)

// The operator's whole-bucket operations (fleetctl). Everything that
// changes one lane goes through its owner instead: the worker's owner layer
// writes with Mutate under the lane's fence.

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
