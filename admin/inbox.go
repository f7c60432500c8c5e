package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
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
	// (each partition in the one stream that can take it) and the migration
	// stops with an error.
	DrainTimeout time.Duration
	// RetryWait bounds how long one step of the migration retries a
	// JetStream call that failed on a transient error (a leader election,
	// "JetStream system temporarily unavailable", a timeout; default 1m),
	// counted from its first failure: the work an attempt did before it
	// failed does not count.
	// Past it the migration stops with the error, as an interruption
	// would: running the command again finishes it.
	RetryWait time.Duration
	// Log receives progress (nil: none).
	Log *slog.Logger

	// Test hooks. step runs after each step the migration takes (the
	// names are the step constants below); an error stops the migration
	// there, as a kill would. beforeMark runs just before a drain marker
	// is published into stream i: what the server applies before the
	// marker (a publish it accepted before the close) is stored there.
	step       func(name string) error
	beforeMark func(stream int)
	// attempt bounds one attempt of a call retried on transient errors
	// (default attemptTimeout).
	attempt time.Duration
}

// The steps of a migration, as the step test hook names them, in the order
// a migration meets them.
const (
	stepGrown         = "grown"           // new streams added, the old ones on exact subjects; the map not yet written
	stepGrowWritten   = "grow-written"    // the map names the new streams
	stepClosed        = "closed"          // close: the map marks the batch moving
	stepCloseSubjects = "close-subjects"  // close: neither the old nor the new streams take the batch's subjects
	stepMarked        = "marked"          // drain markers in the old streams
	stepDrained       = "drained"         // every message of the batch up to its marker committed
	stepFlipped       = "flipped"         // the map names the new streams, with the purge bounds
	stepPurged        = "purged"          // the batch's partitions purged from their old streams
	stepOpenSubjects  = "open-subjects"   // open: the new streams take the batch's subjects; the map not yet written
	stepOpened        = "opened"          // open: the map drops the moves
	stepShrinkSubject = "shrink-subjects" // back to one stream: it takes the wildcard; the map not yet written
	stepFinal         = "final"           // the map has the target count; the emptied streams not yet deleted
)

