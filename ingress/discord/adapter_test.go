package discord_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/disgoorg/snowflake/v2"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/ingress/discord"
	"github.com/agentfleet/agentfleet/ingress/discord/discordtest"
	"github.com/agentfleet/agentfleet/ingress/platformtest"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

func TestMain(m *testing.M) { natstest.VerifyNoLeaks(m, 10*time.Second) }

const (
	waitTimeout = 30 * time.Second
	appID       = "1100000000000000099"
	dmChannel   = "1200000000000000010"
	guildChan   = "1200000000000000020"
	threadChan  = "1200000000000000030"
	ada         = "1000000000000000042"
)

type bundle struct {
	*platformtest.Env
	t       *testing.T
	api     *discordtest.Server
	adapter *discord.Adapter
	hook    *httptest.Server
	priv    ed25519.PrivateKey
}

func setup(t *testing.T) *bundle {
	t.Helper()
	pubKey, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{Env: platformtest.New(t), t: t, api: discordtest.New(t), priv: priv}
	b.api.AddChannel(guildChan, `{"id":"1200000000000000020","type":0,"guild_id":"1300000000000000001","name":"ops","position":1,"permission_overwrites":[],"nsfw":false,"parent_id":null}`)
	b.api.AddChannel(threadChan, `{"id":"1200000000000000030","type":11,"guild_id":"1300000000000000001","name":"deploy-42","parent_id":"1200000000000000020","owner_id":"1000000000000000042","thread_metadata":{"archived":false,"auto_archive_duration":1440,"archive_timestamp":"2026-11-20T10:19:00.000000+00:00","locked":false},"message_count":3,"member_count":2}`)
	b.adapter = b.newAdapter(hex.EncodeToString(pubKey))
	h, err := b.adapter.InteractionsHandler()
	if err != nil {
		t.Fatal(err)
	}
	b.hook = httptest.NewServer(h)
	t.Cleanup(b.hook.Close)
	return b
}

func (b *bundle) newAdapter(publicKey string) *discord.Adapter {
	a, err := discord.New(b.Pub, b.Res, discord.Config{Token: discordtest.Token, PublicKey: publicKey, ApplicationID: appID,
		APIBase: b.api.APIBase(), GatewayURL: b.api.GatewayURL(), RequireMention: true})
	if err != nil {
		b.t.Fatal(err)
	}
	return a
}

