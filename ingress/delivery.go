package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/telemetry"
)

// Settings of the delivery consumer.
const (
	// DeliveryAckWait is the AckWait of the delivery consumer. A reply whose
	// delivery keeps failing is kept alive with InProgress, so it is only
	// redelivered when its process died.
	DeliveryAckWait = 30 * time.Second
	// DeliveryMaxAckPending is how many replies the delivery consumer hands
	// out at once, over every ingress process: a reply whose delivery
	// keeps failing holds up only its own lane.
	DeliveryMaxAckPending = 1024

	// deliveryLanes bounds the lanes one process delivers to at once.
	deliveryLanes = 64
	// deliveryPull is the pull batch of the delivery consumer.
	deliveryPull = 64

	deliveryOpTimeout  = 5 * time.Second
	deliveryBackoffMin = 100 * time.Millisecond
	deliveryBackoffMax = 5 * time.Second
)

// errEarlierPending reports that an earlier reply of the same lane is not
// in the mailbox yet: a lane's replies go in strictly in outbox order.
var errEarlierPending = errors.New("an earlier reply of this lane is not delivered yet")

// Delivery delivers the replies of platform "http": a durable consumer on
// the outbox stream that copies each reply, once and in order, into the
// lane's mailbox <prefix>.box.http.<lane>, which Server serves.
//
// Lanes are delivered independently: each lane's replies are handled one at
// a time, in outbox order, while up to 64 lanes per process (and
// DeliveryMaxAckPending replies over all processes) are in flight, so a
// reply whose delivery keeps failing holds up its own lane only. Order and
// once-only delivery do not rest on the consumer alone (several ingress
// processes share it, and a redelivery can come to another process):
// every mailbox message carries the outbox seq of what it delivers
// (Fleet-Outbox-Seq), and before publishing a reply the delivery reads the
// mailbox's last message. A reply already there is not published again,
// however long ago its copy was stored (the stream's Msg-Id window is
// minutes); a reply whose lane has an earlier reply still undelivered in
// the outbox waits for it. The delivered bucket records delivered reply
// ids as well, which catches a reply republished under a new outbox seq.
//
// Every outbox message of a lane leaves a mailbox message: a reply too
// large for the mailbox is replaced by a notice saying so, and one that
// cannot be read by a marker (Fleet-Kind: skip) that readers pass over.
type Delivery struct {
	js       jetstream.JetStream
	res      *broker.Resources
	names    broker.Names
	log      *slog.Logger
	platform string

	backoffMin, backoffMax time.Duration
	opTimeout              time.Duration
	metrics                *telemetry.Metrics
	tracer                 trace.Tracer

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}

	// lanes holds the replies waiting per outbox subject while that lane's
	// goroutine runs; sem bounds those goroutines; wg waits for them.
	qmu   sync.Mutex
	lanes map[string]*laneQueue
	sem   chan struct{}
	wg    sync.WaitGroup
}

// laneQueue is the replies of one lane waiting for its goroutine, in order.
type laneQueue struct {
	msgs []jetstream.Msg
}

