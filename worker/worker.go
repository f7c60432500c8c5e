package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/agentfleet/agentfleet/session"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/telemetry"
	"github.com/agentfleet/agentfleet/transcript"
)

// Worker consumes wake-ups from the shared workers consumer and runs the
// lane protocol for the lanes it owns.
type Worker struct {
	cfg Config
	nc  *nats.Conn
	js  jetstream.JetStream
	// ajs is js's connection with the asynchronous publisher (see New).
	ajs    jetstream.JetStream
	res    *broker.Resources
	names  broker.Names
	store  *kv.Store
	leases *kv.Leases
	live   *liveness
	msgids *kv.MsgIDs
	tx     *transcript.Log
	owner  string
	log    *slog.Logger
	tracer trace.Tracer
	cache  *agentCache

	// acquireLease is leases.AcquireBound, renewLease leases.Renew and
	// releaseLease leases.Release, for the lane leases (a test may wrap
	// them).
	acquireLease func(ctx context.Context, lane, owner string, live uint64) (*kv.Lease, error)
	renewLease   func(ctx context.Context, lease *kv.Lease) error
	releaseLease func(ctx context.Context, lease *kv.Lease) error

	// pullInbox starts a pull on an inbox stream's workers consumer (a
	// test may wrap it).
	pullInbox func(in *broker.Inbox) (jetstream.MessagesContext, error)

	inboxes   *broker.InboxSet
	mu        sync.Mutex
	lanes     map[string]*lane
	laneSlots chan struct{}
	turns     *turnGate
	wg        sync.WaitGroup

	// inboxNotes are the inbox streams to read again, for the watcher
	// (watchInboxes): told of by advisories, or handed over by the pull
	// loops and forwards (recheck).
	inboxNotes *inboxAdvisories

	drainCh   chan struct{} // closed when a graceful stop begins
	hardCtx   context.Context
	hardStop  context.CancelFunc
	drainOnce sync.Once

	stats         Stats
	started       time.Time
	watcherLeader atomic.Bool
	heldElsewhere sync.Map // lane -> heldInfo: another worker is known to hold it (forward.go)
	fwd           forwards

	// mayHold holds the lanes this worker no longer runs whose lease it
	// may still hold (a release whose delete failed, an ownership given
	// up with the lease not proven taken): lane -> time.Time until which
	// it may (see owner.leftHeld, drainingForward).
	mayHold sync.Map
	// kept holds the lane leases whose release could not delete them
	// (lane -> *keptLease), so that the lane's next runner on this worker
	// can take its own lease back at once (see owner.reclaimKept) rather
	// than wait for it to run out.
	kept sync.Map

	// backlog is the watcher leader's last inbox backlog count (backlog.go).
	backlog atomic.Pointer[telemetry.Backlog]
}

// pullExpiry is how long a pull request of the worker waits on the server.
// A worker that stops without closing its connection (paused, hung) may
// have one pending that long, which takes a wake-up it will not handle.
const pullExpiry = 5 * time.Second

// Stats are counters of a worker's activity.
type Stats struct {
	Turns       atomic.Int64
	TurnsFailed atomic.Int64
	Takeovers   atomic.Int64
	Recoveries  atomic.Int64
	DeadLetters atomic.Int64
	Redelivered atomic.Int64
	// HeldElsewhere counts deliveries handed back because another worker
	// held the lane's lease (as the server judged it, or as this worker saw
	// it a moment before).
	HeldElsewhere atomic.Int64
	// Forwarded counts the deliveries this worker forwarded to the worker
	// holding their lane; ForwardsReceived those other workers forwarded
	// to it (see forward.go).
	// ForwardsBounced counts forwards the server answered with "no
	// responders" (their target was gone): handed back at once.
	Forwarded        atomic.Int64
	ForwardsReceived atomic.Int64
	ForwardsBounced  atomic.Int64
	// ForwardsStale counts forwards handed back because their delivery
	// came from another incarnation of the inbox stream than the one
	// this worker found current (the stream was deleted and made again).
	ForwardsStale atomic.Int64
	// Sweeps counts the expiry sweeps this worker ran as the watcher's
	// leader.
	Sweeps atomic.Int64
	// ExpiryWakes counts the lanes this worker woke, as the watcher's
	// leader, when their lease expired with work pending.
	ExpiryWakes atomic.Int64
	// LivenessLost counts the times this worker found its liveness lease
	// gone while it ran (its lanes could be taken over although it was
	// alive: a spurious takeover). LeasesLost counts the lane leases it
	// lost while owning them, for any reason. DeadOwnerTakeovers counts
	// the lanes it took over from an owner whose liveness lease was gone.
	LivenessLost       atomic.Int64
	LeasesLost         atomic.Int64
	DeadOwnerTakeovers atomic.Int64
}

