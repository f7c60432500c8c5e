package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
)

// LiveSender is a Sender that can also post a message, learn its platform
// id, and replace its text later (Telegram sendMessage/editMessageText,
// Slack chat.postMessage/chat.update). A platform delivery whose Sender is
// a LiveSender shows a streamed reply as one message edited in place.
type LiveSender interface {
	Sender
	// Post posts text to t and returns the new message's id.
	Post(ctx context.Context, t Target, text string) (msgID string, err error)
	// Edit replaces the text of message msgID in t. Editing a message to the
	// text it already has is a success. Failures are *SendError as for Send;
	// Permanent means the message cannot be edited (deleted, too old).
	Edit(ctx context.Context, t Target, msgID, text string) error
}

// The states of a live message record.
const (
	livePosting = "posting" // the streamer is posting the first delta
	liveLive    = "live"    // posted; the streamer may edit it
	liveEditing = "editing" // the streamer's edit is in flight
	liveFinal   = "final"   // the final reply owns the turn: no more edits
)

// liveRecord is the live message of one turn, in the delivered bucket under
// liveKey. It is the only state the streamer (one process per platform)
// and the delivery consumer (whichever process holds the reply) share: each
// change is a compare-and-set on its revision, so the final reply never
// races an edit of a partial text.
type liveRecord struct {
	State    string    `json:"state"`
	MsgID    string    `json:"msg_id,omitempty"`
	ChatID   string    `json:"chat_id,omitempty"`
	ThreadID string    `json:"thread_id,omitempty"`
	Attempt  int       `json:"attempt,omitempty"`
	ReplyID  string    `json:"reply_id,omitempty"` // the reply that claimed it
	At       time.Time `json:"at"`
}

// liveKey is the delivered-bucket key of the live message of turnID. Reply
// keys are "<platform>.<session id>.<seq>": a session id is never "live".
func liveKey(names broker.Names, platform session.Platform, turnID string) string {
	return names.PlatformDeliveredKey(string(platform), "live."+session.LaneToken(turnID))
}

// LiveEditsConfig configures a LiveEdits.
type LiveEditsConfig struct {
	// Names are the fleet's names. Defaults to broker.DefaultPrefix's.
	Names broker.Names
	// Platform whose lanes' deltas are shown.
	Platform session.Platform
	// Sender posts and edits the live messages.
	Sender LiveSender
	// MaxLen and Length are the platform's message limit and measure (as
	// PlatformDeliveryConfig's); a longer live text shows its beginning.
	MaxLen int
	Length func(string) int
	// EditInterval is the least time between two posts or edits of one
	// chat's live message. Defaults to 1s.
	EditInterval time.Duration
	// RateLimitAll makes a 429 pause the edits of every chat (Slack limits
	// chat.update per workspace) rather than the chat's alone (Telegram).
	RateLimitAll bool
	// SendTimeout bounds one post or edit. Defaults to 20s.
	SendTimeout time.Duration
	// Logger receives structured logs. Defaults to a discard logger.
	Logger *slog.Logger
}

// LiveEdits shows the deltas a streaming agent publishes on
// <prefix>.delta.<lane> as one live message per turn on a chat platform:
// the first delta posts it, later ones edit it, at most one post or edit
// per chat every EditInterval (a 429 waits the platform's retry-after).
//
// Run it in one process per platform (under a Singleton lease): the live
// message of a turn is recorded in the delivered bucket, so the platform
// delivery, in whichever process holds the final reply, edits that message
// to the reply's first part instead of posting a new one. Deltas are
// best-effort: a missed delta, a lost record or a streamer that died only
// means the final reply arrives as a new message, never a lost reply.
type LiveEdits struct {
	js  jetstream.JetStream
	res *broker.Resources
	cfg LiveEditsConfig
	log *slog.Logger
}

