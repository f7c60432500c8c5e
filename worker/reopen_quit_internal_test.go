package worker

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// streamReads is a JetStream that counts the reads of stream name.
type streamReads struct {
	jetstream.JetStream
	name string
	n    atomic.Int64
}

func (js *streamReads) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if name == js.name {
		js.n.Add(1)
	}
	return js.JetStream.Stream(ctx, name)
}

// TestReopenInboxWaitEndsAtQuit: the wait of reopenInbox for a deleted
// inbox stream to come back ends when its pull's quit is closed (Run stops
// its pulls so when it fails to start), while the stream is still away and
// the watcher reads it again with backoff. Cancelling Run's context takes
// the drain's way instead (TestGoneInboxStreamWaitEndsAtDrain); quit is
// closed by Run only on a failed start, so the wait is called here directly.
func TestReopenInboxWaitEndsAtQuit(t *testing.T) {
	srv := natstest.RunServer(t)
	nc := srv.Connect(t)
	names := broker.MustNames("fleet")
	wjs := &streamReads{JetStream: natstest.JetStream(t, nc), name: names.InboxStream()}
	res, err := broker.Provision(t.Context(), wjs, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(nc, wjs, res, Config{ID: "w1", Names: names, Backend: echo.Backend(echo.Options{}), LeaseTTL: 3 * time.Second,
		LeaseMargin: 500 * time.Millisecond, DrainTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	stop := runWorker(t, w, "w1")
	in := w.inboxes.ByName(names.InboxStream())
	if in == nil {
		t.Fatal("no inbox stream in the set")
	}

	before := wjs.n.Load()
	if err := natstest.JetStream(t, srv.Connect(t)).DeleteStream(t.Context(), in.Name); err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 30*time.Second, "the stream marked stale, read again while it is away", func() error {
		if !in.Stale() {
			return fmt.Errorf("not stale yet")
		}
		if n := wjs.n.Load() - before; n < 2 {
			return fmt.Errorf("%d reads since the deletion", n)
		}
		return nil
	})

	quit := make(chan struct{})
	returned := make(chan struct{})
	go func() { defer close(returned); w.reopenInbox(in, quit) }()
	close(quit)
	select {
	case <-returned:
	case <-time.After(60 * time.Second):
		t.Fatal("reopenInbox did not return when quit was closed")
	}
	if w.inboxes.ByName(in.Name) != in || w.draining() {
		t.Fatalf("the wait ended for another reason (stream back: %v, draining: %v)", w.inboxes.ByName(in.Name) != in, w.draining())
	}
	stop()
}
