package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/telemetry"
)

// Defaults of PlatformDeliveryConfig.
const (
	DefaultDeliveryMaxAttempts = 8
	DefaultDeliveryMaxAge      = time.Hour
	DefaultDeliveryBackoffMax  = time.Minute
	DefaultSendTimeout         = 20 * time.Second
)

// PlatformDeliveryAckWait is the AckWait of a platform delivery consumer.
// The holder of a reply tells the server it is still working on it every
// third of it (a heartbeat, whatever it is doing: a send, a flood-control
// wait), so a reply is only redelivered when its process died or stalled,
// and a dead process holds up its platform's replies for at most this long.
const PlatformDeliveryAckWait = 10 * time.Second

// DuplicateLabel starts a message whose earlier send had an unknown outcome
// (a timeout after the request was sent, a 5xx): the platform may already
// show it, so the user is told this copy may be a duplicate.
const DuplicateLabel = "[may be a duplicate] "

// Target is where a reply goes on its platform.
type Target struct {
	// ChatID and ThreadID are the reply's chat and thread (a Telegram forum
	// topic, a Slack thread_ts), as the adapter put them in the source.
	ChatID, ThreadID string
	// SessionKey is the lane's session key, for logs.
	SessionKey string
}

// SendError classifies a failed send for the delivery's retry logic.
type SendError struct {
	// RetryAfter is the platform's flood-control wait (Telegram retry_after,
	// Slack Retry-After); the message was not posted.
	RetryAfter time.Duration
	// Ambiguous means the platform may have posted the message (a timeout
	// after the request was written, a 5xx): the retry carries DuplicateLabel.
	Ambiguous bool
	// Permanent means retrying cannot help (chat not found, bot removed).
	Permanent bool
	Err       error
}

func (e *SendError) Error() string {
	switch {
	case e.RetryAfter > 0:
		return fmt.Sprintf("rate limited, retry after %s: %v", e.RetryAfter, e.Err)
	case e.Ambiguous:
		return fmt.Sprintf("outcome unknown: %v", e.Err)
	case e.Permanent:
		return fmt.Sprintf("refused: %v", e.Err)
	}
	return e.Err.Error()
}

func (e *SendError) Unwrap() error { return e.Err }

// Sender posts messages on one platform.
type Sender interface {
	// Send posts one message of text to t. A failure should be a
	// *SendError; any other error counts as a retryable failure of known
	// outcome (nothing was posted).
	Send(ctx context.Context, t Target, text string) error
}

// PlatformDeliveryConfig configures a PlatformDelivery.
type PlatformDeliveryConfig struct {
	// Names are the fleet's names. Defaults to broker.DefaultPrefix's.
	Names broker.Names
	// Platform whose replies are delivered (its outbox subjects).
	Platform session.Platform
	// Sender posts the messages.
	Sender Sender
	// MaxLen is the platform's message limit, in Length units (Telegram
	// 4096 UTF-16 units). Longer replies are split (see Split).
	MaxLen int
	// Length measures text. Defaults to RuneLen.
	Length func(string) int
	// ChatInterval is the least time between two messages to one chat (the
	// platform's per-chat rate limit). Defaults to 0.
	ChatInterval time.Duration
	// MaxAttempts is the failed sends after which a reply is given up.
	// Rate-limit answers (429) do not count. Defaults to 8.
	MaxAttempts int
	// MaxAge is the age of a reply (since the worker created it) after
	// which a failing send is given up. Defaults to 1h.
	MaxAge time.Duration
	// Backoff is the wait after the first failed send; it doubles per
	// failure up to BackoffMax. Defaults to 100ms and 1m.
	Backoff, BackoffMax time.Duration
	// SendTimeout bounds one send. Defaults to 20s.
	SendTimeout time.Duration
	// LiveEdits makes a reply replace its turn's live message (posted by a
	// LiveEdits of the platform, in any process) with its first part,
	// rather than post a new one. It needs a Sender that is a LiveSender.
	// Set it alike on every process of the fleet.
	LiveEdits bool
	// Logger receives structured logs. Defaults to a discard logger.
	Logger *slog.Logger
	// Metrics records send attempts, failures and replies given up, per
	// platform; nil records nothing.
	Metrics *telemetry.Metrics
	// TracerProvider traces each delivery of a reply (a child of the
	// worker's reply publish) and each platform send; nil traces nothing.
	TracerProvider trace.TracerProvider
}

