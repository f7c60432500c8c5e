package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// migrateFleet is a one-stream fleet with one echo worker, and a lane whose
// partition moves to stream 1 when the fleet grows to 2 streams.
type migrateFleet struct {
	t     *testing.T
	srv   *natstest.Server
	names broker.Names
	js    jetstream.JetStream
	fl    *admin.Fleet
	chat  string
	key   string
	lane  string
	p     int
}

func newMigrateFleet(t *testing.T) *migrateFleet {
	f := newMigrateFleetNoWorker(t)
	f.startWorker("mv-1")
	return f
}

// newMigrateFleetNoWorker is a migrateFleet whose worker is not started:
// no lane's message is committed until startWorker.
func newMigrateFleetNoWorker(t *testing.T) *migrateFleet {
	srv := natstest.RunServer(t)
	f := &migrateFleet{t: t, srv: srv, names: broker.MustNames("fleet")}
	nc := srv.Connect(t)
	f.js = natstest.JetStream(t, nc)
	if _, err := broker.Provision(t.Context(), f.js, broker.ProvisionConfig{Names: f.names, LeaseTTL: 3 * time.Second}); err != nil {
		t.Fatal(err)
	}
	fl, err := admin.Open(t.Context(), f.js, f.names)
	if err != nil {
		t.Fatal(err)
	}
	f.fl = fl
	for i := 0; ; i++ {
		f.chat = fmt.Sprintf("mv-%d", i)
		src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: f.chat, ChatType: session.ChatDM, UserID: "u"}
		f.key = session.BuildSessionKey(src, session.DefaultKeyOptions())
		f.lane = session.LaneToken(f.key)
		if session.Partition(f.names.Prefix(), f.lane)%2 == 1 {
			break
		}
	}
	f.p = session.Partition(f.names.Prefix(), f.lane)
	return f
}