// New returns a worker over provisioned resources.
func New(nc *nats.Conn, js jetstream.JetStream, res *broker.Resources, cfg Config) (*Worker, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	tx, err := transcript.New(js, c.Names, nil)
	if err != nil {
		return nil, err
	}
	// The publishes whose PubAck a turn reads later (a reply sent while the
	// turn's end is appended, the msgids claims sent while its intent is
	// recorded) go through the asynchronous publisher: no goroutine each.
	ajs, err := jetstream.New(js.Conn(), jetstream.WithPublishAsyncTimeout(asyncAckTimeout))
	if err != nil {
		return nil, err
	}
	var inc [4]byte
	_, _ = rand.Read(inc[:])
	w := &Worker{
		cfg:       c,
		nc:        nc,
		js:        js,
		res:       res,
		names:     c.Names,
		store:     kv.NewStore(res, &kv.StoreOptions{Now: c.Now}),
		leases:    kv.NewLeases(js, res, c.Names, c.LeaseTTL),
		live:      newLiveness(kv.NewLeases(js, res, c.Names, c.LivenessTTL), c.LivenessTTL),
		ajs:       ajs,
		msgids:    kv.NewMsgIDsAsync(res, ajs),
		inboxes:   res.Inboxes,
		tx:        tx,
		owner:     c.ID + "/" + hex.EncodeToString(inc[:]),
		cache:     newAgentCache(c.CacheSize, c.CacheIdleTTL),
		lanes:     map[string]*lane{},
		laneSlots: make(chan struct{}, c.MaxLanes),
		turns:     newTurnGate(c.MaxTurns),
		drainCh:   make(chan struct{}),
		started:   time.Now(),
	}
	w.inboxNotes = newInboxAdvisories()
	w.acquireLease = w.leases.AcquireBound
	w.pullInbox = func(in *broker.Inbox) (jetstream.MessagesContext, error) {
		return in.Consumer.Messages(jetstream.PullMaxMessages(4), jetstream.PullExpiry(pullExpiry))
	}
	w.renewLease = w.leases.Renew
	w.releaseLease = w.leases.Release
	w.log = c.Logger.With(slog.String("worker", w.owner))
	w.cache.metrics = c.Metrics
	w.tracer = telemetry.Tracer(c.TracerProvider)
	w.hardCtx, w.hardStop = context.WithCancel(context.Background())
	return w, nil
}

// Owner is the owner id this worker writes into leases and entries.
func (w *Worker) Owner() string { return w.owner }

// Stats returns the worker's counters.
func (w *Worker) Stats() *Stats { return &w.stats }

// LanesOwned returns how many lanes the worker holds now.
func (w *Worker) LanesOwned() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.lanes)
}

