package slack_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/ingress/slack"
	"github.com/agentfleet/agentfleet/ingress/slack/slackfake"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestLiveMessageUpdated: on Slack a streamed turn is one message in its
// thread, updated in place with chat.update (a 429 with Retry-After waited
// for), and the final reply is its last text.
func TestLiveMessageUpdated(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	b.startDelivery(func(c *ingress.PlatformDeliveryConfig) { c.LiveEdits = true })
	b.StartLive(slack.LiveConfig(b.adapter.Sender()), func(c *ingress.LiveEditsConfig) { c.EditInterval = 200 * time.Millisecond })
	const channel, thread = "D0USER0001", "1700000000.000100"
	key := b.PutSession(session.PlatformSlack, channel, thread)
	waitText := func(text string) string {
		t.Helper()
		var ts string
		natstest.WaitFor(t, waitTimeout, fmt.Sprintf("the live message shows %q", text), func() error {
			posted := b.api.Posted()
			if len(posted) == 0 {
				return fmt.Errorf("nothing posted")
			}
			ts = posted[0].TS
			if got := b.api.Text(channel, ts); got != text {
				return fmt.Errorf("it shows %q", got)
			}
			return nil
		})
		return ts
	}
	b.Delta(key, "turn-s", 1, "Once ")
	waitText("Once ")
	b.api.FailUpdateNext(slackfake.Failure{Status: http.StatusTooManyRequests, RetryAfter: 1})
	refused := time.Now()
	b.Delta(key, "turn-s", 2, "upon")
	waitText("Once upon")
	if ups := b.api.Updates(); len(ups) != 1 || ups[0].At.Sub(refused) < time.Second {
		t.Fatalf("updates %+v after a refusal at %s", ups, refused)
	}
	b.PublishTurnReply(session.PlatformSlack, "20261123_120000_abcdef01:9", "turn-s", channel, thread, "Once upon a time.")
	ts := waitText("Once upon a time.")
	posted := b.api.Posted()
	if len(posted) != 1 || posted[0].ThreadTS != thread || posted[0].Channel != channel || ts == "" {
		t.Fatalf("posted %+v", posted)
	}
}