// deliveryState is the progress of one reply, kept in the delivered bucket
// so a redelivery (after a crash or a Stop) resumes where the last holder
// was: chunks already posted are not posted again, and a chunk whose send
// had started without a recorded outcome is re-sent with DuplicateLabel.
type deliveryState struct {
	Chunks int `json:"chunks"`
	Sent   int `json:"sent"`
	// Inflight is the chunk whose send started and whose outcome is not
	// known; -1 for none.
	Inflight int `json:"inflight"`
	Failures int `json:"failures,omitempty"`
	// Live is the platform id of the turn's live message (streamed
	// deltas), which the first chunk replaces by an edit; empty for none.
	Live   string `json:"live,omitempty"`
	Done   bool   `json:"done,omitempty"`
	Failed bool   `json:"failed,omitempty"`
	Error  string `json:"error,omitempty"`
}

// DeliveryFailure is the event recorded on <prefix>.ev.delivery_failed.<lane>
// when a reply is given up.
type DeliveryFailure struct {
	Platform   session.Platform `json:"platform"`
	ReplyID    string           `json:"reply_id"`
	SessionKey string           `json:"session_key"`
	ChatID     string           `json:"chat_id,omitempty"`
	ThreadID   string           `json:"thread_id,omitempty"`
	Kind       string           `json:"kind,omitempty"`
	OutboxSeq  uint64           `json:"outbox_seq"`
	Chunks     int              `json:"chunks"`
	SentChunks int              `json:"sent_chunks"`
	// Attempts is the sends made (the failed ones counted across
	// takeovers).
	Attempts  int       `json:"attempts"`
	Error     string    `json:"error"`
	CreatedAt time.Time `json:"created_at,omitzero"`
	FailedAt  time.Time `json:"failed_at"`
}