// MigrateReport says what a migration did.
type MigrateReport struct {
	From int `json:"from"`
	To   int `json:"to"`
	// Moved counts the partition moves made, each time a partition moved
	// again (see strays) included.
	Moved int `json:"moved"`
	// Strays counts the partitions found with messages left in a stream
	// the map does not assign them to (see strays), each time one was
	// found; each is answered by moving its partition again (counted in
	// Moved), or the command fails with ErrInBothStreams. A run at the
	// fleet's count moves nothing else: it only looks for these.
	Strays int `json:"strays"`
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
//  1. close: the map marks the partition moving, and neither its old nor
//     its new stream takes its subject (publishes to it wait: the ingress
//     and the workers retry while no stream answers);
//  2. mark: a marker message goes into the old stream, on its control
//     subject; every message of the partition the old stream accepted
//     before the close is stored below the marker (see mark);
//  3. drain: wait until every message of the partition up to the marker
//     is committed (its workers go on reading the old stream, which the
//     map still names);
//  4. flip: the map names the new stream, with the marker as the purge
//     bound; owners bound to the old one release the lane when idle;
//  5. purge the partition from the old stream up to the bound, so a stream
//     only ever holds messages of the partitions assigned to it;
//  6. open: the new stream takes the subject, then the map drops the move;
//     a last look at the old stream moves the partition again if a message
//     of it was stored there after all (see strays).
//
// Every step is written to the map first (by compare-and-set), so a
// migration stopped anywhere is finished by running it again with the same
// target. Streams are added before partitions move in and deleted after
// the last one moved out.
//
// Run with the fleet's own count and no migration under way, it moves no
// partition to change the count: it only looks over every stream for
// messages left in one their partition is not assigned to (see strays),
// settles what it finds as a migration's last look does (the partition
// moved again, or ErrInBothStreams), and reports it (Strays). With nothing
// found that is a read of the map, two stream info requests per stream
// (see misplaced), one per stream index past the count up to
// broker.MaxInboxStreams (a look for streams a stopped run left, see
// leftovers), and no map write. Drain markers it sees left in a stream (by
// a run stopped before it purged them) it purges, as a migration purges
// every stream's at its end.
func (f *Fleet) MigrateInbox(ctx context.Context, target int, o MigrateOptions) (rep MigrateReport, err error) {
	start := time.Now()
	if o.Batch <= 0 {
		o.Batch = 8
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = 2 * time.Minute
	}
	if o.RetryWait <= 0 {
		o.RetryWait = defaultRetryWait
	}
	if o.attempt <= 0 {
		o.attempt = attemptTimeout
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if target < 1 || target > broker.MaxInboxStreams {
		return MigrateReport{}, fmt.Errorf("inbox streams %d: want 1 to %d", target, broker.MaxInboxStreams)
	}
	mg := &migration{f: f, o: o, log: log}
	bucket, err := retry(ctx, mg, "open the inbox map", func(ctx context.Context) (jetstream.KeyValue, error) {
		return f.JS.KeyValue(ctx, f.Names.InboxMapBucket())
	})
	if err != nil {
		return MigrateReport{}, fmt.Errorf("inbox map bucket: %w (provision the fleet with this version first)", err)
	}
	mg.bucket = bucket
	if err := mg.load(ctx); err != nil {
		return MigrateReport{}, err
	}
	rep = MigrateReport{From: mg.m.Streams, To: target}
	if mg.m.From != 0 {
		rep.From = mg.m.From
	}
	if mg.m.Target != 0 && mg.m.Target != target {
		return rep, fmt.Errorf("a migration to %d streams is under way: finish it first (fleetctl inbox streams %d)", mg.m.Target, mg.m.Target)
	}
	defer func() { rep.Strays = mg.found }()
	if !mg.m.Migrating() && mg.m.Streams == target {
		// Nothing to move: a look for messages left in streams their
		// partitions are not assigned to (see strays), answered as a
		// migration's last look answers them. It costs two stream info
		// requests per stream, and writes the map only when it finds one.
		if err := mg.lookAll(ctx, &rep); err != nil {
			return rep, err
		}
		// The moves' drain markers, and those a run stopped before its
		// purge of them left behind (the look saw them: a migration purges
		// every stream's at its end).
		for i := 0; i < mg.m.Streams; i++ {
			if rep.Moved == 0 && !mg.markers[i] {
				continue
			}
			if err := mg.purgeMarkers(ctx, i); err != nil {
				return rep, err
			}
		}
		// A migration stopped after its last map write leaves its emptied
		// streams behind. Their delete is the one step the map's
		// compare-and-set does not guard: the map is written first
		// (unchanged), so that a migration that has just added streams past
		// target and not yet written its map fails that write (ErrMapChanged)
		// instead of naming streams deleted here.
		left, err := mg.leftovers(ctx, target)
		if err != nil {
			return rep, err
		}
		if left {
			if err := mg.write(ctx, mg.m.Clone()); err != nil {
				return rep, err
			}
			if err := mg.deleteFrom(ctx, target); err != nil {
				return rep, err
			}
		}
		rep.Took = time.Since(start)
		return rep, nil
	}

	// A migration stopped half-way finishes its moves first.
	if len(mg.m.Moving) > 0 {
		d, err := mg.move(ctx, mg.m.Moving)
		rep.Moved += d.moved
		rep.Drain = max(rep.Drain, d.drain)
		if err != nil {
			return rep, err
		}
	}
	// A first look for messages left in the streams partitions moved out of
	// (see strays): one an earlier migration's last look missed must not be
	// in a stream its partition moves into now, where its lanes would read
	// it first, after their newer messages.
	if err := mg.lookAll(ctx, &rep); err != nil {
		return rep, err
	}

	// Grow: add the new streams (parked: no partition yet), and give every
	// stream its exact subjects (a one-stream fleet takes the wildcard).
	old := mg.m.Streams
	if target > old {
		next := mg.m.Clone()
		next.Streams, next.Target, next.From = target, target, rep.From
		model, err := mg.stream(ctx, f.Names.InboxStreamAt(0))
		if err != nil {
			return rep, err
		}
		for i := old; i < target; i++ {
			// Creates the stream and its consumer, or checks them.
			if err := retryDo(ctx, mg, "add "+f.Names.InboxStreamAt(i), func(ctx context.Context) error {
				return broker.AddInboxStream(ctx, f.JS, f.Names, next, i, model)
			}); err != nil {
				return rep, err
			}
		}
		for i := 0; i < old; i++ {
			if err := mg.setSubjects(ctx, next, i); err != nil {
				return rep, err
			}
		}
		if err := mg.step(stepGrown); err != nil {
			return rep, err
		}
		if err := mg.write(ctx, next); err != nil {
			return rep, err
		}
		if err := mg.step(stepGrowWritten); err != nil {
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
		rep.Moved += d.moved
		rep.Drain = max(rep.Drain, d.drain)
		if err != nil {
			return rep, err
		}
		moves = moves[n:]
	}

	// A last look for messages left in the streams partitions moved out
	// of (see strays).
	if err := mg.lookAll(ctx, &rep); err != nil {
		return rep, err
	}
	// The drain markers served their purpose.
	for i := 0; i < mg.m.Streams; i++ {
		if err := mg.purgeMarkers(ctx, i); err != nil {
			return rep, err
		}
	}
	// Shrink: the streams past target hold nothing now.
	final := mg.m.Clone()
	final.Streams, final.Target, final.From = target, 0, 0
	if target == 1 && mg.m.Streams > 1 {
		// Back to the layout of a one-stream fleet.
		if err := mg.setSubjects(ctx, final, 0); err != nil {
			return rep, err
		}
		if err := mg.step(stepShrinkSubject); err != nil {
			return rep, err
		}
	}
	if err := mg.write(ctx, final); err != nil {
		return rep, err
	}
	if err := mg.step(stepFinal); err != nil {
		return rep, err
	}
	if err := mg.deleteFrom(ctx, target); err != nil {
		return rep, err
	}
	rep.Took = time.Since(start)
	log.Info("inbox migration done", slog.Int("streams", target), slog.Int("moved", rep.Moved), slog.Duration("took", rep.Took))
	return rep, nil
}

// leftovers reports whether an inbox stream exists from index first on.
func (mg *migration) leftovers(ctx context.Context, first int) (bool, error) {
	for i := first; i < broker.MaxInboxStreams; i++ {
		name := mg.f.Names.InboxStreamAt(i)
		_, err := mg.stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("inbox stream %s: %w", name, err)
		}
		return true, nil
	}
	return false, nil
}

// deleteFrom deletes the inbox streams from index first on, which the map
// no longer names: each must hold nothing but drain markers.
func (mg *migration) deleteFrom(ctx context.Context, first int) error {
	f := mg.f
	for i := first; i < broker.MaxInboxStreams; i++ {
		name := f.Names.InboxStreamAt(i)
		_, err := mg.stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("inbox stream %s: %w", name, err)
		}
		if err := mg.purgeMarkers(ctx, i); err != nil {
			return err
		}
		st, err := mg.stream(ctx, name)
		if err != nil {
			return fmt.Errorf("inbox stream %s: %w", name, err)
		}
		if n := st.CachedInfo().State.Msgs; n > 0 {
			return fmt.Errorf("inbox stream %s still holds %d messages after its partitions moved: left in place", name, n)
		}
		if err := retryDo(ctx, mg, "delete "+name, func(ctx context.Context) error {
			return f.JS.DeleteStream(ctx, name)
		}); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("delete the emptied inbox stream %s: %w", name, err)
		}
	}
	return nil
}

// step runs the step test hook.
func (mg *migration) step(name string) error {
	if mg.o.step == nil {
		return nil
	}
	return mg.o.step(name)
}

