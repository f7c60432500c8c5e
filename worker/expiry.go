package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
)

// markerReasonMaxAge is the Nats-Marker-Reason of the marker the server
// writes when a key's per-message TTL runs out: a lease that expired, as
// opposed to one released (a purge by its owner) or renewed.
const markerReasonMaxAge = "MaxAge"

// watchLeaseExpiries runs while this worker leads the expiry watcher, until
// ctx ends: it follows the leases bucket (headers only) and, for every lane
// lease that expired, wakes the lane at once if it has work (a turn in
// flight, or messages above its committed seq). Without it, a dead owner's
// lane resumes when one of its deliveries comes back (the consumer's
// AckWait after the owner's last renewal); with it, as soon as the lease
// is gone. The sweep remains the backstop for lanes whose expiry happened
// while no worker led.
func (w *Worker) watchLeaseExpiries(ctx context.Context) error {
	bucket := w.names.LeasesBucket()
	prefix := "$KV." + bucket + "."
	cons, err := w.js.OrderedConsumer(ctx, "KV_"+bucket, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{prefix + ">"},
		DeliverPolicy:  jetstream.DeliverNewPolicy,
		HeadersOnly:    true,
	})
	if err != nil {
		return fmt.Errorf("follow lease expiries: %w", err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("follow lease expiries: %w", err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	var rewakes sync.WaitGroup
	defer rewakes.Wait()
	// Markers from before this follow began (a new leader; a restart
	// after a failure) are not seen: catch up with the lanes of every
	// worker whose liveness lease is gone.
	if w.wakeOrphansAs(ctx, "", "") > 0 {
		rewakes.Add(1)
		go func() { defer rewakes.Done(); w.rewakeOrphans(ctx, "") }()
	}
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("follow lease expiries: %w", err)
		}
		if msg.Headers().Get(jetstream.MarkerReasonHeader) != markerReasonMaxAge {
			continue
		}
		lane := strings.TrimPrefix(msg.Subject(), prefix)
		if strings.HasPrefix(lane, kv.LivenessKeyPrefix) {
			// A worker's liveness lease expired: its lane leases are
			// void, wake its lanes that have work.
			if w.wakeOrphansAs(ctx, lane, "") > 0 {
				rewakes.Add(1)
				go func() { defer rewakes.Done(); w.rewakeOrphans(ctx, lane) }()
			}
			continue
		}
		if lane == "" || lane == w.names.WatcherLeaseKey() {
			continue
		}
		woke, err := w.wakeIfStranded(ctx, lane)
		switch {
		case err != nil && ctx.Err() == nil:
			w.log.Warn("wake after lease expiry", slog.String("lane", lane), slog.Any("error", err))
		case woke:
			w.log.Info("lease expired with work pending: lane woken", slog.String("lane", lane))
			w.stats.ExpiryWakes.Add(1)
		}
	}
}

// wakeOrphansAs wakes the lanes with work whose lease is bound to a
// liveness lease that is gone (their owner died): those of the owner of
// liveKey, or of every dead owner when liveKey is empty. The worker that
// takes the wake-up takes the lease over (kv.Leases.AcquireBound).
//
// again is a suffix for the wake-ups' Msg-Ids (rewakeOrphans wakes the same
// state again). It returns how many lanes it woke.
func (w *Worker) wakeOrphansAs(ctx context.Context, liveKey, again string) int {
	n := 0
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	lanes, err := w.leases.Orphans(lctx, liveKey)
	cancel()
	if err != nil && ctx.Err() == nil {
		w.log.Warn("list the lanes of dead workers", slog.Any("error", err))
	}
	for _, lane := range lanes {
		woke, err := w.wakeLaneAs(ctx, lane, false, again)
		switch {
		case err != nil && ctx.Err() == nil:
			w.log.Warn("wake after the owner's liveness expired", slog.String("lane", lane), slog.Any("error", err))
		case woke:
			n++
			w.log.Info("owner's liveness lease expired with work pending: lane woken", slog.String("lane", lane), slog.Bool("again", again != ""))
			w.stats.ExpiryWakes.Add(1)
		}
	}
	return n
}

