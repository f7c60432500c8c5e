package worker

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestForwardToAGoneHolderBounces: a worker that remembers a holder whose
// process is gone forwards into a subject nobody listens on; the server's
// "no responders" answer hands the delivery back at once, and its
// redelivery takes the (free) lane. The consumer's ack wait is 30 s here: a
// forward lost without the answer would leave the message waiting for it.
func TestForwardToAGoneHolderBounces(t *testing.T) {
	t.Parallel()
	_, nc, js, names, res := provisionFleet(t, 30*time.Second)
	w, err := New(nc, js, res, Config{ID: "w", Names: names, Backend: echo.Backend(echo.Options{}), LeaseTTL: 30 * time.Second,
		Reset: session.ResetConfig{Default: session.ResetPolicy{Mode: session.ResetNone}}})
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, w, "worker")

	src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: "gone", ChatType: session.ChatDM, UserID: "u"}
	key := session.BuildSessionKey(src, session.DefaultKeyOptions())
	lane := session.LaneToken(key)
	// The worker saw another process hold the lane a moment ago; that
	// process is gone (nothing listens on its forward subject).
	w.heldElsewhere.Store(lane, heldInfo{until: time.Now().Add(time.Hour), owner: "gone/00000000"})

	data, _ := json.Marshal(session.Inbound{Source: src, SessionKey: key, Kind: session.KindMessage, Text: "hello", ReceivedAt: time.Now()})
	msg := nats.NewMsg(names.InboxSubject(session.Partition(names.Prefix(), lane), lane))
	msg.Data = data
	msg.Header.Set(broker.HdrSessionKey, key)
	msg.Header.Set(broker.HdrKind, session.KindMessage)
	ack, err := js.PublishMsg(t.Context(), msg)
	if err != nil {
		t.Fatal(err)
	}
	store := kv.NewStore(res, nil)
	natstest.WaitFor(t, 20*time.Second, "the message to be run", func() error {
		e, _, err := store.Get(t.Context(), lane)
		if err != nil {
			return err
		}
		if e.CommittedSeq < ack.Sequence {
			return fmt.Errorf("committed %d < %d", e.CommittedSeq, ack.Sequence)
		}
		return nil
	})
	if n := w.Stats().ForwardsBounced.Load(); n != 1 {
		t.Fatalf("%d forwards bounced, want 1", n)
	}
}

// TestForwardGoneIsPruned: the owners a forward bounced from are forgotten
// once their time ran out, when another bounces, so peers' stopped
// incarnations do not pile up in a long-running worker.
func TestForwardGoneIsPruned(t *testing.T) {
	var f forwards
	t0 := time.Unix(1_000_000, 0)
	for i := range 100 {
		f.markGone(fmt.Sprintf("w%d/old", i), t0)
	}
	f.markGone("w1/new", t0.Add(heldElsewhereFor))
	var left []string
	f.gone.Range(func(k, _ any) bool {
		left = append(left, k.(string))
		return true
	})
	if len(left) != 1 || left[0] != "w1/new" {
		t.Fatalf("remembered after the others' time ran out: %v, want [w1/new]", left)
	}
}

// TestCopiesInOneStepClaimInOrder: two inbox copies of one platform
// message in the same step (seq 5 and seq 9) do not race for its msgids
// record: the first copy owns it, whatever the order the claims would have
// landed in, so the message is incorporated at its first seq and the later
// copy is the duplicate.
func TestCopiesInOneStepClaimInOrder(t *testing.T) {
	t.Parallel()
	_, nc, js, names, res := provisionFleet(t, 30*time.Second)
	w, err := New(nc, js, res, Config{ID: "w", Names: names, Backend: echo.Backend(echo.Options{}), LeaseTTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for round := range 20 {
		l := newLane(w, fmt.Sprintf("copies-%d", round))
		l.ctx = t.Context()
		id := fmt.Sprintf("http:copies:%d", round)
		msgs := []inboxMsg{
			{seq: 5, body: session.Inbound{PlatformMsgID: id}},
			{seq: 6, body: session.Inbound{PlatformMsgID: id + "-other"}},
			{seq: 9, body: session.Inbound{PlatformMsgID: id}},
		}
		claims := l.prefetchMsgIDs(msgs)
		for _, c := range []struct {
			seq, owner uint64
		}{{9, 5}, {5, 5}, {6, 6}} {
			owner, err := claims[c.seq].Wait(t.Context())
			if err != nil || owner.Seq != c.owner {
				t.Fatalf("round %d: claim of seq %d: owner %d, error %v; want owner %d", round, c.seq, owner.Seq, err, c.owner)
			}
		}
	}
}

// TestDuplicateAcrossInboxStreams: the msgids record names the inbox
// stream of the message that incorporated a platform message id, so a
// platform retry that landed in another stream (its partition moved) at the
// same seq as the first copy in the old stream is still a duplicate, while
// the first copy, seen again (a redelivery, a retried step), is not. An
// older record (a seq alone) is judged by its seq, as before.
func TestDuplicateAcrossInboxStreams(t *testing.T) {
	t.Parallel()
	_, nc, js, names, res := provisionFleet(t, 30*time.Second)
	w, err := New(nc, js, res, Config{ID: "w", Names: names, Backend: echo.Backend(echo.Options{}), LeaseTTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l := newLane(w, "moved")
	l.ctx = t.Context()
	const id = "http:moved:1"
	first := inboxMsg{seq: 5, inboxID: "old-stream", body: session.Inbound{PlatformMsgID: id}}
	retry := inboxMsg{seq: 5, inboxID: "new-stream", body: session.Inbound{PlatformMsgID: id}}
	for i, c := range []struct {
		m    inboxMsg
		want bool
	}{{first, false}, {first, false}, {retry, true}} {
		dup, err := l.duplicate(c.m)
		if err != nil || dup != c.want {
			t.Fatalf("check %d (seq %d in %s): duplicate %v, %v; want %v", i, c.m.seq, c.m.inboxID, dup, err, c.want)
		}
	}
	if !l.duplicateCopy(t.Context(), &retry) || l.duplicateCopy(t.Context(), &first) {
		t.Fatal("duplicateCopy does not tell the copy in the new stream from the first")
	}

	// A record written before records named their stream.
	if _, err := res.MsgIDs.Put(t.Context(), w.msgids.Key("http:moved:2"), []byte("7")); err != nil {
		t.Fatal(err)
	}
	old := inboxMsg{seq: 7, inboxID: "new-stream", body: session.Inbound{PlatformMsgID: "http:moved:2"}}
	if dup, err := l.duplicate(old); err != nil || dup {
		t.Fatalf("the message of an older record: duplicate %v, %v", dup, err)
	}
	old.seq = 8
	if dup, err := l.duplicate(old); err != nil || !dup {
		t.Fatalf("a copy at another seq than an older record's: duplicate %v, %v", dup, err)
	}
}
