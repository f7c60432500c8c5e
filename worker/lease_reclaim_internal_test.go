package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestKeptLeaseIsTakenBack: a worker whose release could not delete the
// lane's lease (the lease is kept: it still names the worker, and nobody
// renews it) takes it back at once when the lane's next message comes: it
// deletes the kept lease by its revision and takes a new one, of a new
// epoch. It used to find the lane held, by itself, and hand the delivery
// back, again and again, until its own lease ran out: the message waited up
// to a lease TTL (30 s here) for nothing.
func TestKeptLeaseIsTakenBack(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	nc := srv.Connect(t)
	js := natstest.JetStream(t, nc)
	names := broker.MustNames("fleet")
	const ttl = 30 * time.Second
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names, LeaseTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	store := kv.NewStore(res, nil)
	lanes := drainLanes{t: t, js: js, store: store, names: names}
	_, lane := chatLane("kept")

	w, err := New(nc, js, res, Config{ID: "w", Names: names, Backend: echo.Backend(echo.Options{}), LeaseTTL: ttl,
		Linger: 200 * time.Millisecond, PeekInterval: 100 * time.Millisecond,
		Reset: session.ResetConfig{Default: session.ResetPolicy{Mode: session.ResetNone}}})
	if err != nil {
		t.Fatal(err)
	}
	// The fault: the lane's first release cannot delete its lease.
	var releases atomic.Int32
	var keptEpoch atomic.Uint64
	release := w.releaseLease
	w.releaseLease = func(ctx context.Context, lease *kv.Lease) error {
		if lease.Lane == lane && releases.Add(1) == 1 {
			keptEpoch.Store(lease.Epoch)
			return errors.New("injected: release timed out")
		}
		return release(ctx, lease)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	})

	_, m1 := lanes.post("kept", "m1")
	lanes.waitCommitted(lane, m1)
	natstest.WaitFor(t, 30*time.Second, "the lane released, its lease kept", func() error {
		w.mu.Lock()
		runs := w.lanes[lane] != nil
		w.mu.Unlock()
		if runs || releases.Load() == 0 {
			return fmt.Errorf("runs %t, releases %d", runs, releases.Load())
		}
		return nil
	})
	if owner, _, err := w.leases.Holder(t.Context(), lane); err != nil || owner != w.Owner() {
		t.Fatalf("lease after the failed release: held by %q (%v), want this worker", owner, err)
	}

	start := time.Now()
	_, m2 := lanes.post("kept", "m2")
	lanes.waitCommitted(lane, m2)
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the message after the failed release took %s to be run, want it at once (the kept lease's TTL is %s)", took, ttl)
	}
	e, err := lanes.entry(lane)
	if err != nil {
		t.Fatal(err)
	}
	if e.LeaseEpoch <= keptEpoch.Load() {
		t.Errorf("entry epoch %d, want one above the kept lease's %d (a new lease, fenced)", e.LeaseEpoch, keptEpoch.Load())
	}

	// Each message answered once, in order.
	var got []string
	natstest.WaitFor(t, 30*time.Second, "both answers", func() error {
		got = got[:0]
		for seq := uint64(1); ; {
			raw, err := res.Outbox.GetMsg(t.Context(), seq, jetstream.WithGetMsgSubject(names.OutboxSubject("http", lane)))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return err
			}
			var r session.Reply
			if err := json.Unmarshal(raw.Data, &r); err != nil {
				return err
			}
			got = append(got, r.Kind+" "+r.Text)
			seq = raw.Sequence + 1
		}
		if len(got) < 2 {
			return fmt.Errorf("answers %q", got)
		}
		return nil
	})
	if want := []string{"reply echo: m1", "reply echo: m2"}; !slices.Equal(got, want) {
		t.Errorf("answers %q, want %q", got, want)
	}
	if n := w.Stats().HeldElsewhere.Load(); n != 0 {
		t.Errorf("the lane counted %d times as held elsewhere", n)
	}
}
