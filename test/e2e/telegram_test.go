package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/ingress/telegram/telegramtest"
	"github.com/agentfleet/agentfleet/session"
)

// TestTelegramPollerFailover runs two `agentfleet ingress` processes in
// Telegram poll mode against a local Bot API, and a worker. One ingress
// holds the poller lease; it is killed with SIGKILL while updates keep
// coming. The other ingress takes the poller over, and every update is in
// the inbox exactly once and answered: none lost, none handled twice (a
// reply sent again by the delivery after the kill carries the "may be a
// duplicate" label).
func TestTelegramPollerFailover(t *testing.T) {
	c := newCluster(t)
	t.Parallel()
	api := telegramtest.New(t)
	ingresses := c.startIngresses([]string{
		"AGENTFLEET_PLATFORMS_TELEGRAM_TOKEN=" + telegramtest.Token,
		"AGENTFLEET_PLATFORMS_TELEGRAM_MODE=poll",
		"AGENTFLEET_PLATFORMS_TELEGRAM_API_BASE=" + api.URL,
	}, "ingress-a", "ingress-b")
	c.startWorker("w1")

	next := 1
	add := func(n int) {
		for range n {
			// One chat per update: one lane, one turn, one reply each.
			api.AddUpdate(fmt.Sprintf(`{"message":{"message_id":%d,"from":{"id":%d,"is_bot":false,"first_name":"U"},"chat":{"id":%d,"type":"private"},"date":%d,"text":"m%d"}}`,
				next, 1000+next, 1000+next, time.Now().Unix(), next))
			next++
		}
	}
	sent := func() []string {
		var out []string
		for _, s := range api.Sent() {
			out = append(out, s.Text)
		}
		return out
	}
	add(10)
	waitAnswered(t, "replies to the first 10 updates", "m", next-1, sent)

	key := c.names.SingletonLeaseKey("telegram_poll", ingress.TokenID(telegramtest.Token))
	holder := c.singletonHolder(key, ingresses)
	add(5)
	holder.kill()
	killedAt := time.Now()
	add(10)
	waitAnswered(t, "replies to every update after the poller holder was killed", "m", next-1, sent)
	t.Logf("all %d updates answered %s after the kill", next-1, time.Since(killedAt).Round(time.Millisecond))

	c.checkInboxOnce(next - 1)
	checkRepeatsLabelled(t, sent())
	if polls, conflicts := api.Polls(); conflicts > polls/2 {
		t.Errorf("%d of %d getUpdates calls were conflicts: two pollers ran side by side", conflicts, polls)
	}
	if e, err := c.res.Leases.Get(t.Context(), key); err == nil && strings.Contains(string(e.Value()), fmt.Sprintf("-%d-", holder.pid())) {
		t.Errorf("the killed ingress still holds the poller lease: %s", e.Value())
	}
}

// TestTelegramWebhookToReply drives a real `agentfleet ingress` in webhook
// mode: a request without the secret is refused with 401 and publishes
// nothing; the real update is answered by the worker through sendMessage; a
// redelivered webhook is one turn; and a reply Telegram keeps refusing
// (5xx) is given up after delivery.max_attempts, visible in
// `fleetctl delivery failures`.
func TestTelegramWebhookToReply(t *testing.T) {
	c := newCluster(t)
	t.Parallel()
	api := telegramtest.New(t)
	const secret = "e2e-webhook-secret"
	addr := freeAddr(t)
	base := "http://" + addr
	env := append(append([]string(nil), c.env...),
		"AGENTFLEET_PLATFORMS_TELEGRAM_TOKEN="+telegramtest.Token,
		"AGENTFLEET_PLATFORMS_TELEGRAM_WEBHOOK_SECRET="+secret,
		"AGENTFLEET_PLATFORMS_TELEGRAM_API_BASE="+api.URL,
		"AGENTFLEET_DELIVERY_MAX_ATTEMPTS=3",
		// The scripted failures below are for the delivery's sends: no
		// live message posts at the first delta (TestTelegramLiveMessage).
		"AGENTFLEET_PLATFORMS_TELEGRAM_LIVE_EDITS=false",
	)
	ing := newProc(t, c.dir, "ingress", env, "ingress", "--http", addr)
	ing.start()
	waitReady(t, c.hc, base, ing)
	c.startWorker("w1")

	update := func(id int, chat int, text string) []byte {
		return fmt.Appendf(nil, `{"update_id":%d,"message":{"message_id":%d,"from":{"id":%d,"is_bot":false,"first_name":"U"},"chat":{"id":%d,"type":"private"},"date":%d,"text":%q}}`,
			id, id, chat, chat, time.Now().Unix(), text)
	}
	post := func(body []byte, secretHeader string) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/webhooks/telegram", bytes.NewReader(body))
		if secretHeader != "" {
			req.Header.Set("X-Telegram-Bot-Api-Secret-Token", secretHeader)
		}
		resp, err := c.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := post(update(1, 50, "no secret"), ""); s != http.StatusUnauthorized {
		t.Fatalf("without the secret: %d", s)
	}
	if s := post(update(1, 50, "wrong secret"), "nope"); s != http.StatusUnauthorized {
		t.Fatalf("with a wrong secret: %d", s)
	}
	if n := len(c.readStream(c.res.Inbox, c.names.InboxWildcard())); n != 0 {
		t.Fatalf("refused requests published %d messages", n)
	}
	for range 2 { // Telegram redelivering the same update
		if s := post(update(2, 50, "hello"), secret); s != http.StatusOK {
			t.Fatalf("good secret: %d", s)
		}
	}
	waitFor(t, 60*time.Second, "the reply", func() error {
		if len(api.Sent()) == 0 {
			return errors.New("nothing sent")
		}
		return nil
	})
	if sent := api.Sent(); len(sent) != 1 || sent[0].Text != "echo: hello" || sent[0].ChatID != "50" {
		t.Fatalf("sent %+v", sent)
	}
	if n := len(c.readStream(c.res.Inbox, c.names.InboxWildcard())); n != 1 {
		t.Fatalf("a redelivered webhook made %d inbox messages", n)
	}

	api.FailNext(telegramtest.Failure{Status: 502}, telegramtest.Failure{Status: 500}, telegramtest.Failure{Status: 503})
	if s := post(update(3, 60, "doomed"), secret); s != http.StatusOK {
		t.Fatalf("%d", s)
	}
	var doc struct {
		Failures []ingress.DeliveryFailure `json:"failures"`
	}
	waitFor(t, 60*time.Second, "the failure in fleetctl delivery failures", func() error {
		if err := c.fleetctl(&doc, "delivery", "failures"); err != nil {
			return err
		}
		if len(doc.Failures) == 0 {
			return errors.New("no failure listed")
		}
		return nil
	})
	f := doc.Failures[0]
	if f.Platform != session.PlatformTelegram || f.ChatID != "60" || f.Attempts != 3 || f.SessionKey != "agent:main:telegram:dm:60" {
		t.Fatalf("failure %+v", f)
	}
	// The delivery is not stuck behind it.
	if s := post(update(4, 50, "still there?"), secret); s != http.StatusOK {
		t.Fatalf("%d", s)
	}
	waitFor(t, 60*time.Second, "the reply after the failure", func() error {
		for _, s := range api.Sent() {
			if s.Text == "echo: still there?" {
				return nil
			}
		}
		return errors.New("not yet")
	})
}
