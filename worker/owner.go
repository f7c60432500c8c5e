package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/telemetry"
	"github.com/agentfleet/agentfleet/transcript"
)

// owner is the ownership layer of one lane on this worker: the lease and
// its renew loop, the fence of the lane's transcripts, the deliveries held
// for the lane, the hints that announce new inbox messages, and the entry
// with the revision of our own last write. Everything the lane makes
// durable goes through its small API:
//
//	mutate  the entry, by compare-and-set, fenced by owner and epoch
//	append  to a transcript, fenced on its tail (a conflict loses the lane)
//	publish a message (a reply or a notice) while the lease is good
//	peek    the lane's first inbox message at or after a seq
//	commit  committed_seq past a seq, acking the deliveries it covers
//
// and begin / release / giveUp start and end an ownership. Each of
// mutate, append and publish checks the self-fence first (alive): no write
// once the lease could have expired.
//
// Goroutines:
//   - the dispatcher (Worker.dispatch) calls offer; held, closed and signal
//     are guarded by mu;
//   - the hint subscription's callback writes known, blind, hintKnown (atomics)
//     and hinted (guarded by hintMu), and signals hints;
//   - the renew loop reads lease, writes renewedAt, triedAt, lost and taken
//     (atomics), reads turnStart, and calls cancel;
//   - the runner goroutine does everything else, and is the only one that
//     reads or replaces entry and rev (through mutate);
//   - the agent goroutine of a running turn calls append and publish (opMu
//     makes the durable writes strictly sequential) and must not read entry.
type owner struct {
	w       *Worker
	lane    string
	subject string
	// in is the inbox stream of the current ownership (bind); seqs, reads,
	// hints and held deliveries all count in it.
	in  atomic.Pointer[broker.Inbox]
	log *slog.Logger
	// logScope adds the running turn's ids to log's lines, the renew
	// loop's included; tt is the running turn's trace (tracing.go), read by
	// the agent goroutine's appends and publishes.
	logScope telemetry.LogScope
	tt       atomic.Pointer[turnTrace]

	// Held deliveries: guarded by mu.
	mu   sync.Mutex
	held map[uint64]jetstream.Msg
	// heldFrom is the incarnation of the inbox stream the held deliveries
	// are of (see heldOf).
	heldFrom *broker.Inbox
	closed   bool
	signal   chan struct{}

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
	hintMu sync.Mutex
	hinted []hintedMsg
	hints  chan struct{}
	// committed mirrors the entry's committed_seq for the hint
	// subscription, which sets suspect on a hint whose lane subject's
	// previous seq is below it (see keepHint): peek then checks the
	// stream's identity before it reads.
	committed atomic.Uint64
	suspect   atomic.Bool

	// The lease of the current ownership. lease is set by begin before the
	// renew loop starts; renewDone is closed when that loop ended.
	lease     *kv.Lease
	renewedAt atomic.Int64 // nanoseconds since monoBase of the last confirmed renewal
	// triedAt is when the last renewal was sent or failed (monoBase
	// nanos): one that failed may still have landed, and the key then
	// lives a TTL from it (see leftHeld).
	triedAt atomic.Int64
	lost    atomic.Bool
	// taken is set with lost when the lease is proven to name no longer
	// this ownership (its key gone, or rewritten by another owner or a
	// newer lease: a refused renewal, a fenced write refused, a newer
	// fence). lost alone also covers a lease that could have expired,
	// whose key may still name this worker for up to a TTL (see giveUp).
	taken atomic.Bool
	// live is the epoch of the worker's liveness lease the lease is bound
	// to (the renew loop rebinds it when the worker takes a new one).
	live      atomic.Uint64
	renewDone chan struct{}
	// ctx is the ownership's context; cancel ends it with a cause
	// (kv.ErrLeaseLost, errHardStop, ...).
	ctx    context.Context
	cancel context.CancelCauseFunc
	// writes is context.WithoutCancel(ctx), made once per ownership: the
	// durable writes run to their own timeouts whatever ends ctx (see
	// writeCtx).
	writes context.Context
	// turnStart is the monoBase nanos when the running agent call started,
	// 0 when none (the renew loop stops renewing for an agent that hangs).
	turnStart atomic.Int64

	// opMu makes the lane's durable writes strictly sequential (the agent
	// goroutine appends while the runner may record steer input).
	opMu sync.Mutex
	// entry and rev are the lane's entry and the revision of our own last
	// write of it (runner only).
	entry *session.SessionEntry
	rev   uint64
	// pauseTag names the pausePoint of the next mutate (tests only).
	pauseTag string
	// lastWriteErr is the last failed durable write (see settle).
	lastWriteErr error

	// tx and agents are the sessions this ownership loaded (transcript
	// tail and warm agent), returned to the worker's cache when it ends
	// (parkTx).
	tx     map[string]*txState
	agents map[string]agent.Agent
}