type migration struct {
	f      *Fleet
	bucket jetstream.KeyValue
	o      MigrateOptions
	log    *slog.Logger
	m      broker.InboxMap
	rev    uint64
	found  int // partitions strays found in a stream not assigned to them
	// markers holds the streams the last look (misplaced) saw holding
	// messages on their control subject: drain markers.
	markers map[int]bool
}

// load reads the map from its stream's leader: a direct get may be answered
// by a replica that lags behind the last step written.
func (mg *migration) load(ctx context.Context) error {
	lm, err := retry(ctx, mg, "read the inbox map", func(ctx context.Context) (*broker.LeaderMsg, error) {
		bucket := mg.f.Names.InboxMapBucket()
		return broker.LeaderGet(ctx, mg.f.JS, "KV_"+bucket, broker.LeaderGetRequest{LastBySubject: "$KV." + bucket + "." + broker.InboxMapKey})
	})
	if err != nil {
		return fmt.Errorf("read inbox map: %w", err)
	}
	m, err := broker.DecodeInboxMap(lm.Data)
	if err != nil {
		return fmt.Errorf("read inbox map: %w", err)
	}
	mg.m, mg.rev = m, lm.Sequence
	return nil
}

// read reads the map's encoding and revision from its stream's leader,
// once.
func (mg *migration) read(ctx context.Context) ([]byte, uint64, error) {
	bucket := mg.f.Names.InboxMapBucket()
	lm, err := broker.LeaderGet(ctx, mg.f.JS, "KV_"+bucket, broker.LeaderGetRequest{LastBySubject: "$KV." + bucket + "." + broker.InboxMapKey})
	if err != nil {
		return nil, 0, err
	}
	return lm.Data, lm.Sequence, nil
}

// write stores next over the revision last read or written.
func (mg *migration) write(ctx context.Context, next broker.InboxMap) error {
	if err := next.Validate(); err != nil {
		return err
	}
	rev, err := mg.update(ctx, next)
	if err != nil {
		return err
	}
	mg.m, mg.rev = next, rev
	return nil
}

type moveResult struct {
	moved int // partition moves made: the batch once opened, and moves again (strays)
	drain time.Duration
}

// move runs the six steps of MigrateInbox for a batch. A batch of a
// migration stopped half-way keeps the time it closed, and its moves already
// flipped go on to the purge, bounded by the marker their drain recorded.
//
// The close takes the batch's subjects off its new streams too: a migration
// stopped between the open's subject change and its map write left them
// there, and a partition put back in its old stream (below) must not take
// publishes in two streams.
//
// A message of the partition found in the old stream past the purge bound
// (which the marker rules out, see mark) puts its partition back in its old
// stream (un-flipped, still closed) and the batch drains again, with a new
// marker, so it is answered there before the move ends; unless the new
// stream already holds messages of the partition: then the batch ends as
// in reopen, and that partition stays closed (ErrInBothStreams).
func (mg *migration) move(ctx context.Context, batch []broker.Move) (moveResult, error) {
	f := mg.f
	var res moveResult
	// 1. close.
	now := time.Now().UTC()
	next := mg.m.Clone()
	next.Moving = make([]broker.Move, len(batch))
	for i, mv := range batch {
		if mv.Closed.IsZero() {
			mv.Closed = now
		}
		next.Moving[i] = mv
	}
	if err := mg.write(ctx, next); err != nil {
		return res, err
	}
	if err := mg.step(stepClosed); err != nil {
		return res, err
	}
	for _, i := range streamsOf(batch, true, true) {
		if err := mg.setSubjects(ctx, mg.m, i); err != nil {
			return res, err
		}
	}
	if err := mg.step(stepCloseSubjects); err != nil {
		return res, err
	}
	began := time.Now()
	dctx, cancel := context.WithTimeout(ctx, mg.o.DrainTimeout)
	defer cancel()
	for round := 0; ; round++ {
		// 2. mark and 3. drain the moves still reading from their old
		// stream (and any flipped by a version that did not record the
		// drain's bound: it is verified again).
		var pending []broker.Move
		for _, mv := range mg.m.Moving {
			if !mg.m.Flipped(mv) || mv.Drained == nil {
				pending = append(pending, mv)
			}
		}
		if len(pending) > 0 {
			marks := map[int]uint64{}
			for _, i := range streamsOf(pending, true, false) {
				seq, err := mg.mark(dctx, i)
				if err != nil {
					return res, mg.reopen(ctx, err)
				}
				marks[i] = seq
			}
			if err := mg.step(stepMarked); err != nil {
				return res, err
			}
			bounds, err := mg.drain(dctx, pending, marks)
			if err != nil {
				return res, mg.reopen(ctx, err)
			}
			res.drain = time.Since(began)
			if err := mg.step(stepDrained); err != nil {
				return res, err
			}
			// A partition not yet flipped must find its new stream
			// holding nothing of it: a message left there (stored after
			// an earlier look for such messages, see strays) would be read
			// first by its lanes, which start the stream from its first
			// message, after their newer ones. (A flipped partition, of a
			// run stopped between an open's subject change and its map
			// write, may hold messages there: see the purge's residue.)
			// The batch is reopened, the partition in its old stream; the
			// first look of the command run again moves it as a stray.
			for _, mv := range pending {
				if mg.m.Flipped(mv) {
					continue
				}
				to := f.Names.InboxStreamAt(mv.To)
				seq, found, err := seqRetried(ctx, mg, "look at "+to, func(ctx context.Context) (uint64, bool, error) {
					return mg.purgeAnswered(ctx, mv.To, mv.P)
				})
				if err != nil {
					return res, mg.reopen(ctx, fmt.Errorf("partition %d in its new stream %s: %w", mv.P, to, err))
				}
				if found {
					return res, mg.reopen(ctx, fmt.Errorf("partition %d: its new stream %s holds message %d of it, stored there after an earlier look for such messages: the batch was reopened; run the command again, which looks at it first", mv.P, to, seq))
				}
			}
			// 4. flip, with each partition's purge bound.
			next := mg.m.Clone()
			for i, mv := range next.Moving {
				if b, ok := bounds[mv.P]; ok {
					next.Assign[mv.P] = mv.To
					next.Moving[i].Drained = &b
				}
			}
			if err := mg.write(ctx, next); err != nil {
				return res, err
			}
			if err := mg.step(stepFlipped); err != nil {
				return res, err
			}
		}
		// 5. purge, up to the bounds.
		residue, err := retryEach(ctx, mg, "purge", mg.purge)
		if err != nil {
			return res, err
		}
		if err := mg.step(stepPurged); err != nil {
			return res, err
		}
		if len(residue) == 0 {
			break
		}
		// Messages stored past the bound: back to the old stream, still
		// closed, and drain again; but, as in reopen, only when the new
		// stream holds nothing of the partition: its lanes may have
		// committed messages there, which back in the old stream would be
		// answered again, and the message left there after them. That takes
		// a run stopped between an open's subject change and its map write
		// (the new stream took publishes), or a partition moved again for a
		// message found in its old stream after its open (see strays),
		// whose lanes went on in the new stream. A partition with messages
		// in both streams stays closed.
		for p := range residue {
			mv := mg.m.Moving[slices.IndexFunc(mg.m.Moving, func(mv broker.Move) bool { return mv.P == p })]
			to := f.Names.InboxStreamAt(mv.To)
			_, found, err := nextOfRetried(ctx, mg, to, f.Names.InboxPartitionSubject(p), 1)
			if err != nil {
				return res, fmt.Errorf("partition %d in %s: %w (the batch stays closed until the command is run again)", p, to, err)
			}
			if found {
				return res, mg.reopen(ctx, fmt.Errorf("%w: partition %d, old stream %s, new stream %s (the batch was reopened; run the command again)",
					errPastBoundAndNew, p, f.Names.InboxStreamAt(mv.From), to))
			}
		}
		back := mg.m.Clone()
		for i, mv := range back.Moving {
			if residue[mv.P] {
				back.Assign[mv.P] = mv.From
				back.Moving[i].Drained = nil
			}
		}
		if err := mg.write(ctx, back); err != nil {
			return res, err
		}
		mg.log.Warn("inbox partitions got messages in their old stream past the drain's marker: drained again",
			slog.Int("partitions", len(residue)), slog.Int("round", round))
	}
	// 6. open: the new streams take the subjects, then the map says so (a
	// stop between the two is mended by the close of the re-run).
	opened := mg.m.Moving
	next = mg.m.Clone()
	next.Moving = nil
	for _, i := range streamsOf(batch, false, true) {
		if err := mg.setSubjects(ctx, next, i); err != nil {
			return res, err
		}
	}
	if err := mg.step(stepOpenSubjects); err != nil {
		return res, err
	}
	if err := mg.write(ctx, next); err != nil {
		return res, err
	}
	if err := mg.step(stepOpened); err != nil {
		return res, err
	}
	res.moved = len(batch)
	// A last look at the old streams (see strays).
	n, d, err := mg.strays(ctx, opened)
	res.moved += n
	res.drain = max(res.drain, d)
	if err != nil {
		return res, err
	}
	mg.log.Info("inbox partitions moved", slog.Int("partitions", len(batch)), slog.Duration("drain", res.drain))
	return res, nil
}

