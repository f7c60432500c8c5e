package broker_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/test/natstest"
)

func TestProvisionIdempotentAndConcurrent(t *testing.T) {
	srv := natstest.RunServer(t)
	names := broker.MustNames("acme")
	var wg sync.WaitGroup
	ids := make([]string, 4)
	errs := make([]error, 4)
	for i := range ids {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			nc := srv.Connect(t)
			js := natstest.JetStream(t, nc)
			res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names, LeaseTTL: 4 * time.Second})
			errs[i] = err
			if err == nil {
				ids[i] = res.InboxID
			}
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("provision %d: %v", i, err)
		}
	}
	for i := range ids {
		if ids[i] == "" || ids[i] != ids[0] {
			t.Fatalf("concurrent provisioning disagreed on the inbox identity: %v", ids)
		}
	}
	// Again, sequentially: same identity, same settings.
	nc := srv.Connect(t)
	js := natstest.JetStream(t, nc)
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names, LeaseTTL: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := res.InboxID, ids[0]; got != want {
		t.Fatalf("inbox id %s, want %s", got, want)
	}
	for _, s := range []string{"ACME_IN", "ACME_TX", "ACME_OUT", "ACME_EV"} {
		if _, err := js.Stream(t.Context(), s); err != nil {
			t.Errorf("stream %s: %v", s, err)
		}
	}
	for _, b := range []string{"acme_sessions", "acme_sessionids", "acme_leases", "acme_msgids", "acme_delivered", "acme_workers"} {
		if _, err := js.KeyValue(t.Context(), b); err != nil {
			t.Errorf("bucket %s: %v", b, err)
		}
	}
	info, err := res.Consumer.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxDeliver != -1 || info.Config.AckPolicy != jetstream.AckExplicitPolicy || info.Config.AckWait < 4*time.Second || len(info.Config.BackOff) != 0 {
		t.Fatalf("workers consumer config %+v", info.Config)
	}
}

func TestAssertWorkersConsumerRejectsBadSettings(t *testing.T) {
	srv := natstest.RunServer(t)
	nc := srv.Connect(t)
	js := natstest.JetStream(t, nc)
	names := broker.MustNames("fleet")
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names})
	if err != nil {
		t.Fatal(err)
	}
	// Someone "tunes" the consumer behind our back.
	cfg := broker.WorkersConsumerConfig(names, 15*time.Second, 100, 1)
	cfg.MaxDeliver = 5
	cfg.AckWait = time.Second
	cons, err := res.Inbox.UpdateConsumer(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = broker.AssertWorkersConsumer(t.Context(), cons, 15*time.Second)
	if err == nil {
		t.Fatal("a consumer with MaxDeliver 5 and AckWait 1s passed the assertion")
	}
	t.Log(err)
}

func TestProvisionRejectsBadReplicas(t *testing.T) {
	srv := natstest.RunServer(t)
	js := natstest.JetStream(t, srv.Connect(t))
	if _, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Replicas: 2}); err == nil {
		t.Fatal("replicas 2 accepted")
	}
}

func TestProvisionR3OnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	c := natstest.RunCluster(t, 3)
	nc := c.Connect(t)
	js := natstest.JetStream(t, nc)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	// Provisioning is idempotent. On a loaded machine an R3 create can wait
	// out a stream group's election and its answer can be lost while the
	// fresh cluster settles: bound each attempt, so that one lost answer
	// does not eat the whole wait (CI once spent all 30s on one attempt).
	var res *broker.Resources
	natstest.WaitFor(t, 2*time.Minute, "R3 provisioning", func() error {
		pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		var err error
		res, err = broker.Provision(pctx, js, broker.ProvisionConfig{Replicas: 3})
		return err
	})
	info, err := res.Inbox.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := info.Config.Replicas, 3; got != want {
		t.Fatalf("inbox replicas %d, want %d", got, want)
	}
	st, err := res.Sessions.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if si := st.(*jetstream.KeyValueBucketStatus).StreamInfo(); si.Config.Replicas != 3 {
		t.Fatalf("sessions bucket replicas %d", si.Config.Replicas)
	}

	// A process started with the default (1 replica) must not turn the
	// fleet's assets into single copies: they keep 3, with a warning.
	var again *broker.Resources
	natstest.WaitFor(t, 2*time.Minute, "provisioning again with replicas 1", func() error {
		pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		var err error
		again, err = broker.Provision(pctx, js, broker.ProvisionConfig{})
		return err
	})
	if len(again.Warnings) == 0 {
		t.Fatal("no warning for a configuration asking fewer replicas than the fleet has")
	}
	for _, name := range []string{"FLEET_IN", "FLEET_TX", "FLEET_OUT", "FLEET_EV", "KV_fleet_sessions", "KV_fleet_leases", "KV_fleet_msgids"} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.CachedInfo().Config.Replicas; got != 3 {
			t.Errorf("%s has %d replicas after a provisioning asking 1, want 3 kept", name, got)
		}
	}
	cons, err := again.Inbox.Consumer(ctx, "workers")
	if err != nil {
		t.Fatal(err)
	}
	if got := cons.CachedInfo().Config.Replicas; got != 3 {
		t.Errorf("workers consumer has %d replicas, want 3", got)
	}
}