// NewDelivery returns the delivery consumer of platform "http" for the
// resources res provisioned with names. A nil logger discards logs.
func NewDelivery(js jetstream.JetStream, res *broker.Resources, names broker.Names, logger *slog.Logger) *Delivery {
	if names.Prefix() == "" {
		names = broker.MustNames(broker.DefaultPrefix)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	platform := string(session.PlatformHTTP)
	return &Delivery{
		js:         js,
		res:        res,
		names:      names,
		log:        logger.With(slog.String("consumer", names.DeliveryConsumer(platform))),
		platform:   platform,
		backoffMin: deliveryBackoffMin,
		backoffMax: deliveryBackoffMax,
		opTimeout:  deliveryOpTimeout,
		lanes:      map[string]*laneQueue{},
		sem:        make(chan struct{}, deliveryLanes),
	}
}

// SetTracerProvider traces each delivery of a reply, a child of the
// worker's reply publish (nil: none). Call it before Start.
func (d *Delivery) SetTracerProvider(tp trace.TracerProvider) { d.tracer = telemetry.Tracer(tp) }

// traceDelivery starts the span of one delivery of an outbox message: a
// child of the reply publish whose context the message's headers carry,
// linked to it, with the JetStream delivery count.
func (d *Delivery) traceDelivery(ctx context.Context, msg jetstream.Msg) (context.Context, func()) {
	if d.tracer == nil {
		return ctx, nop
	}
	sc := telemetry.SpanContextOf(msg.Headers())
	if !sc.IsValid() {
		return ctx, nop
	}
	var count uint64
	if md, err := msg.Metadata(); err == nil {
		count = md.NumDelivered
	}
	ctx, span := d.tracer.Start(trace.ContextWithRemoteSpanContext(ctx, sc), "reply delivery",
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(telemetry.LinkTo(sc, attribute.String("agentfleet.link", "reply_publish"))...),
		trace.WithAttributes(telemetry.AttrPlatform.String(d.platform), telemetry.AttrDeliveryCount.Int64(int64(count))))
	return ctx, func() { span.End() }
}

func nop() {}

// endSpan ends span (nil: none), recording err.
func endSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// SetMetrics records delivery attempts and failures on m (nil: none).
// Call it before Start.
func (d *Delivery) SetMetrics(m *telemetry.Metrics) {
	d.metrics = m
	m.PlatformDelivery(d.platform)
}

// SetBackoff sets the delay before the first retry of a failed delivery
// (default 100ms); it doubles per attempt up to 5s, or up to first itself
// if that is longer. Delivery retries until it succeeds. Call it before
// Start.
func (d *Delivery) SetBackoff(first time.Duration) {
	if first <= 0 {
		return
	}
	d.backoffMin = first
	d.backoffMax = max(deliveryBackoffMax, first)
}

// ConsumerConfig is the configuration of the durable delivery consumer.
func (d *Delivery) ConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       d.names.DeliveryConsumer(d.platform),
		Description:   "agentfleet delivery of " + d.platform + " replies into lane mailboxes",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       DeliveryAckWait,
		MaxDeliver:    -1,
		MaxAckPending: DeliveryMaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		FilterSubject: d.names.OutboxPlatformFilter(d.platform),
	}
}

// Start creates or updates the durable consumer and starts delivering in a
// goroutine. It returns once consuming has begun; cancelling ctx, or Stop,
// stops it. Start on a running Delivery returns ErrAlreadyStarted; after
// Stop it may be started again.
func (d *Delivery) Start(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cancel != nil {
		return ErrAlreadyStarted
	}
	if d.js == nil || d.res == nil || d.res.Outbox == nil || d.res.Delivered == nil {
		return fmt.Errorf("%w: delivery needs JetStream and provisioned Outbox and Delivered", ErrInvalidConfig)
	}
	it, err := d.open(ctx)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	d.cancel, d.done = cancel, done
	go func() {
		defer close(done)
		d.run(runCtx, it)
	}()
	d.log.LogAttrs(ctx, slog.LevelInfo, "delivery started", slog.String("filter", d.names.OutboxPlatformFilter(d.platform)))
	return nil
}

// Stop stops delivering and waits until the goroutine has returned. A reply
// being retried is NAKed so another process takes it over at once. Stop is
// idempotent and safe without Start.
func (d *Delivery) Stop() {
	d.mu.Lock()
	cancel, done := d.cancel, d.done
	d.cancel, d.done = nil, nil
	d.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
	d.log.Info("delivery stopped")
}

