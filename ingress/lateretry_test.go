package ingress_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

// A platform retry that comes after its message was incorporated and after
// the stream's de-duplication window: the ingress reads the msgids record
// while it publishes the retry, so the retry is stored again, but it is
// answered as a duplicate of the first seq and the worker's msgids claim
// skips the copy: the agent runs once and there is one reply.
func TestLateRetryRunsOnce(t *testing.T) {
	t.Parallel()
	const window = 500 * time.Millisecond
	b := setup(t, setupOpts{duplicates: window})
	var runs atomic.Int32
	startEchoWorker(t, b, window, &runs)

	const body = `{"chat_id":"late","message_id":"m1","text":"hi"}`
	first := b.post(t, body)
	wantStatus(t, first, http.StatusAccepted)
	if first.body["duplicate"] != false {
		t.Fatalf("first answer %s", first.raw)
	}
	seq := seqOf(t, first)
	key, _ := first.body["session_key"].(string)
	lane := session.LaneToken(key)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The worker incorporates the message (its msgids record names it) and
	// answers it.
	natstest.WaitFor(t, time.Minute, "the msgids record of the first message", func() error {
		e, err := b.res.MsgIDs.Get(ctx, session.LaneToken("http:late:m1"))
		if err != nil {
			return err
		}
		r, err := kv.ParseMsgRef(e.Value())
		if err != nil || r.Seq != seq {
			return fmt.Errorf("record %q, want seq %d", e.Value(), seq)
		}
		return nil
	})
	natstest.WaitFor(t, time.Minute, "the first reply", func() error {
		if n := len(b.outboxReplies(t, lane)); n != 1 {
			return fmt.Errorf("%d replies", n)
		}
		return nil
	})

	// Retry until one comes past the stream's window (it is stored); every
	// answer names the first message.
	natstest.WaitFor(t, time.Minute, "a retry stored past the stream's window", func() error {
		r := b.post(t, body)
		wantStatus(t, r, http.StatusAccepted)
		if r.body["duplicate"] != true || seqOf(t, r) != seq || r.body["session_key"] != key {
			t.Fatalf("retry answered %s, want a duplicate of seq %d", r.raw, seq)
		}
		if n := b.inboxCount(t); n < 2 {
			return fmt.Errorf("inbox holds %d", n)
		}
		return nil
	})

	// The worker takes the copy (acks it) without running it.
	natstest.WaitFor(t, time.Minute, "the copy handled", func() error {
		info, err := b.res.Consumer.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumPending != 0 || info.NumAckPending != 0 || info.AckFloor.Stream < 2 {
			return fmt.Errorf("pending %d, ack pending %d, ack floor %d", info.NumPending, info.NumAckPending, info.AckFloor.Stream)
		}
		return nil
	})
	if n := runs.Load(); n != 1 {
		t.Errorf("the agent ran %d times, want 1", n)
	}
	if got := b.outboxReplies(t, lane); len(got) != 1 || got[0].Text != "echo: hi" {
		t.Errorf("replies %+v, want one", got)
	}
}

// startEchoWorker runs a worker with the echo agent on b's server until
// the test ends; runs counts the agent's turns.
func startEchoWorker(t *testing.T, b *testBundle, window time.Duration, runs *atomic.Int32) {
	t.Helper()
	nc := b.ns.Connect(t)
	js := natstest.JetStream(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	res, err := broker.Provision(ctx, js, broker.ProvisionConfig{Names: b.names, Duplicates: window})
	if err != nil {
		t.Fatal(err)
	}
	echoes := echo.New(echo.Options{})
	counted := agent.AgentFunc(func(ctx context.Context, turn *agent.Turn, emit agent.Emitter) (*agent.Result, error) {
		runs.Add(1)
		return echoes.Run(ctx, turn, emit)
	})
	backend := agent.BackendFunc(func(context.Context, string, string) (agent.Agent, error) { return counted, nil })
	w, err := worker.New(nc, js, res, worker.Config{ID: "w1", Names: b.names, Backend: backend,
		LeaseTTL: 3 * time.Second, LeaseMargin: 500 * time.Millisecond, Linger: 500 * time.Millisecond,
		PeekInterval: 100 * time.Millisecond, DrainTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("worker: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("worker did not stop")
		}
	})
}

// outboxReplies reads the replies (not notices) published for lane's HTTP
// outbox subject.
func (b *testBundle) outboxReplies(t *testing.T, lane string) []session.Reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	var out []session.Reply
	for seq := uint64(1); ; {
		raw, err := b.res.Outbox.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(b.names.OutboxSubject("http", lane)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		var r session.Reply
		if err := json.Unmarshal(raw.Data, &r); err != nil {
			t.Fatal(err)
		}
		if r.Kind == session.ReplyKindReply {
			out = append(out, r)
		}
		seq = raw.Sequence + 1
	}
}

// A late retry whose copy is stored (past the stream's window, after the
// message was incorporated) renews the msgids record, value unchanged: the
// worker's claim skips the copy only while the record lives, and the
// bucket's TTL counts from the last write, so the record must outlive the
// copy's wait in its lane (a backlog, an outage).
func TestLateRetryRenewsRecord(t *testing.T) {
	t.Parallel()
	const window = 500 * time.Millisecond
	b := setup(t, setupOpts{duplicates: window})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const body = `{"chat_id":"renew","message_id":"m1","text":"hi"}`
	first := b.post(t, body)
	wantStatus(t, first, http.StatusAccepted)
	seq := seqOf(t, first)
	// The record a worker writes when it incorporates the message.
	k := session.LaneToken("http:renew:m1")
	value := kv.MsgRef{Seq: seq, Inbox: b.res.InboxID}.Encode()
	rev, err := b.res.MsgIDs.Create(ctx, k, value)
	if err != nil {
		t.Fatal(err)
	}

	natstest.WaitFor(t, time.Minute, "a retry stored past the stream's window", func() error {
		r := b.post(t, body)
		wantStatus(t, r, http.StatusAccepted)
		if r.body["duplicate"] != true || seqOf(t, r) != seq {
			t.Fatalf("retry answered %s, want a duplicate of seq %d", r.raw, seq)
		}
		if n := b.inboxCount(t); n < 2 {
			return fmt.Errorf("inbox holds %d", n)
		}
		return nil
	})
	e, err := b.res.MsgIDs.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if string(e.Value()) != string(value) || e.Revision() <= rev {
		t.Fatalf("record %q at revision %d, want %q rewritten after revision %d", e.Value(), e.Revision(), value, rev)
	}
}
