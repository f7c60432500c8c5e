package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
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
// deleted, made or changed (followInboxAdvisories): on a deletion the
// stream's incarnation is marked stale at once, and on each the stream is
// read again (InboxSet.Reopen, which takes a new incarnation into the set;
// Run then pulls from it), and read again with backoff while it is away,
// until the set has its current incarnation or no longer names it. As the
// server sends an advisory at most once, every stream's identity is also
// read about every inboxCheckLive, and at once when the connection comes
// back; when the advisories cannot be followed, about every inboxCheckPoll.
// One stream read per stream each time, and nothing more while nothing
// changed.
func (w *Worker) watchInboxes(ctx context.Context) {
	adv := &inboxAdvisories{due: map[string]bool{}, kick: make(chan struct{}, 1)}
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
	for {
		var due []string
		select {
		case <-ctx.Done():
			return
		case <-check.C:
			w.checkAllInboxes(ctx, retryAt)
			check.Reset(jittered(period))
		case <-reconnected:
			// What the server sent while the connection was down is
			// lost. And a server it reconnected to may refuse the
			// subscriptions.
			if err := advisoriesRefused(w.nc, w.names.InboxAdvisories()); err != nil {
				w.log.Warn("inbox stream advisories not followed: the streams' identities are read every "+w.cfg.inboxCheck.poll.String(), slog.Any("error", err))
				w.nc.RemoveStatusListener(reconnected)
				stopAdv()
				stopAdv, reconnected, period = nil, nil, w.cfg.inboxCheck.poll
			}
			w.checkAllInboxes(ctx, retryAt)
			check.Reset(jittered(period))
		case <-adv.kick:
			due = adv.take()
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

// inboxAdvisories are the inbox streams JetStream's advisories told of, not
// yet read again.
type inboxAdvisories struct {
	mu  sync.Mutex
	due map[string]bool
	// kick has a value when due has streams.
	kick chan struct{}
}

func (a *inboxAdvisories) note(stream string) {
	a.mu.Lock()
	a.due[stream] = true
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

func (a *inboxAdvisories) take() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.due))
	for s := range a.due {
		out = append(out, s)
	}
	clear(a.due)
	return out
}

// followInboxAdvisories subscribes to JetStream's advisories of the inbox
// streams and their workers consumers made, deleted or changed
// (broker.Names.InboxAdvisories) and notes in adv each one about a stream
// of the set; one about a deletion marks the stream's incarnation stale at
// once. The advisories come through one channel, in the order the server
// sent them (a deletion is never taken after the making that followed it).
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
				name, deleted, ok := w.names.InboxAdvisory(m.Subject)
				if !ok {
					continue
				}
				in := w.inboxes.ByName(name)
				if in == nil {
					// The map does not name the stream (a migration
					// removed it): nothing of it is read any more.
					continue
				}
				if deleted {
					in.MarkStale()
				}
				adv.note(name)
			}
		}
	}()
	return func() { unsubscribe(); close(quit); <-done }, nil
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
// found made again is marked stale and replaced in the set. Until the set
// has its current incarnation (the stream is away, or the read failed), it
// is read again with backoff (retryAt), unless the set no longer names it
// or another reader took its new incarnation.
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
	case w.inboxes.ByName(name) != in:
		// The map dropped it, or another reader took its new
		// incarnation meanwhile.
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

// checkAllInboxes reads every inbox stream's identity once (reopenStream).
func (w *Worker) checkAllInboxes(ctx context.Context, retryAt map[string]*reopenRetry) {
	for _, in := range w.inboxes.All() {
		// A stale one too: its pull may not be waiting to hear of it (its
		// new consumer serves the same name), and Reopen keeps what
		// another reader installed meanwhile.
		w.reopenStream(ctx, in.Name, retryAt)
	}
}
