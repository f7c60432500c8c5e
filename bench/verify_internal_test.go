package bench

import (
	"context"
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
}
