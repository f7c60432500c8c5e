package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/telemetry"
	"github.com/agentfleet/agentfleet/transcript"
)

var (
	errLeaseLost = kv.ErrLeaseLost
	errDrain     = errors.New("drain timeout")
	errStopped   = errors.New("turn stopped by /stop")
	errHardStop  = errors.New("worker stopping")
)

// inboxMsg is one lane message read from the inbox stream.
type inboxMsg struct {
	seq  uint64
	kind string
	body session.Inbound
	// trace is the span context of the message's publish, if traced.
	trace trace.SpanContext
}

// step is the next unit of lane work: a turn of plain messages, one /queue
// item, or one command.
type step struct {
	kind string
	msgs []inboxMsg
}

// lane runs the lane protocol for one lane on this worker.
type lane struct {
	w       *Worker
	lane    string
	subject string
	log     *slog.Logger
	// logScope adds the running turn's ids to log's lines; tt is the
	// running turn's trace (tracing.go).
	logScope telemetry.LogScope
	tt       atomic.Pointer[turnTrace]
	// renewDone is closed when the current ownership's renew loop ended.
	renewDone chan struct{}
	// pauseTag names the pausePoint of the next mutate (tests only).
	pauseTag string
	// turnStarted is when the running turn started (its duration metric).
	turnStarted time.Time

	mu     sync.Mutex
	held   map[uint64]jetstream.Msg
	closed bool
	signal chan struct{}

	// Owner state, touched by the runner goroutine (and the agent goroutine
	// while it runs, for appends).
	lease     *kv.Lease
	renewedAt atomic.Int64 // nanoseconds since monoBase of the last confirmed renewal
	lost      atomic.Bool
	// known is the highest inbox seq of the lane heard of without reading
	// the stream: from post-store hints (their Nats-Sequence) and from
	// deliveries. blind forces the next reads to look anyway: set when the
	// lane is acquired and on the peek timer, because hints are core NATS
	// (at most once) and a delivery may go to another worker. With both,
	// an owned lane reads its inbox only when something is there.
	known atomic.Uint64
	blind atomic.Bool
	// hintKnown is the highest seq a hint announced (known also counts
	// deliveries, which can beat their hint by a moment).
	hintKnown atomic.Uint64
	// hinted holds the messages the hints carried, in seq order, until
	// they are committed (see peek).
	hintMu    sync.Mutex
	hinted    []hintedMsg
	ctx       context.Context
	cancel    context.CancelCauseFunc
	entry     *session.SessionEntry
	rev       uint64
	tx        map[string]*txState
	agents    map[string]agent.Agent
	hints     chan struct{}
	turnStart atomic.Int64 // monoBase nanos when the running agent call started, 0 when none
	// opMu makes the lane's durable writes strictly sequential (the agent
	// goroutine appends while the runner may record steer input).
	opMu sync.Mutex
	// msgids are the platform message id lookups of the step being run.
	msgids msgidLookups
	// holdsGate is set while the lane runs a last-attempt turn that took
	// its place in the worker's turn gate before it was recorded (see
	// turnGate).
	holdsGate bool
	// autoCheck asks the runner, once it has nothing to do, whether the
	// lane is due an automatic resume (set when the lane is taken and when
	// an admin command marked it resume_pending).
	autoCheck bool
	// lastWriteErr is the last failed durable write, failures the steps
	// failed in a row (see retryInPlace).
	lastWriteErr error
	failures     int
}

var monoBase = time.Now()

func mono() int64 { return int64(time.Since(monoBase)) }

func newLane(w *Worker, laneTok string) *lane {
	p := session.Partition(w.names.Prefix(), laneTok)
	l := &lane{
		w:       w,
		lane:    laneTok,
		subject: w.names.InboxSubject(p, laneTok),
		held:    map[uint64]jetstream.Msg{},
		signal:  make(chan struct{}, 1),
		hints:   make(chan struct{}, 1),
		tx:      map[string]*txState{},
		agents:  map[string]agent.Agent{},
	}
	// The lines of a turn carry its session, turn and trace ids.
	l.log = l.logScope.Logger(w.log.With(telemetry.LaneKey, laneTok))
	return l
}

func seqOf(m jetstream.Msg) uint64 {
	md, err := m.Metadata()
	if err != nil {
		return 0
	}
	return md.Sequence.Stream
}

