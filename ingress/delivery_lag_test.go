package ingress_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/ingress"
)

// laggingOutbox answers reads by sequence like a replica that lags behind
// the leader (a direct get may go to any replica): it holds none of the
// recent outbox messages.
type laggingOutbox struct{ jetstream.Stream }

func (laggingOutbox) GetMsg(context.Context, uint64, ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	return nil, jetstream.ErrMsgNotFound
}

// TestDeliveryEarlierReplyNotOvertakenOnALaggingRead: a later reply of a
// lane must not go into the mailbox while an earlier one (held by another
// process) is undelivered, even when the read that looks for earlier
// replies is answered by a replica that does not hold it yet. Otherwise
// the mailbox's last outbox seq passes the earlier reply's, and that one,
// when it comes, is taken as delivered: lost (a 10 000-message chaos run
// lost two replies of one lane so, right after a NATS node rejoined).
func TestDeliveryEarlierReplyNotOvertakenOnALaggingRead(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := *b.res
	res.Outbox = laggingOutbox{b.res.Outbox}
	d := ingress.NewDelivery(b.js, &res, b.names, (&logRecorder{}).logger(t))
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
	// "two" is taken: it waits for "one", or (the defect) is delivered.
	waitFor(t, "the second reply to be taken", func() error {
		if len(b.mailbox(t, testKey)) > 0 {
			return nil
		}
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
