package worker_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

// TestFenceFailureRetriedInPlace: a takeover whose fence cannot be written
// (here the transcript stream is gone for a while; in a loaded cluster the
// transcript load timed out) keeps the lease and retries the fence in
// place, so the lane is answered under the epoch it was taken with once the
// stream is back. Giving the lane up instead left the lease held until it
// ran out, and the next attempt took a new epoch. Every message is answered
// exactly once, in order.
func TestFenceFailureRetriedInPlace(t *testing.T) {
	f := newFleet(t)
	_, stop1 := f.startStoppable("w1", nil)
	lane, seq := f.post("fr", "hello", "m1")
	f.waitReplies(lane, 1)
	f.waitCommitted(lane, seq)
	stop1()

	logs := &lineCounter{}
	f.startWorker("w2", func(c *worker.Config) { c.Logger = slog.New(logs) })
	t.Cleanup(func() {
		if t.Failed() {
			logs.mu.Lock()
			defer logs.mu.Unlock()
			for _, l := range logs.lines {
				t.Log(l)
			}
		}
	})
	// Starting a worker provisions the streams: delete the transcripts now.
	if err := f.js.DeleteStream(t.Context(), f.names.TranscriptStream()); err != nil {
		t.Fatal(err)
	}
	f.post("fr", "again", "m2")

	// The take-over write lands, then the fence fails.
	var epoch uint64
	natstest.WaitFor(t, 30*time.Second, "w2 takes the lane and its fence fails", func() error {
		e, _, err := f.store.Get(t.Context(), lane)
		if err != nil {
			return err
		}
		if !strings.HasPrefix(e.Owner, "w2") {
			return fmt.Errorf("owner %q", e.Owner)
		}
		if logs.count("fence") == 0 {
			return fmt.Errorf("no failed fence yet")
		}
		epoch = e.LeaseEpoch
		return nil
	})
	if _, err := broker.Provision(t.Context(), f.js, broker.ProvisionConfig{Names: f.names, LeaseTTL: testTTL}); err != nil {
		t.Fatal(err)
	}
	f.waitReplies(lane, 2)
	e, _, err := f.store.Get(t.Context(), lane)
	if err != nil {
		t.Fatal(err)
	}
	if e.LeaseEpoch != epoch {
		t.Fatalf("answered under epoch %d, the lane was taken with %d: the lane was given up after its fence failed (%d lines about a failed takeover)",
			e.LeaseEpoch, epoch, logs.count("take ownership"))
	}
	// Afterwards every message is answered exactly once, in order: w2
	// answered neither the message w1 had committed nor its own twice. A
	// last message, answered behind them, closes the lane's answers.
	_, last := f.post("fr", "done", "m3")
	f.waitCommitted(lane, last)
	f.waitReplies(lane, 3)
	f.checkAnsweredOnce(lane, "hello", "again", "done")
}

// lineCounter is a slog.Handler that counts the lines whose message
// contains a string.
type lineCounter struct {
	mu    sync.Mutex
	lines []string
}

func (c *lineCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *lineCounter) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *lineCounter) WithGroup(string) slog.Handler            { return c }
func (c *lineCounter) Handle(_ context.Context, r slog.Record) error {
	line := r.Message
	r.Attrs(func(a slog.Attr) bool {
		line += " " + a.String()
		return true
	})
	c.mu.Lock()
	c.lines = append(c.lines, line)
	c.mu.Unlock()
	return nil
}

func (c *lineCounter) count(sub string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, l := range c.lines {
		if strings.Contains(l, sub) && strings.Contains(l, "error") {
			n++
		}
	}
	return n
}
