package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
)

// MigrateOptions tune MigrateInbox.
type MigrateOptions struct {
	// Batch is how many partitions move at once (default 8): their
	// publishes wait while their old stream drains.
	Batch int
	// DrainTimeout bounds the wait for one batch's messages in the old
	// stream to be committed (default 2m); past it the batch is reopened
	// where it was and the migration stops with an error.
	DrainTimeout time.Duration
	// Log receives progress (nil: none).
	Log *slog.Logger
}

// MigrateReport says what a migration did.
type MigrateReport struct {
	From  int `json:"from"`
	To    int `json:"to"`
	Moved int `json:"moved"`
	// Drain is the longest time one batch waited for its old stream's
	// messages to be committed.
	Drain time.Duration `json:"drain_ns"`
	// Took is the whole migration.
	Took time.Duration `json:"took_ns"`
}

// ErrMapChanged is returned when someone else changed the inbox map during
// a migration (another migration).
var ErrMapChanged = errors.New("the inbox map changed under the migration (another migration running?)")

// MigrateInbox changes the number of inbox streams of a running fleet to
// target, losing nothing. Partitions move in batches; each move is
//
//  1. close: the map marks the partition moving and its stream stops taking
//     its subject (publishes to it wait: the ingress and the workers retry
//     while no stream answers);
//  2. drain: wait until every lane of the partition in the old stream has
//     committed its last message there (its workers go on reading the old
//     stream, which the map still names);
//  3. flip: the map names the new stream; owners bound to the old one
//     release the lane when idle;
//  4. purge the partition from the old stream (all of it committed), so a
//     stream only ever holds messages of the partitions assigned to it;
//  5. open: the new stream takes the subject, the map drops the move.
//
// Every step is written to the map first (by compare-and-set), so a
// migration stopped anywhere is finished by running it again with the same
// target. Streams are added before partitions move in and deleted after
// the last one moved out.
func (f *Fleet) MigrateInbox(ctx context.Context, target int, o MigrateOptions) (MigrateReport, error) {
	start := time.Now()
	if o.Batch <= 0 {
		o.Batch = 8
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = 2 * time.Minute
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if target < 1 || target > broker.MaxInboxStreams {
		return MigrateReport{}, fmt.Errorf("inbox streams %d: want 1 to %d", target, broker.MaxInboxStreams)
	}
	bucket, err := f.JS.KeyValue(ctx, f.Names.InboxMapBucket())
	if err != nil {
		return MigrateReport{}, fmt.Errorf("inbox map bucket: %w (provision the fleet with this version first)", err)
	}
	mg := &migration{f: f, bucket: bucket, o: o, log: log}
	if err := mg.load(ctx); err != nil {
		return MigrateReport{}, err
	}
	rep := MigrateReport{From: mg.m.Streams, To: target}
	if mg.m.From != 0 {
		rep.From = mg.m.From
	}
	if mg.m.Target != 0 && mg.m.Target != target {
		return rep, fmt.Errorf("a migration to %d streams is under way: finish it first (fleetctl inbox streams %d)", mg.m.Target, mg.m.Target)
	}
	if !mg.m.Migrating() && mg.m.Streams == target {
		rep.Took = time.Since(start)
		return rep, nil
	}

	// A migration stopped half-way finishes its moves first.
	if len(mg.m.Moving) > 0 {
		d, err := mg.move(ctx, mg.m.Moving)
		if err != nil {
			return rep, err
		}
		rep.Moved += len(d.moved)
		rep.Drain = max(rep.Drain, d.drain)
	}

	// Grow: add the new streams (parked: no partition yet), and give every
	// stream its exact subjects (a one-stream fleet takes the wildcard).
	old := mg.m.Streams
	if target > old {
		next := mg.m.Clone()
		next.Streams, next.Target, next.From = target, target, rep.From
		model, err := f.JS.Stream(ctx, f.Names.InboxStreamAt(0))
		if err != nil {
			return rep, err
		}
		for i := old; i < target; i++ {
			if err := broker.AddInboxStream(ctx, f.JS, f.Names, next, i, model); err != nil {
				return rep, err
			}
		}
		for i := 0; i < old; i++ {
			if err := broker.SetInboxSubjects(ctx, f.JS, f.Names, next, i); err != nil {
				return rep, err
			}
		}
		if err := mg.write(ctx, next); err != nil {
			return rep, err
		}
	} else if mg.m.Target != target {
		next := mg.m.Clone()
		next.Target, next.From = target, rep.From
		if err := mg.write(ctx, next); err != nil {
			return rep, err
		}
	}
	log.Info("inbox migration", slog.Int("from", old), slog.Int("to", target))

	want := broker.DefaultInboxMap(target)
	var moves []broker.Move
	for p, s := range mg.m.Assign {
		if s != want.Assign[p] {
			moves = append(moves, broker.Move{P: p, From: s, To: want.Assign[p]})
		}
	}
	for len(moves) > 0 {
		n := min(o.Batch, len(moves))
		d, err := mg.move(ctx, moves[:n])
		if err != nil {
			return rep, err
		}
		rep.Moved += len(d.moved)
		rep.Drain = max(rep.Drain, d.drain)
		moves = moves[n:]
	}

	// Shrink: the streams past target hold nothing now.
	final := mg.m.Clone()
	final.Streams, final.Target, final.From = target, 0, 0
	if target == 1 && mg.m.Streams > 1 {
		// Back to the layout of a one-stream fleet.
		if err := broker.SetInboxSubjects(ctx, f.JS, f.Names, final, 0); err != nil {
			return rep, err
		}
	}
	prev := mg.m.Streams
	if err := mg.write(ctx, final); err != nil {
		return rep, err
	}
	for i := target; i < prev; i++ {
		name := f.Names.InboxStreamAt(i)
		if st, err := f.JS.Stream(ctx, name); err == nil {
			if info, err := st.Info(ctx); err == nil && info.State.Msgs > 0 {
				return rep, fmt.Errorf("inbox stream %s still holds %d messages after its partitions moved: left in place", name, info.State.Msgs)
			}
		}
		if err := f.JS.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return rep, fmt.Errorf("delete the emptied inbox stream %s: %w", name, err)
		}
	}
	rep.Took = time.Since(start)
	log.Info("inbox migration done", slog.Int("streams", target), slog.Int("moved", rep.Moved), slog.Duration("took", rep.Took))
	return rep, nil
}