// NewLiveEdits returns the live messages of cfg.Platform.
func NewLiveEdits(js jetstream.JetStream, res *broker.Resources, cfg LiveEditsConfig) (*LiveEdits, error) {
	if js == nil || res == nil || res.Delivered == nil || res.Sessions == nil {
		return nil, fmt.Errorf("%w: live edits need JetStream and provisioned Delivered and Sessions", ErrInvalidConfig)
	}
	if !cfg.Platform.Known() || cfg.Platform == session.PlatformHTTP {
		return nil, fmt.Errorf("%w: live edits: platform %q", ErrInvalidConfig, cfg.Platform)
	}
	if cfg.Sender == nil {
		return nil, fmt.Errorf("%w: live edits: Sender is nil", ErrInvalidConfig)
	}
	if cfg.MaxLen < 64 {
		return nil, fmt.Errorf("%w: live edits: MaxLen %d is below 64", ErrInvalidConfig, cfg.MaxLen)
	}
	if cfg.Names.Prefix() == "" {
		cfg.Names = broker.MustNames(broker.DefaultPrefix)
	}
	if cfg.Length == nil {
		cfg.Length = RuneLen
	}
	if cfg.EditInterval <= 0 {
		cfg.EditInterval = time.Second
	}
	if cfg.SendTimeout <= 0 {
		cfg.SendTimeout = DefaultSendTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &LiveEdits{js: js, res: res, cfg: cfg,
		log: cfg.Logger.With(slog.String("live_edits", string(cfg.Platform)))}, nil
}

// liveTurn is the streamer's view of one turn.
type liveTurn struct {
	id      string
	key     string
	rev     uint64
	target  Target
	msgID   string
	attempt int
	text    strings.Builder
	shown   string
	dirty   bool
	closed  bool
	seen    time.Time
}

// liveIdle is how long a turn without deltas is remembered.
const liveIdle = 5 * time.Minute

// maxLiveTurns bounds the turns remembered; beyond it new turns are not
// shown live (their replies arrive as usual).
const maxLiveTurns = 4096

// Run shows deltas until ctx ends (then it returns nil), or fails to
// subscribe.
func (l *LiveEdits) Run(ctx context.Context) error {
	sub, ch, err := l.subscribe()
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	l.loop(ctx, ch)
	return nil
}

// Start subscribes to the deltas (the server knows the subscription when
// it returns) and shows them in a goroutine until stop is called, which
// waits for it.
func (l *LiveEdits) Start(ctx context.Context) (stop func(), err error) {
	sub, ch, err := l.subscribe()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.loop(ctx, ch)
	}()
	return func() {
		cancel()
		<-done
		_ = sub.Unsubscribe()
	}, nil
}