// strays looks once more, from the stream leaders, for messages of the
// partitions of moves (open in their new stream) in their old stream, and
// moves each partition found there again, as one whose purge found a
// message past its bound: closed, back to its old stream (if its new stream
// holds nothing of it yet), drained, flipped, purged and opened, o.Batch
// partitions at a time; it returns how many moves it made (those of moves
// again that found more included) and the longest drain.
//
// The marker bounds what the stream leader that answered the close can
// store of a closed partition (see mark). On a replicated stream, a replica
// that becomes leader before it applied the close still takes the
// partition's subject for that moment, and a publish retried to it is
// stored in the old stream past the marker; stored after the purge's last
// check, it would stay there unanswered (the partition's lanes are read
// from the new stream). The migration looks after each batch's open and,
// for every stream and every partition assigned to another one, once at
// its start (a message an earlier migration's last look missed: its
// partition may be about to move back into that stream, where its lanes
// would read it first, after their newer messages) and once more before its
// last map write (which also covers a run stopped between an open and its
// look); a run at the fleet's count only looks (see MigrateInbox). A partition with messages in both streams by then stays closed
// and the migration fails (ErrInBothStreams, see reopen): nothing is
// deleted or answered out of order by the migration itself. A message its
// lane committed in the old stream (an owner still bound there) is purged
// (see purge).
func (mg *migration) strays(ctx context.Context, moves []broker.Move) (int, time.Duration, error) {
	f := mg.f
	var again []broker.Move
	for _, mv := range moves {
		if slices.ContainsFunc(again, func(a broker.Move) bool { return a.P == mv.P }) {
			continue // the next look finds the other stream
		}
		name := f.Names.InboxStreamAt(mv.From)
		seq, found, err := nextOfRetried(ctx, mg, name, f.Names.InboxPartitionSubject(mv.P), 1)
		if err != nil {
			return 0, 0, fmt.Errorf("partition %d in its old stream %s after its move: %w (run the command again: it looks again)", mv.P, name, err)
		}
		if found {
			mg.found++
			mg.log.Warn("inbox partition has a message in its old stream after its move: moved again", slog.Int("partition", mv.P),
				slog.String("stream", name), slog.Uint64("seq", seq), slog.String("new_stream", f.Names.InboxStreamAt(mv.To)))
			var zero uint64
			again = append(again, broker.Move{P: mv.P, From: mv.From, To: mv.To, Drained: &zero})
		}
	}
	moved := 0
	var drain time.Duration
	for len(again) > 0 {
		n := min(mg.o.Batch, len(again))
		d, err := mg.move(ctx, again[:n])
		moved += d.moved
		drain = max(drain, d.drain)
		if err != nil {
			return moved, drain, fmt.Errorf("partitions %v had a message in their old stream after their move: %w", partitionsOf(again[:n]), err)
		}
		again = again[n:]
	}
	return moved, drain, nil
}

