package worker_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

// TestGoneInboxStreamWaitEndsAtDrain: a pull loop that handed its deleted
// inbox stream to the watcher and waits for it to come back stops waiting
// when the worker drains (Run's context cancelled), while the stream is
// still away and the watcher reads it again with backoff: Run returns, with
// no error, and leaves no goroutine (TestMain).
func TestGoneInboxStreamWaitEndsAtDrain(t *testing.T) {
	f := newFleet(t)
	stream := f.names.InboxStream()
	wnc := f.srv.Connect(t)
	wjs := &readersJS{JetStream: natstest.JetStream(t, wnc), name: stream}
	wres, err := broker.Provision(t.Context(), wjs, broker.ProvisionConfig{Names: f.names, LeaseTTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	var handedOver atomic.Int64
	log := slog.New(countingHandler{next: slog.Default().Handler(), msg: "reopen inbox stream", stream: stream, n: &handedOver})
	w, err := worker.New(wnc, wjs, wres, worker.Config{ID: "w1", Names: f.names, Backend: echo.Backend(echo.Options{}), LeaseTTL: testTTL,
		LeaseMargin: 500 * time.Millisecond, Linger: 200 * time.Millisecond, PeekInterval: 100 * time.Millisecond,
		DrainTimeout: 2 * time.Second, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	lane, seq := f.post("gone-drain", "before", "b1")
	f.waitCommitted(lane, seq)
	cons, err := f.res.Inbox.Consumer(t.Context(), f.names.WorkersConsumer())
	if err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 30*time.Second, "the worker's pull waiting on the server", func() error {
		info, err := cons.Info(t.Context())
		if err != nil {
			return err
		}
		if info.NumWaiting == 0 {
			return fmt.Errorf("no pull waiting")
		}
		return nil
	})

	if err := f.js.DeleteStream(t.Context(), stream); err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 30*time.Second, "the stream handed to the watcher, read again while it is away", func() error {
		if handedOver.Load() == 0 {
			return fmt.Errorf("the pull loop was not told the consumer was deleted")
		}
		if n := wjs.watcher.Load(); n < 2 {
			return fmt.Errorf("%d reads by the watcher", n)
		}
		return nil
	})
	if id, stale := worker.InboxIDOf(w, stream); id != wres.InboxID || !stale {
		t.Fatalf("before the drain: the worker has incarnation %s (stale %v), want %s stale: the stream is away", id, stale, wres.InboxID)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("worker: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the worker did not stop: its pull loop still waits for the stream to come back")
	}
	if _, stale := worker.InboxIDOf(w, stream); !stale {
		t.Errorf("the stream came back during the drain: the test did not see the wait end while it was away")
	}
}
