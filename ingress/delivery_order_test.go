package ingress_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/ingress"
)

// TestDeliveryRedeliveredEarlierReplyNotStuck: an earlier reply of a lane
// redelivered (its first delivery went to another process, which let it go:
// a partition, an ack wait that ran out) after a later reply of the lane is
// already waiting for it in this process. The later one yields, the earlier
// one is delivered, then the later one. (Each used to wait for the other
// for ever: the later one retried "an earlier reply is pending" while the
// earlier one, queued behind it, was kept in progress. A 10 000-message
// chaos run stalled on it with 69 replies unacked.)
func TestDeliveryRedeliveredEarlierReplyNotStuck(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := ingress.NewDelivery(b.js, b.res, b.names, (&logRecorder{}).logger(t))
	// Another process takes the first reply and sits on it.
	cons, err := b.res.Outbox.CreateOrUpdateConsumer(ctx, d.ConsumerConfig())
	if err != nil {
		t.Fatal(err)
	}
	one := testReply(1, "one")
	b.publishReply(t, one, one.ID)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(waitTimeout))
	if err != nil {
		t.Fatal(err)
	}
	var held jetstream.Msg
	for m := range batch.Messages() {
		held = m
	}
	if held == nil {
		t.Fatal("the other process got no reply")
	}
	two := testReply(2, "two")
	b.publishReply(t, two, two.ID)

	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	// "two" is pulled and waits for "one"; give it time to start waiting,
	// then the other process lets "one" go, to this process.
	waitFor(t, "the second reply to be taken", func() error {
		info, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumAckPending < 2 {
			return fmt.Errorf("ack pending %d", info.NumAckPending)
		}
		return nil
	})
	if err := held.Nak(); err != nil {
		t.Fatal(err)
	}
	b.waitDelivered(t)
	wantTexts(t, b.mailbox(t, testKey), "one", "two")
}
