package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/ingress/slack/slackfake"
)

// TestSlackEventsToReply drives a real `agentfleet ingress` with the Slack
// Events API on: a badly signed request is refused (401, nothing
// published); a signed app mention is answered in its thread through
// chat.postMessage; Slack's retry of the event (X-Slack-Retry-Num) is the
// same turn.
func TestSlackEventsToReply(t *testing.T) {
	c := newCluster(t)
	t.Parallel()
	api := slackfake.New(t)
	const secret = "e2e-signing-secret"
	addr := freeAddr(t)
	base := "http://" + addr
	env := append(append([]string(nil), c.env...),
		"AGENTFLEET_PLATFORMS_SLACK_SIGNING_SECRET="+secret,
		"AGENTFLEET_PLATFORMS_SLACK_BOT_TOKEN="+slackfake.BotToken,
		"AGENTFLEET_PLATFORMS_SLACK_API_BASE="+api.APIBase(),
	)
	ing := newProc(t, c.dir, "ingress", env, "ingress", "--http", addr)
	ing.start()
	waitReady(t, c.hc, base, ing)
	c.startWorker("w1")

	body := []byte(`{"token":"x","team_id":"T1","api_app_id":"A1","type":"event_callback","event_id":"Ev1","event_time":1763900000,` +
		`"authorizations":[{"team_id":"T1","user_id":"U0BOT00001","is_bot":true}],` +
		`"event":{"type":"app_mention","text":"<@U0BOT00001> ping","user":"U42","ts":"1763900100.000100","thread_ts":"1763900000.000001","channel":"C9","event_ts":"1763900100.000100"}}`)
	post := func(h http.Header) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/webhooks/slack", bytes.NewReader(body))
		req.Header = h
		resp, err := c.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := post(slackfake.Sign("wrong", time.Now(), body)); s != http.StatusUnauthorized {
		t.Fatalf("bad signature: %d", s)
	}
	if n := len(c.readStream(c.res.Inbox, c.names.InboxWildcard())); n != 0 {
		t.Fatalf("a refused request published %d messages", n)
	}
	for i := range 3 {
		h := slackfake.Sign(secret, time.Now(), body)
		if i > 0 {
			h.Set("X-Slack-Retry-Num", fmt.Sprint(i))
		}
		if s := post(h); s != http.StatusOK {
			t.Fatalf("attempt %d: %d", i, s)
		}
	}
	waitFor(t, 60*time.Second, "the reply", func() error {
		if len(api.Posted()) == 0 {
			return errors.New("nothing posted")
		}
		return nil
	})
	if n := len(c.readStream(c.res.Inbox, c.names.InboxWildcard())); n != 1 {
		t.Fatalf("three deliveries of one event made %d inbox messages", n)
	}
	p := api.Posted()
	if len(p) != 1 || p[0].Text != "echo: ping" || p[0].Channel != "C9" || p[0].ThreadTS != "1763900000.000001" {
		t.Fatalf("posted %+v", p)
	}
}

// TestSlackSocketModeFailover runs two `agentfleet ingress` processes with
// Slack Socket Mode against a local Socket Mode server, and a worker. One
// ingress holds the connection (the singleton lease); it is killed with
// SIGKILL while events keep coming. The other takes the connection over;
// what the dead one left unacknowledged is delivered again; every event is
// in the inbox exactly once and answered.
func TestSlackSocketModeFailover(t *testing.T) {
	c := newCluster(t)
	t.Parallel()
	api := slackfake.New(t)
	ingresses := c.startIngresses([]string{
		"AGENTFLEET_PLATFORMS_SLACK_MODE=socket",
		"AGENTFLEET_PLATFORMS_SLACK_APP_TOKEN=" + slackfake.AppToken,
		"AGENTFLEET_PLATFORMS_SLACK_BOT_TOKEN=" + slackfake.BotToken,
		"AGENTFLEET_PLATFORMS_SLACK_API_BASE=" + api.APIBase(),
	}, "ingress-a", "ingress-b")
	c.startWorker("w1")

	next := 1
	add := func(n int) {
		for range n {
			// One DM per event: one lane, one turn, one reply each.
			api.AddSocketEvent(fmt.Appendf(nil, `{"token":"x","team_id":"T1","api_app_id":"A1","type":"event_callback","event_id":"Ev%d","event_time":1763900000,`+
				`"authorizations":[{"team_id":"T1","user_id":"U0BOT00001","is_bot":true}],`+
				`"event":{"type":"message","text":"s%d","user":"U%d","ts":"1763900000.%06d","channel":"D%d","event_ts":"1763900000.%06d","channel_type":"im"}}`,
				next, next, next, next, next, next))
			next++
		}
	}
	posted := func() []string {
		var out []string
		for _, p := range api.Posted() {
			out = append(out, p.Text)
		}
		return out
	}
	add(10)
	waitAnswered(t, "replies to the first 10 events", "s", next-1, posted)

	holder := c.singletonHolder(c.names.SingletonLeaseKey("slack_socket", ingress.TokenID(slackfake.AppToken)), ingresses)
	add(5)
	holder.kill()
	killedAt := time.Now()
	add(10)
	waitAnswered(t, "replies to every event after the socket holder was killed", "s", next-1, posted)
	t.Logf("all %d events answered %s after the kill", next-1, time.Since(killedAt).Round(time.Millisecond))

	c.checkInboxOnce(next - 1)
	checkRepeatsLabelled(t, posted())
	if n := api.SocketConnections(); n < 2 {
		t.Errorf("%d socket connections: the survivor never connected", n)
	}
}
