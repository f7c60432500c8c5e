package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
)

// entryRev is one stored revision of a SessionEntry, as a KV watcher saw it.
type entryRev struct {
	rev       uint64
	key       string
	owner     string
	epoch     uint64
	committed uint64
	turn      string
	at        time.Time
	// The lifecycle flags a deploy must never set.
	suspended, resumePending bool
	interrupted              int
}

// entryWatcher records every revision of every SessionEntry while it runs.
type entryWatcher struct {
	mu   sync.Mutex
	revs []entryRev
	stop func()
}

func watchEntries(t *testing.T, c *cluster) *entryWatcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	kw, err := c.res.Sessions.WatchAll(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	w := &entryWatcher{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for u := range kw.Updates() {
			if u == nil || u.Operation() != jetstream.KeyValuePut {
				continue
			}
			var e session.SessionEntry
			if json.Unmarshal(u.Value(), &e) != nil {
				continue
			}
			r := entryRev{rev: u.Revision(), key: u.Key(), owner: e.Owner, epoch: e.LeaseEpoch, committed: e.CommittedSeq, at: time.Now(),
				suspended: e.Suspended, resumePending: e.ResumePending, interrupted: e.InterruptedTurns}
			if e.Turn != nil {
				r.turn = e.Turn.ID
			}
			w.mu.Lock()
			w.revs = append(w.revs, r)
			w.mu.Unlock()
		}
	}()
	w.stop = func() {
		_ = kw.Stop()
		cancel()
		<-done
	}
	t.Cleanup(w.stop)
	return w
}

func (w *entryWatcher) snapshot() []entryRev {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]entryRev(nil), w.revs...)
}

// noticedLossRE matches what a worker logs when it finds it lost a lane
// ("agent failed" is what it logs when its append timed out during the
// pause: see the note in TestZombieFencing).
var noticedLossRE = regexp.MustCompile(`lease lost|turn abandoned|transcript conflict|msg="agent failed"`)

var misreadTimeoutRE = regexp.MustCompile(`msg="agent failed".*gateway timeout`)

