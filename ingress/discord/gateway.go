package discord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/disgoorg/disgo/rest"
	"github.com/disgoorg/snowflake/v2"
	"github.com/gorilla/websocket"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/ingress"
)

// Gateway intents the connection asks for: guilds (channels and threads),
// guild messages, direct messages, and message content (a privileged
// intent to turn on in the Developer Portal).
const (
	intentGuilds         = 1 << 0
	intentGuildMessages  = 1 << 9
	intentDirectMessages = 1 << 12
	intentMessageContent = 1 << 15
	// Intents is the sum the IDENTIFY sends.
	Intents = intentGuilds | intentGuildMessages | intentDirectMessages | intentMessageContent
)

// Gateway opcodes.
const (
	opDispatch       = 0
	opHeartbeat      = 1
	opIdentify       = 2
	opResume         = 6
	opReconnect      = 7
	opInvalidSession = 9
	opHello          = 10
	opHeartbeatACK   = 11
)

// gatewayVersion is the Gateway (and REST) API version spoken.
const gatewayVersion = "10"

// gatewayState is the gateway session as far as it was handled: what the
// next connection, in this process or the next holder's, needs to RESUME.
type gatewayState struct {
	SessionID string `json:"session_id"`
	ResumeURL string `json:"resume_url,omitempty"`
	// Seq is the sequence number of the last event handled (a message
	// published); a resume replays what came after it.
	Seq   int64  `json:"seq"`
	BotID string `json:"bot_id,omitempty"`
}

// GatewayStateKey is the key, in the delivered bucket, of the gateway
// session of a bot token.
func GatewayStateKey(token string) string {
	return "discord._gateway." + ingress.TokenID(token)
}

// errFatal marks a close code after which reconnecting cannot help.
var errFatal = errors.New("discord gateway refused the bot")

// fatalCloseCodes are the close codes Discord documents as not to be
// reconnected after.
var fatalCloseCodes = map[int]string{
	4004: "authentication failed (wrong token)",
	4010: "invalid shard",
	4011: "sharding required",
	4012: "invalid API version",
	4013: "invalid intents",
	4014: "disallowed intents (turn on the message content intent in the Developer Portal)",
}

// Gateway holds the Gateway connection until ctx ends; run it under an
// ingress.Singleton (kind "discord_gateway", id TokenID(token)) so that one
// process per bot holds it fleet-wide.
//
// The protocol is the documented one: HELLO, IDENTIFY (or RESUME), READY,
// heartbeats every heartbeat_interval with their ACKs (a missing ACK
// closes a zombie connection), dispatches, RECONNECT and INVALID_SESSION,
// close codes. Each MESSAGE_CREATE is published before its sequence number
// is recorded in the delivered bucket with the session id and resume URL.
// Any connection after the first, in this process or in the next holder
// of the role, RESUMEs that session from the recorded number: Discord
// replays what was not published yet (the messages sent while nobody was
// connected included), and those published already come again as
// duplicates of the same ids and are dropped. When ctx ends the
// connection is closed with a code that keeps the session resumable.
//
// The client is written on gorilla/websocket: discordgo cannot resume a
// session another process opened (its session id and sequence cannot be
// set), and disgo's gateway (v0.18) has a data race between its heartbeat
// and its close.
func (a *Adapter) Gateway(ctx context.Context) error {
	if a.cfg.Token == "" {
		return fmt.Errorf("%w: discord gateway: token is empty", ingress.ErrInvalidConfig)
	}
	g := &gatewayRun{a: a, log: a.log.With(slog.String("mode", "gateway")), key: GatewayStateKey(a.cfg.Token), botID: a.botID}
	if err := g.load(ctx); err != nil {
		return nil // ctx ended
	}
	backoff := time.Second
	for ctx.Err() == nil {
		ready, err := g.connect(ctx)
		if ctx.Err() != nil {
			break
		}
		if errors.Is(err, errFatal) {
			// Reconnecting would be refused again (and Discord limits
			// IDENTIFYs): hold the role idle until the process stops.
			g.log.LogAttrs(ctx, slog.LevelError, "gateway connection refused for good; not reconnecting", slog.Any("error", err))
			<-ctx.Done()
			return err
		}
		if ready {
			backoff = time.Second
		}
		// Discord asks for 1 to 5 s before a new IDENTIFY after an invalid
		// session; the same jitter spreads reconnects.
		wait := backoff + rand.N(backoff)
		g.log.LogAttrs(ctx, slog.LevelWarn, "gateway connection lost; reconnecting", slog.Any("error", err), slog.Duration("retry_in", wait))
		if !sleep(ctx, wait) {
			break
		}
		backoff = min(2*backoff, 30*time.Second)
	}
	g.log.LogAttrs(context.WithoutCancel(ctx), slog.LevelInfo, "gateway stopped")
	return nil
}