type migration struct {
	f      *Fleet
	bucket jetstream.KeyValue
	o      MigrateOptions
	log    *slog.Logger
	m      broker.InboxMap
	rev    uint64
}

func (mg *migration) load(ctx context.Context) error {
	m, rev, err := broker.ReadInboxMap(ctx, mg.bucket)
	if err != nil {
		return fmt.Errorf("read inbox map: %w", err)
	}
	mg.m, mg.rev = m, rev
	return nil
}

// write stores next over the revision last read or written.
func (mg *migration) write(ctx context.Context, next broker.InboxMap) error {
	if err := next.Validate(); err != nil {
		return err
	}
	rev, err := mg.bucket.Update(ctx, broker.InboxMapKey, next.Encode(), mg.rev)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) || strings.Contains(err.Error(), "wrong last sequence") {
			return fmt.Errorf("%w: %v", ErrMapChanged, err)
		}
		return fmt.Errorf("write inbox map: %w", err)
	}
	mg.m, mg.rev = next, rev
	return nil
}

type moveResult struct {
	moved []broker.Move
	drain time.Duration
}

// move runs the five steps of MigrateInbox for a batch (moves already
// flipped, from a migration stopped half-way, skip to the purge).
func (mg *migration) move(ctx context.Context, batch []broker.Move) (moveResult, error) {
	f := mg.f
	var res moveResult
	// 1. close.
	next := mg.m.Clone()
	next.Moving = append([]broker.Move(nil), batch...)
	if err := mg.write(ctx, next); err != nil {
		return res, err
	}
	froms := map[int]bool{}
	for _, mv := range batch {
		froms[mv.From] = true
	}
	for i := range froms {
		if err := broker.SetInboxSubjects(ctx, f.JS, f.Names, mg.m, i); err != nil {
			return res, err
		}
	}
	// 2. drain.
	began := time.Now()
	var pending []broker.Move
	for _, mv := range batch {
		if mg.m.Assign[mv.P] == mv.From {
			pending = append(pending, mv)
		}
	}
	if err := mg.drain(ctx, pending); err != nil {
		// Reopen where they were: nothing moved.
		back := mg.m.Clone()
		back.Moving = nil
		for _, mv := range batch {
			back.Assign[mv.P] = mv.From
		}
		if werr := mg.write(context.WithoutCancel(ctx), back); werr == nil {
			for i := range froms {
				_ = broker.SetInboxSubjects(context.WithoutCancel(ctx), f.JS, f.Names, mg.m, i)
			}
		}
		return res, err
	}
	res.drain = time.Since(began)
	// 3. flip.
	next = mg.m.Clone()
	for _, mv := range batch {
		next.Assign[mv.P] = mv.To
	}
	if err := mg.write(ctx, next); err != nil {
		return res, err
	}
	// 4. purge.
	for _, mv := range batch {
		st, err := f.JS.Stream(ctx, f.Names.InboxStreamAt(mv.From))
		if err != nil {
			return res, err
		}
		if err := st.Purge(ctx, jetstream.WithPurgeSubject(f.Names.InboxPartitionSubject(mv.P))); err != nil {
			return res, fmt.Errorf("purge partition %d from %s: %w", mv.P, f.Names.InboxStreamAt(mv.From), err)
		}
	}
	// 5. open.
	next = mg.m.Clone()
	next.Moving = nil
	tos := map[int]bool{}
	for _, mv := range batch {
		tos[mv.To] = true
	}
	for i := range tos {
		if err := broker.SetInboxSubjects(ctx, f.JS, f.Names, next, i); err != nil {
			return res, err
		}
	}
	if err := mg.write(ctx, next); err != nil {
		return res, err
	}
	res.moved = batch
	mg.log.Info("inbox partitions moved", slog.Int("partitions", len(batch)), slog.Duration("drain", res.drain))
	return res, nil
}

