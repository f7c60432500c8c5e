package kv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
)

// DefaultWriteTimeout bounds every durable write.
const DefaultWriteTimeout = 5 * time.Second

// Store is the SessionStore on JetStream KV: lane token -> SessionEntry, and
// session id -> lane. Every write is a CAS on the key's revision, so any
// number of writers on any number of machines can share it.
type Store struct {
	sessions jetstream.KeyValue
	index    jetstream.KeyValue
	js       jetstream.JetStream // for leader reads; nil falls back to direct gets
	timeout  time.Duration
	now      func() time.Time
}

// StoreOptions tune a Store. A nil *StoreOptions means the defaults.
type StoreOptions struct {
	// WriteTimeout bounds each durable write. Defaults to 5s.
	WriteTimeout time.Duration
	// Now is the clock for timestamps. Defaults to time.Now.
	Now func() time.Time
}

// NewStore returns a Store over the provisioned buckets.
func NewStore(res *broker.Resources, opts *StoreOptions) *Store {
	s := &Store{sessions: res.Sessions, index: res.SessionIDs, js: res.JS, timeout: DefaultWriteTimeout, now: time.Now}
	if opts != nil {
		if opts.WriteTimeout > 0 {
			s.timeout = opts.WriteTimeout
		}
		if opts.Now != nil {
			s.now = opts.Now
		}
	}
	return s
}

// Now returns the store's clock.
func (s *Store) Now() time.Time { return s.now() }

func (s *Store) writeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(withoutCancel(ctx), s.timeout)
}

// withoutCancel is context.WithoutCancel(ctx), or ctx itself when nothing
// can cancel it (Done is nil: no cancellation and no deadline), as for the
// worker's writes, whose context is already one without cancellation.
func withoutCancel(ctx context.Context) context.Context {
	if ctx.Done() == nil {
		return ctx
	}
	return context.WithoutCancel(ctx)
}

// Get reads a lane's entry and its revision.
func (s *Store) Get(ctx context.Context, lane string) (*session.SessionEntry, uint64, error) {
	e, err := s.sessions.Get(ctx, lane)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, fmt.Errorf("session %s: %w", lane, ErrNotFound)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("session %s: %w", lane, err)
	}
	var entry session.SessionEntry
	if err := json.Unmarshal(e.Value(), &entry); err != nil {
		return nil, 0, fmt.Errorf("session %s: decode: %w", lane, err)
	}
	return &entry, e.Revision(), nil
}

// Fence restricts a mutation to the lane's current owner.
type Fence struct {
	Owner string
	Epoch uint64
}

func (f *Fence) check(e *session.SessionEntry) error {
	if f == nil {
		return nil
	}
	if e == nil || e.Owner != f.Owner || e.LeaseEpoch != f.Epoch {
		return ErrLeaseLost
	}
	return nil
}

// MutateFunc changes an entry in place. entry is nil when the lane has no
// entry; returning a non-nil entry from Create paths is done by the caller
// through Mutate's create flag. Return ErrNoChange to skip the write. The
// function may run more than once (after a conflict it sees the fresh
// entry), so it must decide from the entry it is given. That includes the
// entry its own earlier attempt wrote when that write's outcome was
// ambiguous and could not be settled by reading back, so a non-idempotent
// change (a counter) must carry its own guard (e.g. last_turn_id).
type MutateFunc func(entry *session.SessionEntry) (*session.SessionEntry, error)