// TestProvisionKeepsLongerAckWait: a process with a shorter lease TTL does
// not lower the ack wait the running workers rely on.
func TestProvisionKeepsLongerAckWait(t *testing.T) {
	srv := natstest.RunServer(t)
	js := natstest.JetStream(t, srv.Connect(t))
	if _, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{LeaseTTL: 15 * time.Second}); err != nil {
		t.Fatal(err)
	}
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	info, err := res.Consumer.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := broker.WorkersAckWait(15 * time.Second); info.Config.AckWait != want {
		t.Fatalf("ack wait %s, want %s kept", info.Config.AckWait, want)
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "ack wait") {
		t.Fatalf("warnings %q", res.Warnings)
	}
	// A longer TTL raises it.
	res, err = broker.Provision(t.Context(), js, broker.ProvisionConfig{LeaseTTL: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if info, err = res.Consumer.Info(t.Context()); err != nil || info.Config.AckWait != broker.WorkersAckWait(20*time.Second) {
		t.Fatalf("ack wait %v (%v), want it raised", info.Config.AckWait, err)
	}
}

func TestEmbeddedServerSyncPolicy(t *testing.T) {
	for _, tc := range []struct {
		in      string
		always  bool
		every   time.Duration
		wantErr bool
	}{
		{"", false, 0, false}, {"default", false, 0, false}, {"always", true, 0, false}, {"10s", false, 10 * time.Second, false},
		{"10", false, 10 * time.Second, false}, {"sometimes", false, 0, true}, {"-1s", false, 0, true}, {"0", false, 0, true},
	} {
		always, every, err := broker.ParseSync(tc.in)
		if (err != nil) != tc.wantErr || always != tc.always || every != tc.every {
			t.Errorf("ParseSync(%q) = %v %v %v", tc.in, always, every, err)
		}
	}
	dir := t.TempDir()
	s, err := broker.StartServer(broker.ServerConfig{DataDir: dir, Sync: "always"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Shutdown(); s.WaitForShutdown() }()
	nc, err := broker.Connect(broker.ConnectConfig{InProcess: s})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{}); err != nil {
		t.Fatal(err)
	}
}

// TestInboxIdentityOfAStreamWithoutOne: an inbox stream made by other means
// (no identity metadata) gets one identity however many processes provision
// it, derived from the stream itself, and keeps it.
func TestInboxIdentityOfAStreamWithoutOne(t *testing.T) {
	srv := natstest.RunServer(t)
	js := natstest.JetStream(t, srv.Connect(t))
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "FLEET_IN", Subjects: []string{"fleet.in.>"}}); err != nil {
		t.Fatal(err)
	}
	// Processes starting together, each on a connection of its own.
	const n = 4
	jss := make([]jetstream.JetStream, n)
	for i := range jss {
		jss[i] = natstest.JetStream(t, srv.Connect(t))
	}
	got := make([]string, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			res, err := broker.Provision(t.Context(), jss[i], broker.ProvisionConfig{})
			if err == nil {
				got[i] = res.InboxID
			}
			errs[i] = err
		})
	}
	close(start)
	wg.Wait()
	ids := map[string]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		ids[got[i]] = true
	}
	if len(ids) != 1 {
		t.Fatalf("inbox identities %v, want one", ids)
	}
	s, err := js.Stream(t.Context(), "FLEET_IN")
	if err != nil {
		t.Fatal(err)
	}
	for id := range ids {
		if got := s.CachedInfo().Config.Metadata[broker.InboxIDMetadata]; got != id || id == "" {
			t.Fatalf("stored identity %q, provisioned %q", got, id)
		}
	}
}

// TestProvisionLeavesACurrentInboxAlone: provisioning a fleet whose inbox
// streams already have their settings sends no stream update, so a process
// starting while a migration moves partitions cannot write back the
// subjects it read a moment before (that would give a partition back to
// the stream it is leaving, and messages stored there would be purged or
// never read). A changed setting is still applied.
func TestProvisionLeavesACurrentInboxAlone(t *testing.T) {
	srv := natstest.RunServer(t)
	nc := srv.Connect(t)
	js := natstest.JetStream(t, nc)
	names := broker.MustNames(broker.DefaultPrefix)
	pc := broker.ProvisionConfig{Names: names, LeaseTTL: 4 * time.Second, InboxStreams: 2}
	if _, err := broker.Provision(t.Context(), js, pc); err != nil {
		t.Fatal(err)
	}
	watch := srv.Connect(t)
	// Stream update requests of the two inbox streams, counted (and
	// taken) once every request sent so far has reached the subscription.
	updates := make(chan string, 16)
	for _, stream := range []string{names.InboxStreamAt(0), names.InboxStreamAt(1)} {
		if _, err := watch.Subscribe("$JS.API.STREAM.UPDATE."+stream, func(m *nats.Msg) { updates <- m.Subject }); err != nil {
			t.Fatal(err)
		}
	}
	taken := func() []string {
		t.Helper()
		if err := watch.Flush(); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			select {
			case s := <-updates:
				got = append(got, s)
			default:
				return got
			}
		}
	}
	taken()
	if _, err := broker.Provision(t.Context(), js, pc); err != nil {
		t.Fatal(err)
	}
	// The update requests were sent before Provision returned; the flush's
	// round trip brings any copy of them to this subscription first.
	if got := taken(); len(got) != 0 {
		t.Fatalf("provisioning a current inbox sent stream updates: %v", got)
	}

	// A setting that differs is applied (the subjects kept as they are).
	s, err := js.Stream(t.Context(), names.InboxStream())
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	subjects := cfg.Subjects
	cfg.Description = "changed by hand"
	if _, err := js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	taken()
	if _, err := broker.Provision(t.Context(), js, pc); err != nil {
		t.Fatal(err)
	}
	if got := taken(); !slices.Equal(got, []string{"$JS.API.STREAM.UPDATE." + names.InboxStream()}) {
		t.Fatalf("after a setting of %s changed, provisioning sent updates %v, want one of it", names.InboxStream(), got)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Description == "changed by hand" || !slices.Equal(info.Config.Subjects, subjects) {
		t.Fatalf("after provisioning: description %q subjects %v, want the fleet's description and subjects %v",
			info.Config.Description, info.Config.Subjects, subjects)
	}
}
