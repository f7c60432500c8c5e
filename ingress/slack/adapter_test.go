package slack_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/ingress/platformtest"
	"github.com/agentfleet/agentfleet/ingress/slack"
	"github.com/agentfleet/agentfleet/ingress/slack/slackfake"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

func TestMain(m *testing.M) { natstest.VerifyNoLeaks(m, 10*time.Second) }

const (
	waitTimeout = 30 * time.Second
	secret      = "8f742231b10e8888abcd99yyyzzz85a5"
)

type bundle struct {
	*platformtest.Env
	t       *testing.T
	api     *slackfake.Server
	adapter *slack.Adapter
	hook    *httptest.Server
}

func setup(t *testing.T, requireMention bool) *bundle {
	t.Helper()
	env := platformtest.New(t)
	api := slackfake.New(t)
	a, err := slack.New(env.Pub, slack.Config{SigningSecret: secret, BotToken: slackfake.BotToken, APIBase: api.APIBase(), RequireMention: requireMention})
	if err != nil {
		t.Fatal(err)
	}
	h, err := a.Handler()
	if err != nil {
		t.Fatal(err)
	}
	hook := httptest.NewServer(h)
	t.Cleanup(hook.Close)
	return &bundle{Env: env, t: t, api: api, adapter: a, hook: hook}
}

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// post sends body with headers h (nil: signed now with the right secret).
func (b *bundle) post(body []byte, h http.Header) (int, string) {
	b.t.Helper()
	if h == nil {
		h = slackfake.Sign(secret, time.Now(), body)
	}
	req, _ := http.NewRequest(http.MethodPost, b.hook.URL+"/webhooks/slack", bytes.NewReader(body))
	req.Header = h
	resp, err := b.hook.Client().Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// TestToMessageRecorded converts recorded Events API payloads: DMs (im),
// channel messages with and without a mention, app_mention events in and
// out of threads, multi-person DMs; edits, joins and the app's own echo
// are ignored.
func TestToMessageRecorded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		file     string
		mention  bool // require_mention
		skip     string
		chatType string
		chatID   string
		threadID string
		text     string
		key      string
	}{
		{file: "message_im.json", mention: true, chatType: "dm", chatID: "D0PNCRP9N", text: "hello agent", key: "agent:main:slack:dm:D0PNCRP9N"},
		{file: "message_channel_no_mention.json", mention: true, skip: "channel message without a mention of the app"},
		{file: "message_channel_no_mention.json", mention: false, chatType: "channel", chatID: "C0LAN2Q65", text: "lunch anyone?",
			key: "agent:main:slack:channel:C0LAN2Q65:U061F7AUR"},
		{file: "message_channel_mention.json", mention: true, chatType: "channel", chatID: "C0LAN2Q65", text: "what is the deploy status?",
			key: "agent:main:slack:channel:C0LAN2Q65:U061F7AUR"},
		{file: "app_mention.json", mention: true, chatType: "channel", chatID: "C0LAN2Q65", text: "what is the deploy status?",
			key: "agent:main:slack:channel:C0LAN2Q65:U061F7AUR"},
		{file: "app_mention_thread.json", mention: true, chatType: "channel", chatID: "C0LAN2Q65", threadID: "1763900020.000400",
			text: "and the rollback?", key: "agent:main:slack:channel:C0LAN2Q65:1763900020.000400"},
		{file: "message_mpim.json", mention: true, chatType: "group", chatID: "G0AKFJBEU", text: "summarize",
			key: "agent:main:slack:group:G0AKFJBEU:U0G9QF9C6"},
		{file: "message_changed.json", mention: true, skip: "message subtype message_changed"},
		{file: "channel_join.json", mention: false, skip: "message subtype channel_join"},
		{file: "bot_echo.json", mention: false, skip: "sent by a bot"},
	} {
		t.Run(fmt.Sprintf("%s/%v", tc.file, tc.mention), func(t *testing.T) {
			t.Parallel()
			ev, err := slack.ParseEvent(readFile(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			m, err := slack.ToMessage(ev, "", tc.mention)
			if tc.skip != "" {
				var skip *slack.Skip
				if !errors.As(err, &skip) || skip.Reason != tc.skip {
					t.Fatalf("ToMessage = %+v, %v; want skipped (%s)", m, err, tc.skip)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			src := m.Source
			if src.ChatType != tc.chatType || src.ChatID != tc.chatID || src.ThreadID != tc.threadID || m.Text != tc.text ||
				src.GuildID != "T061EG9R6" || src.Platform != session.PlatformSlack {
				t.Errorf("ToMessage = %+v", m)
			}
			if want := "slack:" + src.ChatID + ":" + src.MessageID; m.DedupID != want {
				t.Errorf("DedupID %q, want %q", m.DedupID, want)
			}
			if key := session.BuildSessionKey(src, session.DefaultKeyOptions()); key != tc.key {
				t.Errorf("key %q, want %q", key, tc.key)
			}
		})
	}
}

// TestSignature: a good v0 signature is accepted and published; a missing,
// wrong, or stale (over 5 minutes, either way) one gets 401 and publishes
// nothing; a body changed after signing too.
func TestSignature(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	body := readFile(t, "message_im.json")
	now := time.Now()
	tampered := slackfake.Sign(secret, now, body)
	cases := map[string]http.Header{
		"missing":      {"Content-Type": {"application/json"}},
		"wrong secret": slackfake.Sign("another-secret", now, body),
		"stale":        slackfake.Sign(secret, now.Add(-6*time.Minute), body),
		"future":       slackfake.Sign(secret, now.Add(6*time.Minute), body),
		"no timestamp": func() http.Header {
			h := slackfake.Sign(secret, now, body)
			h.Del("X-Slack-Request-Timestamp")
			return h
		}(),
	}
	for name, h := range cases {
		if status, resp := b.post(body, h); status != http.StatusUnauthorized {
			t.Errorf("%s: %d %s, want 401", name, status, resp)
		}
	}
	// Signed over other bytes.
	if status, _ := b.post(append(bytes.TrimSpace(body), ' '), tampered); status != http.StatusUnauthorized {
		t.Errorf("tampered body: %d, want 401", status)
	}
	if n := len(b.Inbox()); n != 0 {
		t.Fatalf("refused requests published %d messages", n)
	}
	// Within the window (4 minutes old) and right.
	if status, resp := b.post(body, slackfake.Sign(secret, now.Add(-4*time.Minute), body)); status != http.StatusOK {
		t.Fatalf("good signature: %d %s", status, resp)
	}
	in := b.Inbox()
	if len(in) != 1 || in[0].Text != "hello agent" || in[0].PlatformMsgID != "slack:D0PNCRP9N:1763900000.000200" {
		t.Fatalf("inbox %+v", in)
	}
}

// TestURLVerification answers Slack's challenge (only when signed).
func TestURLVerification(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	body := readFile(t, "url_verification.json")
	status, resp := b.post(body, nil)
	if status != http.StatusOK || resp != "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P" {
		t.Fatalf("%d %q", status, resp)
	}
	if status, _ := b.post(body, slackfake.Sign("x", time.Now(), body)); status != http.StatusUnauthorized {
		t.Fatalf("unsigned challenge: %d", status)
	}
}

// TestRetryIsOneTurn: Slack's retries (X-Slack-Retry-Num, same event_id)
// and the message + app_mention pair of one mention are one inbox message.
func TestRetryIsOneTurn(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	body := readFile(t, "app_mention.json")
	for i := range 3 {
		h := slackfake.Sign(secret, time.Now(), body)
		if i > 0 {
			h.Set("X-Slack-Retry-Num", fmt.Sprint(i))
			h.Set("X-Slack-Retry-Reason", "http_timeout")
		}
		if status, resp := b.post(body, h); status != http.StatusOK {
			t.Fatalf("attempt %d: %d %s", i, status, resp)
		}
	}
	if status, resp := b.post(readFile(t, "message_channel_mention.json"), nil); status != http.StatusOK || !strings.Contains(resp, `"duplicate":true`) {
		t.Fatalf("the message event of the same mention: %d %s", status, resp)
	}
	if in := b.Inbox(); len(in) != 1 || in[0].Text != "what is the deploy status?" {
		t.Fatalf("inbox %+v, want one message", in)
	}
	// Ignored events are 200 and publish nothing.
	for _, f := range []string{"message_changed.json", "bot_echo.json", "message_channel_no_mention.json", "channel_join.json"} {
		if status, resp := b.post(readFile(t, f), nil); status != http.StatusOK || !strings.Contains(resp, "ignored") {
			t.Errorf("%s: %d %s", f, status, resp)
		}
	}
	if n := len(b.Inbox()); n != 1 {
		t.Fatalf("ignored events published: %d messages", n)
	}
	// Malformed JSON, signed, is 400.
	if status, _ := b.post([]byte(`{"type":"event_callback","event":`), nil); status != http.StatusBadRequest {
		t.Errorf("malformed: %d", status)
	}
}

// FuzzParseEvent: no body makes the parser or the conversion panic, and
// what ToMessage accepts is a usable message.
func FuzzParseEvent(f *testing.F) {
	entries, _ := os.ReadDir("testdata")
	for _, e := range entries {
		if data, err := os.ReadFile(filepath.Join("testdata", e.Name())); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(`{"type":"event_callback","event":{"type":"message","subtype":"message_changed","message":null}}`))
	f.Add([]byte(`{"type":"event_callback","event":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := slack.ParseEvent(data)
		if err != nil {
			return
		}
		for _, mention := range []bool{true, false} {
			m, err := slack.ToMessage(ev, "U0BOT00001", mention)
			if err != nil {
				continue
			}
			if strings.TrimSpace(m.Text) == "" && len(m.Attachments) == 0 || m.DedupID == "" || !session.ValidChatType(m.Source.ChatType) {
				t.Fatalf("accepted an unusable message: %+v", m)
			}
			// What the mapping produces passes the media bounds (given a URL
			// the adapter would add), so a real message is never refused
			// for its files' metadata.
			atts := append([]session.Attachment(nil), m.Attachments...)
			for i := range atts {
				if atts[i].FileID == "" || atts[i].URL != "" {
					t.Fatalf("attachment %+v", atts[i])
				}
				atts[i].FileID = "F1" // platform ids are checked by Publish
			}
			if err := session.ValidateMedia(atts, nil); err != nil && len(atts) <= session.MaxAttachments {
				t.Fatalf("mapped attachments are invalid: %v", err)
			}
		}
	})
}

func (b *bundle) publishReply(id, channel, thread, text string) {
	b.PublishReply(session.PlatformSlack, id, channel, thread, text)
}

func (b *bundle) startDelivery(mod func(*ingress.PlatformDeliveryConfig)) {
	b.StartDelivery(slack.DeliveryConfig(b.adapter.Sender()), mod)
}

func (b *bundle) waitPosted(n int) []slackfake.Posted {
	b.t.Helper()
	var got []slackfake.Posted
	natstest.WaitFor(b.t, waitTimeout, fmt.Sprintf("%d posted", n), func() error {
		if got = b.api.Posted(); len(got) < n {
			return fmt.Errorf("%d posted", len(got))
		}
		return nil
	})
	return got
}

// TestDelivery: long replies split at 4000 characters in order, in their
// thread; a 429 waits its Retry-After; a 5xx is retried with the duplicate
// label; channel_not_found is given up with a failure event at once.
func TestDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	b.api.FailNext(slackfake.Failure{Status: http.StatusTooManyRequests, RetryAfter: 1})
	b.startDelivery(nil)
	long := strings.Repeat("lorem ipsum dolor sit amet ", 400) // 10800 characters
	b.publishReply("s1:1", "C1", "1763900020.000400", long)
	posted := b.waitPosted(3)
	var joined strings.Builder
	for _, p := range posted {
		if n := len([]rune(p.Text)); n > slack.MaxMessageLength {
			t.Errorf("a message of %d characters", n)
		}
		if p.Channel != "C1" || p.ThreadTS != "1763900020.000400" {
			t.Errorf("posted to %s/%s", p.Channel, p.ThreadTS)
		}
		joined.WriteString(p.Text)
	}
	if strings.Join(strings.Fields(joined.String()), " ") != strings.TrimSpace(long) {
		t.Error("the chunks do not make the reply, in order")
	}
	att := b.api.Attempts()
	if gap := att[1].At.Sub(att[0].At); gap < time.Second {
		t.Errorf("retried %s after a 429 with Retry-After 1", gap)
	}

	b.api.FailNext(slackfake.Failure{Status: http.StatusInternalServerError})
	b.publishReply("s1:2", "C1", "", "after a 500")
	posted = b.waitPosted(4)
	if posted[3].Text != ingress.DuplicateLabel+"after a 500" {
		t.Errorf("retry after a 5xx: %q", posted[3].Text)
	}

	b.api.FailNext(slackfake.Failure{Error: "channel_not_found"})
	b.publishReply("s1:3", "C404", "", "nowhere")
	b.publishReply("s1:4", "C1", "", "still delivered")
	posted = b.waitPosted(5)
	if posted[4].Text != "still delivered" {
		t.Errorf("posted %+v", posted[4])
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	raw, err := b.Res.Events.GetLastMsgForSubject(ctx, b.Names.DeliveryFailedWildcard())
	if err != nil {
		t.Fatalf("no delivery_failed event: %v", err)
	}
	var f ingress.DeliveryFailure
	if err := json.Unmarshal(raw.Data, &f); err != nil || f.ReplyID != "s1:3" || !strings.Contains(f.Error, "channel_not_found") || f.Attempts != 1 {
		t.Fatalf("failure %+v (%v)", f, err)
	}
}

// TestSocketMode receives events over a Socket Mode WebSocket (the fake's),
// publishes each and acknowledges it only then; an envelope delivered again
// (retry_attempt 1, after the connection that had it closed) is one
// message; a handler for webhooks needs the signing secret, Socket Mode
// does not.
func TestSocketMode(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	a, err := slack.New(b.Pub, slack.Config{BotToken: slackfake.BotToken, APIBase: b.api.APIBase(), RequireMention: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Handler(); !errors.Is(err, ingress.ErrInvalidConfig) {
		t.Fatalf("Handler without a signing secret: %v", err)
	}
	run := func() (context.CancelFunc, chan error) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.SocketMode(ctx, slackfake.AppToken) }()
		return cancel, done
	}
	cancel, done := run()
	b.api.AddSocketEvent(readFile(t, "message_im.json"))
	b.api.AddSocketEvent(readFile(t, "app_mention.json"))
	b.api.AddSocketEvent(readFile(t, "bot_echo.json"))
	natstest.WaitFor(t, waitTimeout, "3 envelopes acknowledged", func() error {
		if acked, _ := b.api.SocketAcks(); acked != 3 {
			return fmt.Errorf("%d acknowledged", acked)
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("SocketMode returned %v after its context ended", err)
	}
	if in := b.Inbox(); len(in) != 2 || in[0].Text != "hello agent" || in[1].Text != "what is the deploy status?" {
		t.Fatalf("inbox %+v", in)
	}
	// The same event again (Slack's redelivery) on a new connection.
	cancel, done = run()
	defer func() { cancel(); <-done }()
	b.api.AddSocketEvent(readFile(t, "message_im.json"))
	natstest.WaitFor(t, waitTimeout, "the redelivery acknowledged", func() error {
		if acked, _ := b.api.SocketAcks(); acked != 4 {
			return fmt.Errorf("%d acknowledged", acked)
		}
		return nil
	})
	if in := b.Inbox(); len(in) != 2 {
		t.Fatalf("a redelivered event made %d inbox messages", len(in))
	}
	if n := b.api.SocketConnections(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
	if err := a.SocketMode(context.Background(), ""); !errors.Is(err, ingress.ErrInvalidConfig) {
		t.Errorf("SocketMode without an app token: %v", err)
	}
}
