package worker_test

import (
	"encoding/json"
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

// postWith publishes a plain message to chat's lane (the key post derives)
// with mod applied to its source, as an adapter that does not bound names
// (or an older ingress) would.
func (f *fleet) postWith(chatID, text string, mod func(*session.SessionSource)) (string, uint64) {
	f.t.Helper()
	src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: chatID, ChatType: session.ChatDM, UserID: "u-" + chatID, UserName: "User " + chatID}
	key := session.BuildSessionKey(src, session.DefaultKeyOptions())
	lane := session.LaneToken(key)
	mod(&src)
	in := session.Inbound{Source: src, SessionKey: key, Kind: session.KindMessage, Text: text, ReceivedAt: time.Now()}
	data, err := json.Marshal(in)
	if err != nil {
		f.t.Fatal(err)
	}
	msg := nats.NewMsg(f.names.InboxSubject(session.Partition(f.names.Prefix(), lane), lane))
	msg.Data = data
	msg.Header.Set(broker.HdrSessionKey, key)
	msg.Header.Set(broker.HdrKind, session.KindMessage)
	ack, err := f.js.PublishMsg(f.t.Context(), msg)
	if err != nil {
		f.t.Fatal(err)
	}
	return lane, ack.Sequence
}

func (f *fleet) waitRepliesLong(lane string, n int) []session.Reply {
	f.t.Helper()
	var got []session.Reply
	natstest.WaitFor(f.t, 60*time.Second, fmt.Sprintf("%d replies on %s", n, lane), func() error {
		got = f.replies(lane)
		if len(got) < n {
			return fmt.Errorf("have %d", len(got))
		}
		return nil
	})
	return got
}

// TestLargeNamesDoNotJamTheLane is issue 12's defect 1: a chat name of
// 535,000 bytes made the entry (which held it twice) larger than the
// server takes, every attempt to record the turn failed, and the lane
// cycled its lease for ever without answering anything again.
func TestLargeNamesDoNotJamTheLane(t *testing.T) {
	f := newFleet(t)
	f.startWorker("w1", nil)
	big := strings.Repeat("n", 535000)
	lane, _ := f.postWith("pz", "hi", func(s *session.SessionSource) { s.ChatName = big })
	r := f.waitRepliesLong(lane, 1)
	if r[0].Text != "echo: hi" {
		t.Fatalf("reply %q", r[0].Text)
	}
	_, seq := f.post("pz", "again", "")
	r = f.waitRepliesLong(lane, 2)
	if r[1].Text != "echo: again" {
		t.Fatalf("second reply %q", r[1].Text)
	}
	e := f.waitCommitted(lane, seq)
	if e.DisplayName != big {
		t.Fatalf("display name of %d bytes, want the chat name", len(e.DisplayName))
	}
	if o, _ := e.OriginSource(); o.ChatName != "" && e.Origin.ChatName != "" {
		t.Fatalf("the entry stores the chat name twice")
	}
	if e.LeaseEpoch > 5 {
		t.Fatalf("lease epoch %d: the lane churned its lease", e.LeaseEpoch)
	}

	// Names too large even once: the turn is recorded without them.
	lane2, _ := f.postWith("pz2", "hello", func(s *session.SessionSource) {
		s.ChatName = strings.Repeat("c", 400000)
		s.ChatTopic = strings.Repeat("t", 300000)
		s.UserName = strings.Repeat("u", 300000)
	})
	if r := f.waitRepliesLong(lane2, 1); r[0].Text != "echo: hello" {
		t.Fatalf("reply %q", r[0].Text)
	}
}

// TestUnrecordableMessageIsDeadLettered: a message whose turn no retry can
// record (its source is larger than an entry may be) ends dead-lettered
// with a notice to the user, and the lane goes on.
func TestUnrecordableMessageIsDeadLettered(t *testing.T) {
	f := newFleet(t)
	f.startWorker("w1", nil)
	// The entry keeps a large chat name; a source as large again cannot be
	// recorded beside it.
	lane, _ := f.postWith("pz", "first", func(s *session.SessionSource) { s.ChatName = strings.Repeat("n", 600000) })
	f.waitRepliesLong(lane, 1)
	_, bad := f.postWith("pz", "poison", func(s *session.SessionSource) { s.UserIDAlt = strings.Repeat("x", 600000) })
	_, seq := f.post("pz", "after", "")
	r := f.waitRepliesLong(lane, 3)
	if r[1].Kind != session.ReplyKindNotice || !strings.Contains(r[1].Text, "too large") || r[2].Text != "echo: after" {
		t.Fatalf("replies %q %q %q", r[0].Text, r[1].Text, r[2].Text)
	}
	e := f.waitCommitted(lane, seq)
	if e.LeaseEpoch > 5 {
		t.Fatalf("lease epoch %d: the lane churned its lease", e.LeaseEpoch)
	}
	dl, err := f.res.Events.GetLastMsgForSubject(t.Context(), f.names.DeadLetterSubject(lane))
	if err != nil {
		t.Fatalf("dead letter: %v", err)
	}
	if dl.Header.Get(broker.HdrInboxSeq) != fmt.Sprint(bad) || !strings.Contains(dl.Header.Get(broker.HdrReason), "cannot be recorded") {
		t.Fatalf("dead letter headers %v", dl.Header)
	}
}

// TestFailedWritesDoNotCycleTheLease: while a store the turn needs is gone,
// its owner retries in place with a growing delay. It keeps the lease (the
// epoch does not climb with the attempts, as it did when every failure
// handed the lane to the next worker at once) and answers once the store
// is back.
func TestFailedWritesDoNotCycleTheLease(t *testing.T) {
	f := newFleet(t)
	f.startWorker("w1", nil)
	f.startWorker("w2", nil)
	if err := f.js.DeleteKeyValue(t.Context(), f.names.MsgIDsBucket()); err != nil {
		t.Fatal(err)
	}
	lane, seq := f.post("hiccup", "are you there?", "h-1")
	var epoch uint64
	natstest.WaitFor(t, 90*time.Second, "six attempts", func() error {
		e, _, err := f.store.Get(t.Context(), lane)
		if err != nil {
			return err
		}
		if e.Turn == nil || e.Turn.Attempt < 6 {
			return fmt.Errorf("turn %+v", e.Turn)
		}
		epoch = e.LeaseEpoch
		return nil
	})
	info, err := f.res.Leases.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// One lease, taken once or twice: not once per attempt. On a loaded
	// machine a starved liveness renewal can cost one or two takeovers, so
	// the bound leaves room for them; a lease cycled per attempt would be
	// at epoch 6 or more by now.
	if epoch > 4 {
		t.Fatalf("lease epoch %d after 6 attempts (leases bucket %d values): the lease cycled", epoch, info.Values())
	}
	if _, err := broker.Provision(t.Context(), f.js, broker.ProvisionConfig{Names: f.names, LeaseTTL: testTTL}); err != nil {
		t.Fatal(err)
	}
	r := f.waitRepliesLong(lane, 1)
	e := f.waitCommitted(lane, seq)
	if r[0].Text != "echo: are you there?" || e.Suspended {
		t.Fatalf("reply %q, suspended %v", r[0].Text, e.Suspended)
	}
	_ = jetstream.ErrKeyNotFound
}
