package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/telemetry"
)

// The inbox backlog: per partition, the messages accepted and not yet
// handled. A lane's backlog is its inbox messages above its committed seq
// (all of them when the lane has no entry yet, or an entry that counts in
// another inbox stream); a partition's is the sum over its lanes. The inbox
// keeps handled messages (limits retention), so neither a stream's
// per-subject counts nor the workers consumers' pending counts say it per
// partition: the watcher's leader counts it, every BacklogInterval.
//
// The inbox may be split over several streams (the inbox map): a count
// visits every stream the map names, and counts a partition in the stream
// the map assigns it to, the one its lanes are read from. A lane whose
// entry's committed seq counts in another stream (its inbox_id differs: the
// partition moved since its last turn) has all its messages in this stream
// waiting, as its owner will read them all. A partition being moved is
// counted where the map says it is: in its old stream until the move's flip
// (the messages the drain waits for), in its new one after it; what is left
// of it in the old stream between the flip and the purge was all committed
// before the flip and is not counted, and publishes waiting for the move to
// open the partition are not accepted yet, so not counted either.
//
// A count costs, per inbox stream, one stream info listing the stream's
// subjects with their message counts (the server answers from its subject
// index, reading no message), then, only for the lanes whose count changed
// since the last count or that had a backlog then, one entry read and one
// batch direct get that counts the lane's messages above its committed seq
// (again from the index). A lane with no new message and no backlog costs
// nothing more: its backlog can only grow with a new message. The first
// count after taking the lead reads every lane once, on a bounded pool, and
// so does a count after messages were removed from a stream (prunes; that
// stream's lanes only) or after the inbox map changed (every lane).

// backlogLane is what the last count learned of one inbox subject.
type backlogLane struct {
	total   uint64 // the subject's messages in the stream
	pending uint64 // of which above the lane's committed seq
}

// backlogStream is what the last count learned of one inbox stream.
type backlogStream struct {
	id    string // the stream's identity: a stream made anew is counted anew
	lanes map[string]backlogLane
	// The stream's message count and last seq at the last count: messages
	// removed since (a prune purges a lane's handled messages) show as
	// fewer messages than the new seqs add.
	msgs, lastSeq uint64
}

// backlogCounter counts the backlog for the leader, keeping per stream and
// subject what the last count learned.
type backlogCounter struct {
	w       *Worker
	streams map[string]*backlogStream // by stream name
	mapRev  uint64                    // the inbox map the last count followed
}

func newBacklogCounter(w *Worker) *backlogCounter {
	return &backlogCounter{w: w, streams: map[string]*backlogStream{}}
}

// backlogLoop counts the inbox backlog every BacklogInterval for as long as
// lead lasts, publishing each count for the gauges; it withdraws the count
// when it ends (the lead is lost or the worker stops).
func (w *Worker) backlogLoop(lead context.Context) {
	defer w.backlog.Store(nil)
	c := newBacklogCounter(w)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-lead.Done():
			return
		case <-t.C:
		}
		b, err := c.count(lead)
		switch {
		case err == nil:
			w.backlog.Store(b)
		case lead.Err() == nil:
			// The last good count stays until the next one: a gauge that
			// drops to nothing on one failed read would fire the absence
			// alerts for no reason.
			w.log.LogAttrs(lead, slog.LevelWarn, "inbox backlog count", slog.Any("error", err))
		}
		t.Reset(w.cfg.BacklogInterval)
	}
}

