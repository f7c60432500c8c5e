package broker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// heldStreamJS is a JetStream whose next stream read, once hold is called,
// is answered by the server and then held back from its caller until
// release is called: a read answered just before what happens meanwhile.
type heldStreamJS struct {
	jetstream.JetStream
	mu   sync.Mutex
	next *streamHold
}

type streamHold struct {
	answered chan struct{} // closed when the held read has its answer
	release  chan struct{}
}

func (js *heldStreamJS) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	st, err := js.JetStream.Stream(ctx, name)
	js.mu.Lock()
	h := js.next
	js.next = nil
	js.mu.Unlock()
	if h != nil {
		close(h.answered)
		select {
		case <-h.release:
		case <-ctx.Done():
		}
	}
	return st, err
}

// hold makes the next stream read wait, once answered, for release.
func (js *heldStreamJS) hold() *streamHold {
	h := &streamHold{answered: make(chan struct{}), release: make(chan struct{})}
	js.mu.Lock()
	js.next = h
	js.mu.Unlock()
	return h
}

// TestReopenKeepsTheIncarnationAnotherReaderInstalled: two readers reopen
// the same Inbox of a stream that is deleted and made again twice. The
// first one's read is answered (second incarnation) just before the second
// deletion; the other reader's read finds the third incarnation and
// installs it. When the first reader goes on, the set keeps the third: an
// older read does not replace what another reader installed, nor mark it
// stale.
func TestReopenKeepsTheIncarnationAnotherReaderInstalled(t *testing.T) {
	srv := natstest.RunServer(t)
	names := broker.MustNames("fleet")
	admin := natstest.JetStream(t, srv.Connect(t))
	remake := func() string {
		t.Helper()
		if err := admin.DeleteStream(t.Context(), names.InboxStream()); err != nil {
			t.Fatal(err)
		}
		res, err := broker.Provision(t.Context(), admin, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return res.InboxID
	}
	if _, err := broker.Provision(t.Context(), admin, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second}); err != nil {
		t.Fatal(err)
	}
	js := &heldStreamJS{JetStream: natstest.JetStream(t, srv.Connect(t))}
	set, err := broker.OpenInboxes(t.Context(), js, names, true)
	if err != nil {
		t.Fatal(err)
	}
	first := set.ForPartition(0)
	changed := set.Changed()

	second := remake()
	// The slow reader: its read finds the second incarnation, and is held.
	h := js.hold()
	type result struct {
		in  *broker.Inbox
		err error
	}
	slow := make(chan result, 1)
	go func() {
		in, err := set.Reopen(t.Context(), first, true)
		slow <- result{in, err}
	}()
	select {
	case <-h.answered:
	case <-time.After(30 * time.Second):
		t.Fatal("the slow reader's read was not answered")
	}

	third := remake()
	if third == second {
		t.Fatalf("the stream was made again with the same identity %s", third)
	}
	// The other reader finds the third incarnation and installs it.
	installed, err := set.Reopen(t.Context(), first, true)
	if err != nil {
		t.Fatal(err)
	}
	if installed.ID != third || set.ForPartition(0) != installed {
		t.Fatalf("the other reader's Reopen gave identity %s (set has %p, reopen gave %p), want %s", installed.ID, set.ForPartition(0), installed, third)
	}
	select {
	case <-changed:
	default:
		t.Fatal("the set took the third incarnation without signalling a change")
	}

	close(h.release)
	var got result
	select {
	case got = <-slow:
	case <-time.After(30 * time.Second):
		t.Fatal("the slow reader's Reopen did not return")
	}
	if got.err != nil {
		t.Fatalf("the slow reader's Reopen: %v", got.err)
	}
	if cur := set.ForPartition(0); cur != installed {
		t.Fatalf("the set has identity %s after the slow reader's Reopen, want the installed %s", cur.ID, third)
	}
	if got.in != installed {
		t.Fatalf("the slow reader's Reopen returned identity %s, want the installed %s", got.in.ID, third)
	}
	if installed.Stale() {
		t.Fatal("the installed incarnation was marked stale by an older read")
	}
	if !first.Stale() {
		t.Fatal("the first incarnation is not stale")
	}
	if all := set.All(); len(all) != 1 || all[0] != installed {
		t.Fatalf("All() = %v, want only the installed incarnation", all)
	}
}