func newOwner(w *Worker, laneTok string) *owner {
	p := session.Partition(w.names.Prefix(), laneTok)
	o := &owner{
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
	o.log = o.logScope.Logger(w.log.With(slog.String(telemetry.LaneKey, laneTok)))
	return o
}

// begin starts an ownership with a freshly acquired lease: it starts the
// renew loop, writes owner and epoch into the entry, fences the lane's
// transcripts (from then on no append by a previous owner can land;
// a fence that fails is retried in place while the lease is good) and
// subscribes to the lane's hints. end, always to be called (after a
// release or a give-up), waits for the renew loop and unsubscribes. On an
// error the caller gives up the lane.
func (o *owner) begin(lease *kv.Lease) (end func(), err error) {
	w := o.w
	o.lease = lease
	o.lost.Store(false)
	o.taken.Store(false)
	o.triedAt.Store(0)
	o.live.Store(lease.Live)
	o.renewedAt.Store(int64(lease.Renewed.Sub(monoBase)))
	o.ctx, o.cancel = context.WithCancelCause(w.hardCtx)
	o.writes = context.WithoutCancel(o.ctx)
	// Whatever this worker remembered of another holder is stale now: its
	// deliveries of the lane must not be forwarded away (see forward.go).
	w.heldElsewhere.Delete(o.lane)
	w.mayHold.Delete(o.lane)
	w.kept.Delete(o.lane)
	w.stats.Takeovers.Add(1)
	w.cfg.Metrics.LeaseAcquired(context.Background())

	renewDone := make(chan struct{})
	o.renewDone = renewDone
	go o.renewLoop(renewDone)
	var sub *nats.Subscription
	end = func() {
		if sub != nil {
			sub.Unsubscribe() //nolint:errcheck
		}
		<-renewDone
		o.cancel(errHardStop)
	}

	// The lane's inbox stream for this ownership: its reads, its seqs and
	// the deliveries it holds all belong to it.
	in := o.bind()
	fallbackKey := o.firstHeldKey()
	if err := o.mutate(func(e *session.SessionEntry) (*session.SessionEntry, error) {
		if e == nil {
			if fallbackKey == "" {
				return nil, errors.New("no session key for a new lane")
			}
			e = &session.SessionEntry{SessionKey: fallbackKey, CostStatus: "unknown"}
		}
		if e.LeaseEpoch > lease.Epoch {
			return nil, fmt.Errorf("entry epoch %d is ahead of our lease %d: %w", e.LeaseEpoch, lease.Epoch, kv.ErrLeaseLost)
		}
		e.Owner = w.owner
		e.LeaseEpoch = lease.Epoch
		// A lane met in another inbox stream than its committed seq
		// counts in (a new stream, or its partition moved) starts over:
		// only the stream a partition is assigned to holds its messages.
		if e.InboxID != in.ID {
			if e.Turn != nil && e.Turn.InboxID == "" {
				// The turn in flight keeps the stream its seqs count
				// in: its recovery ends it without settling them here
				// (see recoverTurn).
				e.Turn.InboxID = e.InboxID
			}
			e.InboxID = in.ID
			e.CommittedSeq = 0
		}
		return e, nil
	}, false); err != nil {
		return end, fmt.Errorf("take over entry: %w", err)
	}
	o.log.Debug("lane acquired", slog.Uint64("epoch", lease.Epoch))

	// The fence: from here on, no append by a previous owner can land.
	if err := o.fenceAllRetrying(); err != nil {
		return end, fmt.Errorf("fence: %w", err)
	}

	o.blind.Store(true)
	o.dropHinted(math.MaxUint64)
	sub, err = w.nc.Subscribe(w.names.HintSubject(session.Partition(w.names.Prefix(), o.lane), o.lane), func(m *nats.Msg) {
		if seq, ok := o.keepHint(m); ok {
			o.heard(seq)
			raise(&o.hintKnown, seq)
		} else {
			o.blind.Store(true) // a hint without its seq: read to find out
		}
		select {
		case o.hints <- struct{}{}:
		default:
		}
	})
	if err != nil {
		sub = nil
		return end, fmt.Errorf("subscribe hints: %w", err)
	}
	return end, nil
}

// mutate applies fn to the entry as its owner (fenced by owner and epoch),
// writing against the revision of our own last write. fenced=false is only
// for the take-over write itself.
func (o *owner) mutate(fn kv.MutateFunc, fenced bool) error {
	o.opMu.Lock()
	defer o.opMu.Unlock()
	if err := o.checkAlive(); err != nil {
		return err
	}
	if o.pauseTag != "" {
		pausePoint(o.pauseTag)
	}
	var fence *kv.Fence
	if fenced {
		fence = &kv.Fence{Owner: o.w.owner, Epoch: o.lease.Epoch}
	}
	// fnLost tells fn's own refusals (a turn record not the one expected,
	// an entry ahead of a lease just taken) from the fence's.
	fnLost := false
	e, rev, err := o.w.store.Mutate(o.writeCtx(), o.lane, o.entry, o.rev, fence,
		func(e *session.SessionEntry) (*session.SessionEntry, error) {
			ne, err := fn(e)
			fnLost = errors.Is(err, kv.ErrLeaseLost)
			return ne, err
		})
	if err != nil {
		o.noteWriteErr(err)
		switch {
		case errors.Is(err, kv.ErrLeaseLost) && !fnLost:
			// The fence refused the write, on the leader's copy: the
			// entry names another owner or epoch, which only the holder
			// of a newer lease writes (an entry is deleted only with
			// no owner).
			o.leaseTaken()
		case errors.Is(err, kv.ErrLeaseLost):
			o.lost.Store(true)
			o.cancel(kv.ErrLeaseLost)
		}
		return err
	}
	o.entry, o.rev = e, rev
	if e != nil {
		o.committed.Store(e.CommittedSeq)
	}
	return nil
}

// writeCtx is the ownership's context without its cancellation, for the
// durable writes and reads of the lane.
func (o *owner) writeCtx() context.Context {
	if o.writes == nil {
		return context.WithoutCancel(o.ctx) // an owner made without begin (tests)
	}
	return o.writes
}

// append appends e to a transcript as the owner, fenced on its tail: a
// conflict means another owner fenced the transcript, so the lane is lost.
func (o *owner) append(st *txState, e *transcript.Entry) error {
	end := nopEnd
	if o.w.tracer != nil {
		_, end = o.childSpan(context.Background(), "transcript append", attribute.String("agentfleet.entry.role", e.Role),
			attribute.String("agentfleet.entry.kind", e.Kind))
	}
	err := o.appendTo(st, e)
	end(err)
	if errors.Is(err, transcript.ErrConflict) {
		o.leaseTaken()
		return fmt.Errorf("%w: %v", kv.ErrLeaseLost, err)
	}
	return err
}

// appendTo appends e to a transcript with fencing on its tail.
func (o *owner) appendTo(st *txState, e *transcript.Entry) error {
	o.opMu.Lock()
	defer o.opMu.Unlock()
	if err := o.checkAlive(); err != nil {
		return err
	}
	pausePoint("append:" + e.Role)
	var seq uint64
	var err error
	for attempt := 0; ; attempt++ {
		seq, err = o.w.tx.Append(o.writeCtx(), st.sessionID, st.last, e)
		// An unknown outcome is resolved by sending the same entry against
		// the same tail again (the transcript log compares entry ids).
		if err == nil || !errors.Is(err, transcript.ErrOutcomeUnknown) || attempt >= 5 || o.checkAlive() != nil {
			break
		}
	}
	if err != nil {
		o.noteWriteErr(err)
		return err
	}
	e.Seq = seq
	st.add(e)
	return nil
}

// publish publishes msg (a reply or a notice, with its Msg-Id header) as the
// lane's owner: not once the lease could have expired. A publish that passed
// the check late is refused by the stream as a duplicate of the new owner's.
func (o *owner) publish(msg *nats.Msg) error {
	if err := o.checkAlive(); err != nil {
		return err
	}
	pausePoint("reply")
	ctx, cancel := context.WithTimeout(o.writeCtx(), 5*time.Second)
	defer cancel()
	_, err := o.w.js.PublishMsg(ctx, msg)
	return err
}

// publishAsync is publish that returns once msg is sent; the function it
// returns waits for the PubAck (up to asyncAckTimeout) and gives publish's
// error.
func (o *owner) publishAsync(msg *nats.Msg) func() error {
	if err := o.checkAlive(); err != nil {
		return func() error { return err }
	}
	pausePoint("reply")
	fut, err := o.w.ajs.PublishMsgAsync(msg)
	if err != nil {
		return func() error { return err }
	}
	return func() error {
		select {
		case <-fut.Ok():
			return nil
		case err := <-fut.Err():
			return err
		}
	}
}

// asyncAckTimeout bounds the wait for the PubAck of an asynchronous
// publish, as publish's timeout does.
const asyncAckTimeout = 5 * time.Second

// commit moves committed_seq past seq with no turn, then acks the held
// deliveries it covers.
func (o *owner) commit(seq uint64) error {
	err := o.mutate(func(e *session.SessionEntry) (*session.SessionEntry, error) {
		if e.CommittedSeq >= seq {
			return nil, kv.ErrNoChange
		}
		e.CommittedSeq = seq
		return e, nil
	}, true)
	if err != nil && !errors.Is(err, kv.ErrNoChange) {
		return fmt.Errorf("commit %d: %w", seq, err)
	}
	o.ackUpTo(o.entry.CommittedSeq)
	return nil
}

// alive reports whether the owner may write: the lane lease not known
// lost, its last confirmed renewal recent enough, and the worker's liveness
// lease it is bound to ours and recent enough (see liveness).
func (o *owner) alive() bool {
	return o.leaseFresh() && o.w.live.fresh(o.live.Load())
}

// leaseFresh is alive without the liveness lease.
func (o *owner) leaseFresh() bool {
	if o.lost.Load() {
		return false
	}
	deadline := int64(o.w.cfg.LeaseTTL - o.w.cfg.LeaseMargin)
	return mono()-o.renewedAt.Load() < deadline
}

// checkAlive is the self-fence: no write once the lease, or the liveness
// lease it is bound to, could have expired. A liveness lease that is late
// (a loaded machine) or was lost and replaced (a store stall) is waited
// for: the write goes ahead once the lease is bound to a fresh liveness
// lease again (the renew loop rebinds it, which fails if another worker
// took the lane meanwhile), and is refused once the lane lease itself
// could have expired or is known lost.
func (o *owner) checkAlive() error {
	for o.leaseFresh() {
		if o.w.live.fresh(o.live.Load()) {
			return nil
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-t.C:
			continue
		case <-o.ctx.Done():
			t.Stop()
		}
		break
	}
	o.lost.Store(true)
	o.cancel(kv.ErrLeaseLost)
	return kv.ErrLeaseLost
}

// renewLoop renews the lease every TTL/3. InProgress goes out only in the
// same tick as a successful renewal. An agent call running past the gateway
// timeout plus a grace stops the renewals, so the lease expires and
// recovery counts the turn.
func (o *owner) renewLoop(done chan struct{}) {
	defer close(done)
	w := o.w
	t := time.NewTicker(w.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		changed := w.live.changedCh()
		select {
		case <-o.ctx.Done():
			return
		case <-t.C:
		case <-changed:
			if live := w.live.epoch.Load(); live == o.live.Load() || live == 0 {
				continue
			}
			// The worker took a new liveness lease (the old one expired
			// in a stall): rebind the lane lease to it now.
		}
		if ts := o.turnStart.Load(); ts != 0 && time.Duration(mono()-ts) > w.cfg.GatewayTimeout+w.cfg.LeaseTTL {
			o.log.Error("agent exceeded the gateway timeout and ignores cancellation; letting the lease expire")
			o.lost.Store(true)
			o.cancel(kv.ErrLeaseLost)
			return
		}
		// A renewal writes the epoch of the worker's current liveness
		// lease: it rebinds the lease when that changed. It is a CAS on
		// our last write, so it fails if anyone took the lane meanwhile.
		live := w.live.epoch.Load()
		o.lease.Live = live
		o.triedAt.Store(mono())
		err := w.renewLease(o.ctx, o.lease)
		if err == nil {
			if old := o.live.Swap(live); old != live {
				o.log.Info("lane lease bound to the worker's new liveness lease", slog.Uint64("live", live), slog.Uint64("was", old))
			}
			o.renewedAt.Store(int64(o.lease.Renewed.Sub(monoBase)))
			o.inProgressHeld()
			continue
		}
		if errors.Is(err, kv.ErrLeaseLost) {
			w.cfg.Metrics.LeaseLost(context.Background(), "taken")
			o.log.Warn("lease lost")
			w.stats.LeasesLost.Add(1)
			o.leaseTaken()
			return
		}
		// The renewal may have landed all the same.
		o.triedAt.Store(mono())
		if o.ctx.Err() != nil {
			return
		}
		o.log.Warn("renew lease", slog.Any("error", err))
		if !o.leaseFresh() {
			w.cfg.Metrics.LeaseLost(context.Background(), "expired")
			o.lost.Store(true)
			o.cancel(kv.ErrLeaseLost)
			return
		}
	}
}

// fenceAllRetrying fences the lane's transcripts, and while the lease is
// good retries in place, after a growing delay (stepRetryDelay) and still
// renewing, the ones it could not fence (most often: the transcript could
// not be loaded in time). Giving the lane up instead kept the lease held
// until it ran out, so the next attempt, here or elsewhere, waited a whole
// lease TTL and took a new epoch. It ends on a lost lease, a hard stop or a
// drain (the caller gives the lane up).
func (o *owner) fenceAllRetrying() error {
	fenced := map[string]bool{}
	for n := 1; ; n++ {
		err := o.fenceAll(fenced)
		if err == nil || errors.Is(err, kv.ErrLeaseLost) || o.ctx.Err() != nil || o.w.draining() {
			return err
		}
		if o.checkAlive() != nil {
			return err
		}
		d := stepRetryDelay(n)
		o.log.Warn("fence failed; retrying in place", slog.Int("failures", n), slog.Duration("retry_in", d), slog.Any("error", err))
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-o.w.drainCh:
		case <-o.ctx.Done():
		}
		t.Stop()
		if o.ctx.Err() != nil || o.w.draining() {
			return err
		}
	}
}

