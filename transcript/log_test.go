package transcript_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/transcript"
)

func TestAppendLoad_RoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "20260101_120000_abcdef01"
	ts := time.Date(2026, 1, 1, 12, 0, 0, 123456789, time.UTC)

	full := []*transcript.Entry{
		{Kind: transcript.KindFence, Epoch: 7, Owner: "w1-inc1", Timestamp: ts},
		{
			ID: "user-1", Kind: transcript.KindMessage, Role: transcript.RoleUser, Content: "hello ünïcode \"quoted\"\n",
			Timestamp: ts, InboxSeq: 42, TurnID: "turn-1", SenderName: "Alice", TokenCount: 3,
		},
		{
			Kind: transcript.KindMessage, Role: transcript.RoleAssistant, Content: "calling a tool",
			ToolCalls: []transcript.ToolCall{
				{ID: "call_1", Name: "search", Arguments: `{"q":"x"}`},
				{ID: "call_2", Name: "fetch", Arguments: `{}`},
			},
			Reasoning:        "think",
			ReasoningDetails: json.RawMessage(`[{"type":"reasoning.text","text":"think"}]`),
			Timestamp:        ts.Add(time.Second), TokenCount: 17, FinishReason: "tool_calls", TurnID: "turn-1",
		},
		{Kind: transcript.KindMessage, Role: transcript.RoleTool, Content: "result", ToolCallID: "call_1", ToolName: "search", Timestamp: ts, TurnID: "turn-1"},
		{Kind: transcript.KindMessage, Role: transcript.RoleSystem, Content: "note", Timestamp: ts},
		{Kind: transcript.KindNotice, Content: "session reset", Timestamp: ts, TurnID: "turn-1"},
		{Kind: transcript.KindTurnEnd, TurnID: "turn-1", Status: transcript.StatusCompleted, Timestamp: ts},
		{Kind: transcript.KindRewind, Rewound: []uint64{2, 3}, Timestamp: ts},
		{Kind: transcript.KindClosed, NextSessionID: "20260102_000000_00000000", Reason: "idle", Timestamp: ts},
	}
	last := appendAll(t, b, session, 0, full...)

	// Another session interleaved: not part of this transcript.
	appendAll(t, b, "other", 0, msg(transcript.RoleUser, "elsewhere"))

	got, gotLast := load(t, b, session)
	if gotLast != last {
		t.Fatalf("load last seq = %d, want %d", gotLast, last)
	}
	if len(got) != len(full) {
		t.Fatalf("loaded %d entries, want %d", len(got), len(full))
	}
	for i, want := range full {
		w := *want
		w.Deleted = w.Seq == 2 || w.Seq == 3 // covered by the rewind
		if w.ID == "" || w.Seq == 0 {
			t.Fatalf("entry %d: Append did not set ID/Seq: %+v", i, w)
		}
		if !reflect.DeepEqual(got[i], w) {
			t.Errorf("entry %d:\n got %+v\nwant %+v", i, got[i], w)
		}
	}
	if full[1].ID != "user-1" {
		t.Fatalf("Append replaced a caller id: %q", full[1].ID)
	}

	// LastSeq and Get agree with Load.
	seq, tail, err := b.log.LastSeq(b.ctx, session)
	if err != nil || seq != last || tail.ID != full[len(full)-1].ID {
		t.Fatalf("LastSeq = %d, %+v, %v; want %d, id %s", seq, tail, err, last, full[len(full)-1].ID)
	}
	e, err := b.log.Get(b.ctx, session, full[2].Seq)
	if err != nil {
		t.Fatal(err)
	}
	if want := *full[2]; !reflect.DeepEqual(*e, want) {
		t.Fatalf("Get:\n got %+v\nwant %+v", *e, want)
	}

	// Headers on the stored message.
	raw, err := b.res.Transcripts.GetMsg(b.ctx, full[1].Seq)
	if err != nil {
		t.Fatal(err)
	}
	if raw.Subject != "fleet.tx."+session {
		t.Fatalf("subject = %q", raw.Subject)
	}
	for k, v := range map[string]string{
		broker.HdrEntryID: "user-1", broker.HdrTurnID: "turn-1", broker.HdrSessionID: session,
		broker.HdrInboxSeq: "42", broker.HdrMsgID: "user-1",
	} {
		if got := raw.Header.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}

	// Load left no consumer behind.
	info, err := b.res.Transcripts.Info(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Consumers != 0 {
		t.Fatalf("%d consumers left on the transcript stream", info.State.Consumers)
	}
}

