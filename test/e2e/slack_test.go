package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/ingress/slack/slackfake"
	"github.com/agentfleet/agentfleet/session"
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
	env := []string{
		"AGENTFLEET_PLATFORMS_SLACK_MODE=socket",
		"AGENTFLEET_PLATFORMS_SLACK_APP_TOKEN=" + slackfake.AppToken,
		"AGENTFLEET_PLATFORMS_SLACK_BOT_TOKEN=" + slackfake.BotToken,
		"AGENTFLEET_PLATFORMS_SLACK_API_BASE=" + api.APIBase(),
	}
	ingresses := map[int]*proc{}
	for _, name := range []string{"ingress-a", "ingress-b"} {
		addr := freeAddr(t)
		p := newProc(t, c.dir, name, append(append([]string(nil), c.env...), env...), "ingress", "--http", addr)
		p.start()
		waitReady(t, c.hc, "http://"+addr, p)
		ingresses[p.pid()] = p
	}
	c.startWorker("w1")

	next := 1
	add := func(n int) {
		for range n {
			api.AddSocketEvent(fmt.Appendf(nil, `{"token":"x","team_id":"T1","api_app_id":"A1","type":"event_callback","event_id":"Ev%d","event_time":1763900000,`+
				`"authorizations":[{"team_id":"T1","user_id":"U0BOT00001","is_bot":true}],`+
				`"event":{"type":"message","text":"s%d","user":"U%d","ts":"1763900000.%06d","channel":"D%d","event_ts":"1763900000.%06d","channel_type":"im"}}`,
				next, next, next, next, next, next))
			next++
		}
	}
	replied := func(what string) {
		waitFor(t, 120*time.Second, what, func() error {
			got := map[string]bool{}
			for _, p := range api.Posted() {
				got[strings.TrimPrefix(p.Text, ingress.DuplicateLabel)] = true
			}
			for i := 1; i < next; i++ {
				if !got[fmt.Sprintf("echo: s%d", i)] {
					return fmt.Errorf("no reply to s%d yet (%d posted)", i, len(api.Posted()))
				}
			}
			return nil
		})
	}
	add(10)
	replied("replies to the first 10 events")

	key := c.names.SingletonLeaseKey("slack_socket", ingress.TokenID(slackfake.AppToken))
	var holder *proc
	waitFor(t, startTimeout, "the socket lease holder", func() error {
		e, err := c.res.Leases.Get(t.Context(), key)
		if err != nil {
			return err
		}
		var v struct{ Owner string }
		if err := json.Unmarshal(e.Value(), &v); err != nil {
			return err
		}
		parts := strings.Split(v.Owner, "-")
		pid, _ := strconv.Atoi(parts[len(parts)-2])
		if holder = ingresses[pid]; holder == nil {
			return fmt.Errorf("owner %q is no ingress of this test", v.Owner)
		}
		return nil
	})
	add(5)
	holder.kill()
	add(10)
	replied("replies to every event after the socket holder was killed")

	counts := map[string]int{}
	for _, m := range c.readStream(c.res.Inbox, c.names.InboxWildcard()) {
		var in session.Inbound
		if err := json.Unmarshal(m.Data, &in); err != nil {
			t.Fatal(err)
		}
		counts[in.PlatformMsgID]++
	}
	if len(counts) != next-1 {
		t.Errorf("inbox holds %d distinct events, want %d", len(counts), next-1)
	}
	for id, n := range counts {
		if n != 1 {
			t.Errorf("event %s is in the inbox %d times", id, n)
		}
	}
	if n := api.SocketConnections(); n < 2 {
		t.Errorf("%d socket connections: the survivor never connected", n)
	}
	seen := map[string]int{}
	for _, p := range api.Posted() {
		base := strings.TrimPrefix(p.Text, ingress.DuplicateLabel)
		seen[base]++
		if seen[base] > 1 && !strings.HasPrefix(p.Text, ingress.DuplicateLabel) {
			t.Errorf("reply %q posted again without the duplicate label", base)
		}
	}
}
