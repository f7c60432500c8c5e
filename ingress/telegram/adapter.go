// Package telegram is the Telegram adapter of agentfleet: the webhook at
// POST /webhooks/telegram (authenticated by X-Telegram-Bot-Api-Secret-Token),
// the getUpdates long-poll loop as the alternative for deployments without a
// public URL (run fleet-wide by one process at a time under an
// ingress.Singleton), and the Sender through which an
// ingress.PlatformDelivery posts replies with sendMessage.
package telegram

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
)

// Modes of Config.Mode.
const (
	ModeWebhook = "webhook"
	ModePoll    = "poll"
)

// Defaults of Config.
const (
	DefaultPollTimeout  = 25 * time.Second
	DefaultMaxBodyBytes = 1 << 20
	// MaxMessageLength is sendMessage's limit in UTF-16 units.
	MaxMessageLength = 4096
	// ChatInterval paces messages to one chat (Telegram asks bots to stay
	// at about one message per second per chat).
	ChatInterval = time.Second
	// HeaderSecret carries the webhook secret on every webhook request.
	HeaderSecret = "X-Telegram-Bot-Api-Secret-Token"
)

// allowedUpdates are the update kinds the poller asks for.
var allowedUpdates = []string{"message", "channel_post"}

// Config configures the adapter.
type Config struct {
	// Token is the bot token from @BotFather. Required.
	Token string
	// WebhookSecret is the secret_token given to setWebhook; Telegram sends
	// it in X-Telegram-Bot-Api-Secret-Token. Required for the webhook.
	WebhookSecret string
	// APIBase is the Bot API base URL. Defaults to DefaultAPIBase.
	APIBase string
	// PollTimeout is the long poll's duration. Defaults to 25s.
	PollTimeout time.Duration
	// MaxBodyBytes caps a webhook body. Defaults to 1 MiB.
	MaxBodyBytes int64
	// MediaBaseURL is the URL at which agents reach this ingress (its
	// http.public_url): attachments get links to its media endpoint,
	// GET /v1/media/telegram/<file id>, which downloads the file with the
	// bot token on the agent's behalf. Empty: attachments carry the file id
	// only.
	MediaBaseURL string
	// HTTPClient makes the API calls. Defaults to a client without an
	// overall timeout (each call has its own).
	HTTPClient *http.Client
	// Logger receives structured logs. Defaults to a discard logger.
	Logger *slog.Logger
}

// Adapter turns Telegram updates into inbox messages and sends replies.
type Adapter struct {
	cfg       Config
	pub       *ingress.Publisher
	client    *Client
	log       *slog.Logger
	secretSum [sha256.Size]byte

	// linker makes the media links (nil without Config.MediaBaseURL).
	linker *ingress.MediaLinker

	mu       sync.Mutex
	bot      Bot
	botTried time.Time
}