// open creates or updates the consumer and starts pulling.
func (d *Delivery) open(ctx context.Context) (jetstream.MessagesContext, error) {
	cfg := d.ConsumerConfig()
	cctx, cancel := context.WithTimeout(ctx, d.opTimeout)
	defer cancel()
	cons, err := d.res.Outbox.CreateOrUpdateConsumer(cctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("delivery consumer %s: %w", cfg.Durable, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(deliveryPull))
	if err != nil {
		return nil, fmt.Errorf("delivery consumer %s: pull: %w", cfg.Durable, err)
	}
	return it, nil
}

func (d *Delivery) run(ctx context.Context, it jetstream.MessagesContext) {
	// The lane goroutines end when ctx does (NAKing what they hold).
	defer d.wg.Wait()
	backoff := d.backoffMin
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err == nil {
			backoff = d.backoffMin
			d.dispatch(ctx, msg)
			continue
		}
		if ctx.Err() != nil {
			d.handBack(it)
			return
		}
		it.Stop()
		// The iterator ended (consumer deleted, connection closed): make the
		// consumer again and carry on from where it stands.
		d.log.LogAttrs(ctx, slog.LevelWarn, "delivery consumer interrupted; reopening",
			slog.Any("error", err), slog.Duration("retry_in", backoff))
		for {
			if !sleepCtx(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, d.backoffMax)
			if it, err = d.open(ctx); err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			d.log.LogAttrs(ctx, slog.LevelWarn, "cannot reopen the delivery consumer",
				slog.Any("error", err), slog.Duration("retry_in", backoff))
		}
	}
}

// handBack stops pulling and NAKs the replies the iterator had already
// pulled, so another process delivers them at once rather than after
// their AckWait. A pull still in flight is not waited for beyond a moment.
func (d *Delivery) handBack(it jetstream.MessagesContext) {
	it.Drain()
	for {
		m, err := it.Next(jetstream.NextMaxWait(200 * time.Millisecond))
		if err != nil {
			it.Stop()
			return
		}
		_ = m.Nak()
	}
}

// dispatch queues msg behind the replies of its lane this process holds,
// starting the lane's goroutine when it has none. With every lane slot
// busy it waits for one (the consumer's MaxAckPending bounds what is held).
func (d *Delivery) dispatch(ctx context.Context, msg jetstream.Msg) {
	key := msg.Subject()
	d.qmu.Lock()
	if q, ok := d.lanes[key]; ok {
		q.msgs = append(q.msgs, msg)
		d.qmu.Unlock()
		return
	}
	q := &laneQueue{msgs: []jetstream.Msg{msg}}
	d.lanes[key] = q
	d.qmu.Unlock()
	slot := false
	select {
	case d.sem <- struct{}{}:
		slot = true
	case <-ctx.Done(): // runLane NAKs what the lane holds
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if slot {
			defer func() { <-d.sem }()
		}
		d.runLane(ctx, key, q)
	}()
}

// runLane delivers a lane's queued replies one at a time, in order.
func (d *Delivery) runLane(ctx context.Context, key string, q *laneQueue) {
	// The replies queued behind one that is being retried must not reach
	// their AckWait meanwhile.
	keep := func() {
		d.qmu.Lock()
		defer d.qmu.Unlock()
		for _, m := range q.msgs {
			_ = m.InProgress()
		}
	}
	// yield puts msg (at stream seq seq, waiting for an earlier reply of
	// its lane) back into the queue when the queue holds an earlier one:
	// that one is delivered first. Without it, the two waited for each
	// other for ever (keep kept the queued one alive).
	yield := func(seq uint64, msg jetstream.Msg) bool {
		d.qmu.Lock()
		defer d.qmu.Unlock()
		for _, m := range q.msgs {
			if s := streamSeq(m); s != 0 && s < seq {
				q.msgs = append(q.msgs, msg)
				return true
			}
		}
		return false
	}
	for {
		d.qmu.Lock()
		if len(q.msgs) == 0 {
			delete(d.lanes, key)
			d.qmu.Unlock()
			return
		}
		// The earliest first: a redelivery (its first delivery timed out
		// elsewhere, e.g. in a partition) can queue behind a later reply
		// of the lane, which waits for it (errEarlierPending).
		i := earliest(q.msgs)
		msg := q.msgs[i]
		q.msgs = slices.Delete(q.msgs, i, i+1)
		d.qmu.Unlock()
		if ctx.Err() != nil {
			_ = msg.Nak()
			continue
		}
		d.handle(ctx, msg, keep, yield)
	}
}