// drain waits until every lane of each move's partition has committed its
// last message in the move's old stream.
func (mg *migration) drain(ctx context.Context, moves []broker.Move) error {
	ctx, cancel := context.WithTimeout(ctx, mg.o.DrainTimeout)
	defer cancel()
	f := mg.f
	done := map[string]uint64{} // subject -> last seq known committed
	for {
		left := 0
		var firstLeft string
		for _, mv := range moves {
			st, err := f.JS.Stream(ctx, f.Names.InboxStreamAt(mv.From))
			if err != nil {
				return err
			}
			id := st.CachedInfo().Config.Metadata[broker.InboxIDMetadata]
			info, err := st.Info(ctx, jetstream.WithSubjectFilter(f.Names.InboxPartitionSubject(mv.P)))
			if err != nil {
				return drainErr(ctx, err)
			}
			prefix := fmt.Sprintf("%s.in.%d.", f.Names.Prefix(), mv.P)
			for subj := range info.State.Subjects {
				last, err := st.GetLastMsgForSubject(ctx, subj)
				if errors.Is(err, jetstream.ErrMsgNotFound) {
					continue // purged since (pruned)
				}
				if err != nil {
					return drainErr(ctx, err)
				}
				if done[subj] >= last.Sequence {
					continue
				}
				lane := strings.TrimPrefix(subj, prefix)
				e, _, err := f.Store.Get(ctx, lane)
				if err != nil && !errors.Is(err, kv.ErrNotFound) {
					return drainErr(ctx, err)
				}
				if e != nil && e.InboxID == id && e.CommittedSeq >= last.Sequence {
					done[subj] = last.Sequence
					continue
				}
				left++
				firstLeft = lane
			}
		}
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drain: %d lanes still have uncommitted messages in their old stream (e.g. %s) after %s: the batch was reopened where it was; retry later or with a longer --drain-timeout: %w",
				left, firstLeft, mg.o.DrainTimeout, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func drainErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("drain: %w", ctx.Err())
	}
	return fmt.Errorf("drain: %w", err)
}