// fenceAll appends a fence entry to every transcript the lane may be
// writing that is not in fenced yet, adding each one it fences.
func (o *owner) fenceAll(fenced map[string]bool) error {
	sids := map[string]bool{}
	if o.entry.SessionID != "" {
		sids[o.entry.SessionID] = true
	}
	if t := o.entry.Turn; t != nil {
		if t.SessionID != "" {
			sids[t.SessionID] = true
		}
		if t.PreviousSessionID != "" {
			sids[t.PreviousSessionID] = true
		}
	}
	for sid := range sids {
		if fenced[sid] {
			continue
		}
		if err := o.fence(sid); err != nil {
			return err
		}
		fenced[sid] = true
	}
	return nil
}

func (o *owner) fence(sid string) error {
	for attempt := 0; attempt < 5; attempt++ {
		st, err := o.txFor(sid)
		if err != nil {
			return err
		}
		if err := o.checkFenceEpoch(st); err != nil {
			return err
		}
		e := transcript.Entry{Kind: transcript.KindFence, Epoch: o.lease.Epoch, Owner: o.w.owner, Timestamp: o.w.cfg.Now()}
		err = o.appendTo(st, &e)
		if err == nil {
			return nil
		}
		if !errors.Is(err, transcript.ErrConflict) {
			return err
		}
		// The error showed a newer tail (a zombie's late append): reload.
		delete(o.tx, sid)
		entries, last, lerr := o.w.tx.Load(o.writeCtx(), sid)
		if lerr != nil {
			return lerr
		}
		o.tx[sid] = newTxState(sid, entries, last)
	}
	return fmt.Errorf("fence %s: the transcript kept moving", sid)
}