func readFile(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// post sends an interaction signed with key (nil: unsigned) at ts.
func (b *bundle) post(body []byte, key ed25519.PrivateKey, ts string) (int, string) {
	b.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, b.hook.URL+"/webhooks/discord", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != nil {
		req.Header.Set("X-Signature-Ed25519", hex.EncodeToString(ed25519.Sign(key, append([]byte(ts), body...))))
		req.Header.Set("X-Signature-Timestamp", ts)
	}
	resp, err := b.hook.Client().Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

func now() string { return strconv.FormatInt(time.Now().Unix(), 10) }

// TestToMessageRecorded converts recorded MESSAGE_CREATE payloads: a DM, a
// guild message mentioning the bot (mention removed), a thread (its own
// lane, under its parent channel), a reply; a guild message without a
// mention and the bot's own message are ignored. Ids stay raw.
func TestToMessageRecorded(t *testing.T) {
	t.Parallel()
	bot := snowflake.MustParse(discordtest.BotID)
	thread := discord.Channel{ParentID: snowflake.MustParse(guildChan), Name: "deploy-42"}
	for _, tc := range []struct {
		file, skip, chatType, chatID, threadID, text, replyTo, key string
		ch                                                         discord.Channel
	}{
		{file: "message_dm.json", chatType: "dm", chatID: dmChannel, text: "hello agent", key: "agent:main:discord:dm:" + dmChannel},
		{file: "message_guild_mention.json", chatType: "channel", chatID: guildChan, text: "what changed in the last deploy?",
			key: "agent:main:discord:channel:" + guildChan + ":" + ada, ch: discord.Channel{Name: "ops"}},
		{file: "message_thread.json", chatType: "channel", chatID: guildChan, threadID: threadChan, text: "and the rollback plan?",
			key: "agent:main:discord:channel:" + guildChan + ":" + threadChan, ch: thread},
		{file: "message_reply.json", chatType: "dm", chatID: dmChannel, text: "shorter please", replyTo: "1308742770000000001",
			key: "agent:main:discord:dm:" + dmChannel},
		{file: "message_guild_no_mention.json", skip: "guild message without a mention of the bot"},
		{file: "message_bot.json", skip: "sent by a bot"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			m, err := discord.ParseMessage(readFile(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			out, err := discord.ToMessage(m, tc.ch, bot, true)
			var skip *discord.Skip
			if tc.skip != "" {
				if !errors.As(err, &skip) || skip.Reason != tc.skip {
					t.Fatalf("ToMessage = %+v, %v; want skipped (%s)", out, err, tc.skip)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			src := out.Source
			if src.Platform != session.PlatformDiscord || src.ChatType != tc.chatType || src.ChatID != tc.chatID || src.ThreadID != tc.threadID ||
				src.UserID != ada || out.Text != tc.text || out.ReplyTo != tc.replyTo {
				t.Errorf("ToMessage = %+v", out)
			}
			if key := session.BuildSessionKey(src, session.DefaultKeyOptions()); key != tc.key {
				t.Errorf("session key = %q, want %q", key, tc.key)
			}
			if want := "discord:" + m.ChannelID.String() + ":" + m.ID.String(); out.DedupID != want {
				t.Errorf("DedupID = %q", out.DedupID)
			}
			if tc.replyTo != "" && (out.Quote == nil || out.Quote.Text != "Here is the summary you asked for." || out.Quote.SenderID != discordtest.BotID) {
				t.Errorf("quote = %+v", out.Quote)
			}
		})
	}
}

// TestInteractionSignature: PING signed with the application's key gets
// PONG; a missing, wrong, other-key or tampered signature gets 401 and
// publishes nothing; a handler without a key cannot be made.
func TestInteractionSignature(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ping := readFile(t, "interaction_ping.json")
	if status, resp := b.post(ping, b.priv, now()); status != http.StatusOK || strings.TrimSpace(resp) != `{"type":1}` {
		t.Fatalf("PING: %d %s", status, resp)
	}
	_, other, _ := ed25519.GenerateKey(nil)
	cmd := readFile(t, "interaction_new_dm.json")
	if status, resp := b.post(cmd, nil, ""); status != http.StatusUnauthorized {
		t.Errorf("unsigned: %d %s", status, resp)
	}
	if status, resp := b.post(cmd, other, now()); status != http.StatusUnauthorized {
		t.Errorf("other key: %d %s", status, resp)
	}
	// Signed for one timestamp, sent with another.
	req, _ := http.NewRequest(http.MethodPost, b.hook.URL, bytes.NewReader(cmd))
	req.Header.Set("X-Signature-Ed25519", hex.EncodeToString(ed25519.Sign(b.priv, append([]byte("1700000000"), cmd...))))
	req.Header.Set("X-Signature-Timestamp", "1700000001")
	resp, err := b.hook.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("tampered timestamp: %d", resp.StatusCode)
	}
	if n := len(b.Inbox()); n != 0 {
		t.Fatalf("refused interactions published %d messages", n)
	}
	a, err := discord.New(b.Pub, b.Res, discord.Config{Token: discordtest.Token})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.InteractionsHandler(); !errors.Is(err, ingress.ErrInvalidConfig) {
		t.Fatalf("handler without a key: %v", err)
	}
	if _, err := discord.New(b.Pub, b.Res, discord.Config{PublicKey: "abcd"}); !errors.Is(err, ingress.ErrInvalidConfig) {
		t.Fatalf("short key: %v", err)
	}
}

// TestSlashCommandDeferred: /new in a DM is published once as the fleet
// command and answered with a deferred response; its reply is delivered
// as the interaction's follow-up; /queue in a thread lands in the thread's
// lane with its option as text.
func TestSlashCommandDeferred(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cmd := readFile(t, "interaction_new_dm.json")
	for range 2 {
		if status, resp := b.post(cmd, b.priv, now()); status != http.StatusOK || strings.TrimSpace(resp) != `{"type":5}` {
			t.Fatalf("/new: %d %s", status, resp)
		}
	}
	if status, resp := b.post(readFile(t, "interaction_queue_thread.json"), b.priv, now()); status != http.StatusOK || !strings.Contains(resp, `"type":5`) {
		t.Fatalf("/queue: %d %s", status, resp)
	}
	in := b.Inbox()
	if len(in) != 2 || in[0].Kind != session.KindCommand || in[0].Command != "new" || in[0].SessionKey != "agent:main:discord:dm:"+dmChannel {
		t.Fatalf("inbox = %+v", in)
	}
	if in[1].Kind != session.KindQueue || in[1].Text != "check the canary after this" ||
		in[1].SessionKey != "agent:main:discord:channel:"+guildChan+":"+threadChan {
		t.Fatalf("queued = %+v", in[1])
	}
	b.StartDelivery(discord.DeliveryConfig(b.adapter.Sender()), nil)
	b.PublishReply(session.PlatformDiscord, "d1:1", dmChannel, "", "Started a new session.")
	sent := b.waitSent(1)
	if sent[0].FollowupToken != "aW50ZXJhY3Rpb246MTMwODc1MDAwMDAwMDAwMDAwMjpuZXc" || sent[0].Content != "Started a new session." {
		t.Fatalf("sent %+v, want the follow-up of the interaction", sent)
	}
}

func (b *bundle) waitSent(n int) []discordtest.Sent {
	b.t.Helper()
	var sent []discordtest.Sent
	natstest.WaitFor(b.t, waitTimeout, fmt.Sprintf("%d messages sent", n), func() error {
		sent = b.api.Sent()
		if len(sent) < n {
			return fmt.Errorf("%d sent", len(sent))
		}
		return nil
	})
	return sent
}

// TestDeliverySplitsInOrder: a reply longer than 2000 characters goes out
// as several channel messages in order, each within the limit; a thread
// reply goes to the thread.
func TestDeliverySplitsInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.StartDelivery(discord.DeliveryConfig(b.adapter.Sender()), nil)
	var long strings.Builder
	for i := range 300 {
		fmt.Fprintf(&long, "step %d: check <@%s> 🚀\n", i, ada)
	}
	b.PublishReply(session.PlatformDiscord, "d2:1", dmChannel, "", long.String())
	b.PublishReply(session.PlatformDiscord, "d2:2", guildChan, threadChan, "in the thread")
	var sent []discordtest.Sent
	natstest.WaitFor(t, waitTimeout, "the thread reply", func() error {
		sent = b.api.Sent()
		if len(sent) == 0 || sent[len(sent)-1].Content != "in the thread" {
			return fmt.Errorf("%d sent", len(sent))
		}
		return nil
	})
	parts := sent[:len(sent)-1]
	if len(parts) < 3 || sent[len(sent)-1].ChannelID != threadChan {
		t.Fatalf("sent %d parts, last to %q", len(parts), sent[len(sent)-1].ChannelID)
	}
	var joined strings.Builder
	for i, p := range parts {
		if n := len([]rune(p.Content)); n > discord.MaxMessageLength || p.ChannelID != dmChannel {
			t.Errorf("chunk %d: %d characters to %q", i, n, p.ChannelID)
		}
		joined.WriteString(p.Content + "\n")
	}
	last := -1
	for i := range 300 {
		at := strings.Index(joined.String(), fmt.Sprintf("step %d:", i))
		if at < last {
			t.Fatalf("step %d missing or out of order", i)
		}
		last = at
	}
}

// TestDelivery429And5xx: a 429 waits its retry_after and the message is
// posted once; a 5xx is retried with the duplicate label.
func TestDelivery429And5xx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.api.FailNext(discordtest.Failure{Status: http.StatusTooManyRequests, RetryAfter: 1.2}, discordtest.Failure{Status: http.StatusBadGateway})
	b.StartDelivery(discord.DeliveryConfig(b.adapter.Sender()), nil)
	b.PublishReply(session.PlatformDiscord, "d3:1", dmChannel, "", "after the flood")
	sent := b.waitSent(1)
	att := b.api.Attempts()
	if len(att) != 3 || sent[0].Content != ingress.DuplicateLabel+"after the flood" || att[0].Content != "after the flood" {
		t.Fatalf("attempts %+v sent %+v", att, sent)
	}
	if gap := att[1].At.Sub(att[0].At); gap < 1200*time.Millisecond {
		t.Errorf("retried %s after retry_after 1.2", gap)
	}
}

// TestDeliveryBudget: a reply that keeps failing is given up after the
// budget with a delivery_failed event; a 403 (Missing Access) at once;
// later replies still go out.
func TestDeliveryBudget(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.api.FailNext(discordtest.Failure{Status: 500}, discordtest.Failure{Status: 500}, discordtest.Failure{Status: 500},
		discordtest.Failure{Status: 403, Code: 50001, Message: "Missing Access"})
	b.StartDelivery(discord.DeliveryConfig(b.adapter.Sender()), func(c *ingress.PlatformDeliveryConfig) { c.MaxAttempts = 3 })
	b.PublishReply(session.PlatformDiscord, "d4:1", dmChannel, "", "doomed")
	b.PublishReply(session.PlatformDiscord, "d4:2", guildChan, "", "no access")
	b.PublishReply(session.PlatformDiscord, "d4:3", dmChannel, "", "this one arrives")
	if sent := b.waitSent(1); sent[0].Content != "this one arrives" {
		t.Fatalf("sent %+v", sent)
	}
	var fails []ingress.DeliveryFailure
	natstest.WaitFor(t, waitTimeout, "two failures", func() error {
		if fails = b.Failures(); len(fails) < 2 {
			return fmt.Errorf("%d", len(fails))
		}
		return nil
	})
	if fails[0].ReplyID != "d4:1" || fails[0].Attempts != 3 || !strings.Contains(fails[0].Error, "500") ||
		fails[1].ReplyID != "d4:2" || fails[1].Attempts != 1 || !strings.Contains(fails[1].Error, "Missing Access") ||
		fails[0].Platform != session.PlatformDiscord {
		t.Fatalf("failures %+v", fails)
	}
}

// gatewayHolder runs the gateway under a singleton until stopped.
type gatewayHolder struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (b *bundle) startGateway(owner string) *gatewayHolder {
	b.t.Helper()
	a := b.newAdapter("")
	s, err := ingress.NewSingleton(b.JS, b.Res, ingress.SingletonConfig{Names: b.Names, Kind: "discord_gateway",
		ID: ingress.TokenID(discordtest.Token), Owner: owner, TTL: 2 * time.Second, Retry: 200 * time.Millisecond})
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &gatewayHolder{cancel: cancel, done: make(chan struct{})}
	go func() { defer close(h.done); _ = s.Run(ctx, a.Gateway) }()
	b.t.Cleanup(h.stop)
	return h
}

func (h *gatewayHolder) stop() { h.cancel(); <-h.done }

func (b *bundle) holder() string {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	e, err := b.Res.Leases.Get(ctx, b.Names.SingletonLeaseKey("discord_gateway", ingress.TokenID(discordtest.Token)))
	if err != nil {
		return ""
	}
	var v struct{ Owner string }
	_ = json.Unmarshal(e.Value(), &v)
	return v.Owner
}

func (b *bundle) waitInbox(n int) []session.Inbound {
	b.t.Helper()
	var in []session.Inbound
	natstest.WaitFor(b.t, waitTimeout, fmt.Sprintf("%d inbox messages", n), func() error {
		if in = b.Inbox(); len(in) != n {
			return fmt.Errorf("%d", len(in))
		}
		return nil
	})
	return in
}

func dm(i int) string {
	return fmt.Sprintf(`{"type":0,"id":"14000000000000%05d","channel_id":%q,"content":"m%d","author":{"id":%q,"username":"ada"},"mentions":[],"attachments":[],"embeds":[],"timestamp":"2026-11-20T10:15:02.731000+00:00"}`,
		i, dmChannel, i, ada)
}

// TestGatewayMessages: over the gateway (IDENTIFY with the message content
// intent, READY), DMs, guild mentions and thread messages are published in
// their lanes; guild messages without a mention and bot messages are not.
func TestGatewayMessages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startGateway("A")
	natstest.WaitFor(t, waitTimeout, "connected", func() error {
		if !b.api.Connected() {
			return errors.New("not yet")
		}
		return nil
	})
	for _, f := range []string{"message_dm.json", "message_guild_no_mention.json", "message_bot.json", "message_guild_mention.json", "message_thread.json"} {
		b.api.Dispatch("MESSAGE_CREATE", string(readFile(t, f)))
	}
	// A channel the REST API will not describe (404) is taken for a plain
	// channel; it does not hold up the messages after it.
	b.api.Dispatch("MESSAGE_CREATE", strings.ReplaceAll(string(readFile(t, "message_guild_mention.json")), guildChan, "1200000000000000099"))
	in := b.waitInbox(4)
	if in[0].Text != "hello agent" || in[1].Text != "what changed in the last deploy?" || in[2].Text != "and the rollback plan?" ||
		in[2].SessionKey != "agent:main:discord:channel:"+guildChan+":"+threadChan || in[1].Source.ChatName != "ops" ||
		in[3].SessionKey != "agent:main:discord:channel:1200000000000000099:"+ada {
		t.Fatalf("inbox = %+v", in)
	}
	if n := b.api.Identifies(); n != 1 {
		t.Errorf("%d IDENTIFYs", n)
	}
}

// TestGatewaySingletonTakeover: two ingresses compete for one bot's
// gateway; only the lease holder connects. The holder stops; messages sent
// while nobody is connected wait in the session; the other ingress takes
// the lease and RESUMEs the session from the last published sequence;
// every message is published exactly once, in order, none lost.
func TestGatewaySingletonTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holders := map[string]*gatewayHolder{"A": b.startGateway("A"), "B": b.startGateway("B")}
	natstest.WaitFor(t, waitTimeout, "connected", func() error {
		if !b.api.Connected() {
			return errors.New("not yet")
		}
		return nil
	})
	for i := 1; i <= 5; i++ {
		b.api.Dispatch("MESSAGE_CREATE", dm(i))
	}
	b.waitInbox(5)
	first := b.holder()
	if holders[first] == nil {
		t.Fatalf("holder %q", first)
	}
	holders[first].stop()
	natstest.WaitFor(t, waitTimeout, "disconnected", func() error {
		if b.api.Connected() {
			return errors.New("still connected")
		}
		return nil
	})
	for i := 6; i <= 8; i++ {
		b.api.Dispatch("MESSAGE_CREATE", dm(i)) // nobody connected: kept for the resume
	}
	natstest.WaitFor(t, waitTimeout, "the other ingress connected", func() error {
		if !b.api.Connected() {
			return errors.New("not yet")
		}
		return nil
	})
	for i := 9; i <= 10; i++ {
		b.api.Dispatch("MESSAGE_CREATE", dm(i))
	}
	in := b.waitInbox(10)
	for i, m := range in {
		if m.Text != fmt.Sprintf("m%d", i+1) {
			t.Errorf("inbox[%d] = %q", i, m.Text)
		}
	}
	if h := b.holder(); h == first || h == "" {
		t.Errorf("holder after the stop = %q (was %q)", h, first)
	}
	rs := b.api.Resumes()
	if b.api.Identifies() != 1 || len(rs) != 1 || !rs[0].Known || rs[0].SessionID != "session0001" || rs[0].Seq != 6 {
		t.Fatalf("identifies %d, resumes %+v: want one IDENTIFY, then a RESUME of session0001 from seq 6 (READY + 5 messages)", b.api.Identifies(), rs)
	}
}

