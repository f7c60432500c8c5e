package e2e

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
)

// TestStoreStallMidTurn pauses the NATS server (SIGSTOP) for 6.5s — longer
// than one transcript append's 5s write timeout, shorter than the lease
// survives (TTL 15s, margin 2s) — while a worker is appending tool entries.
// DESIGN §4 fencing rule 4: an ambiguous outcome is resolved by reading the
// tail, never taken for a lost lease, and it is not an agent error. So once
// NATS is back the turn completes with every tool entry once and its reply
// delivered once, and the user gets no "something went wrong" notice.
func TestStoreStallMidTurn(t *testing.T) {
	const ttl = 15 * time.Second
	c := newClusterTTL(t, ttl, 2*time.Second)
	c.startIngress()
	w := c.startWorker("stall-1", "AGENTFLEET_TELEMETRY_LOG_LEVEL=debug")

	const tools = 1000
	msg := c.post("stall-1", fmt.Sprintf("stall\n!tools %d", tools), "")
	var sid, turnID string
	var before int
	waitFor(t, 20*time.Second, "the worker to be appending tool entries", func() error {
		e, err := c.entry(msg.SessionKey)
		if err != nil {
			return err
		}
		if e.Turn == nil {
			return fmt.Errorf("no turn yet (committed %d)", e.CommittedSeq)
		}
		n := 0
		for _, x := range c.load(e.Turn.SessionID) {
			if x.Role == transcript.RoleTool {
				n++
			}
		}
		if n < 4 {
			return fmt.Errorf("%d tool results", n)
		}
		sid, turnID, before = e.Turn.SessionID, e.Turn.ID, n
		return nil
	})

	// The fault itself lasts a fixed time: this timer is the stall, not a
	// wait for some state.
	c.nats.signal(syscall.SIGSTOP)
	stoppedAt := time.Now()
	stall := time.NewTimer(6500 * time.Millisecond)
	<-stall.C
	c.nats.signal(syscall.SIGCONT)
	resumed := time.Now()
	t.Logf("NATS paused for %v after %d of %d tool results", resumed.Sub(stoppedAt).Round(time.Millisecond), before, tools)

	waitFor(t, 3*ttl, "the lane to settle after the stall", func() error {
		if err := c.committed(msg.SessionKey, msg.Seq); err != nil {
			return err
		}
		if err := c.delivered(); err != nil {
			return err
		}
		return c.inboxSettled()
	})
	t.Logf("lane settled %v after NATS resumed", time.Since(resumed).Round(time.Millisecond))
	if !w.alive() {
		t.Errorf("the worker died during the stall")
	}

	entries := c.load(sid)
	ends := turnEnds(entries)[turnID]
	if len(ends) == 0 || ends[len(ends)-1].Status != transcript.StatusCompleted {
		t.Errorf("turn %s ended %+v after a 6.5s store stall, want completed", turnID, ends)
	}
	calls, results := map[string]int{}, map[string]int{}
	for _, x := range transcript.Effective(entries) {
		for _, tc := range x.ToolCalls {
			calls[tc.ID]++
		}
		if x.Role == transcript.RoleTool {
			results[x.ToolCallID]++
		}
	}
	if len(calls) != tools || len(results) != tools {
		t.Errorf("%d tool calls and %d tool results, want %d each", len(calls), len(results), tools)
	}
	for id, n := range calls {
		if n != 1 || results[id] != 1 {
			t.Errorf("tool call %s recorded %d times with %d results, want once each", id, n, results[id])
		}
	}
	box := c.allReplies(msg.SessionKey)
	var replies, notices []reply
	for _, r := range box {
		if r.Kind == session.ReplyKindNotice {
			notices = append(notices, r)
		} else {
			replies = append(replies, r)
		}
	}
	if len(notices) > 0 {
		t.Errorf("the user was told the turn failed because the store stalled: %+v", notices)
	}
	if len(replies) != 1 || replies[0].Text != "echo: stall" {
		t.Errorf("replies %+v, want one \"echo: stall\"", replies)
	}
	checkRepliesOnce(t, msg.SessionKey, entries, box)
}