// Run pulls wake-ups until ctx is cancelled, then stops gracefully: it stops
// pulling, hands back what it had buffered, releases idle lanes at once,
// marks running turns resume_pending, waits up to the drain timeout, cancels
// what is left and releases everything. Run returns when all of that is done.
func (w *Worker) Run(ctx context.Context) error {
	for _, in := range w.inboxes.All() {
		if err := broker.AssertWorkersConsumer(ctx, in.Consumer, w.cfg.LeaseTTL); err != nil {
			return err
		}
	}
	if err := w.startLiveness(ctx); err != nil {
		return err
	}
	liveStop := make(chan struct{})
	liveDone := make(chan struct{})
	go func() { defer close(liveDone); w.livenessLoop(liveStop) }()
	defer func() { close(liveStop); <-liveDone }()
	pulls := &pullers{w: w, by: map[string]*puller{}, quit: make(chan struct{})}
	if err := pulls.reconcile(); err != nil {
		pulls.stopAll()
		return err
	}
	// Follow the inbox map: a migration adds and removes streams, and
	// moves partitions between them.
	mapCtx, mapStop := context.WithCancel(context.Background())
	mapDone := make(chan struct{})
	go func() { defer close(mapDone); w.inboxes.Watch(mapCtx) }()
	checkDone := make(chan struct{})
	go func() { defer close(checkDone); w.watchInboxes(mapCtx) }()
	defer func() { mapStop(); <-mapDone; <-checkDone }()
	evictSub, err := w.nc.Subscribe(w.names.EvictSubject(), func(m *nats.Msg) {
		w.cache.evictSession(string(m.Data))
	})
	if err != nil {
		pulls.stopAll()
		return fmt.Errorf("worker: subscribe evictions: %w", err)
	}
	defer evictSub.Unsubscribe() //nolint:errcheck
	unsubFwd, err := w.subscribeForwards()
	if err != nil {
		pulls.stopAll()
		return fmt.Errorf("worker: subscribe forwards: %w", err)
	}
	defer unsubFwd()

	sweepDone := make(chan struct{})
	go func() {
		defer close(sweepDone)
		t := time.NewTicker(time.Minute)
		defer t.Stop()
		for {
			select {
			case <-w.drainCh:
				return
			case <-t.C:
				now := time.Now()
				w.cache.sweep(now)
				w.heldElsewhere.Range(func(k, v any) bool {
					if now.After(v.(heldInfo).until) {
						w.heldElsewhere.Delete(k)
					}
					return true
				})
				w.mayHold.Range(func(k, v any) bool {
					if now.After(v.(time.Time)) {
						w.mayHold.CompareAndDelete(k, v)
					}
					return true
				})
				w.kept.Range(func(k, v any) bool {
					if now.After(v.(*keptLease).until) {
						w.kept.CompareAndDelete(k, v)
					}
					return true
				})
			}
		}
	}()

	bgStop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { defer bg.Done(); w.heartbeatLoop(bgStop) }()
	go func() { defer bg.Done(); w.watcherLoop(bgStop) }()

	w.log.Info("worker started", slog.Duration("lease_ttl", w.cfg.LeaseTTL), slog.Duration("liveness_ttl", w.cfg.LivenessTTL), slog.Int("max_lanes", w.cfg.MaxLanes), slog.Int("max_turns", w.cfg.MaxTurns),
		slog.Int("inbox_streams", len(w.inboxes.All())))
	var runErr error
	// A pull that did not start (its consumer is not there yet, say) is
	// tried again with backoff until it starts, its stream leaves the map
	// or the worker stops; a change of the map tries it at once.
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval = 250*time.Millisecond, 5*time.Second
	var retry <-chan time.Time
	for running := true; running; {
		select {
		case <-ctx.Done():
			running = false
			continue
		case <-w.inboxes.Changed():
			// A migration changed the map, or an inbox stream was found
			// recreated (InboxSet.Reopen): the pulls follow.
		case <-retry:
		}
		if err := pulls.reconcile(); err != nil {
			wait := bo.NextBackOff()
			w.log.Warn("follow the inbox map: a pull did not start; tried again", slog.Duration("in", wait), slog.Any("error", err))
			retry = time.After(wait)
		} else {
			bo.Reset()
			retry = nil
		}
	}
	w.beginDrain()
	pulls.drainAll()
	// A forwarded delivery starts its runner under w.mu only when no drain
	// began: after this, no runner is added to w.wg.
	w.mu.Lock()
	w.mu.Unlock() //nolint:staticcheck // an empty critical section is the barrier
	// Wait for lanes to finish their drain, then hard-stop whatever is left.
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(w.cfg.DrainTimeout + w.cfg.LeaseTTL):
		w.hardStop()
		<-done
	}
	w.hardStop()
	close(bgStop)
	bg.Wait()
	if err := w.heartbeat(StateStopped, stoppedRecordTTL); err != nil {
		w.log.Warn("record clean stop", slog.Any("error", err))
	}
	<-sweepDone
	w.cache.closeAll()
	// Every lane has ended: no publish of ours awaits its ack. The
	// asynchronous publisher's reply subscription goes with the worker, not
	// with the connection (which may outlive it).
	w.ajs.CleanupPublisher()
	w.log.Info("worker stopped")
	return runErr
}

func (w *Worker) beginDrain() {
	w.drainOnce.Do(func() { close(w.drainCh) })
}

func (w *Worker) draining() bool {
	select {
	case <-w.drainCh:
		return true
	default:
		return false
	}
}

// laneOf extracts the lane token from an inbox subject <prefix>.in.<p>.<lane>.
func (w *Worker) laneOf(subject string) (string, bool) {
	parts := strings.SplitN(subject, ".", 4)
	if len(parts) != 4 || parts[0] != w.names.Prefix() || parts[1] != "in" || parts[3] == "" {
		return "", false
	}
	return parts[3], true
}