// offer hands a delivery to the lane; false when the runner has stopped.
func (l *lane) offer(m jetstream.Msg) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	if old := l.held[seqOf(m)]; old != nil {
		// A redelivery of a delivery we hold: the new one supersedes it.
		_ = old
	}
	seq := seqOf(m)
	l.held[seq] = m
	l.heard(seq)
	select {
	case l.signal <- struct{}{}:
	default:
	}
	return true
}

// heard records that inbox seq exists on the lane.
func (l *lane) heard(seq uint64) { raise(&l.known, seq) }

// raise sets v to seq if that is higher.
func raise(v *atomic.Uint64, seq uint64) {
	for {
		cur := v.Load()
		if seq <= cur || v.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// hintGrace is how long a read waits for the hint of a message only its
// delivery announced so far: the server sends both at once, and the hint
// carries the message, which saves the read.
const hintGrace = 20 * time.Millisecond

// awaitHint waits up to hintGrace for a hint above seq.
func (l *lane) awaitHint(seq uint64) {
	if l.hintKnown.Load() > seq {
		return
	}
	t := time.NewTimer(hintGrace)
	defer t.Stop()
	for l.hintKnown.Load() <= seq {
		select {
		case <-l.hints:
		case <-t.C:
			return
		case <-l.ctx.Done():
			return
		}
	}
}

// mayHaveAfter reports whether the inbox may hold a message of the lane
// after seq: always when blind, otherwise only when one was heard of.
func (l *lane) mayHaveAfter(seq uint64) bool {
	return l.blind.Load() || l.known.Load() > seq
}

func (l *lane) closeInbox() []jetstream.Msg {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	out := make([]jetstream.Msg, 0, len(l.held))
	for _, m := range l.held {
		out = append(out, m)
	}
	l.held = map[uint64]jetstream.Msg{}
	return out
}

// ackUpTo acks held deliveries at or below seq; it reports whether any
// deliveries remain held.
func (l *lane) ackUpTo(seq uint64) bool {
	l.dropHinted(seq)
	l.mu.Lock()
	defer l.mu.Unlock()
	for s, m := range l.held {
		if s <= seq {
			_ = m.Ack()
			delete(l.held, s)
		}
	}
	return len(l.held) > 0
}

func (l *lane) heldCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held)
}

func (l *lane) firstHeldKey() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.held {
		if k := m.Headers().Get(broker.HdrSessionKey); k != "" {
			return k
		}
	}
	return ""
}

// nakHeld hands every held delivery back, after delay.
func (l *lane) nakHeld(delay time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s, m := range l.held {
		d := delay
		if d < 0 {
			// Short and doubling with the delivery count, capped at the TTL.
			d = time.Second
			if md, err := m.Metadata(); err == nil && md.NumDelivered > 1 {
				for i := uint64(1); i < md.NumDelivered && d < l.w.cfg.LeaseTTL; i++ {
					d *= 2
				}
			}
			if d > l.w.cfg.LeaseTTL {
				d = l.w.cfg.LeaseTTL
			}
		}
		if d == 0 {
			_ = m.Nak()
		} else {
			_ = m.NakWithDelay(d)
		}
		delete(l.held, s)
	}
}

func (l *lane) inProgressHeld() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.held {
		_ = m.InProgress()
	}
}

// run is the runner goroutine of a lane.
func (l *lane) run() {
	defer func() {
		left := l.w.laneExit(l)
		committed := uint64(0)
		if l.entry != nil && l.entry.InboxID == l.w.res.InboxID {
			committed = l.entry.CommittedSeq
		}
		for _, m := range left {
			if seqOf(m) <= committed {
				_ = m.Ack()
			} else {
				_ = m.Nak()
			}
		}
	}()
	ctx := l.w.hardCtx
	entry, rev, err := l.w.store.Get(ctx, l.lane)
	switch {
	case errors.Is(err, kv.ErrNotFound):
	case err != nil:
		l.log.Warn("read entry", "err", err)
		l.nakHeld(time.Second)
		return
	default:
		l.entry, l.rev = entry, rev
	}
	// Wake-up step 1: deliveries whose effects are already durable.
	if l.entry != nil && l.entry.InboxID == l.w.res.InboxID {
		if !l.ackUpTo(l.entry.CommittedSeq) && l.entry.Turn == nil {
			if l.entry.Owner == "" || !l.w.draining() {
				// Nothing newer was handed to us. A sweep may still need
				// us if the lane has unprocessed messages: check below.
				if next, err := l.peek(ctx, l.entry.CommittedSeq+1); err != nil || next == nil {
					return
				}
			}
		}
	}
	for attempt := 0; ; attempt++ {
		if l.w.draining() {
			l.nakHeld(0)
			return
		}
		lease, err := l.w.leases.Acquire(ctx, l.lane, l.w.owner)
		var held *kv.HeldError
		if errors.As(err, &held) {
			// Wake-up step 2: another worker owns the lane.
			l.w.stats.HeldElsewhere.Add(1)
			l.w.heldElsewhere.Store(l.lane, time.Now().Add(500*time.Millisecond))
			delay := time.Duration(-1)
			if l.entry != nil && l.entry.Turn != nil {
				// A turn in flight under someone else's lease: if that
				// owner died, the lane is ours to resume when the lease
				// runs out. Come back just after that, not a whole TTL on.
				delay = heldRetryDelay(held.Expires, l.w.cfg.LeaseTTL)
			}
			l.nakHeld(delay)
			return
		}
		if err != nil {
			l.log.Warn("acquire lease", "err", err)
			l.nakHeld(time.Second)
			return
		}
		again := l.own(lease)
		if !again {
			return
		}
	}
}