// New returns the adapter publishing through pub.
func New(pub *ingress.Publisher, cfg Config) (*Adapter, error) {
	if pub == nil {
		return nil, fmt.Errorf("%w: telegram: Publisher is nil", ingress.ErrInvalidConfig)
	}
	if cfg.Token == "" {
		return nil, fmt.Errorf("%w: telegram: token is empty", ingress.ErrInvalidConfig)
	}
	if cfg.PollTimeout <= 0 {
		cfg.PollTimeout = DefaultPollTimeout
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	a := &Adapter{
		cfg:    cfg,
		pub:    pub,
		client: NewClient(cfg.APIBase, cfg.Token, cfg.HTTPClient),
		log:    cfg.Logger.With(slog.String("platform", "telegram")),
		bot:    Bot{ID: BotIDFromToken(cfg.Token)},
	}
	a.secretSum = sha256.Sum256([]byte(cfg.WebhookSecret))
	if cfg.MediaBaseURL != "" {
		l, err := ingress.NewMediaLinker(cfg.MediaBaseURL, session.PlatformTelegram, ingress.MediaKey(cfg.Token))
		if err != nil {
			return nil, fmt.Errorf("telegram: %w", err)
		}
		a.linker = l
	}
	return a, nil
}

// Client returns the adapter's Bot API client.
func (a *Adapter) Client() *Client { return a.client }

// botInfo returns what is known of the bot, asking getMe for its username
// at most every 30s until it is known.
func (a *Adapter) botInfo(ctx context.Context) Bot {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.bot.Username != "" || time.Since(a.botTried) < 30*time.Second {
		return a.bot
	}
	a.botTried = time.Now()
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	me, err := a.client.GetMe(gctx)
	if err != nil {
		a.log.LogAttrs(ctx, slog.LevelWarn, "getMe failed; commands addressed to other bots are not filtered yet", slog.Any("error", err))
		return a.bot
	}
	a.bot = Bot{ID: me.ID, Username: me.Username}
	return a.bot
}

// WebhookHandler serves POST /webhooks/telegram. It refuses to exist
// without a secret: an open webhook lets anyone post as any user.
func (a *Adapter) WebhookHandler() (http.Handler, error) {
	if err := ValidSecret(a.cfg.WebhookSecret); err != nil {
		return nil, fmt.Errorf("%w: telegram webhook: %v", ingress.ErrInvalidConfig, err)
	}
	return http.HandlerFunc(a.serveWebhook), nil
}

// ValidSecret checks a webhook secret as setWebhook does: 1 to 256
// characters of A-Z, a-z, 0-9, '_' and '-'.
func ValidSecret(s string) error {
	if s == "" {
		return errors.New("webhook_secret is empty; refusing to run a webhook anyone could post to")
	}
	if len(s) > 256 {
		return fmt.Errorf("webhook_secret is %d characters; Telegram allows 1 to 256", len(s))
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return fmt.Errorf("webhook_secret holds %q; Telegram allows only A-Z, a-z, 0-9, _ and -", r)
		}
	}
	return nil
}

type answer struct {
	OK      bool   `json:"ok"`
	Ignored string `json:"ignored,omitempty"`
	Error   string `json:"error,omitempty"`
	Seq     uint64 `json:"seq,omitempty"`
	Dup     bool   `json:"duplicate,omitempty"`
}

func (a *Adapter) serveWebhook(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		writeJSON(w, http.StatusMethodNotAllowed, answer{Error: "use POST"})
		return
	}
	got := r.Header.Get(HeaderSecret)
	sum := sha256.Sum256([]byte(got))
	if got == "" || subtle.ConstantTimeCompare(sum[:], a.secretSum[:]) != 1 {
		a.log.LogAttrs(r.Context(), slog.LevelWarn, "webhook request refused: missing or wrong secret token",
			slog.String("remote", r.RemoteAddr))
		writeJSON(w, http.StatusUnauthorized, answer{Error: "missing or wrong " + HeaderSecret})
		return
	}
	if r.ContentLength > a.cfg.MaxBodyBytes {
		writeJSON(w, http.StatusRequestEntityTooLarge, answer{Error: fmt.Sprintf("body is larger than %d bytes", a.cfg.MaxBodyBytes)})
		return
	}
	// A client trickling its body in must not hold the handler for ever.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(ingress.BodyReadTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, a.cfg.MaxBodyBytes))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			writeJSON(w, http.StatusRequestEntityTooLarge, answer{Error: fmt.Sprintf("body is larger than %d bytes", a.cfg.MaxBodyBytes)})
			return
		}
		writeJSON(w, http.StatusBadRequest, answer{Error: "cannot read the body"})
		return
	}
	res, err := a.Handle(r.Context(), body)
	var skip *Skip
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, answer{OK: true, Seq: res.Seq, Dup: res.Duplicate})
	case errors.As(err, &skip):
		writeJSON(w, http.StatusOK, answer{OK: true, Ignored: skip.Reason})
	case errors.Is(err, ingress.ErrUnavailable):
		// Telegram retries a non-2xx answer: the update is not lost.
		a.log.LogAttrs(r.Context(), slog.LevelWarn, "update not stored; Telegram will retry", slog.Any("error", err))
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, answer{Error: "the update could not be stored; retry"})
	case errors.Is(err, ErrMalformed):
		writeJSON(w, http.StatusBadRequest, answer{Error: err.Error()})
	default:
		status := http.StatusBadRequest
		if errors.Is(err, ingress.ErrTooLarge) {
			status = http.StatusRequestEntityTooLarge
		}
		a.log.LogAttrs(r.Context(), slog.LevelWarn, "update refused", slog.Any("error", err))
		writeJSON(w, status, answer{Error: err.Error()})
	}
}