// dispatch hands a delivery of inbox stream from to the lane's runner,
// starting one if needed. Starting a runner needs a lane slot: at capacity
// it blocks, which stops pulling (it never NAKs in a hot loop).
func (w *Worker) dispatch(from *broker.Inbox, msg jetstream.Msg) {
	if strings.HasPrefix(msg.Subject(), w.names.InboxControlPrefix()) {
		// A migration's drain marker (admin.MigrateInbox): no lane's.
		_ = msg.Ack()
		return
	}
	laneTok, ok := w.laneOf(msg.Subject())
	if !ok {
		w.log.Error("inbox message outside the lane layout; acked and ignored", slog.String("subject", msg.Subject()))
		_ = msg.Ack()
		return
	}
	w.traceDelivery(msg, laneTok)
	redelivered := false
	if md, err := msg.Metadata(); err == nil && md.NumDelivered > 1 {
		redelivered = true
		w.stats.Redelivered.Add(1)
		w.cfg.Metrics.Redelivered(context.Background())
	}
	// Another worker was seen holding this lane a moment ago: forward the
	// delivery to it (forward.go), or hand it back, without a round trip
	// (its owner reads the lane itself). A redelivery always looks at the
	// lease: it was handed back (by a holder that stopped, say) or never
	// acknowledged, so what this worker remembers may be stale.
	if v, ok := w.heldElsewhere.Load(laneTok); ok && !redelivered && msg.Headers().Get(broker.HdrKind) != KindInternalHeader {
		if h := v.(heldInfo); time.Now().Before(h.until) && h.owner != w.owner {
			w.stats.HeldElsewhere.Add(1)
			if !w.forward(h.owner, laneTok, msg, from) {
				_ = msg.NakWithDelay(time.Second)
			}
			return
		}
		w.heldElsewhere.Delete(laneTok)
	}
	w.runLocal(laneTok, msg, from, true)
}

// runLocal hands a delivery of inbox stream from to the lane's runner on
// this worker, starting one if needed. Starting a runner needs a lane slot:
// at capacity it blocks when block is set, and otherwise reports false (the
// delivery untouched). A worker that is draining hands the delivery back.
func (w *Worker) runLocal(laneTok string, msg jetstream.Msg, from *broker.Inbox, block bool) bool {
	w.mu.Lock()
	if l := w.lanes[laneTok]; l != nil && l.offer(msg, from) {
		w.mu.Unlock()
		return true
	}
	w.mu.Unlock()
	if in := w.inboxes.ForLane(laneTok); from != in || in.Stale() {
		// A delivery of a stream the inbox map does not put the lane in:
		// this worker has not seen the map a migration just wrote, or
		// the delivery is of the stream the lane's partition left (drained
		// and committed, then purged). Or of another incarnation of the
		// lane's stream than the one this worker knows (it was deleted
		// and made again: its seqs count from 1 again). Handed back: the
		// lane's owner reads the lane from its stream.
		_ = msg.NakWithDelay(time.Second)
		return true
	}
	if block {
		select {
		case w.laneSlots <- struct{}{}:
		case <-w.drainCh:
			_ = msg.Nak()
			return true
		}
	} else {
		select {
		case w.laneSlots <- struct{}{}:
		default:
			return false
		}
	}
	w.mu.Lock()
	if !block && w.draining() {
		// From another goroutine than Run's loop: no runner may start
		// once the drain began (Run waits for the runners under w.mu).
		w.mu.Unlock()
		<-w.laneSlots
		return false
	}
	if l := w.lanes[laneTok]; l != nil && l.offer(msg, from) {
		w.mu.Unlock()
		<-w.laneSlots
		return true
	}
	l := newLane(w, laneTok)
	l.offer(msg, from)
	w.lanes[laneTok] = l
	w.wg.Add(1)
	w.mu.Unlock()
	go l.run()
	return true
}

// laneExit removes a finished runner and returns the deliveries it was
// handed after it stopped looking.
func (w *Worker) laneExit(l *lane) []jetstream.Msg {
	w.mu.Lock()
	if w.lanes[l.lane] == l {
		delete(w.lanes, l.lane)
	}
	left := l.closeInbox()
	w.mu.Unlock()
	<-w.laneSlots
	w.wg.Done()
	return left
}

// event publishes a lifecycle event (best effort, never blocks a turn).
func (w *Worker) event(kind, laneTok string, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		return
	}
	// A core publish: the events stream stores it; no PubAck is awaited
	// (events are best effort, and the turn path must not pay for them).
	if err := w.nc.Publish(w.names.EventSubject(kind, laneTok), data); err != nil {
		w.log.Debug("event publish", slog.String("kind", kind), slog.Any("error", err))
	}
}