// TestGatewayDroppedConnection: a connection that dies under the holder
// is resumed by it; nothing is lost or published twice.
func TestGatewayDroppedConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startGateway("A")
	natstest.WaitFor(t, waitTimeout, "connected", func() error {
		if !b.api.Connected() {
			return errors.New("not yet")
		}
		return nil
	})
	b.api.Dispatch("MESSAGE_CREATE", dm(1))
	b.waitInbox(1)
	b.api.DropConnections()
	b.api.Dispatch("MESSAGE_CREATE", dm(2))
	b.api.Dispatch("MESSAGE_CREATE", dm(3))
	in := b.waitInbox(3)
	if in[1].Text != "m2" || in[2].Text != "m3" {
		t.Fatalf("inbox = %+v", in)
	}
	if len(b.api.Resumes()) == 0 {
		t.Error("the holder did not resume")
	}
}

// TestAttachments: a voice message and an image reach the agent as
// attachments with Discord's CDN URLs; the voice message is its own turn.
func TestAttachments(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		file, kind, mime, name, text string
		size                         int64
	}{
		{"message_voice.json", session.AttachVoice, "audio/ogg", "voice-message.ogg", "", 18412},
		{"message_image.json", session.AttachPhoto, "image/png", "dashboard.png", "what is on this dashboard?", 204800},
	} {
		m, err := discord.ParseMessage(readFile(t, tc.file))
		if err != nil {
			t.Fatal(err)
		}
		out, err := discord.ToMessage(m, discord.Channel{}, snowflake.MustParse(discordtest.BotID), true)
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Attachments) != 1 || out.Text != tc.text {
			t.Fatalf("%s: %+v", tc.file, out)
		}
		a := out.Attachments[0]
		if a.Kind != tc.kind || a.MimeType != tc.mime || a.Name != tc.name || a.Size != tc.size ||
			!strings.HasPrefix(a.URL, "https://cdn.discordapp.com/attachments/") || a.FileID != m.Attachments[0].ID.String() {
			t.Errorf("%s: attachment %+v", tc.file, a)
		}
	}
	b := setup(t)
	b.startGateway("A")
	natstest.WaitFor(t, waitTimeout, "connected", func() error {
		if !b.api.Connected() {
			return errors.New("not yet")
		}
		return nil
	})
	b.api.Dispatch("MESSAGE_CREATE", string(readFile(t, "message_voice.json")))
	in := b.waitInbox(1)
	if in[0].Kind != session.KindQueue || len(in[0].Attachments) != 1 || in[0].Attachments[0].Kind != session.AttachVoice {
		t.Fatalf("inbox = %+v", in)
	}
}