// checkFenceEpoch refuses to fence a transcript that already holds the
// fence of a newer lease epoch: its owner took the lane after us (a
// takeover our self-fence cannot see, e.g. one decided on a replica that
// lagged), and our fence on top of it would let our appends follow its
// own. Only a fence of an epoch above every earlier one shuts the previous
// owners out, so the lane is lost.
func (o *owner) checkFenceEpoch(st *txState) error {
	newer := transcript.FenceEpoch(st.entries)
	if newer <= o.lease.Epoch {
		return nil
	}
	o.log.Warn("lease lost: the transcript holds the fence of a newer epoch",
		slog.String("session_id", st.sessionID), slog.Uint64("epoch", o.lease.Epoch), slog.Uint64("fence_epoch", newer))
	o.w.cfg.Metrics.LeaseLost(context.Background(), "taken")
	o.w.stats.LeasesLost.Add(1)
	o.leaseTaken()
	return fmt.Errorf("transcript %s fenced at epoch %d, ours is %d: %w", st.sessionID, newer, o.lease.Epoch, kv.ErrLeaseLost)
}

// txFor returns the loaded transcript of a session, from the lane, the
// worker's cache (revalidated against the subject's last sequence) or the
// stream.
func (o *owner) txFor(sid string) (*txState, error) {
	if st := o.tx[sid]; st != nil {
		return st, nil
	}
	ctx := o.writeCtx()
	key := ""
	if o.entry != nil {
		key = o.entry.SessionKey
	}
	if ce := o.w.cache.take(key, sid); ce != nil {
		last, _, err := o.w.tx.LastSeq(ctx, sid)
		if err == nil && last == ce.tx.last {
			o.tx[sid] = ce.tx
			if ce.agent != nil {
				o.agents[sid] = ce.agent
			}
			return ce.tx, nil
		}
		closeAgent(ce.agent)
	}
	entries, last, err := o.w.tx.Load(ctx, sid)
	if err != nil {
		return nil, err
	}
	st := newTxState(sid, entries, last)
	o.tx[sid] = st
	return st, nil
}

