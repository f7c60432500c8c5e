// Package discord is the Discord adapter of agentfleet: the Gateway
// connection that receives messages (one per bot token across the fleet,
// run under an ingress.Singleton, resumed by the next holder), the
// interactions endpoint at POST /webhooks/discord (Ed25519-signed slash
// commands, answered with a deferred response whose follow-up is the
// reply), and the Sender through which an ingress.PlatformDelivery posts
// replies.
//
// It uses github.com/disgoorg/disgo for its REST client (channel messages,
// interaction follow-ups, channel lookups) at a configurable URL, its
// Ed25519 request verification and its types; the Gateway client is the
// adapter's own (see Adapter.Gateway for why).
package discord

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/disgoorg/disgo/discord"
	"github.com/disgoorg/disgo/rest"
	"github.com/disgoorg/snowflake/v2"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
)

// Defaults and limits.
const (
	// DefaultAPIBase is Discord's REST API, with its version.
	DefaultAPIBase = "https://discord.com/api/v10"
	// DefaultGatewayURL is Discord's Gateway.
	DefaultGatewayURL   = "wss://gateway.discord.gg"
	DefaultMaxBodyBytes = 1 << 20
	// MaxMessageLength is a bot message's limit in characters: longer
	// replies are split.
	MaxMessageLength = 2000
	// ChatInterval paces messages to one channel (Discord allows about 5
	// messages per 5 seconds per channel).
	ChatInterval = time.Second
	// InteractionTTL is how long an interaction token takes follow-ups.
	InteractionTTL = 15 * time.Minute
)

// Config configures the adapter.
type Config struct {
	// Token is the bot token. Required for the gateway and the Sender.
	Token string
	// PublicKey is the application's Ed25519 public key (hex), to verify
	// interactions. Required for InteractionsHandler.
	PublicKey string
	// ApplicationID is the application's id; when set, interactions of
	// another application are refused.
	ApplicationID string
	// APIBase is the REST API base URL with version. Defaults to
	// DefaultAPIBase.
	APIBase string
	// GatewayURL is the Gateway's URL. Defaults to DefaultGatewayURL.
	GatewayURL string
	// RequireMention makes guild messages (threads included) count only
	// when they mention the bot; DMs never need one.
	RequireMention bool
	// MaxBodyBytes caps an interaction body. Defaults to 1 MiB.
	MaxBodyBytes int64
	// HTTPClient makes REST calls. Defaults to a client with a 30 s
	// timeout.
	HTTPClient *http.Client
	// Logger receives structured logs. Defaults to a discard logger.
	Logger *slog.Logger
}

// Adapter turns Discord messages and interactions into inbox messages and
// sends replies.
type Adapter struct {
	cfg   Config
	pub   *ingress.Publisher
	res   *broker.Resources
	names broker.Names
	rest  rest.Rest
	log   *slog.Logger
	pkey  []byte
	botID snowflake.ID

	mu       sync.Mutex
	channels map[snowflake.ID]Channel
}

// New returns the adapter publishing through pub; res holds the delivered
// bucket (interaction tokens, the gateway's resume state).
func New(pub *ingress.Publisher, res *broker.Resources, cfg Config) (*Adapter, error) {
	if pub == nil || res == nil || res.Delivered == nil {
		return nil, fmt.Errorf("%w: discord: needs a Publisher and a provisioned Delivered bucket", ingress.ErrInvalidConfig)
	}
	if cfg.APIBase == "" {
		cfg.APIBase = DefaultAPIBase
	}
	cfg.APIBase = strings.TrimRight(cfg.APIBase, "/")
	if cfg.GatewayURL == "" {
		cfg.GatewayURL = DefaultGatewayURL
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
	a := &Adapter{cfg: cfg, pub: pub, res: res, names: pub.Names(), log: cfg.Logger.With(slog.String("platform", "discord")),
		botID: BotIDFromToken(cfg.Token), channels: map[snowflake.ID]Channel{}}
	if cfg.PublicKey != "" {
		k, err := hex.DecodeString(cfg.PublicKey)
		if err != nil || len(k) != 32 {
			return nil, fmt.Errorf("%w: discord: public_key must be 64 hex digits (the application's Ed25519 key)", ingress.ErrInvalidConfig)
		}
		a.pkey = k
	}
	// 429s come back to the delivery (the no-op limiter retries nothing),
	// which waits as told and keeps the replies of a lane in order; the
	// default limiter would also start a goroutine that never ends.
	a.rest = rest.New(rest.NewClient(cfg.Token, rest.WithURL(cfg.APIBase), rest.WithHTTPClient(cfg.HTTPClient),
		rest.WithLogger(cfg.Logger), rest.WithRateLimiter(rest.NewNoopRateLimiter())))
	return a, nil
}

// BotIDFromToken returns the bot's user id, which a bot token carries
// base64-encoded before its first '.', or 0.
func BotIDFromToken(token string) snowflake.ID {
	head, _, ok := strings.Cut(token, ".")
	if !ok {
		return 0
	}
	raw, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(head, "="))
	if err != nil {
		return 0
	}
	id, err := snowflake.Parse(string(raw))
	if err != nil {
		return 0
	}
	return id
}

