package e2e

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/ingress/discord/discordtest"
)

// TestDiscordGatewayFailover runs two `agentfleet ingress` processes with
// Discord on against a local Gateway, and a worker. One ingress holds the
// Gateway connection (the singleton lease); it is killed with SIGKILL while
// messages keep coming. The other takes the lease and RESUMEs the session
// from the last message the dead one published, so Discord replays what
// was sent meanwhile; every message is in the inbox exactly once and
// answered in its channel.
func TestDiscordGatewayFailover(t *testing.T) {
	c := newCluster(t)
	t.Parallel()
	api := discordtest.New(t)
	ingresses := c.startIngresses([]string{
		"AGENTFLEET_PLATFORMS_DISCORD_TOKEN=" + discordtest.Token,
		"AGENTFLEET_PLATFORMS_DISCORD_API_BASE=" + api.APIBase(),
		"AGENTFLEET_PLATFORMS_DISCORD_GATEWAY_URL=" + api.GatewayURL(),
	}, "ingress-a", "ingress-b")
	c.startWorker("w1")
	waitFor(t, startTimeout, "a gateway connection", func() error {
		if !api.Connected() {
			return errors.New("not connected")
		}
		return nil
	})
	next := 1
	add := func(n int) {
		for range n {
			// One DM channel per message: one lane, one turn, one reply each.
			api.Dispatch("MESSAGE_CREATE", fmt.Sprintf(`{"type":0,"id":"15000000000000%05d","channel_id":"16000000000000%05d","content":"g%d","author":{"id":"17000000000000%05d","username":"u%d"},"mentions":[],"attachments":[],"embeds":[],"timestamp":"2026-11-20T10:15:02.731000+00:00"}`,
				next, next, next, next, next))
			next++
		}
	}
	posted := func() []string {
		var out []string
		for _, s := range api.Sent() {
			out = append(out, s.Content)
		}
		return out
	}
	add(10)
	waitAnswered(t, "replies to the first 10 messages", "g", next-1, posted)

	holder := c.singletonHolder(c.names.SingletonLeaseKey("discord_gateway", ingress.TokenID(discordtest.Token)), ingresses)
	add(5)
	holder.kill()
	killedAt := time.Now()
	add(10)
	waitAnswered(t, "replies to every message after the gateway holder was killed", "g", next-1, posted)
	t.Logf("all %d messages answered %s after the kill", next-1, time.Since(killedAt).Round(time.Millisecond))

	c.checkInboxOnce(next - 1)
	checkRepeatsLabelled(t, posted())
	if n := api.Identifies(); n != 1 {
		t.Errorf("%d IDENTIFYs: the survivor should have resumed the session", n)
	}
	if rs := api.Resumes(); len(rs) == 0 || !rs[len(rs)-1].Known {
		t.Errorf("resumes %+v", rs)
	}
}
