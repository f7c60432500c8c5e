package worker_test

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

// readersJS is a JetStream that counts the reads of stream name, by the
// worker's function they come from: its pull loop's wait for the stream
// to come back (reopenInbox), its watcher (watchInboxes), or another.
type readersJS struct {
	jetstream.JetStream
	name                     string
	pull, watcher, elsewhere atomic.Int64
}

func (js *readersJS) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if name == js.name {
		pcs := make([]uintptr, 64)
		frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
		n := &js.elsewhere
		for {
			f, more := frames.Next()
			if strings.Contains(f.Function, "(*Worker).reopenInbox") {
				n = &js.pull
				break
			}
			if strings.Contains(f.Function, "(*Worker).watchInboxes") {
				n = &js.watcher
				break
			}
			if !more {
				break
			}
		}
		n.Add(1)
	}
	return js.JetStream.Stream(ctx, name)
}

// TestGoneInboxStreamReadAgainByTheWatcherAlone: while an inbox stream is
// deleted and not yet made again, one reader of the worker reads it again
// until it is back, the watcher (watchInboxes): the pull loop, told by its
// pull that the consumer was deleted, hands the stream over to it and
// waits, rather than read it again on a schedule of its own (twice the
// reads). The worker takes the new stream as soon as it is made.
func TestGoneInboxStreamReadAgainByTheWatcherAlone(t *testing.T) {
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
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("worker: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("the worker did not stop")
		}
	})
	lane, seq := f.post("gone-1", "before", "b1")
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
	natstest.WaitFor(t, 30*time.Second, "the stream read again while it is away", func() error {
		if handedOver.Load() == 0 {
			return fmt.Errorf("the pull loop was not told the consumer was deleted")
		}
		if n := wjs.watcher.Load(); n < 4 {
			return fmt.Errorf("%d reads by the watcher", n)
		}
		return nil
	})
	if n := wjs.pull.Load(); n != 0 {
		t.Errorf("the pull loop read the stream %d times while it was away (the watcher %d)", n, wjs.watcher.Load())
	}

	// Provisioning is idempotent: a call that times out on a busy machine
	// (each JetStream API call has 5 s) is made again.
	pjs := natstest.JetStream(t, f.srv.Connect(t))
	var nres *broker.Resources
	natstest.WaitFor(t, 60*time.Second, "the stream provisioned again", func() error {
		var err error
		nres, err = broker.Provision(t.Context(), pjs, broker.ProvisionConfig{Names: f.names, LeaseTTL: testTTL})
		return err
	})
	natstest.WaitFor(t, 30*time.Second, "the worker on the new stream", func() error {
		if id, stale := worker.InboxIDOf(w, stream); id != nres.InboxID || stale {
			return fmt.Errorf("the worker has incarnation %s (stale %v), want %s", id, stale, nres.InboxID)
		}
		return nil
	})
	lane, seq = f.post("gone-2", "after", "a1")
	f.waitCommittedIn(lane, seq, nres.InboxID, "a message of the new stream committed", 30*time.Second)
	if n := wjs.pull.Load(); n != 0 {
		t.Errorf("the pull loop read the stream %d times while it was away", n)
	}
}