// KindInternalHeader is the Fleet-Kind of the fleet's own wake-ups and
// commands: they skip the "held elsewhere" fast path, since they are sent
// precisely when a lane changes hands.
const KindInternalHeader = broker.KindInternal

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (w *Worker) publishInternal(ctx context.Context, lane, key, cmd, args, msgID string) error {
	body, err := json.Marshal(session.Inbound{SessionKey: key, Kind: session.KindInternal, Command: cmd, Args: args, ReceivedAt: time.Now()})
	if err != nil {
		return err
	}
	msg := nats.NewMsg(w.names.InboxSubject(session.Partition(w.names.Prefix(), lane), lane))
	msg.Data = body
	msg.Header.Set(broker.HdrSessionKey, key)
	msg.Header.Set(broker.HdrKind, session.KindInternal)
	_, err = w.js.PublishMsg(ctx, msg, append(broker.InboxPublishOptions(), jetstream.WithMsgID(msgID))...)
	return err
}

// pullers are the worker's pull loops, one per inbox stream of the map.
type pullers struct {
	w       *Worker
	by      map[string]*puller
	stopped []*puller
	// quit is closed by stopAll: a pull loop waiting for its stream to
	// come back (reopenInbox) stops waiting.
	quit chan struct{}
}

type puller struct {
	in   *broker.Inbox
	it   jetstream.MessagesContext
	done chan struct{}
	quit chan struct{}
	// reconnects is the connection's count of reconnects when in's
	// identity was last known current (see pullLoop).
	reconnects uint64
}

// reconcile starts a pull loop for each stream of the map that has none and
// stops those of streams the map no longer names, and those of an
// incarnation of a stream that is no longer the set's (it was recreated:
// the new pull is on the new incarnation's consumer).
func (ps *pullers) reconcile() error {
	want := map[string]bool{}
	var errs []error
	for _, in := range ps.w.inboxes.All() {
		want[in.Name] = true
		if p := ps.by[in.Name]; p != nil {
			if p.in == in {
				continue
			}
			// What its iterator still buffers is of the old consumer, or
			// of the new one through a pull the old iterator made: either
			// way it is dropped here, and the new consumer hands it out
			// again after its ack wait.
			p.it.Stop()
			ps.stopped = append(ps.stopped, p)
			delete(ps.by, in.Name)
		}
		reconnects := ps.w.nc.Stats().Reconnects
		it, err := ps.w.pullInbox(in)
		if err != nil {
			errs = append(errs, fmt.Errorf("worker: pull %s: %w", in.Name, err))
			continue
		}
		p := &puller{in: in, it: it, done: make(chan struct{}), quit: ps.quit, reconnects: reconnects}
		ps.by[in.Name] = p
		go ps.w.pullLoop(p)
	}
	for name, p := range ps.by {
		if !want[name] {
			// A stream a migration emptied and removes: nothing is left in
			// it to hand out.
			p.it.Stop()
			ps.stopped = append(ps.stopped, p)
			delete(ps.by, name)
		}
	}
	return errors.Join(errs...)
}

// drainAll stops every pull loop, handing back what they had buffered.
func (ps *pullers) drainAll() {
	for _, p := range ps.by {
		p.it.Drain()
	}
	ps.wait()
}

func (ps *pullers) wait() {
	for _, p := range ps.by {
		<-p.done
	}
	for _, p := range ps.stopped {
		<-p.done
	}
}

func (ps *pullers) stopAll() {
	close(ps.quit)
	for _, p := range ps.by {
		p.it.Stop()
	}
	ps.wait()
}

