package broker_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestDefaultInboxMap: partition p lives in stream p mod N, every stream gets
// partitions, and one stream keeps the wildcard layout of a fleet that never
// set the count.
func TestDefaultInboxMap(t *testing.T) {
	n := broker.MustNames("fleet")
	for _, count := range []int{1, 2, 3, 7, 16} {
		m := broker.DefaultInboxMap(count)
		if err := m.Validate(); err != nil {
			t.Fatalf("%d streams: %v", count, err)
		}
		seen := map[int]int{}
		for p := 0; p < broker.Partitions; p++ {
			if got := m.Assign[p]; got != p%count {
				t.Fatalf("%d streams: partition %d in stream %d, want %d", count, p, got, p%count)
			}
			seen[m.Assign[p]]++
		}
		if len(seen) != count {
			t.Fatalf("%d streams: only %d hold partitions", count, len(seen))
		}
		// The subjects of the streams cover each partition exactly once.
		var all []string
		for i := 0; i < count; i++ {
			all = append(all, m.Subjects(n, i)...)
		}
		if count == 1 {
			if !slices.Equal(all, []string{"fleet.in.>"}) {
				t.Fatalf("one stream: subjects %v, want the wildcard", all)
			}
			continue
		}
		// Besides each stream's control subject.
		all = slices.DeleteFunc(all, func(s string) bool { return strings.HasPrefix(s, n.InboxControlPrefix()) })
		slices.Sort(all)
		if len(all) != broker.Partitions || len(slices.Compact(all)) != broker.Partitions {
			t.Fatalf("%d streams: %d subjects, want each of the %d partitions once", count, len(all), broker.Partitions)
		}
	}
	// The map and the lane's partition agree with the lane subject.
	m := broker.DefaultInboxMap(3)
	lane := session.LaneToken("agent:main:telegram:group:-100123:u42")
	p := session.Partition("fleet", lane)
	if want := fmt.Sprintf("fleet.in.%d.>", p); !slices.Contains(m.Subjects(n, p%3), want) {
		t.Fatalf("stream %d subjects %v lack %s", p%3, m.Subjects(n, p%3), want)
	}
}

// TestInboxMapMoving: a moving partition is in no stream's subjects, and a
// stream left with none takes only its control subject, outside the inbox.
func TestInboxMapMoving(t *testing.T) {
	n := broker.MustNames("fleet")
	m := broker.DefaultInboxMap(2)
	m.Moving = []broker.Move{{P: 1, From: 1, To: 0}}
	if m.IsOpen(1) || !m.IsOpen(0) || !m.Migrating() {
		t.Fatalf("open(1)=%v open(0)=%v migrating=%v", m.IsOpen(1), m.IsOpen(0), m.Migrating())
	}
	if slices.Contains(m.Subjects(n, 1), "fleet.in.1.>") {
		t.Fatal("a moving partition is still in its stream's subjects")
	}
	one := broker.DefaultInboxMap(1)
	one.Streams = 2 // stream 1 added, holding nothing yet
	if got := one.Subjects(n, 1); !slices.Equal(got, []string{"fleet.inctl.1"}) {
		t.Fatalf("empty stream subjects %v", got)
	}
	if got := one.Subjects(n, 0); len(got) != broker.Partitions+1 || got[len(got)-1] != "fleet.inctl.0" {
		t.Fatalf("stream 0 of two: %d subjects, want the %d exact ones and its control subject", len(got), broker.Partitions)
	}
	bad := broker.DefaultInboxMap(2)
	bad.Assign[5] = 2
	if bad.Validate() == nil {
		t.Fatal("a partition in a stream past the count was accepted")
	}
	dec, err := broker.DecodeInboxMap(m.Encode())
	if err != nil || !slices.Equal(dec.Assign, m.Assign) || len(dec.Moving) != 1 {
		t.Fatalf("round trip: %+v, %v", dec, err)
	}
}

func TestInboxStreamNames(t *testing.T) {
	n := broker.MustNames("acme")
	for i, want := range []string{"ACME_IN", "ACME_IN_1", "ACME_IN_15"} {
		idx := []int{0, 1, 15}[i]
		if got := n.InboxStreamAt(idx); got != want {
			t.Fatalf("stream %d: %s, want %s", idx, got, want)
		}
		if got, ok := n.InboxStreamIndex(want); !ok || got != idx {
			t.Fatalf("index of %s: %d %v", want, got, ok)
		}
	}
	for _, bad := range []string{"ACME_TX", "ACME_IN_", "ACME_IN_01", "ACME_IN_16", "ACME_IN_x", "OTHER_IN"} {
		if _, ok := n.InboxStreamIndex(bad); ok {
			t.Fatalf("%s taken for an inbox stream", bad)
		}
	}
}

