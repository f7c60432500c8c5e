package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/broker"
)

const (
	// inboxCheckLive is how often, on average (±25 %), a worker that
	// follows the inbox streams' advisories reads every inbox stream's
	// identity all the same (watchInboxes): the server sends an advisory
	// at most once, and none to a connection that is down.
	inboxCheckLive = time.Minute
	// inboxCheckPoll is that period for a worker that could not subscribe
	// to the advisories (its permissions refuse them): the check is then
	// the only word it gets of a stream made again while it had no pull
	// waiting.
	inboxCheckPoll = 10 * time.Second
)

// reconnectCheckMax is the longest wait after the connection comes back
// before the streams' identities are read (watchInboxes).
const reconnectCheckMax = 5 * time.Second

// reopenRetryMax is the longest wait between two reads of an inbox stream
// that is away (deleted, not made again yet).
const reopenRetryMax = 5 * time.Second

// watchInboxes keeps the worker's view of its inbox streams' identities
// current until ctx ends. A stream deleted and made again while this worker
// had no pull waiting on the server (every lane slot busy, see pullLoop)
// gives its pull no word, and the owners of its lanes must not go on reading
// the new incarnation as the old.
//
// JetStream's advisories tell of an inbox stream or its workers consumer
// deleted, made or changed (followInboxAdvisories): on a deletion of the
// set's incarnation the stream is marked stale at once (onInboxAdvisory),
// and on each (on a change only while the stream is away or stale) the
// stream is read again (InboxSet.Reopen, which takes a new incarnation into
// the set; Run then pulls from it), and read again with backoff while it is
// away, until the set has its current incarnation or no longer names it.
// As the server sends an advisory at most once, every stream's identity is
// also read about every inboxCheckLive, and within reconnectCheckMax (at
// random) after the connection comes back; when the advisories cannot be
// followed, about every inboxCheckPoll. One stream read per stream each
// time, and nothing more while nothing changed.
//
// The watcher is the one reader that reads a stream again until it is back:
// the pull loops and the forwards hand it the streams they find gone or in
// doubt (inboxAdvisories.recheck), and it reads each at once unless it is
// already reading it again with backoff.
func (w *Worker) watchInboxes(ctx context.Context) {
	adv := w.inboxNotes
	period := w.cfg.inboxCheck.poll
	var stopAdv func()
	var reconnected chan nats.Status
	if !w.cfg.inboxCheck.noAdvisories {
		stop, err := w.followInboxAdvisories(adv)
		if err != nil {
			w.log.Warn("inbox stream advisories not followed: the streams' identities are read every "+w.cfg.inboxCheck.poll.String(), slog.Any("error", err))
		} else {
			stopAdv, period = stop, w.cfg.inboxCheck.live
			reconnected = w.nc.StatusChanged(nats.CONNECTED)
		}
	}
	defer func() {
		if stopAdv != nil {
			w.nc.RemoveStatusListener(reconnected)
			stopAdv()
		}
	}()
	check := time.NewTimer(jittered(period))
	defer check.Stop()
	retryAt := map[string]*reopenRetry{}
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	// reconnectedAt is when (broker.Mono, not a wall-clock reading, which
	// a clock set back would make earlier than a read before it) the
	// connection last came back, until the check that follows it; 0: none.
	var reconnectedAt int64
	for {
		var due []string
		select {
		case <-ctx.Done():
			return
		case <-check.C:
			w.checkAllInboxes(ctx, retryAt, reconnectedAt)
			reconnectedAt = 0
			check.Reset(jittered(period))
		case <-reconnected:
			reconnectedAt = broker.Mono()
			// What the server sent while the connection was down is
			// lost. And a server it reconnected to may refuse the
			// subscriptions.
			if err := advisoriesRefused(w.nc, w.names.InboxAdvisories()); err != nil {
				w.log.Warn("inbox stream advisories not followed: the streams' identities are read every "+w.cfg.inboxCheck.poll.String(), slog.Any("error", err))
				w.nc.RemoveStatusListener(reconnected)
				stopAdv()
				stopAdv, reconnected, period = nil, nil, w.cfg.inboxCheck.poll
			}
			// Within reconnectCheckMax, at random: every worker came
			// back at once, to a server that may have just started.
			// The pull loops check their streams' identities before
			// they take a delivery after a reconnect (pullLoop), so the
			// wait leaves no delivery of a stream made again taken as
			// the old one's; this check is for the streams no
			// delivery came from since (a lane owner reads its stream
			// by name), and skips those a pull loop's check found
			// current since (the last reconnect: a read before it
			// may be older than a making while it was down).
			check.Reset(mrand.N(reconnectCheckMax))
		case <-adv.kick:
			due = w.toReread(adv.take(), retryAt)
			for name := range adv.takeRechecks() {
				if retryAt[name] == nil && !slices.Contains(due, name) {
					due = append(due, name)
				}
			}
		case <-retry.C:
			now := time.Now()
			for name, r := range retryAt {
				if !now.Before(r.at) {
					due = append(due, name)
				}
			}
		}
		for _, name := range due {
			w.reopenStream(ctx, name, retryAt)
		}
		if ctx.Err() != nil {
			return
		}
		var next time.Time
		for _, r := range retryAt {
			if next.IsZero() || r.at.Before(next) {
				next = r.at
			}
		}
		retry.Stop()
		if !next.IsZero() {
			retry.Reset(time.Until(next))
		}
	}
}

