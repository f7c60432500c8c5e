// Package slack is the Slack adapter of agentfleet: the Events API endpoint
// at POST /webhooks/slack and the Sender through which an
// ingress.PlatformDelivery posts replies with chat.postMessage.
//
// It uses github.com/slack-go/slack for what that library does well and
// the adapter would otherwise re-implement: the v0 request signature
// (HMAC-SHA256 over "v0:<timestamp>:<raw body>", a 5-minute replay window,
// a constant-time compare), the decoding of Events API envelopes and inner
// events (message subtypes included), and the Web API client
// (chat.postMessage at a configurable API URL, with 429 answers surfaced as
// *slack.RateLimitedError carrying Retry-After).
package slack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	slackapi "github.com/slack-go/slack"
	"github.com/slack-go/slack/slackevents"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
)

// Defaults and limits.
const (
	// DefaultAPIBase is the Slack Web API.
	DefaultAPIBase      = "https://slack.com/api/"
	DefaultMaxBodyBytes = 1 << 20
	// AckBudget is how long the handler may take before answering: Slack
	// waits 3 s, then counts the delivery as failed and retries it.
	AckBudget = 2500 * time.Millisecond
	// MaxTextLength is the longest message text accepted, in characters
	// (Slack truncates messages at 40,000).
	MaxTextLength = 40000
	// MaxMessageLength is the length of the chunks a long reply is split
	// into: Slack advises keeping a message's text under 4,000 characters.
	MaxMessageLength = 4000
	// ChatInterval paces messages to one channel (chat.postMessage allows
	// about one message per second per channel).
	ChatInterval = time.Second
)

// Config configures the adapter.
type Config struct {
	// SigningSecret verifies request signatures. Required for Handler.
	SigningSecret string
	// BotToken (xoxb-...) posts replies. Required for Sender.
	BotToken string
	// APIBase is the Web API base URL, ending in "/". Defaults to
	// DefaultAPIBase.
	APIBase string
	// RequireMention makes channel messages count only when they mention
	// the app (app_mention events always do; DMs never need one).
	RequireMention bool
	// MaxBodyBytes caps a request body. Defaults to 1 MiB.
	MaxBodyBytes int64
	// MediaBaseURL is the URL at which agents reach this ingress (its
	// http.public_url): attachments get links to its media endpoint,
	// GET /v1/media/slack/<file id>, which downloads the file with the bot
	// token (scope files:read) on the agent's behalf. Empty: attachments
	// carry the file id only.
	MediaBaseURL string
	// HTTPClient makes Web API calls. Defaults to a client with a 30 s
	// timeout.
	HTTPClient *http.Client
	// Logger receives structured logs. Defaults to a discard logger.
	Logger *slog.Logger
}

// Adapter turns Events API requests into inbox messages and sends replies.
type Adapter struct {
	cfg    Config
	pub    *ingress.Publisher
	api    *slackapi.Client
	log    *slog.Logger
	mu     sync.Mutex
	botIDs map[string]string // team id -> the app's bot user id
	// linker makes the media links (nil without Config.MediaBaseURL).
	linker *ingress.MediaLinker
}