// Mutate applies fn to the lane's entry with CAS, retrying on conflicts. When
// cached and rev are given (rev > 0) the first attempt writes against them
// without a read. With a fence, the entry must name the fence's owner and
// epoch or ErrLeaseLost is returned and nothing is written. fn receives a
// copy it may modify (nil when absent) and returns the entry to store.
func (s *Store) Mutate(ctx context.Context, lane string, cached *session.SessionEntry, rev uint64, fence *Fence, fn MutateFunc) (*session.SessionEntry, uint64, error) {
	cur := cached
	haveCur := cached != nil && rev > 0
	for attempt := 0; ; attempt++ {
		fromCache := haveCur
		if !haveCur {
			// After a conflict, read from the stream leader: a direct get may
			// be answered by a replica that lags behind the write we lost to.
			e, r, err := s.read(ctx, lane, attempt > 0)
			switch {
			case errors.Is(err, ErrNotFound):
				cur, rev = nil, 0
			case err != nil:
				return nil, 0, err
			default:
				cur, rev = e, r
			}
		}
		haveCur = false
		if err := fence.check(cur); err != nil {
			if fromCache || attempt > 0 || s.js == nil {
				return nil, 0, fmt.Errorf("session %s: %w", lane, err)
			}
			// A lagging replica may show an older owner: confirm with the
			// leader before declaring the lease lost.
			e, r, lerr := s.read(ctx, lane, true)
			switch {
			case errors.Is(lerr, ErrNotFound):
				cur, rev = nil, 0
			case lerr != nil:
				return nil, 0, lerr
			default:
				cur, rev = e, r
			}
			if err := fence.check(cur); err != nil {
				return nil, 0, fmt.Errorf("session %s: %w", lane, err)
			}
		}
		var work *session.SessionEntry
		if cur != nil {
			work = cur.Clone()
		}
		next, err := fn(work)
		if errors.Is(err, ErrNoChange) {
			return cur, rev, nil
		}
		if err != nil {
			return nil, 0, err
		}
		if next == nil {
			return nil, 0, fmt.Errorf("session %s: mutate returned no entry", lane)
		}
		data, err := json.Marshal(next)
		if err != nil {
			return nil, 0, err
		}
		newRev, err := s.put(ctx, lane, data, rev)
		if err == nil {
			return next, newRev, nil
		}
		if !errors.Is(err, ErrRevisionMismatch) {
			return nil, 0, err
		}
		if attempt >= 500 {
			return nil, 0, fmt.Errorf("session %s: gave up after %d conflicts: %w", lane, attempt, err)
		}
		if attempt > 2 {
			// Jittered, growing back-off under contention (R3 answers 10164
			// to any write racing another in flight, so hot keys need room).
			ceiling := 1 << min(attempt-2, 6) // 2ms .. 64ms
			t := time.NewTimer(time.Duration(1+rand.IntN(ceiling)) * time.Millisecond)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, 0, fmt.Errorf("session %s: %w", lane, ctx.Err())
			}
		}
	}
}

// put writes data with CAS on rev (0 = create). An ambiguous outcome is
// resolved by reading back: if the stored value is ours, the write landed.
func (s *Store) put(ctx context.Context, lane string, data []byte, rev uint64) (uint64, error) {
	wctx, cancel := s.writeCtx(ctx)
	defer cancel()
	var newRev uint64
	var err error
	if rev == 0 {
		newRev, err = s.sessions.Create(wctx, lane, data)
	} else {
		newRev, err = s.sessions.Update(wctx, lane, data, rev)
	}
	if err == nil {
		return newRev, nil
	}
	if isConflict(err) {
		return 0, fmt.Errorf("session %s: %w", lane, ErrRevisionMismatch)
	}
	if isAmbiguous(err) {
		rctx, rcancel := s.writeCtx(ctx)
		defer rcancel()
		e, gerr := s.sessions.Get(rctx, lane)
		if gerr == nil && bytes.Equal(e.Value(), data) {
			return e.Revision(), nil
		}
		return 0, fmt.Errorf("session %s: ambiguous write (%v): %w", lane, err, ErrRevisionMismatch)
	}
	return 0, fmt.Errorf("session %s: write: %w", lane, err)
}

// Delete removes a lane's entry only if it is still at rev.
func (s *Store) Delete(ctx context.Context, lane string, rev uint64) error {
	wctx, cancel := s.writeCtx(ctx)
	defer cancel()
	err := s.sessions.Delete(wctx, lane, jetstream.LastRevision(rev))
	if isConflict(err) {
		return fmt.Errorf("session %s: %w", lane, ErrRevisionMismatch)
	}
	return err
}

