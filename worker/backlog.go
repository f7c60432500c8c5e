package worker

import (
	"context"
	"errors"
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
// another inbox); a partition's is the sum over its lanes. The inbox keeps
// handled messages (limits retention), so neither a stream's per-subject
// counts nor the shared workers consumer's pending count says it per
// partition: the watcher's leader counts it, every BacklogInterval.
//
// A count costs one stream info listing the inbox's subjects with their
// message counts (the server answers from its subject index, reading no
// message), then, only for the lanes whose count changed since the last
// count or that had a backlog then, one entry read and one batch direct get
// that counts the lane's messages above its committed seq (again from the
// index). A lane with no new message and no backlog costs nothing more: its
// backlog can only grow with a new message. The first count after taking
// the lead reads every lane once, on a bounded pool, and so does a count
// after messages were removed from the inbox (prunes).

// backlogLane is what the last count learned of one inbox subject.
type backlogLane struct {
	total   uint64 // the subject's messages in the inbox
	pending uint64 // of which above the lane's committed seq
}

// backlogCounter counts the backlog for the leader, keeping per subject what
// the last count learned.
type backlogCounter struct {
	w     *Worker
	lanes map[string]backlogLane
	// The inbox's message count and last seq at the last count: messages
	// removed since (a prune purges a lane's handled messages) show as
	// fewer messages than the new seqs add.
	msgs, lastSeq uint64
}

// backlogLoop counts the inbox backlog every BacklogInterval for as long as
// lead lasts, publishing each count for the gauges; it withdraws the count
// when it ends (the lead is lost or the worker stops).
func (w *Worker) backlogLoop(lead context.Context) {
	defer w.backlog.Store(nil)
	c := &backlogCounter{w: w, lanes: map[string]backlogLane{}}
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
	info, err := w.res.Inbox.Info(ctx, jetstream.WithSubjectFilter(w.names.InboxWildcard()))
	if err != nil {
		return nil, err
	}
	st := info.State
	if st.LastSeq < c.lastSeq || st.Msgs != c.msgs+(st.LastSeq-c.lastSeq) {
		// Messages were removed since the last count (or the stream was
		// made anew): a lane may have lost handled messages and gained new
		// ones with its count unchanged, so every lane is counted again.
		// Prunes remove messages, once an hour by default.
		clear(c.lanes)
	}
	c.msgs, c.lastSeq = st.Msgs, st.LastSeq
	subjects := st.Subjects
	var mu sync.Mutex
	counted := map[string]backlogLane{}
	p := newSweepPool(ctx, sweepWorkers)
	var scanErr error
	for s, total := range subjects {
		if last, ok := c.lanes[s]; ok && last.total == total && last.pending == 0 {
			continue
		}
		if _, lane, ok := c.parse(s); ok {
			if scanErr = p.submit(func(ctx context.Context) (bool, error) {
				n, err := c.lanePending(ctx, s, lane)
				if err != nil {
					return false, err
				}
				mu.Lock()
				counted[s] = backlogLane{total: total, pending: n}
				mu.Unlock()
				return false, nil
			}); scanErr != nil {
				break
			}
		}
	}
	if _, err := p.wait(scanErr); err != nil {
		return nil, err
	}
	for s, l := range counted {
		c.lanes[s] = l
	}
	b := &telemetry.Backlog{Messages: make([]int64, broker.Partitions), Lanes: make([]int64, broker.Partitions)}
	for s, l := range c.lanes {
		if l.pending == 0 {
			continue
		}
		part, _, _ := c.parse(s)
		b.Messages[part] += int64(l.pending)
		b.Lanes[part]++
	}
	return b, nil
}

// lanePending counts the messages of the lane on inbox subject s above its
// committed seq.
func (c *backlogCounter) lanePending(ctx context.Context, s, lane string) (uint64, error) {
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
	case e.InboxID == w.res.InboxID:
		from = e.CommittedSeq + 1
	}
	return broker.SubjectPending(ctx, w.res.JS, w.names.InboxStream(), s, from)
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