// FuzzParse: no input makes the message or interaction parsers, or the
// conversions, panic; what they accept is a usable message.
func FuzzParse(f *testing.F) {
	entries, _ := os.ReadDir("testdata")
	for _, e := range entries {
		f.Add(readFile(f, e.Name()))
	}
	f.Add([]byte(`{"id":"1","type":2,"channel_id":"2","data":{"name":"x","options":[{"name":"a","type":1,"options":[{"name":"b","type":3,"value":"\u0000"}]}]},"user":{"id":"3"}}`))
	bot := snowflake.MustParse(discordtest.BotID)
	f.Fuzz(func(t *testing.T, data []byte) {
		if m, err := discord.ParseMessage(data); err == nil {
			for _, ch := range []discord.Channel{{}, {ParentID: 5}} {
				out, err := discord.ToMessage(m, ch, bot, false)
				if err == nil && (strings.TrimSpace(out.Text) == "" && len(out.Attachments) == 0 || out.DedupID == "" || !session.ValidChatType(out.Source.ChatType)) {
					t.Fatalf("accepted an unusable message: %+v", out)
				}
			}
		}
		if in, err := discord.ParseInteraction(data); err == nil {
			out, err := discord.CommandMessage(in)
			if err == nil && (!strings.HasPrefix(out.Text, "/") || out.DedupID == "" || out.Source.UserID == "") {
				t.Fatalf("accepted an unusable command: %+v", out)
			}
		}
	})
}