// Handle parses one update and publishes it; the error is a *Skip for an
// update that is not for the agent, or wraps ErrMalformed,
// ingress.ErrRejected or ingress.ErrUnavailable.
func (a *Adapter) Handle(ctx context.Context, body []byte) (ingress.Accepted, error) {
	u, err := ParseUpdate(body)
	if err != nil {
		return ingress.Accepted{}, err
	}
	m, err := ToMessage(u, a.botInfo(ctx))
	if err != nil {
		return ingress.Accepted{}, err
	}
	a.linkMedia(&m)
	res, err := a.pub.Publish(ctx, m)
	if err != nil {
		return ingress.Accepted{}, err
	}
	a.log.LogAttrs(ctx, slog.LevelDebug, "update accepted", slog.Int64("update_id", u.UpdateID),
		slog.String("session_key", res.SessionKey), slog.Uint64("seq", res.Seq), slog.Bool("duplicate", res.Duplicate))
	return res, nil
}

// Poll runs the getUpdates loop until ctx ends; run it under an
// ingress.Singleton so one process per bot polls. Each update is published
// before the next getUpdates confirms it (offset = last update_id + 1), so
// a poller that dies leaves its unconfirmed updates to the next one, which
// publishes them again as duplicates of the same ids: none lost, none
// handled twice. An update the inbox cannot store now stops the batch; it
// is fetched again after a backoff.
func (a *Adapter) Poll(ctx context.Context) error {
	log := a.log.With(slog.String("mode", ModePoll))
	if err := a.client.DeleteWebhook(ctx); err != nil && ctx.Err() == nil {
		// getUpdates answers 409 while a webhook is set: say why.
		log.LogAttrs(ctx, slog.LevelWarn, "deleteWebhook failed", slog.Any("error", err))
	}
	log.LogAttrs(ctx, slog.LevelInfo, "polling for updates")
	var offset int64
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, a.cfg.PollTimeout+10*time.Second)
		ups, err := a.client.GetUpdates(pctx, offset, a.cfg.PollTimeout, allowedUpdates)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			wait := backoff
			var ae *APIError
			if errors.As(err, &ae) && ae.RetryAfter > 0 {
				wait = ae.RetryAfter
			}
			log.LogAttrs(ctx, slog.LevelWarn, "getUpdates failed; retrying", slog.Any("error", err), slog.Duration("retry_in", wait))
			if !sleep(ctx, wait) {
				break
			}
			backoff = min(2*backoff, 30*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		if !a.handleBatch(ctx, log, ups, &offset) {
			break
		}
	}
	log.LogAttrs(context.WithoutCancel(ctx), slog.LevelInfo, "polling stopped", slog.Int64("offset", offset))
	return nil
}

// handleBatch publishes a getUpdates batch in order, moving offset past
// each update handled (published, skipped or refused for good). An update
// the inbox cannot store now ends the batch, so the next getUpdates returns
// it again. It reports false when ctx ended.
func (a *Adapter) handleBatch(ctx context.Context, log *slog.Logger, ups []json.RawMessage, offset *int64) bool {
	for _, raw := range ups {
		if ctx.Err() != nil {
			return false // the role was lost: the next poller fetches the rest
		}
		id, ok := updateID(raw)
		if !ok {
			log.LogAttrs(ctx, slog.LevelWarn, "update without update_id skipped", slog.String("update", truncate(raw)))
			continue
		}
		if id < *offset {
			continue // already confirmed
		}
		_, err := a.Handle(context.WithoutCancel(ctx), raw)
		var skip *Skip
		switch {
		case err == nil, errors.As(err, &skip):
		case errors.Is(err, ingress.ErrUnavailable):
			log.LogAttrs(ctx, slog.LevelWarn, "update not stored; fetching it again", slog.Int64("update_id", id), slog.Any("error", err))
			return sleep(ctx, time.Second)
		default:
			log.LogAttrs(ctx, slog.LevelWarn, "update refused; skipped", slog.Int64("update_id", id), slog.Any("error", err))
		}
		*offset = id + 1
	}
	return ctx.Err() == nil
}

