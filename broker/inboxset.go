package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/session"
)

// Inbox is one inbox stream with its identity and, for workers, its
// workers consumer.
//
// An Inbox stands for one incarnation of its stream: a stream deleted and
// made again under the same name (its seqs start again at 1, with a new
// identity) is another Inbox (see InboxSet.Reopen). Stream and Consumer
// address the stream and consumer by name, so they reach whichever
// incarnation exists: once Stale, nothing may be read through them as this
// incarnation's.
type Inbox struct {
	Index  int
	Name   string
	ID     string
	Stream jetstream.Stream
	// Consumer is the stream's workers consumer (nil when the set was
	// opened without consumers).
	Consumer jetstream.Consumer
	// stale is set when this incarnation is known to be gone or in doubt.
	stale atomic.Bool
	// checked is when (Mono) the latest read of the stream that found
	// this incarnation current began.
	checked atomic.Int64
}

// CheckedSince reports whether a read of the stream that began at mono
// (Mono) or later found this incarnation current (the read that opened it,
// or a Reopen that kept it).
func (in *Inbox) CheckedSince(mono int64) bool { return in.checked.Load() >= mono }

// noteChecked records that a read begun at start (Mono) found in current.
func (in *Inbox) noteChecked(start int64) {
	for {
		old := in.checked.Load()
		if old >= start || in.checked.CompareAndSwap(old, start) {
			return
		}
	}
}

// processBase is the base of Mono.
var processBase = time.Now()

// Mono is the time now on the process's monotonic clock, in nanoseconds
// since the process started (always > 0). Unlike a wall-clock reading it
// does not go back when the system clock is set back: of two moments, the
// later has the greater Mono.
func Mono() int64 { return max(int64(time.Since(processBase)), 1) }

// Stale reports whether the incarnation is known to be gone or in doubt
// (its workers consumer was deleted, or the stream found with another
// identity): its seqs, reads and deliveries count for nothing now.
func (in *Inbox) Stale() bool { return in.stale.Load() }

// MarkStale marks the incarnation stale: for a reader told that the stream
// or its workers consumer was deleted (an advisory), before it reads the
// stream again (Reopen).
func (in *Inbox) MarkStale() { in.stale.Store(true) }

// InboxSet is a process's view of the inbox map and the streams it names.
// Readers ask it for a lane's stream; Watch keeps it current while the map
// changes (a migration), and Changed signals each change.
type InboxSet struct {
	js        jetstream.JetStream
	names     Names
	bucket    jetstream.KeyValue
	consumers bool

	mu      sync.RWMutex
	m       InboxMap
	rev     uint64
	streams map[int]*Inbox
	changed chan struct{}
	// readAt is when (Mono) the map was last read (Refresh), for Fresh;
	// 0: never.
	readAt atomic.Int64
}