// PlatformDelivery delivers the replies of one chat platform: a durable
// consumer (deliver_<platform>) on the outbox stream, filtered to
// <prefix>.out.<platform>.>, that posts each reply through a Sender.
//
// Order: the consumer has MaxAckPending 1, so across every ingress process
// only one reply of the platform is in hand at a time, and a reply being
// retried holds back every later one: a lane's replies arrive in order.
//
// Retries: a failed send is retried with a doubling backoff; a 429 waits
// the platform's retry_after; an ambiguous outcome is retried with
// DuplicateLabel. After MaxAttempts failures or once the reply is older
// than MaxAge, the reply is given up: a DeliveryFailure event is published
// on the events stream (fleetctl deliveries shows them) and the outbox
// message is terminated.
type PlatformDelivery struct {
	js  jetstream.JetStream
	res *broker.Resources
	cfg PlatformDeliveryConfig
	dec *Delivery // subject and body decoding, shared with the HTTP delivery
	log *slog.Logger

	lastSend map[string]time.Time // chat -> last send

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// NewPlatformDelivery returns the delivery of cfg.Platform.
func NewPlatformDelivery(js jetstream.JetStream, res *broker.Resources, cfg PlatformDeliveryConfig) (*PlatformDelivery, error) {
	if js == nil || res == nil || res.Outbox == nil || res.Delivered == nil || res.Events == nil {
		return nil, fmt.Errorf("%w: platform delivery needs JetStream and provisioned Outbox, Delivered and Events", ErrInvalidConfig)
	}
	if !cfg.Platform.Known() || cfg.Platform == session.PlatformHTTP {
		return nil, fmt.Errorf("%w: platform delivery: platform %q", ErrInvalidConfig, cfg.Platform)
	}
	if cfg.Sender == nil {
		return nil, fmt.Errorf("%w: platform delivery: Sender is nil", ErrInvalidConfig)
	}
	if cfg.MaxLen < 64 {
		return nil, fmt.Errorf("%w: platform delivery: MaxLen %d is below 64", ErrInvalidConfig, cfg.MaxLen)
	}
	if _, ok := cfg.Sender.(LiveSender); cfg.LiveEdits && !ok {
		return nil, fmt.Errorf("%w: platform delivery: LiveEdits needs a Sender that can edit messages", ErrInvalidConfig)
	}
	if cfg.Names.Prefix() == "" {
		cfg.Names = broker.MustNames(broker.DefaultPrefix)
	}
	if cfg.Length == nil {
		cfg.Length = RuneLen
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = DefaultDeliveryMaxAttempts
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultDeliveryMaxAge
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = deliveryBackoffMin
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = DefaultDeliveryBackoffMax
	}
	cfg.BackoffMax = max(cfg.BackoffMax, cfg.Backoff)
	if cfg.SendTimeout <= 0 {
		cfg.SendTimeout = DefaultSendTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	log := cfg.Logger.With(slog.String("consumer", cfg.Names.DeliveryConsumer(string(cfg.Platform))))
	cfg.Metrics.PlatformDelivery(string(cfg.Platform))
	return &PlatformDelivery{
		js: js, res: res, cfg: cfg, log: log,
		dec:      &Delivery{names: cfg.Names, platform: string(cfg.Platform), log: log, tracer: telemetry.Tracer(cfg.TracerProvider)},
		lastSend: map[string]time.Time{},
	}, nil
}

// ConsumerConfig is the configuration of the durable consumer.
func (d *PlatformDelivery) ConsumerConfig() jetstream.ConsumerConfig {
	p := string(d.cfg.Platform)
	return jetstream.ConsumerConfig{
		Durable:       d.cfg.Names.DeliveryConsumer(p),
		Description:   "agentfleet delivery of " + p + " replies to " + d.cfg.Platform.DisplayName(),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       PlatformDeliveryAckWait,
		MaxDeliver:    -1,
		MaxAckPending: 1,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		FilterSubject: d.cfg.Names.OutboxPlatformFilter(p),
	}
}

// Start creates or updates the consumer and delivers in a goroutine until
// ctx ends or Stop. It returns ErrAlreadyStarted on a running delivery.
func (d *PlatformDelivery) Start(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cancel != nil {
		return ErrAlreadyStarted
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
	d.log.LogAttrs(ctx, slog.LevelInfo, "platform delivery started", slog.String("platform", string(d.cfg.Platform)))
	return nil
}

// Stop stops delivering and waits for the goroutine. A reply in hand is
// NAKed so another process takes it at once. Idempotent; safe without Start.
func (d *PlatformDelivery) Stop() {
	d.mu.Lock()
	cancel, done := d.cancel, d.done
	d.cancel, d.done = nil, nil
	d.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

func (d *PlatformDelivery) open(ctx context.Context) (jetstream.MessagesContext, error) {
	cfg := d.ConsumerConfig()
	cctx, cancel := context.WithTimeout(ctx, deliveryOpTimeout)
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

func (d *PlatformDelivery) run(ctx context.Context, it jetstream.MessagesContext) {
	backoff := d.cfg.Backoff
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err == nil {
			backoff = d.cfg.Backoff
			d.handle(ctx, msg)
			continue
		}
		it.Stop()
		if ctx.Err() != nil {
			return
		}
		d.log.LogAttrs(ctx, slog.LevelWarn, "delivery consumer interrupted; reopening",
			slog.Any("error", err), slog.Duration("retry_in", backoff))
		for {
			if !sleepCtx(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, deliveryBackoffMax)
			if it, err = d.open(ctx); err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
		}
	}
}

// handle delivers one reply, chunk by chunk, then acks it; or gives it up.
// While it runs, a heartbeat keeps the reply in this process's hands.
func (d *PlatformDelivery) handle(ctx context.Context, msg jetstream.Msg) {
	hbDone := make(chan struct{})
	var hb sync.WaitGroup
	hb.Go(func() {
		t := time.NewTicker(PlatformDeliveryAckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-hbDone:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	})
	defer hb.Wait()
	defer close(hbDone)
	ctx, end := d.dec.traceDelivery(ctx, msg)
	defer end()
	d.deliverReply(ctx, msg)
}

func (d *PlatformDelivery) deliverReply(ctx context.Context, msg jetstream.Msg) {
	var outSeq uint64
	if md, err := msg.Metadata(); err == nil {
		outSeq = md.Sequence.Stream
	}
	lane, rep, err := d.dec.decode(msg)
	if err != nil {
		// Not a reply at all: nothing to retry, nothing to tell a user.
		d.giveUp(ctx, msg, lane, &session.Reply{}, outSeq, &deliveryState{Inflight: -1}, 0, err)
		return
	}
	log := d.log.With(slog.String("session_key", rep.SessionKey), slog.String("reply_id", rep.ID))
	key := d.cfg.Names.PlatformDeliveredKey(string(d.cfg.Platform), session.LaneToken(rep.ID))

	st, ok := d.loadState(ctx, msg, key)
	if !ok {
		_ = msg.Nak()
		return
	}
	if st.Done || st.Failed {
		if st.Failed {
			_ = msg.TermWithReason("delivery failed: " + st.Error)
		} else {
			d.ack(ctx, msg, log)
		}
		return
	}
	chunks := Split(rep.Text, d.cfg.MaxLen-d.cfg.Length(DuplicateLabel), d.cfg.Length)
	st.Chunks = len(chunks)
	target := Target{ChatID: rep.ChatID, ThreadID: rep.ThreadID, SessionKey: rep.SessionKey}
	if st.Sent == 0 && st.Live == "" {
		st.Live = d.claimLive(ctx, rep)
	}
	attempts := 0
	for i := st.Sent; i < len(chunks); {
		if ctx.Err() != nil {
			_ = msg.Nak()
			return
		}
		text := chunks[i]
		edit := i == 0 && st.Live != ""
		if !edit && (st.Inflight == i || (i == 0 && rep.PossibleDuplicate)) {
			text = DuplicateLabel + text
		}
		if !d.pace(ctx, msg, target.ChatID) {
			_ = msg.Nak()
			return
		}
		st.Inflight = i
		if err := d.saveState(ctx, key, st); err != nil {
			// Without the marker a crash during the send would resend the
			// chunk unlabelled: do not send before it is stored.
			log.LogAttrs(ctx, slog.LevelWarn, "delivery state not stored; retrying", slog.Any("error", err))
			if !d.wait(ctx, msg, d.cfg.Backoff) {
				_ = msg.Nak()
				return
			}
			continue
		}
		attempts++
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.SendTimeout)
		var span trace.Span
		if d.dec.tracer != nil {
			sctx, span = d.dec.tracer.Start(sctx, "platform send", trace.WithSpanKind(trace.SpanKindClient),
				trace.WithAttributes(telemetry.AttrPlatform.String(string(d.cfg.Platform)), attribute.Int("agentfleet.chunk", i),
					attribute.Int("agentfleet.attempt", attempts), attribute.Bool("agentfleet.edit", edit)))
		}
		var err error
		if edit {
			// Replaces the streamed text: an edit is idempotent, so it
			// never needs the duplicate label.
			err = d.cfg.Sender.(LiveSender).Edit(sctx, target, st.Live, text)
		} else {
			err = d.cfg.Sender.Send(sctx, target, text)
		}
		endSpan(span, err)
		cancel()
		d.cfg.Metrics.DeliveryAttempt(ctx, string(d.cfg.Platform), err)
		d.lastSend[target.ChatID] = time.Now()
		if err == nil {
			st.Sent, st.Inflight = i+1, -1
			i++
			if err := d.saveState(ctx, key, st); err != nil {
				// The next chunk's marker write retries; a crash before it
				// resends this chunk labelled as a possible duplicate.
				log.LogAttrs(ctx, slog.LevelWarn, "delivery progress not stored", slog.Any("error", err))
			}
			continue
		}
		var se *SendError
		if !errors.As(err, &se) {
			se = &SendError{Err: err}
		}
		if edit && se.Permanent {
			// The live message is gone (deleted, too old to edit): post
			// the reply as a new message instead.
			log.LogAttrs(ctx, slog.LevelWarn, "live message not editable; posting the reply", slog.Any("error", err))
			st.Live, st.Inflight = "", -1
			continue
		}
		if !se.Ambiguous || edit {
			st.Inflight = -1 // nothing was posted: the retry needs no label
		}
		if se.RetryAfter > 0 && !se.Permanent {
			log.LogAttrs(ctx, slog.LevelWarn, "rate limited by the platform; waiting",
				slog.Duration("retry_after", se.RetryAfter), slog.String("chat_id", target.ChatID))
			d.lastSend[target.ChatID] = time.Now().Add(se.RetryAfter - d.cfg.ChatInterval)
			if d.expired(rep) {
				d.giveUp(ctx, msg, lane, rep, outSeq, st, attempts, err)
				return
			}
			if !d.wait(ctx, msg, se.RetryAfter) {
				_ = msg.Nak()
				return
			}
			continue
		}
		st.Failures++
		if se.Permanent || st.Failures >= d.cfg.MaxAttempts || d.expired(rep) {
			d.giveUp(ctx, msg, lane, rep, outSeq, st, attempts, err)
			return
		}
		backoff := d.cfg.Backoff << min(st.Failures-1, 20)
		backoff = min(backoff, d.cfg.BackoffMax)
		log.LogAttrs(ctx, slog.LevelWarn, "send failed; retrying",
			slog.Int("chunk", i), slog.Int("failures", st.Failures), slog.Bool("ambiguous", se.Ambiguous),
			slog.Duration("retry_in", backoff), slog.Any("error", err))
		if !d.wait(ctx, msg, backoff) {
			_ = msg.Nak()
			return
		}
	}
	st.Done, st.Inflight = true, -1
	if err := d.saveState(ctx, key, st); err != nil {
		log.LogAttrs(ctx, slog.LevelWarn, "delivery completion not stored", slog.Any("error", err))
	}
	log.LogAttrs(ctx, slog.LevelDebug, "reply delivered", slog.Int("chunks", len(chunks)))
	d.ack(ctx, msg, log)
}

// expired reports whether rep is older than the retry budget's age.
func (d *PlatformDelivery) expired(rep *session.Reply) bool {
	return !rep.CreatedAt.IsZero() && time.Since(rep.CreatedAt) >= d.cfg.MaxAge
}

func (d *PlatformDelivery) ack(ctx context.Context, msg jetstream.Msg, log *slog.Logger) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deliveryOpTimeout)
	defer cancel()
	if err := msg.DoubleAck(actx); err != nil {
		// The redelivery finds the state done and acks it.
		log.LogAttrs(ctx, slog.LevelWarn, "reply ack failed", slog.Any("error", err))
	}
}

// giveUp records the failure event, marks the reply failed and terminates
// it. The event is published before anything else: until it is stored the
// reply is not let go (a Stop NAKs it and the next holder tries again).
func (d *PlatformDelivery) giveUp(ctx context.Context, msg jetstream.Msg, lane string, rep *session.Reply, outSeq uint64, st *deliveryState, attempts int, cause error) {
	ev := DeliveryFailure{
		Platform: d.cfg.Platform, ReplyID: rep.ID, SessionKey: rep.SessionKey, ChatID: rep.ChatID,
		ThreadID: rep.ThreadID, Kind: rep.Kind, OutboxSeq: outSeq, Chunks: st.Chunks, SentChunks: st.Sent,
		Attempts: max(attempts, st.Failures), Error: cause.Error(), CreatedAt: rep.CreatedAt, FailedAt: time.Now().UTC(),
	}
	data, _ := json.Marshal(ev)
	if lane == "" {
		lane = "_"
	}
	id := fmt.Sprintf("%s:%s:%d", broker.DeliveryFailedKind, d.cfg.Platform, outSeq)
	backoff := d.cfg.Backoff
	for {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deliveryOpTimeout)
		m := nats.NewMsg(d.cfg.Names.EventSubject(broker.DeliveryFailedKind, lane))
		m.Data = data
		if rep.SessionKey != "" {
			m.Header.Set(broker.HdrSessionKey, rep.SessionKey)
		}
		m.Header.Set(broker.HdrReason, cause.Error())
		_, err := d.js.PublishMsg(pctx, m, jetstream.WithMsgID(id), jetstream.WithExpectStream(d.cfg.Names.EventStream()))
		cancel()
		if err == nil {
			break
		}
		d.log.LogAttrs(ctx, slog.LevelWarn, "delivery failure event not stored; retrying", slog.Any("error", err))
		if !d.wait(ctx, msg, backoff) {
			_ = msg.Nak()
			return
		}
		backoff = min(2*backoff, deliveryBackoffMax)
	}
	d.cfg.Metrics.DeliveryGivenUp(ctx, string(d.cfg.Platform))
	d.log.LogAttrs(ctx, slog.LevelError, "reply delivery failed; given up",
		slog.String("reply_id", rep.ID), slog.String("session_key", rep.SessionKey),
		slog.Uint64("outbox_seq", outSeq), slog.Int("attempts", attempts), slog.Any("error", cause))
	if rep.ID != "" {
		st.Failed, st.Error = true, cause.Error()
		key := d.cfg.Names.PlatformDeliveredKey(string(d.cfg.Platform), session.LaneToken(rep.ID))
		_ = d.saveState(ctx, key, st)
	}
	_ = msg.TermWithReason("delivery failed: " + cause.Error())
}

// loadState reads the reply's delivery state, retrying a store that does
// not answer; ok is false when ctx ended first.
func (d *PlatformDelivery) loadState(ctx context.Context, msg jetstream.Msg, key string) (*deliveryState, bool) {
	backoff := d.cfg.Backoff
	for {
		gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deliveryOpTimeout)
		e, err := d.res.Delivered.Get(gctx, key)
		cancel()
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return &deliveryState{Inflight: -1}, true
		}
		if err == nil {
			st := &deliveryState{Inflight: -1}
			if json.Unmarshal(e.Value(), st) == nil {
				return st, true
			}
			// Not ours (an HTTP mailbox record) or unreadable: start over,
			// labelling the first chunk.
			return &deliveryState{Inflight: 0}, true
		}
		d.log.LogAttrs(ctx, slog.LevelWarn, "cannot read delivery state; retrying", slog.Any("error", err))
		if !d.wait(ctx, msg, backoff) {
			return nil, false
		}
		backoff = min(2*backoff, deliveryBackoffMax)
	}
}

func (d *PlatformDelivery) saveState(ctx context.Context, key string, st *deliveryState) error {
	data, _ := json.Marshal(st)
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deliveryOpTimeout)
	defer cancel()
	_, err := d.res.Delivered.Put(pctx, key, data)
	return err
}

// pace waits until chat may get its next message (ChatInterval after the
// last one, or the end of a flood-control wait).
func (d *PlatformDelivery) pace(ctx context.Context, msg jetstream.Msg, chat string) bool {
	last, ok := d.lastSend[chat]
	if !ok {
		return true
	}
	wait := time.Until(last.Add(d.cfg.ChatInterval))
	if len(d.lastSend) > 4096 {
		// Forget chats whose interval is long over.
		for c, t := range d.lastSend {
			if time.Since(t) > d.cfg.ChatInterval+time.Minute {
				delete(d.lastSend, c)
			}
		}
	}
	if wait <= 0 {
		return true
	}
	return d.wait(ctx, msg, wait)
}

// wait sleeps for dur (the heartbeat of handle keeps the reply in hand).
// It reports whether dur passed (false: ctx ended).
func (d *PlatformDelivery) wait(ctx context.Context, _ jetstream.Msg, dur time.Duration) bool {
	return sleepCtx(ctx, dur)
}