func (l *lane) alive() bool {
	if l.lost.Load() {
		return false
	}
	deadline := int64(l.w.cfg.LeaseTTL - l.w.cfg.LeaseMargin)
	return mono()-l.renewedAt.Load() < deadline
}

// checkAlive is the self-fence: no write once the lease could have expired.
func (l *lane) checkAlive() error {
	if !l.alive() {
		l.cancel(errLeaseLost)
		return errLeaseLost
	}
	return nil
}

// own runs the lane as its owner until it releases the lease (returning true
// when new work appeared right after the release) or loses it.
func (l *lane) own(lease *kv.Lease) bool {
	w := l.w
	l.lease = lease
	l.lost.Store(false)
	l.renewedAt.Store(int64(lease.Renewed.Sub(monoBase)))
	l.ctx, l.cancel = context.WithCancelCause(w.hardCtx)
	defer l.cancel(errHardStop)
	w.stats.Takeovers.Add(1)
	w.cfg.Metrics.LeaseAcquired(context.Background())

	renewDone := make(chan struct{})
	l.renewDone = renewDone
	go l.renewLoop(renewDone)
	defer func() { <-renewDone }()

	fallbackKey := l.firstHeldKey()
	if err := l.mutate(func(e *session.SessionEntry) (*session.SessionEntry, error) {
		if e == nil {
			if fallbackKey == "" {
				return nil, errors.New("no session key for a new lane")
			}
			e = &session.SessionEntry{SessionKey: fallbackKey, CostStatus: "unknown"}
		}
		if e.LeaseEpoch > lease.Epoch {
			return nil, fmt.Errorf("entry epoch %d is ahead of our lease %d: %w", e.LeaseEpoch, lease.Epoch, errLeaseLost)
		}
		e.Owner = w.owner
		e.LeaseEpoch = lease.Epoch
		if e.InboxID != w.res.InboxID {
			e.InboxID = w.res.InboxID
			e.CommittedSeq = 0
		}
		return e, nil
	}, false); err != nil {
		l.log.Warn("take over entry", "err", err)
		l.giveUp()
		return false
	}
	l.log.Debug("lane acquired", "epoch", lease.Epoch)

	// The fence: from here on, no append by a previous owner can land.
	if err := l.fenceAll(); err != nil {
		l.log.Warn("fence", "err", err)
		l.giveUp()
		return false
	}

	l.blind.Store(true)
	l.dropHinted(math.MaxUint64)
	sub, err := w.nc.Subscribe(w.names.HintSubject(session.Partition(w.names.Prefix(), l.lane), l.lane), func(m *nats.Msg) {
		if seq, ok := l.keepHint(m); ok {
			l.heard(seq)
			raise(&l.hintKnown, seq)
		} else {
			l.blind.Store(true) // a hint without its seq: read to find out
		}
		select {
		case l.hints <- struct{}{}:
		default:
		}
	})
	if err != nil {
		l.log.Warn("subscribe hints", "err", err)
		l.giveUp()
		return false
	}
	defer sub.Unsubscribe() //nolint:errcheck

	// A lane taken with a turn in flight resumes that turn (the previous
	// owner died, or, after a failed step, see retryInPlace, this one could
	// not finish it); one taken without may be due an automatic resume (see
	// autoResumeDue).
	l.autoCheck = l.entry.Turn == nil
	for l.entry.Turn != nil {
		if l.recoverTurn() {
			l.failures = 0
			break
		}
		if !l.retryInPlace(nil) {
			return false
		}
	}

	lingerUntil := time.Now().Add(w.cfg.Linger)
	for {
		if l.ctx.Err() != nil {
			l.giveUp()
			return false
		}
		if w.draining() {
			l.release()
			return false
		}
		st, err := l.nextStep(l.ctx)
		if err != nil {
			if l.ctx.Err() != nil {
				continue
			}
			l.log.Warn("peek", "err", err)
			if !l.wait(time.Second) {
				continue
			}
			continue
		}
		if st == nil && l.autoCheck {
			l.autoCheck = false
			if l.autoResumeDue() {
				if err := l.publishAutoResume(); err != nil {
					l.log.Warn("publish automatic resume", "err", err)
				}
				continue
			}
		}
		if st != nil {
			if st.kind == session.KindCommand && st.msgs[0].body.Command == "resume_pending" {
				l.autoCheck = true
			}
			l.lastWriteErr = nil
			if !l.runStep(st) {
				// A drain timeout, a lost lease or a failed write.
				if !l.retryInPlace(st) {
					return false
				}
				for l.entry.Turn != nil {
					if l.recoverTurn() {
						break
					}
					if !l.retryInPlace(nil) {
						return false
					}
				}
				lingerUntil = time.Now().Add(w.cfg.Linger)
				continue
			}
			l.failures = 0
			lingerUntil = time.Now().Add(w.cfg.Linger)
			continue
		}
		remaining := time.Until(lingerUntil)
		if remaining <= 0 {
			return l.releaseAndRecheck()
		}
		if remaining > w.cfg.PeekInterval {
			remaining = w.cfg.PeekInterval
		}
		l.wait(remaining)
	}
}