// OpenInboxes reads the inbox map and opens the streams it names. With
// consumers, each stream's workers consumer is opened too.
func OpenInboxes(ctx context.Context, js jetstream.JetStream, n Names, consumers bool) (*InboxSet, error) {
	s := &InboxSet{js: js, names: n, consumers: consumers, streams: map[int]*Inbox{}, changed: make(chan struct{})}
	bucket, err := js.KeyValue(ctx, n.InboxMapBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		// A fleet provisioned before the count was configurable: its one
		// inbox stream holds every partition.
		return s, s.apply(ctx, DefaultInboxMap(1), 1)
	}
	if err != nil {
		return nil, fmt.Errorf("inbox map bucket %s: %w", n.InboxMapBucket(), err)
	}
	s.bucket = bucket
	if err := s.Refresh(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// ReadInboxMap reads the stored map and its revision.
func ReadInboxMap(ctx context.Context, bucket jetstream.KeyValue) (InboxMap, uint64, error) {
	e, err := bucket.Get(ctx, InboxMapKey)
	if err != nil {
		return InboxMap{}, 0, err
	}
	m, err := DecodeInboxMap(e.Value())
	return m, e.Revision(), err
}

// Refresh re-reads the map and opens any stream it names that is not open
// yet.
func (s *InboxSet) Refresh(ctx context.Context) error {
	if s.bucket == nil {
		return nil
	}
	m, rev, err := ReadInboxMap(ctx, s.bucket)
	if err != nil {
		return fmt.Errorf("read inbox map: %w", err)
	}
	if err := s.apply(ctx, m, rev); err != nil {
		return err
	}
	s.readAt.Store(Mono())
	return nil
}

// Fresh re-reads the map when it was last read more than maxAge ago: for a
// process that reads lanes now and then without following the map (Watch).
// A failed read keeps the map it has.
func (s *InboxSet) Fresh(ctx context.Context, maxAge time.Duration) *InboxSet {
	if at := s.readAt.Load(); at == 0 || Mono()-at > int64(maxAge) {
		_ = s.Refresh(ctx)
	}
	return s
}

// apply makes the set follow map m of revision rev, unless it has that
// revision or a later one. A stream the set has already (an incarnation,
// stale or not) is kept as the set has it when apply installs: its readers
// (Reopen) replace it, and read a stale one again until it is back (in a
// worker, the watcher); apply does not read it. A stream the set had not
// is read, and apply fails if it cannot be (Watch tries again). Another
// apply may have installed one meanwhile: the set keeps that one, marked
// stale if its identity is not the one this read found (the two reads
// cannot be ordered; a Reopen reads it again).
func (s *InboxSet) apply(ctx context.Context, m InboxMap, rev uint64) error {
	s.mu.RLock()
	stale := rev <= s.rev
	s.mu.RUnlock()
	if stale {
		return nil
	}
	opened := map[int]*Inbox{}
	read := map[int]bool{}
	for i := 0; i < m.Streams; i++ {
		s.mu.RLock()
		in := s.streams[i]
		s.mu.RUnlock()
		if in == nil {
			var err error
			if in, err = s.open(ctx, i); err != nil {
				return err
			}
			read[i] = true
		}
		opened[i] = in
	}
	if testHookApplyRead != nil {
		testHookApplyRead()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if rev <= s.rev {
		return nil
	}
	for i, in := range opened {
		cur := s.streams[i]
		switch {
		case cur == nil:
			// Not in the set (or dropped meanwhile by another apply, of
			// an older map): this one.
		case !read[i]:
			// A stream Reopen replaced meanwhile keeps its newer
			// incarnation.
			opened[i] = cur
		default:
			// Installed by another apply while this one read it.
			if cur.ID != in.ID {
				cur.stale.Store(true)
			}
			opened[i] = cur
		}
	}
	s.m, s.rev, s.streams = m, rev, opened
	close(s.changed)
	s.changed = make(chan struct{})
	return nil
}

// testHookApplyRead, when set (by a test), runs between apply's reads of
// the streams and its install.
var testHookApplyRead func()

func (s *InboxSet) open(ctx context.Context, i int) (*Inbox, error) {
	in, err := s.openStream(ctx, i)
	if err != nil {
		return nil, err
	}
	return in, s.openConsumer(ctx, in)
}

// errNoIdentity is an inbox stream without its identity metadata (made by
// other means than provisioning).
var errNoIdentity = errors.New("no identity metadata; run provisioning")

// openStream reads inbox stream i and its identity.
func (s *InboxSet) openStream(ctx context.Context, i int) (*Inbox, error) {
	name := s.names.InboxStreamAt(i)
	start := Mono()
	st, err := s.js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("inbox stream %s: %w", name, err)
	}
	id := st.CachedInfo().Config.Metadata[InboxIDMetadata]
	if id == "" {
		return nil, fmt.Errorf("inbox stream %s: %w", name, errNoIdentity)
	}
	in := &Inbox{Index: i, Name: name, ID: id, Stream: st}
	in.checked.Store(start)
	return in, nil
}

// openConsumer opens in's workers consumer, for a set opened with them.
func (s *InboxSet) openConsumer(ctx context.Context, in *Inbox) error {
	if !s.consumers {
		return nil
	}
	c, err := in.Stream.Consumer(ctx, s.names.WorkersConsumer())
	if err != nil {
		return fmt.Errorf("inbox stream %s: workers consumer: %w", in.Name, err)
	}
	in.Consumer = c
	return nil
}

// Reopen reads inbox stream in again and makes the set name what it finds:
// for a reader that met a sign that in's incarnation is gone (gone: its
// workers consumer reported deleted) or in doubt (a seq or identity that
// does not fit). When gone is set, in is marked Stale at once (before the
// read: nothing goes on using it while the stream is away).
//
// The read is judged against the incarnation the set has for the stream
// (which may be another than in: another reader took a newer one), and it
// is newer than that one when no reader installed another while it ran:
// then what the set has is marked Stale and replaced, with new handles,
// unless it has the identity found and is not Stale (and not in, gone).
// Changed then signals. When another reader installed an incarnation while
// the read ran, the two reads cannot be ordered (the other's may have been
// answered just before the stream was deleted and made again, or this
// one's): if both found the same identity, that one is returned, else the
// stream is read again and judged against it (at most reopenReads reads in
// all, then an error, as another reader keeps replacing it). An
// incarnation read before a read that found another identity (in, and the
// one the set had when Reopen began) is marked Stale, whatever the set
// then does.
//
// Success returns the incarnation the set has for the stream, found
// current by a read that began after it was installed or that found the
// same identity. When the map no longer names the stream (a migration
// removed it) the set takes nothing: Reopen returns in if the read found
// its identity (and it is neither Stale nor gone), else a new Inbox the
// set does not name. An error (the stream not there yet, while it is
// recreated, or its consumer not yet) takes nothing either: in and the
// set's incarnation are Stale if the stream was not found or has another
// identity, in if gone; the caller tries again (passing in, or the set's
// incarnation: the read is judged against the set's either way).
func (s *InboxSet) Reopen(ctx context.Context, in *Inbox, gone bool) (*Inbox, error) {
	if gone {
		in.stale.Store(true)
	}
	s.mu.RLock()
	before := s.streams[in.Index]
	s.mu.RUnlock()
	for reads := 1; ; reads++ {
		fresh, err := s.openStream(ctx, in.Index)
		if err != nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, errNoIdentity) {
				// Deleted, or made again by other means than
				// provisioning: whatever is there under its name is
				// another.
				in.stale.Store(true)
				if before != nil {
					before.stale.Store(true)
				}
			}
			return nil, err
		}
		// Both were read before this read began: of another identity,
		// they are gone.
		for _, old := range []*Inbox{in, before} {
			if old != nil && old.ID != fresh.ID {
				old.stale.Store(true)
			}
		}
		s.mu.RLock()
		cur := s.streams[in.Index]
		s.mu.RUnlock()
		switch {
		case cur != nil && cur.ID == fresh.ID && !cur.Stale():
			// Found current (by this read, newer than its install, or
			// by this read and the installer's alike).
			cur.noteChecked(fresh.checked.Load())
			return cur, nil
		case cur != before:
			// Installed (or dropped by the map) while this read ran.
			before = cur
			if reads == reopenReads {
				return nil, fmt.Errorf("inbox stream %s: %w", in.Name, errReopenRaced)
			}
			continue
		case cur == nil:
			// The map no longer names it (a migration removed it).
			if fresh.ID == in.ID && !in.Stale() {
				in.noteChecked(fresh.checked.Load())
				return in, nil
			}
			if err := s.openConsumer(ctx, fresh); err != nil {
				return nil, err
			}
			return fresh, nil
		}
		// cur, the set's since before this read, is not current: this
		// read, newer, replaces it. Its consumer is looked up first
		// (provisioning may make it a moment after the stream).
		if err := s.openConsumer(ctx, fresh); err != nil {
			return nil, err
		}
		s.mu.Lock()
		if now := s.streams[in.Index]; now != cur {
			s.mu.Unlock()
			before = now
			if reads == reopenReads {
				return nil, fmt.Errorf("inbox stream %s: %w", in.Name, errReopenRaced)
			}
			continue
		}
		cur.stale.Store(true)
		s.streams[in.Index] = fresh
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
		return fresh, nil
	}
}

