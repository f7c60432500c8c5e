package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/ingress/whatsapp"
	"github.com/agentfleet/agentfleet/ingress/whatsapp/whatsapptest"
)

// TestWhatsAppWebhookToReply drives a real `agentfleet ingress` with
// WhatsApp on: Meta's verification handshake; a badly signed notification
// is refused (401, nothing published); a signed message is answered
// through /{phone_number_id}/messages; Meta's redelivery is the same turn.
func TestWhatsAppWebhookToReply(t *testing.T) {
	c := newCluster(t)
	t.Parallel()
	api := whatsapptest.New(t)
	const secret, verify = "e2e-app-secret", "e2e-verify"
	addr := freeAddr(t)
	base := "http://" + addr
	env := append(append([]string(nil), c.env...),
		"AGENTFLEET_PLATFORMS_WHATSAPP_APP_SECRET="+secret,
		"AGENTFLEET_PLATFORMS_WHATSAPP_VERIFY_TOKEN="+verify,
		"AGENTFLEET_PLATFORMS_WHATSAPP_ACCESS_TOKEN="+whatsapptest.Token,
		"AGENTFLEET_PLATFORMS_WHATSAPP_PHONE_NUMBER_ID="+whatsapptest.PhoneNumberID,
		"AGENTFLEET_PLATFORMS_WHATSAPP_API_BASE="+api.URL+"/v23.0",
	)
	ing := newProc(t, c.dir, "ingress", env, "ingress", "--http", addr)
	ing.start()
	waitReady(t, c.hc, base, ing)
	c.startWorker("w1")

	resp, err := c.hc.Get(base + "/webhooks/whatsapp?hub.mode=subscribe&hub.verify_token=" + verify + "&hub.challenge=42")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("verification: %d", resp.StatusCode)
	}
	body := fmt.Appendf(nil, `{"object":"whatsapp_business_account","entry":[{"id":"1","changes":[{"field":"messages","value":{"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550783881","phone_number_id":%q},"contacts":[{"profile":{"name":"Ada"},"wa_id":"16505550001"}],"messages":[{"from":"16505550001","id":"wamid.E2E1","timestamp":"%d","type":"text","text":{"body":"ping"}}]}}]}]}`,
		whatsapptest.PhoneNumberID, time.Now().Unix())
	post := func(sig string) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/webhooks/whatsapp", bytes.NewReader(body))
		req.Header.Set(whatsapp.HeaderSignature, sig)
		resp, err := c.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := post(whatsapp.Sign("wrong", body)); s != http.StatusUnauthorized {
		t.Fatalf("bad signature: %d", s)
	}
	if n := len(c.readStream(c.res.Inbox, c.names.InboxWildcard())); n != 0 {
		t.Fatalf("a refused request published %d messages", n)
	}
	for i := range 3 {
		if s := post(whatsapp.Sign(secret, body)); s != http.StatusOK {
			t.Fatalf("attempt %d: %d", i, s)
		}
	}
	waitFor(t, 60*time.Second, "the reply", func() error {
		if len(api.Sent()) == 0 {
			return errors.New("nothing sent")
		}
		return nil
	})
	if n := len(c.readStream(c.res.Inbox, c.names.InboxWildcard())); n != 1 {
		t.Fatalf("three deliveries of one message made %d inbox messages", n)
	}
	if s := api.Sent(); len(s) != 1 || s[0].Text != "echo: ping" || s[0].To != "16505550001" {
		t.Fatalf("sent %+v", s)
	}
}
