package e2e

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
)

// TestQueueSurvivesKill: `/queue a`, `/queue b`, `/queue c` sent during a
// long turn run as three separate turns, in order, each answered once, also
// when the worker running them is killed (SIGKILL) while item a runs: the
// other worker resumes a, then runs b and c.
func TestQueueSurvivesKill(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.startIngress()
	workers := []*workerProc{c.startWorker("qa"), c.startWorker("qb")}

	first := c.post("queued", "first\n!sleep 1500ms", "q-0")
	key := first.SessionKey
	waitFor(t, 30*time.Second, "the first turn to start", func() error {
		e, err := c.entry(key)
		if err != nil {
			return err
		}
		if e.Turn == nil {
			return errors.New("no turn in flight")
		}
		return nil
	})
	items := []string{"a", "b", "c"}
	var seqs []uint64
	for i, item := range items {
		a := c.post("queued", "/queue "+item+"\n!sleep 1s", fmt.Sprintf("q-%d", i+1))
		seqs = append(seqs, a.Seq)
	}

	// Kill the worker running item a, mid-turn.
	var owner string
	waitFor(t, 30*time.Second, "queued item a to run", func() error {
		e, err := c.entry(key)
		if err != nil {
			return err
		}
		if e.Turn == nil || e.Turn.FirstSeq != seqs[0] {
			return fmt.Errorf("turn in flight %+v", e.Turn)
		}
		owner = e.Turn.Owner
		return nil
	})
	var victim, survivor *workerProc
	for _, w := range workers {
		if w.owner == owner {
			victim = w
		} else {
			survivor = w
		}
	}
	if victim == nil {
		t.Fatalf("item a runs on %s, not one of the workers", owner)
	}
	victim.kill()
	t.Logf("killed %s while it ran queued item a", owner)

	waitFor(t, 60*time.Second, "every queued item to be answered", func() error {
		if err := c.committed(key, seqs[len(seqs)-1]); err != nil {
			return err
		}
		return c.delivered()
	})
	e := c.mustEntry(key)
	entries := c.load(e.SessionID)
	box := c.allReplies(key)
	checkRepliesOnce(t, key, entries, box)
	var got []string
	for _, r := range box {
		if r.Kind == session.ReplyKindReply {
			got = append(got, r.Text)
		}
	}
	if want := []string{"echo: first", "echo: a", "echo: b", "echo: c"}; !slices.Equal(got, want) {
		t.Fatalf("replies %q, want %q", got, want)
	}
	// Each queued item is a turn of its own; a ran again on the survivor.
	turnOf := map[string]string{}
	for _, u := range userEntries(entries) {
		text, _, _ := strings.Cut(u.Content, "\n")
		if prev, ok := turnOf[text]; ok && prev != u.TurnID {
			t.Errorf("%q has user entries in turns %s and %s", text, prev, u.TurnID)
		}
		turnOf[text] = u.TurnID
	}
	seen := map[string]string{}
	for _, text := range append([]string{"first"}, items...) {
		id := turnOf[text]
		if id == "" {
			t.Errorf("no user entry for %q", text)
			continue
		}
		if other, ok := seen[id]; ok {
			t.Errorf("%q shares turn %s with %q", text, id, other)
		}
		seen[id] = text
	}
	var resumedOn string
	for _, ev := range c.laneTurnEvents(session.LaneToken(key)) {
		if ev.Type == "start" && ev.TurnID == turnOf["a"] && ev.Attempt == 2 {
			resumedOn = ev.Owner
		}
	}
	if resumedOn != survivor.owner {
		t.Errorf("item a resumed on %q, want the survivor %s", resumedOn, survivor.owner)
	}
	if e.Suspended || e.Turn != nil || e.InterruptedTurns != 0 || e.QueueDepth != 0 {
		t.Errorf("entry after the queue: suspended %v turn %v interrupted_turns %d queue_depth %d", e.Suspended, e.Turn != nil, e.InterruptedTurns, e.QueueDepth)
	}
}
