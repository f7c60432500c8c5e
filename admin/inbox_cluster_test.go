package admin_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/admin"
	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

// TestMigrateInboxR3ClusterUnderLoad: on a three-node cluster with R3
// inbox streams, two workers and lanes that keep posting (each lane's next
// message after the previous one was stored, retried with the same message
// id while its partition is closed, a few unanswered at most: see
// posters), the fleet goes from 1 to 3 inbox
// streams and back to 1. Every lane's transcript then holds exactly the
// messages it posted, once each, in order, and no inbox stream holds a
// partition it is not assigned.
func TestMigrateInboxR3ClusterUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("a three-node cluster under load")
	}
	rf := startR3Fleet(t)
	c, js, names, fl := rf.c, rf.js, rf.names, rf.fl

	// The lanes post until told to stop.
	ps := startPosters(t, func() jetstream.JetStream { return natstest.JetStream(t, c.Connect(t)) }, names, "r3", 8)
	ps.waitPosted(t, 2) // traffic flowing before the move
	for _, target := range []int{3, 1} {
		rep, err := fl.MigrateInbox(t.Context(), target, admin.MigrateOptions{DrainTimeout: 2 * time.Minute})
		if err != nil {
			t.Fatalf("migrate to %d: %v", target, err)
		}
		t.Logf("%d -> %d streams: %d partitions moved in %s (longest drain %s)", rep.From, rep.To, rep.Moved, rep.Took, rep.Drain)
	}
	ps.stop(t)
	ps.checkTranscripts(t, fl)
	// The checks below read every stream with the client's default timeout.
	waitStreamLeaders(t, c, js)
	checkMapSettled(t, js, names, 1)
}

// TestMigrateInboxRidesOutAClusterOutage: a migration's steps ride out a
// cluster that cannot answer for a while. On a three-node cluster with R3
// streams, two workers and lanes that keep posting, the fleet goes from 1
// to 2 inbox streams and back to 1; after each of several steps (followed
// by a map write, a subject change, the drain's reads, a purge, a marker,
// the final deletes) two of the three nodes stop, so that no meta or
// stream leader can be elected and every JetStream call fails or times
// out, and they are started again only once the migration has reported a
// failed call it is retrying. Each migration completes; every lane's
// transcript holds exactly the messages it posted, once each, in order;
// the map has its target and nothing moving, the streams take exactly the
// subjects the map gives them, and no stream holds a partition it is not
// assigned.
func TestMigrateInboxRidesOutAClusterOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("a three-node cluster stopped and restarted mid-migration")
	}
	rf := startR3Fleet(t)
	c, js, names, fl := rf.c, rf.js, rf.names, rf.fl
	ps := startPosters(t, func() jetstream.JetStream { return natstest.JetStream(t, c.Connect(t)) }, names, "outage", 4)
	ps.waitPosted(t, 2)

	// The steps after which the cluster loses its quorum (each once), per
	// migration.
	breakAfter := map[int][]string{
		2: {"grown", "closed", "marked", "drained", "flipped"},
		1: {"close-subjects", "final"},
	}
	var down []int // the nodes stopped, until the migration retries
	outages, recovered := 0, 0
	restart := func() {
		for _, i := range down {
			c.RestartNode(t, i) // waits for the meta leader
		}
		down = nil
		recovered++
	}
	t.Cleanup(func() {
		if down != nil {
			restart()
		}
	})
	for _, target := range []int{2, 1} {
		armed := map[string]bool{}
		for _, s := range breakAfter[target] {
			armed[s] = true
		}
		var o admin.MigrateOptions
		o.Batch, o.DrainTimeout, o.RetryWait = 16, 2*time.Minute, 2*time.Minute
		// A call made to a cluster without quorum fails when its attempt
		// times out: a short one keeps the test short.
		admin.SetMigrateAttemptTimeout(&o, 3*time.Second)
		admin.SetMigrateStep(&o, func(step string) error {
			if !armed[step] || down != nil {
				return nil
			}
			delete(armed, step)
			// Keep a different node running each time.
			keep := outages % len(c.Nodes)
			outages++
			for i := range c.Nodes {
				if i != keep {
					c.StopNode(t, i)
					down = append(down, i)
				}
			}
			t.Logf("after step %q: nodes %v stopped", step, down)
			return nil
		})
		// The migration logs a warning before it retries a failed call
		// (from its own goroutine: here, the test's).
		o.Log = slog.New(&onWarn{msg: admin.MigrateRetrying, f: func(r slog.Record) {
			if down != nil {
				t.Logf("the migration retries: %s; nodes %v restarting", recordText(r), down)
				restart()
			}
		}})
		rep, err := fl.MigrateInbox(t.Context(), target, o)
		if err != nil {
			t.Fatalf("migrate to %d: %v", target, err)
		}
		t.Logf("%d -> %d streams: %d partitions moved in %s (longest drain %s)", rep.From, rep.To, rep.Moved, rep.Took, rep.Drain)
		if len(armed) > 0 {
			t.Fatalf("the migration to %d met no step %v", target, slices.Sorted(maps.Keys(armed)))
		}
		if down != nil {
			t.Fatalf("the migration to %d completed with nodes %v stopped and no retry", target, down)
		}
		// The last restart can leave a stream's election running after the
		// migration's own calls succeeded: the checks below read every
		// stream, with the client's default timeout.
		waitStreamLeaders(t, c, js)
		checkMapSettled(t, js, names, target)
		ps.waitPosted(t, 2)
	}
	if recovered != outages {
		t.Fatalf("%d outages, %d ended by a retry", outages, recovered)
	}
	ps.stop(t)
	ps.checkTranscripts(t, fl)
}

