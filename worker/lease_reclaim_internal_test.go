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

	"github.com/nats-io/nats.go"
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
// to a lease TTL (30 s here) for nothing. Two lanes:
//   - "later": the next message comes after the lane's runner ended (a new
//     runner takes the lane);
//   - "during": it comes while the release fails (the releasing runner's
//     last look at the inbox finds it and takes the lane again).
func TestKeptLeaseIsTakenBack(t *testing.T) {
	t.Parallel()
	const ttl = 30 * time.Second
	_, nc, js, names, res := provisionFleet(t, ttl)
	store := kv.NewStore(res, nil)
	lanes := drainLanes{t: t, js: js, store: store, names: names}
	_, later := chatLane("later")
	_, during := chatLane("during")

	w, err := New(nc, js, res, Config{ID: "w", Names: names, Backend: echo.Backend(echo.Options{}), LeaseTTL: ttl,
		Linger: 200 * time.Millisecond, PeekInterval: 100 * time.Millisecond,
		Reset: session.ResetConfig{Default: session.ResetPolicy{Mode: session.ResetNone}}})
	if err != nil {
		t.Fatal(err)
	}
	// The fault: each lane's first release cannot delete its lease; that
	// of "during" posts the lane's next message first.
	type kept struct {
		releases atomic.Int32
		epoch    atomic.Uint64
		posted   atomic.Uint64 // the seq of the message posted by the release
		start    atomic.Int64  // when it was posted (unix nanos)
	}
	faults := map[string]*kept{later: {}, during: {}}
	release := w.releaseLease
	w.releaseLease = func(ctx context.Context, lease *kv.Lease) error {
		k := faults[lease.Lane]
		if k == nil || k.releases.Add(1) != 1 {
			return release(ctx, lease)
		}
		k.epoch.Store(lease.Epoch)
		if lease.Lane == during {
			k.start.Store(time.Now().UnixNano())
			if seq, err := postTo(ctx, js, names, "during", "m2"); err == nil {
				k.posted.Store(seq)
			}
		}
		return errors.New("injected: release timed out")
	}
	runWorker(t, w, "worker")
	runs := func(lane string) bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.lanes[lane] != nil
	}

	_, m1 := lanes.post("later", "m1")
	lanes.post("during", "m1")
	lanes.waitCommitted(later, m1)
	natstest.WaitFor(t, 30*time.Second, "later released, its lease kept", func() error {
		if runs(later) || faults[later].releases.Load() == 0 {
			return fmt.Errorf("runs %t, releases %d", runs(later), faults[later].releases.Load())
		}
		return nil
	})
	if owner, _, err := w.leases.Holder(t.Context(), later); err != nil || owner != w.Owner() {
		t.Fatalf("later: lease after the failed release held by %q (%v), want this worker", owner, err)
	}
	start := time.Now()
	_, m2 := lanes.post("later", "m2")
	lanes.waitCommitted(later, m2)
	checkTakenBack(t, "later", time.Since(start), ttl)

	natstest.WaitFor(t, 30*time.Second, "during: the message posted by the failing release", func() error {
		if faults[during].posted.Load() == 0 {
			return errors.New("not posted yet")
		}
		return nil
	})
	lanes.waitCommitted(during, faults[during].posted.Load())
	checkTakenBack(t, "during", time.Since(time.Unix(0, faults[during].start.Load())), ttl)

	for chat, lane := range map[string]string{"later": later, "during": during} {
		e, err := lanes.entry(lane)
		if err != nil {
			t.Fatal(err)
		}
		if kept := faults[lane].epoch.Load(); e.LeaseEpoch <= kept {
			t.Errorf("%s: entry epoch %d, want one above the kept lease's %d (a new lease, fenced)", chat, e.LeaseEpoch, kept)
		}
		// Each message answered once, in order.
		var got []string
		natstest.WaitFor(t, 30*time.Second, chat+": both answers", func() error {
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
			t.Errorf("%s: answers %q, want %q", chat, got, want)
		}
	}
	if n := w.Stats().HeldElsewhere.Load(); n != 0 {
		t.Errorf("the lanes counted %d times as held elsewhere", n)
	}
}

// checkTakenBack fails the test when the message after a failed release
// took anywhere near the kept lease's TTL to be run.
func checkTakenBack(t *testing.T, chat string, took, ttl time.Duration) {
	t.Helper()
	if took > 10*time.Second {
		t.Errorf("%s: the message after the failed release took %s to be run, want it at once (the kept lease's TTL is %s)", chat, took, ttl)
	}
}

// postTo publishes text to chat's lane (see chatLane) and returns its seq
// (drainLanes.post without the test's failure: for any goroutine).
func postTo(ctx context.Context, js jetstream.JetStream, names broker.Names, chat, text string) (uint64, error) {
	src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: chat, ChatType: session.ChatDM, UserID: "u"}
	key, lane := chatLane(chat)
	data, _ := json.Marshal(session.Inbound{Source: src, SessionKey: key, Kind: session.KindMessage, Text: text, ReceivedAt: time.Now()})
	msg := nats.NewMsg(names.InboxSubject(session.Partition(names.Prefix(), lane), lane))
	msg.Data = data
	msg.Header.Set(broker.HdrSessionKey, key)
	msg.Header.Set(broker.HdrKind, session.KindMessage)
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}