func updateID(raw json.RawMessage) (int64, bool) {
	var u struct {
		UpdateID *int64 `json:"update_id"`
	}
	if json.Unmarshal(raw, &u) != nil || u.UpdateID == nil {
		return 0, false
	}
	return *u.UpdateID, true
}

// Sender returns the ingress.Sender that posts replies with sendMessage.
func (a *Adapter) Sender() ingress.Sender { return sender{a} }

type sender struct{ a *Adapter }

// Send posts text to the reply's chat, in its forum topic. A group that
// became a supergroup is followed to its new id once.
func (s sender) Send(ctx context.Context, t ingress.Target, text string) error {
	var thread int64
	if t.ThreadID != "" {
		n, err := strconv.ParseInt(t.ThreadID, 10, 64)
		if err != nil {
			return &ingress.SendError{Permanent: true, Err: fmt.Errorf("thread id %q is not a Telegram topic id", t.ThreadID)}
		}
		thread = n
	}
	err := s.a.client.SendMessage(ctx, t.ChatID, thread, text)
	var ae *APIError
	if errors.As(err, &ae) && ae.MigrateTo != 0 {
		err = s.a.client.SendMessage(ctx, strconv.FormatInt(ae.MigrateTo, 10), thread, text)
	}
	if err != nil {
		return sendError(err)
	}
	return nil
}

// Post is Send that returns the new message's id (an ingress.LiveSender:
// the first streamed delta of a turn).
func (s sender) Post(ctx context.Context, t ingress.Target, text string) (string, error) {
	thread, err := topic(t)
	if err != nil {
		return "", err
	}
	id, err := s.a.client.PostMessage(ctx, t.ChatID, thread, text)
	if err != nil {
		return "", sendError(err)
	}
	return strconv.FormatInt(id, 10), nil
}

// Edit replaces the text of a message posted by Post (editMessageText).
func (s sender) Edit(ctx context.Context, t ingress.Target, msgID, text string) error {
	id, err := strconv.ParseInt(msgID, 10, 64)
	if err != nil {
		return &ingress.SendError{Permanent: true, Err: fmt.Errorf("message id %q is not a Telegram message id", msgID)}
	}
	if err := s.a.client.EditMessageText(ctx, t.ChatID, id, text); err != nil {
		se := sendError(err)
		// A failed edit changes nothing visible: retried as it is.
		if e, ok := se.(*ingress.SendError); ok {
			e.Ambiguous = false
		}
		return se
	}
	return nil
}

func topic(t ingress.Target) (int64, error) {
	if t.ThreadID == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(t.ThreadID, 10, 64)
	if err != nil {
		return 0, &ingress.SendError{Permanent: true, Err: fmt.Errorf("thread id %q is not a Telegram topic id", t.ThreadID)}
	}
	return n, nil
}

// LiveConfig returns the live-message settings of Telegram: one edit per
// chat per second (its per-chat limit), a 429 pausing the chat.
func LiveConfig(s ingress.Sender) ingress.LiveEditsConfig {
	ls, _ := s.(ingress.LiveSender)
	return ingress.LiveEditsConfig{
		Platform:     session.PlatformTelegram,
		Sender:       ls,
		MaxLen:       MaxMessageLength,
		Length:       ingress.UTF16Len,
		EditInterval: ChatInterval,
	}
}

// DeliveryConfig returns the platform delivery settings of Telegram: its
// message limit in UTF-16 units and its per-chat pace.
func DeliveryConfig(s ingress.Sender) ingress.PlatformDeliveryConfig {
	return ingress.PlatformDeliveryConfig{
		Platform:     session.PlatformTelegram,
		Sender:       s,
		MaxLen:       MaxMessageLength,
		Length:       ingress.UTF16Len,
		ChatInterval: ChatInterval,
	}
}

func truncate(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}