// rewakeOrphans wakes once more, after pullExpiry, the lanes of a dead
// owner (liveKey, or all) that are still not taken over. A worker that is
// paused or hung rather than dead keeps its connection, and the pull
// request it had pending may have taken the first wake-up (to be
// redelivered only after the consumer's AckWait); by now that request has
// expired, so the second one reaches a live worker.
func (w *Worker) rewakeOrphans(ctx context.Context, liveKey string) {
	t := time.NewTimer(pullExpiry + time.Second)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	w.wakeOrphansAs(ctx, liveKey, ":again")
}

// wakeIfStranded publishes an internal wake-up into a lane that no worker
// holds and that has work (see wakeStranded).
func (w *Worker) wakeIfStranded(ctx context.Context, lane string) (bool, error) {
	return w.wakeLane(ctx, lane, true)
}

// wakeLane is wakeIfStranded; with free=false the lane's lease is not
// looked at (it is known to be void).
func (w *Worker) wakeLane(ctx context.Context, lane string, free bool) (bool, error) {
	return w.wakeLaneAs(ctx, lane, free, "")
}

// wakeLaneAs is wakeLane with a suffix for the wake-up's Msg-Id.
func (w *Worker) wakeLaneAs(ctx context.Context, lane string, free bool, again string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if free {
		if _, _, err := w.leases.Holder(ctx, lane); err == nil {
			return false, nil // taken again already: its owner sees the work
		} else if !errors.Is(err, kv.ErrNotFound) {
			return false, err
		}
	}
	e, _, err := w.store.Get(ctx, lane)
	switch {
	case errors.Is(err, kv.ErrNotFound):
		// A lane whose first message never got an entry: the session key
		// is in the message.
		last, err := w.inboxes.ForLane(lane).Stream.GetLastMsgForSubject(ctx, w.names.InboxSubject(session.Partition(w.names.Prefix(), lane), lane))
		if err != nil || last.Header.Get(broker.HdrSessionKey) == "" {
			return false, nil
		}
		e = &session.SessionEntry{SessionKey: last.Header.Get(broker.HdrSessionKey)}
	case err != nil:
		return false, err
	}
	return w.wakeStrandedAs(ctx, lane, e, again)
}

// wakeStranded publishes an internal wake-up into a lane, known to have no
// live lease, when it has work: a turn in flight, an automatic resume due,
// or inbox messages above
// its committed seq (any, when the entry counts in another inbox). The
// Msg-Id is the same for the sweep and the expiry watch, so the two never
// wake a lane twice for the same state. It reports whether it woke the lane.
func (w *Worker) wakeStranded(ctx context.Context, lane string, e *session.SessionEntry) (bool, error) {
	return w.wakeStrandedAs(ctx, lane, e, "")
}

// wakeStrandedAs is wakeStranded with a suffix for the wake-up's Msg-Id.
func (w *Worker) wakeStrandedAs(ctx context.Context, lane string, e *session.SessionEntry, again string) (bool, error) {
	// A turn in flight, or a session due an automatic resume (marked
	// resume_pending with no turn: fleetctl session suspend-recent after an
	// unclean stop of the whole fleet), is work.
	stranded := e.Turn != nil || autoResumeDue(e, w.cfg.Now(), w.cfg.Freshness)
	if !stranded {
		subject := w.names.InboxSubject(session.Partition(w.names.Prefix(), lane), lane)
		in := w.inboxes.ForLane(lane)
		last, err := in.Stream.GetLastMsgForSubject(ctx, subject)
		if err == nil && (e.InboxID != in.ID || last.Sequence > e.CommittedSeq) {
			stranded = true
		}
	}
	if !stranded {
		return false, nil
	}
	if err := w.publishInternal(ctx, lane, e.SessionKey, session.CmdWake, "", WakeMsgID(lane, e.CommittedSeq, e.LeaseEpoch)+again); err != nil {
		return false, err
	}
	return true, nil
}