// TestProvisionInboxStreams: a new fleet gets the configured number of inbox
// streams, each with exactly its partitions' subjects (and its control
// subject) and its own workers consumer and identity; a lane's publish lands
// in its stream; a process configured with another count is refused with a
// clear error and changes nothing; 0 takes the fleet's count.
func TestProvisionInboxStreams(t *testing.T) {
	srv := natstest.RunServer(t)
	js := natstest.JetStream(t, srv.Connect(t))
	n := broker.MustNames("fleet")
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: n, LeaseTTL: 4 * time.Second, InboxStreams: 3})
	if err != nil {
		t.Fatal(err)
	}
	all := res.Inboxes.All()
	if len(all) != 3 {
		t.Fatalf("%d inbox streams, want 3", len(all))
	}
	ids := map[string]bool{}
	for i, in := range all {
		if in.Name != n.InboxStreamAt(i) || in.Consumer == nil || in.ID == "" {
			t.Fatalf("stream %d: %+v", i, in)
		}
		ids[in.ID] = true
		subs := in.Stream.CachedInfo().Config.Subjects
		if len(subs) != len(broker.DefaultInboxMap(3).PartitionsOf(i))+1 || subs[len(subs)-1] != n.InboxControlSubject(i) {
			t.Fatalf("%s: %d subjects, want its partitions' and its control subject", in.Name, len(subs))
		}
	}
	if len(ids) != 3 {
		t.Fatal("inbox streams share an identity")
	}
	lane := session.LaneToken("agent:main:http:dm:c1")
	p := session.Partition("fleet", lane)
	ack, err := js.Publish(t.Context(), n.InboxSubject(p, lane), []byte("{}"), broker.InboxPublishOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	if want := res.Inboxes.ForLane(lane).Name; ack.Stream != want || want != n.InboxStreamAt(p%3) {
		t.Fatalf("lane of partition %d stored in %s, map says %s", p, ack.Stream, want)
	}

	_, err = broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: n, LeaseTTL: 4 * time.Second, InboxStreams: 2})
	if !errors.Is(err, broker.ErrInboxStreams) || broker.Retryable(err) {
		t.Fatalf("provision with another count: %v, want ErrInboxStreams, not retryable", err)
	}
	if _, err := js.Stream(t.Context(), "FLEET_IN_2"); err != nil {
		t.Fatalf("the refused provisioning changed the streams: %v", err)
	}
	res2, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: n, LeaseTTL: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(res2.Inboxes.All()); got != 3 {
		t.Fatalf("count 0 took %d streams, want the fleet's 3", got)
	}
}

// TestProvisionKeepsLegacyInbox: a fleet provisioned before the count was
// configurable (one inbox stream on the wildcard, its consumer filtered on
// it, no map) keeps its stream, identity and subjects.
func TestProvisionKeepsLegacyInbox(t *testing.T) {
	srv := natstest.RunServer(t)
	js := natstest.JetStream(t, srv.Connect(t))
	n := broker.MustNames("fleet")
	st, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "FLEET_IN", Subjects: []string{"fleet.in.>"},
		Metadata: map[string]string{broker.InboxIDMetadata: "legacy-id"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateOrUpdateConsumer(t.Context(), jetstream.ConsumerConfig{Durable: "workers", FilterSubject: "fleet.in.>",
		AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1, AckWait: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: n, LeaseTTL: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.InboxID != "legacy-id" || len(res.Inboxes.All()) != 1 || res.Inboxes.ForLane("x").ID != "legacy-id" {
		t.Fatalf("legacy inbox: id %s, %d streams", res.InboxID, len(res.Inboxes.All()))
	}
	if subs := res.Inbox.CachedInfo().Config.Subjects; !slices.Equal(subs, []string{"fleet.in.>"}) {
		t.Fatalf("legacy subjects changed to %v", subs)
	}
}

// TestProvisionLegacyInboxRefusesAnotherCount: a process configured for 3
// inbox streams meeting a fleet that has its one legacy stream records the
// fleet as it is (one stream) and refuses to start, creating nothing.
func TestProvisionLegacyInboxRefusesAnotherCount(t *testing.T) {
	srv := natstest.RunServer(t)
	js := natstest.JetStream(t, srv.Connect(t))
	n := broker.MustNames("fleet")
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "FLEET_IN", Subjects: []string{"fleet.in.>"}}); err != nil {
		t.Fatal(err)
	}
	_, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: n, LeaseTTL: 4 * time.Second, InboxStreams: 3})
	if !errors.Is(err, broker.ErrInboxStreams) {
		t.Fatalf("provision for 3 streams over a legacy inbox: %v, want ErrInboxStreams", err)
	}
	if _, err := js.Stream(t.Context(), "FLEET_IN_1"); err == nil {
		t.Fatal("the refused provisioning created FLEET_IN_1")
	}
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: n, LeaseTTL: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(res.Inboxes.All()); got != 1 {
		t.Fatalf("%d streams, want the legacy one", got)
	}
}

