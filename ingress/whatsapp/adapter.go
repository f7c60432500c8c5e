// Package whatsapp is the WhatsApp Business Cloud API adapter of
// agentfleet: the webhook at /webhooks/whatsapp (GET: Meta's verification
// handshake; POST: notifications signed with X-Hub-Signature-256), and the
// Sender through which an ingress.PlatformDelivery posts replies with
// POST /{phone_number_id}/messages.
//
// Inbound messages are published with the de-duplication id
// "whatsapp:<from>:<wamid>", so Meta's at-least-once redeliveries are one
// inbox message. Status callbacks (sent, delivered, read, failed) are not
// turns: each is recorded as a delivery_status event on the events stream,
// and a failed one also as a delivery_failed event (fleetctl delivery
// failures). Every accepted message records the time the user last wrote
// in the lane; a reply to a lane whose user has not written for 24 hours
// (WhatsApp's customer-service window, outside which only template
// messages may be sent) fails at once with ErrOutsideWindow, recorded as a
// delivery failure, instead of being posted and refused later.
package whatsapp

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
)

// Defaults and limits.
const (
	// DefaultAPIBase is the Graph API, with its version.
	DefaultAPIBase      = "https://graph.facebook.com/v23.0"
	DefaultMaxBodyBytes = 1 << 20
	// MaxMessageLength is the longest text message body the Cloud API
	// sends, in characters: longer replies are split.
	MaxMessageLength = 4096
	// ChatInterval paces messages to one user (WhatsApp limits the
	// messages from one business number to one user; a burst of parts
	// is spread out rather than refused with error 131056).
	ChatInterval = time.Second
	// Window is WhatsApp's customer-service window: free-form messages may
	// be sent until 24 hours after the user's last message.
	Window = 24 * time.Hour
	// HeaderSignature carries "sha256=<hex HMAC-SHA256 of the raw body>".
	HeaderSignature = "X-Hub-Signature-256"
	// StatusKind is the event kind of a status callback:
	// <prefix>.ev.delivery_status.<lane>.
	StatusKind = "delivery_status"
)

// ErrOutsideWindow is the error of a reply to a user who has not written
// for longer than Window (or never): WhatsApp only lets template messages
// through then.
var ErrOutsideWindow = errors.New("outside WhatsApp's 24-hour customer-service window")

// Config configures the adapter.
type Config struct {
	// AppSecret is the Meta app secret: the key of X-Hub-Signature-256.
	// Required for Handler.
	AppSecret string
	// VerifyToken is the token Meta echoes in the GET handshake. Required
	// for Handler.
	VerifyToken string
	// AccessToken is the Graph API bearer token. Required for Sender.
	AccessToken string
	// PhoneNumberID is the business phone number id replies are sent from.
	// Required for Sender.
	PhoneNumberID string
	// APIBase is the Graph API base URL with version. Defaults to
	// DefaultAPIBase.
	APIBase string
	// MediaBaseURL is the URL at which agents reach this ingress (its
	// http.public_url): attachments get links to its media endpoint,
	// GET /v1/media/whatsapp/<media id>, which downloads the file with the
	// access token on the agent's behalf. Empty (or no access token):
	// attachments carry the media id only.
	MediaBaseURL string
	// MaxBodyBytes caps a webhook body. Defaults to 1 MiB.
	MaxBodyBytes int64
	// HTTPClient makes the API calls. Defaults to a client with a 30 s
	// timeout.
	HTTPClient *http.Client
	// Logger receives structured logs. Defaults to a discard logger.
	Logger *slog.Logger
	// Now is the clock (tests). Defaults to time.Now.
	Now func() time.Time
}

// Adapter turns Cloud API notifications into inbox messages and events,
// and sends replies.
type Adapter struct {
	cfg   Config
	pub   *ingress.Publisher
	js    jetstream.JetStream
	res   *broker.Resources
	names broker.Names
	log   *slog.Logger
	// linker makes the media links (nil without Config.MediaBaseURL).
	linker *ingress.MediaLinker
}

