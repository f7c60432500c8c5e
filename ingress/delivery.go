package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
)

// Settings of the delivery consumer.
const (
	// DeliveryAckWait is the AckWait of the delivery consumer. A reply whose
	// delivery keeps failing is kept alive with InProgress, so it is only
	// redelivered when its process died.
	DeliveryAckWait = 30 * time.Second

	deliveryOpTimeout  = 5 * time.Second
	deliveryBackoffMin = 100 * time.Millisecond
	deliveryBackoffMax = 5 * time.Second
)

// Delivery delivers the replies of platform "http": a durable consumer on
// the outbox stream that copies each reply, once and in order, into the
// lane's mailbox <prefix>.box.http.<lane>, which Server serves.
//
// Messages are handled strictly one at a time. The consumer has
// MaxAckPending 1, so even with several ingress processes running a Delivery
// (they share the durable consumer) a reply is only handed out once the one
// before it is acked: a later reply never overtakes an earlier one, also
// when that one is being retried. A reply whose id is in the delivered
// bucket is acked without a second copy; the mailbox publish also carries
// a Msg-Id derived from the reply id ("box:http:<reply id>").
type Delivery struct {
	js       jetstream.JetStream
	res      *broker.Resources
	names    broker.Names
	log      *slog.Logger
	platform string

	backoffMin, backoffMax time.Duration
	opTimeout              time.Duration

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
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
	}
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
		MaxAckPending: 1,
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

// open creates or updates the consumer and starts pulling, one message at a
// time (a buffered message would age towards its AckWait).
func (d *Delivery) open(ctx context.Context) (jetstream.MessagesContext, error) {
	cfg := d.ConsumerConfig()
	cctx, cancel := context.WithTimeout(ctx, d.opTimeout)
	defer cancel()
	cons, err := d.res.Outbox.CreateOrUpdateConsumer(cctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("delivery consumer %s: %w", cfg.Durable, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1))
	if err != nil {
		return nil, fmt.Errorf("delivery consumer %s: pull: %w", cfg.Durable, err)
	}
	return it, nil
}

func (d *Delivery) run(ctx context.Context, it jetstream.MessagesContext) {
	backoff := d.backoffMin
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err == nil {
			backoff = d.backoffMin
			d.handle(ctx, msg)
			continue
		}
		it.Stop()
		if ctx.Err() != nil {
			return
		}
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

// handle delivers one reply, retrying until it is delivered, and acks it.
func (d *Delivery) handle(ctx context.Context, msg jetstream.Msg) {
	lane, rep, err := d.decode(msg)
	if err != nil {
		d.undeliverable(ctx, msg, lane, "", err)
		return
	}
	log := d.log.With(slog.String("session_key", rep.SessionKey), slog.String("reply_id", rep.ID),
		slog.String("lane", lane))
	backoff := d.backoffMin
	for attempt := 1; ; attempt++ {
		dup, boxSeq, err := d.deliver(ctx, lane, rep, msg.Data())
		if err == nil {
			log.LogAttrs(ctx, slog.LevelDebug, "reply delivered",
				slog.Bool("duplicate", dup), slog.Uint64("box_seq", boxSeq), slog.Int("attempt", attempt))
			break
		}
		if ctx.Err() != nil {
			_ = msg.Nak()
			return
		}
		if permanent(err) {
			d.undeliverable(ctx, msg, lane, rep.ID, err)
			return
		}
		log.LogAttrs(ctx, slog.LevelWarn, "reply delivery failed; retrying",
			slog.Int("attempt", attempt), slog.Duration("retry_in", backoff), slog.Any("error", err))
		_ = msg.InProgress()
		if !sleepCtx(ctx, backoff) {
			_ = msg.Nak()
			return
		}
		backoff = min(2*backoff, d.backoffMax)
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.opTimeout)
	defer cancel()
	if err := msg.DoubleAck(actx); err != nil {
		// The redelivery finds the reply in the delivered bucket and acks it.
		log.LogAttrs(ctx, slog.LevelWarn, "reply ack failed", slog.Any("error", err))
	}
}

// permanent reports whether a delivery error cannot go away by retrying:
// the mailbox copy is larger than the server takes.
func permanent(err error) bool {
	var ae *jetstream.APIError
	return errors.Is(err, nats.ErrMaxPayload) ||
		errors.As(err, &ae) && ae.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum
}

// undeliverable gives up on a reply that retrying cannot deliver: with
// MaxAckPending 1, retrying it would hold up every later reply of the
// platform. It is terminated (it stays in the outbox for inspection),
// logged, and reported on the events stream (<prefix>.ev.undeliverable.<lane>)
// where operators and alerts watch.
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

// decode returns the lane (from the subject) and the reply of msg.
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
		return "", nil, fmt.Errorf("reply body: %w", err)
	}
	if rep.ID == "" {
		return "", nil, errors.New("reply has no id")
	}
	if rep.SessionKey != "" && rep.SessionKey != key {
		d.log.Warn("reply session key differs from its subject; delivering by subject",
			slog.String("reply_id", rep.ID), slog.String("reply_session_key", rep.SessionKey), slog.String("lane", lane))
	}
	rep.SessionKey = key // the mailbox it goes to
	return lane, &rep, nil
}

// deliver puts the reply into the lane's mailbox unless it is recorded as
// delivered, then records it. Each step is idempotent, so a failure at any
// point is retried from the top. The writes run to their own timeout, not
// ctx: a Stop does not cut a delivery in half.
func (d *Delivery) deliver(ctx context.Context, lane string, rep *session.Reply, data []byte) (dup bool, boxSeq uint64, err error) {
	key := session.LaneToken(rep.ID)
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.opTimeout)
	defer cancel()
	if _, err := d.res.Delivered.Get(octx, key); err == nil {
		return true, 0, nil
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, 0, fmt.Errorf("check delivered %s: %w", key, err)
	}

	box := nats.NewMsg(d.names.BoxSubject(d.platform, lane))
	box.Data = data
	box.Header.Set(broker.HdrSessionKey, rep.SessionKey)
	if rep.SessionID != "" {
		box.Header.Set(broker.HdrSessionID, rep.SessionID)
	}
	if rep.TurnID != "" {
		box.Header.Set(broker.HdrTurnID, rep.TurnID)
	}
	ack, err := d.js.PublishMsg(octx, box,
		jetstream.WithMsgID(d.boxMsgID(rep.ID)),
		jetstream.WithExpectStream(d.names.OutboxStream()))
	if err != nil {
		return false, 0, fmt.Errorf("publish to %s: %w", box.Subject, err)
	}
	if _, err := d.res.Delivered.Put(octx, key, []byte(strconv.FormatUint(ack.Sequence, 10))); err != nil {
		return false, 0, fmt.Errorf("record delivered %s: %w", key, err)
	}
	return ack.Duplicate, ack.Sequence, nil
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