// reopenReads bounds the reads of one Reopen (see there).
const reopenReads = 3

// errReopenRaced is a Reopen whose reads other readers' installs kept
// overtaking: the caller tries again.
var errReopenRaced = errors.New("replaced by other readers while it was read; read it again")

// Watch keeps the set current until ctx ends: each stored change of the map
// is applied (a failure to open a stream it names is retried).
func (s *InboxSet) Watch(ctx context.Context) {
	if s.bucket == nil {
		<-ctx.Done()
		return
	}
	for ctx.Err() == nil {
		w, err := s.bucket.Watch(ctx, InboxMapKey)
		if err != nil {
			if !sleepCtx(ctx, time.Second) {
				return
			}
			continue
		}
		s.follow(ctx, w)
		_ = w.Stop()
	}
}

func (s *InboxSet) follow(ctx context.Context, w jetstream.KeyWatcher) {
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			m, err := DecodeInboxMap(e.Value())
			if err != nil {
				continue
			}
			for ctx.Err() == nil {
				if err := s.apply(ctx, m, e.Revision()); err == nil || errors.Is(err, context.Canceled) {
					break
				}
				if !sleepCtx(ctx, 250*time.Millisecond) {
					return
				}
			}
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Map returns the current map and its revision.
func (s *InboxSet) Map() (InboxMap, uint64) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.m.Clone(), s.rev
}

