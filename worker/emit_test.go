package worker_test

// What an agent emits during a turn beyond tool calls: streamed deltas
// (ephemeral, core NATS), interim messages (durable, each a reply of its
// own), usage (into the entry's counters), and a partial reply kept when
// the turn is cut short.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
	"github.com/agentfleet/agentfleet/worker"
)

func TestDeltasStreamOnLaneSubject(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	lane := laneFor("deltas")
	ch := make(chan *nats.Msg, 64)
	sub, err := f.nc.ChanSubscribe(f.names.DeltaSubject(lane), ch)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	_, seq := f.send("deltas", "one\ntwo")
	e := f.settled(lane, seq)

	var got []session.Delta
	deadline := time.After(20 * time.Second)
	for len(got) < 2 {
		select {
		case m := <-ch:
			var d session.Delta
			if err := json.Unmarshal(m.Data, &d); err != nil {
				t.Fatalf("delta %q: %v", m.Data, err)
			}
			got = append(got, d)
		case <-deadline:
			t.Fatalf("deltas %+v, want 2", got)
		}
	}
	var text strings.Builder
	for i, d := range got {
		if d.N != i+1 || d.SessionID != e.SessionID || d.TurnID != e.LastTurnID || d.Attempt != 1 {
			t.Errorf("delta %d = %+v (session %s turn %s)", i, d, e.SessionID, e.LastTurnID)
		}
		text.WriteString(d.Text)
	}
	if text.String() != "echo: one\ntwo" {
		t.Errorf("deltas make %q", text.String())
	}
	// Ephemeral: nothing of them in the transcript or the outbox.
	if rs := texts(f.replies(lane), session.ReplyKindReply); !slices.Equal(rs, []string{"echo: one\ntwo"}) {
		t.Errorf("replies %q, want the one reply", rs)
	}
	for _, en := range f.load(e.SessionID) {
		if en.Role == transcript.RoleAssistant && en.Content != "echo: one\ntwo" {
			t.Errorf("transcript has assistant entry %q", en.Content)
		}
	}
}

func TestInterimMessagesAreRepliesInOrder(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	lane, seq := f.send("interim", "!say looking that up…\n!say still looking\nfound")
	e := f.settled(lane, seq)
	rs := f.replies(lane)
	if got, want := texts(rs, session.ReplyKindReply), []string{"looking that up…", "still looking", "echo: found"}; !slices.Equal(got, want) {
		t.Fatalf("replies %q, want %q", got, want)
	}
	var assistants []string
	for _, en := range transcript.Effective(f.load(e.SessionID)) {
		if en.Role == transcript.RoleAssistant {
			assistants = append(assistants, en.Content)
		}
	}
	if want := []string{"looking that up…", "still looking", "echo: found"}; !slices.Equal(assistants, want) {
		t.Errorf("assistant entries %q, want %q", assistants, want)
	}
	for i, r := range rs {
		if r.TurnID != e.LastTurnID || (i > 0 && r.TxSeq <= rs[i-1].TxSeq) {
			t.Errorf("reply %d %+v: wrong turn or out of transcript order", i, r)
		}
	}
}

// usageBackend reports two model calls' usage per turn, then answers.
func usageBackend() agent.Backend {
	a := agent.AgentFunc(func(ctx context.Context, t *agent.Turn, emit agent.Emitter) (*agent.Result, error) {
		for _, u := range []agent.Usage{
			{InputTokens: 100, OutputTokens: 10, CacheReadTokens: 40, CacheWriteTokens: 5, EstimatedCostUSD: 0.25, CostStatus: agent.CostEstimated, PromptTokens: 100},
			{InputTokens: 130, OutputTokens: 20, CacheReadTokens: 60, EstimatedCostUSD: 0.5, CostStatus: agent.CostEstimated, PromptTokens: 130},
		} {
			if err := emit.Usage(ctx, u); err != nil {
				return nil, err
			}
		}
		if strings.Contains(t.Messages[0].Text, "fail") {
			return nil, fmt.Errorf("model refused")
		}
		return &agent.Result{Text: "ok"}, nil
	})
	return agent.BackendFunc(func(context.Context, string, string) (agent.Agent, error) { return a, nil })
}

func TestUsageLandsInEntryCounters(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", mods(noReset, func(c *worker.Config) { c.Backend = usageBackend() }))
	lane, seq := f.send("usage", "hello")
	e := f.settled(lane, seq)
	if e.InputTokens != 230 || e.OutputTokens != 30 || e.CacheReadTokens != 100 || e.CacheWriteTokens != 5 ||
		e.TotalTokens != 260 || e.EstimatedCostUSD != 0.75 || e.CostStatus != agent.CostEstimated || e.LastPromptTokens != 130 {
		t.Fatalf("after one turn: in %d out %d cache r/w %d/%d total %d cost %v %q last prompt %d", e.InputTokens, e.OutputTokens,
			e.CacheReadTokens, e.CacheWriteTokens, e.TotalTokens, e.EstimatedCostUSD, e.CostStatus, e.LastPromptTokens)
	}
	// A failed turn's usage counts too: the tokens were spent.
	_, seq = f.send("usage", "fail please")
	e = f.settled(lane, seq)
	if e.InputTokens != 460 || e.OutputTokens != 60 || e.EstimatedCostUSD != 1.5 {
		t.Errorf("after a failed turn: in %d out %d cost %v", e.InputTokens, e.OutputTokens, e.EstimatedCostUSD)
	}
}

// A turn the user interrupts keeps its partial reply in the transcript
// (not delivered: the next turn answers).
func TestInterruptKeepsPartialReply(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	lane, s0 := f.send("partial", "first words\n!sleep 30s")
	first := f.waitTurn(lane, s0)
	_, s1 := f.send("partial", "next")
	e := f.settled(lane, s1)
	if got := texts(f.replies(lane), session.ReplyKindReply); !slices.Equal(got, []string{"echo: next"}) {
		t.Fatalf("replies %q", got)
	}
	var partial *transcript.Entry
	entries := f.load(e.SessionID)
	for i, en := range entries {
		if en.TurnID == first.ID && en.Role == transcript.RoleAssistant {
			partial = &entries[i]
		}
	}
	if partial == nil || partial.Content != "echo: first words" || partial.FinishReason != "interrupted" {
		t.Fatalf("partial reply of the interrupted turn: %+v", partial)
	}
	if status, ok := transcript.TurnEnded(entries, first.ID); !ok || status != worker.StatusInterrupted {
		t.Errorf("first turn end %q %v", status, ok)
	}
}
