package broker

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/test/natstest"
)

// onApplyRead sets testHookApplyRead to run f once, for the test.
func onApplyRead(t *testing.T, f func()) {
	done := false
	testHookApplyRead = func() {
		if !done {
			done = true
			f()
		}
	}
	t.Cleanup(func() { testHookApplyRead = nil })
}

// TestApplyKeepsTheIncarnationReopenInstalled: a change of the map is
// applied while the set's incarnation of a stream is stale and the stream
// is deleted and made again twice. Between the apply's reads and its
// install (when an apply that read the stream would have the second
// incarnation), a Reopen finds the third and installs it: the set keeps
// the third, not stale. (An apply that installed what it read would leave
// the set with the second, gone, and nothing would mark it stale: the
// third's seqs would be judged against it.)
func TestApplyKeepsTheIncarnationReopenInstalled(t *testing.T) {
	srv := natstest.RunServer(t)
	names := MustNames("fleet")
	admin := natstest.JetStream(t, srv.Connect(t))
	provision := func() string {
		t.Helper()
		res, err := Provision(t.Context(), admin, ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second})
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
	set, err := OpenInboxes(t.Context(), natstest.JetStream(t, srv.Connect(t)), names, true)
	if err != nil {
		t.Fatal(err)
	}
	first := set.ForPartition(0)
	second := remake()
	first.MarkStale()

	var installed *Inbox
	onApplyRead(t, func() {
		third := remake()
		if third == second {
			t.Errorf("the stream was made again with the same identity %s", third)
		}
		var err error
		if installed, err = set.Reopen(t.Context(), first, true); err != nil {
			t.Errorf("Reopen: %v", err)
			return
		}
		if installed.ID != third || set.ForPartition(0) != installed {
			t.Errorf("Reopen gave identity %s, want %s installed", installed.ID, third)
		}
	})
	want := putMap(t, admin, names, DefaultInboxMap(1))
	if err := set.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if t.Failed() || installed == nil {
		t.FailNow()
	}
	if _, rev := set.Map(); rev != want {
		t.Fatalf("the change of the map (%d) was not applied: the set has %d", want, rev)
	}
	if cur := set.ForPartition(0); cur != installed {
		t.Fatalf("after the apply the set has identity %s, want the one Reopen installed, %s", cur.ID, installed.ID)
	}
	if installed.Stale() {
		t.Fatal("the incarnation Reopen installed was marked stale")
	}
	if all := set.All(); len(all) != 1 || all[0] != installed {
		t.Fatalf("All() = %v, want only the one Reopen installed", all)
	}
}

// TestApplyKeepsWhatAnotherApplyInstalled: two applies of changes of the
// map that name a stream the set had not read it while it is deleted and
// made again: the earlier change's apply, whose read finds the new
// incarnation, installs first. The later one's, whose read found the old,
// does not install it: the set keeps the other's, marked stale (the two
// reads cannot be ordered: a Reopen reads it again).
func TestApplyKeepsWhatAnotherApplyInstalled(t *testing.T) {
	srv := natstest.RunServer(t)
	names := MustNames("fleet")
	admin := natstest.JetStream(t, srv.Connect(t))
	if _, err := Provision(t.Context(), admin, ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second, InboxStreams: 2}); err != nil {
		t.Fatal(err)
	}
	set, err := OpenInboxes(t.Context(), natstest.JetStream(t, srv.Connect(t)), names, true)
	if err != nil {
		t.Fatal(err)
	}
	two, _ := set.Map()
	model := set.ForPartition(0).Stream
	if two.Streams != 2 || set.ByName(names.InboxStreamAt(1)) == nil {
		t.Fatalf("the set has %d streams: the case was not made", two.Streams)
	}
	// The map without stream 1, then with it twice (two revisions).
	putMap(t, admin, names, DefaultInboxMap(1))
	if err := set.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if set.ByName(names.InboxStreamAt(1)) != nil {
		t.Fatal("the set still names stream 1")
	}
	earlier := putMap(t, admin, names, two)
	putMap(t, admin, names, two)

	var theirs *Inbox
	onApplyRead(t, func() {
		// The later change's apply has read stream 1: it is made again,
		// and the earlier change's apply reads and installs it.
		if err := admin.DeleteStream(t.Context(), names.InboxStreamAt(1)); err != nil {
			t.Error(err)
			return
		}
		if err := AddInboxStream(t.Context(), admin, names, two, 1, model); err != nil {
			t.Error(err)
			return
		}
		if err := set.apply(t.Context(), two, earlier); err != nil {
			t.Errorf("the earlier change's apply: %v", err)
			return
		}
		theirs = set.ByName(names.InboxStreamAt(1))
	})
	if err := set.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if t.Failed() || theirs == nil {
		t.FailNow()
	}
	if _, rev := set.Map(); rev <= earlier {
		t.Fatalf("the later change (after %d) was not applied: the set has %d", earlier, rev)
	}
	if cur := set.ByName(names.InboxStreamAt(1)); cur != theirs || !cur.Stale() {
		t.Fatalf("after the later apply the set has %s (stale %v), want the earlier apply's %s, stale", cur.ID, cur.Stale(), theirs.ID)
	}
}

// putMap stores m as the inbox map and returns its revision.
func putMap(t *testing.T, js jetstream.JetStream, n Names, m InboxMap) uint64 {
	t.Helper()
	bucket, err := js.KeyValue(t.Context(), n.InboxMapBucket())
	if err != nil {
		t.Fatal(err)
	}
	rev, err := bucket.Put(t.Context(), InboxMapKey, m.Encode())
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// TestCheckedIsMonotonic: the time an Inbox was last found current is the
// Mono of the read's start (the read that opened it, then a Reopen that
// kept it): between Mono readings taken before and after the read, whatever
// the wall clock does, and CheckedSince orders by it.
func TestCheckedIsMonotonic(t *testing.T) {
	srv := natstest.RunServer(t)
	names := MustNames("fleet")
	admin := natstest.JetStream(t, srv.Connect(t))
	if _, err := Provision(t.Context(), admin, ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second}); err != nil {
		t.Fatal(err)
	}
	before := Mono()
	set, err := OpenInboxes(t.Context(), natstest.JetStream(t, srv.Connect(t)), names, true)
	if err != nil {
		t.Fatal(err)
	}
	after := Mono()
	in := set.ForPartition(0)
	if c := in.checked.Load(); c < before || c > after {
		t.Fatalf("opened: checked %d, not between the Mono readings %d and %d around the read", c, before, after)
	}
	if !in.CheckedSince(before) || in.CheckedSince(after+1) {
		t.Fatalf("opened: CheckedSince(%d) %v, CheckedSince(%d) %v; want true, false", before, in.CheckedSince(before), after+1, in.CheckedSince(after+1))
	}
	before = Mono()
	if got, err := set.Reopen(t.Context(), in, false); err != nil || got != in {
		t.Fatalf("Reopen: %v, %v", got, err)
	}
	after = Mono()
	if c := in.checked.Load(); c < before || c > after {
		t.Fatalf("kept by Reopen: checked %d, not between the Mono readings %d and %d around the read", c, before, after)
	}
	if !in.CheckedSince(before) || in.CheckedSince(after+1) {
		t.Fatalf("kept by Reopen: CheckedSince(%d) %v, CheckedSince(%d) %v; want true, false", before, in.CheckedSince(before), after+1, in.CheckedSince(after+1))
	}
}
