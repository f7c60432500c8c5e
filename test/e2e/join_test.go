package e2e

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
)

// TestResumedTurnTakesWaitingMessages: one worker (lease TTL 3s) runs
// "!sleep 5s / first" and is SIGKILLed mid-turn; "second" is posted while the
// lane has no live worker; another worker is started. In interrupt mode
// (the default) the plain message already waiting joins the resumed turn
// instead of cutting it short: one reply answers both messages, with the
// crash's resume note, and nothing is left resume_pending or counted.
func TestResumedTurnTakesWaitingMessages(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.startIngress()
	w1 := c.startWorker("join-1")

	a := c.post("join", "!sleep 5s\nfirst\n!notes", "")
	lane := session.LaneToken(a.SessionKey)
	var turnID, sid string
	waitFor(t, 30*time.Second, "the first turn to run on the only worker", func() error {
		e, err := c.entry(a.SessionKey)
		if err != nil {
			return err
		}
		if e.Turn == nil || e.Owner != w1.owner {
			return fmt.Errorf("turn %v owner %q", e.Turn != nil, e.Owner)
		}
		for _, ev := range c.laneTurnEvents(lane) {
			if ev.Type == "start" && ev.TurnID == e.Turn.ID {
				turnID, sid = e.Turn.ID, e.Turn.SessionID
				return nil
			}
		}
		return errors.New("no start event yet")
	})
	w1.kill()
	b := c.post("join", "second", "")
	c.startWorker("join-2")

	got := c.waitReplies(a.SessionKey, 1, 60*time.Second)
	waitFor(t, 60*time.Second, "the lane to settle", func() error {
		if err := c.committed(a.SessionKey, b.Seq); err != nil {
			return err
		}
		return c.delivered()
	})
	box := c.allReplies(a.SessionKey)
	if len(box) != 1 || box[0].Kind != session.ReplyKindReply || box[0].TurnID != turnID || box[0].SessionID != sid {
		t.Fatalf("mailbox %+v, want one reply of the resumed turn %s in session %s", box, turnID, sid)
	}
	if !strings.HasPrefix(got[0].Text, "echo: first\nsecond\nnote: ") {
		t.Fatalf("reply %q, want both messages answered by the resumed turn", got[0].Text)
	}
	if notes := resumeNotes(got[0].Text); len(notes) != 1 || !strings.Contains(notes[0], "interrupted by a gateway crash.") {
		t.Errorf("resume notes %q, want the crash's note once", notes)
	}
	e := c.mustEntry(a.SessionKey)
	if e.SessionID != sid || e.ResumePending || e.InterruptedTurns != 0 || e.LastTurnID != turnID {
		t.Errorf("entry after the resumed turn: session %s resume_pending %v interrupted_turns %d last turn %s; want %s, false, 0, %s",
			e.SessionID, e.ResumePending, e.InterruptedTurns, e.LastTurnID, sid, turnID)
	}
	if users := userEntries(c.load(sid)); len(users) != 2 || users[0].InboxSeq != a.Seq || users[1].InboxSeq != b.Seq {
		t.Errorf("user entries %+v, want first and second once each, in order", users)
	}
}
