package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
)

// TestPausedPastLivenessFenced pauses the owner of a lane mid-turn (SIGSTOP
// of the real process) for longer than its liveness TTL but far less than
// its lane lease TTL (30s here). The server expires A's liveness lease; B
// takes the lane lease over by a conditional write while A's lane lease is
// still live on the server (no expiry marker of the lane lease in between),
// and completes the turn. Then A is resumed (SIGCONT): its writes are
// refused, nothing durable of A's lands after B's fence, and the user gets
// the reply once.
func TestPausedPastLivenessFenced(t *testing.T) {
	c := newClusterTTL(t, 30*time.Second, 2*time.Second)
	c.startIngress()
	debug := "AGENTFLEET_TELEMETRY_LOG_LEVEL=debug"
	a := c.startWorker("live-a", debug)

	msg := c.post("live-1", "zombie\n!tools 20\n!sleep 3s", "")
	key := msg.SessionKey
	lane := session.LaneToken(key)

	// Every write of the lane's lease key and of A's liveness key.
	type op struct {
		key, owner string
		op         jetstream.KeyValueOp
		rev        uint64
	}
	var mu sync.Mutex
	var ops []op
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	kw, err := c.res.Leases.WatchAll(ctx, jetstream.IncludeHistory())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kw.Stop() })
	liveA := kv.LivenessKey(a.owner)
	go func() {
		for u := range kw.Updates() {
			if u == nil || (u.Key() != lane && u.Key() != liveA) {
				continue
			}
			var v struct {
				Owner string `json:"owner"`
			}
			_ = json.Unmarshal(u.Value(), &v)
			mu.Lock()
			ops = append(ops, op{u.Key(), v.Owner, u.Operation(), u.Revision()})
			mu.Unlock()
		}
	}()

	var sid, turnID string
	var epochA uint64
	waitFor(t, 30*time.Second, "worker A to be mid-turn", func() error {
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

	b := c.startWorker("live-b", debug)
	var epochB uint64
	waitFor(t, 60*time.Second, "worker B to take the lane over and commit the turn", func() error {
		e, err := c.entry(key)
		if err != nil {
			return err
		}
		if e.LeaseEpoch <= epochA || e.Turn != nil || e.CommittedSeq < msg.Seq {
			return fmt.Errorf("owner %q epoch %d committed %d turn %v", e.Owner, e.LeaseEpoch, e.CommittedSeq, e.Turn != nil)
		}
		epochB = e.LeaseEpoch
		return c.delivered()
	})
	t.Logf("B (%s) took over at epoch %d and committed, %v after A (epoch %d) was paused",
		b.owner, epochB, time.Since(stoppedAt).Round(time.Millisecond), epochA)
	if !processStopped(a.pid()) {
		t.Fatalf("A is not stopped")
	}
	if l := findLine(b.output(), regexp.MustCompile(`lane taken over from an owner whose liveness lease is gone`)); l == "" {
		t.Errorf("B did not log a takeover from a dead owner; its log:\n%s", b.output())
	}

	// The lane lease went from A to B by B's conditional write, with no
	// expiry or release of A's lane lease in between; A's liveness lease
	// expired on the server.
	mu.Lock()
	seen := append([]op(nil), ops...)
	mu.Unlock()
	lastA, firstB, liveExpired := -1, -1, false
	for i, o := range seen {
		switch {
		case o.key == liveA && o.op != jetstream.KeyValuePut:
			liveExpired = true
		case o.key == lane && o.op == jetstream.KeyValuePut && o.owner == a.owner && firstB < 0:
			lastA = i
		case o.key == lane && o.op == jetstream.KeyValuePut && o.owner == b.owner && firstB < 0:
			firstB = i
		}
	}
	if !liveExpired {
		t.Errorf("A's liveness key %s saw no expiry marker: %+v", liveA, seen)
	}
	if lastA < 0 || firstB < 0 {
		t.Fatalf("lease writes of A (%d) and B (%d) not both seen: %+v", lastA, firstB, seen)
	}
	for _, o := range seen[lastA+1 : firstB] {
		if o.key == lane {
			t.Errorf("A's lane lease ended (%v at rev %d) before B's takeover: B should have taken it over live", o.op, o.rev)
		}
	}

	// Resume A: it notices the loss and writes nothing that lands.
	from := len(a.output())
	a.signal(syscall.SIGCONT)
	if l := a.waitLog(30*time.Second, noticedLossRE); l != "" {
		t.Logf("A after SIGCONT: %s", l)
	}
	waitFor(t, 30*time.Second, "the lane and the mailbox to settle", func() error {
		if err := c.committed(key, msg.Seq); err != nil {
			return err
		}
		return c.delivered()
	})
	if !a.alive() {
		t.Errorf("A died after SIGCONT; its log since:\n%s", a.output()[from:])
	}
	if e := c.mustEntry(key); e.LeaseEpoch < epochB || e.Owner == a.owner || e.LastTurnID != turnID || e.SessionID != sid {
		t.Errorf("final entry owner %q epoch %d last turn %s session %s; want B's epoch %d, turn %s, session %s",
			e.Owner, e.LeaseEpoch, e.LastTurnID, e.SessionID, epochB, turnID, sid)
	}
	entries := c.load(sid)
	fence := -1
	for i, x := range entries {
		if x.Kind == transcript.KindFence && x.Epoch == epochB {
			fence = i
		}
	}
	if fence < 0 {
		t.Fatalf("no fence of B's epoch %d in the transcript", epochB)
	}
	for _, x := range entries[fence+1:] {
		if strings.Contains(x.ID, ":a1:") || (x.Kind == transcript.KindFence && x.Epoch < epochB) {
			t.Errorf("entry %s (%s %s) of A's attempt landed after B's fence", x.ID, x.Kind, x.Role)
		}
	}
	if n := len(userEntries(entries)); n != 1 {
		t.Errorf("%d user entries, want 1", n)
	}
	if n := c.outboxCount(t, lane); n != 1 {
		t.Errorf("outbox holds %d replies for the lane, want 1", n)
	}
	box := c.allReplies(key)
	if len(box) != 1 || box[0].Text != "echo: zombie" {
		t.Errorf("mailbox %+v, want one reply \"echo: zombie\"", box)
	}
	checkRepliesOnce(t, key, entries, box)
}

// spuriousRE matches what a running worker logs when it finds its liveness
// lease, or a lane lease, gone while it was alive.
var (
	livenessLostRE = regexp.MustCompile(`msg="liveness lease lost while running`)
	laneLostRE     = regexp.MustCompile(`msg="lease lost( with the worker's liveness lease)?"`)
)

// reportSpuriousTakeovers logs, when the test ends, how many times a worker
// that was alive (not killed: a killed one logs nothing more) lost its
// liveness lease or a lane lease, over every incarnation of ws: the
// spurious takeovers of a run whose workers were never paused. The goal is
// zero; a loaded machine is what could make it otherwise.
func reportSpuriousTakeovers(t *testing.T, ws []*workerProc) {
	t.Cleanup(func() {
		live, lanes := 0, 0
		for _, w := range ws {
			data, err := os.ReadFile(w.logPath)
			if err != nil {
				continue
			}
			live += len(livenessLostRE.FindAllIndex(data, -1))
			lanes += len(laneLostRE.FindAllIndex(data, -1))
		}
		t.Logf("spurious takeovers: %d liveness leases and %d lane leases lost by running workers", live, lanes)
	})
}
