package e2e

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
)

// TestBreakLeaseMidTurn: `fleetctl lane break-lease` during a running turn
// forces a takeover long before the owner's lease would expire. The owner is
// paused (SIGSTOP) so it cannot step aside on its own: the other worker
// resumes the turn at a higher epoch and completes it, and when the old
// owner runs again the server refuses what it writes (its renewal, append
// or commit), exactly as after a crash — nothing of its attempt lands after
// the new owner's fence, and the user gets one reply.
func TestBreakLeaseMidTurn(t *testing.T) {
	// A long lease: without break-lease the lane would stay stuck for most
	// of a minute, well past the takeover deadline below.
	const ttl = 60 * time.Second
	c := newClusterTTL(t, ttl, 2*time.Second)
	c.startIngress()
	watch := watchEntries(t, c)
	debug := "AGENTFLEET_TELEMETRY_LOG_LEVEL=debug"
	// A long liveness lease too: the pause below must not let the other
	// worker take the lane over by itself (a dead worker's lanes are taken
	// over once its liveness lease expires; see TestPausedPastLivenessFenced).
	live := "AGENTFLEET_LEASE_LIVENESS_TTL=60s"
	a := c.startWorker("break-a", debug, live)
	b := c.startWorker("break-b", debug, live)

	msg := c.post("break-1", "breaker\n!sleep 5s", "")
	key := msg.SessionKey
	var sid, turnID string
	var epochOld uint64
	var old, other *workerProc
	waitFor(t, 30*time.Second, "a worker to be mid-turn", func() error {
		e, err := c.entry(key)
		if err != nil {
			return err
		}
		if e.Turn == nil {
			return fmt.Errorf("no turn yet (owner %q)", e.Owner)
		}
		switch e.Owner {
		case a.owner:
			old, other = a, b
		case b.owner:
			old, other = b, a
		default:
			return fmt.Errorf("owner %q is neither worker", e.Owner)
		}
		sid, turnID, epochOld = e.Turn.SessionID, e.Turn.ID, e.LeaseEpoch
		return nil
	})
	old.signal(syscall.SIGSTOP)
	// The pause is the fault; it lasts past the workers' 5s pull expiry, so
	// the paused worker holds no pull request that could be handed the
	// wake-up.
	pause := time.NewTimer(6 * time.Second)
	<-pause.C
	if e := c.mustEntry(key); e.Owner != old.owner || e.Turn == nil || e.Turn.ID != turnID {
		t.Fatalf("the turn ended before the owner was paused: %+v", e)
	}

	var doc struct {
		Lane   string `json:"lane"`
		Broken *struct {
			Owner string `json:"owner"`
			Epoch uint64 `json:"epoch"`
		} `json:"broken"`
	}
	if err := c.fleetctl(&doc, "lane", "break-lease", key); err != nil {
		t.Fatal(err)
	}
	if doc.Lane != session.LaneToken(key) || doc.Broken == nil || doc.Broken.Owner != old.owner || doc.Broken.Epoch != epochOld {
		t.Fatalf("break-lease reported %+v, want the lease of %s at epoch %d", doc, old.owner, epochOld)
	}
	broke := time.Now()

	// The other worker takes over well before the old lease could have
	// expired (at least 2/3 of the 60s TTL after the pause).
	var epochNew uint64
	waitFor(t, 25*time.Second, "the other worker to take the lane over", func() error {
		e, err := c.entry(key)
		if err != nil {
			return err
		}
		if e.Owner != other.owner || e.LeaseEpoch <= epochOld {
			return fmt.Errorf("owner %q epoch %d", e.Owner, e.LeaseEpoch)
		}
		epochNew = e.LeaseEpoch
		return nil
	})
	t.Logf("%s took over from %s at epoch %d, %v after break-lease", other.owner, old.owner, epochNew, time.Since(broke).Round(time.Millisecond))
	c.waitReplies(key, 1, 60*time.Second)
	waitFor(t, 30*time.Second, "the turn to be committed", func() error { return c.committed(key, msg.Seq) })

	// The old owner runs again: the server refuses its writes.
	resumeLog := len(old.output())
	old.signal(syscall.SIGCONT)
	noticed := poll(90*time.Second, func() error {
		if !old.alive() {
			return fatalf("the old owner exited after SIGCONT")
		}
		if l := findLine(old.output()[resumeLog:], noticedLossRE); l != "" {
			t.Logf("old owner: %s", l)
			return nil
		}
		return errors.New("no refusal logged yet")
	})
	if noticed != nil {
		t.Fatalf("the old owner logged no refused write after SIGCONT: %v\n%s", noticed, old.output()[resumeLog:])
	}
	waitFor(t, 30*time.Second, "the lane and the mailbox to settle", func() error {
		if err := c.committed(key, msg.Seq); err != nil {
			return err
		}
		if err := c.delivered(); err != nil {
			return err
		}
		return c.inboxSettled()
	})

	// Nothing durable of the old owner after the takeover.
	e := c.mustEntry(key)
	if e.LeaseEpoch < epochNew || e.Owner == old.owner || e.Turn != nil || e.LastTurnID != turnID || e.SessionID != sid {
		t.Errorf("final entry owner %q epoch %d turn %v last turn %s; want the new owner's after epoch %d, turn %s done",
			e.Owner, e.LeaseEpoch, e.Turn, e.LastTurnID, epochNew, turnID)
	}
	lane := session.LaneToken(key)
	took := false
	for _, r := range watch.snapshot() {
		if r.key != lane {
			continue
		}
		if r.epoch == epochNew {
			took = true
		}
		if took && (r.owner == old.owner || r.epoch < epochNew) {
			t.Errorf("entry revision %d after the takeover names owner %q epoch %d", r.rev, r.owner, r.epoch)
		}
	}
	if !took {
		t.Errorf("the entry watcher never saw epoch %d", epochNew)
	}
	entries := c.load(sid)
	fence := -1
	for i, x := range entries {
		if x.Kind == transcript.KindFence && x.Epoch == epochNew {
			fence = i
		}
	}
	if fence < 0 {
		t.Fatalf("no fence of epoch %d in the transcript", epochNew)
	}
	for _, x := range entries[fence+1:] {
		if x.Kind == transcript.KindFence {
			continue
		}
		if x.TurnID != turnID || strings.Contains(x.ID, ":a1:") {
			t.Errorf("entry %s (%s %s) after the new owner's fence is not its attempt of turn %s", x.ID, x.Kind, x.Role, turnID)
		}
	}
	box := c.allReplies(key)
	if len(box) != 1 || box[0].Text != "echo: breaker" || box[0].TurnID != turnID {
		t.Errorf("mailbox %+v, want one reply \"echo: breaker\" of turn %s", box, turnID)
	}
	checkRepliesOnce(t, key, entries, box)
}