// New returns the adapter publishing through pub; js and res hold the
// events stream and the delivered bucket (window records).
func New(pub *ingress.Publisher, js jetstream.JetStream, res *broker.Resources, cfg Config) (*Adapter, error) {
	if pub == nil || js == nil || res == nil || res.Delivered == nil {
		return nil, fmt.Errorf("%w: whatsapp: needs a Publisher, JetStream and a provisioned Delivered bucket", ingress.ErrInvalidConfig)
	}
	if cfg.APIBase == "" {
		cfg.APIBase = DefaultAPIBase
	}
	cfg.APIBase = strings.TrimRight(cfg.APIBase, "/")
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	a := &Adapter{cfg: cfg, pub: pub, js: js, res: res, names: pub.Names(),
		log: cfg.Logger.With(slog.String("platform", "whatsapp"))}
	if cfg.MediaBaseURL != "" && cfg.AccessToken != "" {
		l, err := ingress.NewMediaLinker(cfg.MediaBaseURL, session.PlatformWhatsApp, ingress.MediaKey(cfg.AccessToken))
		if err != nil {
			return nil, fmt.Errorf("whatsapp: %w", err)
		}
		a.linker = l
	}
	return a, nil
}

// Handler serves GET and POST /webhooks/whatsapp. It refuses to exist
// without an app secret and a verify token.
func (a *Adapter) Handler() (http.Handler, error) {
	if a.cfg.AppSecret == "" {
		return nil, fmt.Errorf("%w: whatsapp: app_secret is empty; refusing to accept unsigned notifications", ingress.ErrInvalidConfig)
	}
	if a.cfg.VerifyToken == "" {
		return nil, fmt.Errorf("%w: whatsapp: verify_token is empty; Meta cannot verify the webhook", ingress.ErrInvalidConfig)
	}
	return http.HandlerFunc(a.serve), nil
}

func (a *Adapter) serve(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		a.verifyHandshake(w, r)
	case http.MethodPost:
		a.notification(w, r)
	default:
		w.Header().Set("Allow", "GET, POST")
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "use GET (verification) or POST"})
	}
}

// verifyHandshake answers Meta's subscription check: hub.mode=subscribe
// and the configured hub.verify_token get hub.challenge back; anything
// else 403.
func (a *Adapter) verifyHandshake(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	got := sha256.Sum256([]byte(q.Get("hub.verify_token")))
	want := sha256.Sum256([]byte(a.cfg.VerifyToken))
	if q.Get("hub.mode") != "subscribe" || subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		a.log.LogAttrs(r.Context(), slog.LevelWarn, "webhook verification refused", slog.String("remote", r.RemoteAddr))
		http.Error(w, "verification failed", http.StatusForbidden)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = io.WriteString(w, q.Get("hub.challenge"))
}

func (a *Adapter) notification(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength > a.cfg.MaxBodyBytes {
		writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"error": fmt.Sprintf("body is larger than %d bytes", a.cfg.MaxBodyBytes)})
		return
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(ingress.BodyReadTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, a.cfg.MaxBodyBytes))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"error": fmt.Sprintf("body is larger than %d bytes", a.cfg.MaxBodyBytes)})
			return
		}
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "cannot read the body"})
		return
	}
	if !ValidSignature(a.cfg.AppSecret, body, r.Header.Get(HeaderSignature)) {
		a.log.LogAttrs(r.Context(), slog.LevelWarn, "notification refused: missing or wrong signature", slog.String("remote", r.RemoteAddr))
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "missing or wrong " + HeaderSignature})
		return
	}
	res, err := a.Handle(r.Context(), body)
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, res)
	case errors.Is(err, ingress.ErrUnavailable):
		// Meta retries a non-2xx answer for days; the messages already
		// stored are duplicates then.
		a.log.LogAttrs(r.Context(), slog.LevelWarn, "notification not stored; Meta will retry", slog.Any("error", err))
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "the notification could not be stored; retry"})
	default:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
	}
}