// wait blocks until a hint, a delivery, a drain, the lane's end or d.
func (l *lane) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-l.hints:
		return true
	case <-l.signal:
		return true
	case <-l.w.drainCh:
		return true
	case <-l.ctx.Done():
		return false
	case <-t.C:
		l.blind.Store(true)
		return true
	}
}

// renewLoop renews the lease every TTL/3. InProgress goes out only in the
// same tick as a successful renewal. An agent call running past the gateway
// timeout plus a grace stops the renewals, so the lease expires and
// recovery counts the turn.
func (l *lane) renewLoop(done chan struct{}) {
	defer close(done)
	w := l.w
	t := time.NewTicker(w.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-t.C:
		}
		if ts := l.turnStart.Load(); ts != 0 && time.Duration(mono()-ts) > w.cfg.GatewayTimeout+w.cfg.LeaseTTL {
			l.log.Error("agent exceeded the gateway timeout and ignores cancellation; letting the lease expire")
			l.lost.Store(true)
			l.cancel(errLeaseLost)
			return
		}
		err := w.leases.Renew(l.ctx, l.lease)
		if err == nil {
			l.renewedAt.Store(int64(l.lease.Renewed.Sub(monoBase)))
			l.inProgressHeld()
			continue
		}
		if errors.Is(err, kv.ErrLeaseLost) {
			w.cfg.Metrics.LeaseLost(context.Background(), "taken")
			l.log.Warn("lease lost")
			l.lost.Store(true)
			l.cancel(errLeaseLost)
			return
		}
		if l.ctx.Err() != nil {
			return
		}
		l.log.Warn("renew lease", "err", err)
		if !l.alive() {
			w.cfg.Metrics.LeaseLost(context.Background(), "expired")
			l.lost.Store(true)
			l.cancel(errLeaseLost)
			return
		}
	}
}

// giveUp ends ownership without writing anything (the lease was lost, or a
// hard stop): held deliveries go back without ack.
func (l *lane) giveUp() {
	l.cancel(errHardStop)
	l.nakHeld(0)
	l.parkTx()
}