// TestInboxSetReopen: Reopen leaves an inbox stream whose identity has not
// changed as it is; one deleted and made again (a new identity) is replaced
// by a new Inbox, the old one marked stale, and Changed signals; a stream
// found missing marks its Inbox stale at once, before it comes back.
func TestInboxSetReopen(t *testing.T) {
	srv := natstest.RunServer(t)
	js := natstest.JetStream(t, srv.Connect(t))
	n := broker.MustNames("fleet")
	cfg := broker.ProvisionConfig{Names: n, LeaseTTL: 4 * time.Second, InboxStreams: 2}
	res, err := broker.Provision(t.Context(), js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	set := res.Inboxes
	old := set.ByName(n.InboxStreamAt(1))
	other := set.ByName(n.InboxStreamAt(0))
	changed := set.Changed()
	if in, err := set.Reopen(t.Context(), old, false); err != nil || in != old || old.Stale() {
		t.Fatalf("reopen of an unchanged stream: %p %v (stale %v), want the same Inbox", in, err, old.Stale())
	}
	select {
	case <-changed:
		t.Fatal("Changed signalled for an unchanged stream")
	default:
	}

	if err := js.DeleteStream(t.Context(), old.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := set.Reopen(t.Context(), old, false); !errors.Is(err, jetstream.ErrStreamNotFound) || !old.Stale() {
		t.Fatalf("reopen of a deleted stream: %v (stale %v), want not found and stale", err, old.Stale())
	}
	if set.ByName(old.Name) != old {
		t.Fatal("the set dropped the stream while it is away")
	}
	if _, err := broker.Provision(t.Context(), js, cfg); err != nil {
		t.Fatal(err)
	}
	in, err := set.Reopen(t.Context(), old, false)
	if err != nil {
		t.Fatal(err)
	}
	if in == old || in.ID == old.ID || in.Stale() || in.Consumer == nil || set.ByName(old.Name) != in {
		t.Fatalf("reopened %+v, was %+v: want a new Inbox with a new identity, in the set", in, old)
	}
	select {
	case <-changed:
	default:
		t.Fatal("Changed did not signal the new incarnation")
	}
	if set.ByName(other.Name) != other || other.Stale() {
		t.Fatal("the other stream changed")
	}
	// A second reader with the old Inbox gets the new one, no second
	// replacement.
	if again, err := set.Reopen(t.Context(), old, false); err != nil || again != in {
		t.Fatalf("second reopen: %p %v, want %p", again, err, in)
	}
	// gone: the consumer reported deleted; the stream kept its identity.
	fresh, err := set.Reopen(t.Context(), in, true)
	if err != nil || fresh == in || fresh.ID != in.ID || !in.Stale() || set.ByName(in.Name) != fresh {
		t.Fatalf("reopen gone: %+v %v", fresh, err)
	}

	// Made again with a new identity, its workers consumer not yet: the
	// Inbox is stale at once, though the set cannot take the new one yet.
	si, err := fresh.Stream.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(t.Context(), fresh.Name); err != nil {
		t.Fatal(err)
	}
	remade := si.Config
	remade.Metadata = map[string]string{broker.InboxIDMetadata: "another-incarnation"}
	if _, err := js.CreateStream(t.Context(), remade); err != nil {
		t.Fatal(err)
	}
	if _, err := set.Reopen(t.Context(), fresh, false); !errors.Is(err, jetstream.ErrConsumerNotFound) || !fresh.Stale() {
		t.Fatalf("reopen of a stream made again without its consumer yet: %v (stale %v), want consumer not found and stale", err, fresh.Stale())
	}
}