// jittered is d ±25 %, at random: workers started together do not all ask
// at once.
func jittered(d time.Duration) time.Duration {
	return d + time.Duration(mrand.Int64N(int64(d/2)+1)) - d/4
}

// inboxAdvisories are the inbox streams JetStream's advisories told of, and
// those the worker's other readers handed to the watcher (recheck), not yet
// read again.
type inboxAdvisories struct {
	mu sync.Mutex
	// due has each stream told of, and whether an advisory other than a
	// change (UPDATED) told of it.
	due map[string]bool
	// rechecks has each stream handed over by recheck.
	rechecks map[string]bool
	// kick has a value when due or rechecks has streams.
	kick chan struct{}
}

func newInboxAdvisories() *inboxAdvisories {
	return &inboxAdvisories{due: map[string]bool{}, rechecks: map[string]bool{}, kick: make(chan struct{}, 1)}
}

// recheck hands stream to the watcher (watchInboxes), for a reader that
// found it gone or in doubt and does not read it again itself: the watcher
// reads it at once, unless it is reading it again with backoff already
// (the stream is away), and then until the set has its current
// incarnation or no longer names it.
func (a *inboxAdvisories) recheck(stream string) {
	a.mu.Lock()
	if a.rechecks == nil {
		a.rechecks = map[string]bool{}
	}
	a.rechecks[stream] = true
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// takeRechecks returns the streams handed over by recheck, and forgets
// them.
func (a *inboxAdvisories) takeRechecks() map[string]bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.rechecks
	a.rechecks = map[string]bool{}
	return out
}

// note notes an advisory of stream; updated when it tells of a change.
func (a *inboxAdvisories) note(stream string, updated bool) {
	a.mu.Lock()
	a.due[stream] = a.due[stream] || !updated
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// take returns the streams noted, each with whether an advisory other than
// a change told of it, and forgets them.
func (a *inboxAdvisories) take() map[string]bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.due
	a.due = map[string]bool{}
	return out
}

// toReread are the streams of told (inboxAdvisories.take) to read again. A
// stream told of only as changed (STREAM.UPDATED) is read again only while
// it is away or stale (retryAt, Inbox.Stale): a migration changes the
// streams' subjects many times, and every worker would read the stream each
// time. An edit of a current stream's fleet_inbox_id is found by the
// periodic check.
func (w *Worker) toReread(told map[string]bool, retryAt map[string]*reopenRetry) []string {
	var out []string
	for name, notOnlyChanged := range told {
		in := w.inboxes.ByName(name)
		if notOnlyChanged || retryAt[name] != nil || (in != nil && in.Stale()) {
			out = append(out, name)
		}
	}
	return out
}

// followInboxAdvisories subscribes to JetStream's advisories of the inbox
// streams and their workers consumers made, deleted or changed
// (broker.Names.InboxAdvisories) and notes in adv each one about a stream
// of the set (onInboxAdvisory). The advisories come through one channel, in
// the order the server sent them (a deletion is never taken after the
// making that followed it; another reader may have installed that making's
// incarnation already, though).
// It fails when the server refuses the subscriptions; stop ends them.
func (w *Worker) followInboxAdvisories(adv *inboxAdvisories) (stop func(), err error) {
	subjects := w.names.InboxAdvisories()
	ch := make(chan *nats.Msg, 256)
	var subs []*nats.Subscription
	unsubscribe := func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}
	for _, s := range subjects {
		sub, err := w.nc.ChanSubscribe(s, ch)
		if err != nil {
			unsubscribe()
			return nil, fmt.Errorf("subscribe %s: %w", s, err)
		}
		subs = append(subs, sub)
	}
	if err := advisoriesRefused(w.nc, subjects); err != nil {
		unsubscribe()
		return nil, err
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case m := <-ch:
				w.onInboxAdvisory(m, adv)
			}
		}
	}()
	return func() { unsubscribe(); close(quit); <-done }, nil
}