// parkTx returns loaded transcripts and agents to the worker's cache.
func (o *owner) parkTx() {
	if o.entry == nil {
		return
	}
	for sid, st := range o.tx {
		if sid != o.entry.SessionID {
			continue
		}
		o.w.cache.put(&cacheEntry{key: cacheKey(o.entry.SessionKey, sid), agent: o.agents[sid], tx: st})
	}
	o.tx = map[string]*txState{}
	o.agents = map[string]agent.Agent{}
}

// giveUp ends ownership without writing anything (the lease was lost, or a
// hard stop): held deliveries go back without ack. Unless the lease is
// proven taken, its key may still name this worker (a hard stop, or a
// lease that could have expired but need not have: a renewal that failed
// past the margin, a stale liveness lease, an agent past the gateway
// timeout), so the lane is remembered as possibly held (leftHeld).
func (o *owner) giveUp() {
	o.cancel(errHardStop)
	if !o.taken.Load() {
		// A renewal in flight (its write does not end with the
		// cancellation) may still move the lease's expiry: let it end
		// before counting how long the lease may name this worker.
		if o.renewDone != nil {
			<-o.renewDone
		}
		o.leftHeld()
	}
	o.nakHeld(0)
	o.parkTx()
}

// leaseTaken records that the lease is proven lost to another owner (see
// taken) and ends the ownership.
func (o *owner) leaseTaken() {
	o.taken.Store(true)
	o.lost.Store(true)
	o.cancel(kv.ErrLeaseLost)
}