// Changed is closed at the next change of the map.
func (s *InboxSet) Changed() <-chan struct{} {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.changed
}

// ForPartition is the stream that holds partition p.
func (s *InboxSet) ForPartition(p int) *Inbox {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.streams[s.m.Assign[p]]
}

// ForLane is the stream that holds lane's inbox.
func (s *InboxSet) ForLane(lane string) *Inbox {
	return s.ForPartition(session.Partition(s.names.Prefix(), lane))
}

// All returns the open streams in index order.
func (s *InboxSet) All() []*Inbox {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*Inbox, 0, len(s.streams))
	for i := 0; i < s.m.Streams; i++ {
		if in := s.streams[i]; in != nil {
			out = append(out, in)
		}
	}
	return out
}

// ByName returns the open stream named name, or nil.
func (s *InboxSet) ByName(name string) *Inbox {
	i, ok := s.names.InboxStreamIndex(name)
	if !ok {
		return nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.streams[i]
}

// InboxPublishOptions are the options of a publish into the inbox: while a
// migration moves the message's partition between streams no stream takes
// its subject (no responders), and the publish is retried every 100 ms
// until its context ends, instead of failing at once.
func InboxPublishOptions() []jetstream.PublishOpt {
	return []jetstream.PublishOpt{jetstream.WithRetryAttempts(1 << 20), jetstream.WithRetryWait(100 * time.Millisecond)}
}

// WorkersBacklog sums the workers consumers of every inbox stream of set:
// the deliveries not yet handed out and those handed out and not acked.
func WorkersBacklog(ctx context.Context, set *InboxSet, n Names) (pending, ackPending uint64, err error) {
	for _, in := range set.All() {
		cons := in.Consumer
		if cons == nil {
			if cons, err = in.Stream.Consumer(ctx, n.WorkersConsumer()); err != nil {
				return 0, 0, err
			}
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return 0, 0, err
		}
		pending += info.NumPending
		ackPending += uint64(info.NumAckPending)
	}
	return pending, ackPending, nil
}

// AddInboxStream creates inbox stream i (or updates it, keeping its subjects
// and identity) as map m describes it, with the replicas, de-duplication
// window and workers consumer of model (another inbox stream).
func AddInboxStream(ctx context.Context, js jetstream.JetStream, n Names, m InboxMap, i int, model jetstream.Stream) error {
	mc := model.CachedInfo().Config
	if _, _, err := ensureInbox(ctx, js, InboxStreamConfig(n, m, i, mc.Replicas, mc.Duplicates)); err != nil {
		return err
	}
	mcons, err := model.Consumer(ctx, n.WorkersConsumer())
	if err != nil {
		return fmt.Errorf("workers consumer of %s: %w", mc.Name, err)
	}
	cfg := mcons.CachedInfo().Config
	cfg.FilterSubject, cfg.FilterSubjects = "", nil
	if _, err := js.CreateOrUpdateConsumer(ctx, n.InboxStreamAt(i), cfg); err != nil {
		return fmt.Errorf("provision consumer %s on %s: %w", cfg.Durable, n.InboxStreamAt(i), err)
	}
	return nil
}

// SetInboxSubjects sets the subjects of inbox stream i to what map m gives
// it (the migration's one way of changing them).
func SetInboxSubjects(ctx context.Context, js jetstream.JetStream, n Names, m InboxMap, i int) error {
	st, err := js.Stream(ctx, n.InboxStreamAt(i))
	if err != nil {
		return fmt.Errorf("inbox stream %s: %w", n.InboxStreamAt(i), err)
	}
	cfg := st.CachedInfo().Config
	want := m.Subjects(n, i)
	if slices.Equal(cfg.Subjects, want) {
		return nil
	}
	cfg.Subjects = want
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("set the subjects of %s: %w", cfg.Name, err)
	}
	return nil
}
