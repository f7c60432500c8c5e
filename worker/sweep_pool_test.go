package worker_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/worker"
)

// sweepNow is the clock of the sweep and prune tests.
var sweepNow = time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)

// sweeper returns a worker that is not running: the tests call Sweep and
// Prune directly. Sessions idle for more than an hour are expired, entries
// not updated for a day are old enough to prune.
func (f *fleet) sweeper() *worker.Worker {
	f.t.Helper()
	w, err := worker.New(f.nc, f.js, f.res, worker.Config{ID: "sweeper", Names: f.names, Backend: echo.Backend(echo.Options{}),
		LeaseTTL: testTTL, MaxAgeDays: 1, Now: func() time.Time { return sweepNow },
		Reset: session.ResetConfig{Default: session.ResetPolicy{Mode: session.ResetIdle, IdleMinutes: 60}}})
	if err != nil {
		f.t.Fatal(err)
	}
	return w
}

// bulk publishes messages asynchronously and returns their sequences, in
// order, once every one is acknowledged.
func (f *fleet) bulk(msgs []*nats.Msg) []uint64 {
	f.t.Helper()
	futures := make([]jetstream.PubAckFuture, len(msgs))
	for i, m := range msgs {
		fut, err := f.js.PublishMsgAsync(m)
		if err != nil {
			f.t.Fatal(err)
		}
		futures[i] = fut
	}
	seqs := make([]uint64, len(msgs))
	for i, fut := range futures {
		select {
		case ack := <-fut.Ok():
			seqs[i] = ack.Sequence
		case err := <-fut.Err():
			f.t.Fatal(err)
		case <-time.After(30 * time.Second):
			f.t.Fatal("publish not acknowledged")
		}
	}
	return seqs
}

// poolLane is a lane of the sweep and prune tests.
type poolLane struct {
	lane, key string
	entry     session.SessionEntry
	held      bool   // a live lease of another worker
	msg       bool   // one inbox message
	committed int    // committed_seq relative to that message's seq: 0 or -1
	want      string // Msg-Id of the command a sweep must publish, or ""
}

func newPoolLane(i int, kind string) *poolLane {
	src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: fmt.Sprintf("pool-%s-%d", kind, i), ChatType: session.ChatDM, UserID: fmt.Sprintf("u%d", i)}
	key := session.BuildSessionKey(src, session.DefaultKeyOptions())
	return &poolLane{lane: session.LaneToken(key), key: key, entry: session.SessionEntry{
		SessionKey: key, SessionID: fmt.Sprintf("20260310_110000_%08x", i), Platform: src.Platform, ChatType: src.ChatType,
		CreatedAt: sweepNow.Add(-10 * time.Minute), UpdatedAt: sweepNow.Add(-10 * time.Minute), LeaseEpoch: uint64(1000 + i),
	}}
}

// setUp writes the lanes' inbox messages, entries and leases.
func (f *fleet) setUp(lanes []*poolLane) {
	f.t.Helper()
	var msgs []*nats.Msg
	var withMsg []*poolLane
	for _, l := range lanes {
		if l.entry.InboxID == "" {
			l.entry.InboxID = f.res.InboxID
		}
		if l.msg {
			m := nats.NewMsg(f.names.InboxSubject(session.Partition(f.names.Prefix(), l.lane), l.lane))
			m.Data, _ = json.Marshal(session.Inbound{SessionKey: l.key, Kind: session.KindMessage, Text: "hi", ReceivedAt: sweepNow})
			msgs = append(msgs, m)
			withMsg = append(withMsg, l)
		}
	}
	for i, seq := range f.bulk(msgs) {
		l := withMsg[i]
		l.entry.CommittedSeq = uint64(int(seq) + l.committed)
	}
	msgs = msgs[:0]
	for _, l := range lanes {
		if l.want == "wake" {
			l.want = fmt.Sprintf("wake:%s:%d:%d", l.lane, l.entry.CommittedSeq, l.entry.LeaseEpoch)
		}
		m := nats.NewMsg("$KV." + f.names.SessionsBucket() + "." + l.lane)
		m.Data, _ = json.Marshal(l.entry)
		msgs = append(msgs, m)
	}
	f.bulk(msgs)
	leases := kv.NewLeases(f.js, f.res, f.names, time.Minute)
	for _, l := range lanes {
		if l.held {
			if _, err := leases.Acquire(f.t.Context(), l.lane, "other-worker"); err != nil {
				f.t.Fatal(err)
			}
		}
	}
	// The watcher's own lease lives in the same bucket.
	if _, err := leases.Acquire(f.t.Context(), f.names.WatcherLeaseKey(), "other-worker"); err != nil {
		f.t.Fatal(err)
	}
}

