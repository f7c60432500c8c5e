package worker_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/test/natstest"
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