// release ends ownership cleanly: owner cleared in the entry (the turn
// record, if any, is kept for the next owner), lease deleted, held
// deliveries above the committed seq handed back at once. If the delete
// failed they go back after fwdBackDelay: the lease still names this
// worker, so a redelivery now would only be forwarded back here. The lease
// is then remembered as kept, for the lane's next runner here to take back
// (reclaimKept).
func (o *owner) release() {
	w := o.w
	if err := o.mutate(func(e *session.SessionEntry) (*session.SessionEntry, error) {
		e.Owner = ""
		return e, nil
	}, true); err != nil && !errors.Is(err, kv.ErrLeaseLost) {
		o.log.Warn("release entry", slog.Any("error", err))
	}
	o.cancel(errHardStop)
	// The renew loop may be inside a Renew that writes the lease's
	// revision: let it end before the release reads it.
	<-o.renewDone
	if err := w.releaseLease(context.WithoutCancel(w.hardCtx), o.lease); err != nil {
		o.log.Warn("release lease", slog.Any("error", err))
		until := o.leftHeld()
		kept := *o.lease
		w.kept.Store(o.lane, &keptLease{lease: &kept, until: until})
	}
	handOver := o.entry != nil && o.entry.Turn != nil
	if !handOver && o.entry != nil && w.draining() {
		// Released by a drain with messages still waiting: their deliveries
		// may sit NAK-delayed on other workers.
		if next, err := o.peek(w.hardCtx, o.entry.CommittedSeq+1); err == nil && next != nil {
			handOver = true
		}
	}
	if handOver {
		// A turn record or waiting messages handed over (drain, failed
		// write): the deliveries may sit delayed on other workers, so wake
		// the lane now rather than after their delay.
		wake := fmt.Sprintf("wake:%s:%d:handover", o.lane, o.lease.Epoch)
		if err := w.publishInternal(context.WithoutCancel(w.hardCtx), o.lane, o.entry.SessionKey, session.CmdWake, "", wake); err != nil {
			o.log.Warn("handover wake", slog.Any("error", err))
		}
	}
	committed := uint64(0)
	if o.entry != nil {
		committed = o.entry.CommittedSeq
	}
	o.ackUpTo(committed)
	o.nakHeld(o.handBackDelay())
	o.parkTx()
	o.log.Debug("lane released")
}

