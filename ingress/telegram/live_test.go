package telegram_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/ingress/telegram"
	"github.com/agentfleet/agentfleet/ingress/telegram/telegramtest"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

const liveInterval = 300 * time.Millisecond

// startLive runs the delivery and the live messages of the bundle's bot,
// the live edits paced at liveInterval per chat.
func (b *bundle) startLive() {
	b.startDelivery(func(c *ingress.PlatformDeliveryConfig) { c.LiveEdits = true })
	b.StartLive(telegram.LiveConfig(b.adapter.Sender()), func(c *ingress.LiveEditsConfig) { c.EditInterval = liveInterval })
}

// waitText waits until message id shows text.
func (b *bundle) waitText(id int64, text string) {
	b.t.Helper()
	natstest.WaitFor(b.t, waitTimeout, fmt.Sprintf("message %d shows %.40q", id, text), func() error {
		if got := b.api.Text(id); got != text {
			return fmt.Errorf("it shows %.60q", got)
		}
		return nil
	})
}

// stream publishes n deltas of turn, one every gap, and returns their text.
func (b *bundle) stream(key, turn string, n int, gap time.Duration) string {
	var all strings.Builder
	for i := 1; i <= n; i++ {
		piece := fmt.Sprintf("word%d ", i)
		all.WriteString(piece)
		b.Delta(key, turn, i, piece)
		time.Sleep(gap) // the agent's pace, not a wait for a condition
	}
	return all.String()
}

// TestLiveMessageEditedInPlace: a streamed turn is one message, posted at
// the first delta and edited in place at most once per interval; the final
// reply replaces its text, and no second message appears.
func TestLiveMessageEditedInPlace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startLive()
	key := b.PutSession(session.PlatformTelegram, "321", "")
	start := time.Now()
	streamed := b.stream(key, "turn-1", 30, 20*time.Millisecond)
	b.waitText(1, streamed)
	elapsed := time.Since(start)
	edits := b.api.Edits()
	if len(edits) >= 29 {
		t.Errorf("%d edits for 30 deltas: not throttled", len(edits))
	}
	if max := int(elapsed/liveInterval) + 2; len(edits) > max {
		t.Errorf("%d edits in %s, at most %d expected at one per %s", len(edits), elapsed, max, liveInterval)
	}
	for i := 1; i < len(edits); i++ {
		if gap := edits[i].At.Sub(edits[i-1].At); gap < liveInterval-20*time.Millisecond {
			t.Errorf("edits %d and %d %s apart", i-1, i, gap)
		}
	}
	b.PublishTurnReply(session.PlatformTelegram, "20261123_120000_abcdef01:7", "turn-1", "321", "", "The final answer.")
	b.waitText(1, "The final answer.")
	// A later reply is a new message: the first one stays the final answer.
	b.publishReply("20261123_120000_abcdef01:8", "321", "", "next")
	sent := b.waitSent(2)
	if len(sent) != 2 || sent[0].Text != "word1 " || sent[1].Text != "next" || b.api.Text(1) != "The final answer." {
		t.Fatalf("sent %+v; message 1 shows %q", sent, b.api.Text(1))
	}
}

// TestLiveEdit429: an edit answered 429 is retried after retry_after, and
// the live message still ends with the final reply.
func TestLiveEdit429(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startLive()
	key := b.PutSession(session.PlatformTelegram, "322", "")
	b.Delta(key, "turn-2", 1, "Hel")
	b.waitText(1, "Hel")
	b.api.FailEditNext(telegramtest.Failure{Status: http.StatusTooManyRequests, RetryAfter: 1})
	refused := time.Now()
	b.Delta(key, "turn-2", 2, "lo")
	b.waitText(1, "Hello")
	if edits := b.api.Edits(); len(edits) != 1 || edits[0].At.Sub(refused) < time.Second {
		t.Fatalf("edits %+v, the refused one at %s", edits, refused)
	}
	b.PublishTurnReply(session.PlatformTelegram, "20261123_120000_abcdef01:2", "turn-2", "322", "", "Hello, world.")
	b.waitText(1, "Hello, world.")
	if sent := b.api.Sent(); len(sent) != 1 {
		t.Fatalf("sent %+v", sent)
	}
}

// TestLiveLongFinalSplit: a final reply longer than a message replaces the
// live message with its first part; the other parts follow as new messages.
func TestLiveLongFinalSplit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startLive()
	key := b.PutSession(session.PlatformTelegram, "323", "")
	b.Delta(key, "turn-3", 1, "Thinking")
	b.waitText(1, "Thinking")
	var long strings.Builder
	for i := range 700 {
		fmt.Fprintf(&long, "line %d of the answer\n", i)
	}
	b.PublishTurnReply(session.PlatformTelegram, "20261123_120000_abcdef01:3", "turn-3", "323", "", long.String())
	sent := b.waitSent(2)
	parts := ingress.Split(long.String(), telegram.MaxMessageLength-ingress.UTF16Len(ingress.DuplicateLabel), ingress.UTF16Len)
	if len(parts) < 3 {
		t.Fatalf("the reply splits into %d parts", len(parts))
	}
	sent = b.waitSent(len(parts))
	b.waitText(1, parts[0])
	if len(sent) != len(parts) {
		t.Fatalf("%d messages for %d parts", len(sent), len(parts))
	}
	for i, p := range parts[1:] {
		if sent[i+1].Text != p {
			t.Errorf("message %d is not part %d", i+2, i+1)
		}
	}
}

// TestLiveFinalFirst: a final reply that comes before any delta is posted
// as today, and a late delta of its turn posts nothing.
func TestLiveFinalFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startLive()
	key := b.PutSession(session.PlatformTelegram, "324", "")
	b.PublishTurnReply(session.PlatformTelegram, "20261123_120000_abcdef01:4", "turn-4", "324", "", "Done already.")
	b.waitSent(1)
	b.Delta(key, "turn-4", 1, "late")
	// A delta of another turn posts: once it shows, the late one was handled
	// before it (one subscription, in order).
	b.Delta(key, "turn-5", 1, "next turn")
	sent := b.waitSent(2)
	if len(sent) != 2 || sent[0].Text != "Done already." || sent[1].Text != "next turn" || len(b.api.Edits()) != 0 {
		t.Fatalf("sent %+v, edits %+v", sent, b.api.Edits())
	}
}

// TestLiveStateLost: when the live message's record is gone (the state the
// streamer and the delivery share), the final reply is posted as a normal
// new message: never lost, and the streamer stops editing.
func TestLiveStateLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startLive()
	key := b.PutSession(session.PlatformTelegram, "325", "")
	b.Delta(key, "turn-6", 1, "partial")
	b.waitText(1, "partial")
	if err := b.Res.Delivered.Purge(t.Context(), "telegram.live."+session.LaneToken("turn-6")); err != nil {
		t.Fatal(err)
	}
	b.PublishTurnReply(session.PlatformTelegram, "20261123_120000_abcdef01:6", "turn-6", "325", "", "The whole answer.")
	sent := b.waitSent(2)
	b.Delta(key, "turn-6", 2, " more")
	b.Delta(key, "turn-7", 1, "next turn")
	sent = b.waitSent(3)
	if sent[1].Text != "The whole answer." || sent[2].Text != "next turn" || b.api.Text(1) != "partial" {
		t.Fatalf("sent %+v, message 1 shows %q", sent, b.api.Text(1))
	}
	if edits := b.api.Edits(); len(edits) != 0 {
		t.Fatalf("edits %+v", edits)
	}
}
