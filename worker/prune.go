package worker

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
)

// Prune deletes entries not updated for session_store_max_age_days: the
// lane's inbox is purged up to committed_seq, then the entry is deleted at
// the revision read, only when no lease is held and no turn is set. The
// candidates' round trips run on a bounded pool, as in Sweep; each entry's
// own steps stay in order (read, purge, then the CAS delete).
func (w *Worker) Prune(ctx context.Context) (int, error) {
	cutoff := w.cfg.Now().Add(-time.Duration(w.cfg.MaxAgeDays) * 24 * time.Hour)
	// The live leases, listed at the first candidate (most prunes have
	// none). A lane taken after the listing is no worse off than with a
	// check of its lease right before the delete: its new owner writes
	// owner and epoch into the entry right after taking the lease, so the
	// delete at the revision read here fails unless it lands between those
	// two writes (the window such a check leaves open too), and the purge
	// only removes messages at or below the committed_seq read here, which
	// no owner reads again.
	// The streams' identities, read now: an entry's committed_seq counts
	// in the incarnation its inbox_id names, and a purge by name reaches
	// whatever incarnation is there (one made again since this worker
	// last looked would lose unread messages).
	// A stream whose identity could not be read is left alone this pass.
	var unread map[int]bool
	for _, in := range w.inboxes.All() {
		if _, err := w.inboxes.Reopen(ctx, in, false); err != nil {
			if ctx.Err() != nil {
				return 0, err
			}
			w.log.Warn("prune: inbox stream's identity not read: its lanes wait for the next pass", slog.String("stream", in.Name), slog.Any("error", err))
			if unread == nil {
				unread = map[int]bool{}
			}
			unread[in.Index] = true
		}
	}
	var held map[string]struct{}
	p := newSweepPool(ctx, sweepWorkers)
	err := w.store.Each(ctx, func(r kv.Record) error {
		e := r.Entry
		if err := p.ctx.Err(); err != nil {
			return err
		}
		if e.Suspended || e.Turn != nil || e.Owner != "" || !e.UpdatedAt.Before(cutoff) {
			return nil
		}
		if unread[w.inboxes.ForLane(r.Lane).Index] {
			return nil
		}
		if held == nil {
			var err error
			if held, err = w.leases.Live(p.ctx); err != nil {
				return err
			}
		}
		if _, ok := held[r.Lane]; ok {
			return nil
		}
		return p.submit(func(ctx context.Context) (bool, error) { return w.pruneEntry(ctx, r) })
	})
	return p.wait(err)
}

// pruneEntry deletes an old entry with no live lease unless its inbox holds
// unprocessed work, and reports whether it deleted it.
func (w *Worker) pruneEntry(ctx context.Context, r kv.Record) (bool, error) {
	e := r.Entry
	subject := w.names.InboxSubject(session.Partition(w.names.Prefix(), r.Lane), r.Lane)
	in := w.inboxes.ForLane(r.Lane)
	if in.Stale() {
		// Being recreated: a purge by its name would reach the new
		// incarnation, whose seqs committed_seq does not count.
		return false, nil
	}
	if last, err := in.Stream.GetLastMsgForSubject(ctx, subject); err == nil && last.Sequence > e.CommittedSeq {
		return false, nil // unprocessed work: not prunable
	}
	if e.InboxID == in.ID && e.CommittedSeq > 0 {
		if err := in.Stream.Purge(ctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(e.CommittedSeq+1)); err != nil {
			return false, err
		}
	}
	if err := w.store.Delete(ctx, r.Lane, r.Revision); err != nil {
		if errors.Is(err, kv.ErrRevisionMismatch) {
			return false, nil
		}
		return false, err
	}
	w.event("pruned", r.Lane, map[string]any{"session_id": e.SessionID, "updated_at": e.UpdatedAt})
	return true, nil
}