func TestLoad_Empty(t *testing.T) {
	t.Parallel()
	b := setup(t)
	entries, last := load(t, b, "nothing_here")
	if len(entries) != 0 || last != 0 {
		t.Fatalf("Load of an empty transcript = %d entries, last %d", len(entries), last)
	}
	seq, e, err := b.log.LastSeq(b.ctx, "nothing_here")
	if seq != 0 || e != nil || err != nil {
		t.Fatalf("LastSeq of an empty transcript = %d, %v, %v", seq, e, err)
	}
}

func TestGet_NotFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mine := appendAll(t, b, "mine", 0, msg(transcript.RoleUser, "a"))
	theirs := appendAll(t, b, "theirs", 0, msg(transcript.RoleUser, "b"))
	for _, seq := range []uint64{0, theirs, theirs + 100} {
		if _, err := b.log.Get(b.ctx, "mine", seq); !errors.Is(err, transcript.ErrNotFound) {
			t.Errorf("Get seq %d: err = %v, want ErrNotFound", seq, err)
		}
	}
	if _, err := b.log.Get(b.ctx, "mine", mine); err != nil {
		t.Fatal(err)
	}
}

func TestAppend_Invalid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		name    string
		session string
		e       *transcript.Entry
		want    error
	}{
		{"nil entry", "s", nil, transcript.ErrInvalidEntry},
		{"empty session", "", msg("user", "x"), transcript.ErrInvalidSessionID},
		{"dotted session", "a.b", msg("user", "x"), transcript.ErrInvalidSessionID},
		{"wildcard session", "a*", msg("user", "x"), transcript.ErrInvalidSessionID},
		{"no kind", "s", &transcript.Entry{Role: "user"}, transcript.ErrInvalidEntry},
		{"bad role", "s", msg("robot", "x"), transcript.ErrInvalidEntry},
		{"fence without epoch", "s", &transcript.Entry{Kind: transcript.KindFence, Owner: "w"}, transcript.ErrInvalidEntry},
		{"turn end without status", "s", &transcript.Entry{Kind: transcript.KindTurnEnd, TurnID: "t"}, transcript.ErrInvalidEntry},
		{"empty rewind", "s", &transcript.Entry{Kind: transcript.KindRewind}, transcript.ErrInvalidEntry},
		{"id with space", "s", &transcript.Entry{ID: "a b", Kind: transcript.KindNotice}, transcript.ErrInvalidEntry},
		{"turn id with newline", "s", &transcript.Entry{Kind: transcript.KindNotice, TurnID: "a\nb"}, transcript.ErrInvalidEntry},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := b.log.Append(b.ctx, tc.session, 0, tc.e); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := transcript.New(b.js, broker.Names{}, nil); err == nil {
		t.Fatal("New with zero Names succeeded")
	}
	if _, err := transcript.New(b.js, b.names, &transcript.Options{WriteTimeout: -1}); err == nil {
		t.Fatal("New with a negative WriteTimeout succeeded")
	}
}

// TestAppend_Fencing: two writers with the same lastSeq, exactly one wins,
// the other learns the winner's seq.
func TestAppend_Fencing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "race"
	var last uint64
	for round := range 20 {
		var (
			start = make(chan struct{})
			wg    sync.WaitGroup
			seqs  [2]uint64
			errs  [2]error
		)
		for w := range 2 {
			wg.Go(func() {
				<-start
				seqs[w], errs[w] = b.log.Append(b.ctx, session, last, msg(transcript.RoleAssistant, fmt.Sprintf("r%d w%d", round, w)))
			})
		}
		close(start)
		wg.Wait()
		winner, loser := 0, 1
		if errs[0] != nil {
			winner, loser = 1, 0
		}
		if errs[winner] != nil {
			t.Fatalf("round %d: both failed: %v / %v", round, errs[0], errs[1])
		}
		if seqs[winner] <= last {
			t.Fatalf("round %d: winner seq %d not above %d", round, seqs[winner], last)
		}
		requireConflict(t, errs[loser], seqs[winner])
		last = seqs[winner]
	}
	entries, _ := load(t, b, session)
	if len(entries) != 20 {
		t.Fatalf("transcript has %d entries, want 20 (one per round)", len(entries))
	}
}