// startWorker runs an echo worker until the test ends.
func (f *migrateFleet) startWorker(id string) {
	t := f.t
	wnc := f.srv.Connect(t)
	wjs := natstest.JetStream(t, wnc)
	wres, err := broker.Provision(t.Context(), wjs, broker.ProvisionConfig{Names: f.names, LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(wnc, wjs, wres, worker.Config{ID: id, Names: f.names, Backend: echo.Backend(echo.Options{}),
		LeaseTTL: 3 * time.Second, LeaseMargin: 500 * time.Millisecond, PeekInterval: 100 * time.Millisecond, DrainTimeout: 2 * time.Second,
		Linger: 200 * time.Millisecond, Reset: session.ResetConfig{Default: session.ResetPolicy{Mode: session.ResetNone}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
}

func (f *migrateFleet) msg(text string) *nats.Msg {
	src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: f.chat, ChatType: session.ChatDM, UserID: "u"}
	data, _ := json.Marshal(session.Inbound{Source: src, SessionKey: f.key, Kind: session.KindMessage, Text: text, ReceivedAt: time.Now()})
	msg := nats.NewMsg(f.names.InboxSubject(f.p, f.lane))
	msg.Data = data
	msg.Header.Set(broker.HdrSessionKey, f.key)
	msg.Header.Set(broker.HdrKind, session.KindMessage)
	return msg
}

func (f *migrateFleet) post(text string) *jetstream.PubAck {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.t.Context(), 20*time.Second)
	defer cancel()
	ack, err := f.js.PublishMsg(ctx, f.msg(text), broker.InboxPublishOptions()...)
	if err != nil {
		f.t.Fatal(err)
	}
	return ack
}

// postAfterTheMove posts "after" on the lane, checks that it went to
// stream 1 and waits until the lane commits it there.
func (f *migrateFleet) postAfterTheMove() {
	f.t.Helper()
	after := f.post("after")
	if after.Stream != f.names.InboxStreamAt(1) {
		f.t.Fatalf("the lane's message after the move went to %s", after.Stream)
	}
	f.waitCommitted(1, after.Sequence)
}

// storeLate stores a message of the lane in stream 0 while its partition is
// closed there: what a replicated stream does with a publish it accepted
// just before the close and applies after it. Stream 0 takes the
// partition's subject for the moment of the publish (and any other stream
// that takes it, a stream a stopped migration opened, lets go of it for
// that moment).
func (f *migrateFleet) storeLate(text string) *jetstream.PubAck {
	f.t.Helper()
	ctx := f.t.Context()
	subj := f.names.InboxPartitionSubject(f.p)
	var undo []jetstream.StreamConfig
	for i := 1; i < broker.MaxInboxStreams; i++ {
		st, err := f.js.Stream(ctx, f.names.InboxStreamAt(i))
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			f.t.Fatal(err)
		}
		cfg := st.CachedInfo().Config
		if !slices.Contains(cfg.Subjects, subj) {
			continue
		}
		undo = append(undo, cfg)
		cfg.Subjects = slices.DeleteFunc(slices.Clone(cfg.Subjects), func(s string) bool { return s == subj })
		if _, err := f.js.UpdateStream(ctx, cfg); err != nil {
			f.t.Fatal(err)
		}
	}
	st, err := f.js.Stream(ctx, f.names.InboxStreamAt(0))
	if err != nil {
		f.t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	undo = append(undo, cfg)
	cfg.Subjects = append(slices.Clone(cfg.Subjects), subj)
	if _, err := f.js.UpdateStream(ctx, cfg); err != nil {
		f.t.Fatal(err)
	}
	ack, err := f.js.PublishMsg(ctx, f.msg(text))
	if err != nil {
		f.t.Fatal(err)
	}
	for _, cfg := range slices.Backward(undo) {
		if _, err := f.js.UpdateStream(ctx, cfg); err != nil {
			f.t.Fatal(err)
		}
	}
	if ack.Stream != f.names.InboxStreamAt(0) {
		f.t.Fatalf("the late message went to %s", ack.Stream)
	}
	return ack
}

// waitCommitted waits for the lane to commit seq in inbox stream i.
func (f *migrateFleet) waitCommitted(i int, seq uint64) {
	f.t.Helper()
	natstest.WaitFor(f.t, 60*time.Second, fmt.Sprintf("the lane to commit seq %d in stream %d", seq, i), func() error {
		e, _, err := f.fl.Store.Get(f.t.Context(), f.lane)
		if err != nil {
			return err
		}
		if err := f.fl.Res.Inboxes.Refresh(f.t.Context()); err != nil {
			return err
		}
		in := f.fl.Res.Inboxes.ForLane(f.lane)
		if in.Name != f.names.InboxStreamAt(i) {
			return fmt.Errorf("the map puts the lane in %s", in.Name)
		}
		if e.InboxID != in.ID || e.CommittedSeq < seq {
			return fmt.Errorf("entry in inbox %s at %d, want %s at %d", e.InboxID, e.CommittedSeq, in.ID, seq)
		}
		return nil
	})
}

// users is the lane's user entries in its transcript.
func (f *migrateFleet) users() []string {
	f.t.Helper()
	e, _, err := f.fl.Store.Get(f.t.Context(), f.lane)
	if err != nil {
		f.t.Fatal(err)
	}
	entries, _, err := f.fl.TX.Load(f.t.Context(), e.SessionID)
	if err != nil {
		f.t.Fatal(err)
	}
	var users []string
	for _, e := range entries {
		if e.Role == "user" {
			users = append(users, e.Content)
		}
	}
	return users
}

// TestMigrateInboxPurgeIsBoundedByTheDrain: a message of a moving partition
// stored in its old stream after the drain looked (a publish a replicated
// stream applies just after the close; stored here right after the flip, so
// that no worker reads it before the purge) is not purged with the partition:
// the purge goes up to the seq the drain recorded in the map, the message
// found after it puts the partition back in its old stream, which drains
// again, and the message is answered there before the move ends. The same
// holds when the migration is killed between the flip and the purge and run
// again: the re-run purges up to the recorded bound only. The lane's
// transcript holds every message once, in order.
func TestMigrateInboxPurgeIsBoundedByTheDrain(t *testing.T) {
	for _, killed := range []bool{false, true} {
		t.Run(fmt.Sprintf("killed=%v", killed), func(t *testing.T) {
			f := newMigrateFleet(t)
			first := f.post("first")
			f.waitCommitted(0, first.Sequence)

			var o admin.MigrateOptions
			o.Batch, o.DrainTimeout = 64, 30*time.Second
			injected := false
			var late *jetstream.PubAck
			inject := func() {
				if !injected {
					injected = true
					late = f.storeLate("late")
				}
			}
			errKilled := errors.New("killed after the flip")
			admin.SetMigrateStep(&o, func(step string) error {
				if injected || step != "flipped" {
					return nil
				}
				inject()
				if killed {
					return errKilled
				}
				return nil
			})
			_, err := f.fl.MigrateInbox(t.Context(), 2, o)
			if killed {
				if !errors.Is(err, errKilled) {
					t.Fatalf("the killed migration: %v", err)
				}
				m, _, rerr := broker.ReadInboxMap(t.Context(), mustBucket(t, f))
				if rerr != nil {
					t.Fatal(rerr)
				}
				if len(m.Moving) != 32 || !m.Flipped(m.Moving[0]) || m.Moving[0].Drained == nil || m.Moving[0].Closed.IsZero() {
					t.Fatalf("after the kill the map is %s, moving %+v", m, m.Moving)
				}
				_, err = f.fl.MigrateInbox(t.Context(), 2, admin.MigrateOptions{DrainTimeout: 30 * time.Second})
			}
			if err != nil {
				t.Fatal(err)
			}
			if late == nil {
				t.Fatal("no late message was stored")
			}
			f.postAfterTheMove()
			if users := f.users(); !slices.Equal(users, []string{"first", "late", "after"}) {
				t.Fatalf("user entries %q, want first, late, after", users)
			}
			st0, err := f.js.Stream(t.Context(), f.names.InboxStreamAt(0))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st0.GetLastMsgForSubject(t.Context(), f.names.InboxSubject(f.p, f.lane)); !errors.Is(err, jetstream.ErrMsgNotFound) {
				t.Fatalf("stream 0 still holds the moved partition's messages: %v", err)
			}
		})
	}
}

func mustBucket(t *testing.T, f *migrateFleet) jetstream.KeyValue {
	t.Helper()
	b, err := f.js.KeyValue(t.Context(), f.names.InboxMapBucket())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestMigrateInboxMarkerBoundsTheDrain: a publish the old stream accepted
// before the close but stores only after it (a replicated stream applies it
// a moment later) is answered in the old stream before the move ends. The
// server takes a stream's publishes in order, so such a message is stored
// before anything published into the stream after the close: the test
// stores it just before the migration's drain marker (the latest the server
// can), or, if the migration publishes nothing into the old stream after
// the close, after the migration's last look at the old stream (the
// purge's check, here of the batch's last round). The lane's transcript
// then holds every message once, in order, and the old stream nothing of
// the moved partition.
func TestMigrateInboxMarkerBoundsTheDrain(t *testing.T) {
	f := newMigrateFleet(t)
	first := f.post("first")
	f.waitCommitted(0, first.Sequence)

	var o admin.MigrateOptions
	o.Batch, o.DrainTimeout = 64, 30*time.Second
	var late *jetstream.PubAck
	admin.SetMigrateBeforeMark(&o, func(stream int) {
		if late == nil && stream == 0 {
			late = f.storeLate("late")
		}
	})
	admin.SetMigrateStep(&o, func(step string) error {
		if late == nil && step == "purged" {
			late = f.storeLate("late")
		}
		return nil
	})
	if _, err := f.fl.MigrateInbox(t.Context(), 2, o); err != nil {
		t.Fatal(err)
	}
	if late == nil {
		t.Fatal("no late message was stored")
	}
	f.postAfterTheMove()
	if users := f.users(); !slices.Equal(users, []string{"first", "late", "after"}) {
		t.Fatalf("user entries %q, want first, late, after", users)
	}
	st0, err := f.js.Stream(t.Context(), f.names.InboxStreamAt(0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st0.GetLastMsgForSubject(t.Context(), f.names.InboxSubject(f.p, f.lane)); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("stream 0 still holds the moved partition's messages: %v", err)
	}
}

// TestMigrateInboxRerunClosesTheNewStream: a migration stopped between the
// open's subject change (the new stream takes the batch's subjects) and its
// map write, with a message of a moved partition left in its old stream
// past the drain's bound, is run again: its close takes the subjects off
// the new stream too, so while the partition goes back to its old stream to
// drain that message no stream but the one the map names takes publishes of
// it. Everything is answered once, in order.
func TestMigrateInboxRerunClosesTheNewStream(t *testing.T) {
	f := newMigrateFleet(t)
	first := f.post("first")
	f.waitCommitted(0, first.Sequence)

	f.stopAtOpenSubjects()
	subj := f.names.InboxPartitionSubject(f.p)
	if !slices.Contains(f.subjects(1), subj) {
		t.Fatalf("stream 1 does not take partition %d after the open's subject change: %v", f.p, f.subjects(1))
	}
	late := f.storeLate("late")

	var takers [][]int
	o := admin.MigrateOptions{DrainTimeout: 30 * time.Second}
	admin.SetMigrateStep(&o, func(step string) error {
		var in []int
		for i := range 2 {
			if slices.Contains(f.subjects(i), subj) {
				in = append(in, i)
			}
		}
		if step == "close-subjects" || step == "drained" {
			takers = append(takers, in)
		}
		return nil
	})
	if _, err := f.fl.MigrateInbox(t.Context(), 2, o); err != nil {
		t.Fatal(err)
	}
	if len(takers) == 0 {
		t.Fatal("the re-run did not close the batch")
	}
	for _, in := range takers {
		if len(in) != 0 {
			t.Fatalf("while the re-run moved the batch, streams %v took partition %d (each step: %v)", in, f.p, takers)
		}
	}
	f.postAfterTheMove()
	if users := f.users(); !slices.Equal(users, []string{"first", "late", "after"}) {
		t.Fatalf("user entries %q, want first, late, after (late at %d)", users, late.Sequence)
	}
}

// TestMigrateInboxDrainTimeoutReopensEachPartitionOnce: a batch whose first
// round flipped and purged its partitions but one (a message stored in its
// old stream past the drain's bound puts it back there), and whose second
// drain times out (no worker commits that message), is reopened with every
// partition taken by exactly one stream, the one the map names: the one put
// back by its old stream, the others by their new one. Run again with a
// worker, the migration finishes and the message is answered.
func TestMigrateInboxDrainTimeoutReopensEachPartitionOnce(t *testing.T) {
	f := newMigrateFleetNoWorker(t)
	var o admin.MigrateOptions
	o.Batch, o.DrainTimeout = 64, 5*time.Second
	var late *jetstream.PubAck
	admin.SetMigrateStep(&o, func(step string) error {
		if late == nil && step == "flipped" {
			late = f.storeLate("late")
		}
		return nil
	})
	_, err := f.fl.MigrateInbox(t.Context(), 2, o)
	if err == nil || late == nil {
		t.Fatalf("the migration: %v (late message stored: %v), want a drain timeout", err, late != nil)
	}
	t.Logf("as expected: %v", err)
	m, _, err := broker.ReadInboxMap(t.Context(), mustBucket(t, f))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Moving) != 0 || m.Assign[f.p] != 0 {
		t.Fatalf("after the drain timeout the map is %s, partition %d in stream %d, want nothing moving and it in 0",
			m, f.p, m.Assign[f.p])
	}
	f.checkSubjects(m)
	for p := 1; p < broker.Partitions; p += 2 {
		if p != f.p && m.Assign[p] != 1 {
			t.Fatalf("partition %d, flipped and purged, is in stream %d, want 1", p, m.Assign[p])
		}
	}

	f.startWorker("mv-1")
	if _, err := f.fl.MigrateInbox(t.Context(), 2, admin.MigrateOptions{DrainTimeout: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	f.postAfterTheMove()
	if users := f.users(); !slices.Equal(users, []string{"late", "after"}) {
		t.Fatalf("user entries %q, want late, after", users)
	}
}

// stopAtOpenSubjects runs a 1 -> 2 migration of every partition in one
// batch and stops it right after the open's subject change (before the
// open's map write): the new stream takes the partitions' publishes while
// the map still names the move.
func (f *migrateFleet) stopAtOpenSubjects() {
	f.t.Helper()
	errKilled := errors.New("killed after the open's subject change")
	var o admin.MigrateOptions
	o.Batch, o.DrainTimeout = 64, 30*time.Second
	admin.SetMigrateStep(&o, func(step string) error {
		if step == "open-subjects" {
			return errKilled
		}
		return nil
	})
	if _, err := f.fl.MigrateInbox(f.t.Context(), 2, o); !errors.Is(err, errKilled) {
		f.t.Fatalf("the stopped migration: %v", err)
	}
}

// subjects are the subjects inbox stream i takes.
func (f *migrateFleet) subjects(i int) []string {
	f.t.Helper()
	st, err := f.js.Stream(f.t.Context(), f.names.InboxStreamAt(i))
	if err != nil {
		f.t.Fatal(err)
	}
	return st.CachedInfo().Config.Subjects
}

// checkSubjects checks that each stream of m takes exactly the subjects m
// gives it, so each open partition is taken by exactly the stream m names,
// and that no stream past m's count is left.
func (f *migrateFleet) checkSubjects(m broker.InboxMap) {
	f.t.Helper()
	checkInboxSubjects(f.t, f.js, f.names, m)
}

func checkInboxSubjects(t *testing.T, js jetstream.JetStream, names broker.Names, m broker.InboxMap) {
	t.Helper()
	for i := 0; i < broker.MaxInboxStreams; i++ {
		st, err := js.Stream(t.Context(), names.InboxStreamAt(i))
		if i >= m.Streams {
			if !errors.Is(err, jetstream.ErrStreamNotFound) {
				t.Fatalf("stream %s past the map's %d streams: %v", names.InboxStreamAt(i), m.Streams, err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if got, want := st.CachedInfo().Config.Subjects, m.Subjects(names, i); !slices.Equal(got, want) {
			t.Fatalf("stream %s takes %v, the map (%s) gives it %v", names.InboxStreamAt(i), got, m, want)
		}
	}
}

// TestMigrateInboxStoppedAtEveryStep: with two workers and lanes that keep
// posting (each lane's next message once the previous one was stored,
// retried with the same message id while its partition is closed), the
// fleet goes from 1 to 2 inbox streams and back to 1, each migration
// stopped (as by a kill) after one of its steps, then run again to the end.
// For every step: each lane's transcript holds exactly the messages it
// posted, once each, in order; after each migration the map has its target
// and nothing moving, each stream takes exactly the subjects the map gives
// it, the emptied streams are gone, and no stream holds a message of a
// partition it is not assigned.
func TestMigrateInboxStoppedAtEveryStep(t *testing.T) {
	if testing.Short() {
		t.Skip("a migration per step under load")
	}
	for _, stop := range admin.MigrateSteps {
		t.Run(stop, func(t *testing.T) {
			f := newMigrateFleet(t)
			f.startWorker("mv-2")
			ps := startPosters(t, func() jetstream.JetStream { return natstest.JetStream(t, f.srv.Connect(t)) }, f.names, "stop-"+stop, 6)
			ps.waitPosted(t, 2)
			stopped := 0
			for _, target := range []int{2, 1} {
				errKilled := fmt.Errorf("killed after %s", stop)
				var o admin.MigrateOptions
				o.Batch, o.DrainTimeout = 16, 60*time.Second
				admin.SetMigrateStep(&o, func(step string) error {
					if step == stop {
						admin.SetMigrateStep(&o, nil)
						return errKilled
					}
					return nil
				})
				_, err := f.fl.MigrateInbox(t.Context(), target, o)
				if err != nil {
					if !errors.Is(err, errKilled) {
						t.Fatalf("migrate to %d: %v", target, err)
					}
					stopped++
					if _, err = f.fl.MigrateInbox(t.Context(), target, admin.MigrateOptions{Batch: 16, DrainTimeout: 60 * time.Second}); err != nil {
						t.Fatalf("migrate to %d again: %v", target, err)
					}
				}
				f.checkMigratedTo(target)
				ps.waitPosted(t, 2)
			}
			if stopped == 0 {
				t.Fatalf("no migration met step %s", stop)
			}
			ps.stop(t)
			ps.checkTranscripts(t, f.fl)
		})
	}
}

// checkMigratedTo checks that a migration to target has finished: the map
// names target streams and no move, and the streams' subjects and what each
// stream holds are those of the map.
func (f *migrateFleet) checkMigratedTo(target int) {
	f.t.Helper()
	checkMapSettled(f.t, f.js, f.names, target)
}

// checkMapSettled checks that the inbox map names target streams and no
// move, and that the streams' subjects and what each stream holds are those
// of the map. It returns the map and its revision.
func checkMapSettled(t *testing.T, js jetstream.JetStream, names broker.Names, target int) (broker.InboxMap, uint64) {
	t.Helper()
	m, rev, err := broker.ReadInboxMap(t.Context(), mustBucketJS(t, js, names))
	if err != nil {
		t.Fatal(err)
	}
	if m.Streams != target || m.Migrating() {
		t.Fatalf("after the migration to %d the map is %s", target, m)
	}
	checkInboxSubjects(t, js, names, m)
	checkInboxHolds(t, js, names, m)
	return m, rev
}

// checkInboxHolds checks that each stream of m holds messages of its
// partitions only.
func checkInboxHolds(t *testing.T, js jetstream.JetStream, names broker.Names, m broker.InboxMap) {
	t.Helper()
	for i := 0; i < m.Streams; i++ {
		st, err := js.Stream(t.Context(), names.InboxStreamAt(i))
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(t.Context(), jetstream.WithSubjectFilter(names.InboxWildcard()))
		if err != nil {
			t.Fatal(err)
		}
		for subj := range info.State.Subjects {
			var p int
			if _, err := fmt.Sscanf(strings.TrimPrefix(subj, names.Prefix()+".in."), "%d.", &p); err != nil {
				t.Fatalf("subject %s in %s: %v", subj, names.InboxStreamAt(i), err)
			}
			if m.Assign[p] != i {
				t.Fatalf("stream %s holds %s of partition %d, assigned to stream %d", names.InboxStreamAt(i), subj, p, m.Assign[p])
			}
		}
	}
}

// posters are lanes posting one message after the other until stopped, as
// the ingress does: a publish is retried with the same message id while its
// partition is closed (no stream answers) or its first copy is still being
// stored. A lane keeps at most postWindow messages unanswered (it waits up
// to postPace for the replies before it posts anyway), so that a fleet
// slowed by a loaded machine is not handed a backlog that outlasts a
// drain's timeout.
type posters struct {
	names broker.Names
	lanes []*posterLane
	quit  chan struct{}
	wg    sync.WaitGroup
	errs  chan error
	done  bool
}

type posterLane struct {
	key, lane string
	mu        sync.Mutex
	sent      []string
}

func (l *posterLane) posted() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.sent)
}

func startPosters(t *testing.T, connect func() jetstream.JetStream, names broker.Names, tag string, lanes int) *posters {
	ps := &posters{names: names, quit: make(chan struct{}), errs: make(chan error, lanes)}
	for i := range lanes {
		src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: fmt.Sprintf("%s-%d", tag, i), ChatType: session.ChatDM, UserID: "u"}
		key := session.BuildSessionKey(src, session.DefaultKeyOptions())
		l := &posterLane{key: key, lane: session.LaneToken(key)}
		ps.lanes = append(ps.lanes, l)
		js := connect()
		// The highest message number a reply of the lane named: a reply
		// the subscription missed (a reconnect) is made up for by the
		// next one.
		var answered atomic.Int64
		answered.Store(-1)
		replied := make(chan struct{}, 1)
		mine := regexp.MustCompile(regexp.QuoteMeta(fmt.Sprintf("%s-%d-", tag, i)) + `(\d+)`)
		sub, err := js.Conn().Subscribe(names.OutboxLaneFilter(l.lane), func(m *nats.Msg) {
			var r session.Reply
			if json.Unmarshal(m.Data, &r) != nil {
				return
			}
			for _, g := range mine.FindAllStringSubmatch(r.Text, -1) {
				if n, err := strconv.ParseInt(g[1], 10, 64); err == nil && n > answered.Load() {
					answered.Store(n)
				}
			}
			select {
			case replied <- struct{}{}:
			default:
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		ps.wg.Add(1)
		go func() {
			defer ps.wg.Done()
			defer func() { _ = sub.Unsubscribe() }()
			p := session.Partition(names.Prefix(), l.lane)
			for n := 0; ; n++ {
				select {
				case <-ps.quit:
					return
				default:
				}
				for paced := time.After(postPace); int64(n)-answered.Load() > postWindow; {
					select {
					case <-ps.quit:
						return
					case <-replied:
						continue
					case <-paced:
					}
					break
				}
				text := fmt.Sprintf("%s-%d-%d", tag, i, n)
				data, _ := json.Marshal(session.Inbound{Source: src, SessionKey: key, Kind: session.KindMessage, Text: text,
					PlatformMsgID: "http:" + text, ReceivedAt: time.Now()})
				msg := nats.NewMsg(names.InboxSubject(p, l.lane))
				msg.Data = data
				msg.Header.Set(broker.HdrSessionKey, key)
				msg.Header.Set(broker.HdrKind, session.KindMessage)
				deadline := time.Now().Add(2 * time.Minute)
				var err error
				for {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					_, err = js.PublishMsg(ctx, msg, append(broker.InboxPublishOptions(), jetstream.WithMsgID("http:"+text))...)
					cancel()
					if err == nil || time.Now().After(deadline) {
						break
					}
					select {
					case <-ps.quit:
						// Stopped mid-retry: whether the message was stored
						// is unknown; the lane's check allows it either way.
						l.mu.Lock()
						l.sent = append(l.sent, "?"+text)
						l.mu.Unlock()
						return
					case <-time.After(100 * time.Millisecond):
					}
				}
				if err != nil {
					ps.errs <- fmt.Errorf("lane %d: post %s: %w", i, text, err)
					return
				}
				l.mu.Lock()
				l.sent = append(l.sent, text)
				l.mu.Unlock()
				select {
				case <-ps.quit:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
	}
	t.Cleanup(func() { ps.stop(t) })
	return ps
}

// postWindow is how many messages a poster's lane keeps unanswered at
// most, and postPace how long it waits for a reply before it posts anyway.
const (
	postWindow = 3
	postPace   = 5 * time.Second
)

// waitPosted waits until every lane posted n more messages.
func (ps *posters) waitPosted(t *testing.T, n int) {
	t.Helper()
	from := make([]int, len(ps.lanes))
	for i, l := range ps.lanes {
		from[i] = len(l.posted())
	}
	natstest.WaitFor(t, 2*time.Minute, fmt.Sprintf("every lane to post %d more", n), func() error {
		select {
		case err := <-ps.errs:
			t.Fatal(err)
		default:
		}
		for i, l := range ps.lanes {
			if got := len(l.posted()) - from[i]; got < n {
				return fmt.Errorf("lane %s posted %d", l.lane, got)
			}
		}
		return nil
	})
}

func (ps *posters) stop(t *testing.T) {
	if !ps.done {
		ps.done = true
		close(ps.quit)
		ps.wg.Wait()
	}
	select {
	case err := <-ps.errs:
		t.Error(err)
	default:
	}
}

// checkTranscripts waits for every lane's transcript to hold exactly the
// messages it posted, once each, in order (a message whose post was cut
// short by the stop may be there or not).
func (ps *posters) checkTranscripts(t *testing.T, fl *admin.Fleet) {
	t.Helper()
	for _, l := range ps.lanes {
		sent := l.posted()
		if len(sent) == 0 {
			t.Fatalf("lane %s posted nothing", l.lane)
		}
		want := sent
		optional := ""
		if last := sent[len(sent)-1]; strings.HasPrefix(last, "?") {
			want, optional = sent[:len(sent)-1], last[1:]
		}
		waitTranscript(t, fl, l.lane, want, optional)
	}
}

// waitTranscript waits for the lane's transcript to hold exactly want, once
// each, in order; if optional is not empty, it may also hold optional after
// them.
func waitTranscript(t *testing.T, fl *admin.Fleet, lane string, want []string, optional string) {
	t.Helper()
	natstest.WaitFor(t, 2*time.Minute, "lane "+lane+" to incorporate every message", func() error {
		e, _, err := fl.Store.Get(t.Context(), lane)
		if err != nil {
			return err
		}
		if e.Turn != nil {
			return fmt.Errorf("turn in flight")
		}
		entries, _, err := fl.TX.Load(t.Context(), e.SessionID)
		if err != nil {
			return err
		}
		var users []string
		for _, e := range entries {
			if e.Role == "user" {
				users = append(users, e.Content)
			}
		}
		if len(users) < len(want) {
			return fmt.Errorf("%d of %d messages incorporated", len(users), len(want))
		}
		if optional != "" && len(users) == len(want)+1 && users[len(users)-1] == optional {
			users = users[:len(want)]
		}
		if !slices.Equal(users, want) {
			t.Fatalf("lane %s: transcript users %q, want exactly %q", lane, users, want)
		}
		return nil
	})
}

// A second migration to the current count, run while a first one has added
// its new stream and not yet written its map, must not leave the first
// naming a stream it deleted: the second writes the map before deleting,
// so the first's write fails, and running the first again finishes it.
func TestMigrateInboxConcurrentNoOpDoesNotDeleteUnderAGrow(t *testing.T) {
	f := newMigrateFleet(t)
	first := f.post("first")
	f.waitCommitted(0, first.Sequence)
	var o admin.MigrateOptions
	o.DrainTimeout = 30 * time.Second
	var second error
	ran := false
	admin.SetMigrateStep(&o, func(step string) error {
		if step == "grown" && !ran {
			ran = true
			if _, err := f.fl.JS.Stream(t.Context(), f.names.InboxStreamAt(1)); err != nil {
				t.Errorf("at the grown step the new stream: %v", err)
			}
			_, second = f.fl.MigrateInbox(t.Context(), 1, admin.MigrateOptions{})
		}
		return nil
	})
	_, err := f.fl.MigrateInbox(t.Context(), 2, o)
	if !ran || second != nil {
		t.Fatalf("the second migration ran: %v, its error: %v", ran, second)
	}
	if !errors.Is(err, admin.ErrMapChanged) {
		t.Fatalf("the first migration: %v, want ErrMapChanged", err)
	}
	m, _, err := broker.ReadInboxMap(t.Context(), mustBucket(t, f))
	if err != nil {
		t.Fatal(err)
	}
	if m.Streams != 1 || m.Migrating() {
		t.Fatalf("after the refused write the map is %s, want 1 stream, nothing moving", m)
	}
	if _, err := f.fl.MigrateInbox(t.Context(), 2, admin.MigrateOptions{DrainTimeout: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	f.postAfterTheMove()
	if users := f.users(); !slices.Equal(users, []string{"first", "after"}) {
		t.Fatalf("user entries %q, want first, after", users)
	}
}

// holds reports whether inbox stream i holds the message at seq.
func (f *migrateFleet) holds(i int, seq uint64) bool {
	f.t.Helper()
	st, err := f.js.Stream(f.t.Context(), f.names.InboxStreamAt(i))
	if err != nil {
		f.t.Fatal(err)
	}
	_, err = st.GetMsg(f.t.Context(), seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return true
}

// removeMsg removes the message at seq from inbox stream i, as an operator
// would with nats stream rmm.
func (f *migrateFleet) removeMsg(i int, seq uint64) {
	f.t.Helper()
	st, err := f.js.Stream(f.t.Context(), f.names.InboxStreamAt(i))
	if err != nil {
		f.t.Fatal(err)
	}
	if err := st.DeleteMsg(f.t.Context(), seq); err != nil {
		f.t.Fatal(err)
	}
}

// useLowLane makes the fleet's lane one of partition 1, whose move to
// stream 1 is in the first batch of 8.
func (f *migrateFleet) useLowLane() {
	for i := 0; ; i++ {
		chat := fmt.Sprintf("low-%d", i)
		src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: chat, ChatType: session.ChatDM, UserID: "u"}
		key := session.BuildSessionKey(src, session.DefaultKeyOptions())
		lane := session.LaneToken(key)
		if p := session.Partition(f.names.Prefix(), lane); p == 1 {
			f.chat, f.key, f.lane, f.p = chat, key, lane, p
			return
		}
	}
}

// TestMigrateInboxStrayAfterTheOpen: a message of a moved partition stored
// in its old stream after the open (what a replica of a replicated stream
// that becomes leader before applying the close can do with a publish
// retried to it) is not left there unanswered. Stored right after its
// batch's open, with nothing of the partition in its new stream yet: the
// migration's look after that open closes the partition again (before the
// next batch closes), moves it through its old stream, and the message is
// answered there, in order. Stored with the migration stopped right after
// that open, the re-run's last look over every stream does the same.
func TestMigrateInboxStrayAfterTheOpen(t *testing.T) {
	for _, stopped := range []bool{false, true} {
		t.Run(fmt.Sprintf("stopped=%v", stopped), func(t *testing.T) {
			f := newMigrateFleet(t)
			f.useLowLane()
			first := f.post("first")
			f.waitCommitted(0, first.Sequence)

			var o admin.MigrateOptions
			o.Batch, o.DrainTimeout = 8, 30*time.Second
			errKilled := errors.New("killed after the open")
			var late *jetstream.PubAck
			var closedNext []int // the partitions of the next close after the stray
			admin.SetMigrateStep(&o, func(step string) error {
				if late != nil {
					if step == "closed" && closedNext == nil {
						m, _, err := broker.ReadInboxMap(t.Context(), mustBucket(t, f))
						if err != nil {
							return err
						}
						for _, mv := range m.Moving {
							closedNext = append(closedNext, mv.P)
						}
					}
					return nil
				}
				if step != "opened" {
					return nil
				}
				late = f.storeLate("late")
				if stopped {
					return errKilled
				}
				return nil
			})
			rep, err := f.fl.MigrateInbox(t.Context(), 2, o)
			if !stopped && rep.Moved != 33 {
				t.Errorf("the report counts %d moves, want 33 (32 partitions, one of them moved again)", rep.Moved)
			}
			if stopped {
				if !errors.Is(err, errKilled) {
					t.Fatalf("the stopped migration: %v", err)
				}
				_, err = f.fl.MigrateInbox(t.Context(), 2, admin.MigrateOptions{DrainTimeout: 30 * time.Second})
			}
			if err != nil {
				t.Fatal(err)
			}
			if late == nil {
				t.Fatal("no late message was stored")
			}
			if !stopped && !slices.Equal(closedNext, []int{f.p}) {
				t.Fatalf("after the stray was stored, the next close took partitions %v, want only %d", closedNext, f.p)
			}
			checkMapSettled(t, f.js, f.names, 2)
			f.postAfterTheMove()
			if users := f.users(); !slices.Equal(users, []string{"first", "late", "after"}) {
				t.Fatalf("user entries %q, want first, late, after", users)
			}
		})
	}
}

// TestMigrateInboxStrayAfterTheOpenBehindNewerMessages: a message of a
// moved partition stored in its old stream after the open, once a lane of
// the partition has posted and committed a newer message in the new stream
// (its own lane: it can no longer be answered in order; another lane: the
// partition cannot go back to its old stream without that lane's message
// being answered again), is not answered by the migration: the migration
// closes the partition, fails with ErrInBothStreams naming the partition,
// the old stream, the message's seq and its lane, and deletes nothing;
// running it again fails the same way. Once an operator removed the message
// (nats stream rmm), the command opens the partition in its new stream.
func TestMigrateInboxStrayAfterTheOpenBehindNewerMessages(t *testing.T) {
	for _, other := range []bool{false, true} {
		t.Run(fmt.Sprintf("other=%v", other), func(t *testing.T) {
			f := newMigrateFleet(t)
			first := f.post("first")
			f.waitCommitted(0, first.Sequence)
			g, why, want := f, "can no longer be answered in order", []string{"first", "newer", "after"}
			if other {
				g, why, want = f.otherLane(), fmt.Sprintf("(none of lane %s)", f.lane), []string{"first", "after"}
			}

			var o admin.MigrateOptions
			o.Batch, o.DrainTimeout = 64, 30*time.Second
			var late, newer *jetstream.PubAck
			admin.SetMigrateStep(&o, func(step string) error {
				if late != nil || step != "opened" {
					return nil
				}
				newer = g.post("newer")
				if newer.Stream != f.names.InboxStreamAt(1) {
					t.Errorf("the lane's message after the open went to %s", newer.Stream)
				}
				g.waitCommitted(1, newer.Sequence)
				late = f.storeLate("late")
				return nil
			})
			_, err := f.fl.MigrateInbox(t.Context(), 2, o)
			if late == nil {
				t.Fatalf("no late message was stored: %v", err)
			}
			checkInBoth(t, f, err, late.Sequence, why)
			if _, err := f.fl.MigrateInbox(t.Context(), 2, admin.MigrateOptions{DrainTimeout: 30 * time.Second}); err != nil {
				checkInBoth(t, f, err, late.Sequence, why)
			} else {
				t.Fatal("running the command again opened the partition with a message left in its old stream")
			}
			if !f.holds(1, newer.Sequence) {
				t.Fatal("the newer message is gone from stream 1")
			}
			if users, want := f.users(), want[:len(want)-1]; !slices.Equal(users, want) {
				t.Fatalf("user entries %q, want %q", users, want)
			}
			if users := g.users(); other && !slices.Equal(users, []string{"newer"}) {
				t.Fatalf("the other lane's user entries %q, want newer", users)
			}

			f.removeMsg(0, late.Sequence)
			if _, err := f.fl.MigrateInbox(t.Context(), 2, admin.MigrateOptions{DrainTimeout: 30 * time.Second}); err != nil {
				t.Fatal(err)
			}
			checkMapSettled(t, f.js, f.names, 2)
			f.postAfterTheMove()
			if users := f.users(); !slices.Equal(users, want) {
				t.Fatalf("user entries %q, want %q", users, want)
			}
			if users := g.users(); other && !slices.Equal(users, []string{"newer"}) {
				t.Fatalf("the other lane's user entries %q, want newer", users)
			}
		})
	}
}

// otherLane is a copy of f for another lane of the same partition.
func (f *migrateFleet) otherLane() *migrateFleet {
	g := *f
	for i := 0; ; i++ {
		g.chat = fmt.Sprintf("other-%d", i)
		src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: g.chat, ChatType: session.ChatDM, UserID: "u"}
		g.key = session.BuildSessionKey(src, session.DefaultKeyOptions())
		g.lane = session.LaneToken(g.key)
		if session.Partition(f.names.Prefix(), g.lane) == f.p {
			return &g
		}
	}
}

// checkInBoth checks that err is ErrInBothStreams naming the lane's
// partition, stream 0 and seq, and why, and that the partition is closed
// (moving, flipped, taken by no stream) with the message still in stream 0.
func checkInBoth(t *testing.T, f *migrateFleet, err error, seq uint64, why string) {
	t.Helper()
	if !errors.Is(err, admin.ErrInBothStreams) {
		t.Fatalf("the migration: %v, want ErrInBothStreams", err)
	}
	t.Logf("as expected: %v", err)
	for _, want := range []string{fmt.Sprintf("partition %d:", f.p), fmt.Sprintf("message %d of lane %s left in its old stream %s", seq, f.lane, f.names.InboxStreamAt(0)),
		why, "nats stream rmm"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("the error does not say %q: %v", want, err)
		}
	}
	m, _, err := broker.ReadInboxMap(t.Context(), mustBucket(t, f))
	if err != nil {
		t.Fatal(err)
	}
	if m.IsOpen(f.p) || m.Assign[f.p] != 1 {
		t.Fatalf("the map is %s, partition %d open: %v, in stream %d; want it closed, flipped to 1", m, f.p, m.IsOpen(f.p), m.Assign[f.p])
	}
	f.checkSubjects(m)
	if !f.holds(0, seq) {
		t.Fatalf("the message left in stream 0 (seq %d) is gone", seq)
	}
}

// TestMigrateInboxResidueWithMessagesInTheNewStream: a migration stopped
// between the open's subject change and its map write lets the new stream
// take publishes of the batch's partitions, which their lanes commit there
// (the map names it); a message of such a lane then stored in the old
// stream past the drain's bound cannot go back to the old stream to be
// answered (it would come after the committed newer one, and that one
// would be answered again): the re-run keeps the partition closed and fails
// with ErrInBothStreams, deleting nothing; once the message is removed, it
// finishes.
func TestMigrateInboxResidueWithMessagesInTheNewStream(t *testing.T) {
	f := newMigrateFleet(t)
	first := f.post("first")
	f.waitCommitted(0, first.Sequence)

	f.stopAtOpenSubjects()
	newer := f.post("newer")
	if newer.Stream != f.names.InboxStreamAt(1) {
		t.Fatalf("the lane's message after the open's subject change went to %s", newer.Stream)
	}
	f.waitCommitted(1, newer.Sequence)
	late := f.storeLate("late")

	_, err := f.fl.MigrateInbox(t.Context(), 2, admin.MigrateOptions{DrainTimeout: 30 * time.Second})
	checkInBoth(t, f, err, late.Sequence, "can no longer be answered in order")
	if !f.holds(1, newer.Sequence) {
		t.Fatal("the newer message is gone from stream 1")
	}
	if users := f.users(); !slices.Equal(users, []string{"first", "newer"}) {
		t.Fatalf("user entries %q, want first, newer", users)
	}

	f.removeMsg(0, late.Sequence)
	if _, err := f.fl.MigrateInbox(t.Context(), 2, admin.MigrateOptions{DrainTimeout: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	f.postAfterTheMove()
	if users := f.users(); !slices.Equal(users, []string{"first", "newer", "after"}) {
		t.Fatalf("user entries %q, want first, newer, after", users)
	}
}

// useLaneIn makes the fleet's lane one of partition p.
func (f *migrateFleet) useLaneIn(p int) {
	for i := 0; ; i++ {
		chat := fmt.Sprintf("in-%d-%d", p, i)
		src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: chat, ChatType: session.ChatDM, UserID: "u"}
		key := session.BuildSessionKey(src, session.DefaultKeyOptions())
		lane := session.LaneToken(key)
		if session.Partition(f.names.Prefix(), lane) == p {
			f.chat, f.key, f.lane, f.p = chat, key, lane, p
			return
		}
	}
}

// TestMigrateInboxStrayFromAnEarlierMigration: a message of a partition
// stored in a stream it moved out of after that migration's last look (the
// known limit) is found by the next migration's first look, before the
// partition moves back into that stream, where its lanes would read it first
// (they start a stream they did not count in from its first message), after
// their newer messages. With a newer message of its lane in the partition's
// stream, the partition closes with ErrInBothStreams, naming the message and
// how many more of the partition are left there, and nothing is answered
// out of order; once they are removed, the command finishes. With none,
// the messages are answered there, in order.
func TestMigrateInboxStrayFromAnEarlierMigration(t *testing.T) {
	for _, newer := range []bool{false, true} {
		t.Run(fmt.Sprintf("newer=%v", newer), func(t *testing.T) {
			f := newMigrateFleet(t)
			first := f.post("first")
			f.waitCommitted(0, first.Sequence)
			o := admin.MigrateOptions{DrainTimeout: 30 * time.Second}
			if _, err := f.fl.MigrateInbox(t.Context(), 2, o); err != nil {
				t.Fatal(err)
			}
			stray := f.storeLate("stray")
			stray2 := f.storeLate("stray2")
			want := []string{"first", "stray", "stray2", "after"}
			if newer {
				n := f.post("newer")
				if n.Stream != f.names.InboxStreamAt(1) {
					t.Fatalf("the lane's message after the move went to %s", n.Stream)
				}
				f.waitCommitted(1, n.Sequence)
				want = []string{"first", "newer", "after"}
				// A message of another partition in stream 0, not counted
				// with the partition's.
				h := *f
				h.useLaneIn(0)
				h.post("other")
			}
			_, err := f.fl.MigrateInbox(t.Context(), 1, o)
			if newer {
				checkInBoth(t, f, err, stray.Sequence, "can no longer be answered in order")
				if !strings.Contains(err.Error(), "(and 1 more of the partition)") {
					t.Fatalf("the error does not count the other message left: %v", err)
				}
				if users := f.users(); !slices.Equal(users, []string{"first", "newer"}) {
					t.Fatalf("user entries %q, want first, newer", users)
				}
				f.removeMsg(0, stray.Sequence)
				f.removeMsg(0, stray2.Sequence)
				_, err = f.fl.MigrateInbox(t.Context(), 1, o)
			}
			if err != nil {
				t.Fatal(err)
			}
			m, _, err := broker.ReadInboxMap(t.Context(), mustBucket(t, f))
			if err != nil {
				t.Fatal(err)
			}
			if m.Streams != 1 || m.Migrating() {
				t.Fatalf("after the migration the map is %s", m)
			}
			f.checkSubjects(m)
			after := f.post("after")
			f.waitCommitted(0, after.Sequence)
			if users := f.users(); !slices.Equal(users, want) {
				t.Fatalf("user entries %q, want %q", users, want)
			}
		})
	}
}

// TestMigrateInboxStrayInTheStreamAPartitionMovesInto: a message of a
// partition found in the stream the partition is about to move into (stored
// there after the migration's first look, before a newer message of its
// lane was posted and committed in the partition's stream) keeps the
// partition from flipping: the batch is reopened, the partition open in its
// stream, and the command fails saying so; run again, its first look closes
// the partition with ErrInBothStreams. Nothing is answered out of order.
func TestMigrateInboxStrayInTheStreamAPartitionMovesInto(t *testing.T) {
	f := newMigrateFleet(t)
	f.useLaneIn(63) // moves back to stream 0 in the last batch of 8
	first := f.post("first")
	f.waitCommitted(0, first.Sequence)
	o := admin.MigrateOptions{DrainTimeout: 30 * time.Second}
	if _, err := f.fl.MigrateInbox(t.Context(), 2, o); err != nil {
		t.Fatal(err)
	}
	var stray, newer *jetstream.PubAck
	o.Batch = 8
	admin.SetMigrateStep(&o, func(step string) error {
		if stray != nil || step != "opened" {
			return nil
		}
		stray = f.storeLate("stray")
		newer = f.post("newer")
		if newer.Stream != f.names.InboxStreamAt(1) {
			t.Errorf("the lane's message went to %s", newer.Stream)
		}
		f.waitCommitted(1, newer.Sequence)
		return nil
	})
	_, err := f.fl.MigrateInbox(t.Context(), 1, o)
	if stray == nil {
		t.Fatalf("no stray was stored: %v", err)
	}
	if err == nil || errors.Is(err, admin.ErrInBothStreams) || !strings.Contains(err.Error(), fmt.Sprintf("holds message %d", stray.Sequence)) {
		t.Fatalf("the migration: %v, want the batch reopened for message %d", err, stray.Sequence)
	}
	t.Logf("as expected: %v", err)
	m, _, err := broker.ReadInboxMap(t.Context(), mustBucket(t, f))
	if err != nil {
		t.Fatal(err)
	}
	if !m.IsOpen(f.p) || m.Assign[f.p] != 1 {
		t.Fatalf("the map is %s; want partition %d open in stream 1", m, f.p)
	}
	f.checkSubjects(m)
	if users := f.users(); !slices.Equal(users, []string{"first", "newer"}) {
		t.Fatalf("user entries %q, want first, newer", users)
	}
	o = admin.MigrateOptions{DrainTimeout: 30 * time.Second}
	_, err = f.fl.MigrateInbox(t.Context(), 1, o)
	checkInBoth(t, f, err, stray.Sequence, "can no longer be answered in order")
	f.removeMsg(0, stray.Sequence)
	if _, err := f.fl.MigrateInbox(t.Context(), 1, o); err != nil {
		t.Fatal(err)
	}
	after := f.post("after")
	f.waitCommitted(0, after.Sequence)
	if users := f.users(); !slices.Equal(users, []string{"first", "newer", "after"}) {
		t.Fatalf("user entries %q, want first, newer, after", users)
	}
}

// TestMigrateInboxCommittedStrayIsPurged: a message of a moved partition
// found in its old stream after the open that its lane committed there (an
// owner still bound to the old stream answered it; simulated by writing
// the lane's entry) is purged, not reported as left behind, even when the
// new stream holds messages of the partition (of another lane): posting it
// again would answer it twice. The migration finishes.
func TestMigrateInboxCommittedStrayIsPurged(t *testing.T) {
	f := newMigrateFleet(t)
	first := f.post("first")
	f.waitCommitted(0, first.Sequence)
	g := f.otherLane()

	var o admin.MigrateOptions
	o.Batch, o.DrainTimeout = 64, 30*time.Second
	var late *jetstream.PubAck
	admin.SetMigrateStep(&o, func(step string) error {
		if late != nil || step != "opened" {
			return nil
		}
		newer := g.post("newer")
		g.waitCommitted(1, newer.Sequence)
		late = f.storeLate("late")
		st, err := f.js.Stream(t.Context(), f.names.InboxStreamAt(0))
		if err != nil {
			return err
		}
		// The lane's owner (which bound it to stream 1 at the flip) lets
		// go of it first: the entry is written as if it had answered the
		// late message in stream 0 instead.
		natstest.WaitFor(t, 60*time.Second, "the lane's lease to be released", func() error {
			l, err := f.fl.ReadLease(t.Context(), f.lane)
			if err == nil && l != nil {
				err = fmt.Errorf("held by %s", l.Owner)
			}
			return err
		})
		_, _, err = f.fl.Store.Mutate(t.Context(), f.lane, nil, 0, nil, func(e *session.SessionEntry) (*session.SessionEntry, error) {
			if e == nil {
				return nil, errors.New("the lane has no entry")
			}
			e.InboxID, e.CommittedSeq = st.CachedInfo().Config.Metadata[broker.InboxIDMetadata], late.Sequence
			return e, nil
		})
		return err
	})
	if _, err := f.fl.MigrateInbox(t.Context(), 2, o); err != nil {
		t.Fatal(err)
	}
	if late == nil {
		t.Fatal("no late message was stored")
	}
	if f.holds(0, late.Sequence) {
		t.Fatal("the committed message is still in stream 0")
	}
	checkMapSettled(t, f.js, f.names, 2)
	after := f.post("after")
	f.waitCommitted(1, after.Sequence)
	if users := f.users(); !slices.Equal(users, []string{"first", "after"}) {
		t.Fatalf("user entries %q, want first, after", users)
	}
	if users := g.users(); !slices.Equal(users, []string{"newer"}) {
		t.Fatalf("the other lane's user entries %q, want newer", users)
	}
}

// TestMigrateInboxResidueGoneIsNotInBothStreams: when the message past the
// drain's bound that made a batch reopen (its partition also has messages
// in its new stream) is gone by the time the batch reopens, the partition
// opens in its new stream and the error is not ErrInBothStreams (whose
// text says running the command again does not help): run again, the
// command finishes.
func TestMigrateInboxResidueGoneIsNotInBothStreams(t *testing.T) {
	f := newMigrateFleet(t)
	first := f.post("first")
	f.waitCommitted(0, first.Sequence)

	f.stopAtOpenSubjects()
	newer := f.post("newer")
	f.waitCommitted(1, newer.Sequence)
	late := f.storeLate("late")

	o := admin.MigrateOptions{DrainTimeout: 30 * time.Second}
	removed := false
	admin.SetMigrateStep(&o, func(step string) error {
		if step == "purged" && !removed {
			removed = true
			f.removeMsg(0, late.Sequence)
		}
		return nil
	})
	_, err := f.fl.MigrateInbox(t.Context(), 2, o)
	if err == nil || errors.Is(err, admin.ErrInBothStreams) {
		t.Fatalf("the migration: %v, want an error other than ErrInBothStreams", err)
	}
	t.Logf("as expected: %v", err)
	m, _, err := broker.ReadInboxMap(t.Context(), mustBucket(t, f))
	if err != nil {
		t.Fatal(err)
	}
	if !m.IsOpen(f.p) || m.Assign[f.p] != 1 {
		t.Fatalf("the map is %s; want partition %d open in stream 1", m, f.p)
	}
	f.checkSubjects(m)
	if _, err := f.fl.MigrateInbox(t.Context(), 2, admin.MigrateOptions{DrainTimeout: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	after := f.post("after")
	f.waitCommitted(1, after.Sequence)
	if users := f.users(); !slices.Equal(users, []string{"first", "newer", "after"}) {
		t.Fatalf("user entries %q, want first, newer, after", users)
	}
}

// TestMigrateInboxStraysMoveInBatches: the look over every stream moves the
// partitions it finds in a stream they moved out of again o.Batch at a
// time, each move counted in the report, and their messages are answered
// in order.
func TestMigrateInboxStraysMoveInBatches(t *testing.T) {
	f := newMigrateFleet(t)
	f.useLaneIn(1)
	g := *f
	g.useLaneIn(3) // in the same first batch of 8 as partition 1
	for _, l := range []*migrateFleet{f, &g} {
		first := l.post("first")
		l.waitCommitted(0, first.Sequence)
	}
	errKilled := errors.New("killed after the open")
	var o admin.MigrateOptions
	o.Batch, o.DrainTimeout = 8, 30*time.Second
	admin.SetMigrateStep(&o, func(step string) error {
		if step != "opened" {
			return nil
		}
		f.storeLate("late")
		g.storeLate("late")
		return errKilled
	})
	if _, err := f.fl.MigrateInbox(t.Context(), 2, o); !errors.Is(err, errKilled) {
		t.Fatalf("the stopped migration: %v", err)
	}

	o = admin.MigrateOptions{Batch: 1, DrainTimeout: 30 * time.Second}
	most := 0
	admin.SetMigrateStep(&o, func(step string) error {
		if step == "closed" {
			m, _, err := broker.ReadInboxMap(t.Context(), mustBucket(t, f))
			if err != nil {
				return err
			}
			most = max(most, len(m.Moving))
		}
		return nil
	})
	rep, err := f.fl.MigrateInbox(t.Context(), 2, o)
	if err != nil {
		t.Fatal(err)
	}
	if most != 1 {
		t.Fatalf("a close took %d partitions, want at most 1 (the batch)", most)
	}
	if rep.Moved != 24+2 {
		t.Fatalf("the report counts %d moves, want 26 (24 partitions left to move, 2 moved again)", rep.Moved)
	}
	for _, l := range []*migrateFleet{f, &g} {
		after := l.post("after")
		l.waitCommitted(1, after.Sequence)
		if users := l.users(); !slices.Equal(users, []string{"first", "late", "after"}) {
			t.Fatalf("lane %s: user entries %q, want first, late, after", l.lane, users)
		}
	}
}

// TestMigrateInboxAtItsCountLooksForStrays: the command run with the
// fleet's own count moves nothing to change it, but looks for messages left
// in a stream their partition is not assigned to (a stray a migration's last
// look missed) and settles them as a migration's look does. With none, it
// writes nothing (the map's revision is unchanged). With a stray whose
// partition's stream holds nothing of it, the partition moves through its
// old stream and the stray is answered there, in order; the report counts
// the stray and the move. With a newer message of its lane in the
// partition's stream, the partition closes and the command fails with
// ErrInBothStreams, answering nothing out of order.
func TestMigrateInboxAtItsCountLooksForStrays(t *testing.T) {
	for _, c := range []string{"none", "stray", "newer"} {
		t.Run(c, func(t *testing.T) {
			f := newMigrateFleet(t)
			first := f.post("first")
			f.waitCommitted(0, first.Sequence)
			o := admin.MigrateOptions{DrainTimeout: 30 * time.Second}
			if _, err := f.fl.MigrateInbox(t.Context(), 2, o); err != nil {
				t.Fatal(err)
			}
			_, rev, err := broker.ReadInboxMap(t.Context(), mustBucket(t, f))
			if err != nil {
				t.Fatal(err)
			}
			var stray *jetstream.PubAck
			want := []string{"first", "after"}
			switch c {
			case "stray":
				stray = f.storeLate("stray")
				want = []string{"first", "stray", "after"}
			case "newer":
				n := f.post("newer")
				f.waitCommitted(1, n.Sequence)
				stray = f.storeLate("stray")
			}
			rep, err := f.fl.MigrateInbox(t.Context(), 2, o)
			if c == "newer" {
				checkInBoth(t, f, err, stray.Sequence, "can no longer be answered in order")
				if rep.Strays != 1 {
					t.Errorf("the report counts %d strays, want 1", rep.Strays)
				}
				if users := f.users(); !slices.Equal(users, []string{"first", "newer"}) {
					t.Fatalf("user entries %q, want first, newer", users)
				}
				f.removeMsg(0, stray.Sequence)
				rep, err = f.fl.MigrateInbox(t.Context(), 2, o)
				want = []string{"first", "newer", "after"}
			}
			if err != nil {
				t.Fatal(err)
			}
			_, rev2 := checkMapSettled(t, f.js, f.names, 2)
			if rep.From != 2 || rep.To != 2 {
				t.Errorf("the report says %d -> %d streams, want 2 -> 2", rep.From, rep.To)
			}
			switch c {
			case "none":
				if rev2 != rev || rep.Moved != 0 || rep.Strays != 0 {
					t.Fatalf("with nothing to do, the map went from revision %d to %d, the report %+v; want no write, nothing moved or found", rev, rev2, rep)
				}
			case "stray":
				if rep.Moved != 1 || rep.Strays != 1 {
					t.Fatalf("the report %+v, want 1 stray found and 1 move", rep)
				}
				if f.holds(0, stray.Sequence) {
					t.Fatal("the stray is still in stream 0")
				}
			}
			f.postAfterTheMove()
			if users := f.users(); !slices.Equal(users, want) {
				t.Fatalf("user entries %q, want %q", users, want)
			}
		})
	}
}