// New returns the adapter publishing through pub.
func New(pub *ingress.Publisher, cfg Config) (*Adapter, error) {
	if pub == nil {
		return nil, fmt.Errorf("%w: slack: Publisher is nil", ingress.ErrInvalidConfig)
	}
	if cfg.APIBase == "" {
		cfg.APIBase = DefaultAPIBase
	}
	if !strings.HasSuffix(cfg.APIBase, "/") {
		cfg.APIBase += "/"
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	a := &Adapter{
		cfg:    cfg,
		pub:    pub,
		api:    slackapi.New(cfg.BotToken, slackapi.OptionAPIURL(cfg.APIBase), slackapi.OptionHTTPClient(cfg.HTTPClient)),
		log:    cfg.Logger.With(slog.String("platform", "slack")),
		botIDs: map[string]string{},
	}
	if cfg.MediaBaseURL != "" {
		if cfg.BotToken == "" {
			return nil, fmt.Errorf("%w: slack: media links need the bot token", ingress.ErrInvalidConfig)
		}
		l, err := ingress.NewMediaLinker(cfg.MediaBaseURL, session.PlatformSlack, ingress.MediaKey(cfg.BotToken))
		if err != nil {
			return nil, fmt.Errorf("slack: %w", err)
		}
		a.linker = l
	}
	return a, nil
}

// Skip says why an event is not a message for the agent; it is answered
// 200 and publishes nothing.
type Skip struct{ Reason string }

func (s *Skip) Error() string { return "ignored: " + s.Reason }

// ErrMalformed wraps a body that is not an Events API payload.
var ErrMalformed = errors.New("malformed slack event")

// Event is a verified Events API request, decoded.
type Event struct {
	// Type is url_verification, event_callback or app_rate_limited.
	Type string
	// Challenge is the url_verification challenge.
	Challenge string
	// EventID is the top-level event_id.
	EventID string
	// TeamID is the workspace.
	TeamID string
	// BotUserID is the app's bot user in this workspace, from the
	// payload's authorizations, "" when absent.
	BotUserID string
	// Inner is the inner event: *slackevents.MessageEvent,
	// *slackevents.AppMentionEvent or another type (ignored).
	Inner any
}

// ParseEvent decodes an Events API body. It never panics, whatever body
// holds.
func ParseEvent(body []byte) (ev *Event, err error) {
	defer func() {
		if r := recover(); r != nil {
			ev, err = nil, fmt.Errorf("%w: %v", ErrMalformed, r)
		}
	}()
	if !json.Valid(body) {
		return nil, fmt.Errorf("%w: not JSON", ErrMalformed)
	}
	parsed, err := slackevents.ParseEvent(json.RawMessage(body), slackevents.OptionNoVerifyToken())
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	ev = &Event{Type: parsed.Type, TeamID: parsed.TeamID}
	switch d := parsed.Data.(type) {
	case *slackevents.ChallengeResponse:
		ev.Challenge = d.Challenge
	case *slackevents.EventsAPIURLVerificationEvent:
		ev.Challenge = d.Challenge
	case *slackevents.EventsAPICallbackEvent:
		ev.EventID = d.EventID
		for _, a := range d.Authorizations {
			if a.IsBot && a.UserID != "" && (a.TeamID == "" || a.TeamID == d.TeamID) {
				ev.BotUserID = a.UserID
				break
			}
		}
		ev.Inner = parsed.InnerEvent.Data
	}
	if ev.Type == slackevents.CallbackEvent && ev.Inner == nil {
		return nil, fmt.Errorf("%w: event_callback without an event", ErrMalformed)
	}
	return ev, nil
}

// userSubtypes are the message subtypes a person's new message can have.
var userSubtypes = map[string]bool{"": true, "file_share": true, "thread_broadcast": true, "me_message": true}

// ToMessage turns a decoded event into the message to publish: DMs (im)
// are dm, multi-person DMs (mpim) group, channels and private channels
// channel; thread_ts is the thread; the team is the guild. The de-
// duplication id is the channel and the message ts, shared by a message's
// retries and by its message and app_mention events. Edits, deletions,
// joins and other subtypes, bot messages (the app's own echoes included),
// and channel messages without a mention (when requireMention) are *Skip.
func ToMessage(ev *Event, botUserID string, requireMention bool) (ingress.Message, error) {
	if botUserID == "" {
		botUserID = ev.BotUserID
	}
	var user, text, ts, threadTS, channel, channelType, botID string
	var files []slackapi.File
	var shared []slackapi.Attachment
	mentioned := false
	switch e := ev.Inner.(type) {
	case *slackevents.MessageEvent:
		if !userSubtypes[e.SubType] {
			return ingress.Message{}, &Skip{"message subtype " + e.SubType}
		}
		user, text, ts, threadTS, channel, channelType, botID = e.User, e.Text, e.TimeStamp, e.ThreadTimeStamp, e.Channel, e.ChannelType, e.BotID
		if e.Message != nil {
			files, shared = e.Message.Files, e.Message.Attachments
		}
	case *slackevents.AppMentionEvent:
		if e.Edited != nil {
			return ingress.Message{}, &Skip{"edited message"}
		}
		user, text, ts, threadTS, channel, botID = e.User, e.Text, e.TimeStamp, e.ThreadTimeStamp, e.Channel, e.BotID
		files, shared = e.Files, e.Attachments
		mentioned = true
	default:
		return ingress.Message{}, &Skip{fmt.Sprintf("event %T", ev.Inner)}
	}
	if botID != "" || (user != "" && user == botUserID) {
		return ingress.Message{}, &Skip{"sent by a bot"}
	}
	if user == "" || channel == "" || ts == "" {
		return ingress.Message{}, fmt.Errorf("%w: message without user, channel or ts", ingress.ErrRejected)
	}
	if channelType == "" {
		channelType = channelTypeOf(channel)
	}
	src := session.SessionSource{
		Platform:  session.PlatformSlack,
		ChatID:    channel,
		UserID:    user,
		ThreadID:  threadTS,
		GuildID:   ev.TeamID,
		MessageID: ts,
	}
	switch channelType {
	case "im":
		src.ChatType = session.ChatDM
	case "mpim":
		src.ChatType = session.ChatGroup
	case "channel", "group":
		src.ChatType = session.ChatChannel
	default:
		return ingress.Message{}, &Skip{fmt.Sprintf("channel type %q", channelType)}
	}
	if botUserID != "" && strings.Contains(text, "<@"+botUserID+">") {
		mentioned = true
		text = strings.TrimSpace(strings.ReplaceAll(text, "<@"+botUserID+">", ""))
	}
	if requireMention && src.ChatType != session.ChatDM && !mentioned {
		return ingress.Message{}, &Skip{"channel message without a mention of the app"}
	}
	atts := attachments(files)
	if strings.TrimSpace(text) == "" && len(atts) == 0 {
		return ingress.Message{}, &Skip{"no text"}
	}
	if !utf8.ValidString(text) {
		return ingress.Message{}, fmt.Errorf("%w: text is not valid UTF-8", ingress.ErrRejected)
	}
	if n := utf8.RuneCountInString(text); n > MaxTextLength {
		return ingress.Message{}, fmt.Errorf("%w: %w: text of %d characters is longer than Slack's %d", ingress.ErrRejected, ingress.ErrTooLarge, n, MaxTextLength)
	}
	return ingress.Message{
		Source:      src,
		Text:        text,
		DedupID:     ingress.PlatformMsgID(session.PlatformSlack, channel, ts),
		Attachments: atts,
		Quote:       quoteOf(shared, ts, threadTS),
	}, nil
}

// attachments maps the files of a message onto the fleet's attachments by
// their media type: images are photos, Slack's recorded clips
// (media_display_type audio) voice notes, other audio audio, video video,
// anything else a document. Deleted files (tombstones) and files hidden by
// the workspace's plan carry nothing to fetch and are left out. Only file
// ids: the adapter adds the URLs (url_private needs the bot token).
func attachments(files []slackapi.File) []session.Attachment {
	var out []session.Attachment
	for _, f := range files {
		if f.ID == "" || f.Mode == "tombstone" || f.Mode == "hidden_by_limit" {
			continue
		}
		a := session.Attachment{FileID: f.ID, MimeType: f.Mimetype, Size: int64(max(f.Size, 0)), Name: f.Name}
		major, _, _ := strings.Cut(f.Mimetype, "/")
		switch {
		case f.MediaDisplayType == "audio":
			a.Kind = session.AttachVoice
		case major == "image":
			a.Kind = session.AttachPhoto
		case major == "audio":
			a.Kind = session.AttachAudio
		case major == "video" || f.MediaDisplayType == "video":
			a.Kind = session.AttachVideo
		default:
			a.Kind = session.AttachDocument
		}
		if !utf8.ValidString(a.Name) {
			a.Name = strings.ToValidUTF8(a.Name, "")
		}
		if len(a.Name) > session.MaxFileNameLength {
			a.Name = ""
		}
		if _, _, err := mime.ParseMediaType(a.MimeType); err != nil || !strings.Contains(a.MimeType, "/") {
			a.MimeType = ""
		}
		out = append(out, a)
	}
	return out
}

// quoteOf is a Slack message's reply context: a message the user shared
// or quoted into it (an attachment Slack marks is_share or is_msg_unfurl,
// with the quoted text and author), else, for a reply in a thread, the
// thread's parent (its ts only: the event does not carry its text).
func quoteOf(shared []slackapi.Attachment, ts, threadTS string) *session.Quote {
	for _, a := range shared {
		if !a.IsShare && !a.IsMsgUnfurl {
			continue
		}
		q := &session.Quote{MessageID: string(a.Ts), Text: strings.ToValidUTF8(a.Text, ""), SenderID: a.AuthorID,
			SenderName: strings.ToValidUTF8(a.AuthorName, "")}
		if q.MessageID == "" || session.ValidateID("message_id", q.MessageID) != nil || session.ValidateID("sender_id", q.SenderID) != nil {
			continue
		}
		if len(q.SenderName) > session.MaxNameLength {
			q.SenderName = ""
		}
		return q
	}
	if threadTS != "" && threadTS != ts {
		return &session.Quote{MessageID: threadTS}
	}
	return nil
}

// channelTypeOf infers a channel's type from its id when the event does not
// say (app_mention): D is a DM, anything else a channel.
func channelTypeOf(channel string) string {
	if strings.HasPrefix(channel, "D") {
		return "im"
	}
	return "channel"
}

// Handler serves POST /webhooks/slack. It refuses to exist without a
// signing secret: unverified requests could post as anyone.
func (a *Adapter) Handler() (http.Handler, error) {
	if a.cfg.SigningSecret == "" {
		return nil, fmt.Errorf("%w: slack: signing secret is empty; refusing to accept unverified requests", ingress.ErrInvalidConfig)
	}
	return http.HandlerFunc(a.serve), nil
}

func (a *Adapter) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "use POST"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), AckBudget)
	defer cancel()
	if r.ContentLength > a.cfg.MaxBodyBytes {
		writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"error": fmt.Sprintf("body is larger than %d bytes", a.cfg.MaxBodyBytes)})
		return
	}
	// A client trickling its body in must not hold the handler for ever.
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
	if err := a.verify(r.Header, body); err != nil {
		a.log.LogAttrs(ctx, slog.LevelWarn, "request refused: bad signature", slog.String("remote", r.RemoteAddr), slog.Any("error", err))
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "invalid or stale request signature"})
		return
	}
	ev, err := ParseEvent(body)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	switch ev.Type {
	case slackevents.URLVerification:
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, ev.Challenge)
		return
	case slackevents.AppRateLimited:
		a.log.LogAttrs(ctx, slog.LevelWarn, "slack reports the app's events are rate limited")
		writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
		return
	}
	res, err := a.handle(ctx, ev)
	var skip *Skip
	switch {
	case err == nil:
		a.log.LogAttrs(ctx, slog.LevelDebug, "event accepted", slog.String("event_id", ev.EventID),
			slog.String("retry_num", r.Header.Get("X-Slack-Retry-Num")), slog.String("session_key", res.SessionKey),
			slog.Uint64("seq", res.Seq), slog.Bool("duplicate", res.Duplicate))
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "duplicate": res.Duplicate})
	case errors.As(err, &skip):
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "ignored": skip.Reason})
	case errors.Is(err, ingress.ErrUnavailable):
		// Slack retries (up to 3 times over ~5 minutes).
		a.log.LogAttrs(ctx, slog.LevelWarn, "event not stored; Slack will retry", slog.Any("error", err))
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "the event could not be stored; retry"})
	default:
		// A retry cannot help: tell Slack not to retry.
		w.Header().Set("X-Slack-No-Retry", "1")
		status := http.StatusBadRequest
		if errors.Is(err, ingress.ErrTooLarge) {
			status = http.StatusRequestEntityTooLarge
		}
		a.log.LogAttrs(ctx, slog.LevelWarn, "event refused", slog.Any("error", err))
		writeJSON(w, status, map[string]string{"error": err.Error()})
	}
}

