package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/admin"
	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

// TestMigrateInboxWaitsForTheDrain: with no worker running, a lane's
// message waits uncommitted in stream 0, so moving its partition cannot
// drain: the migration gives up after its drain timeout, puts the batch back
// where it was (the map and the stream's subjects as before, the message
// still there, publishes taken again). A worker then handles the message,
// and the same command, run again, moves everything; the lane's next
// message lands in its new stream and is answered there. A concurrent
// change of the map is refused.
func TestMigrateInboxWaitsForTheDrain(t *testing.T) {
	srv := natstest.RunServer(t)
	names := broker.MustNames("fleet")
	nc := srv.Connect(t)
	js := natstest.JetStream(t, nc)
	if _, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second}); err != nil {
		t.Fatal(err)
	}
	fl, err := admin.Open(t.Context(), js, names)
	if err != nil {
		t.Fatal(err)
	}
	// A lane whose partition moves to stream 1 of 2 (an odd partition).
	var chat, key, lane string
	for i := 0; ; i++ {
		chat = fmt.Sprintf("mv-%d", i)
		src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: chat, ChatType: session.ChatDM, UserID: "u"}
		key = session.BuildSessionKey(src, session.DefaultKeyOptions())
		lane = session.LaneToken(key)
		if session.Partition(names.Prefix(), lane)%2 == 1 {
			break
		}
	}
	p := session.Partition(names.Prefix(), lane)
	post := func(text string) *jetstream.PubAck {
		t.Helper()
		src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: chat, ChatType: session.ChatDM, UserID: "u"}
		data, _ := json.Marshal(session.Inbound{Source: src, SessionKey: key, Kind: session.KindMessage, Text: text, ReceivedAt: time.Now()})
		msg := nats.NewMsg(names.InboxSubject(p, lane))
		msg.Data = data
		msg.Header.Set(broker.HdrSessionKey, key)
		msg.Header.Set(broker.HdrKind, session.KindMessage)
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		ack, err := js.PublishMsg(ctx, msg, broker.InboxPublishOptions()...)
		if err != nil {
			t.Fatal(err)
		}
		return ack
	}
	post("first")

	_, err = fl.MigrateInbox(t.Context(), 2, admin.MigrateOptions{Batch: 64, DrainTimeout: time.Second})
	if err == nil {
		t.Fatal("the migration moved a partition whose message was never handled")
	}
	t.Logf("as expected: %v", err)
	if err := fl.Res.Inboxes.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	m, _ := fl.Res.Inboxes.Map()
	if len(m.Moving) != 0 || m.Assign[p] != 0 {
		t.Fatalf("after the failed drain the map is %s with partition %d in stream %d, want it back in 0", m, p, m.Assign[p])
	}
	st0, err := js.Stream(t.Context(), names.InboxStreamAt(0))
	if err != nil {
		t.Fatal(err)
	}
	if subs := st0.CachedInfo().Config.Subjects; !slices.Contains(subs, names.InboxPartitionSubject(p)) {
		t.Fatalf("stream 0 no longer takes partition %d: %v", p, subs)
	}
	if _, err := st0.GetLastMsgForSubject(t.Context(), names.InboxSubject(p, lane)); err != nil {
		t.Fatalf("the waiting message: %v", err)
	}
	if ack := post("second"); ack.Stream != names.InboxStreamAt(0) {
		t.Fatalf("a publish after the failed migration went to %s", ack.Stream)
	}

	// A worker handles the lane; the migration then goes through.
	wnc := srv.Connect(t)
	wjs := natstest.JetStream(t, wnc)
	wres, err := broker.Provision(t.Context(), wjs, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(wnc, wjs, wres, worker.Config{ID: "mv-1", Names: names, Backend: echo.Backend(echo.Options{}),
		LeaseTTL: 3 * time.Second, LeaseMargin: 500 * time.Millisecond, PeekInterval: 100 * time.Millisecond, DrainTimeout: 2 * time.Second,
		Linger: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })

	rep, err := fl.MigrateInbox(t.Context(), 2, admin.MigrateOptions{DrainTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if rep.From != 1 || rep.To != 2 || rep.Moved != 32 {
		t.Fatalf("report %+v, want 1 -> 2 with 32 partitions moved", rep)
	}
	if _, err := fl.MigrateInbox(t.Context(), 2, admin.MigrateOptions{}); err != nil {
		t.Fatalf("running it again: %v", err)
	}
	ack := post("third")
	if ack.Stream != names.InboxStreamAt(1) {
		t.Fatalf("the lane's message after the move went to %s, want %s", ack.Stream, names.InboxStreamAt(1))
	}
	if _, err := st0.GetLastMsgForSubject(t.Context(), names.InboxSubject(p, lane)); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("stream 0 still holds the moved partition's messages: %v", err)
	}
	natstest.WaitFor(t, 30*time.Second, "the lane to commit its message in stream 1", func() error {
		e, _, err := fl.Store.Get(t.Context(), lane)
		if err != nil {
			return err
		}
		if err := fl.Res.Inboxes.Refresh(t.Context()); err != nil {
			return err
		}
		in := fl.Res.Inboxes.ForLane(lane)
		if in.Name != names.InboxStreamAt(1) {
			return fmt.Errorf("the map puts the lane in %s", in.Name)
		}
		if e.InboxID != in.ID || e.CommittedSeq < ack.Sequence {
			return fmt.Errorf("entry in inbox %s at %d, want %s at %d", e.InboxID, e.CommittedSeq, in.ID, ack.Sequence)
		}
		return nil
	})
	e, _, err := fl.Store.Get(t.Context(), lane)
	if err != nil {
		t.Fatal(err)
	}
	entries, _, err := fl.TX.Load(t.Context(), e.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	var users []string
	for _, e := range entries {
		if e.Role == "user" {
			users = append(users, e.Content)
		}
	}
	if !slices.Equal(users, []string{"first", "second", "third"}) {
		t.Fatalf("user entries %q", users)
	}

}