// onWarn is a slog handler that calls f for each warning whose message is
// msg.
type onWarn struct {
	msg string
	f   func(slog.Record)
}

func (h *onWarn) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *onWarn) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.f(r)
	}
	return nil
}
func (h *onWarn) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *onWarn) WithGroup(string) slog.Handler      { return h }

func recordText(r slog.Record) string {
	var b strings.Builder
	r.Attrs(func(a slog.Attr) bool {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(a.String())
		return true
	})
	return b.String()
}

// r3Fleet is a fleet on a three-node cluster with R3 streams and two
// workers running until the test ends.
type r3Fleet struct {
	c     *natstest.Cluster
	js    jetstream.JetStream
	names broker.Names
	fl    *admin.Fleet
}

// startR3Fleet starts a three-node cluster, provisions a fleet with R3
// streams on it, waits until every stream has a leader, and starts two
// workers.
func startR3Fleet(t *testing.T) *r3Fleet {
	t.Helper()
	c := natstest.RunCluster(t, 3) // waits for the meta leader
	names := broker.MustNames("fleet")
	nc := c.Connect(t)
	js := natstest.JetStream(t, nc)
	pc := broker.ProvisionConfig{Names: names, Replicas: 3, LeaseTTL: 3 * time.Second}
	natstest.WaitFor(t, 2*time.Minute, "R3 provisioning", func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		_, err := broker.Provision(ctx, js, pc)
		return err
	})
	waitStreamLeaders(t, c, js)
	fl, err := admin.Open(t.Context(), js, names)
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { wcancel(); wg.Wait() })
	for i := range 2 {
		wnc := c.Connect(t)
		wjs := natstest.JetStream(t, wnc)
		var wres *broker.Resources
		natstest.WaitFor(t, time.Minute, "the worker's provisioning", func() error {
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			var err error
			wres, err = broker.Provision(ctx, wjs, pc)
			return err
		})
		w, err := worker.New(wnc, wjs, wres, worker.Config{ID: fmt.Sprintf("r3-%d", i), Names: names, Backend: echo.Backend(echo.Options{}),
			LeaseTTL: 3 * time.Second, LeaseMargin: 500 * time.Millisecond, PeekInterval: 100 * time.Millisecond, DrainTimeout: 2 * time.Second,
			Linger: 500 * time.Millisecond, Reset: session.ResetConfig{Default: session.ResetPolicy{Mode: session.ResetNone}}})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = w.Run(wctx) }()
	}
	return &r3Fleet{c: c, js: js, names: names, fl: fl}
}

// waitStreamLeaders waits until every stream of the account has a leader
// among the running nodes, and every running node that holds a replica of
// it is current: on a loaded machine a stream's first election can outlast
// its creation by seconds.
func waitStreamLeaders(t *testing.T, c *natstest.Cluster, js jetstream.JetStream) {
	t.Helper()
	natstest.WaitFor(t, 2*time.Minute, "a leader for every stream", func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		names := js.StreamNames(ctx)
		n := 0
		for name := range names.Name() {
			n++
			led := false
			for _, s := range c.Nodes {
				if s.Server != nil && s.Running() && s.JetStreamIsStreamLeader("$G", name) {
					led = true
				}
			}
			if !led {
				return fmt.Errorf("stream %s has no leader", name)
			}
			st, err := js.Stream(ctx, name)
			if err != nil {
				return fmt.Errorf("stream %s: %w", name, err)
			}
			cl := st.CachedInfo().Cluster
			if cl == nil || cl.Leader == "" {
				return fmt.Errorf("stream %s reports no leader", name)
			}
			for _, r := range cl.Replicas {
				if !r.Current || r.Offline {
					return fmt.Errorf("stream %s: replica %s not current", name, r.Name)
				}
			}
		}
		if err := names.Err(); err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("no streams")
		}
		return nil
	})
}

func mustBucketJS(t *testing.T, js jetstream.JetStream, names broker.Names) jetstream.KeyValue {
	t.Helper()
	b, err := js.KeyValue(t.Context(), names.InboxMapBucket())
	if err != nil {
		t.Fatal(err)
	}
	return b
}