// onInboxAdvisory takes one advisory of the inbox streams (m): it notes the
// stream in adv, to be read again, unless the set no longer names it. An
// advisory of the deletion of the set's incarnation of the stream, or of
// its workers consumer, marks that incarnation stale at once; one sent
// before the incarnation was made (of the one before it, taken late: after
// a reader installed the new one) does not.
func (w *Worker) onInboxAdvisory(m *nats.Msg, adv *inboxAdvisories) {
	a, ok := w.names.ParseInboxAdvisory(m.Subject)
	if !ok {
		return
	}
	in := w.inboxes.ByName(a.Stream)
	if in == nil {
		// The map does not name the stream (a migration removed it):
		// nothing of it is read any more.
		return
	}
	if a.Action == broker.AdvisoryDeleted && !sentBefore(m.Data, madeAt(in, a.Consumer)) {
		in.MarkStale()
	}
	adv.note(a.Stream, a.Action == broker.AdvisoryUpdated)
}

// madeAt is when in's stream, or with consumer its workers consumer, was
// made, as the server said when in was opened. (In a cluster the making
// and the deletion may be timed by two servers' clocks: a deletion taken
// late and timed a moment after the making that followed it still marks
// the new incarnation stale, which costs a release and retake of its
// lanes, no more.)
func madeAt(in *broker.Inbox, consumer bool) time.Time {
	if consumer && in.Consumer != nil {
		if ci := in.Consumer.CachedInfo(); ci != nil {
			return ci.Created
		}
	}
	if si := in.Stream.CachedInfo(); si != nil {
		return si.Created
	}
	return time.Time{}
}

// sentBefore reports whether advisory data says it was sent before t. An
// advisory whose time cannot be read, or a zero t, is not.
func sentBefore(data []byte, t time.Time) bool {
	var adv struct {
		Time time.Time `json:"timestamp"`
	}
	if t.IsZero() || json.Unmarshal(data, &adv) != nil || adv.Time.IsZero() {
		return false
	}
	return adv.Time.Before(t)
}

// advisoriesRefused reports the server's refusal of a subscription to one
// of subjects (the client's permissions deny it): the server answers a
// subscription it refuses before the flush. A flush that fails (the
// connection is down) reports nothing: the subscriptions are made again
// when it comes back, and looked at then.
func advisoriesRefused(nc *nats.Conn, subjects []string) error {
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		return nil
	}
	err := nc.LastError()
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return nil
	}
	for _, s := range subjects {
		if strings.Contains(err.Error(), `"`+s+`"`) {
			return err
		}
	}
	return nil
}

// reopenRetry is when a stream an advisory told of is read again.
type reopenRetry struct {
	bo *backoff.ExponentialBackOff
	at time.Time
}

// reopenStream reads inbox stream name again (InboxSet.Reopen): a stream
// found made again is marked stale and replaced in the set. Until a read
// finds the set's incarnation current or takes the current one (the stream
// is away, or the read failed), it is read again with backoff (retryAt),
// unless the set no longer names it. An incarnation another reader
// installed meanwhile is read again too: it may be of a read answered just
// before the stream was deleted again.
func (w *Worker) reopenStream(ctx context.Context, name string, retryAt map[string]*reopenRetry) {
	in := w.inboxes.ByName(name)
	if in == nil {
		delete(retryAt, name)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	fresh, err := w.inboxes.Reopen(cctx, in, false)
	cancel()
	switch {
	case err == nil:
		delete(retryAt, name)
		if fresh != in {
			w.log.Warn("inbox stream made again: reopened", slog.String("stream", name), slog.String("inbox_id", fresh.ID), slog.String("was", in.ID))
		}
		return
	case ctx.Err() != nil:
		return
	case w.inboxes.ByName(name) == nil:
		// The map dropped it.
		delete(retryAt, name)
		return
	}
	r := retryAt[name]
	if r == nil {
		bo := backoff.NewExponentialBackOff()
		bo.InitialInterval, bo.MaxInterval = 250*time.Millisecond, reopenRetryMax
		r = &reopenRetry{bo: bo}
		retryAt[name] = r
		w.log.Warn("inbox stream gone or made again", slog.String("stream", name), slog.Any("error", err))
	}
	r.at = time.Now().Add(r.bo.NextBackOff())
}

// checkAllInboxes reads every inbox stream's identity once (reopenStream),
// but those a read begun at since (broker.Mono) or later found current
// (none when since is 0).
func (w *Worker) checkAllInboxes(ctx context.Context, retryAt map[string]*reopenRetry, since int64) {
	for _, in := range w.inboxes.All() {
		if since != 0 && !in.Stale() && retryAt[in.Name] == nil && in.CheckedSince(since) {
			continue
		}
		// A stale one too: its pull may not be waiting to hear of it (its
		// new consumer serves the same name), and Reopen keeps what
		// another reader installed meanwhile.
		w.reopenStream(ctx, in.Name, retryAt)
	}
}
