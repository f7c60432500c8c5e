package bench

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestVerifyAcceptsOnlyInternalAfterTheLastSend: a lane may commit past the
// bench's last message only over the fleet's own wake-ups; a message of any
// other kind there fails the verify.
func TestVerifyAcceptsOnlyInternalAfterTheLastSend(t *testing.T) {
	srv := natstest.RunServer(t)
	js := natstest.JetStream(t, srv.Connect(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IN", Subjects: []string{"in.>"}})
	if err != nil {
		t.Fatal(err)
	}
	pub := func(subject, kind string) uint64 {
		m := nats.NewMsg(subject)
		m.Header.Set(broker.HdrKind, kind)
		ack, err := js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	last := pub("in.a", session.KindMessage)
	pub("in.b", session.KindMessage) // another lane's, between
	wake := pub("in.a", session.KindInternal)
	if err := onlyInternalAfter(ctx, st, "in.a", last, wake); err != nil {
		t.Fatalf("a wake-up after the last send: %v", err)
	}
	stray := pub("in.a", session.KindMessage)
	err = onlyInternalAfter(ctx, st, "in.a", last, stray)
	if err == nil || !strings.Contains(err.Error(), "did not send") {
		t.Fatalf("a message the bench did not send was accepted: %v", err)
	}
	if err := onlyInternalAfter(ctx, st, "in.a", last, last); err != nil {
		t.Fatalf("nothing after the last send: %v", err)
	}
	// A lane committed past everything its subject holds: no message of it
	// is stored there, which is an error, not a pass.
	if err := onlyInternalAfter(ctx, st, "in.a", stray, stray+5); err == nil {
		t.Fatal("a commit past the subject's last message was accepted")
	}
}

// TestVerifyJudgesStrays: the observer sees a second publish of an answered
// reply that the outbox refused by its Msg-Id (a worker finishing a turn
// again): the verify counts it as a re-publish, not a failure. A reply
// stored on the lane that answers no message in flight (a real duplicate
// answer, with a Msg-Id of its own) fails it, naming the lane, the Msg-Id
// and the reply.
func TestVerifyJudgesStrays(t *testing.T) {
	srv := natstest.RunServer(t)
	nc := srv.Connect(t)
	js := natstest.JetStream(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}, Duplicates: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	reply := func(id, text string, wantDup bool) {
		t.Helper()
		m := nats.NewMsg("out.a")
		m.Data = []byte(text)
		ack, err := js.PublishMsg(ctx, m, jetstream.WithMsgID(id))
		if err != nil {
			t.Fatal(err)
		}
		if ack.Duplicate != wantDup {
			t.Fatalf("publish %s: duplicate %t, want %t", id, ack.Duplicate, wantDup)
		}
	}
	run := func(p string, second func()) *driver {
		t.Helper()
		d := newDriver(Options{ReplyTimeout: time.Minute}, "test", []string{"out.a"})
		if err := d.observe(srv.Connect(t), "out.>"); err != nil {
			t.Fatal(err)
		}
		timer := time.NewTimer(time.Hour)
		timer.Stop()
		// Message 0 is answered; while message 1 is in flight, second
		// publishes something else on the lane before its reply.
		send := func(_ context.Context, _, n int) (sent, error) {
			if n == 0 {
				reply(p+"r0", "answer tok-0", false)
			} else {
				second()
				reply(p+"r1", "answer tok-1", false)
			}
			return sent{token: fmt.Appendf(nil, "tok-%d", n), seq: uint64(n + 1)}, nil
		}
		for n := range 2 {
			if _, err := d.turn(ctx, send, timer, 0, n); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}

	// A second publish of reply 0 with its Msg-Id: refused by the outbox.
	d := run("a-", func() { reply("a-r0", "answer tok-0", true) })
	if got := d.strays.Load(); got != 1 {
		t.Fatalf("%d strays, want 1", got)
	}
	republished, err := judgeStrays(ctx, d, out)
	if err != nil || republished != 1 {
		t.Fatalf("a refused re-publish: republished %d, %v; want 1, nil", republished, err)
	}

	// Reply 0 again under a Msg-Id of its own: stored, a user would see it
	// twice.
	d = run("b-", func() { reply("b-r0-again", "answer tok-0", false) })
	republished, err = judgeStrays(ctx, d, out)
	if err == nil || republished != 0 {
		t.Fatalf("a stored duplicate answer: republished %d, %v; want 0 and an error", republished, err)
	}
	for _, want := range []string{"lane 0", `"b-r0-again"`, "tok-0", "in flight message 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %s: %v", want, err)
		}
	}
	t.Log(err)
}