// earliest is the index of the message with the lowest stream sequence.
func earliest(msgs []jetstream.Msg) int {
	best, bestSeq := 0, uint64(0)
	for i, m := range msgs {
		s := streamSeq(m)
		if i == 0 || s != 0 && (bestSeq == 0 || s < bestSeq) {
			best, bestSeq = i, s
		}
	}
	return best
}

func streamSeq(m jetstream.Msg) uint64 {
	md, err := m.Metadata()
	if err != nil {
		return 0
	}
	return md.Sequence.Stream
}

// boxItem is what a mailbox gets for one outbox message.
type boxItem struct {
	// replyID is the reply's id, recorded in the delivered bucket; empty
	// for a marker.
	replyID string
	msgID   string
	data    []byte
	header  nats.Header
	// notice marks the notice that stands in for a reply too large.
	notice bool
}

// handle delivers one outbox message, retrying until its mailbox holds it,
// and acks it. keep keeps the lane's queued replies alive while it retries.
func (d *Delivery) handle(ctx context.Context, msg jetstream.Msg, keep func(), yield func(uint64, jetstream.Msg) bool) {
	ctx, end := d.traceDelivery(ctx, msg)
	defer end()
	var seq uint64
	if md, err := msg.Metadata(); err == nil {
		seq = md.Sequence.Stream
	}
	lane, rep, err := d.decode(msg)
	if err != nil {
		if lane == "" || seq == 0 {
			d.undeliverable(ctx, msg, lane, "", err)
			return
		}
		// Leave a marker, so the lane's later replies need not wait for this one.
		item := boxItem{msgID: fmt.Sprintf("box:%s:skip:%d", d.platform, seq), header: nats.Header{}}
		item.header.Set(broker.HdrKind, broker.KindSkip)
		item.header.Set(broker.HdrReason, err.Error())
		if d.deliverRetrying(ctx, msg, seq, lane, item, keep, yield, d.log.With(slog.String("lane", lane))) {
			d.undeliverable(ctx, msg, lane, "", err)
		}
		return
	}
	log := d.log.With(slog.String("session_key", rep.SessionKey), slog.String("reply_id", rep.ID),
		slog.String("lane", lane))
	item := d.replyItem(rep, msg.Data())
	if size := d.boxSize(item, seq); size > d.maxPayload() && d.maxPayload() > 0 {
		// The mailbox copy, with its headers, is larger than the server
		// takes: the user gets a notice in its place.
		d.undeliverableNotice(ctx, msg, seq, lane, rep, fmt.Errorf("the mailbox copy is %d bytes, the server takes %d: %w", size, d.maxPayload(), nats.ErrMaxPayload), keep, log)
		return
	}
	if !d.deliverRetrying(ctx, msg, seq, lane, item, keep, yield, log) {
		return
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.opTimeout)
	defer cancel()
	if err := msg.DoubleAck(actx); err != nil {
		// The redelivery finds the reply in the mailbox and acks it.
		log.LogAttrs(ctx, slog.LevelWarn, "reply ack failed", slog.Any("error", err))
	}
}