// channel returns what is known of a guild channel, asking the REST API
// once per channel: whether it is a thread, and of which channel.
func (a *Adapter) channel(ctx context.Context, id snowflake.ID) (Channel, error) {
	a.mu.Lock()
	ch, ok := a.channels[id]
	a.mu.Unlock()
	if ok {
		return ch, nil
	}
	c, err := a.rest.GetChannel(id, rest.WithCtx(ctx))
	if err != nil {
		return Channel{}, err
	}
	ch = Channel{Name: c.Name()}
	if t, ok := c.(discord.GuildThread); ok && t.ParentID() != nil {
		ch.ParentID = *t.ParentID()
	}
	a.mu.Lock()
	if len(a.channels) > 10000 {
		clear(a.channels)
	}
	a.channels[id] = ch
	a.mu.Unlock()
	return ch, nil
}

// interactionRecord is a deferred interaction awaiting its reply.
type interactionRecord struct {
	ApplicationID string    `json:"application_id"`
	Token         string    `json:"token"`
	Expires       time.Time `json:"expires"`
}

// InteractionKey is the key, in the delivered bucket, of the deferred
// interaction of a lane.
func InteractionKey(sessionKey string) string {
	return string(session.PlatformDiscord) + "._interaction." + session.LaneToken(sessionKey)
}

// Sender returns the ingress.Sender that posts replies: as the follow-up
// of a lane's deferred slash command while its token is valid, else as a
// message in the channel (or thread).
func (a *Adapter) Sender() ingress.Sender { return sender{a} }

type sender struct{ a *Adapter }

func (s sender) Send(ctx context.Context, t ingress.Target, text string) error {
	a := s.a
	create := discord.MessageCreate{Content: text, AllowedMentions: &discord.AllowedMentions{}}
	if rec, ok := a.interaction(ctx, t.SessionKey); ok {
		app, err := snowflake.Parse(rec.ApplicationID)
		if err == nil {
			_, err = a.rest.CreateFollowupMessage(app, rec.Token, create, rest.WithCtx(ctx))
			if err == nil {
				return nil
			}
			var re rest.Error
			// An expired or unknown token (404, 401): post in the channel.
			if !errors.As(err, &re) || re.Response == nil || (re.Response.StatusCode != http.StatusNotFound && re.Response.StatusCode != http.StatusUnauthorized) {
				return sendError(err)
			}
		}
	}
	chat := t.ChatID
	if t.ThreadID != "" {
		chat = t.ThreadID // a thread is a channel of its own
	}
	id, err := snowflake.Parse(chat)
	if err != nil {
		return &ingress.SendError{Permanent: true, Err: fmt.Errorf("chat id %q is not a Discord channel id", chat)}
	}
	if _, err := a.rest.CreateMessage(id, create, rest.WithCtx(ctx)); err != nil {
		return sendError(err)
	}
	return nil
}

func (a *Adapter) interaction(ctx context.Context, sessionKey string) (interactionRecord, bool) {
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	e, err := a.res.Delivered.Get(gctx, InteractionKey(sessionKey))
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			a.log.LogAttrs(ctx, slog.LevelWarn, "cannot read the deferred interaction; posting in the channel", slog.Any("error", err))
		}
		return interactionRecord{}, false
	}
	var r interactionRecord
	if json.Unmarshal(e.Value(), &r) != nil || time.Now().After(r.Expires) {
		return interactionRecord{}, false
	}
	return r, true
}

// sendError classifies a failed REST call.
func sendError(err error) error {
	var re rest.Error
	if errors.As(err, &re) && re.Response != nil {
		code := re.Response.StatusCode
		switch {
		case code == http.StatusTooManyRequests:
			return &ingress.SendError{RetryAfter: retryAfter(re), Err: err}
		case code >= 500:
			return &ingress.SendError{Ambiguous: true, Err: err}
		}
		// 400, 403 Missing Access, 404 Unknown Channel...
		return &ingress.SendError{Permanent: true, Err: err}
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return &ingress.SendError{Err: err}
	}
	return &ingress.SendError{Ambiguous: true, Err: err}
}

// retryAfter reads a 429's wait: the body's retry_after (seconds, with
// fractions), else the Retry-After header, at least a second.
func retryAfter(re rest.Error) time.Duration {
	var body struct {
		RetryAfter float64 `json:"retry_after"`
	}
	d := time.Second
	if json.Unmarshal(re.RsBody, &body) == nil && body.RetryAfter > 0 {
		d = time.Duration(body.RetryAfter * float64(time.Second))
	} else if s, err := strconv.ParseFloat(re.Response.Header.Get("Retry-After"), 64); err == nil && s > 0 {
		d = time.Duration(s * float64(time.Second))
	}
	return max(d, time.Second)
}

// DeliveryConfig returns the platform delivery settings of Discord.
func DeliveryConfig(s ingress.Sender) ingress.PlatformDeliveryConfig {
	return ingress.PlatformDeliveryConfig{
		Platform:     session.PlatformDiscord,
		Sender:       s,
		MaxLen:       MaxMessageLength,
		Length:       ingress.RuneLen,
		ChatInterval: ChatInterval,
	}
}