func (l *LiveEdits) subscribe() (*nats.Subscription, chan *nats.Msg, error) {
	ch := make(chan *nats.Msg, maxPendingDeltas)
	nc := l.js.Conn()
	sub, err := nc.ChanSubscribe(l.cfg.Names.DeltaWildcard(), ch)
	if err == nil {
		err = nc.FlushTimeout(deliveryOpTimeout)
		if err != nil {
			_ = sub.Unsubscribe()
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("live edits: subscribe to deltas: %w", err)
	}
	return sub, ch, nil
}

func (l *LiveEdits) loop(ctx context.Context, ch chan *nats.Msg) {
	l.log.LogAttrs(ctx, slog.LevelInfo, "live edits started")
	tick := time.NewTicker(max(l.cfg.EditInterval/4, 20*time.Millisecond))
	defer tick.Stop()
	turns := map[string]*liveTurn{}
	next := map[string]time.Time{} // chat -> earliest next post or edit
	var all time.Time              // every chat's (RateLimitAll)
	due := func(chat string, now time.Time) bool {
		return !now.Before(next[chat]) && !now.Before(all)
	}
	flush := func(lt *liveTurn, now time.Time) {
		if lt.closed || !lt.dirty || !due(lt.target.ChatID, now) {
			return
		}
		wait := l.show(ctx, lt)
		next[lt.target.ChatID] = time.Now().Add(max(wait, l.cfg.EditInterval))
		if wait > 0 && l.cfg.RateLimitAll {
			all = time.Now().Add(wait)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-ch:
			var d session.Delta
			if json.Unmarshal(m.Data, &d) != nil || d.TurnID == "" || d.Text == "" {
				continue
			}
			if p, _, _, err := session.SplitSessionKey(d.SessionKey); err != nil || p != l.cfg.Platform {
				continue
			}
			lt := turns[d.TurnID]
			if lt == nil {
				if len(turns) >= maxLiveTurns {
					continue
				}
				lt = &liveTurn{id: d.TurnID, key: liveKey(l.cfg.Names, l.cfg.Platform, d.TurnID), attempt: d.Attempt}
				turns[d.TurnID] = lt
				if !l.resolve(ctx, lt, d.SessionKey) {
					lt.closed = true
				}
			}
			lt.seen = time.Now()
			if lt.closed || d.Attempt < lt.attempt {
				continue
			}
			if d.Attempt > lt.attempt { // a retried turn streams from the start
				lt.attempt = d.Attempt
				lt.text.Reset()
			}
			lt.text.WriteString(d.Text)
			lt.dirty = true
			flush(lt, time.Now())
		case now := <-tick.C:
			for id, lt := range turns {
				if now.Sub(lt.seen) > liveIdle {
					delete(turns, id)
					continue
				}
				flush(lt, now)
			}
			for chat, t := range next {
				if now.Sub(t) > time.Minute {
					delete(next, chat)
				}
			}
		}
	}
}

// resolve finds the chat and thread of a lane from its session entry's
// origin (a delta carries only the session key).
func (l *LiveEdits) resolve(ctx context.Context, lt *liveTurn, key string) bool {
	gctx, cancel := context.WithTimeout(ctx, deliveryOpTimeout)
	defer cancel()
	e, err := l.res.Sessions.Get(gctx, session.LaneToken(key))
	if err != nil {
		l.log.LogAttrs(ctx, slog.LevelDebug, "no session entry for a streamed turn; not shown live",
			slog.String("session_key", key), slog.Any("error", err))
		return false
	}
	var entry session.SessionEntry
	if json.Unmarshal(e.Value(), &entry) != nil {
		return false
	}
	src, ok := entry.OriginSource()
	if !ok || src.Platform != l.cfg.Platform || src.ChatID == "" {
		return false
	}
	lt.target = Target{ChatID: src.ChatID, ThreadID: src.ThreadID, SessionKey: key}
	return true
}

// liveText is the text a live message shows: the stream so far, cut to
// the platform's limit.
func (l *LiveEdits) liveText(text string) string {
	if l.cfg.Length(text) <= l.cfg.MaxLen {
		return text
	}
	return Split(text, l.cfg.MaxLen-1, l.cfg.Length)[0] + "…"
}

// show posts or edits lt's live message. It returns the platform's
// flood-control wait when it answered 429.
func (l *LiveEdits) show(ctx context.Context, lt *liveTurn) time.Duration {
	text := l.liveText(lt.text.String())
	lt.dirty = false
	if text == lt.shown {
		return 0
	}
	log := l.log.With(slog.String("turn_id", lt.id), slog.String("chat_id", lt.target.ChatID))
	if lt.msgID == "" {
		rec := liveRecord{State: livePosting, ChatID: lt.target.ChatID, ThreadID: lt.target.ThreadID, Attempt: lt.attempt, At: time.Now().UTC()}
		rev, err := l.create(ctx, lt.key, rec)
		if err != nil {
			// The final reply got there first (or the store is down):
			// nothing to show live.
			lt.closed = true
			return 0
		}
		sctx, cancel := context.WithTimeout(ctx, l.cfg.SendTimeout)
		id, err := l.cfg.Sender.Post(sctx, lt.target, text)
		cancel()
		if err != nil {
			// Give the turn up: the final reply is posted as usual.
			lt.closed = true
			rec.State = liveFinal
			_, _ = l.update(ctx, lt.key, rec, rev)
			log.LogAttrs(ctx, slog.LevelWarn, "live message not posted", slog.Any("error", err))
			return retryAfter(err)
		}
		rec.State, rec.MsgID = liveLive, id
		if lt.rev, err = l.update(ctx, lt.key, rec, rev); err != nil {
			lt.closed = true
			return 0
		}
		lt.msgID, lt.shown = id, text
		return 0
	}
	rec := liveRecord{State: liveEditing, MsgID: lt.msgID, ChatID: lt.target.ChatID, ThreadID: lt.target.ThreadID, Attempt: lt.attempt, At: time.Now().UTC()}
	rev, err := l.update(ctx, lt.key, rec, lt.rev)
	if err != nil {
		// The final reply claimed the message (or the store is down: then
		// stop editing rather than race the final reply).
		lt.closed = true
		return 0
	}
	sctx, cancel := context.WithTimeout(ctx, l.cfg.SendTimeout)
	err = l.cfg.Sender.Edit(sctx, lt.target, lt.msgID, text)
	cancel()
	wait := retryAfter(err)
	switch {
	case err == nil:
		lt.shown = text
	case wait > 0:
		lt.dirty = true // shown after the wait
		log.LogAttrs(ctx, slog.LevelDebug, "live edit rate limited", slog.Duration("retry_after", wait))
	default:
		log.LogAttrs(ctx, slog.LevelDebug, "live edit failed", slog.Any("error", err))
	}
	rec.State = liveLive
	if lt.rev, err = l.update(ctx, lt.key, rec, rev); err != nil {
		lt.closed = true
	}
	return wait
}

func retryAfter(err error) time.Duration {
	var se *SendError
	if errors.As(err, &se) {
		return se.RetryAfter
	}
	return 0
}

func (l *LiveEdits) create(ctx context.Context, key string, rec liveRecord) (uint64, error) {
	data, _ := json.Marshal(rec)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deliveryOpTimeout)
	defer cancel()
	return l.res.Delivered.Create(cctx, key, data)
}