// TestAppend_ZombieAfterFence: an owner that lost its lease cannot append
// once the new owner has fenced the transcript.
func TestAppend_ZombieAfterFence(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "zombie"

	// Owner A (epoch 1) runs a turn.
	lastA := appendAll(t, b, session, 0,
		&transcript.Entry{Kind: transcript.KindFence, Epoch: 1, Owner: "A"},
		msg(transcript.RoleUser, "hi"),
	)

	// A pauses; B takes the lease (epoch 5), loads and fences.
	entries, lastB := load(t, b, session)
	if transcript.FenceEpoch(entries) != 1 {
		t.Fatalf("FenceEpoch = %d, want 1", transcript.FenceEpoch(entries))
	}
	fence := &transcript.Entry{Kind: transcript.KindFence, Epoch: 5, Owner: "B"}
	fenceSeq := appendAll(t, b, session, lastB, fence)

	// A resumes and tries to write its reply: refused, told the fence's seq.
	_, err := b.log.Append(b.ctx, session, lastA, msg(transcript.RoleAssistant, "zombie reply"))
	requireConflict(t, err, fenceSeq)

	// B goes on; A's entry is nowhere.
	appendAll(t, b, session, fenceSeq, msg(transcript.RoleAssistant, "real reply"))
	entries, _ = load(t, b, session)
	if got := transcript.FenceEpoch(entries); got != 5 {
		t.Fatalf("FenceEpoch = %d, want 5", got)
	}
	for _, e := range entries {
		if e.Content == "zombie reply" {
			t.Fatalf("zombie entry stored at seq %d", e.Seq)
		}
	}
	if len(entries) != 4 {
		t.Fatalf("%d entries, want 4", len(entries))
	}
}

// TestAppend_RetrySameEntry: calling Append again with an entry that was
// stored (same ID, old lastSeq) returns the original seq and stores nothing.
func TestAppend_RetrySameEntry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "retry"
	base := appendAll(t, b, session, 0, msg(transcript.RoleUser, "q"))

	e := msg(transcript.RoleAssistant, "a")
	seq, err := b.log.Append(b.ctx, session, base, e)
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.log.Append(b.ctx, session, base, e)
	if err != nil {
		t.Fatalf("retry of a stored entry: %v", err)
	}
	if again != seq {
		t.Fatalf("retry returned seq %d, want the original %d", again, seq)
	}
	entries, last := load(t, b, session)
	if len(entries) != 2 || last != seq {
		t.Fatalf("after retry: %d entries, last %d; want 2, %d", len(entries), last, seq)
	}

	// Once someone else has appended on top, the retry is a conflict.
	other := appendAll(t, b, session, seq, &transcript.Entry{Kind: transcript.KindFence, Epoch: 2, Owner: "B"})
	_, err = b.log.Append(b.ctx, session, base, e)
	requireConflict(t, err, other)

	// A caller-chosen id on an empty subject works on the first send.
	if seq, err := b.log.Append(b.ctx, "fresh", 0, &transcript.Entry{ID: "fixed-id", Kind: transcript.KindNotice}); err != nil || seq == 0 {
		t.Fatalf("append with a caller id: %d, %v", seq, err)
	}
}

// flakyJS wraps a JetStream and lets a test decide what each PublishMsg
// does: the ambiguous outcomes a real network produces.
type flakyJS struct {
	jetstream.JetStream
	calls atomic.Int32
	// publish is called with the 1-based call number; real sends the
	// message for real.
	publish func(n int32, real func() (*jetstream.PubAck, error)) (*jetstream.PubAck, error)
}

func (f *flakyJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	n := f.calls.Add(1)
	return f.publish(n, func() (*jetstream.PubAck, error) { return f.JetStream.PublishMsg(ctx, m, opts...) })
}