// handBackDelay is the delay of a delivery the lane hands back once it
// released: none, or fwdBackDelay while a lease of the lane that a release
// could not delete may still name this worker (Worker.kept: set by that
// release, dropped by a take-back or once the lease could have run out), so
// a redelivery now would only be forwarded back here.
func (o *owner) handBackDelay() time.Duration {
	if _, ok := o.w.kept.Load(o.lane); ok {
		return fwdBackDelay
	}
	return 0
}

// leftHeld records that the lane's runner ends while the worker may still
// hold its lease: until the key could have run out on the server, a TTL
// after the last renewal that may have landed (the last confirmed one, or
// a later one that failed or was cut off: its write may have landed all
// the same), plus leaseExpirySlack (a draining worker hands the lane's
// forwarded deliveries back with a delay until then, see drainingForward).
//
// It returns that time (zero without a lease).
func (o *owner) leftHeld() time.Time {
	if o.lease == nil {
		return time.Time{}
	}
	last := max(o.renewedAt.Load(), o.triedAt.Load())
	until := monoBase.Add(time.Duration(last) + o.w.cfg.LeaseTTL + leaseExpirySlack)
	o.w.mayHold.Store(o.lane, until)
	return until
}

// keptLease is a lane lease a release could not delete (see Worker.kept):
// the lease as the ownership last knew it, and until when it may be there.
type keptLease struct {
	lease *kv.Lease
	until time.Time
}

