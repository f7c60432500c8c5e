package telegram_test

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
	"github.com/agentfleet/agentfleet/ingress/telegram"
	"github.com/agentfleet/agentfleet/ingress/telegram/telegramtest"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

func TestMain(m *testing.M) { natstest.VerifyNoLeaks(m, 10*time.Second) }

const (
	waitTimeout = 30 * time.Second
	secret      = "s3cret-Token_42"
)

type bundle struct {
	*platformtest.Env
	t       *testing.T
	api     *telegramtest.Server
	adapter *telegram.Adapter
	hook    *httptest.Server
}

func setup(t *testing.T) *bundle {
	t.Helper()
	env := platformtest.New(t)
	api := telegramtest.New(t)
	a, err := telegram.New(env.Pub, telegram.Config{Token: telegramtest.Token, WebhookSecret: secret, APIBase: api.URL, PollTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	h, err := a.WebhookHandler()
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

// post sends body to the webhook with the given secret header ("" = none).
func (b *bundle) post(body []byte, secretHeader string) (int, string) {
	b.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, b.hook.URL+"/webhooks/telegram", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if secretHeader != "" {
		req.Header.Set(telegram.HeaderSecret, secretHeader)
	}
	resp, err := b.hook.Client().Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// TestToMessageRecorded converts recorded Bot API updates of every chat
// kind: private chats, groups (a command addressed to this bot, one to
// another bot), forum topics as threads, supergroup reply chains (not
// threads), channel posts, captions, a sticker (an attachment without
// text); edited messages and bot messages are ignored.
func TestToMessageRecorded(t *testing.T) {
	t.Parallel()
	bot := telegram.Bot{ID: 777, Username: telegramtest.BotUsername}
	for _, tc := range []struct {
		file     string
		skip     string
		chatType string
		chatID   string
		threadID string
		userID   string
		text     string
		topic    string
		replyTo  string
		key      string
	}{
		{file: "private_text.json", chatType: "dm", chatID: "123456789", userID: "123456789", text: "hello agent",
			key: "agent:main:telegram:dm:123456789"},
		{file: "group_command_bot.json", chatType: "group", chatID: "-4012345678", userID: "123456789", text: "/new@fleetbot",
			key: "agent:main:telegram:group:-4012345678:123456789"},
		{file: "group_command_other_bot.json", skip: "command for @otherbot"},
		{file: "forum_topic.json", chatType: "group", chatID: "-1001987654321", threadID: "400", userID: "987654321",
			text: "status of the deploy?", topic: "Deploys", key: "agent:main:telegram:group:-1001987654321:400"},
		{file: "supergroup_reply.json", chatType: "group", chatID: "-1001122334455", userID: "987654321", text: "agreed",
			replyTo: "900", key: "agent:main:telegram:group:-1001122334455:987654321"},
		{file: "channel_post.json", chatType: "channel", chatID: "-1005556667778", userID: "-1005556667778", text: "summarize this week",
			key: "agent:main:telegram:channel:-1005556667778:-1005556667778"},
		{file: "photo_caption.json", chatType: "dm", chatID: "123456789", userID: "123456789", text: "what is in this picture?",
			key: "agent:main:telegram:dm:123456789"},
		{file: "edited_message.json", skip: "edited message"},
		{file: "from_bot.json", skip: "sent by a bot"},
		{file: "sticker.json", chatType: "dm", chatID: "123456789", userID: "123456789", key: "agent:main:telegram:dm:123456789"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			u, err := telegram.ParseUpdate(readFile(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			m, err := telegram.ToMessage(u, bot)
			var skip *telegram.Skip
			if tc.skip != "" {
				if !errors.As(err, &skip) || skip.Reason != tc.skip {
					t.Fatalf("ToMessage = %+v, %v; want skipped (%s)", m, err, tc.skip)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			src := m.Source
			if src.Platform != session.PlatformTelegram || src.ChatType != tc.chatType || src.ChatID != tc.chatID ||
				src.ThreadID != tc.threadID || src.UserID != tc.userID || src.ChatTopic != tc.topic || m.Text != tc.text || m.ReplyTo != tc.replyTo {
				t.Errorf("ToMessage = %+v", m)
			}
			if want := "telegram:" + src.ChatID + ":" + src.MessageID; m.DedupID != want {
				t.Errorf("DedupID = %q, want %q", m.DedupID, want)
			}
			if key := session.BuildSessionKey(src, session.DefaultKeyOptions()); key != tc.key {
				t.Errorf("session key = %q, want %q", key, tc.key)
			}
		})
	}
}

// TestWebhookSecret: the right secret is accepted and published once; a
// missing or wrong one gets 401 and publishes nothing; a handler without a
// secret cannot be made.
func TestWebhookSecret(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := readFile(t, "private_text.json")
	for _, bad := range []string{"", "wrong", secret + "x", strings.ToUpper(secret)} {
		if status, resp := b.post(body, bad); status != http.StatusUnauthorized {
			t.Errorf("secret %q: %d %s, want 401", bad, status, resp)
		}
	}
	if n := len(b.Inbox()); n != 0 {
		t.Fatalf("refused requests published %d messages", n)
	}
	if status, resp := b.post(body, secret); status != http.StatusOK || !strings.Contains(resp, `"ok":true`) {
		t.Fatalf("good secret: %d %s", status, resp)
	}
	in := b.Inbox()
	if len(in) != 1 || in[0].Text != "hello agent" || in[0].SessionKey != "agent:main:telegram:dm:123456789" ||
		in[0].PlatformMsgID != "telegram:123456789:1021" {
		t.Fatalf("inbox = %+v", in)
	}

	a, err := telegram.New(b.Pub, telegram.Config{Token: telegramtest.Token, APIBase: b.api.URL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.WebhookHandler(); err == nil || !errors.Is(err, ingress.ErrInvalidConfig) {
		t.Fatalf("WebhookHandler without a secret: %v, want ErrInvalidConfig", err)
	}
}

// TestWebhookRetryIsOneMessage: Telegram redelivering the same update (a
// retry after a lost answer) gives one inbox message; the retry is
// answered 200 as a duplicate.
func TestWebhookRetryIsOneMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := readFile(t, "forum_topic.json")
	var answers []string
	for range 3 {
		status, resp := b.post(body, secret)
		if status != http.StatusOK {
			t.Fatalf("%d %s", status, resp)
		}
		answers = append(answers, resp)
	}
	if !strings.Contains(answers[1], `"duplicate":true`) || !strings.Contains(answers[2], `"duplicate":true`) {
		t.Errorf("retries not reported as duplicates: %q", answers)
	}
	if in := b.Inbox(); len(in) != 1 || in[0].Source.ThreadID != "400" {
		t.Fatalf("inbox = %+v, want one message in thread 400", in)
	}
	// Ignored updates are answered 200 and publish nothing.
	for _, f := range []string{"edited_message.json", "from_bot.json", "group_command_other_bot.json"} {
		if status, resp := b.post(readFile(t, f), secret); status != http.StatusOK || !strings.Contains(resp, "ignored") {
			t.Errorf("%s: %d %s", f, status, resp)
		}
	}
	// The command addressed to this bot is a fleet command.
	if status, resp := b.post(readFile(t, "group_command_bot.json"), secret); status != http.StatusOK {
		t.Fatalf("%d %s", status, resp)
	}
	in := b.Inbox()
	if len(in) != 2 || in[1].Kind != session.KindCommand || in[1].Command != "new" {
		t.Fatalf("inbox = %+v, want the /new@fleetbot command last", in)
	}
}

// TestWebhookBadInput: malformed JSON is 400, an oversized body 413, a text
// longer than Telegram allows 413, a GET 405; none publishes anything.
func TestWebhookBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	long := fmt.Sprintf(`{"update_id":5,"message":{"message_id":1,"from":{"id":1,"is_bot":false,"first_name":"A"},"chat":{"id":1,"type":"private"},"date":1,"text":%q}}`, strings.Repeat("x", 5000))
	for _, tc := range []struct {
		body   string
		status int
	}{
		{`{"update_id":`, http.StatusBadRequest},
		{`[1,2]`, http.StatusBadRequest},
		{`{}`, http.StatusBadRequest},
		{`{"update_id":6,"message":{"message_id":1,"chat":{"id":1,"type":"private"},"text":"hi/../x","from":{"id":1}}}`, http.StatusOK},
		{long, http.StatusRequestEntityTooLarge},
		{strings.Repeat(" ", 2<<20), http.StatusRequestEntityTooLarge},
	} {
		status, resp := b.post([]byte(tc.body), secret)
		if status != tc.status {
			t.Errorf("body %.40q: %d %s, want %d", tc.body, status, resp, tc.status)
		}
	}
	resp, err := b.hook.Client().Get(b.hook.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d", resp.StatusCode)
	}
	if in := b.Inbox(); len(in) != 1 || in[0].Text != "hi/../x" {
		t.Fatalf("inbox = %+v, want only the valid message", in)
	}
}

// FuzzParseUpdate: no input makes the parser or the conversion panic, and
// whatever ToMessage accepts is a valid source with a text and a dedup id.
func FuzzParseUpdate(f *testing.F) {
	entries, _ := os.ReadDir("testdata")
	for _, e := range entries {
		if data, err := os.ReadFile(filepath.Join("testdata", e.Name())); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(`{"update_id":1,"message":{"message_id":1,"chat":{"id":-1,"type":"supergroup"},"is_topic_message":true,"message_thread_id":-5,"text":"/x@"}}`))
	f.Add([]byte(`{"update_id":1,"channel_post":{"message_id":1,"chat":{"id":1,"type":"channel"},"caption":"\u0000"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		u, err := telegram.ParseUpdate(data)
		if err != nil {
			return
		}
		m, err := telegram.ToMessage(u, telegram.Bot{ID: 777, Username: "fleetbot"})
		if err != nil {
			return
		}
		if strings.TrimSpace(m.Text) == "" && len(m.Attachments) == 0 || m.DedupID == "" || m.Source.Platform != session.PlatformTelegram {
			t.Fatalf("accepted an unusable message: %+v", m)
		}
		for _, a := range m.Attachments {
			if a.FileID == "" || a.URL != "" || a.Size < 0 {
				t.Fatalf("attachment %+v", a)
			}
			if err := (session.Attachment{Kind: a.Kind, FileID: "x"}).Validate(); err != nil {
				t.Fatalf("attachment kind: %v", err)
			}
		}
		if m.Quote != nil && (m.Quote.MessageID == "" || m.Quote.MessageID != m.ReplyTo) {
			t.Fatalf("quote %+v, reply_to %q", m.Quote, m.ReplyTo)
		}
		if !session.ValidChatType(m.Source.ChatType) {
			t.Fatalf("chat type %q", m.Source.ChatType)
		}
	})
}

func (b *bundle) publishReply(id, chat, thread, text string) {
	b.PublishReply(session.PlatformTelegram, id, chat, thread, text)
}

func (b *bundle) startDelivery(mod func(*ingress.PlatformDeliveryConfig)) {
	b.StartDelivery(telegram.DeliveryConfig(b.adapter.Sender()), mod)
}

func (b *bundle) waitSent(n int) []telegramtest.Sent {
	b.t.Helper()
	var sent []telegramtest.Sent
	natstest.WaitFor(b.t, waitTimeout, fmt.Sprintf("%d messages sent", n), func() error {
		sent = b.api.Sent()
		if len(sent) < n {
			return fmt.Errorf("%d sent", len(sent))
		}
		return nil
	})
	return sent
}

// TestDeliverySplitsInOrder: a reply longer than 4096 UTF-16 units is sent
// as several messages, in order, each within the limit, code blocks closed
// and reopened; replies of one chat keep their order; forum topics get
// their message_thread_id.
func TestDeliverySplitsInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startDelivery(nil)
	var long strings.Builder
	long.WriteString("Here is the code:\n```go\n")
	for i := range 400 {
		fmt.Fprintf(&long, "fmt.Println(%d) // 🚀 line\n", i)
	}
	long.WriteString("```\nDone.")
	b.publishReply("s1:1", "123", "", long.String())
	b.publishReply("s1:2", "123", "", "second reply")
	b.publishReply("s1:3", "-100200", "42", "in the topic")
	sent := b.waitSent(3)
	var parts []string
	i := 0
	for ; i < len(sent) && sent[i].Text != "second reply"; i++ {
		if n := ingress.UTF16Len(sent[i].Text); n > telegram.MaxMessageLength {
			t.Errorf("chunk %d is %d units long", i, n)
		}
		if strings.Count(sent[i].Text, "```")%2 != 0 {
			t.Errorf("chunk %d leaves a code block open: ...%q", i, sent[i].Text[max(0, len(sent[i].Text)-40):])
		}
		parts = append(parts, sent[i].Text)
	}
	if len(parts) < 2 {
		t.Fatalf("the long reply was sent as %d message(s)", len(parts))
	}
	joined := strings.Join(parts, "\n")
	for n := range 400 {
		if !strings.Contains(joined, fmt.Sprintf("fmt.Println(%d) //", n)) {
			t.Fatalf("line %d of the reply is missing", n)
		}
	}
	if strings.Index(joined, "fmt.Println(399)") < strings.Index(joined, "fmt.Println(398)") {
		t.Error("chunks out of order")
	}
	sent = b.waitSent(len(parts) + 2)
	if sent[len(parts)].Text != "second reply" || sent[len(parts)+1].Text != "in the topic" || sent[len(parts)+1].ThreadID != 42 {
		t.Errorf("later replies: %+v", sent[len(parts):])
	}
}

// TestDelivery429 honours flood control: after a 429 with retry_after 1 the
// retry comes at least a second later, and the message is sent once.
func TestDelivery429(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.api.FailNext(telegramtest.Failure{Status: http.StatusTooManyRequests, RetryAfter: 1})
	b.startDelivery(nil)
	b.publishReply("s2:1", "5", "", "hello after the flood")
	sent := b.waitSent(1)
	att := b.api.Attempts()
	if len(att) != 2 || len(sent) != 1 || sent[0].Text != "hello after the flood" {
		t.Fatalf("attempts %+v, sent %+v", att, sent)
	}
	if gap := att[1].At.Sub(att[0].At); gap < time.Second {
		t.Errorf("retried %s after a 429 with retry_after 1", gap)
	}
}

// TestDeliveryAmbiguous: a 5xx and a send that times out after Telegram
// posted it are retried with the "may be a duplicate" label.
func TestDeliveryAmbiguous(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.api.FailNext(telegramtest.Failure{Status: http.StatusBadGateway}, telegramtest.Failure{Hang: 3 * time.Second})
	b.startDelivery(func(c *ingress.PlatformDeliveryConfig) { c.SendTimeout = 500 * time.Millisecond })
	b.publishReply("s3:1", "9", "", "are you there?")
	sent := b.waitSent(2)
	// The hung send was posted (its answer was lost), then the labelled retry.
	if sent[0].Text != "[may be a duplicate] are you there?" || sent[1].Text != "[may be a duplicate] are you there?" {
		t.Fatalf("sent %+v", sent)
	}
	if att := b.api.Attempts(); len(att) != 3 || att[0].Text != "are you there?" {
		t.Fatalf("attempts %+v: want the first unlabelled, then two labelled", att)
	}
}

// TestDeliveryBudget: a reply that keeps failing is given up after the
// attempt budget with a delivery_failed event, and later replies still go
// out; a permanent refusal (400) is given up at once.
func TestDeliveryBudget(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.api.FailNext(telegramtest.Failure{Status: 500}, telegramtest.Failure{Status: 500}, telegramtest.Failure{Status: 500},
		telegramtest.Failure{Status: 400, Description: "Bad Request: chat not found"})
	b.startDelivery(func(c *ingress.PlatformDeliveryConfig) { c.MaxAttempts = 3 })
	b.publishReply("s4:1", "11", "", "doomed")
	b.publishReply("s4:2", "12", "", "no such chat")
	b.publishReply("s4:3", "11", "", "this one arrives")
	sent := b.waitSent(1)
	if sent[0].Text != "this one arrives" {
		t.Fatalf("sent %+v", sent)
	}
	var fails []ingress.DeliveryFailure
	natstest.WaitFor(t, waitTimeout, "two failure events", func() error {
		fails = b.Failures()
		if len(fails) < 2 {
			return fmt.Errorf("%d events", len(fails))
		}
		return nil
	})
	if fails[0].ReplyID != "s4:1" || fails[0].Attempts != 3 || !strings.Contains(fails[0].Error, "500") ||
		fails[1].ReplyID != "s4:2" || fails[1].Attempts != 1 || !strings.Contains(fails[1].Error, "chat not found") {
		t.Fatalf("failures %+v", fails)
	}
	if fails[0].Platform != session.PlatformTelegram || fails[0].ChatID != "11" || fails[0].SessionKey == "" {
		t.Errorf("failure %+v", fails[0])
	}
}

// TestPollerSingleton: two pollers compete for one bot; only the lease
// holder polls; when it stops, the other takes over; every update is
// published exactly once, none lost.
func TestPollerSingleton(t *testing.T) {
	t.Parallel()
	b := setup(t)
	type poller struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	start := func(owner string) poller {
		s, err := ingress.NewSingleton(b.JS, b.Res, ingress.SingletonConfig{Names: b.Names, Kind: "telegram_poll",
			ID: ingress.TokenID(telegramtest.Token), Owner: owner, TTL: 2 * time.Second, Retry: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		p := poller{cancel: cancel, done: make(chan struct{})}
		go func() { defer close(p.done); _ = s.Run(ctx, b.adapter.Poll) }()
		t.Cleanup(func() { cancel(); <-p.done })
		return p
	}
	holder := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		e, err := b.Res.Leases.Get(ctx, b.Names.SingletonLeaseKey("telegram_poll", ingress.TokenID(telegramtest.Token)))
		if err != nil {
			return ""
		}
		var v struct{ Owner string }
		_ = json.Unmarshal(e.Value(), &v)
		return v.Owner
	}
	pa, pb := start("A"), start("B")
	add := func(i int) {
		b.api.AddUpdate(fmt.Sprintf(`{"message":{"message_id":%d,"from":{"id":5,"is_bot":false,"first_name":"U"},"chat":{"id":5,"type":"private"},"date":1,"text":"m%d"}}`, i, i))
	}
	for i := 1; i <= 5; i++ {
		add(i)
	}
	natstest.WaitFor(t, waitTimeout, "5 updates published", func() error {
		if n := len(b.Inbox()); n != 5 {
			return fmt.Errorf("%d", n)
		}
		return nil
	})
	first := holder()
	if first != "A" && first != "B" {
		t.Fatalf("holder %q", first)
	}
	// Stop the holder; the other takes over and gets what comes next.
	if first == "A" {
		pa.cancel()
		<-pa.done
	} else {
		pb.cancel()
		<-pb.done
	}
	for i := 6; i <= 10; i++ {
		add(i)
	}
	natstest.WaitFor(t, waitTimeout, "10 updates published", func() error {
		if n := len(b.Inbox()); n != 10 {
			return fmt.Errorf("%d", n)
		}
		return nil
	})
	if h := holder(); h == first || h == "" {
		t.Errorf("holder after the stop = %q (was %q)", h, first)
	}
	for i, in := range b.Inbox() {
		if in.Text != fmt.Sprintf("m%d", i+1) {
			t.Errorf("inbox[%d] = %q", i, in.Text)
		}
	}
	if !b.api.WebhookDeleted() {
		t.Error("the poller did not delete the webhook first")
	}
}