func TestAppend_Ambiguous(t *testing.T) {
	t.Parallel()
	b := setup(t)
	lost := fmt.Errorf("simulated: %w", context.DeadlineExceeded)

	for i, tc := range []struct {
		name string
		// publish simulates the network; other appends as another writer.
		publish func(n int32, real func() (*jetstream.PubAck, error), other func()) (*jetstream.PubAck, error)
		// wantConflict: the other writer's seq is the expected Actual.
		wantConflict bool
		wantSends    int32
	}{{
		name: "stored, ack lost",
		publish: func(n int32, real func() (*jetstream.PubAck, error), _ func()) (*jetstream.PubAck, error) {
			if _, err := real(); err != nil {
				return nil, err
			}
			return nil, lost
		},
		wantSends: 1, // resolved by reading the tail, no resend
	}, {
		name: "not stored, timed out",
		publish: func(n int32, real func() (*jetstream.PubAck, error), _ func()) (*jetstream.PubAck, error) {
			if n == 1 {
				return nil, lost
			}
			return real()
		},
		wantSends: 2,
	}, {
		name: "no responders, then stored",
		publish: func(n int32, real func() (*jetstream.PubAck, error), _ func()) (*jetstream.PubAck, error) {
			if n == 1 {
				return nil, jetstream.ErrNoStreamResponse
			}
			return real()
		},
		wantSends: 2,
	}, {
		name: "first send delayed past the resolution, resend gets 10071 naming it",
		publish: func() func(int32, func() (*jetstream.PubAck, error), func()) (*jetstream.PubAck, error) {
			var delayed func() (*jetstream.PubAck, error)
			return func(n int32, real func() (*jetstream.PubAck, error), _ func()) (*jetstream.PubAck, error) {
				if n == 1 {
					delayed = real // in flight; the client times out
					return nil, lost
				}
				if _, err := delayed(); err != nil { // lands now, after the tail was read
					return nil, err
				}
				return real() // 10071 "wrong last sequence: <the delayed send's seq>"
			}
		}(),
		wantSends: 2,
	}, {
		name: "10164 while another write is in flight, subject unchanged",
		publish: func(n int32, real func() (*jetstream.PubAck, error), _ func()) (*jetstream.PubAck, error) {
			if n <= 2 {
				return nil, fmt.Errorf("nats: %w", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant, Description: "wrong last sequence"})
			}
			return real()
		},
		wantSends: 3,
	}, {
		name: "10164, and the other write landed",
		publish: func(n int32, real func() (*jetstream.PubAck, error), other func()) (*jetstream.PubAck, error) {
			other()
			return nil, fmt.Errorf("nats: %w", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant, Description: "wrong last sequence"})
		},
		wantConflict: true,
		wantSends:    1,
	}, {
		name: "ack lost, and a new owner fenced on top",
		publish: func(n int32, real func() (*jetstream.PubAck, error), other func()) (*jetstream.PubAck, error) {
			if _, err := real(); err != nil {
				return nil, err
			}
			other()
			return nil, lost
		},
		wantConflict: true,
		wantSends:    1,
	}, {
		name: "timed out unsent, and a new owner fenced meanwhile",
		publish: func(n int32, real func() (*jetstream.PubAck, error), other func()) (*jetstream.PubAck, error) {
			other()
			return nil, lost
		},
		wantConflict: true,
		wantSends:    1,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			session := fmt.Sprintf("amb_%d", i)
			base := appendAll(t, b, session, 0, msg(transcript.RoleUser, "q"))
			var otherSeq uint64
			other := func() {
				if otherSeq != 0 {
					return
				}
				s, err := b.log.Append(b.ctx, session, 0, &transcript.Entry{Kind: transcript.KindFence, Epoch: 9, Owner: "B"})
				var ce *transcript.ConflictError
				if errors.As(err, &ce) { // fence on whatever the tail is
					s, err = b.log.Append(b.ctx, session, ce.Actual, &transcript.Entry{Kind: transcript.KindFence, Epoch: 9, Owner: "B"})
				}
				if err != nil {
					t.Errorf("other writer: %v", err)
				}
				otherSeq = s
			}
			fj := &flakyJS{JetStream: b.js}
			fj.publish = func(n int32, real func() (*jetstream.PubAck, error)) (*jetstream.PubAck, error) {
				return tc.publish(n, real, other)
			}
			log, err := transcript.New(fj, b.names, nil)
			if err != nil {
				t.Fatal(err)
			}

			e := msg(transcript.RoleAssistant, "answer")
			seq, err := log.Append(b.ctx, session, base, e)
			if got := fj.calls.Load(); got != tc.wantSends {
				t.Errorf("%d sends, want %d", got, tc.wantSends)
			}
			entries, last := load(t, b, session)
			var mine []uint64
			for _, x := range entries {
				if x.ID == e.ID {
					mine = append(mine, x.Seq)
				}
			}
			if tc.wantConflict {
				requireConflict(t, err, last)
				if last != otherSeq {
					t.Fatalf("tail %d is not the other writer's %d", last, otherSeq)
				}
				if len(mine) > 1 {
					t.Fatalf("entry stored %d times", len(mine))
				}
				return
			}
			if err != nil {
				t.Fatalf("Append: %v", err)
			}
			if len(mine) != 1 || mine[0] != seq || e.Seq != seq || last != seq {
				t.Fatalf("entry stored at %v, Append said %d (e.Seq %d), tail %d", mine, seq, e.Seq, last)
			}
		})
	}
}