// deliverRetrying puts item into the lane's mailbox, retrying with backoff
// until it is there. It reports false when it gave up: ctx ended (msg was
// NAKed), the error is permanent (then the reply is replaced by a notice
// and settled), or msg waits for an earlier reply that is queued behind it
// (yield put msg back into the lane's queue; nil yield: never).
func (d *Delivery) deliverRetrying(ctx context.Context, msg jetstream.Msg, seq uint64, lane string, item boxItem, keep func(), yield func(uint64, jetstream.Msg) bool, log *slog.Logger) bool {
	backoff := d.backoffMin
	for attempt := 1; ; attempt++ {
		actx, span := ctx, trace.Span(nil)
		if d.tracer != nil {
			actx, span = d.tracer.Start(ctx, "mailbox put", trace.WithAttributes(attribute.Int("agentfleet.attempt", attempt)))
		}
		dup, boxSeq, err := d.deliver(actx, msg.Subject(), seq, lane, item)
		endSpan(span, err)
		d.metrics.DeliveryAttempt(ctx, d.platform, err)
		if err == nil {
			log.LogAttrs(ctx, slog.LevelDebug, "reply delivered",
				slog.Bool("duplicate", dup), slog.Uint64("box_seq", boxSeq), slog.Int("attempt", attempt))
			return true
		}
		if ctx.Err() != nil {
			_ = msg.Nak()
			return false
		}
		if permanent(err) {
			if item.replyID == "" || item.notice {
				d.undeliverable(ctx, msg, lane, item.replyID, err)
				return false
			}
			var rep session.Reply
			_ = json.Unmarshal(item.data, &rep)
			rep.SessionKey = item.header.Get(broker.HdrSessionKey)
			d.undeliverableNotice(ctx, msg, seq, lane, &rep, err, keep, log)
			return false
		}
		if errors.Is(err, errEarlierPending) && yield != nil && yield(seq, msg) {
			_ = msg.InProgress()
			return false
		}
		level, what := slog.LevelWarn, "reply delivery failed; retrying"
		if errors.Is(err, errEarlierPending) {
			level, what = slog.LevelDebug, "reply waits for an earlier reply of its lane"
		}
		log.LogAttrs(ctx, level, what,
			slog.Int("attempt", attempt), slog.Duration("retry_in", backoff), slog.Any("error", err))
		_ = msg.InProgress()
		keep()
		if !sleepCtx(ctx, backoff) {
			_ = msg.Nak()
			return false
		}
		backoff = min(2*backoff, d.backoffMax)
	}
}

// replyItem is the mailbox copy of a reply.
func (d *Delivery) replyItem(rep *session.Reply, data []byte) boxItem {
	h := nats.Header{}
	h.Set(broker.HdrSessionKey, rep.SessionKey)
	if rep.SessionID != "" {
		h.Set(broker.HdrSessionID, rep.SessionID)
	}
	if rep.TurnID != "" {
		h.Set(broker.HdrTurnID, rep.TurnID)
	}
	return boxItem{replyID: rep.ID, msgID: d.boxMsgID(rep.ID), data: data, header: h}
}

// boxSize is the size the server counts for item's publish.
func (d *Delivery) boxSize(item boxItem, seq uint64) int64 {
	size := len(item.data) + len("NATS/1.0\r\n\r\n") +
		len(broker.HdrMsgID) + len(item.msgID) + 4 +
		len("Nats-Expected-Stream") + len(d.names.OutboxStream()) + 4 +
		len(broker.HdrOutboxSeq) + len(strconv.FormatUint(seq, 10)) + 4
	for k, vs := range item.header {
		for _, v := range vs {
			size += len(k) + len(v) + 4
		}
	}
	return int64(size)
}

func (d *Delivery) maxPayload() int64 {
	if nc := d.js.Conn(); nc != nil {
		return nc.MaxPayload()
	}
	return 0
}

// undeliverableNotice replaces a reply that cannot go into the mailbox (too
// large) by a notice telling the user so, acks it, and reports it.
func (d *Delivery) undeliverableNotice(ctx context.Context, msg jetstream.Msg, seq uint64, lane string, rep *session.Reply, cause error, keep func(), log *slog.Logger) {
	notice := *rep
	notice.Kind = session.ReplyKindNotice
	notice.Text = "⚠️ A reply to this conversation was too large to deliver here, so it was dropped. Ask again for a shorter answer."
	data, err := json.Marshal(notice)
	if err != nil {
		d.undeliverable(ctx, msg, lane, rep.ID, cause)
		return
	}
	item := d.replyItem(&notice, data)
	item.notice = true
	if !d.deliverRetrying(ctx, msg, seq, lane, item, keep, nil, log) {
		return
	}
	d.undeliverable(ctx, msg, lane, rep.ID, cause)
}

// permanent reports whether a delivery error cannot go away by retrying:
// the mailbox copy is larger than the server takes.
func permanent(err error) bool {
	var ae *jetstream.APIError
	return errors.Is(err, nats.ErrMaxPayload) ||
		errors.As(err, &ae) && ae.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum
}

