package ingress_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
)

const testKey = "agent:main:http:dm:c1"

func testReply(n int, text string) session.Reply {
	return session.Reply{
		ID:         fmt.Sprintf("20250101_120000_abcdef01:%d", n),
		SessionKey: testKey,
		SessionID:  "20250101_120000_abcdef01",
		TurnID:     fmt.Sprintf("turn-%d", n),
		TxSeq:      uint64(n),
		Kind:       session.ReplyKindReply,
		Text:       text,
		Platform:   session.PlatformHTTP,
		ChatID:     "c1",
		CreatedAt:  time.Date(2025, 1, 1, 12, 0, n, 0, time.UTC),
	}
}

// publishReply publishes rep to the outbox as a worker does, with msgID as
// its Nats-Msg-Id, and returns the ack.
func (b *testBundle) publishReply(t *testing.T, rep session.Reply, msgID string) *jetstream.PubAck {
	t.Helper()
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	m := nats.NewMsg(b.names.OutboxSubject("http", session.LaneToken(rep.SessionKey)))
	m.Data = data
	ack, err := b.js.PublishMsg(ctx, m, jetstream.WithMsgID(msgID))
	if err != nil {
		t.Fatal(err)
	}
	return ack
}

// mailbox returns every reply in the lane's mailbox, in stream order.
func (b *testBundle) mailbox(t *testing.T, key string) []session.Reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	subj := b.names.BoxSubject("http", session.LaneToken(key))
	var out []session.Reply
	for seq := uint64(1); ; {
		m, err := b.res.Outbox.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		seq = m.Sequence + 1
		if m.Header.Get("Fleet-Kind") == "skip" {
			continue // a marker for an unreadable reply
		}
		var rep session.Reply
		if err := json.Unmarshal(m.Data, &rep); err != nil {
			t.Fatal(err)
		}
		out = append(out, rep)
	}
}

// waitDelivered waits until the delivery consumer has acked everything.
func (b *testBundle) waitDelivered(t *testing.T) {
	t.Helper()
	waitFor(t, "the delivery consumer to ack everything", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		cons, err := b.res.Outbox.Consumer(ctx, b.names.DeliveryConsumer("http"))
		if err != nil {
			return err
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumPending != 0 || info.NumAckPending != 0 {
			return fmt.Errorf("pending %d, ack pending %d", info.NumPending, info.NumAckPending)
		}
		// The consumer's pending counts follow a new message a moment after
		// its PubAck, so they alone can read zero before the consumer saw
		// the newest reply: its ack floor must have passed that reply.
		last, err := b.res.Outbox.GetLastMsgForSubject(ctx, info.Config.FilterSubject)
		if err != nil {
			return err
		}
		if info.AckFloor.Stream < last.Sequence {
			return fmt.Errorf("ack floor %d, newest reply at %d", info.AckFloor.Stream, last.Sequence)
		}
		return nil
	})
}

func wantTexts(t *testing.T, got []session.Reply, want ...string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("mailbox holds %d replies, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i].Text != want[i] {
			t.Fatalf("mailbox[%d] = %q, want %q (all: %+v)", i, got[i].Text, want[i], got)
		}
	}
}

func TestDeliveryOnceAndInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{delivery: true})

	r1, r2, r3 := testReply(1, "one"), testReply(2, "two"), testReply(3, "three")
	b.publishReply(t, r1, r1.ID)
	b.publishReply(t, r2, r2.ID)
	if ack := b.publishReply(t, r2, r2.ID); !ack.Duplicate {
		t.Fatal("the outbox stored a repeated Msg-Id")
	}
	// A republish the stream cannot see as a duplicate (another Msg-Id, or
	// the stream's window is over): the delivered bucket catches it.
	if ack := b.publishReply(t, r2, "other-msg-id"); ack.Duplicate {
		t.Fatal("the outbox dropped another Msg-Id")
	}
	b.publishReply(t, r3, r3.ID)

	b.waitDelivered(t)
	wantTexts(t, b.mailbox(t, testKey), "one", "two", "three")

	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for _, r := range []session.Reply{r1, r2, r3} {
		if _, err := b.res.Delivered.Get(ctx, session.LaneToken(r.ID)); err != nil {
			t.Errorf("reply %s not recorded as delivered: %v", r.ID, err)
		}
	}

	// A reply for another platform is not ours.
	other := testReply(4, "for telegram")
	other.SessionKey = "agent:main:telegram:dm:c1"
	data, _ := json.Marshal(other)
	if _, err := b.js.Publish(ctx, b.names.OutboxSubject("telegram", session.LaneToken(other.SessionKey)), data); err != nil {
		t.Fatal(err)
	}
	b.publishReply(t, testReply(5, "five"), testReply(5, "").ID)
	b.waitDelivered(t)
	wantTexts(t, b.mailbox(t, testKey), "one", "two", "three", "five")
	if got := b.mailbox(t, other.SessionKey); len(got) != 0 {
		t.Fatalf("telegram reply delivered to an http mailbox: %+v", got)
	}
}

func TestDeliveryConsumerConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	d := ingress.NewDelivery(b.js, b.res, b.names, nil)
	d.Stop() // without Start: a no-op
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); !errors.Is(err, ingress.ErrAlreadyStarted) {
		t.Fatalf("second Start: %v", err)
	}
	d.Stop()
	d.Stop()
	// Start again after Stop: the consumer is updated in place.
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer d.Stop()

	cons, err := b.res.Outbox.Consumer(ctx, "deliver_http")
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := info.Config
	if c.AckPolicy != jetstream.AckExplicitPolicy || c.AckWait != 30*time.Second || c.MaxDeliver != -1 ||
		c.MaxAckPending != ingress.DeliveryMaxAckPending || c.FilterSubject != "fleet.out.http.>" || c.Durable != "deliver_http" {
		t.Fatalf("consumer config %+v", c)
	}
}

// A failing mailbox publish is retried in place: nothing is skipped and no
// later reply overtakes it.
func TestDeliveryRetriesInOrder(t *testing.T) {
	t.Parallel()
	logs := &logRecorder{}
	b := setup(t, setupOpts{logs: logs})
	for i, text := range []string{"one", "two", "three"} {
		r := testReply(i+1, text)
		b.publishReply(t, r, r.ID)
	}

	// Fill the outbox: every mailbox publish now fails.
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	info, err := b.res.Outbox.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	orig := info.Config
	full := orig
	full.MaxMsgs = int64(info.State.Msgs)
	full.Discard = jetstream.DiscardNew
	if _, err := b.js.UpdateStream(ctx, full); err != nil {
		t.Fatal(err)
	}

	d := ingress.NewDelivery(b.js, b.res, b.names, logs.logger(t))
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	waitFor(t, "three failed attempts", func() error {
		if n := logs.count("reply delivery failed; retrying"); n < 3 {
			return fmt.Errorf("%d failed attempts", n)
		}
		return nil
	})
	if got := b.mailbox(t, testKey); len(got) != 0 {
		t.Fatalf("mailbox got %+v while full", got)
	}

	if _, err := b.js.UpdateStream(ctx, orig); err != nil {
		t.Fatal(err)
	}
	b.waitDelivered(t)
	wantTexts(t, b.mailbox(t, testKey), "one", "two", "three")
}

// A reply that can never be delivered does not block the ones after it.
func TestDeliveryTerminatesPoison(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{delivery: true})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	lane := session.LaneToken(testKey)
	for _, data := range []string{`not json`, `{"text":"no id"}`} {
		if _, err := b.js.Publish(ctx, b.names.OutboxSubject("http", lane), []byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	r := testReply(1, "after the poison")
	b.publishReply(t, r, r.ID)
	b.waitDelivered(t)
	wantTexts(t, b.mailbox(t, testKey), "after the poison")
}

// TestDeliveryGivesUpOnOversizeReply: a reply whose mailbox copy (with its
// extra headers) is larger than the server takes can never be delivered;
// the user gets a notice in its place (issue 12: it used to vanish), it is
// terminated and reported on the events stream instead of holding up the
// lane's later replies, and the poison and decode failures are reported
// the same way.
func TestDeliveryGivesUpOnOversizeReply(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{delivery: true})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	lane := session.LaneToken(testKey)
	events, err := b.nc.SubscribeSync(b.names.EventSubject("undeliverable", ">"))
	if err != nil {
		t.Fatal(err)
	}
	// Fill the reply up to just under the limit for the outbox publish.
	big := testReply(1, "")
	base, _ := json.Marshal(big)
	msgID := big.ID
	overhead := len(base) + len("NATS/1.0\r\n\r\n") + len("Nats-Msg-Id: \r\n") + len(msgID) + 64
	big.Text = strings.Repeat("x", int(b.nc.MaxPayload())-overhead)
	b.publishReply(t, big, msgID)
	if _, err := b.js.Publish(ctx, b.names.OutboxSubject("http", lane), []byte(`not json`)); err != nil {
		t.Fatal(err)
	}
	r := testReply(2, "after the oversize reply")
	b.publishReply(t, r, r.ID)
	b.waitDelivered(t)
	box := b.mailbox(t, testKey)
	if len(box) != 2 || box[0].Kind != session.ReplyKindNotice || box[0].ID != big.ID || box[0].TurnID != big.TurnID ||
		!strings.Contains(box[0].Text, "too large") || box[1].Text != "after the oversize reply" {
		t.Fatalf("mailbox %+v, want the notice standing for the oversize reply, then the next reply", box)
	}

	var got []map[string]any
	for len(got) < 2 {
		m, err := events.NextMsg(waitTimeout)
		if err != nil {
			t.Fatalf("undeliverable events: %v (have %v)", err, got)
		}
		var ev map[string]any
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatal(err)
		}
		got = append(got, ev)
	}
	if got[0]["reply_id"] != big.ID || !strings.Contains(fmt.Sprint(got[0]["error"]), "payload") {
		t.Fatalf("first event %v, want the oversize reply %s", got[0], big.ID)
	}
	if got[1]["reply_id"] != "" || got[1]["subject"] != b.names.OutboxSubject("http", lane) {
		t.Fatalf("second event %v, want the undecodable one", got[1])
	}
}
