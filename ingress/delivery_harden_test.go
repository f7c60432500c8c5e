package ingress_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestDeliveryOnceBeyondTheDuplicateWindow is issue 12's defect 2: the
// mailbox copy of a reply was stored but recording it as delivered kept
// failing (the store was full); once the outbox's Msg-Id window had passed,
// the next attempt stored a second copy. The delivery now reads what the
// mailbox holds before publishing again.
func TestDeliveryOnceBeyondTheDuplicateWindow(t *testing.T) {
	t.Parallel()
	logs := &logRecorder{}
	b := setup(t, setupOpts{logs: logs})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// A one-second Msg-Id window, so the test need not wait ten minutes.
	info, err := b.res.Outbox.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	short := info.Config
	short.Duplicates = time.Second
	if _, err := b.js.UpdateStream(ctx, short); err != nil {
		t.Fatal(err)
	}
	// The delivered bucket is full: every record of a delivery fails.
	kvs, err := b.js.Stream(ctx, "KV_"+b.names.DeliveredBucket())
	if err != nil {
		t.Fatal(err)
	}
	orig := kvs.CachedInfo().Config
	full := orig
	full.MaxBytes = 1
	if _, err := b.js.UpdateStream(ctx, full); err != nil {
		t.Fatal(err)
	}

	d := ingress.NewDelivery(b.js, b.res, b.names, logs.logger(t))
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	r := testReply(1, "one")
	b.publishReply(t, r, r.ID)
	// Six failed attempts, 100ms doubling: the last ones come seconds
	// after the mailbox copy, well past the one-second window.
	natstest.WaitFor(t, time.Minute, "six failed attempts", func() error {
		if n := logs.count("reply delivery failed; retrying"); n < 6 {
			return fmt.Errorf("%d failed attempts", n)
		}
		return nil
	})
	if _, err := b.js.UpdateStream(ctx, orig); err != nil {
		t.Fatal(err)
	}
	b.waitDelivered(t)
	wantTexts(t, b.mailbox(t, testKey), "one")
}

// TestDeliveryStuckReplyDoesNotStallOtherLanes: while one lane's reply
// cannot reach its mailbox (here the ingress user may not publish there),
// the replies of every other lane are delivered. (The consumer used to hand
// out one reply at a time, so every lane waited behind the stuck one.)
func TestDeliveryStuckReplyDoesNotStallOtherLanes(t *testing.T) {
	t.Parallel()
	names := broker.MustNames("fleet")
	stuckKey := "agent:main:http:dm:stuck"
	stuckBox := names.BoxSubject("http", session.LaneToken(stuckKey))
	srv := natstest.RunServer(t, natstest.WithServerOptions(func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "admin", Password: "a"},
			{Username: "ingress", Password: "i", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{stuckBox}},
			}},
		}
	}))
	admin := srv.Connect(t, nats.UserInfo("admin", "a"))
	ajs := natstest.JetStream(t, admin)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := broker.Provision(ctx, ajs, broker.ProvisionConfig{Names: names})
	if err != nil {
		t.Fatal(err)
	}
	inc := srv.Connect(t, nats.UserInfo("ingress", "i"))
	ijs := natstest.JetStream(t, inc)
	ires, err := broker.Provision(ctx, ijs, broker.ProvisionConfig{Names: names})
	if err != nil {
		t.Fatal(err)
	}
	logs := &logRecorder{}
	d := ingress.NewDelivery(ijs, ires, names, logs.logger(t))
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)

	b := &testBundle{nc: admin, js: ajs, res: res, names: names}
	stuck := testReply(1, "stuck")
	stuck.SessionKey = stuckKey
	b.publishReply(t, stuck, stuck.ID)
	natstest.WaitFor(t, time.Minute, "the stuck reply to fail once", func() error {
		if logs.count("reply delivery failed; retrying") == 0 {
			return fmt.Errorf("no failed attempt yet")
		}
		return nil
	})
	for i := range 5 {
		r := testReply(10+i, fmt.Sprintf("lane %d", i))
		r.SessionKey = fmt.Sprintf("agent:main:http:dm:other%d", i)
		b.publishReply(t, r, r.ID)
	}
	for i := range 5 {
		key := fmt.Sprintf("agent:main:http:dm:other%d", i)
		natstest.WaitFor(t, time.Minute, "the reply of "+key, func() error {
			if got := b.mailbox(t, key); len(got) != 1 || got[0].Text != fmt.Sprintf("lane %d", i) {
				return fmt.Errorf("mailbox %+v", got)
			}
			return nil
		})
	}
	if got := b.mailbox(t, stuckKey); len(got) != 0 {
		t.Fatalf("the stuck lane's mailbox holds %+v", got)
	}
	_ = jetstream.ErrMsgNotFound
}