// undeliverable settles a reply that retrying cannot deliver (its mailbox
// got a notice or a marker in its place, when its lane is known): it is
// terminated (it stays in the outbox for inspection), logged, and reported
// on the events stream (<prefix>.ev.undeliverable.<lane>) where operators
// and alerts watch.
func (d *Delivery) undeliverable(ctx context.Context, msg jetstream.Msg, lane, replyID string, cause error) {
	var seq uint64
	if md, err := msg.Metadata(); err == nil {
		seq = md.Sequence.Stream
	}
	d.log.LogAttrs(ctx, slog.LevelError, "undeliverable reply terminated",
		slog.String("subject", msg.Subject()), slog.String("reply_id", replyID),
		slog.Uint64("outbox_seq", seq), slog.Any("error", cause))
	_ = msg.TermWithReason(cause.Error())
	if lane == "" {
		lane = "_"
	}
	ev, _ := json.Marshal(map[string]any{"platform": d.platform, "subject": msg.Subject(), "reply_id": replyID,
		"outbox_seq": seq, "error": cause.Error(), "at": time.Now().UTC()})
	if err := d.js.Conn().Publish(d.names.EventSubject("undeliverable", lane), ev); err != nil {
		d.log.LogAttrs(ctx, slog.LevelWarn, "undeliverable event not published", slog.Any("error", err))
	}
}

// decode returns the lane (from the subject) and the reply of msg. The
// lane is returned whenever the subject names one, also with an error
// about the body.
func (d *Delivery) decode(msg jetstream.Msg) (string, *session.Reply, error) {
	prefix := strings.TrimSuffix(d.names.OutboxPlatformFilter(d.platform), ">")
	lane, ok := strings.CutPrefix(msg.Subject(), prefix)
	if !ok {
		return "", nil, fmt.Errorf("subject %q is not under %s", msg.Subject(), prefix)
	}
	key, err := session.ParseLaneToken(lane)
	if err != nil {
		return "", nil, fmt.Errorf("subject %q: %w", msg.Subject(), err)
	}
	var rep session.Reply
	if err := json.Unmarshal(msg.Data(), &rep); err != nil {
		return lane, nil, fmt.Errorf("reply body: %w", err)
	}
	if rep.ID == "" {
		return lane, nil, errors.New("reply has no id")
	}
	if rep.SessionKey != "" && rep.SessionKey != key {
		d.log.Warn("reply session key differs from its subject; delivering by subject",
			slog.String("reply_id", rep.ID), slog.String("reply_session_key", rep.SessionKey), slog.String("lane", lane))
	}
	rep.SessionKey = key // the mailbox it goes to
	return lane, &rep, nil
}

// deliver puts item, standing for the outbox message at seq on subject
// outSubj, into the lane's mailbox unless the mailbox already holds it,
// then records a reply as delivered. Each step is idempotent, so a failure
// at any point is retried from the top. The writes run to their own
// timeout, not ctx: a Stop does not cut a delivery in half.
//
// What the mailbox holds is read from its last message (a lane's mailbox
// is filled in outbox order): its Msg-Id, or an outbox seq at or above
// seq, means item is there already, however long ago it was stored. When
// the outbox holds an earlier message of the lane above that last one,
// item waits (errEarlierPending).
func (d *Delivery) deliver(ctx context.Context, outSubj string, seq uint64, lane string, item boxItem) (dup bool, boxSeq uint64, err error) {
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.opTimeout)
	defer cancel()
	key := ""
	if item.replyID != "" {
		key = session.LaneToken(item.replyID)
		if _, err := d.res.Delivered.Get(octx, key); err == nil {
			return true, 0, nil
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return false, 0, fmt.Errorf("check delivered %s: %w", key, err)
		}
	}
	subject := d.names.BoxSubject(d.platform, lane)
	there, lastSeq, known, err := d.inMailbox(octx, subject, item.msgID, seq)
	if err != nil {
		return false, 0, err
	}
	if !there && known && seq > 0 {
		if err := d.earlierDone(octx, outSubj, lastSeq+1, seq); err != nil {
			return false, 0, err
		}
	}
	if !there {
		box := nats.NewMsg(subject)
		box.Data = item.data
		for k, v := range item.header {
			box.Header[k] = v
		}
		if seq > 0 {
			box.Header.Set(broker.HdrOutboxSeq, strconv.FormatUint(seq, 10))
		}
		ack, err := d.js.PublishMsg(octx, box,
			jetstream.WithMsgID(item.msgID),
			jetstream.WithExpectStream(d.names.OutboxStream()))
		if err != nil {
			return false, 0, fmt.Errorf("publish to %s: %w", box.Subject, err)
		}
		dup, boxSeq = ack.Duplicate, ack.Sequence
	} else {
		dup = true
	}
	if key != "" {
		if _, err := d.res.Delivered.Put(octx, key, []byte(strconv.FormatUint(boxSeq, 10))); err != nil {
			return false, 0, fmt.Errorf("record delivered %s: %w", key, err)
		}
	}
	return dup, boxSeq, nil
}

