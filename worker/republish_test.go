package worker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/worker"
)

// TestReplyPublishedAgainIsStoredOnce: when a turn's reply went out but its
// turn_end append failed, the owner finishes the turn again and publishes
// the reply again, with the same Msg-Id. A core subscription on the outbox
// (as the bench's observer is) sees both publishes; the outbox stores one,
// so a platform gets the reply once.
func TestReplyPublishedAgainIsStoredOnce(t *testing.T) {
	f := newFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The first agent run fills the transcript up to one more entry (the
	// reply): its turn_end append is refused.
	var (
		mu    sync.Mutex
		calls int
		saved *jetstream.StreamConfig
	)
	inner := echo.Backend(echo.Options{})
	backend := agent.BackendFunc(func(ctx context.Context, key, sid string) (agent.Agent, error) {
		a, err := inner.NewAgent(ctx, key, sid)
		if err != nil {
			return nil, err
		}
		return agent.AgentFunc(func(ctx context.Context, turn *agent.Turn, emit agent.Emitter) (*agent.Result, error) {
			mu.Lock()
			calls++
			first := calls == 1
			mu.Unlock()
			if first {
				info, err := f.res.Transcripts.Info(ctx)
				if err != nil {
					return nil, err
				}
				orig, full := info.Config, info.Config
				full.Discard, full.MaxMsgs = jetstream.DiscardNew, int64(info.State.Msgs)+1
				if _, err := f.js.UpdateStream(ctx, full); err != nil {
					return nil, err
				}
				mu.Lock()
				saved = &orig
				mu.Unlock()
			}
			return a.Run(ctx, turn, emit)
		}), nil
	})

	published := make(chan *nats.Msg, 16)
	sub, err := f.srv.Connect(t).ChanSubscribe(f.names.OutboxWildcard(), published)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck
	f.startWorker("w1", func(c *worker.Config) { c.Backend = backend })
	lane, seq := f.post("again", "once, please", "a-1")

	var ids []string
	for len(ids) < 2 {
		select {
		case m := <-published:
			ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
		case <-ctx.Done():
			t.Fatalf("%d publishes of the reply seen (%v), want 2: %v", len(ids), ids, ctx.Err())
		}
	}
	if ids[0] == "" || ids[0] != ids[1] {
		t.Fatalf("the publishes carried Msg-Ids %q: want the same one twice", ids)
	}
	mu.Lock()
	orig := saved
	mu.Unlock()
	if orig == nil {
		t.Fatal("the transcript was never made to refuse writes")
	}
	if _, err := f.js.UpdateStream(ctx, *orig); err != nil {
		t.Fatal(err)
	}
	f.waitCommitted(lane, seq)
	r := f.replies(lane)
	if len(r) != 1 || r[0].ID != ids[0] || r[0].Text != "echo: once, please" {
		t.Fatalf("stored replies %+v, want the reply %s once", r, ids[0])
	}
}