// lookAll runs strays over every stream's misplaced partitions until it
// finds none, adding its moves and drains to rep.
func (mg *migration) lookAll(ctx context.Context, rep *MigrateReport) error {
	for {
		moves, err := retryEach(ctx, mg, "look at the inbox streams", mg.misplaced)
		if err != nil {
			return err
		}
		n, d, err := mg.strays(ctx, moves)
		rep.Moved += n
		rep.Drain = max(rep.Drain, d)
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
	}
}

// misplaced lists, as moves, the open partitions that a stream holds
// messages of while the map assigns them to another stream, for strays
// (which confirms each from the stream's leader). Two requests per stream:
// its info (binding it), then its info with the subjects under the fleet's
// prefix and their message counts (the inbox subjects, and the stream's
// control subject); the stream's leader answers them but for a group
// without one, so strays' look can miss a message only a replica that lags
// has not stored yet. It also notes in mg.markers the streams that hold
// messages on their control subject: drain markers. The subjects and their
// counts come in one answer, so a publish or a delete of an inbox message
// meanwhile cannot make a marker seen or missed.
func (mg *migration) misplaced(ctx context.Context) ([]broker.Move, error) {
	f := mg.f
	var out []broker.Move
	markers := map[int]bool{}
	for i := 0; i < mg.m.Streams; i++ {
		name := f.Names.InboxStreamAt(i)
		_, info, err := mg.streamInfo(ctx, name, f.Names.Prefix()+".>")
		if err != nil {
			return nil, fmt.Errorf("inbox stream %s: %w", name, err)
		}
		if info.State.Subjects[f.Names.InboxControlSubject(i)] > 0 {
			markers[i] = true
		}
		var ps []int
		for subj := range info.State.Subjects {
			p, ok := partitionOf(f.Names, subj)
			if !ok || p >= len(mg.m.Assign) || mg.m.Assign[p] == i || !mg.m.IsOpen(p) || slices.Contains(ps, p) {
				continue
			}
			ps = append(ps, p)
		}
		slices.Sort(ps)
		for _, p := range ps {
			out = append(out, broker.Move{P: p, From: i, To: mg.m.Assign[p]})
		}
	}
	mg.markers = markers
	return out, nil
}

// partitionOf is the partition of an inbox subject (<prefix>.in.<p>.<lane>).
func partitionOf(names broker.Names, subj string) (int, bool) {
	rest, ok := strings.CutPrefix(subj, names.Prefix()+".in.")
	if !ok {
		return 0, false
	}
	ps, _, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, false
	}
	p, err := strconv.Atoi(ps)
	if err != nil || p < 0 {
		return 0, false
	}
	return p, true
}

func partitionsOf(moves []broker.Move) []int {
	out := make([]int, len(moves))
	for i, mv := range moves {
		out[i] = mv.P
	}
	return out
}

