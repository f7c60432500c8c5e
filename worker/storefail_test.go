package worker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

// TestStoreTroubleIsNotAnInterruption: while the msgids bucket is gone (as
// when the cluster has no quorum for it), every attempt of a turn gives up
// before its agent runs. Those attempts are retried but not counted as
// interrupted: the message is answered once the store is back, never
// dead-lettered, however many attempts it took.
func TestStoreTroubleIsNotAnInterruption(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (waits out lease expiries while the store fails); skipped under -short")
	}
	f := newFleet(t)
	f.startWorker("w1", nil)
	if err := f.js.DeleteKeyValue(t.Context(), f.names.MsgIDsBucket()); err != nil {
		t.Fatal(err)
	}
	lane, seq := f.post("hiccup", "are you there?", "h-1")
	natstest.WaitFor(t, 60*time.Second, "more attempts than the dead-letter threshold", func() error {
		e, _, err := f.store.Get(t.Context(), lane)
		if err != nil {
			return err
		}
		if e.Suspended {
			t.Fatalf("the lane was suspended (dead letter) after %d interrupted turns", e.InterruptedTurns)
		}
		if e.Turn == nil || e.Turn.Attempt <= 4 {
			return fmt.Errorf("turn %+v", e.Turn)
		}
		if e.InterruptedTurns > 1 {
			t.Fatalf("interrupted_turns %d at attempt %d: store trouble was counted", e.InterruptedTurns, e.Turn.Attempt)
		}
		return nil
	})
	if _, err := broker.Provision(t.Context(), f.js, broker.ProvisionConfig{Names: f.names, LeaseTTL: testTTL}); err != nil {
		t.Fatal(err)
	}
	r := f.waitReplies(lane, 1)
	e := f.waitCommitted(lane, seq)
	if r[0].Text != "echo: are you there?" || e.Suspended || e.InterruptedTurns != 0 {
		t.Fatalf("reply %q, suspended %v, interrupted_turns %d", r[0].Text, e.Suspended, e.InterruptedTurns)
	}
}

// TestTransientWriteFailureAfterTheAgentRan: the turn's agent has run but
// its reply cannot be written (the transcript stream refuses writes, as a
// stream without quorum does during a partition) for longer than
// MaxInterruptedTurns in-place retries take. The owner, alive all along,
// retries in place: those attempts are not interruptions, so the turn is
// neither dead-lettered nor its lane suspended, and once writes are taken
// again the message is answered exactly once.
func TestTransientWriteFailureAfterTheAgentRan(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (every refused reply append takes seconds); skipped under -short")
	}
	f := newFleet(t)
	refused := refuseRepliesAfterFirstRun(f, 0)
	lane, seq := f.post("partition", "are you there?", "p-1")
	// More agent runs than the dead-letter threshold allows interrupted
	// attempts, every reply refused.
	const runs = worker.MaxInterruptedTurns + 1
	natstest.WaitFor(t, 150*time.Second, fmt.Sprintf("%d agent runs", runs), func() error {
		e, _, err := f.store.Get(t.Context(), lane)
		if err != nil {
			return err
		}
		if e.Suspended || e.InterruptedTurns > 0 {
			t.Fatalf("failed writes of a live owner were counted: suspended %v, interrupted_turns %d", e.Suspended, e.InterruptedTurns)
		}
		if n := refused.runs(); n < runs {
			return fmt.Errorf("%d runs", n)
		}
		return nil
	})
	if got := f.replies(lane); len(got) != 0 {
		t.Fatalf("replies while the transcript refused writes: %+v", got)
	}
	refused.restore(t)
	e := f.waitCommitted(lane, seq)
	if e.Suspended || e.InterruptedTurns != 0 {
		t.Fatalf("suspended %v, interrupted_turns %d", e.Suspended, e.InterruptedTurns)
	}
	// Nothing more comes: one reply, the agent's.
	if _, seq2 := f.post("partition", "and now?", "p-2"); true {
		f.waitCommitted(lane, seq2)
	}
	r := f.waitRepliesLong(lane, 2)
	if len(r) != 2 || r[0].Text != "echo: are you there?" || r[1].Text != "echo: and now?" {
		t.Fatalf("replies %+v, want each message answered once", r)
	}
}

