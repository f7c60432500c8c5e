package broker_test

import (
	"context"
	"errors"
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

// TestReopenReplacesAnOlderIncarnationAnotherReaderInstalled: two readers
// reopen the same Inbox of a stream that is deleted and made again twice.
// The first one's read is answered (second incarnation) just before the
// second deletion, the other's (third incarnation) after it; the first
// installs the second incarnation, then the other goes on. Its read is the
// newer: it must not take the second incarnation, which the set has now, as
// current (it would be trusted until the next check), but leave the set
// with the third, and the second stale.
func TestReopenReplacesAnOlderIncarnationAnotherReaderInstalled(t *testing.T) {
	srv := natstest.RunServer(t)
	names := broker.MustNames("fleet")
	admin := natstest.JetStream(t, srv.Connect(t))
	provision := func() string {
		t.Helper()
		res, err := broker.Provision(t.Context(), admin, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return res.InboxID
	}
	remake := func() string {
		t.Helper()
		if err := admin.DeleteStream(t.Context(), names.InboxStream()); err != nil {
			t.Fatal(err)
		}
		return provision()
	}
	provision()
	js := &heldStreamJS{JetStream: natstest.JetStream(t, srv.Connect(t))}
	set, err := broker.OpenInboxes(t.Context(), js, names, true)
	if err != nil {
		t.Fatal(err)
	}
	first := set.ForPartition(0)
	type result struct {
		in  *broker.Inbox
		err error
	}
	reopen := func(h *streamHold) chan result {
		out := make(chan result, 1)
		go func() {
			in, err := set.Reopen(t.Context(), first, true)
			out <- result{in, err}
		}()
		select {
		case <-h.answered:
		case <-time.After(30 * time.Second):
			t.Fatal("a reader's read was not answered")
		}
		return out
	}
	wait := func(c chan result, who string) result {
		t.Helper()
		select {
		case r := <-c:
			if r.err != nil {
				t.Fatalf("%s Reopen: %v", who, r.err)
			}
			return r
		case <-time.After(30 * time.Second):
			t.Fatalf("%s Reopen did not return", who)
		}
		return result{}
	}

	second := remake()
	h1 := js.hold()
	older := reopen(h1) // answered: the second incarnation
	third := remake()
	if third == second {
		t.Fatalf("the stream was made again with the same identity %s", third)
	}
	h2 := js.hold()
	newer := reopen(h2) // answered: the third incarnation
	close(h1.release)
	installed := wait(older, "the older reader's").in
	if installed.ID != second || set.ForPartition(0) != installed {
		t.Fatalf("the older reader's Reopen gave identity %s, want %s installed", installed.ID, second)
	}
	changed := set.Changed()
	close(h2.release)
	got := wait(newer, "the newer reader's").in
	cur := set.ForPartition(0)
	if cur.ID != third || cur.Stale() {
		t.Fatalf("after the newer reader's Reopen the set has identity %s (stale %v), want the current %s", cur.ID, cur.Stale(), third)
	}
	if got != cur {
		t.Fatalf("the newer reader's Reopen returned identity %s, want the set's %s", got.ID, cur.ID)
	}
	if !installed.Stale() {
		t.Fatal("the older incarnation the other reader installed is not stale")
	}
	select {
	case <-changed:
	default:
		t.Fatal("the set took the third incarnation without signalling a change")
	}
}

// TestReopenOfAStreamTheMapDropped: once the inbox map no longer names a
// stream (a migration removed it), Reopen of its Inbox installs nothing
// and signals no change, whatever it finds: the same incarnation (returned
// as it is), another one (returned, not named by the set; the old one
// stale) or none (an error; the old one stale).
func TestReopenOfAStreamTheMapDropped(t *testing.T) {
	srv := natstest.RunServer(t)
	names := broker.MustNames("fleet")
	admin := natstest.JetStream(t, srv.Connect(t))
	if _, err := broker.Provision(t.Context(), admin, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second, InboxStreams: 2}); err != nil {
		t.Fatal(err)
	}
	set, err := broker.OpenInboxes(t.Context(), natstest.JetStream(t, srv.Connect(t)), names, true)
	if err != nil {
		t.Fatal(err)
	}
	two, _ := set.Map()
	dropped := set.ByName(names.InboxStreamAt(1))
	if dropped == nil || two.Streams != 2 {
		t.Fatalf("the set has %d streams: the case was not made", two.Streams)
	}
	// The map without stream 1, which is left in place.
	bucket, err := admin.KeyValue(t.Context(), names.InboxMapBucket())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bucket.Put(t.Context(), broker.InboxMapKey, broker.DefaultInboxMap(1).Encode()); err != nil {
		t.Fatal(err)
	}
	if err := set.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if set.ByName(dropped.Name) != nil || len(set.All()) != 1 {
		t.Fatal("the set still names the dropped stream")
	}
	kept := set.ForPartition(0)
	changed := set.Changed()
	check := func(when string) {
		t.Helper()
		if set.ByName(dropped.Name) != nil || len(set.All()) != 1 || set.ForPartition(0) != kept || kept.Stale() {
			t.Fatalf("%s: the set changed (names %v)", when, set.All())
		}
		select {
		case <-changed:
			t.Fatalf("%s: a change was signalled", when)
		default:
		}
	}

	got, err := set.Reopen(t.Context(), dropped, false)
	if err != nil {
		t.Fatal(err)
	}
	if got != dropped || dropped.Stale() {
		t.Fatalf("the same incarnation read: got %p (stale %v), want the Inbox passed, not stale", got, dropped.Stale())
	}
	check("the same incarnation read")

	got, err = set.Reopen(t.Context(), dropped, true)
	if err != nil {
		t.Fatal(err)
	}
	if got == dropped || got.ID != dropped.ID || got.Stale() || !dropped.Stale() {
		t.Fatalf("the same incarnation read, the old one gone: got %p %s (stale %v), old stale %v; want a new Inbox of %s, the old stale",
			got, got.ID, got.Stale(), dropped.Stale(), dropped.ID)
	}
	check("the same incarnation read, the old one gone")

	// Stream 1 made again, with another identity.
	model := kept.Stream
	if err := admin.DeleteStream(t.Context(), dropped.Name); err != nil {
		t.Fatal(err)
	}
	if err := broker.AddInboxStream(t.Context(), admin, names, two, 1, model); err != nil {
		t.Fatal(err)
	}
	current := got
	got, err = set.Reopen(t.Context(), current, false)
	if err != nil {
		t.Fatal(err)
	}
	if got == current || got.ID == current.ID || got.Stale() || !current.Stale() {
		t.Fatalf("another incarnation read: got %s (stale %v), old %s stale %v; want a new identity, the old stale", got.ID, got.Stale(), current.ID, current.Stale())
	}
	check("another incarnation read")

	// Stream 1 deleted.
	current = got
	if err := admin.DeleteStream(t.Context(), dropped.Name); err != nil {
		t.Fatal(err)
	}
	if got, err = set.Reopen(t.Context(), current, false); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("the stream deleted: Reopen gave %v, %v; want stream not found", got, err)
	}
	if !current.Stale() {
		t.Fatal("the stream deleted: the incarnation is not stale")
	}
	check("the stream deleted")
}
