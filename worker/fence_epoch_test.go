package worker_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/transcript"
)

// TestNoFenceAfterANewerEpochsFence: an owner whose transcript already holds
// the fence of a newer lease epoch (a worker that took the lane after it,
// e.g. on a takeover decided from a lagging replica's read of its liveness
// lease) must not fence on top of it: it gives the lane up. Without the
// check its fence, and then its turn, land after the newer owner's fence.
// Its later attempts (the lane is woken again when its lease expires) give
// the lane up too, so the first message stays answered exactly once and the
// second is left to the newer owner.
func TestNoFenceAfterANewerEpochsFence(t *testing.T) {
	f := newFleet(t)
	_, stop1 := f.startStoppable("w1", nil)
	lane, seq := f.post("c1", "hello", "m1")
	f.waitReplies(lane, 1)
	e := f.waitCommitted(lane, seq)
	stop1()

	// A newer owner's fence, of an epoch above any lease this test takes.
	const newer = uint64(1) << 40
	_, last, err := f.tx.Load(t.Context(), e.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.tx.Append(t.Context(), e.SessionID, last, &transcript.Entry{Kind: transcript.KindFence, Epoch: newer, Owner: "w9/newer"}); err != nil {
		t.Fatal(err)
	}

	w2 := f.startWorker("w2", nil)
	f.post("c1", "again", "m2")
	// Either w2 gives the lane up (the fix), or it takes it and answers.
	natstest.WaitFor(t, 30*time.Second, "w2 gives the lane up or answers", func() error {
		if w2.Stats().LeasesLost.Load() > 0 || len(f.replies(lane)) >= 2 {
			return nil
		}
		return fmt.Errorf("lost %d, replies %d", w2.Stats().LeasesLost.Load(), len(f.replies(lane)))
	})
	// The lane is woken again when w2's lease expires (m2 waits): its next
	// attempt must give the lane up too.
	natstest.WaitFor(t, 60*time.Second, "w2 tries the lane again and gives it up again, or answers", func() error {
		if w2.Stats().LeasesLost.Load() >= 2 || len(f.replies(lane)) >= 2 {
			return nil
		}
		return fmt.Errorf("lost %d, replies %d", w2.Stats().LeasesLost.Load(), len(f.replies(lane)))
	})
	// Afterwards m1 is answered exactly once, and m2 not at all: the lane
	// is the newer owner's (an answer of w2's would overtake it).
	f.checkAnsweredOnce(lane, "hello")
	entries, _, err := f.tx.Load(t.Context(), e.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	var fence uint64
	for _, x := range entries {
		if x.Kind != transcript.KindFence {
			continue
		}
		if x.Epoch <= fence {
			t.Fatalf("fence of epoch %d (seq %d, %s) after a fence of epoch %d", x.Epoch, x.Seq, x.Owner, fence)
		}
		fence = x.Epoch
	}
}