func (l *LiveEdits) update(ctx context.Context, key string, rec liveRecord, rev uint64) (uint64, error) {
	data, _ := json.Marshal(rec)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deliveryOpTimeout)
	defer cancel()
	return l.res.Delivered.Update(cctx, key, data, rev)
}

// liveClaimPoll is how often the delivery looks again at a live message
// whose post or edit is in flight.
const liveClaimPoll = 50 * time.Millisecond

// claimLive makes rep's turn final for the streamer and returns the id of
// its live message, which rep's first part then replaces; "" when the turn
// has none (rep is then posted as a new message). A post or edit of the
// streamer in flight is waited for, up to twice the send timeout (a
// streamer that died meanwhile does not hold the reply longer).
func (d *PlatformDelivery) claimLive(ctx context.Context, rep *session.Reply) string {
	if !d.cfg.LiveEdits || rep.TurnID == "" || rep.Kind != session.ReplyKindReply {
		return ""
	}
	key := liveKey(d.cfg.Names, d.cfg.Platform, rep.TurnID)
	final := func() []byte {
		data, _ := json.Marshal(liveRecord{State: liveFinal, ReplyID: rep.ID, At: time.Now().UTC()})
		return data
	}
	deadline := time.Now().Add(2 * d.cfg.SendTimeout)
	for ctx.Err() == nil {
		gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deliveryOpTimeout)
		e, err := d.res.Delivered.Get(gctx, key)
		cancel()
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deliveryOpTimeout)
			_, err = d.res.Delivered.Create(cctx, key, final())
			cancel()
			if err == nil || !errors.Is(err, jetstream.ErrKeyExists) {
				// Claimed, or the store does not answer: a plain post
				// (a streamer that cannot write stops editing).
				return ""
			}
			continue
		}
		if err != nil {
			return ""
		}
		var rec liveRecord
		if json.Unmarshal(e.Value(), &rec) != nil {
			return ""
		}
		switch {
		case rec.State == liveFinal:
			if rec.ReplyID == rep.ID {
				return rec.MsgID // this reply claimed it before a redelivery
			}
			return ""
		case rec.State == liveLive || time.Now().After(deadline):
			rec.State, rec.ReplyID, rec.At = liveFinal, rep.ID, time.Now().UTC()
			data, _ := json.Marshal(rec)
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deliveryOpTimeout)
			_, err := d.res.Delivered.Update(uctx, key, data, e.Revision())
			cancel()
			if err == nil {
				return rec.MsgID
			}
		default: // posting or editing: wait for the streamer
			if !sleepCtx(ctx, liveClaimPoll) {
				return ""
			}
		}
	}
	return ""
}