// verify checks the v0 signature over the raw body and the 5-minute
// replay window (slack-go's SecretsVerifier: hmac.Equal, constant time).
func (a *Adapter) verify(h http.Header, body []byte) error {
	sv, err := slackapi.NewSecretsVerifier(h, a.cfg.SigningSecret)
	if err != nil {
		return err
	}
	if _, err := sv.Write(body); err != nil {
		return err
	}
	return sv.Ensure()
}

// handle converts and publishes a verified event_callback.
func (a *Adapter) handle(ctx context.Context, ev *Event) (ingress.Accepted, error) {
	if ev.Type != slackevents.CallbackEvent {
		return ingress.Accepted{}, &Skip{"event type " + ev.Type}
	}
	m, err := ToMessage(ev, a.botUser(ctx, ev), a.cfg.RequireMention)
	if err != nil {
		return ingress.Accepted{}, err
	}
	a.linkMedia(&m)
	return a.pub.Publish(ctx, m)
}

// botUser returns the app's bot user id in the event's workspace: from the
// payload's authorizations, else from auth.test (once per workspace).
func (a *Adapter) botUser(ctx context.Context, ev *Event) string {
	if ev.BotUserID != "" {
		return ev.BotUserID
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if id, ok := a.botIDs[ev.TeamID]; ok {
		return id
	}
	if a.cfg.BotToken == "" {
		return ""
	}
	actx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := a.api.AuthTestContext(actx)
	if err != nil {
		a.log.LogAttrs(ctx, slog.LevelWarn, "auth.test failed; the app's own user is unknown", slog.Any("error", err))
		return ""
	}
	a.botIDs[ev.TeamID] = resp.UserID
	return resp.UserID
}

// Sender returns the ingress.Sender that posts replies with
// chat.postMessage, in the reply's thread.
func (a *Adapter) Sender() ingress.Sender { return sender{a} }

type sender struct{ a *Adapter }

func (s sender) Send(ctx context.Context, t ingress.Target, text string) error {
	opts := []slackapi.MsgOption{slackapi.MsgOptionText(text, false)}
	if t.ThreadID != "" {
		opts = append(opts, slackapi.MsgOptionTS(t.ThreadID))
	}
	_, _, err := s.a.api.PostMessageContext(ctx, t.ChatID, opts...)
	if err != nil {
		return sendError(err)
	}
	return nil
}

// Post is Send that returns the new message's ts (an ingress.LiveSender:
// the first streamed delta of a turn).
func (s sender) Post(ctx context.Context, t ingress.Target, text string) (string, error) {
	opts := []slackapi.MsgOption{slackapi.MsgOptionText(text, false)}
	if t.ThreadID != "" {
		opts = append(opts, slackapi.MsgOptionTS(t.ThreadID))
	}
	_, ts, err := s.a.api.PostMessageContext(ctx, t.ChatID, opts...)
	if err != nil {
		return "", sendError(err)
	}
	return ts, nil
}

// Edit replaces the text of message msgID (its ts) with chat.update.
func (s sender) Edit(ctx context.Context, t ingress.Target, msgID, text string) error {
	_, _, _, err := s.a.api.UpdateMessageContext(ctx, t.ChatID, msgID, slackapi.MsgOptionText(text, false))
	if err != nil {
		se := sendError(err)
		if e, ok := se.(*ingress.SendError); ok {
			e.Ambiguous = false // a failed edit changes nothing visible
		}
		return se
	}
	return nil
}

// LiveConfig returns the live-message settings of Slack: chat.update is a
// Tier 3 method (about 50 a minute per workspace), so one edit per chat
// per ChatInterval, and a 429 pauses every chat's edits.
func LiveConfig(s ingress.Sender) ingress.LiveEditsConfig {
	ls, _ := s.(ingress.LiveSender)
	return ingress.LiveEditsConfig{
		Platform:     session.PlatformSlack,
		Sender:       ls,
		MaxLen:       MaxMessageLength,
		Length:       ingress.RuneLen,
		EditInterval: ChatInterval,
		RateLimitAll: true,
	}
}

// sendError classifies a chat.postMessage failure.
func sendError(err error) error {
	var rl *slackapi.RateLimitedError
	var sc slackapi.StatusCodeError
	var se slackapi.SlackErrorResponse
	switch {
	case errors.As(err, &rl):
		return &ingress.SendError{RetryAfter: max(rl.RetryAfter, time.Second), Err: err}
	case errors.As(err, &sc):
		if sc.Code == http.StatusTooManyRequests { // without a Retry-After
			return &ingress.SendError{RetryAfter: time.Second, Err: err}
		}
		return &ingress.SendError{Ambiguous: sc.Code >= 500, Permanent: sc.Code < 500, Err: err}
	case errors.As(err, &se):
		switch se.Err {
		case "internal_error", "fatal_error", "service_unavailable", "request_timeout":
			return &ingress.SendError{Ambiguous: true, Err: err}
		case "ratelimited":
			return &ingress.SendError{RetryAfter: time.Second, Err: err}
		}
		// channel_not_found, not_in_channel, is_archived, invalid_auth...
		return &ingress.SendError{Permanent: true, Err: err}
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return &ingress.SendError{Err: err}
	}
	return &ingress.SendError{Ambiguous: true, Err: err}
}

// DeliveryConfig returns the platform delivery settings of Slack.
func DeliveryConfig(s ingress.Sender) ingress.PlatformDeliveryConfig {
	return ingress.PlatformDeliveryConfig{
		Platform:     session.PlatformSlack,
		Sender:       s,
		MaxLen:       MaxMessageLength,
		Length:       ingress.RuneLen,
		ChatInterval: ChatInterval,
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}