// IndexRecord is the session-id index value.
type IndexRecord struct {
	Lane            string    `json:"lane"`
	SessionKey      string    `json:"session_key"`
	CreatedAt       time.Time `json:"created_at"`
	ParentSessionID string    `json:"parent_session_id,omitempty"`
	// Title is the session's title (from /new <title> or /title), if any.
	Title string `json:"title,omitempty"`
}

// Index records that sessionID belongs to lane. It is idempotent.
func (s *Store) Index(ctx context.Context, sessionID string, rec IndexRecord) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	wctx, cancel := s.writeCtx(ctx)
	defer cancel()
	if _, err := s.index.Create(wctx, sessionID, data); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("index session %s: %w", sessionID, err)
	}
	return nil
}

// LookupIndex returns the index record of a session id.
func (s *Store) LookupIndex(ctx context.Context, sessionID string) (*IndexRecord, error) {
	if !session.ValidSessionID(sessionID) {
		return nil, fmt.Errorf("session id %q: %w", sessionID, ErrNotFound)
	}
	e, err := s.index.Get(ctx, sessionID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("session id %s: %w", sessionID, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	var rec IndexRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// SetTitle sets the title of an indexed session (compare-and-set on the
// index record, retried on a concurrent change). An empty title removes it.
func (s *Store) SetTitle(ctx context.Context, sessionID, title string) error {
	if !session.ValidSessionID(sessionID) {
		return fmt.Errorf("session id %q: %w", sessionID, ErrNotFound)
	}
	for attempt := 0; ; attempt++ {
		e, err := s.index.Get(ctx, sessionID)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("session id %s: %w", sessionID, ErrNotFound)
		}
		if err != nil {
			return err
		}
		var rec IndexRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			return err
		}
		if rec.Title == title {
			return nil
		}
		rec.Title = title
		data, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		wctx, cancel := s.writeCtx(ctx)
		_, err = s.index.Update(wctx, sessionID, data, e.Revision())
		cancel()
		if err == nil || !isConflict(err) || attempt >= 5 {
			if err != nil {
				return fmt.Errorf("title session %s: %w", sessionID, err)
			}
			return nil
		}
	}
}

// Lanes lists every lane that has an entry. It streams the bucket's keys and
// is meant for admin tools and background sweeps, never a hot path.
func (s *Store) Lanes(ctx context.Context) ([]string, error) {
	lister, err := s.sessions.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for k := range lister.Keys() {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	// The lister stops its watcher itself once the keys are listed, so Stop
	// only matters (and its error only says "already stopped") here. The
	// channel is also closed when ctx ends: a partial list is an error.
	_ = lister.Stop()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sort.Strings(out)
	return out, nil
}

// Record is an entry with its lane and revision.
type Record struct {
	Lane     string
	Entry    *session.SessionEntry
	Revision uint64
}

// All reads every entry (admin and sweeps), one record per lane in lane
// order. Entries deleted meanwhile and values that do not decode are
// skipped; a lane written during the scan is listed once, at the newest
// revision seen.
func (s *Store) All(ctx context.Context) ([]Record, error) {
	w, err := s.sessions.WatchAll(ctx)
	if err != nil {
		return nil, err
	}
	defer stopWatch(w)
	byLane := map[string]Record{}
	deleted := map[string]uint64{} // lane -> revision of its delete marker
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				// Closed only by Stop or a closed connection: the scan is
				// incomplete.
				return nil, fmt.Errorf("list sessions: watch closed before the initial values were read")
			}
			if e == nil {
				out := make([]Record, 0, len(byLane))
				for _, r := range byLane {
					out = append(out, r)
				}
				sort.Slice(out, func(i, j int) bool { return out[i].Lane < out[j].Lane })
				return out, nil
			}
			if e.Operation() != jetstream.KeyValuePut {
				if prev, ok := byLane[e.Key()]; ok && prev.Revision < e.Revision() {
					delete(byLane, e.Key())
				}
				deleted[e.Key()] = max(deleted[e.Key()], e.Revision())
				continue
			}
			var entry session.SessionEntry
			if err := json.Unmarshal(e.Value(), &entry); err != nil {
				continue
			}
			if e.Revision() < deleted[e.Key()] {
				continue
			}
			if prev, ok := byLane[e.Key()]; !ok || e.Revision() > prev.Revision {
				byLane[e.Key()] = Record{Lane: e.Key(), Entry: &entry, Revision: e.Revision()}
			}
		}
	}
}