type gatewayRun struct {
	a     *Adapter
	log   *slog.Logger
	key   string
	state gatewayState
	botID snowflake.ID
}

func (g *gatewayRun) load(ctx context.Context) error {
	for {
		gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		e, err := g.a.res.Delivered.Get(gctx, g.key)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			return nil
		case err == nil:
			if json.Unmarshal(e.Value(), &g.state) != nil {
				g.state = gatewayState{}
			}
			if id, err := snowflake.Parse(g.state.BotID); err == nil && g.botID == 0 {
				g.botID = id
			}
			return nil
		}
		g.log.LogAttrs(ctx, slog.LevelWarn, "cannot read the gateway session; retrying", slog.Any("error", err))
		if !sleep(ctx, time.Second) {
			return ctx.Err()
		}
	}
}

// save records the state; a failure only means a resume replays more.
func (g *gatewayRun) save(ctx context.Context) {
	data, _ := json.Marshal(g.state)
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := g.a.res.Delivered.Put(pctx, g.key, data); err != nil {
		g.log.LogAttrs(ctx, slog.LevelWarn, "gateway session not recorded", slog.Any("error", err))
	}
}

type payload struct {
	Op int             `json:"op"`
	D  json.RawMessage `json:"d,omitempty"`
	S  *int64          `json:"s,omitempty"`
	T  string          `json:"t,omitempty"`
}

// conn is one websocket connection; writes are serialized.
type conn struct {
	ws *websocket.Conn
	mu sync.Mutex
}

func (c *conn) send(op int, d any) error {
	data, err := json.Marshal(d)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.ws.SetWriteDeadline(time.Now().Add(10 * time.Second))
	return c.ws.WriteJSON(payload{Op: op, D: data})
}

func (c *conn) close(code int, text string) {
	c.mu.Lock()
	_ = c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), time.Now().Add(time.Second))
	c.mu.Unlock()
	_ = c.ws.Close()
}