// streamsOf lists, in order, the old (from) and/or new (to) streams of moves.
func streamsOf(moves []broker.Move, from, to bool) []int {
	var out []int
	for _, mv := range moves {
		if from {
			out = append(out, mv.From)
		}
		if to {
			out = append(out, mv.To)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// mark publishes a drain marker into inbox stream i, on its control
// subject, and returns the marker's seq: every message of a partition the
// close took off the stream's subjects that the stream accepted before the
// close is stored below it, so the marker bounds the drain and the purge.
//
// Why (nats-server v2.15, read from its source): a stream receives the
// publishes of its subjects through internal subscriptions, whose callback
// (processInboundJetStreamMsg) only queues the message on the stream's
// inbound queue (mset.msgs); one goroutine per stream (internalLoop) takes
// that queue in order. An R1 stream stores each message there
// (processJetStreamMsg, which does not check the subject against the
// stream's subjects again: a message queued before the close is stored
// after it), so the seqs follow the queue's order. A replicated stream's
// leader proposes each one there, in the same order, to the stream's raft
// group (processClusteredInboundMsg, commitSingleMsg: one proposal queue)
// and every replica stores them in the log's order. A proposal of a leader
// that lost its leadership is either in the new leader's log, before
// anything the new leader proposes (the marker included), or never
// committed (the publisher gets no ack and retries: into the closed
// partition, so it waits). The close's stream update removes the
// subscription before its answer is sent (updateWithAdvisory, then the
// stream leader answers: processClusterUpdateStream), and the marker is
// published after that answer, so it is queued after every publish the
// stream took for the closed subject. The one window left is a publish
// whose delivery passed the subscription's closed check (deliverMsg) just
// before the update and whose goroutine reaches the queue only after the
// update's answer and the marker's publish went over the network: the
// purge's check for messages past the bound (purge) catches it before the
// open, and the batch drains again. The argument holds for the leader that
// answered the close: a replica that becomes the stream's leader before it
// applied the close still takes the subject for that moment, and what it
// stores of the partition lands past the marker, maybe after the purge's
// check; the looks after the open (strays) are for that.
func (mg *migration) mark(ctx context.Context, i int) (uint64, error) {
	if mg.o.beforeMark != nil {
		mg.o.beforeMark(i)
	}
	name := mg.f.Names.InboxStreamAt(i)
	// A marker whose ack was lost may have been stored: the one retried is
	// stored above it, after the close as well, and bounds the drain
	// instead (the purge of the markers takes both). A publish no stream
	// answered (no responders: the stream's leader away) stored nothing.
	// retry is the one layer that makes the publish again, logging each
	// failure: the client's own retry on no responders is turned off, so
	// that it neither outlasts the attempt's bound nor hides the stall.
	ack, err := retry(ctx, mg, "drain marker into "+name, func(ctx context.Context) (*jetstream.PubAck, error) {
		return mg.f.JS.Publish(ctx, mg.f.Names.InboxControlSubject(i), []byte("drain marker"), jetstream.WithExpectStream(name),
			jetstream.WithRetryAttempts(0))
	})
	if err != nil {
		return 0, fmt.Errorf("drain marker into %s: %w", name, err)
	}
	return ack.Sequence, nil
}

// purgeMarkers removes the drain markers from inbox stream i.
func (mg *migration) purgeMarkers(ctx context.Context, i int) error {
	name := mg.f.Names.InboxStreamAt(i)
	return retryDo(ctx, mg, "purge the drain markers of "+name, func(ctx context.Context) error {
		st, err := mg.f.JS.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("inbox stream %s: %w", name, err)
		}
		if err := st.Purge(ctx, jetstream.WithPurgeSubject(mg.f.Names.InboxControlSubject(i))); err != nil {
			return fmt.Errorf("purge the drain markers of %s: %w", name, err)
		}
		return nil
	})
}

// reopen ends a batch whose drain (or marker) could not finish, leaving
// each of its partitions taken by exactly one stream and the map saying
// so:
//   - a partition the batch did not flip goes back to its old stream, which
//     holds all of its messages (nothing of it moved);
//   - a flipped partition with a recorded bound was drained up to its
//     marker: once purged up to it from its old stream (again: the purge
//     may not have run yet) with nothing left there, its new stream takes
//     it;
//   - a flipped partition with messages left in its old stream past its
//     bound goes back to its old stream when its new stream holds nothing
//     of it: no lane of it committed anything there, and the old stream
//     holds only what the purge left, none of it committed.
//
// A flipped partition with messages in both streams (which takes a message
// stored past its marker, and a migration stopped between an open's
// subject change and its map write, or a message stored in its old stream
// after the open, see strays) stays closed: no stream can take it without
// answering a message out of order or twice, and running the command again
// does not change that; the error (ErrInBothStreams) names the messages and
// what an operator can do. Only then is the error ErrInBothStreams: when
// reopen finds no such partition (the message was answered or removed
// since), it returns cause. A flipped partition whose new stream or old
// message could not be read stays closed too, until the command is run
// again (the error says why); so does one
// flipped by a version that recorded no bound: its old stream was never
// purged, and a lane taken there again would start from its first message
// (an owner binding to another stream reads it from the start), answering
// committed messages twice.
// The streams' subjects are set before the map is written, as in the open.
func (mg *migration) reopen(ctx context.Context, cause error) error {
	f := mg.f
	ctx = context.WithoutCancel(ctx)
	residue, err := retryEach(ctx, mg, "purge", mg.purge)
	if err != nil {
		return fmt.Errorf("%w (the batch could not be reopened: %v; it stays closed until the command is run again)", cause, err)
	}
	back := mg.m.Clone()
	back.Moving = nil
	var both, unread []string
	for _, mv := range mg.m.Moving {
		switch {
		case !mg.m.Flipped(mv):
		case mv.Drained == nil:
			back.Moving = append(back.Moving, mv)
		case !residue[mv.P]:
		default:
			var desc string
			found, err := retryEach(ctx, mg, "read "+f.Names.InboxStreamAt(mv.To), func(ctx context.Context) (found bool, err error) {
				desc, found, err = mg.inBoth(ctx, mv)
				return found, err
			})
			if err != nil {
				mg.log.Warn("inbox partition with a message past its drain's bound stays closed", slog.Int("partition", mv.P), slog.Any("error", err))
				unread = append(unread, fmt.Sprintf("partition %d: %v", mv.P, err))
			}
			if err != nil || found {
				back.Moving = append(back.Moving, mv)
				if found {
					both = append(both, desc)
				}
				continue
			}
			back.Assign[mv.P] = mv.From
		}
	}
	why := ""
	if len(unread) > 0 {
		why = "; " + strings.Join(unread, "; ")
	}
	for _, i := range streamsOf(mg.m.Moving, true, true) {
		if err := mg.setSubjects(ctx, back, i); err != nil {
			return fmt.Errorf("%w (the batch could not be reopened: %v; it stays closed until the command is run again)", cause, err)
		}
	}
	if err := mg.write(ctx, back); err != nil {
		return fmt.Errorf("%w (the batch could not be reopened: %v; it stays closed until the command is run again)", cause, err)
	}
	if len(both) > 0 {
		for _, desc := range both {
			mg.log.Error("inbox partition closed: messages in both its old and its new stream", slog.String("partition", desc))
		}
		err := fmt.Errorf("%w: %s. %s", ErrInBothStreams, strings.Join(both, "; "), inBothRecovery)
		if n := len(back.Moving) - len(both); n > 0 {
			err = fmt.Errorf("%w (%d other partitions stay closed until the command is run again%s)", err, n, why)
		}
		if errors.Is(cause, errPastBoundAndNew) {
			return err
		}
		return fmt.Errorf("%w (%w)", cause, err)
	}
	if len(back.Moving) > 0 {
		return fmt.Errorf("%w (%d partitions that no one stream can take yet stay closed until the command is run again%s)", cause, len(back.Moving), why)
	}
	return cause
}

// errPastBoundAndNew is move's cause for reopen when a partition's purge
// found a message past its bound in its old stream and its new stream holds
// messages of it: reopen returns ErrInBothStreams when it still finds that
// (its own purge and inBoth), and this cause when it does not (the message
// was answered or removed since: the command run again goes on).
var errPastBoundAndNew = errors.New("a moving partition had messages past its drain's bound in its old stream and messages in its new stream")

// ErrInBothStreams is returned when a moving partition has a message left
// in its old stream (stored past its drain's bound, or after the open, or
// after an earlier migration's last look), not committed, and messages in
// its new stream: it stays closed.
var ErrInBothStreams = errors.New("inbox partitions with messages in both their old and their new stream stay closed: no stream can take one without answering a message out of order or twice, and running the command again does not change that")

// inBothRecovery tells the operator what can be done about ErrInBothStreams.
const inBothRecovery = "Nothing was deleted. Inspect each such message (nats stream get <stream> <seq>); " +
	"to open its partition in its new stream without it, save it, remove it (nats stream rmm <stream> <seq>) and run the command again " +
	"(the message is then answered only if posted again, after the lane's newer messages if it has any)"

// inBoth reports whether mv's partition has messages in its new stream
// while its old stream still holds one (which purge found past the bound,
// not committed; an error if it is gone since), and if so describes them:
// the partition, the first message left in the old stream, its lane, how
// many more of the partition are left there, and whether that lane has
// messages in the new stream, committed or not (committed ones came after
// the message left behind, which can then no longer be answered in order).
func (mg *migration) inBoth(ctx context.Context, mv broker.Move) (string, bool, error) {
	f := mg.f
	oldName, newName := f.Names.InboxStreamAt(mv.From), f.Names.InboxStreamAt(mv.To)
	subj := f.Names.InboxPartitionSubject(mv.P)
	first, found, err := mg.nextOf(ctx, newName, subj, 1)
	if err != nil || !found {
		return "", false, err
	}
	left, err := once(ctx, mg, func(ctx context.Context) (*broker.LeaderMsg, error) {
		return broker.LeaderGet(ctx, f.JS, oldName, broker.LeaderGetRequest{Seq: 1, NextBySubject: subj})
	})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		// Removed since the purge looked: the re-run's purge opens it in
		// its new stream.
		return "", false, fmt.Errorf("nothing left in its old stream %s now", oldName)
	}
	if err != nil {
		return "", false, err
	}
	lane := strings.TrimPrefix(left.Subject, fmt.Sprintf("%s.in.%d.", f.Names.Prefix(), mv.P))
	more := ""
	if _, info, err := mg.streamInfo(ctx, oldName, subj); err != nil {
		return "", false, err
	} else {
		var n uint64 // State.Msgs counts the whole stream
		for _, c := range info.State.Subjects {
			n += c
		}
		if n > 1 {
			more = fmt.Sprintf(" (and %d more of the partition)", n-1)
		}
	}
	desc := fmt.Sprintf("partition %d: message %d of lane %s left in its old stream %s%s, and messages in its new stream %s from seq %d on",
		mv.P, left.Sequence, lane, oldName, more, newName, first)
	laneFirst, found, err := mg.nextOf(ctx, newName, left.Subject, 1)
	if err != nil {
		return "", false, err
	}
	if !found {
		return desc + fmt.Sprintf(" (none of lane %s)", lane), true, nil
	}
	st, err := once(ctx, mg, func(ctx context.Context) (jetstream.Stream, error) { return f.JS.Stream(ctx, newName) })
	if err != nil {
		return "", false, err
	}
	e, err := mg.entry(ctx, lane)
	if err != nil && !errors.Is(err, kv.ErrNotFound) {
		return "", false, err
	}
	if e != nil && e.InboxID == st.CachedInfo().Config.Metadata[broker.InboxIDMetadata] && e.CommittedSeq >= laneFirst {
		return desc + fmt.Sprintf(" (lane %s already committed messages there, up to seq %d, which came after message %d: it can no longer be answered in order)",
			lane, e.CommittedSeq, left.Sequence), true, nil
	}
	return desc + fmt.Sprintf(" (lane %s has messages there from seq %d on, none committed yet)", lane, laneFirst), true, nil
}

// purge removes each flipped move's partition from its old stream up to the
// bound its drain recorded, and then the messages past it that their lanes
// committed there (see purgeAnswered), and returns the partitions that
// still have messages there: stored past the bound, not committed.
func (mg *migration) purge(ctx context.Context) (map[int]bool, error) {
	f := mg.f
	var residue map[int]bool
	for _, mv := range mg.m.Moving {
		if !mg.m.Flipped(mv) || mv.Drained == nil {
			continue
		}
		name := f.Names.InboxStreamAt(mv.From)
		st, err := once(ctx, mg, func(ctx context.Context) (jetstream.Stream, error) { return f.JS.Stream(ctx, name) })
		if err != nil {
			return nil, err
		}
		subj := f.Names.InboxPartitionSubject(mv.P)
		if b := *mv.Drained; b > 0 {
			if err := onceDo(ctx, mg, func(ctx context.Context) error {
				return st.Purge(ctx, jetstream.WithPurgeSubject(subj), jetstream.WithPurgeSequence(b+1))
			}); err != nil {
				return nil, fmt.Errorf("purge partition %d from %s up to %d: %w", mv.P, name, b, err)
			}
		}
		seq, found, err := mg.purgeAnswered(ctx, mv.From, mv.P)
		if err != nil {
			return nil, fmt.Errorf("partition %d in %s after its purge: %w", mv.P, name, err)
		}
		if found {
			if residue == nil {
				residue = map[int]bool{}
			}
			residue[mv.P] = true
			mg.log.Warn("inbox partition has a message in its old stream past its drain's bound", slog.Int("partition", mv.P),
				slog.String("stream", name), slog.Uint64("seq", seq), slog.Uint64("drained", *mv.Drained))
		}
	}
	return residue, nil
}

// purgeAnswered removes from inbox stream i the messages of partition p
// that their lanes committed there (the lane's entry counts in stream i, up
// to or past them): answered, they are neither left behind nor to be posted
// again (an owner still bound to a partition's old stream after the flip
// can answer a message stored there past the bound). It returns the seq of
// the partition's first message left in the stream, from its leader.
func (mg *migration) purgeAnswered(ctx context.Context, i, p int) (uint64, bool, error) {
	f := mg.f
	name := f.Names.InboxStreamAt(i)
	subj := f.Names.InboxPartitionSubject(p)
	seq, found, err := mg.nextOf(ctx, name, subj, 1)
	if err != nil || !found {
		return seq, found, err
	}
	st, info, err := mg.streamInfo(ctx, name, subj)
	if err != nil {
		return 0, false, err
	}
	id := info.Config.Metadata[broker.InboxIDMetadata]
	prefix := fmt.Sprintf("%s.in.%d.", f.Names.Prefix(), p)
	purged := false
	for s := range info.State.Subjects {
		lane := strings.TrimPrefix(s, prefix)
		e, err := mg.entry(ctx, lane)
		if err != nil && !errors.Is(err, kv.ErrNotFound) {
			return 0, false, err
		}
		if e == nil || id == "" || e.InboxID != id {
			continue
		}
		if laneFirst, found, err := mg.nextOf(ctx, name, s, 1); err != nil {
			return 0, false, err
		} else if !found || e.CommittedSeq < laneFirst {
			continue
		}
		if err := onceDo(ctx, mg, func(ctx context.Context) error {
			return st.Purge(ctx, jetstream.WithPurgeSubject(s), jetstream.WithPurgeSequence(e.CommittedSeq+1))
		}); err != nil {
			return 0, false, fmt.Errorf("purge lane %s's committed messages from %s: %w", lane, name, err)
		}
		mg.log.Info("inbox: lane's messages committed in a stream its partition is not assigned to purged", slog.String("lane", lane),
			slog.String("stream", name), slog.Uint64("committed", e.CommittedSeq))
		purged = true
	}
	if !purged {
		return seq, true, nil
	}
	return mg.nextOf(ctx, name, subj, 1)
}

// nextOf is the seq of the first message on subj (a wildcard) at or after
// seq in stream, read from the stream's leader: a direct get may be
// answered by a replica that lags, and its "none" would purge or move on
// too early.
func nextOf(ctx context.Context, js jetstream.JetStream, stream, subj string, seq uint64) (uint64, bool, error) {
	m, err := broker.LeaderGet(ctx, js, stream, broker.LeaderGetRequest{Seq: seq, NextBySubject: subj})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return m.Sequence, true, nil
}

// lastOf is the seq of the last message on subj in stream, from the
// stream's leader (see nextOf); false when there is none.
func lastOf(ctx context.Context, js jetstream.JetStream, stream, subj string) (uint64, bool, error) {
	m, err := broker.LeaderGet(ctx, js, stream, broker.LeaderGetRequest{LastBySubject: subj})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return m.Sequence, true, nil
}

// drain waits until every lane of each move's partition has committed its
// last message in the move's old stream up to the stream's marker (marks:
// stream index -> the marker's seq, see mark), and returns each partition's
// purge bound: its marker, with nothing of the partition stored past it.
// Every message of the partition up to the bound is then committed. A
// message past the marker (see mark: the one window it leaves) takes a new
// marker.
func (mg *migration) drain(ctx context.Context, moves []broker.Move, marks map[int]uint64) (map[int]uint64, error) {
	f := mg.f
	done := map[string]uint64{} // subject -> last seq known committed
	bounds := map[int]uint64{}
	// A read that fails on a transient error (see retry) leaves its
	// partition for the next round. Each read is bounded by attemptTimeout
	// (a round makes one per lane: a bound over the whole round would cap
	// the lanes a partition can have), the rounds by the drain timeout. A
	// read that timed out ends its round: the cluster is likely away for
	// the others too (and the drain ends only once every partition has
	// drained), so a round of an unreachable cluster takes one bound, not
	// one per partition.
	var stalled error
	for {
		left := 0
		var firstLeft string
		wasStalled := stalled
		stalled = nil
		timedOut := false
	moves:
		for _, mv := range moves {
			if timedOut {
				break
			}
			if _, ok := bounds[mv.P]; ok {
				continue
			}
			// stall reports whether err only stalls the partition's drain
			// for this round.
			stall := func(err error) bool {
				if ctx.Err() != nil || !broker.Transient(err) {
					return false
				}
				stalled = err
				left++
				firstLeft = fmt.Sprintf("partition %d (%v)", mv.P, err)
				timedOut = errors.Is(err, context.DeadlineExceeded)
				return true
			}
			bound, ok := marks[mv.From]
			if !ok {
				seq, err := mg.mark(ctx, mv.From)
				if err != nil {
					return nil, drainErr(ctx, err)
				}
				marks[mv.From], bound = seq, seq
			}
			name := f.Names.InboxStreamAt(mv.From)
			_, info, err := mg.streamInfo(ctx, name, f.Names.InboxPartitionSubject(mv.P))
			if err != nil {
				if stall(err) {
					continue
				}
				return nil, drainErr(ctx, err)
			}
			id := info.Config.Metadata[broker.InboxIDMetadata]
			prefix := fmt.Sprintf("%s.in.%d.", f.Names.Prefix(), mv.P)
			ok = true
			for subj := range info.State.Subjects {
				last, found, err := mg.lastOf(ctx, name, subj)
				if err != nil {
					if stall(err) {
						continue moves
					}
					return nil, drainErr(ctx, err)
				}
				if !found {
					continue // purged since (pruned)
				}
				if done[subj] >= last {
					continue
				}
				lane := strings.TrimPrefix(subj, prefix)
				e, err := mg.entry(ctx, lane)
				if err != nil && !errors.Is(err, kv.ErrNotFound) {
					if stall(err) {
						continue moves
					}
					return nil, drainErr(ctx, err)
				}
				if e != nil && e.InboxID == id && e.CommittedSeq >= last {
					done[subj] = last
					continue
				}
				ok = false
				left++
				firstLeft = lane
			}
			if !ok {
				continue
			}
			// Stored past the marker: not covered by it; a new marker.
			if seq, found, err := mg.nextOf(ctx, name, f.Names.InboxPartitionSubject(mv.P), bound+1); err != nil {
				if stall(err) {
					continue
				}
				return nil, drainErr(ctx, err)
			} else if found {
				left++
				firstLeft = fmt.Sprintf("partition %d (seq %d)", mv.P, seq)
				delete(marks, mv.From)
				continue
			}
			bounds[mv.P] = bound
		}
		if left == 0 {
			return bounds, nil
		}
		if stalled != nil && wasStalled == nil {
			mg.log.Warn(retryingMsg, slog.String("step", "drain"), slog.Any("error", stalled))
		}
		select {
		case <-ctx.Done():
			if stalled != nil {
				return nil, fmt.Errorf("drain: not done after %s, the last reads of the old streams failed (%v): the batch was reopened; retry later: %w",
					mg.o.DrainTimeout, stalled, ctx.Err())
			}
			return nil, fmt.Errorf("drain: %d lanes still have uncommitted messages in their old stream (e.g. %s) after %s: the batch was reopened; retry later or with a longer --drain-timeout: %w",
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