// release ends ownership cleanly: owner cleared in the entry (the turn
// record, if any, is kept for the next owner), lease deleted, held
// deliveries above the committed seq handed back at once.
func (l *lane) release() {
	w := l.w
	if err := l.mutate(func(e *session.SessionEntry) (*session.SessionEntry, error) {
		e.Owner = ""
		return e, nil
	}, true); err != nil && !errors.Is(err, errLeaseLost) {
		l.log.Warn("release entry", "err", err)
	}
	l.cancel(errHardStop)
	// The renew loop may be inside a Renew that writes the lease's
	// revision: let it end before the release reads it.
	<-l.renewDone
	if err := w.leases.Release(context.WithoutCancel(w.hardCtx), l.lease); err != nil {
		l.log.Warn("release lease", "err", err)
	}
	handOver := l.entry != nil && l.entry.Turn != nil
	if !handOver && l.entry != nil && w.draining() {
		// Released by a drain with messages still waiting: their deliveries
		// may sit NAK-delayed on other workers.
		if next, err := l.peek(w.hardCtx, l.entry.CommittedSeq+1); err == nil && next != nil {
			handOver = true
		}
	}
	if handOver {
		// A turn record or waiting messages handed over (drain, failed
		// write): the deliveries may sit delayed on other workers, so wake
		// the lane now rather than after their delay.
		wake := fmt.Sprintf("wake:%s:%d:handover", l.lane, l.lease.Epoch)
		if err := w.publishInternal(context.WithoutCancel(w.hardCtx), l.lane, l.entry.SessionKey, internalWake, "", wake); err != nil {
			l.log.Warn("handover wake", "err", err)
		}
	}
	committed := uint64(0)
	if l.entry != nil {
		committed = l.entry.CommittedSeq
	}
	l.ackUpTo(committed)
	l.nakHeld(0)
	l.parkTx()
	l.log.Debug("lane released")
}

// releaseAndRecheck releases, then peeks once more: a message that arrived
// after the last peek but before the release would otherwise wait for a
// redelivery. It reports whether the lane must be taken again.
func (l *lane) releaseAndRecheck() bool {
	l.release()
	if l.entry == nil {
		return false
	}
	next, err := l.peek(l.w.hardCtx, l.entry.CommittedSeq+1)
	return err == nil && next != nil && !l.w.draining()
}

// parkTx returns loaded transcripts and agents to the worker's cache.
func (l *lane) parkTx() {
	if l.entry == nil {
		return
	}
	for sid, st := range l.tx {
		if sid != l.entry.SessionID {
			continue
		}
		l.w.cache.put(&cacheEntry{key: cacheKey(l.entry.SessionKey, sid), agent: l.agents[sid], tx: st})
	}
	l.tx = map[string]*txState{}
	l.agents = map[string]agent.Agent{}
}

// mutate applies fn to the entry as its owner (fenced by owner and epoch),
// writing against the revision of our own last write. fenced=false is only
// for the take-over write itself.
func (l *lane) mutate(fn kv.MutateFunc, fenced bool) error {
	l.opMu.Lock()
	defer l.opMu.Unlock()
	if err := l.checkAlive(); err != nil {
		return err
	}
	if l.pauseTag != "" {
		pausePoint(l.pauseTag)
	}
	var fence *kv.Fence
	if fenced {
		fence = &kv.Fence{Owner: l.w.owner, Epoch: l.lease.Epoch}
	}
	e, rev, err := l.w.store.Mutate(context.WithoutCancel(l.ctx), l.lane, l.entry, l.rev, fence, fn)
	if err != nil {
		l.noteWriteErr(err)
		if errors.Is(err, kv.ErrLeaseLost) {
			l.lost.Store(true)
			l.cancel(errLeaseLost)
		}
		return err
	}
	l.entry, l.rev = e, rev
	return nil
}

// txFor returns the loaded transcript of a session, from the lane, the
// worker's cache (revalidated against the subject's last sequence) or the
// stream.
func (l *lane) txFor(sid string) (*txState, error) {
	if st := l.tx[sid]; st != nil {
		return st, nil
	}
	ctx := context.WithoutCancel(l.ctx)
	key := ""
	if l.entry != nil {
		key = l.entry.SessionKey
	}
	if ce := l.w.cache.take(key, sid); ce != nil {
		last, _, err := l.w.tx.LastSeq(ctx, sid)
		if err == nil && last == ce.tx.last {
			l.tx[sid] = ce.tx
			if ce.agent != nil {
				l.agents[sid] = ce.agent
			}
			return ce.tx, nil
		}
		closeAgent(ce.agent)
	}
	entries, last, err := l.w.tx.Load(ctx, sid)
	if err != nil {
		return nil, err
	}
	st := newTxState(sid, entries, last)
	l.tx[sid] = st
	return st, nil
}

