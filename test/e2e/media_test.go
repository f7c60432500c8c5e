package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/ingress/telegram/telegramtest"
	"github.com/agentfleet/agentfleet/session"
)

// TestTelegramMediaLink drives a real `agentfleet ingress` in webhook mode:
// a photo update is stored with a link to the ingress's own media endpoint
// (never Telegram's file URL, which holds the bot token), and that link
// serves the photo's bytes through getFile and the download.
func TestTelegramMediaLink(t *testing.T) {
	c := newCluster(t)
	t.Parallel()
	api := telegramtest.New(t)
	const secret = "e2e-media-secret"
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
	jpeg := []byte("\xff\xd8\xff\xe0 e2e photo")
	api.AddFile("AgACAgQAAxkBAAIE2e", "image/jpeg", jpeg)

	update := fmt.Appendf(nil, `{"update_id":9,"message":{"message_id":9,"from":{"id":70,"is_bot":false,"first_name":"U"},"chat":{"id":70,"type":"private"},"date":%d,"photo":[{"file_id":"AgACAgQAAxkBAAIE2e","file_unique_id":"u","file_size":%d,"width":90,"height":90}],"caption":"see"}}`,
		time.Now().Unix(), len(jpeg))
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/webhooks/telegram", bytes.NewReader(update))
	req.Header.Set("X-Telegram-Bot-Api-Secret-Token", secret)
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("webhook: %d", resp.StatusCode)
	}
	msgs := c.readStream(c.res.Inbox, c.names.InboxWildcard())
	if len(msgs) != 1 {
		t.Fatalf("%d inbox messages", len(msgs))
	}
	if bytes.Contains(msgs[0].Data, []byte("test-token")) {
		t.Fatalf("the inbox message holds the bot token: %s", msgs[0].Data)
	}
	var in session.Inbound
	if err := json.Unmarshal(msgs[0].Data, &in); err != nil {
		t.Fatal(err)
	}
	if len(in.Attachments) != 1 || !strings.HasPrefix(in.Attachments[0].URL, base+"/v1/media/telegram/AgACAgQAAxkBAAIE2e?sig=") {
		t.Fatalf("attachments %+v", in.Attachments)
	}
	got, err := c.hc.Get(in.Attachments[0].URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(got.Body)
	got.Body.Close()
	if got.StatusCode != http.StatusOK || !bytes.Equal(body, jpeg) {
		t.Fatalf("GET the link: %d %q", got.StatusCode, body)
	}
}
