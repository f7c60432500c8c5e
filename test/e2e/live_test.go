package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/ingress/telegram/telegramtest"
)

// TestTelegramLiveMessage: a real ingress (webhook mode) and worker with the
// echo agent, which streams its reply line by line. The reply is one
// Telegram message, posted at the first delta, edited as the lines come,
// and left with the final reply's text; no second message is sent.
func TestTelegramLiveMessage(t *testing.T) {
	c := newCluster(t)
	t.Parallel()
	api := telegramtest.New(t)
	const secret = "e2e-live-secret"
	addr := freeAddr(t)
	base := "http://" + addr
	env := append(append([]string(nil), c.env...),
		"AGENTFLEET_PLATFORMS_TELEGRAM_TOKEN="+telegramtest.Token,
		"AGENTFLEET_PLATFORMS_TELEGRAM_WEBHOOK_SECRET="+secret,
		"AGENTFLEET_PLATFORMS_TELEGRAM_API_BASE="+api.URL,
	)
	ing := newProc(t, c.dir, "ingress", env, "ingress", "--http", addr)
	ing.start()
	waitReady(t, c.hc, base, ing)
	c.startWorker("w1")

	// Three lines 1.5 s apart: the edits (one a second at most) show each.
	text := "line one\n!sleep 1500ms\nline two\n!sleep 1500ms\nline three"
	body := fmt.Appendf(nil, `{"update_id":1,"message":{"message_id":1,"from":{"id":60,"is_bot":false,"first_name":"U"},"chat":{"id":60,"type":"private"},"date":%d,"text":%q}}`,
		time.Now().Unix(), text)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/webhooks/telegram", bytes.NewReader(body))
	req.Header.Set("X-Telegram-Bot-Api-Secret-Token", secret)
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("webhook: %d", resp.StatusCode)
	}
	const final = "echo: line one\nline two\nline three"
	waitFor(t, 90*time.Second, "the live message to show the final reply", func() error {
		if got := api.Text(1); got != final {
			return fmt.Errorf("message 1 shows %q", got)
		}
		return nil
	})
	// The reply is delivered (the outbox consumer acked it) once the text
	// is final; nothing else is sent after it.
	waitFor(t, 60*time.Second, "the delivery consumer to finish", func() error {
		info, err := c.res.Outbox.Consumer(t.Context(), c.names.DeliveryConsumer("telegram"))
		if err != nil {
			return err
		}
		ci, err := info.Info(t.Context())
		if err != nil {
			return err
		}
		if ci.NumPending != 0 || ci.NumAckPending != 0 {
			return errors.New("reply not acked yet")
		}
		return nil
	})
	sent, edits := api.Sent(), api.Edits()
	if len(sent) != 1 || sent[0].Text != "echo: line one" || sent[0].ChatID != "60" {
		t.Fatalf("sent %+v, want one message posted at the first delta", sent)
	}
	if len(edits) < 2 || edits[0].Text != "echo: line one\nline two" {
		t.Fatalf("edits %+v, want the second line edited in, then the final text", edits)
	}
	t.Logf("one message, %d edits", len(edits))
}