// ValidSignature reports whether header is "sha256=<hex>" of the
// HMAC-SHA256 of body keyed by secret, compared in constant time.
func ValidSignature(secret string, body []byte, header string) bool {
	hexSig, ok := strings.CutPrefix(header, "sha256=")
	if !ok || secret == "" {
		return false
	}
	sig, err := hex.DecodeString(hexSig)
	if err != nil {
		return false
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return hmac.Equal(sig, mac.Sum(nil))
}

// Sign returns the X-Hub-Signature-256 value of body under secret.
func Sign(secret string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// Result is the answer to a notification.
type Result struct {
	OK         bool     `json:"ok"`
	Accepted   int      `json:"accepted"`
	Duplicates int      `json:"duplicates,omitempty"`
	Statuses   int      `json:"statuses,omitempty"`
	Ignored    []string `json:"ignored,omitempty"`
}

// Handle parses a verified notification and publishes what it holds: each
// message into its lane (a refused one is logged and ignored: retrying
// cannot help), each status as events. An error wraps ErrMalformed or
// ingress.ErrUnavailable (nothing may be lost: the caller answers 5xx so
// Meta retries; what was stored is de-duplicated then).
func (a *Adapter) Handle(ctx context.Context, body []byte) (Result, error) {
	p, err := ParsePayload(body)
	if err != nil {
		return Result{}, err
	}
	res := Result{OK: true}
	for _, e := range p.Entry {
		for _, c := range e.Changes {
			if c.Field != "messages" {
				res.Ignored = append(res.Ignored, "field "+c.Field)
				continue
			}
			v := &c.Value
			for i := range v.Messages {
				m := &v.Messages[i]
				acc, err := a.handleMessage(ctx, v, m)
				var skip *Skip
				switch {
				case err == nil:
					res.Accepted++
					if acc.Duplicate {
						res.Duplicates++
					}
				case errors.As(err, &skip):
					res.Ignored = append(res.Ignored, skip.Reason)
				case errors.Is(err, ingress.ErrUnavailable):
					return Result{}, err
				default:
					a.log.LogAttrs(ctx, slog.LevelWarn, "message refused", slog.String("wamid", m.ID), slog.Any("error", err))
					res.Ignored = append(res.Ignored, err.Error())
				}
			}
			for i := range v.Statuses {
				if err := a.recordStatus(ctx, &v.Statuses[i]); err != nil {
					return Result{}, err
				}
				res.Statuses++
			}
		}
	}
	return res, nil
}

func (a *Adapter) handleMessage(ctx context.Context, v *Value, m *Message) (ingress.Accepted, error) {
	msg, err := ToMessage(v, m)
	if err != nil {
		return ingress.Accepted{}, err
	}
	a.link(&msg)
	acc, err := a.pub.Publish(ctx, msg)
	if err != nil {
		return ingress.Accepted{}, err
	}
	at := m.sentAt()
	if now := a.cfg.Now(); at.IsZero() || at.After(now) {
		at = now
	}
	if err := a.touchWindow(ctx, acc.SessionKey, at); err != nil {
		// The message is stored; without the record the window check fails
		// closed, so ask for the retry that writes it (a duplicate then).
		return ingress.Accepted{}, fmt.Errorf("%w: window record: %w", ingress.ErrUnavailable, err)
	}
	a.log.LogAttrs(ctx, slog.LevelDebug, "message accepted", slog.String("wamid", m.ID),
		slog.String("session_key", acc.SessionKey), slog.Uint64("seq", acc.Seq), slog.Bool("duplicate", acc.Duplicate))
	return acc, nil
}

// windowRecord is the last time the user of a lane wrote.
type windowRecord struct {
	LastInbound time.Time `json:"last_inbound"`
}

// WindowKey is the key of a lane's window record in the delivered bucket.
func WindowKey(sessionKey string) string {
	return string(session.PlatformWhatsApp) + "._window." + session.LaneToken(sessionKey)
}

func (a *Adapter) touchWindow(ctx context.Context, sessionKey string, at time.Time) error {
	key := WindowKey(sessionKey)
	if last, err := a.lastInbound(ctx, key); err == nil && !last.Before(at) {
		return nil
	}
	data, _ := json.Marshal(windowRecord{LastInbound: at.UTC()})
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, err := a.res.Delivered.Put(pctx, key, data)
	return err
}

// lastInbound reads a window record; jetstream.ErrKeyNotFound when none.
func (a *Adapter) lastInbound(ctx context.Context, key string) (time.Time, error) {
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	e, err := a.res.Delivered.Get(gctx, key)
	if err != nil {
		return time.Time{}, err
	}
	var r windowRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return time.Time{}, jetstream.ErrKeyNotFound
	}
	return r.LastInbound, nil
}

// StatusEvent is the event recorded for a status callback.
type StatusEvent struct {
	Platform    session.Platform `json:"platform"`
	MessageID   string           `json:"message_id"`
	Status      string           `json:"status"`
	RecipientID string           `json:"recipient_id"`
	SessionKey  string           `json:"session_key,omitempty"`
	Errors      []string         `json:"errors,omitempty"`
	At          time.Time        `json:"at,omitzero"`
}

// recordStatus publishes a status callback as a delivery_status event (a
// failed one also as a delivery_failed event), de-duplicated on the
// message id and status.
func (a *Adapter) recordStatus(ctx context.Context, st *Status) error {
	if st.ID == "" || st.Status == "" {
		return nil
	}
	ev := StatusEvent{Platform: session.PlatformWhatsApp, MessageID: st.ID, Status: st.Status, RecipientID: st.RecipientID}
	lane := "_"
	if st.RecipientID != "" {
		ev.SessionKey = a.pub.SessionKey(session.SessionSource{Platform: session.PlatformWhatsApp, ChatType: session.ChatDM,
			ChatID: st.RecipientID, UserID: st.RecipientID})
		lane = session.LaneToken(ev.SessionKey)
	}
	if sec, err := parseUnix(st.Timestamp); err == nil {
		ev.At = sec
	}
	for _, e := range st.Errors {
		ev.Errors = append(ev.Errors, e.String())
	}
	data, _ := json.Marshal(ev)
	if err := a.publishEvent(ctx, StatusKind, lane, ev.SessionKey, fmt.Sprintf("%s:whatsapp:%s:%s", StatusKind, st.ID, st.Status), data, ""); err != nil {
		return err
	}
	if st.Status != "failed" {
		return nil
	}
	reason := "WhatsApp reports the message failed"
	if len(ev.Errors) > 0 {
		reason += ": " + strings.Join(ev.Errors, "; ")
	}
	f := ingress.DeliveryFailure{Platform: session.PlatformWhatsApp, SessionKey: ev.SessionKey, ChatID: st.RecipientID,
		Kind: "status", Error: reason + " (message " + st.ID + ")", FailedAt: a.cfg.Now().UTC()}
	if !ev.At.IsZero() {
		f.FailedAt = ev.At
	}
	data, _ = json.Marshal(f)
	return a.publishEvent(ctx, broker.DeliveryFailedKind, lane, ev.SessionKey, broker.DeliveryFailedKind+":whatsapp:"+st.ID, data, reason)
}

func (a *Adapter) publishEvent(ctx context.Context, kind, lane, sessionKey, id string, data []byte, reason string) error {
	m := nats.NewMsg(a.names.EventSubject(kind, lane))
	m.Data = data
	if sessionKey != "" {
		m.Header.Set(broker.HdrSessionKey, sessionKey)
	}
	if reason != "" {
		m.Header.Set(broker.HdrReason, reason)
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := a.js.PublishMsg(pctx, m, jetstream.WithMsgID(id), jetstream.WithExpectStream(a.names.EventStream())); err != nil {
		return fmt.Errorf("%w: %s event: %w", ingress.ErrUnavailable, kind, err)
	}
	return nil
}

// DeliveryConfig returns the platform delivery settings of WhatsApp.
func DeliveryConfig(s ingress.Sender) ingress.PlatformDeliveryConfig {
	return ingress.PlatformDeliveryConfig{
		Platform:     session.PlatformWhatsApp,
		Sender:       s,
		MaxLen:       MaxMessageLength,
		Length:       ingress.RuneLen,
		ChatInterval: ChatInterval,
	}
}

func parseUnix(s string) (time.Time, error) {
	var sec int64
	if _, err := fmt.Sscan(s, &sec); err != nil || sec <= 0 {
		return time.Time{}, errors.New("no timestamp")
	}
	return time.Unix(sec, 0).UTC(), nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}