// connect runs one connection until it fails or ctx ends; ready reports
// whether it got as far as READY or RESUMED.
func (g *gatewayRun) connect(ctx context.Context) (ready bool, err error) {
	resume := g.state.SessionID != "" && g.state.Seq > 0
	url := g.a.cfg.GatewayURL
	if resume && g.state.ResumeURL != "" {
		url = g.state.ResumeURL
	}
	url = strings.TrimRight(url, "/") + "?v=" + gatewayVersion + "&encoding=json"
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	ws, _, err := websocket.DefaultDialer.DialContext(dctx, url, nil)
	cancel()
	if err != nil {
		return false, fmt.Errorf("dial: %w", err)
	}
	ws.SetReadLimit(16 << 20)
	c := &conn{ws: ws}
	var closed atomic.Bool
	stop := context.AfterFunc(ctx, func() {
		// Not 1000/1001: those end the session; the next holder resumes it.
		closed.Store(true)
		c.close(websocket.CloseServiceRestart, "handing over")
	})
	defer func() {
		if stop() {
			c.close(websocket.CloseServiceRestart, "reconnecting")
		}
	}()

	var hello struct {
		HeartbeatInterval int64 `json:"heartbeat_interval"`
	}
	_ = ws.SetReadDeadline(time.Now().Add(30 * time.Second))
	var p payload
	if err := ws.ReadJSON(&p); err != nil {
		return false, fmt.Errorf("waiting for HELLO: %w", err)
	}
	if p.Op != opHello || json.Unmarshal(p.D, &hello) != nil || hello.HeartbeatInterval <= 0 {
		return false, fmt.Errorf("expected HELLO, got op %d", p.Op)
	}
	interval := time.Duration(hello.HeartbeatInterval) * time.Millisecond

	var lastSeq atomic.Int64 // last sequence received, for heartbeats
	lastSeq.Store(g.state.Seq)
	var acked atomic.Bool
	acked.Store(true)
	hbCtx, hbCancel := context.WithCancel(ctx)
	var hb sync.WaitGroup
	defer func() { hbCancel(); hb.Wait() }()
	hb.Go(func() { g.heartbeat(hbCtx, c, interval, &lastSeq, &acked) })

	if resume {
		err = c.send(opResume, map[string]any{"token": g.a.cfg.Token, "session_id": g.state.SessionID, "seq": g.state.Seq})
	} else {
		err = g.identify(c)
	}
	if err != nil {
		return false, err
	}
	for {
		// A connection without even a heartbeat ACK for two intervals is
		// dead; the heartbeat closes a zombie before that.
		_ = ws.SetReadDeadline(time.Now().Add(2*interval + 10*time.Second))
		var p payload
		if err := ws.ReadJSON(&p); err != nil {
			if closed.Load() || ctx.Err() != nil {
				return ready, ctx.Err()
			}
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				if why, ok := fatalCloseCodes[ce.Code]; ok {
					return ready, fmt.Errorf("%w: close %d: %s", errFatal, ce.Code, why)
				}
				if ce.Code == 4007 || ce.Code == 4009 { // invalid seq, session timed out
					g.state = gatewayState{BotID: g.state.BotID}
				}
			}
			return ready, err
		}
		switch p.Op {
		case opDispatch:
			if p.S != nil {
				lastSeq.Store(*p.S)
			}
			if ok := g.dispatch(ctx, p); !ok {
				return ready, ctx.Err()
			}
			if p.T == "READY" || p.T == "RESUMED" {
				ready = true
			}
		case opHeartbeat:
			if err := c.send(opHeartbeat, lastSeq.Load()); err != nil {
				return ready, err
			}
		case opHeartbeatACK:
			acked.Store(true)
		case opReconnect:
			return ready, errors.New("discord asked for a reconnect")
		case opInvalidSession:
			var resumable bool
			_ = json.Unmarshal(p.D, &resumable)
			if !resumable {
				g.log.LogAttrs(ctx, slog.LevelWarn, "gateway session invalid; identifying anew (events since the last one handled are lost)",
					slog.String("session_id", g.state.SessionID))
				g.state = gatewayState{BotID: g.state.BotID}
				g.save(ctx)
			}
			return ready, errors.New("invalid session")
		}
	}
}

func (g *gatewayRun) identify(c *conn) error {
	return c.send(opIdentify, map[string]any{
		"token":   g.a.cfg.Token,
		"intents": Intents,
		"properties": map[string]string{
			"os":      runtime.GOOS,
			"browser": "agentfleet",
			"device":  "agentfleet",
		},
	})
}

// heartbeat sends a heartbeat every interval (the first after a random
// part of it, as documented); one not ACKed by the next closes the
// connection, so the read loop resumes.
func (g *gatewayRun) heartbeat(ctx context.Context, c *conn, interval time.Duration, seq *atomic.Int64, acked *atomic.Bool) {
	wait := time.Duration(rand.Int64N(int64(interval)))
	for {
		if !sleep(ctx, wait) {
			return
		}
		wait = interval
		if !acked.Swap(false) {
			g.log.LogAttrs(ctx, slog.LevelWarn, "no heartbeat ACK; closing the zombie connection")
			_ = c.ws.Close()
			return
		}
		var d any
		if s := seq.Load(); s > 0 {
			d = s
		}
		if err := c.send(opHeartbeat, d); err != nil {
			return
		}
	}
}