// fenceAll appends a fence entry to every transcript the lane may be writing.
func (l *lane) fenceAll() error {
	sids := map[string]bool{}
	if l.entry.SessionID != "" {
		sids[l.entry.SessionID] = true
	}
	if t := l.entry.Turn; t != nil {
		if t.SessionID != "" {
			sids[t.SessionID] = true
		}
		if t.PreviousSessionID != "" {
			sids[t.PreviousSessionID] = true
		}
	}
	for sid := range sids {
		if err := l.fence(sid); err != nil {
			return err
		}
	}
	return nil
}

func (l *lane) fence(sid string) error {
	for attempt := 0; attempt < 5; attempt++ {
		st, err := l.txFor(sid)
		if err != nil {
			return err
		}
		e := transcript.Entry{Kind: transcript.KindFence, Epoch: l.lease.Epoch, Owner: l.w.owner, Timestamp: l.w.cfg.Now()}
		err = l.appendTo(st, &e)
		if err == nil {
			return nil
		}
		if !errors.Is(err, transcript.ErrConflict) {
			return err
		}
		// The error showed a newer tail (a zombie's late append): reload.
		delete(l.tx, sid)
		entries, last, lerr := l.w.tx.Load(context.WithoutCancel(l.ctx), sid)
		if lerr != nil {
			return lerr
		}
		l.tx[sid] = newTxState(sid, entries, last)
	}
	return fmt.Errorf("fence %s: the transcript kept moving", sid)
}

// appendTo appends e to a transcript with fencing on its tail.
func (l *lane) appendTo(st *txState, e *transcript.Entry) error {
	l.opMu.Lock()
	defer l.opMu.Unlock()
	if err := l.checkAlive(); err != nil {
		return err
	}
	pausePoint("append:" + e.Role)
	var seq uint64
	var err error
	for attempt := 0; ; attempt++ {
		seq, err = l.w.tx.Append(context.WithoutCancel(l.ctx), st.sessionID, st.last, e)
		// An unknown outcome is resolved by sending the same entry against
		// the same tail again (the transcript log compares entry ids).
		if err == nil || !errors.Is(err, transcript.ErrOutcomeUnknown) || attempt >= 5 || !l.alive() {
			break
		}
	}
	if err != nil {
		l.noteWriteErr(err)
		return err
	}
	e.Seq = seq
	st.add(*e)
	return nil
}

// appendOwned appends as the owner: a conflict means another owner fenced
// the transcript, so the lane is lost.
func (l *lane) appendOwned(st *txState, e *transcript.Entry) error {
	end := nopEnd
	if l.w.tracer != nil {
		_, end = l.childSpan(context.Background(), "transcript append", attribute.String("agentfleet.entry.role", e.Role),
			attribute.String("agentfleet.entry.kind", e.Kind))
	}
	err := l.appendTo(st, e)
	end(err)
	if errors.Is(err, transcript.ErrConflict) {
		l.lost.Store(true)
		l.cancel(errLeaseLost)
		return fmt.Errorf("%w: %v", errLeaseLost, err)
	}
	return err
}

// peek returns the lane's first inbox message at or after seq, or nil.
//
// A message a hint carried answers without a read when it is exactly that
// message: the hint's Nats-Last-Sequence is the lane subject's previous seq
// at the time it was stored, so a hinted message m is the first at or after
// seq iff m.last < seq <= m.seq. Otherwise it is a direct get.
func (l *lane) peek(ctx context.Context, seq uint64) (*inboxMsg, error) {
	if seq == 0 {
		seq = 1
	}
	if m := l.hintedAt(seq); m != nil {
		return m, nil
	}
	raw, err := l.w.res.Inbox.GetMsg(context.WithoutCancel(ctx), seq, jetstream.WithGetMsgSubject(l.subject))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return l.decodeInbox(raw.Sequence, raw.Header, raw.Data), nil
}

func (l *lane) decodeInbox(seq uint64, hdr nats.Header, data []byte) *inboxMsg {
	m := &inboxMsg{seq: seq, kind: hdr.Get(broker.HdrKind), trace: telemetry.SpanContextOf(hdr)}
	if err := json.Unmarshal(data, &m.body); err != nil {
		// Ingress never writes this; keep the lane moving with an empty
		// message rather than wedging it.
		l.log.Error("undecodable inbox message", "seq", seq, "err", err)
		m.body = session.Inbound{Kind: session.KindMessage}
	}
	if m.kind == "" {
		m.kind = m.body.Kind
	}
	if m.kind == "" {
		m.kind = session.KindMessage
	}
	if m.body.SessionKey == "" {
		m.body.SessionKey = hdr.Get(broker.HdrSessionKey)
	}
	return m
}