// count counts the backlog of every partition once.
func (c *backlogCounter) count(ctx context.Context) (*telemetry.Backlog, error) {
	w := c.w
	m, rev := w.inboxes.Map()
	if rev != c.mapRev {
		// Partitions moved (or a move began or ended): count every lane
		// again rather than reason about which cached counts still hold.
		clear(c.streams)
		c.mapRev = rev
	}
	inboxes := w.inboxes.All()
	seen := map[string]bool{}
	var mu sync.Mutex
	type countedLane struct {
		st *backlogStream
		s  string
		l  backlogLane
	}
	var counted []countedLane
	p := newSweepPool(ctx, sweepWorkers)
	var scanErr error
streams:
	for _, in := range inboxes {
		seen[in.Name] = true
		info, err := in.Stream.Info(ctx, jetstream.WithSubjectFilter(w.names.InboxWildcard()))
		if err != nil {
			scanErr = fmt.Errorf("inbox stream %s: %w", in.Name, err)
			break
		}
		st := c.streams[in.Name]
		state := info.State
		if st == nil || st.id != in.ID || state.LastSeq < st.lastSeq || state.Msgs != st.msgs+(state.LastSeq-st.lastSeq) {
			// New to this count, made anew, or messages were removed
			// since the last count: a lane may have lost handled messages
			// and gained new ones with its count unchanged, so every lane
			// of the stream is counted again. Prunes remove messages, once
			// an hour by default.
			st = &backlogStream{id: in.ID, lanes: map[string]backlogLane{}}
			c.streams[in.Name] = st
		}
		st.msgs, st.lastSeq = state.Msgs, state.LastSeq
		for s, total := range state.Subjects {
			part, lane, ok := c.parse(s)
			if !ok || m.Assign[part] != in.Index {
				// Not a lane subject, or what is left of a moved
				// partition in its old stream (committed, to be purged).
				delete(st.lanes, s)
				continue
			}
			if last, ok := st.lanes[s]; ok && last.total == total && last.pending == 0 {
				continue
			}
			if scanErr = p.submit(func(ctx context.Context) (bool, error) {
				n, err := c.lanePending(ctx, in, s, lane)
				if err != nil {
					return false, err
				}
				mu.Lock()
				counted = append(counted, countedLane{st, s, backlogLane{total: total, pending: n}})
				mu.Unlock()
				return false, nil
			}); scanErr != nil {
				break streams
			}
		}
		// A subject gone from the stream (purged) has no backlog.
		for s := range st.lanes {
			if _, ok := state.Subjects[s]; !ok {
				delete(st.lanes, s)
			}
		}
	}
	if _, err := p.wait(scanErr); err != nil {
		return nil, err
	}
	for name := range c.streams {
		if !seen[name] {
			delete(c.streams, name) // a stream the map no longer names
		}
	}
	for _, cl := range counted {
		cl.st.lanes[cl.s] = cl.l
	}
	b := &telemetry.Backlog{Messages: make([]int64, broker.Partitions), Lanes: make([]int64, broker.Partitions)}
	for _, st := range c.streams {
		for s, l := range st.lanes {
			if l.pending == 0 {
				continue
			}
			part, _, _ := c.parse(s)
			b.Messages[part] += int64(l.pending)
			b.Lanes[part]++
		}
	}
	return b, nil
}

// lanePending counts the messages of the lane on subject s of inbox stream
// in above its committed seq in that stream.
func (c *backlogCounter) lanePending(ctx context.Context, in *broker.Inbox, s, lane string) (uint64, error) {
	w := c.w
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var from uint64 = 1
	e, _, err := w.store.Get(ctx, lane)
	switch {
	case errors.Is(err, kv.ErrNotFound):
		// A lane whose first message has no entry yet: all of it waits.
	case err != nil:
		return 0, err
	case e.InboxID == in.ID:
		from = e.CommittedSeq + 1
	}
	// Another stream's identity: the committed seq counts there, and the
	// owner reads every message of this stream.
	return broker.SubjectPending(ctx, w.res.JS, in.Name, s, from)
}

// parse returns the partition and the lane token of inbox subject s
// (<prefix>.in.<p>.<lane>).
func (c *backlogCounter) parse(s string) (int, string, bool) {
	rest, ok := strings.CutPrefix(s, c.w.names.Prefix()+".in.")
	if !ok {
		return 0, "", false
	}
	tok, lane, ok := strings.Cut(rest, ".")
	p, err := strconv.Atoi(tok)
	if !ok || lane == "" || err != nil || p < 0 || p >= broker.Partitions {
		return 0, "", false
	}
	return p, lane, true
}

// observeBacklog registers the backlog gauges on the worker's metrics: they
// have series only while this worker leads the watcher and has counted.
func (w *Worker) observeBacklog() func() {
	unregister, err := w.cfg.Metrics.ObserveBacklog(func() (telemetry.Backlog, bool) {
		b := w.backlog.Load()
		if b == nil {
			return telemetry.Backlog{}, false
		}
		return *b, true
	})
	if err != nil {
		w.log.LogAttrs(context.Background(), slog.LevelWarn, "inbox backlog gauges", slog.Any("error", err))
		return func() {}
	}
	return func() { _ = unregister() }
}