// TestZombieFencing pauses the owner of a lane mid-turn (SIGSTOP) until a
// second worker has taken the lane over and completed the turn, then resumes
// it (SIGCONT): the paused worker must change nothing durable afterwards — no
// transcript entry after the new owner's fence, no reply, no entry update.
func TestZombieFencing(t *testing.T) {
	c := newCluster(t)
	c.startIngress()
	watch := watchEntries(t, c)
	debug := "AGENTFLEET_TELEMETRY_LOG_LEVEL=debug"
	a := c.startWorker("zombie-a", debug)

	const tools = 40
	msg := c.post("zombie-1", fmt.Sprintf("zombie\n!tools %d\n!sleep 4s", tools), "")
	key := msg.SessionKey

	// A is mid-turn: it owns the lane, a turn is recorded, and tool calls
	// are landing in the transcript.
	var sid, turnID string
	var epochA uint64
	waitFor(t, 20*time.Second, "worker A to be mid-turn", func() error {
		e, err := c.entry(key)
		if err != nil {
			return err
		}
		if e.Owner != a.owner || e.Turn == nil {
			return fmt.Errorf("owner %q, turn %v", e.Owner, e.Turn != nil)
		}
		n := 0
		for _, x := range c.load(e.Turn.SessionID) {
			if x.Role == transcript.RoleTool {
				n++
			}
		}
		if n < 2 {
			return fmt.Errorf("%d tool results so far", n)
		}
		sid, turnID, epochA = e.Turn.SessionID, e.Turn.ID, e.LeaseEpoch
		return nil
	})
	a.signal(syscall.SIGSTOP)
	stoppedAt := time.Now()
	if e := c.mustEntry(key); e.Owner != a.owner || e.Turn == nil || e.Turn.ID != turnID {
		t.Fatalf("the turn ended before A was paused: %+v", e)
	}
	aTools := 0
	for _, x := range c.load(sid) {
		if x.Role == transcript.RoleTool {
			aTools++
		}
	}
	t.Logf("A (%s) paused at epoch %d in turn %s after %d of %d tool results", a.owner, epochA, turnID, aTools, tools)

	// B takes the lane over once A's lease has expired, and completes the turn.
	b := c.startWorker("zombie-b", debug)
	var epochB uint64
	waitFor(t, 30*time.Second, "worker B to take the lane over", func() error {
		e, err := c.entry(key)
		if err != nil {
			return err
		}
		if e.Owner != b.owner || e.LeaseEpoch <= epochA {
			return fmt.Errorf("owner %q epoch %d", e.Owner, e.LeaseEpoch)
		}
		epochB = e.LeaseEpoch
		return nil
	})
	tookOver := time.Since(stoppedAt)
	c.waitReplies(key, 1, 30*time.Second)
	waitFor(t, 30*time.Second, "B to commit the turn", func() error { return c.committed(key, msg.Seq) })
	t.Logf("B (%s) took over at epoch %d %v after the pause, committed %v after it",
		b.owner, epochB, tookOver.Round(time.Millisecond), time.Since(stoppedAt).Round(time.Millisecond))

	// Resume A and let it run until it has noticed the loss (or 2×TTL).
	resumeLog := len(a.output())
	a.signal(syscall.SIGCONT)
	resumedAt := time.Now()
	noticed := poll(2*leaseTTL, func() error {
		if !a.alive() {
			return fatalf("A exited after SIGCONT")
		}
		if l := findLine(a.output()[resumeLog:], noticedLossRE); l != "" {
			t.Logf("A noticed %v after SIGCONT: %s", time.Since(resumedAt).Round(time.Millisecond), l)
			if misreadTimeoutRE.MatchString(l) {
				// Not an invariant violation (nothing durable changed, as
				// checked below), but a misreading: the append that was in
				// flight when A was paused ran out of its 5s write timeout,
				// and the worker reports the store's context.DeadlineExceeded
				// as the agent exceeding agent.gateway_timeout, and takes the
				// failed-turn path (error notice, commit as failed), which
				// only the self-fence stops here.
				t.Logf("NOTE: A took its timed-out append for an agent failure (gateway timeout)")
			}
			return nil
		}
		return errors.New("A has not logged the loss")
	})
	if errors.Is(noticed, errFatal) {
		t.Fatal(noticed)
	}
	if noticed != nil {
		t.Logf("A logged nothing about the loss within %v of SIGCONT; its log since:\n%s", 2*leaseTTL, a.output()[resumeLog:])
	}
	waitFor(t, 20*time.Second, "the lane and the mailbox to settle", func() error {
		if err := c.committed(key, msg.Seq); err != nil {
			return err
		}
		if err := c.delivered(); err != nil {
			return err
		}
		return c.inboxSettled()
	})
	if !a.alive() {
		t.Errorf("A died after SIGCONT")
	}

	// The entry is B's.
	e := c.mustEntry(key)
	if e.LeaseEpoch != epochB || (e.Owner != b.owner && e.Owner != "") || e.CommittedSeq < msg.Seq || e.Turn != nil ||
		e.LastTurnID != turnID || e.SessionID != sid {
		t.Errorf("final entry owner %q epoch %d committed %d turn %v last turn %s session %s; want B's (%s, epoch %d), %d, none, %s, %s",
			e.Owner, e.LeaseEpoch, e.CommittedSeq, e.Turn, e.LastTurnID, e.SessionID, b.owner, epochB, msg.Seq, turnID, sid)
	}
	// No entry revision by A once B took over.
	lane := session.LaneToken(key)
	took := false
	for _, r := range watch.snapshot() {
		if r.key != lane {
			continue
		}
		if r.epoch == epochB {
			took = true
		}
		if took && (r.owner == a.owner || r.epoch < epochB) {
			t.Errorf("entry revision %d written after B's takeover names owner %q epoch %d (A is %s, epoch %d)",
				r.rev, r.owner, r.epoch, a.owner, epochA)
		}
	}
	if !took {
		t.Errorf("the entry watcher never saw B's epoch %d", epochB)
	}

	// The transcript: after B's fence, only B's attempt of the turn.
	entries := c.load(sid)
	fence := -1
	for i, x := range entries {
		if x.Kind == transcript.KindFence && x.Epoch == epochB {
			if x.Owner != b.owner {
				t.Errorf("fence of epoch %d names %s, want B %s", epochB, x.Owner, b.owner)
			}
			fence = i
		}
	}
	if fence < 0 {
		t.Fatalf("no fence of B's epoch %d in the transcript", epochB)
	}
	bCalls := 0
	for _, x := range entries[fence+1:] {
		switch {
		case x.Kind == transcript.KindFence && x.Epoch > epochB:
			t.Logf("a later owner fenced the transcript: %s epoch %d", x.Owner, x.Epoch)
		case x.TurnID != turnID:
			t.Errorf("entry %s (%s) after B's fence belongs to turn %q, not %s", x.ID, x.Kind, x.TurnID, turnID)
		case strings.Contains(x.ID, ":a1:"):
			t.Errorf("entry %s (%s %s) of A's attempt landed after B's fence", x.ID, x.Kind, x.Role)
		case len(x.ToolCalls) > 0:
			bCalls++
		}
	}
	for _, x := range entries[:fence] {
		if x.TurnID == turnID && (strings.Contains(x.ID, ":a2:") || x.Kind == transcript.KindTurnEnd || x.ID == turnID+":reply") {
			t.Errorf("entry %s (%s) of B's attempt before B's fence", x.ID, x.Kind)
		}
	}
	if bCalls != tools {
		t.Errorf("B's attempt recorded %d tool calls after its fence, want %d", bCalls, tools)
	}
	if n := len(userEntries(entries)); n != 1 {
		t.Errorf("%d user entries, want 1", n)
	}

	// The mailbox: the turn's reply, once, from the session.
	box := c.allReplies(key)
	if len(box) != 1 || box[0].Text != "echo: zombie" || box[0].TurnID != turnID || box[0].SessionID != sid {
		t.Errorf("mailbox %+v, want one reply \"echo: zombie\" of turn %s", box, turnID)
	}
	checkRepliesOnce(t, key, entries, box)

	// The events: A started attempt 1 and never ended it; B ran attempt 2.
	var aStarts, bStarts, ends int
	for _, ev := range c.turnEvents() {
		switch {
		case ev.Owner == a.owner && ev.Type == "start" && ev.Epoch == epochA:
			aStarts++
		case ev.Owner == a.owner:
			t.Errorf("event of A after its start: %+v", ev)
		case ev.Owner == b.owner && ev.Type == "start" && ev.Epoch == epochB && ev.Attempt == 2:
			bStarts++
		case ev.Owner == b.owner && ev.Type == "end" && ev.Epoch == epochB && ev.Status == "completed":
			ends++
		default:
			t.Errorf("unexpected turn event %+v", ev)
		}
	}
	if aStarts != 1 || bStarts != 1 || ends != 1 {
		t.Errorf("turn events: %d starts by A, %d by B, %d ends; want 1, 1, 1", aStarts, bStarts, ends)
	}
}