// read returns a lane's entry; leader asks the stream leader (STREAM.MSG.GET)
// instead of a direct get that any replica may answer.
func (s *Store) read(ctx context.Context, lane string, leader bool) (*session.SessionEntry, uint64, error) {
	if !leader || s.js == nil {
		return s.Get(ctx, lane)
	}
	rctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	seq, data, err := leaderLast(rctx, s.js, s.sessions.Bucket(), lane)
	if errors.Is(err, ErrNotFound) {
		return nil, 0, fmt.Errorf("session %s: %w", lane, ErrNotFound)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("session %s: leader read: %w", lane, err)
	}
	var entry session.SessionEntry
	if err := json.Unmarshal(data, &entry); err != nil {
		return nil, 0, fmt.Errorf("session %s: decode: %w", lane, err)
	}
	return &entry, seq, nil
}

// eachBatch bounds the entries Each has pulled ahead of fn.
const eachBatch = 256

// Each calls fn for every entry, streaming: it pulls the bucket's last
// values with an ordered consumer in batches of eachBatch, so it never holds
// more than that many entries in memory, whatever the number of sessions and
// however slow fn is. A lane written during the scan may be seen twice (fn
// must be idempotent); deleted lanes are skipped. An error from fn stops the
// scan and is returned.
func (s *Store) Each(ctx context.Context, fn func(Record) error) error {
	if s.js == nil {
		return s.eachWatch(ctx, fn)
	}
	bucket := s.sessions.Bucket()
	stream := "KV_" + bucket
	prefix := "$KV." + bucket + "."
	str, err := s.js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("scan sessions: %w", err)
	}
	if info := str.CachedInfo(); info != nil && info.State.Msgs == 0 {
		return nil
	}
	cons, err := s.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{prefix + ">"},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return fmt.Errorf("scan sessions: %w", err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(eachBatch))
	if err != nil {
		return fmt.Errorf("scan sessions: %w", err)
	}
	defer it.Stop()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("scan sessions: %w", err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("scan sessions: %w", err)
		}
		h := msg.Headers()
		if h.Get(kvOperationHeader) == "" && h.Get(jetstream.MarkerReasonHeader) == "" {
			var entry session.SessionEntry
			if err := json.Unmarshal(msg.Data(), &entry); err == nil {
				if err := fn(Record{Lane: strings.TrimPrefix(msg.Subject(), prefix), Entry: &entry, Revision: md.Sequence.Stream}); err != nil {
					return err
				}
			}
		}
		if md.NumPending == 0 {
			return nil
		}
	}
}

// kvOperationHeader marks a KV delete or purge (its value is DEL or PURGE).
const kvOperationHeader = "KV-Operation"

// eachWatch is Each over a KV watch, for a Store without a JetStream
// context.
func (s *Store) eachWatch(ctx context.Context, fn func(Record) error) error {
	w, err := s.sessions.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	defer stopWatch(w)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("scan sessions: watch closed before the initial values were read")
			}
			if e == nil {
				return nil
			}
			var entry session.SessionEntry
			if err := json.Unmarshal(e.Value(), &entry); err != nil {
				continue
			}
			if err := fn(Record{Lane: e.Key(), Entry: &entry, Revision: e.Revision()}); err != nil {
				return err
			}
		}
	}
}

// stopWatch stops a KV watch and reads what it still delivers until its
// updates channel closes. nats.go's watch callback blocks on a full updates
// channel and Stop does not unblock it, so a watch abandoned early (an
// error, a cancelled ctx) with a full channel would keep its
// subscription's goroutine forever; drained, the goroutine sees the
// subscription closed, ends, and closes the channel.
func stopWatch(w jetstream.KeyWatcher) {
	_ = w.Stop()
	for range w.Updates() {
	}
}