// dispatch handles one event in order; false when the role ended before a
// message was stored (the next holder replays it).
func (g *gatewayRun) dispatch(ctx context.Context, p payload) bool {
	switch p.T {
	case "READY":
		var r struct {
			SessionID string `json:"session_id"`
			ResumeURL string `json:"resume_gateway_url"`
			User      struct {
				ID snowflake.ID `json:"id"`
			} `json:"user"`
		}
		if json.Unmarshal(p.D, &r) != nil || p.S == nil {
			return true
		}
		g.state = gatewayState{SessionID: r.SessionID, ResumeURL: r.ResumeURL, Seq: *p.S, BotID: r.User.ID.String()}
		if g.botID == 0 {
			g.botID = r.User.ID
		}
		g.log.LogAttrs(ctx, slog.LevelInfo, "gateway session ready", slog.String("bot_id", r.User.ID.String()))
		g.save(ctx)
	case "RESUMED":
		g.log.LogAttrs(ctx, slog.LevelInfo, "gateway session resumed", slog.Int64("from_seq", g.state.Seq))
	case "MESSAGE_CREATE":
		if !g.message(ctx, p.D) {
			return false
		}
		if p.S != nil && *p.S > g.state.Seq {
			g.state.Seq = *p.S
			g.save(ctx)
		}
	}
	return true
}

// message publishes one message, retrying while the inbox cannot store it;
// false when ctx ended first.
func (g *gatewayRun) message(ctx context.Context, data []byte) bool {
	backoff := 100 * time.Millisecond
	for {
		err := g.publish(ctx, data)
		var skip *Skip
		switch {
		case err == nil, errors.As(err, &skip):
			return true
		case !errors.Is(err, ingress.ErrUnavailable):
			g.log.LogAttrs(ctx, slog.LevelWarn, "message refused", slog.Any("error", err))
			return true
		}
		g.log.LogAttrs(ctx, slog.LevelWarn, "message not stored; retrying", slog.Any("error", err))
		if !sleep(ctx, backoff) {
			return false
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

func (g *gatewayRun) publish(ctx context.Context, data []byte) error {
	m, err := ParseMessage(data)
	if err != nil {
		return fmt.Errorf("%w: %w", ingress.ErrRejected, err)
	}
	var ch Channel
	if m.GuildID != nil && !m.Author.Bot && m.WebhookID == nil {
		c, err := g.a.channel(ctx, m.ChannelID)
		switch {
		case err == nil:
			ch = c
		case refused(err):
			// Discord will not say (403, 404): take it for a channel of
			// its own rather than hold up every later message.
			g.log.LogAttrs(ctx, slog.LevelWarn, "channel lookup refused; taking it for a plain channel",
				slog.String("channel_id", m.ChannelID.String()), slog.Any("error", err))
		default:
			// Without it a thread could land in the wrong lane: retry.
			return fmt.Errorf("%w: channel %s: %w", ingress.ErrUnavailable, m.ChannelID, err)
		}
	}
	msg, err := ToMessage(m, ch, g.botID, g.a.cfg.RequireMention)
	if err != nil {
		return err
	}
	res, err := g.a.pub.Publish(context.WithoutCancel(ctx), msg)
	if err != nil {
		return err
	}
	g.log.LogAttrs(ctx, slog.LevelDebug, "message accepted", slog.String("message_id", m.ID.String()),
		slog.String("session_key", res.SessionKey), slog.Uint64("seq", res.Seq), slog.Bool("duplicate", res.Duplicate))
	return nil
}

// refused reports whether a REST call failed for good (a 4xx but 429).
func refused(err error) bool {
	var re rest.Error
	if !errors.As(err, &re) || re.Response == nil {
		return false
	}
	code := re.Response.StatusCode
	return code >= 400 && code < 500 && code != http.StatusTooManyRequests
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