// TestPersistentWriteFailureEnds: past the store retry budget, the attempts
// of a turn whose reply cannot be written count as interrupted again, so a
// write that keeps failing ends as a dead-lettered turn with a notice, not
// as a retry loop for ever.
func TestPersistentWriteFailureEnds(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (every refused reply append takes seconds); skipped under -short")
	}
	f := newFleet(t)
	refused := refuseRepliesAfterFirstRun(f, time.Nanosecond)
	lane, _ := f.post("forever", "are you there?", "f-1")
	// The messages reach the dead-letter subject (another stream) once
	// the attempts are counted again; the notice, in the transcript, waits.
	natstest.WaitFor(t, 240*time.Second, "the message dead-lettered", func() error {
		if _, err := f.res.Events.GetLastMsgForSubject(t.Context(), f.names.DeadLetterSubject(lane)); err != nil {
			e, _, _ := f.store.Get(t.Context(), lane)
			return fmt.Errorf("%w (entry %+v after %d runs)", err, e, refused.runs())
		}
		return nil
	})
	// The dead letter's notice needs the transcript too.
	refused.restore(t)
	natstest.WaitFor(t, 120*time.Second, "the turn dead-lettered", func() error {
		e, _, err := f.store.Get(t.Context(), lane)
		if err != nil {
			return err
		}
		if !e.Suspended || e.Turn != nil {
			return fmt.Errorf("suspended %v, turn %+v", e.Suspended, e.Turn)
		}
		return nil
	})
	r := f.replies(lane)
	if len(r) != 1 || r[0].Kind != session.ReplyKindNotice {
		t.Fatalf("replies %+v, want the dead letter's notice alone", r)
	}
}

// refusedReplies is a worker whose echo agent, on its first run, makes the
// transcript stream refuse every further write (full, discarding new).
type refusedReplies struct {
	f     *fleet
	mu    sync.Mutex
	calls int
	saved *jetstream.StreamConfig
}

// refuseRepliesAfterFirstRun starts a worker (with budget as its store
// retry budget, when set) whose first agent run fills the transcript.
func refuseRepliesAfterFirstRun(f *fleet, budget time.Duration) *refusedReplies {
	rr := &refusedReplies{f: f}
	inner := echo.Backend(echo.Options{})
	backend := agent.BackendFunc(func(ctx context.Context, key, sid string) (agent.Agent, error) {
		a, err := inner.NewAgent(ctx, key, sid)
		if err != nil {
			return nil, err
		}
		return agent.AgentFunc(func(ctx context.Context, turn *agent.Turn, emit agent.Emitter) (*agent.Result, error) {
			rr.mu.Lock()
			rr.calls++
			first := rr.calls == 1
			rr.mu.Unlock()
			if first {
				info, err := f.res.Transcripts.Info(ctx)
				if err != nil {
					return nil, err
				}
				orig, full := info.Config, info.Config
				full.Discard, full.MaxMsgs = jetstream.DiscardNew, int64(info.State.Msgs)
				if _, err := f.js.UpdateStream(ctx, full); err != nil {
					return nil, err
				}
				rr.mu.Lock()
				rr.saved = &orig
				rr.mu.Unlock()
			}
			return a.Run(ctx, turn, emit)
		}), nil
	})
	f.startWorker("w1", func(c *worker.Config) {
		c.Backend = backend
		if budget > 0 {
			c.StoreRetryBudget = budget
		}
	})
	return rr
}

func (rr *refusedReplies) runs() int {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	return rr.calls
}

// restore lets the transcript take writes again.
func (rr *refusedReplies) restore(t *testing.T) {
	t.Helper()
	rr.mu.Lock()
	orig := rr.saved
	rr.mu.Unlock()
	if orig == nil {
		t.Fatal("the transcript was never made to refuse writes")
	}
	if _, err := rr.f.js.UpdateStream(t.Context(), *orig); err != nil {
		t.Fatal(err)
	}
}