// TestGatewayInvalidSession: a recorded session Discord no longer knows is
// answered INVALID_SESSION; the holder identifies anew and messages flow.
func TestGatewayInvalidSession(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	stale := fmt.Sprintf(`{"session_id":"gone","resume_url":%q,"seq":41}`, b.api.GatewayURL())
	if _, err := b.Res.Delivered.Put(ctx, discord.GatewayStateKey(discordtest.Token), []byte(stale)); err != nil {
		t.Fatal(err)
	}
	b.startGateway("A")
	natstest.WaitFor(t, waitTimeout, "a new session", func() error {
		if !b.api.Connected() {
			return errors.New("not yet")
		}
		return nil
	})
	b.api.Dispatch("MESSAGE_CREATE", dm(1))
	if in := b.waitInbox(1); in[0].Text != "m1" {
		t.Fatalf("inbox = %+v", in)
	}
	rs := b.api.Resumes()
	if len(rs) != 1 || rs[0].Known || rs[0].SessionID != "gone" || rs[0].Seq != 41 || b.api.Identifies() != 1 {
		t.Fatalf("resumes %+v, identifies %d: want the stale RESUME refused, then one IDENTIFY", rs, b.api.Identifies())
	}
	e, err := b.Res.Delivered.Get(ctx, discord.GatewayStateKey(discordtest.Token))
	if err != nil || !strings.Contains(string(e.Value()), `"session_id":"session0001"`) {
		t.Fatalf("recorded state %s, %v", e.Value(), err)
	}
}

// TestGatewayZombie: a connection whose heartbeats go unanswered is closed
// by the client, which resumes the session on a new one.
func TestGatewayZombie(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startGateway("A")
	natstest.WaitFor(t, waitTimeout, "connected", func() error {
		if !b.api.Connected() {
			return errors.New("not yet")
		}
		return nil
	})
	b.api.Dispatch("MESSAGE_CREATE", dm(1))
	b.waitInbox(1)
	b.api.SetHeartbeatACK(false)
	natstest.WaitFor(t, waitTimeout, "a resume after the zombie connection", func() error {
		if len(b.api.Resumes()) == 0 {
			return errors.New("no resume yet")
		}
		return nil
	})
	b.api.SetHeartbeatACK(true)
	b.api.Dispatch("MESSAGE_CREATE", dm(2))
	if in := b.waitInbox(2); in[1].Text != "m2" {
		t.Fatalf("inbox = %+v", in)
	}
	if n := b.api.Identifies(); n != 1 {
		t.Errorf("%d IDENTIFYs, want the session resumed", n)
	}
}