// hintedMsg is a message a hint carried, with the lane subject's previous
// seq when it was stored.
type hintedMsg struct {
	last uint64
	msg  *inboxMsg
}

// maxHinted bounds the hinted messages kept per lane; beyond it the oldest
// go, and peek reads them from the stream.
const maxHinted = 64

// keepHint records the message a hint carries and returns its seq; false
// when the hint lacks the sequence headers.
func (l *lane) keepHint(m *nats.Msg) (uint64, bool) {
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil || seq == 0 {
		return 0, false
	}
	last, err := strconv.ParseUint(m.Header.Get(jetstream.LastSequenceHeader), 10, 64)
	if err != nil || last >= seq || m.Header.Get("Nats-Msg-Size") != "" {
		return seq, true // usable as a hint, not as the message
	}
	h := hintedMsg{last: last, msg: l.decodeInbox(seq, m.Header, m.Data)}
	l.hintMu.Lock()
	defer l.hintMu.Unlock()
	if n := len(l.hinted); n > 0 && l.hinted[n-1].msg.seq >= seq {
		return seq, true // out of order or repeated: ignore
	}
	if len(l.hinted) == maxHinted {
		l.hinted = append(l.hinted[:0], l.hinted[1:]...)
	}
	l.hinted = append(l.hinted, h)
	return seq, true
}

// hintedAt returns the hinted message that is the lane's first at or after
// seq, or nil.
func (l *lane) hintedAt(seq uint64) *inboxMsg {
	l.hintMu.Lock()
	defer l.hintMu.Unlock()
	for _, h := range l.hinted {
		if h.last < seq && seq <= h.msg.seq {
			return h.msg
		}
	}
	return nil
}

// dropHinted forgets the hinted messages at or below seq.
func (l *lane) dropHinted(seq uint64) {
	l.hintMu.Lock()
	defer l.hintMu.Unlock()
	i := 0
	for i < len(l.hinted) && l.hinted[i].msg.seq <= seq {
		i++
	}
	l.hinted = append(l.hinted[:0], l.hinted[i:]...)
}

// nextStep reads the next unit of work above the committed seq: a maximal run
// of plain messages (capped), or one /queue item, or one command.
func (l *lane) nextStep(ctx context.Context) (*step, error) {
	if !l.mayHaveAfter(l.entry.CommittedSeq) {
		return nil, nil
	}
	blind := l.blind.Swap(false)
	if !blind {
		l.awaitHint(l.entry.CommittedSeq)
	}
	first, err := l.peek(ctx, l.entry.CommittedSeq+1)
	if err != nil || first == nil {
		if err != nil && blind {
			l.blind.Store(true)
		}
		return nil, err
	}
	l.heard(first.seq)
	st := &step{kind: first.kind, msgs: []inboxMsg{*first}}
	if first.kind == session.KindQueue && l.resetAhead(ctx, first.seq) {
		st.kind = kindDiscard
		return st, nil
	}
	if first.kind != session.KindMessage || l.busyMode() == BusyQueue {
		// In queue mode every plain message is its own turn, FIFO, as a
		// /queue item is: nothing merges them.
		return st, nil
	}
	size := len(first.body.Text)
	last := first.seq
	for len(st.msgs) < l.w.cfg.MaxTurnMessages {
		if !blind && !l.mayHaveAfter(last) {
			break
		}
		next, err := l.peek(ctx, last+1)
		if err != nil {
			return nil, err
		}
		if next == nil || next.kind != session.KindMessage || size+len(next.body.Text) > l.w.cfg.MaxTurnBytes {
			break
		}
		st.msgs = append(st.msgs, *next)
		size += len(next.body.Text)
		last = next.seq
	}
	return st, nil
}

func seqString(s uint64) string { return strconv.FormatUint(s, 10) }

// kindDiscard is the step of a /queue item that a later /new or /reset
// discards.
const kindDiscard = "discard"