// inboxIDsAfter returns the Msg-Ids of the inbox messages after seq, each
// checked to be an internal command on its lane's subject.
func (f *fleet) inboxIDsAfter(seq uint64) []string {
	f.t.Helper()
	info, err := f.res.Inbox.Info(f.t.Context())
	if err != nil {
		f.t.Fatal(err)
	}
	var ids []string
	for s := seq + 1; s <= info.State.LastSeq; s++ {
		m, err := f.res.Inbox.GetMsg(f.t.Context(), s)
		if err != nil {
			f.t.Fatalf("inbox seq %d: %v", s, err)
		}
		var in session.Inbound
		if err := json.Unmarshal(m.Data, &in); err != nil {
			f.t.Fatal(err)
		}
		lane := session.LaneToken(in.SessionKey)
		if in.Kind != session.KindInternal || m.Subject != f.names.InboxSubject(session.Partition(f.names.Prefix(), lane), lane) {
			f.t.Fatalf("inbox seq %d: %s %q on %s", s, in.Kind, in.Command, m.Subject)
		}
		id := m.Header.Get(jetstream.MsgIDHeader)
		if want := in.Command + ":"; len(id) < len(want) || id[:len(want)] != want {
			f.t.Fatalf("inbox seq %d: command %q with Msg-Id %q", s, in.Command, id)
		}
		ids = append(ids, id)
	}
	return ids
}