// reclaimKept takes back a lease of this lane that a release of this worker
// could not delete, when an acquisition found the lane held by it (held):
// the lease no runner renews any more would otherwise keep the lane's next
// message waiting until it ran out, up to a lease TTL, for nothing. It
// deletes the lease by its revision, as the release would have (a lease
// taken by anyone else meanwhile, a new lease of this worker included, is
// left alone), and reports whether the lane should be acquired again at
// once. The acquisition then takes a new lease, of a new epoch, and fences
// as every new ownership does: the lease stays the only judge, and nothing
// the ended ownership might still attempt can land.
func (o *owner) reclaimKept(held *kv.HeldError) bool {
	w := o.w
	if held.Owner != w.owner {
		return false
	}
	v, ok := w.kept.Load(o.lane)
	if !ok {
		return false
	}
	k := v.(*keptLease)
	if k.lease.Epoch != held.Epoch {
		return false
	}
	lease := *k.lease
	if err := w.releaseLease(context.WithoutCancel(w.hardCtx), &lease); err != nil {
		o.log.Warn("release kept lease", slog.Any("error", err))
		return false
	}
	// mayHold stays until begin clears it or it runs out: the delete may
	// have been judged done from a read that lagged (Release resolves a
	// conflict by a read), and the lease still be there.
	w.kept.CompareAndDelete(o.lane, v)
	o.log.Debug("kept lease deleted; taking the lane again", slog.Uint64("epoch", lease.Epoch))
	return true
}

// leaseExpirySlack is how much later than a TTL after a renewal was sent
// its key may still be there: the TTL counts from when the server stored
// the write, not from when it was sent, and the server's expiry itself
// runs late (up to a quarter second measured, see the JetStream notes).
const leaseExpirySlack = time.Second

// releaseAndRecheck releases, then peeks once more: a message that arrived
// after the last peek but before the release would otherwise wait for a
// redelivery. It reports whether the lane must be taken again.
func (o *owner) releaseAndRecheck() bool {
	o.release()
	if o.moved() {
		// The lane's partition moved to another stream: take it again
		// there at once (begin binds the new stream), so what the new
		// stream holds does not wait for a redelivery. A stream being
		// recreated is taken again by a delivery of its new incarnation.
		return !o.w.draining() && !o.w.inboxes.ForLane(o.lane).Stale()
	}
	if o.entry == nil {
		return false
	}
	next, err := o.peek(o.w.hardCtx, o.entry.CommittedSeq+1)
	return err == nil && next != nil && !o.w.draining()
}

// noteWriteErr remembers the last failed durable write of the lane, for
// settle.
func (o *owner) noteWriteErr(err error) {
	if err != nil && !errors.Is(err, kv.ErrNoChange) {
		o.lastWriteErr = err
	}
}

var monoBase = time.Now()

func mono() int64 { return int64(time.Since(monoBase)) }