// TestAppend_OutcomeUnknown: when the server cannot be reached for the whole
// write timeout, Append says so (not a conflict), and a later Append of the
// same entry resolves it.
func TestAppend_OutcomeUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "unknown"
	base := appendAll(t, b, session, 0, msg(transcript.RoleUser, "q"))

	down := &flakyJS{JetStream: b.js}
	down.publish = func(n int32, real func() (*jetstream.PubAck, error)) (*jetstream.PubAck, error) {
		if n == 1 {
			if _, err := real(); err != nil { // stored; every ack is lost from here on
				return nil, err
			}
		}
		return nil, nats.ErrTimeout
	}
	// Reads fail too.
	slow, err := transcript.New(&noReads{down}, b.names, &transcript.Options{WriteTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e := msg(transcript.RoleAssistant, "a")
	started := time.Now()
	_, err = slow.Append(b.ctx, session, base, e)
	if !errors.Is(err, transcript.ErrOutcomeUnknown) || errors.Is(err, transcript.ErrConflict) {
		t.Fatalf("err = %v, want ErrOutcomeUnknown and not ErrConflict", err)
	}
	if d := time.Since(started); d > 2*time.Second {
		t.Fatalf("Append took %v with a 300ms WriteTimeout", d)
	}
	t.Logf("unreachable: %v after %v", err, time.Since(started))

	// The connection is back: the same entry resolves to the stored seq.
	seq, err := b.log.Append(b.ctx, session, base, e)
	if err != nil {
		t.Fatal(err)
	}
	entries, last := load(t, b, session)
	if len(entries) != 2 || last != seq || entries[1].ID != e.ID {
		t.Fatalf("entries %d, last %d, Append seq %d", len(entries), last, seq)
	}
}

// noReads sends the Log's reads to an API prefix nobody serves, so every
// read fails and Append cannot resolve.
type noReads struct{ *flakyJS }

func (n *noReads) Options() jetstream.JetStreamOptions {
	return jetstream.JetStreamOptions{APIPrefix: "$NOBODY.API"}
}

// TestAppend_IgnoresCallerCancellation: a durable write is not abandoned
// because the turn that asked for it was cancelled.
func TestAppend_IgnoresCallerCancellation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	seq, err := b.log.Append(ctx, "cancelled", 0, msg(transcript.RoleAssistant, "partial"))
	if err != nil || seq == 0 {
		t.Fatalf("Append with a cancelled ctx: %d, %v", seq, err)
	}
}

func TestLoad_Large(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 2000
	const session = "big"
	var last uint64
	ids := make([]string, 0, n)
	started := time.Now()
	for i := range n {
		e := msg(transcript.RoleUser, fmt.Sprintf("message %d", i))
		if i%2 == 1 {
			e.Role = transcript.RoleAssistant
		}
		seq, err := b.log.Append(b.ctx, session, last, e)
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		last = seq
		ids = append(ids, e.ID)
		if i%100 == 0 { // noise on another subject
			appendAll(t, b, fmt.Sprintf("noise_%d", i), 0, msg(transcript.RoleUser, "x"))
		}
	}
	appendDur := time.Since(started)

	started = time.Now()
	entries, gotLast := load(t, b, session)
	loadDur := time.Since(started)
	t.Logf("appended %d entries in %v (%v each); loaded them in %v", n, appendDur, appendDur/n, loadDur)

	if gotLast != last || len(entries) != n {
		t.Fatalf("loaded %d entries up to %d, want %d up to %d", len(entries), gotLast, n, last)
	}
	var prev uint64
	for i, e := range entries {
		if e.ID != ids[i] || e.Content != fmt.Sprintf("message %d", i) || e.Seq <= prev {
			t.Fatalf("entry %d: %+v (prev seq %d)", i, e, prev)
		}
		prev = e.Seq
	}
	if got := len(transcript.Effective(entries)); got != n {
		t.Fatalf("Effective has %d entries, want %d", got, n)
	}
}