func lastSeq(t *testing.T, s jetstream.Stream) uint64 {
	t.Helper()
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

// TestSweepPublishesExactly: one sweep over 2000 entries of every kind —
// held by another worker (with a turn, pending messages or an expired
// session: all left to the owner), stranded by a turn in flight, with
// messages above committed_seq, with messages of an older inbox, expired,
// expired but finalized, idle — publishes exactly one wake per stranded
// lane and one expire per expired one, with their Msg-Ids, and returns that
// count. A second sweep publishes the same wakes again, which the inbox's
// Msg-Id window drops, and wakes the expired lanes.
func TestSweepPublishesExactly(t *testing.T) {
	f := newFleet(t)
	const n = 2000
	old := sweepNow.Add(-2 * time.Hour)
	var lanes []*poolLane
	for i := range n {
		kind := []string{"held-turn", "held-pending", "held-expired", "turn", "pending", "foreign", "expired",
			"finalized", "idle", "committed", "expired-pending", "no-session"}[i%12]
		l := newPoolLane(i, kind)
		switch kind {
		case "held-turn":
			l.held, l.entry.Turn = true, &session.TurnIntent{ID: "t", FirstSeq: 1, LastSeq: 1, Kind: "messages", Attempt: 1}
		case "held-pending":
			l.held, l.msg, l.committed = true, true, -1
		case "held-expired":
			l.held, l.entry.UpdatedAt = true, old
		case "turn":
			l.entry.Turn = &session.TurnIntent{ID: "t", FirstSeq: 1, LastSeq: 1, Kind: "messages", Attempt: 1}
			l.entry.UpdatedAt = old // stranded wins over expired
			l.want = "wake"
		case "pending":
			l.msg, l.committed, l.want = true, -1, "wake"
		case "foreign":
			l.msg, l.entry.InboxID, l.want = true, "an-older-inbox", "wake"
		case "expired":
			l.entry.UpdatedAt, l.want = old, "expire:"+l.entry.SessionID
		case "finalized":
			l.entry.UpdatedAt, l.entry.ExpiryFinalized = old, true
		case "idle":
		case "committed":
			l.msg, l.entry.UpdatedAt = true, sweepNow.Add(-time.Minute)
		case "expired-pending":
			l.msg, l.committed, l.entry.UpdatedAt, l.want = true, -1, old, "wake"
		case "no-session":
			l.entry.SessionID, l.entry.UpdatedAt = "", old
		}
		lanes = append(lanes, l)
	}
	f.setUp(lanes)
	var want []string
	for _, l := range lanes {
		if l.want != "" {
			want = append(want, l.want)
		}
	}
	sort.Strings(want)

	w := f.sweeper()
	before := lastSeq(t, f.res.Inbox)
	start := time.Now()
	got, err := w.Sweep(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sweep of %d entries: %d commands in %v", n, got, time.Since(start))
	if got != len(want) {
		t.Fatalf("sweep returned %d, want %d", got, len(want))
	}
	ids := f.inboxIDsAfter(before)
	sort.Strings(ids)
	if len(ids) != len(want) {
		t.Fatalf("inbox holds %d commands, want %d", len(ids), len(want))
	}
	for i := range want {
		if ids[i] != want[i] {
			t.Fatalf("command %d: Msg-Id %q, want %q", i, ids[i], want[i])
		}
	}

	// Again: the wakes are the same commands (dropped as duplicates); the
	// expire commands are now unprocessed inbox messages of free lanes, so
	// those lanes get a wake.
	after := lastSeq(t, f.res.Inbox)
	var wakes []string
	for _, l := range lanes {
		if strings.HasPrefix(l.want, "expire:") {
			wakes = append(wakes, fmt.Sprintf("wake:%s:%d:%d", l.lane, l.entry.CommittedSeq, l.entry.LeaseEpoch))
		}
	}
	sort.Strings(wakes)
	if got, err := w.Sweep(t.Context()); err != nil || got != len(want) {
		t.Fatalf("second sweep: %d, %v; want %d, nil", got, err, len(want))
	}
	ids = f.inboxIDsAfter(after)
	sort.Strings(ids)
	if strings.Join(ids, " ") != strings.Join(wakes, " ") {
		t.Fatalf("second sweep stored %d commands, want the %d wakes of the expired lanes", len(ids), len(wakes))
	}
}

// TestSweepStopsAtFirstError: a sweep whose publishes start failing (the
// inbox is full) ends with the first error, without publishing past it,
// and returns a count no larger than what was stored; its pool goroutines
// and its watches end with it (TestMain checks for leaks).
func TestSweepStopsAtFirstError(t *testing.T) {
	f := newFleet(t)
	var lanes []*poolLane
	for i := range 2000 {
		l := newPoolLane(i, "stranded")
		l.entry.Turn = &session.TurnIntent{ID: "t", FirstSeq: 1, LastSeq: 1, Kind: "messages", Attempt: 1}
		lanes = append(lanes, l)
	}
	f.setUp(lanes)
	w := f.sweeper()

	// Room for 100 more messages, then publishes fail.
	const room = 100
	info, err := f.res.Inbox.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	before := info.State.LastSeq
	cfg := info.Config
	cfg.Discard, cfg.MaxMsgs = jetstream.DiscardNew, int64(info.State.Msgs)+room
	if _, err := f.js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	got, err := w.Sweep(t.Context())
	if err == nil {
		t.Fatalf("sweep: %d, nil; want an error", got)
	}
	// Every command the sweep counted was acknowledged, so it is stored;
	// one whose ack was cancelled by the first error may be stored
	// uncounted.
	stored := lastSeq(t, f.res.Inbox) - before
	t.Logf("sweep stopped with %v after %d acknowledged commands, %d stored", err, got, stored)
	if stored != room || got > room {
		t.Fatalf("sweep returned %d with %d commands stored, want at most %d of %d", got, stored, room, room)
	}
}

// TestPruneDeletesExactly: a prune over entries of every kind deletes
// exactly the old, free, settled ones (purging their committed inbox
// messages first) and leaves the others, held ones included.
func TestPruneDeletesExactly(t *testing.T) {
	f := newFleet(t)
	old := sweepNow.Add(-48 * time.Hour)
	var lanes []*poolLane
	for i := range 800 {
		kind := []string{"committed", "empty", "foreign", "held", "turn", "owner", "suspended", "pending", "fresh"}[i%9]
		l := newPoolLane(i, kind)
		l.entry.UpdatedAt = old
		switch kind {
		case "committed":
			l.msg, l.want = true, "pruned"
		case "empty":
			l.want = "pruned"
		case "foreign":
			l.msg, l.entry.InboxID, l.want = true, "an-older-inbox", "pruned"
		case "held":
			l.held = true
		case "turn":
			l.entry.Turn = &session.TurnIntent{ID: "t", FirstSeq: 1, LastSeq: 1, Kind: "messages", Attempt: 1}
		case "owner":
			l.entry.Owner = "gone/0000"
		case "suspended":
			l.entry.Suspended = true
		case "pending":
			l.msg, l.committed = true, -1
		case "fresh":
			l.entry.UpdatedAt = sweepNow.Add(-time.Hour)
		}
		lanes = append(lanes, l)
	}
	f.setUp(lanes)
	w := f.sweeper()
	got, err := w.Prune(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, l := range lanes {
		_, _, gerr := f.store.Get(t.Context(), l.lane)
		subject := f.names.InboxSubject(session.Partition(f.names.Prefix(), l.lane), l.lane)
		_, merr := f.res.Inbox.GetLastMsgForSubject(t.Context(), subject)
		switch {
		case l.want == "":
			if gerr != nil {
				t.Fatalf("%s: kept entry: %v", l.lane, gerr)
			}
			if l.msg && merr != nil {
				t.Fatalf("%s: inbox message gone: %v", l.lane, merr)
			}
		default:
			want++
			if !errors.Is(gerr, kv.ErrNotFound) {
				t.Fatalf("%s: pruned entry still there: %v", l.lane, gerr)
			}
			// Purged when committed to this inbox; an older inbox's
			// messages are not this lane's to purge.
			if purged := errors.Is(merr, jetstream.ErrMsgNotFound); l.msg && purged == (l.entry.InboxID != f.res.InboxID) {
				t.Fatalf("%s: inbox message purged=%v (inbox %s)", l.lane, purged, l.entry.InboxID)
			}
		}
	}
	if got != want {
		t.Fatalf("prune returned %d, want %d", got, want)
	}
}