// resetAhead reports whether a /new or /reset waits in the inbox after seq
// with only /queue items between: those queued items are discarded, as the
// seed's /new clears the queue. The fleet's own wake-ups and /status, which
// change nothing, do not count as between.
func (l *lane) resetAhead(ctx context.Context, seq uint64) bool {
	next := seq + 1
	for i := 0; i < 256; i++ {
		m, err := l.peek(ctx, next)
		if err != nil || m == nil {
			return false
		}
		switch {
		case resetsSession(m):
			return true
		case transparent(m):
		case m.kind != session.KindQueue:
			return false
		}
		next = m.seq + 1
	}
	return false
}

// resetsSession reports whether m is a /reset, or a /new that will start a
// new session (one whose title is refused changes nothing).
func resetsSession(m *inboxMsg) bool {
	if m.kind != session.KindCommand {
		return false
	}
	switch m.body.Command {
	case session.CmdReset:
		return true
	case session.CmdNew:
		args := strings.TrimSpace(m.body.Args)
		if args == "" {
			return true
		}
		_, err := session.SanitizeTitle(args)
		return err == nil
	}
	return false
}

// transparent reports whether m changes nothing a busy check or a queue
// discard looks at: the fleet's own wake-ups (a handover or a sweep may put
// them anywhere) and /status.
func transparent(m *inboxMsg) bool {
	return m.kind == session.KindInternal || m.kind == session.KindCommand && session.ReadOnlyCommand(m.body.Command)
}

// autoResumeDue reports whether the lane is due an automatic turn: its
// session is resume_pending for a reason in the automatic set, the marker is
// fresh and has not had its automatic turn yet, the session has an origin
// to answer to, is not suspended, and no turn is in flight.
func (l *lane) autoResumeDue() bool {
	return autoResumeDue(l.entry, l.w.cfg.Now(), l.w.cfg.Freshness)
}

// autoResumeDue is lane.autoResumeDue for an entry at now.
func autoResumeDue(e *session.SessionEntry, now time.Time, freshness time.Duration) bool {
	if e == nil || e.Turn != nil || e.Suspended || !e.ResumePending || e.SessionID == "" || e.Origin == nil ||
		!autoResumeReason(e.ResumeReason) || !session.ResumeFresh(e.LastResumeMarkedAt, now, freshness) {
		return false
	}
	return e.AutoResumedAt == nil || e.LastResumeMarkedAt == nil || !e.AutoResumedAt.Equal(*e.LastResumeMarkedAt)
}

// publishAutoResume puts the internal event of an automatic resume into the
// lane's inbox, so that it takes its place in order. Its Msg-Id names the
// marker: one marker, one event.
func (l *lane) publishAutoResume() error {
	e := l.entry
	marker := int64(0)
	if e.LastResumeMarkedAt != nil {
		marker = e.LastResumeMarkedAt.UnixNano()
	}
	id := fmt.Sprintf("resume:%s:%s:%d", l.lane, e.SessionID, marker)
	l.log.Info("resume pending with no turn in flight: automatic resume", "session", e.SessionID, "reason", e.ResumeReason)
	return l.w.publishInternal(context.WithoutCancel(l.ctx), l.lane, e.SessionKey, internalResume, e.SessionID, id)
}

// runAutoResume runs the automatic turn of a resume_pending session: an
// event with empty text, answered in the session with the resume note. It
// only commits past the event when the lane is no longer due one (a message
// already continued the session, or it was reset).
func (l *lane) runAutoResume(m inboxMsg) bool {
	if !l.autoResumeDue() || m.body.Args != l.entry.SessionID {
		return l.commitSimple(m.seq)
	}
	st := &step{kind: session.KindInternal, msgs: []inboxMsg{m}}
	if l.startTurnTrace(st.msgs, "") {
		defer l.endTurnTrace()
	}
	intent, err := l.recordIntent(st)
	if err != nil {
		l.log.Warn("record intent", "err", err)
		return false
	}
	l.w.event("resume", l.lane, map[string]any{"turn_id": intent.ID, "session_id": intent.SessionID, "attempt": intent.Attempt,
		"reason": l.entry.ResumeReason, "automatic": true})
	l.w.cfg.Metrics.TurnResumed(context.Background())
	return l.execute(intent, st.msgs, false)
}

// heldRetryDelay is how long to hand a delivery back for when its lane's
// lease, held by another worker, runs out at expires: a little past that
// moment, within [250ms, ttl].
func heldRetryDelay(expires time.Time, ttl time.Duration) time.Duration {
	const slack = 250 * time.Millisecond
	if expires.IsZero() {
		return ttl
	}
	d := time.Until(expires) + slack
	return min(max(d, slack), ttl)
}