// TestLoad_ConcurrentAppends: entries appended while a Load runs are left
// for the next Load, and the last seq it returns is that of its last entry.
func TestLoad_ConcurrentAppends(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "moving"
	last := appendAll(t, b, session, 0, msg(transcript.RoleUser, "0"))
	done := make(chan error, 1)
	go func() {
		l := last
		for i := range 300 {
			s, err := b.log.Append(b.ctx, session, l, msg(transcript.RoleUser, fmt.Sprint(i+1)))
			if err != nil {
				done <- err
				return
			}
			l = s
		}
		done <- nil
	}()
	for range 20 {
		entries, l := load(t, b, session)
		if len(entries) == 0 || entries[len(entries)-1].Seq != l {
			t.Fatalf("load returned %d entries, last seq %d", len(entries), l)
		}
		for i, e := range entries {
			if e.Content != fmt.Sprint(i) {
				t.Fatalf("entry %d has content %q", i, e.Content)
			}
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestAppend_ConcurrentSessions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const sessions, perSession = 16, 50
	var wg sync.WaitGroup
	errs := make(chan error, sessions)
	for s := range sessions {
		wg.Go(func() {
			id := fmt.Sprintf("s%02d", s)
			var last uint64
			for i := range perSession {
				seq, err := b.log.Append(b.ctx, id, last, msg(transcript.RoleUser, fmt.Sprint(i)))
				if err != nil {
					errs <- fmt.Errorf("%s append %d: %w", id, i, err)
					return
				}
				last = seq
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for s := range sessions {
		entries, _ := load(t, b, fmt.Sprintf("s%02d", s))
		if len(entries) != perSession {
			t.Fatalf("session %d has %d entries", s, len(entries))
		}
		for i, e := range entries {
			if e.Content != fmt.Sprint(i) {
				t.Fatalf("session %d entry %d = %q", s, i, e.Content)
			}
		}
	}
}

// TestRewind_EndToEnd: /undo and /retry through the log.
func TestRewind_EndToEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "undo"
	last := appendAll(t, b, session, 0,
		msg(transcript.RoleUser, "one"), msg(transcript.RoleAssistant, "1"),
		msg(transcript.RoleUser, "two"), msg(transcript.RoleAssistant, "2"),
		&transcript.Entry{Kind: transcript.KindTurnEnd, TurnID: "t2", Status: transcript.StatusCompleted},
	)
	entries, l := load(t, b, session)
	if l != last {
		t.Fatal("last seq mismatch")
	}
	ctl, turns, text := transcript.RewindUserTurns(entries, 1)
	if ctl == nil || turns != 1 || text != "two" {
		t.Fatalf("RewindUserTurns = %+v, %d, %q", ctl, turns, text)
	}
	appendAll(t, b, session, l, ctl)

	entries, _ = load(t, b, session)
	var deleted []string
	for _, e := range entries {
		if e.Deleted {
			deleted = append(deleted, e.Content)
		}
	}
	if !reflect.DeepEqual(deleted, []string{"two", "2"}) {
		t.Fatalf("deleted = %q", deleted)
	}
	var eff []string
	for _, e := range transcript.Effective(entries) {
		eff = append(eff, e.Content)
	}
	if !reflect.DeepEqual(eff, []string{"one", "1"}) {
		t.Fatalf("Effective = %q", eff)
	}
	if st, ok := transcript.TurnEnded(entries, "t2"); !ok || st != transcript.StatusCompleted {
		t.Fatalf("TurnEnded = %q, %v", st, ok)
	}
	// A second undo rewinds the earlier turn, not the already deleted one.
	_, turns, text = transcript.RewindUserTurns(entries, 1)
	if turns != 1 || text != "one" {
		t.Fatalf("second undo: %d, %q", turns, text)
	}
}

// TestAppend_NoStream: without the stream, Append fails fast instead of
// waiting out its timeout.
func TestAppend_NoStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	log, err := transcript.New(b.js, broker.MustNames("unprovisioned"), nil)
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	_, err = log.Append(b.ctx, "s", 0, msg(transcript.RoleUser, "x"))
	if err == nil || time.Since(started) > 2*time.Second {
		t.Fatalf("Append without a stream: %v after %v", err, time.Since(started))
	}
	t.Logf("no stream: %v", err)
	if _, _, err := log.Load(b.ctx, "s"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("Load without a stream: %v, want ErrStreamNotFound", err)
	}
}
