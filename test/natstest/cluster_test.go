package natstest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/test/natstest"
)

// failoverTimeout bounds each wait for the cluster to heal in these tests.
const failoverTimeout = 15 * time.Second

func TestRunCluster_Failover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster and fails it over; skipped with -short")
	}
	// Not parallel: Raft elections are timing-sensitive, and two clusters
	// forming at once on a small CI machine slow each other down (see RunCluster).
	ctx := testContext(t)
	started := time.Now()

	c := natstest.RunCluster(t, 3)
	t.Logf("cluster ready after %v", time.Since(started))
	if len(c.Nodes) != 3 {
		t.Fatalf("%d nodes, want 3", len(c.Nodes))
	}
	if c.Leader() == nil {
		t.Fatal("no meta leader after RunCluster")
	}
	if got := strings.Count(c.URLs(), ","); got != 2 {
		t.Fatalf("URLs() = %q, want 3 URLs", c.URLs())
	}

	nc := c.Connect(t)
	js := natstest.JetStream(t, nc)

	// JetStream works as soon as RunCluster returns: no retry here.
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     "EVENTS",
		Subjects: []string{"events.>"},
		Replicas: 3,
	})
	if err != nil {
		t.Fatalf("create R3 stream: %v", err)
	}
	const before = 5
	for i := range before {
		publish(ctx, t, js, i)
	}
	for i := range before {
		expectMsg(ctx, t, stream, i)
	}

	// Fail over: stop the stream leader.
	leader := c.StreamLeader(t, "$G", "EVENTS")
	stopped := time.Now()
	c.StopNode(t, leader)
	t.Logf("stopped stream leader node %d (%s)", leader, c.Nodes[leader].Name())
	if strings.Contains(c.URLs(), c.Nodes[leader].URL()) {
		t.Fatalf("URLs() = %q still lists the stopped node", c.URLs())
	}

	publish(ctx, t, js, before) // retried through WaitFor until a new leader takes it
	expectMsg(ctx, t, stream, before)
	t.Logf("publish and read worked %v after the stop", time.Since(stopped))
	if next := c.StreamLeader(t, "$G", "EVENTS"); next == leader {
		t.Fatalf("stopped node %d is still the stream leader", leader)
	}

	// Bring the node back: the stream heals to 3 current replicas.
	restarted := time.Now()
	c.RestartNode(t, leader)
	if !c.Nodes[leader].Running() {
		t.Fatalf("node %d is not running after RestartNode", leader)
	}
	waitReplicasCurrent(ctx, t, stream, 3)
	natstest.WaitFor(t, failoverTimeout, "restarted node current on EVENTS", func() error {
		if !c.Nodes[leader].JetStreamIsStreamCurrent("$G", "EVENTS") {
			return errors.New("not current")
		}
		return nil
	})
	t.Logf("3 current replicas %v after the restart", time.Since(restarted))

	publish(ctx, t, js, before+1)
	expectMsg(ctx, t, stream, before+1)
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	if info.State.Msgs != before+2 {
		t.Fatalf("stream has %d messages, want %d", info.State.Msgs, before+2)
	}

	// Losing the meta leader: a new one is elected among the others.
	meta := slices.Index(c.Nodes, c.Leader())
	if meta < 0 {
		t.Fatal("no meta leader")
	}
	c.StopNode(t, meta)
	c.WaitForMetaLeader(t)
	if l := c.Leader(); l == nil || l == c.Nodes[meta] {
		t.Fatalf("meta leader after stopping node %d: %v", meta, l)
	}
	c.RestartNode(t, meta)
	waitReplicasCurrent(ctx, t, stream, 3)
	t.Logf("total %v", time.Since(started))
}

func TestRunCluster_RestartOverSameData(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster twice; skipped with -short")
	}
	// Not parallel, like TestRunCluster_Failover.
	ctx := testContext(t)
	dir := t.TempDir()
	name := fmt.Sprintf("natstest-restart-%d", time.Now().UnixNano())

	c := natstest.RunCluster(t, 3, natstest.WithStoreDir(dir), natstest.WithServerName(name))
	nc := c.Connect(t)
	kv, err := natstest.JetStream(t, nc).CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b", Replicas: 3})
	if err != nil {
		t.Fatalf("create R3 bucket: %v", err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v1")); err != nil {
		t.Fatalf("put: %v", err)
	}
	nc.Close()
	for i := range c.Nodes {
		c.StopNode(t, i)
	}
	if c.URLs() != "" {
		t.Fatalf("URLs() = %q with every node stopped", c.URLs())
	}

	started := time.Now()
	c2 := natstest.RunCluster(t, 3, natstest.WithStoreDir(dir), natstest.WithServerName(name))
	t.Logf("restarted cluster has a meta leader after %v", time.Since(started))
	js := natstest.JetStream(t, c2.Connect(t))
	// The bucket's own Raft group elects its leader after the meta leader.
	natstest.WaitFor(t, failoverTimeout, "bucket b readable after full restart", func() error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		kv, err := js.KeyValue(ctx, "b")
		if err != nil {
			return err
		}
		e, err := kv.Get(ctx, "k")
		if err != nil {
			return err
		}
		if string(e.Value()) != "v1" {
			return fmt.Errorf("k = %q, want v1", e.Value())
		}
		return nil
	})
	t.Logf("bucket readable after %v", time.Since(started))
}

// publish publishes message i to events.<i>, retrying until the cluster takes
// it. The Msg-Id makes a retry after a lost ack harmless.
func publish(ctx context.Context, t *testing.T, js jetstream.JetStream, i int) {
	t.Helper()
	natstest.WaitFor(t, failoverTimeout, fmt.Sprintf("publish of message %d", i), func() error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		ack, err := js.Publish(ctx, fmt.Sprintf("events.%d", i), fmt.Appendf(nil, "event-%d", i),
			jetstream.WithMsgID(fmt.Sprintf("event-%d", i)))
		if err != nil {
			return err
		}
		if ack.Sequence != uint64(i+1) {
			return fmt.Errorf("stored at sequence %d, want %d", ack.Sequence, i+1)
		}
		return nil
	})
}

// expectMsg reads message i back from the stream.
func expectMsg(ctx context.Context, t *testing.T, stream jetstream.Stream, i int) {
	t.Helper()
	natstest.WaitFor(t, failoverTimeout, fmt.Sprintf("read of message %d", i), func() error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		msg, err := stream.GetMsg(ctx, uint64(i+1))
		if err != nil {
			return err
		}
		if want := fmt.Sprintf("event-%d", i); string(msg.Data) != want {
			return fmt.Errorf("message %d = %q, want %q", i, msg.Data, want)
		}
		return nil
	})
}

// waitReplicasCurrent waits until the stream has a leader and n-1 followers,
// all current and online.
func waitReplicasCurrent(ctx context.Context, t *testing.T, stream jetstream.Stream, n int) {
	t.Helper()
	natstest.WaitFor(t, failoverTimeout, fmt.Sprintf("%d current replicas", n), func() error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		info, err := stream.Info(ctx)
		if err != nil {
			return err
		}
		ci := info.Cluster
		if ci == nil || ci.Leader == "" {
			return errors.New("no stream leader")
		}
		if len(ci.Replicas) != n-1 {
			return fmt.Errorf("leader %s has %d followers, want %d", ci.Leader, len(ci.Replicas), n-1)
		}
		for _, r := range ci.Replicas {
			if !r.Current || r.Offline {
				return fmt.Errorf("replica %s: current=%v offline=%v lag=%d", r.Name, r.Current, r.Offline, r.Lag)
			}
		}
		return nil
	})
}
