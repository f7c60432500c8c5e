package worker_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/transcript"
	"github.com/agentfleet/agentfleet/worker"
)

// TestDrainAloneMarksResumesAndBanners: a worker stopped gracefully with no
// other worker alive marks its running turn resume_pending at the start of
// the drain, tells the user honestly, keeps the turn record at the drain
// timeout, and the next worker resumes the turn without a user message, with
// a note that calls it a shutdown, not a restart.
func TestDrainAloneMarksResumesAndBanners(t *testing.T) {
	f := newFleet(t)
	nc := f.srv.Connect(t)
	js := natstest.JetStream(t, nc)
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: f.names, LeaseTTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(nc, js, res, worker.Config{ID: "draining", Names: f.names, Backend: echo.Backend(echo.Options{}),
		LeaseTTL: testTTL, LeaseMargin: 500 * time.Millisecond, Linger: 5 * time.Second, DrainTimeout: 500 * time.Millisecond,
		Reset: session.ResetConfig{Default: session.ResetPolicy{Mode: session.ResetNone}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	lane, seq := f.post("drain", "!notes\n!sleep 3s", "d1")
	natstest.WaitFor(t, 10*time.Second, "the turn to run", func() error {
		e, _, err := f.store.Get(t.Context(), lane)
		if err != nil {
			return err
		}
		if e.Turn == nil {
			return errString("no turn yet")
		}
		return nil
	})
	sid := f.waitEntry(lane).SessionID
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("worker did not stop")
	}
	e := f.waitEntry(lane)
	if e.Turn == nil || !e.ResumePending || e.ResumeReason != worker.ResumeShutdownTimeout || e.Owner != "" {
		t.Fatalf("after the drain: turn %v resume_pending %v reason %q owner %q", e.Turn != nil, e.ResumePending, e.ResumeReason, e.Owner)
	}
	rs := f.replies(lane)
	if len(rs) != 1 || rs[0].Kind != session.ReplyKindNotice || !strings.Contains(rs[0].Text, "Shutting down") {
		t.Fatalf("replies after the drain: %+v, want one shutdown banner", rs)
	}

	// A new worker resumes without any user message.
	f.startWorker("successor", func(c *worker.Config) { c.Reset.Default = session.ResetPolicy{Mode: session.ResetNone} })
	rs = f.waitReplies(lane, 2)
	got := rs[1].Text
	if !strings.HasPrefix(got, "echo: ") || !strings.Contains(got, "interrupted by a gateway shutdown") || strings.Contains(got, "restart") {
		t.Fatalf("resumed reply %q: want the shutdown-aware note", got)
	}
	e = f.waitCommitted(lane, seq)
	if e.SessionID != sid || e.ResumePending || e.InterruptedTurns != 0 {
		t.Fatalf("after the resumed turn: session %s (was %s) resume_pending %v interrupted %d", e.SessionID, sid, e.ResumePending, e.InterruptedTurns)
	}
}

// TestResumedRetryNotInterruptedByItsOwnRange: a turn over two messages is
// cut by a drain; its retry runs the first message alone (a poison suspect
// dead-letters alone), and the second, which was part of the cut turn, is
// not news that interrupts that retry (default busy mode interrupt): both
// get their reply, in order, each in its own turn.
func TestResumedRetryNotInterruptedByItsOwnRange(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	lane, _ := f.post("narrow", "a\n!sleep 2s", "n1")
	_, sb := f.post("narrow", "b", "n2")

	_, stop := f.startStoppable("cut", mods(noReset, func(c *worker.Config) {
		c.Linger, c.DrainTimeout = 5*time.Second, 300*time.Millisecond
	}))
	if turn := f.waitTurn(lane, sb); turn.FirstSeq == turn.LastSeq {
		t.Fatalf("the first turn covers %d..%d, want both messages", turn.FirstSeq, turn.LastSeq)
	}
	stop()
	if e := f.entry(lane); e.Turn == nil || e.CommittedSeq >= sb {
		t.Fatalf("after the drain: turn %+v committed %d; want the cut turn kept", e.Turn, e.CommittedSeq)
	}

	rec := newRecorder()
	f.startWorker("successor", mods(noReset, func(c *worker.Config) { c.Backend = rec.backend() }))
	e := f.settled(lane, sb)
	if got, want := texts(f.replies(lane), session.ReplyKindReply), []string{"echo: a", "echo: b"}; !slices.Equal(got, want) {
		t.Fatalf("replies %q, want %q", got, want)
	}
	// The retry of a saw a's history only: b is the next turn's.
	retry, ok := rec.turnWith("a\n!sleep 2s")
	if !ok {
		t.Fatal("the successor ran no turn with a")
	}
	if users := historyContents(retry.History, transcript.RoleUser); slices.Contains(users, "b") {
		t.Fatalf("the narrowed retry of a saw b in its history: %q", users)
	}
	// Each user message once, in order (b's entry was written by the cut
	// attempt and is reused, not written again).
	if got, want := contents(f.effective(e.SessionID), transcript.RoleUser), []string{"a\n!sleep 2s", "b"}; !slices.Equal(got, want) {
		t.Fatalf("user entries %q, want %q", got, want)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

func (f *fleet) waitEntry(lane string) *session.SessionEntry {
	f.t.Helper()
	var e *session.SessionEntry
	natstest.WaitFor(f.t, 10*time.Second, "entry of "+lane, func() error {
		var err error
		e, _, err = f.store.Get(f.t.Context(), lane)
		return err
	})
	return e
}

// TestEndedCommandEffectSurvivesCrash: a worker died after appending the
// end of a /stop (or of a dead letter) to the transcript but before the
// commit, which is where the effect on the entry is applied. The next owner
// finds the turn ended, republishes its notice, and commits it with its
// effect: the lane is suspended, as the user was told.
func TestEndedCommandEffectSurvivesCrash(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, text, kind, status string
	}{
		{"stop", "/stop", session.KindCommand, worker.StatusCommand},
		{"dead letter", "poison", session.KindMessage, worker.StatusDeadLetter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFleet(t)
			chat := "ended-" + strings.ReplaceAll(tc.name, " ", "-")
			_, stop := f.startStoppable("w1", noReset)
			lane, s := f.send(chat, "hello")
			sid := f.settled(lane, s).SessionID
			stop()

			// The state a crash between the turn_end append and the commit
			// leaves: the intent in the entry, the notice and the end in
			// the transcript, no lease.
			_, seq := f.send(chat, tc.text)
			turnID := "crashed" + tc.status
			ctx := t.Context()
			e, rev, err := f.store.Get(ctx, lane)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := f.store.Mutate(ctx, lane, e, rev, nil, func(e *session.SessionEntry) (*session.SessionEntry, error) {
				e.Turn = &session.TurnIntent{ID: turnID, FirstSeq: seq, LastSeq: seq, Kind: tc.kind, Attempt: 1,
					SessionID: sid, Owner: e.Owner, Epoch: e.LeaseEpoch, StartedAt: time.Now()}
				return e, nil
			}); err != nil {
				t.Fatal(err)
			}
			last, _, err := f.tx.LastSeq(ctx, sid)
			if err != nil {
				t.Fatal(err)
			}
			for _, en := range []transcript.Entry{
				{ID: turnID + ":notice:0", Kind: transcript.KindNotice, Role: "system", Content: "notice of " + tc.name, TurnID: turnID},
				{ID: turnID + ":end", Kind: transcript.KindTurnEnd, TurnID: turnID, Status: tc.status},
			} {
				if last, err = f.tx.Append(ctx, sid, last, &en); err != nil {
					t.Fatal(err)
				}
			}

			f.startWorker("w2", noReset)
			e = f.settled(lane, seq)
			if !e.Suspended || e.SessionID != sid {
				t.Fatalf("after recovering the ended %s: suspended %v session %s (was %s)", tc.name, e.Suspended, e.SessionID, sid)
			}
			if n := f.lastNotice(lane); n != "notice of "+tc.name {
				t.Fatalf("last notice %q, want the ended turn's notice republished", n)
			}
		})
	}
}