// pullLoop hands the deliveries of one inbox stream to their lanes.
//
// Each delivery is of the incarnation p.in of the stream (see broker.Inbox)
// as long as that is the set's: the loop ends when the consumer reports
// itself deleted, after the set has taken the stream's new incarnation (or
// marked p.in stale until it can: InboxSet.Reopen), and Run starts a pull
// on the new one. A delivery that comes through this loop once p.in is not
// the set's any more is handed back, never compared with a committed seq.
func (w *Worker) pullLoop(p *puller) {
	defer close(p.done)
	for {
		msg, err := p.it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return
			}
			if w.draining() {
				return
			}
			w.log.Warn("pull", slog.String("stream", p.in.Name), slog.Any("error", err))
			switch {
			case errors.Is(err, jetstream.ErrConsumerDeleted):
				// The consumer is gone, and with it, likely, the stream
				// (an operator deleted it; provisioning makes it again,
				// with a new identity and seqs from 1).
				w.reopenInbox(p.in, p.quit)
				return
			case errors.Is(err, jetstream.ErrNoHeartbeat):
				// The server stopped answering the pull: the consumer
				// may be gone. Check the stream's identity.
				if _, err := w.inboxes.Reopen(context.WithoutCancel(w.hardCtx), p.in, false); err != nil {
					w.log.Warn("check inbox stream", slog.String("stream", p.in.Name), slog.Any("error", err))
				}
				if p.in.Stale() && w.inboxes.ByName(p.in.Name) == p.in {
					// Gone, and not back yet: the watcher reads it
					// again until it is (no read here at each
					// missed heartbeat meanwhile).
					w.reopenInbox(p.in, p.quit)
				}
			}
			// Never spin on a failing pull: back off briefly.
			select {
			case <-w.drainCh:
			case <-time.After(250 * time.Millisecond):
			}
			continue
		}
		if w.draining() {
			_ = msg.Nak()
			continue
		}
		if n := w.nc.Stats().Reconnects; n != p.reconnects {
			// The connection came back since: the pull Next sent again
			// then may have been served by a consumer made again while it
			// was down, of which no word (no advisory) reached this
			// worker. Check the stream's identity first.
			if _, err := w.inboxes.Reopen(context.WithoutCancel(w.hardCtx), p.in, false); err != nil {
				w.log.Warn("check inbox stream", slog.String("stream", p.in.Name), slog.Any("error", err))
				_ = msg.NakWithDelay(time.Second)
				if p.in.Stale() && w.inboxes.ByName(p.in.Name) == p.in {
					// Gone, and not back yet: no read here at each
					// delivery meanwhile (see below).
					w.reopenInbox(p.in, p.quit)
				}
				continue
			}
			p.reconnects = n
		}
		if cur := w.inboxes.ByName(p.in.Name); p.in.Stale() || cur != p.in {
			// Of an incarnation of the stream that is not the set's: its
			// seq may count in another stream than the lane's entry.
			_ = msg.NakWithDelay(time.Second)
			if cur == p.in {
				// Known gone, and the set has not the new one yet (a
				// check found the stream missing): the watcher reads it
				// again until it is back, and this loop waits; Run then
				// replaces this pull.
				w.reopenInbox(p.in, p.quit)
			}
			continue
		}
		began := time.Now()
		w.dispatch(p.in, msg)
		if time.Since(began) >= awayCheck {
			// Dispatch waited (for a lane slot, at capacity): the
			// iterator may have had no pull waiting on the server
			// meanwhile, so the consumer could have been deleted with no
			// word to it, and the next pull, which Next sends, would be
			// served by a consumer made again since: check the stream's
			// identity first.
			if _, err := w.inboxes.Reopen(context.WithoutCancel(w.hardCtx), p.in, false); err != nil {
				w.log.Warn("check inbox stream", slog.String("stream", p.in.Name), slog.Any("error", err))
			}
		}
	}
}

// awayCheck is how long the pull loop may spend handing one delivery to its
// lane before it checks the stream's identity (see pullLoop).
const awayCheck = 500 * time.Millisecond

// reopenInbox makes the set take the new incarnation of in's stream, whose
// consumer reported itself deleted or which was found gone: in is marked
// stale at once, and the stream handed to the watcher (watchInboxes), the
// one reader that reads it again until it is back (provisioning makes it
// again); then it waits until the set no longer has in as the stream's (the
// watcher or another reader took its new incarnation, or the map dropped
// it), the worker drains or quit is closed. The watcher reads it at once,
// unless it is reading it again with backoff already (an advisory told it
// of the deletion).
func (w *Worker) reopenInbox(in *broker.Inbox, quit <-chan struct{}) {
	in.MarkStale()
	w.inboxNotes.recheck(in.Name)
	w.log.Warn("reopen inbox stream", slog.String("stream", in.Name), slog.String("was", in.ID))
	for {
		changed := w.inboxes.Changed()
		if cur := w.inboxes.ByName(in.Name); cur != in {
			if cur != nil {
				w.log.Warn("inbox stream reopened", slog.String("stream", in.Name), slog.String("inbox_id", cur.ID), slog.String("was", in.ID))
			}
			return
		}
		select {
		case <-w.drainCh:
			return
		case <-quit:
			return
		case <-changed:
		}
	}
}