// maxEarlierScan bounds the earlier outbox messages of a lane earlierDone
// looks at; past it, the reply waits as if one were pending.
const maxEarlierScan = 64

// earlierDone checks the outbox messages of subject outSubj from seq from
// up to (not including) seq: each must be a reply already recorded as
// delivered (a republished duplicate, which left nothing in the mailbox),
// else an earlier reply of the lane is pending (errEarlierPending).
func (d *Delivery) earlierDone(ctx context.Context, outSubj string, from, seq uint64) error {
	for i := 0; from < seq; i++ {
		// From the leader: a lagging replica's "none" would let this
		// reply overtake an earlier one, which the mailbox's last seq
		// then shows as delivered (the earlier reply lost).
		next, err := broker.LeaderGet(ctx, d.js, d.names.OutboxStream(), broker.LeaderGetRequest{Seq: from, NextBySubject: outSubj})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("check earlier replies on %s: %w", outSubj, err)
		}
		if next.Sequence >= seq {
			return nil
		}
		pending := fmt.Errorf("%w (outbox seq %d before %d)", errEarlierPending, next.Sequence, seq)
		if i >= maxEarlierScan {
			return pending
		}
		var rep session.Reply
		if json.Unmarshal(next.Data, &rep) != nil || rep.ID == "" {
			return pending
		}
		if _, err := d.res.Delivered.Get(ctx, session.LaneToken(rep.ID)); errors.Is(err, jetstream.ErrKeyNotFound) {
			return pending
		} else if err != nil {
			return fmt.Errorf("check delivered %s: %w", rep.ID, err)
		}
		from = next.Sequence + 1
	}
	return nil
}

// inMailbox reads the last message of a mailbox: there reports that it is
// msgID's, or delivers outbox seq seq or a later one; lastSeq is the outbox
// seq it delivers, known whether that is known (an empty mailbox is 0; one
// written before mailboxes carried the seq is unknown).
func (d *Delivery) inMailbox(ctx context.Context, subject, msgID string, seq uint64) (there bool, lastSeq uint64, known bool, err error) {
	last, err := d.res.Outbox.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, 0, true, nil
	}
	if err != nil {
		return false, 0, false, fmt.Errorf("read the last message of %s: %w", subject, err)
	}
	if last.Header.Get(broker.HdrMsgID) == msgID {
		return true, 0, false, nil
	}
	v := last.Header.Get(broker.HdrOutboxSeq)
	if v == "" {
		return false, 0, false, nil
	}
	lastSeq, err = strconv.ParseUint(v, 10, 64)
	if err != nil {
		return false, 0, false, nil
	}
	return seq > 0 && lastSeq >= seq, lastSeq, true, nil
}

// boxMsgID is the Nats-Msg-Id of a reply in its mailbox. It is not the
// reply id itself: mailboxes live in the outbox stream, whose Msg-Id window
// already holds the reply id (the worker's publish), and would drop the
// mailbox copy as a duplicate of it.
func (d *Delivery) boxMsgID(replyID string) string { return "box:" + d.platform + ":" + replyID }

// sleepCtx waits for d or until ctx ends; it reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
