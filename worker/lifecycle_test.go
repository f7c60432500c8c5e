package worker_test

// Seed lifecycle behaviours: the freshness window of an interrupted turn,
// resume_pending cleared only by a completed turn, the restart-resume and
// tool-tail notes, the automatic resume of a pending lane, read-only
// commands answered during a turn, the /resume list, /title, and the
// gating of reset notices (seeds/session-lifecycle.md,
// seeds/resume-after-restart-spec.md, DESIGN §5).

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/transcript"
	"github.com/agentfleet/agentfleet/worker"
)

// specNote is the resume spec's restart-resume note for an interruption.
func specNote(cause string) string {
	return "[System note: Your previous turn in this same session was interrupted by " + cause +
		". Continue from the existing transcript. If there are unfinished tool results, process them first, " +
		"summarize what was accomplished, then answer the user's new message.]"
}

const wantToolTail = "[System note: Your previous turn ended while processing tool results. Finish processing the interrupted tool results before addressing the new user message.]"

// crashedTurn leaves in the lane's entry what a worker that died in the
// middle of a message turn over seq leaves: the turn's intent, started at
// startedAt (also the entry's updated_at), and no lease.
func (f *fleet) crashedTurn(lane string, seq uint64, startedAt time.Time) *session.TurnIntent {
	f.t.Helper()
	var turn *session.TurnIntent
	e, rev, err := f.store.Get(f.t.Context(), lane)
	if err != nil {
		f.t.Fatal(err)
	}
	if _, _, err := f.store.Mutate(f.t.Context(), lane, e, rev, nil, func(e *session.SessionEntry) (*session.SessionEntry, error) {
		turn = &session.TurnIntent{ID: fmt.Sprintf("crashed%d", seq), FirstSeq: seq, LastSeq: seq, Kind: session.KindMessage, Attempt: 1,
			SessionID: e.SessionID, Owner: e.Owner, Epoch: e.LeaseEpoch, StartedAt: startedAt}
		e.Turn = turn
		e.UpdatedAt = startedAt
		return e, nil
	}); err != nil {
		f.t.Fatal(err)
	}
	return turn
}

// startedSession runs one turn on a first worker, stops it, and returns the
// lane and its session id.
func (f *fleet) startedSession(chat string) (string, string) {
	f.t.Helper()
	_, stop := f.startStoppable("first", noReset)
	lane, s := f.send(chat, "hello")
	sid := f.settled(lane, s).SessionID
	stop()
	return lane, sid
}

// TestStaleInterruptedTurnWaitsForTheUser: a turn interrupted (its worker
// died) longer ago than agent.gateway_auto_continue_freshness is not run
// again when a worker comes back: its message is recorded, the turn ends
// interrupted, the session stays with resume_pending dated from the
// interruption. The user's next message continues it with the resume note;
// under an idle policy the stale marker does not protect the session from
// the reset.
func TestStaleInterruptedTurnWaitsForTheUser(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		policy session.ResetPolicy
		reset  bool
	}{
		{"policy none", session.ResetPolicy{Mode: session.ResetNone}, false},
		{"idle policy", session.ResetPolicy{Mode: session.ResetIdle, IdleMinutes: 60, Notify: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFleet(t)
			chat := "stale-" + strings.ReplaceAll(tc.name, " ", "-")
			lane, sid := f.startedSession(chat)
			_, seq := f.send(chat, "long task\n!notes")
			at := time.Now().Add(-2 * time.Hour)
			f.crashedTurn(lane, seq, at)
			before := len(f.replies(lane))

			rec := newRecorder()
			f.startWorker("back", func(c *worker.Config) {
				c.Reset.Default, c.Freshness, c.Backend = tc.policy, time.Hour, rec.backend()
			})
			e := f.settled(lane, seq)
			if e.SessionID != sid || !e.ResumePending || e.ResumeReason != worker.ResumeRestartInterrupted || e.InterruptedTurns != 1 {
				t.Fatalf("after the stale turn: session %s (was %s) resume_pending %v %q interrupted_turns %d; want kept, pending (%s), 1",
					e.SessionID, sid, e.ResumePending, e.ResumeReason, e.InterruptedTurns, worker.ResumeRestartInterrupted)
			}
			if e.LastResumeMarkedAt == nil || e.LastResumeMarkedAt.After(at.Add(time.Second)) {
				t.Errorf("marker %v, want the interruption's time %v (stale)", e.LastResumeMarkedAt, at)
			}
			if rs := f.replies(lane); len(rs) != before {
				t.Errorf("the stale turn was answered: %q", texts(rs[before:], ""))
			}
			if _, ran := rec.turnWith("long task\n!notes"); ran {
				t.Error("the stale turn was run again")
			}
			if users := contents(f.effective(sid), transcript.RoleUser); !slices.Equal(users, []string{"hello", "long task\n!notes"}) {
				t.Errorf("user entries %q: the stale turn's message must be recorded once", users)
			}

			_, s := f.send(chat, "next\n!notes")
			e = f.settled(lane, s)
			got := texts(f.replies(lane), session.ReplyKindReply)
			last := got[len(got)-1]
			if tc.reset {
				if e.SessionID == sid || e.ParentSessionID != sid {
					t.Errorf("stale marker under an idle policy: session %s parent %s, want a new session after %s", e.SessionID, e.ParentSessionID, sid)
				}
				if last != "echo: next\nnote: "+wantIdleNote {
					t.Errorf("reply %q, want the idle reset's note only", last)
				}
			} else {
				if e.SessionID != sid {
					t.Errorf("the next message moved the lane to %s, want %s", e.SessionID, sid)
				}
				if want := "echo: next\nnote: " + specNote("a gateway crash"); last != want {
					t.Errorf("reply %q, want %q", last, want)
				}
				turn, _ := rec.turnWith("next\n!notes")
				if users := historyContents(turn.History, transcript.RoleUser); !slices.Contains(users, "long task\n!notes") {
					t.Errorf("the continuing turn's history %q lacks the interrupted message", users)
				}
			}
			if e.ResumePending || e.InterruptedTurns != 0 {
				t.Errorf("after the next turn: resume_pending %v interrupted_turns %d", e.ResumePending, e.InterruptedTurns)
			}
		})
	}
}

// TestResumePendingClearedOnlyBySuccess: a resumed turn that fails, or that
// the user interrupts, leaves resume_pending (and the interrupted count);
// the next turn still gets the resume note, and only its completion clears
// them.
func TestResumePendingClearedOnlyBySuccess(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"failed", "interrupted"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			f := newFleet(t)
			chat := "clear-" + how
			lane, sid := f.startedSession(chat)
			text := "!fail"
			if how == "interrupted" {
				text = "slow\n!sleep 30s"
			}
			_, seq := f.send(chat, text)
			turn := f.crashedTurn(lane, seq, time.Now())
			f.startWorker("back", noReset)
			if how == "interrupted" {
				natstest.WaitFor(t, 10*time.Second, "the resumed attempt to run", func() error {
					if e := f.entry(lane); e.Turn == nil || e.Turn.ID != turn.ID || e.Turn.Attempt != 2 || e.Turn.AgentStarted != 2 {
						return fmt.Errorf("turn %+v", e.Turn)
					}
					return nil
				})
				// A long turn of its own, so the state after the interrupted
				// one can be read while it runs.
				f.send(chat, "interrupting\n!sleep 30s")
			}
			natstest.WaitFor(t, 10*time.Second, "the resumed turn to end", func() error {
				e := f.entry(lane)
				if e.LastTurnID != turn.ID {
					return fmt.Errorf("last turn %q", e.LastTurnID)
				}
				if how == "interrupted" && e.Turn == nil {
					return errString("the interrupting turn does not run yet")
				}
				return nil
			})
			status, _ := transcript.TurnEnded(f.load(sid), turn.ID)
			if want := map[string]string{"failed": worker.StatusFailed, "interrupted": worker.StatusInterrupted}[how]; status != want {
				t.Fatalf("resumed turn ended %q, want %q", status, want)
			}
			e := f.entry(lane)
			if !e.ResumePending || e.ResumeReason != worker.ResumeRestartInterrupted || e.InterruptedTurns != 1 {
				t.Errorf("after the %s resumed turn: resume_pending %v %q interrupted_turns %d; want kept", how, e.ResumePending, e.ResumeReason, e.InterruptedTurns)
			}
			_, s := f.send(chat, "next\n!notes")
			e = f.settled(lane, s)
			got := texts(f.replies(lane), session.ReplyKindReply)
			if want := specNote("a gateway crash"); !strings.HasSuffix(got[len(got)-1], "\nnote: "+want) {
				t.Errorf("reply %q, want the resume note", got[len(got)-1])
			}
			if e.ResumePending || e.InterruptedTurns != 0 || e.SessionID != sid {
				t.Errorf("after the completed turn: resume_pending %v interrupted_turns %d session %s", e.ResumePending, e.InterruptedTurns, e.SessionID)
			}
		})
	}
}

// TestAutomaticResumePerReason: a session marked resume_pending with no
// turn in flight gets an automatic turn (an event with empty text) when the
// owner picks the marker up, with the spec's note for the reason; a reason
// outside the automatic set gets none.
func TestAutomaticResumePerReason(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	rec := newRecorder()
	f.startWorker("w1", mods(noReset, func(c *worker.Config) { c.Backend = rec.backend() }))
	for _, tc := range []struct{ reason, cause string }{
		{worker.ResumeRestartTimeout, "a gateway restart"},
		{worker.ResumeShutdownTimeout, "a gateway shutdown"},
		{worker.ResumeRestartInterrupted, "a gateway crash"},
	} {
		chat := "auto-" + tc.reason
		lane, s := f.send(chat, "hello")
		sid := f.settled(lane, s).SessionID
		f.adminCommand(lane, "resume_pending", tc.reason)
		rs := f.waitReply(lane, "the automatic resume of "+tc.reason, func(r session.Reply) bool { return r.Text == "echo: " })
		if got := texts(rs, ""); !slices.Equal(got, []string{"echo: hello", "echo: "}) {
			t.Errorf("%s: replies %q", tc.reason, got)
		}
		turn, ok := rec.turnWith("")
		if !ok || turn.SessionID != sid || len(turn.Messages) != 1 || !slices.Equal(turn.Notes, []string{specNote(tc.cause)}) {
			t.Errorf("%s: automatic turn %v session %s messages %+v notes %q; want one empty message in %s with the note %q",
				tc.reason, ok, turn.SessionID, turn.Messages, turn.Notes, sid, specNote(tc.cause))
		}
		natstest.WaitFor(t, 10*time.Second, "the automatic resume to clear the marker", func() error {
			if e := f.entry(lane); e.Turn != nil || e.ResumePending {
				return fmt.Errorf("turn %v resume_pending %v", e.Turn != nil, e.ResumePending)
			}
			return nil
		})
	}

	lane, s := f.send("auto-manual", "hello")
	f.settled(lane, s)
	s = f.adminCommand(lane, "resume_pending", "manual")
	f.settled(lane, s)
	_, s = f.send("auto-manual", "x")
	f.settled(lane, s)
	if got := texts(f.replies(lane), ""); !slices.Equal(got, []string{"echo: hello", "echo: x"}) {
		t.Errorf("a reason outside the automatic set: replies %q, want no automatic turn", got)
	}
}

// TestToolTailNote: a turn interrupted by the user after its tools returned
// leaves the transcript ending in a tool result; the next turn is told so
// (the check comes before its own user entries are appended).
func TestToolTailNote(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	lane, s := f.send("tooltail", "!tools 2\n!sleep 30s")
	turn := f.waitTurn(lane, s)
	natstest.WaitFor(t, 10*time.Second, "the tool results", func() error {
		if n := len(contents(f.load(turn.SessionID), "tool")); n < 2 {
			return fmt.Errorf("%d tool results", n)
		}
		return nil
	})
	_, s = f.send("tooltail", "next\n!notes")
	f.settled(lane, s)
	if got, want := texts(f.replies(lane), session.ReplyKindReply), []string{"echo: next\nnote: " + wantToolTail}; !slices.Equal(got, want) {
		t.Errorf("replies %q, want %q", got, want)
	}
}

// TestReadOnlyCommandsDuringTurn: /status and /help sent while a turn runs
// are answered at once, without interrupting it; a /help sent behind a
// message that waits is not answered before that message's turn runs
// (answers keep inbox order), and nothing is answered twice.
func TestReadOnlyCommandsDuringTurn(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{worker.BusyInterrupt, worker.BusyQueue} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			f := newFleet(t)
			f.startWorker("w1", mods(noReset, func(c *worker.Config) { c.BusyMode = mode }))
			chat := "ro-" + mode
			lane, s := f.send(chat, "first\n!sleep 5s")
			first := f.waitTurn(lane, s)
			f.send(chat, "/status")
			rs := f.waitReply(lane, "the /status answer", func(r session.Reply) bool { return strings.HasPrefix(r.Text, "Session ") })
			if got := texts(rs, ""); len(got) != 1 {
				t.Fatalf("replies when /status was answered: %q, want the answer before the running turn's reply", got)
			}
			if !strings.Contains(rs[0].Text, "Running: a turn since") {
				t.Errorf("/status answer %q does not show the running turn", rs[0].Text)
			}
			f.send(chat, "/help")
			f.waitReply(lane, "the /help answer", func(r session.Reply) bool { return strings.HasPrefix(r.Text, "Commands:") })
			// Behind a message that waits: answered only once that message
			// is incorporated (while its turn runs).
			_, s2 := f.send(chat, "second\n!sleep 2s")
			_, s3 := f.send(chat, "/help")
			e := f.settled(lane, s3)
			kinds := []string{}
			for _, r := range f.replies(lane) {
				switch {
				case strings.HasPrefix(r.Text, "Session "):
					kinds = append(kinds, "status")
				case strings.HasPrefix(r.Text, "Commands:"):
					kinds = append(kinds, "help")
				default:
					kinds = append(kinds, r.Text)
				}
			}
			if want := []string{"status", "help", "echo: first", "help", "echo: second"}; !slices.Equal(kinds, want) {
				t.Errorf("replies in order %q, want %q", kinds, want)
			}
			if status, _ := transcript.TurnEnded(f.load(e.SessionID), first.ID); status != worker.StatusCompleted {
				t.Errorf("the running turn ended %q, want completed", status)
			}
			if e.CommittedSeq < s2 {
				t.Errorf("committed %d", e.CommittedSeq)
			}
		})
	}
}

// TestResumeListAndNumber: /resume alone lists the lane's named sessions,
// numbered, newest first, without the current one (nor untitled ones);
// /resume N switches to the N-th; a number outside the list changes
// nothing.
func TestResumeListAndNumber(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	lane, s := f.send("rl", "untitled")
	f.settled(lane, s)
	_, s = f.send("rl", "/new alpha")
	alpha := f.settled(lane, s).SessionID
	_, s = f.send("rl", "/new beta")
	beta := f.settled(lane, s).SessionID
	_, s = f.send("rl", "/new gamma")
	gamma := f.settled(lane, s).SessionID

	_, s = f.send("rl", "/resume")
	f.settled(lane, s)
	n := f.lastNotice(lane)
	if !strings.Contains(n, "1. beta ("+beta) || !strings.Contains(n, "2. alpha ("+alpha) || strings.Contains(n, "gamma") || strings.Contains(n, "3.") {
		t.Errorf("/resume list %q, want 1. beta, 2. alpha only", n)
	}
	_, s = f.send("rl", "/resume 2")
	if e := f.settled(lane, s); e.SessionID != alpha {
		t.Fatalf("/resume 2 went to %s, want alpha %s", e.SessionID, alpha)
	}
	_, s = f.send("rl", "/resume 9")
	if e := f.settled(lane, s); e.SessionID != alpha {
		t.Errorf("/resume 9 moved the lane to %s", e.SessionID)
	}
	if n := f.lastNotice(lane); !strings.HasPrefix(n, "No session number 9 in the list.") || !strings.Contains(n, "gamma ("+gamma) {
		t.Errorf("/resume 9 notice %q", n)
	}
}

// TestTitleCommand: /title sets the current session's title, sanitized
// (control and invisible characters dropped, white space collapsed), shows
// it without argument, refuses a title over 100 characters with a clear
// error and no change, and keeps titles unique in the lane with the
// lineage numbering. A /new whose title is refused starts nothing.
func TestTitleCommand(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	lane, s := f.send("tt", "hello")
	first := f.settled(lane, s).SessionID

	_, s = f.send("tt", "/title")
	f.settled(lane, s)
	if n := f.lastNotice(lane); !strings.Contains(n, "has no title") {
		t.Errorf("/title without a title: %q", n)
	}
	_, s = f.send("tt", "/title \ufeff My\x00 \u200bProject\u202e\t\n  plan  ")
	f.settled(lane, s)
	if n := f.lastNotice(lane); n != "✏️ Session title set: My Project plan" {
		t.Errorf("/title notice %q", n)
	}
	_, s = f.send("tt", "/title")
	f.settled(lane, s)
	if n := f.lastNotice(lane); n != "Session "+first+"\nTitle: My Project plan" {
		t.Errorf("/title shows %q", n)
	}
	_, s = f.send("tt", "/title "+strings.Repeat("x", 101))
	f.settled(lane, s)
	if n := f.lastNotice(lane); !strings.Contains(n, "too long (101 characters, at most 100)") {
		t.Errorf("a 101-character title: %q", n)
	}
	_, s = f.send("tt", "/new "+strings.Repeat("y", 101))
	if e := f.settled(lane, s); e.SessionID != first {
		t.Errorf("a /new with a refused title started session %s", e.SessionID)
	}
	_, s = f.send("tt", "/new other")
	second := f.settled(lane, s).SessionID
	_, s = f.send("tt", "/title my project plan")
	f.settled(lane, s)
	if n := f.lastNotice(lane); !strings.HasPrefix(n, "✏️ Session title set: my project plan #2") {
		t.Errorf("a title another session has: %q", n)
	}
	_, s = f.send("tt", "/resume My Project plan #1")
	if e := f.settled(lane, s); e.SessionID != first {
		t.Errorf("/resume by the sanitized title went to %s, want %s (the other is %s)", e.SessionID, first, second)
	}
}

// TestResetNoticeGating: an idle reset of a session that had no activity
// sends no notice; platforms in notify_exclude_platforms get no notice,
// neither for an idle reset nor for a suspended one; a suspended reset
// notifies even with notify off.
func TestResetNoticeGating(t *testing.T) {
	t.Parallel()
	idle := session.ResetPolicy{Mode: session.ResetIdle, IdleMinutes: 1, Notify: true}
	t.Run("no activity", func(t *testing.T) {
		t.Parallel()
		f := newFleet(t)
		clk := &testClock{now: time.Date(2030, 1, 2, 10, 0, 0, 0, time.UTC)}
		f.startWorker("w1", func(c *worker.Config) { c.Now, c.Location, c.Reset.Default = clk.Now, time.UTC, idle })
		lane, s := f.send("quiet", "/new")
		sid := f.settled(lane, s).SessionID
		clk.Advance(2 * time.Minute)
		_, s = f.send("quiet", "hi")
		if e := f.settled(lane, s); e.SessionID == sid || e.ParentSessionID != sid {
			t.Fatalf("no idle reset: session %s (was %s)", e.SessionID, sid)
		}
		if got := texts(f.replies(lane), session.ReplyKindNotice); len(got) != 1 || !strings.HasPrefix(got[0], "✨ Started a new session") {
			t.Errorf("notices %q, want only the /new one", got)
		}
	})
	t.Run("excluded platform", func(t *testing.T) {
		t.Parallel()
		f := newFleet(t)
		clk := &testClock{now: time.Date(2030, 1, 2, 10, 0, 0, 0, time.UTC)}
		f.startWorker("w1", func(c *worker.Config) {
			c.Now, c.Location, c.Reset.Default = clk.Now, time.UTC, idle
			c.Reset.NotifyExcludePlatforms = []session.Platform{session.PlatformHTTP}
		})
		lane, s := f.send("excl", "one")
		sid := f.settled(lane, s).SessionID
		clk.Advance(2 * time.Minute)
		_, s = f.send("excl", "two")
		if e := f.settled(lane, s); e.SessionID == sid {
			t.Fatal("no idle reset")
		}
		_, s = f.send("excl", "/stop")
		f.settled(lane, s)
		_, s = f.send("excl", "three")
		if e := f.settled(lane, s); e.AutoResetReason != "" || e.ParentSessionID == "" {
			t.Fatalf("no suspended reset: %+v", e)
		}
		if got := texts(f.replies(lane), session.ReplyKindNotice); !slices.Equal(got, []string{wantStopped}) {
			t.Errorf("notices %q, want only the /stop answer", got)
		}
	})
	t.Run("suspended with notify off", func(t *testing.T) {
		t.Parallel()
		f := newFleet(t)
		f.startWorker("w1", noReset) // notify false
		lane, s := f.send("susp", "/stop")
		f.settled(lane, s)
		_, s = f.send("susp", "x")
		f.settled(lane, s)
		if n := f.lastNotice(lane); n != wantSuspended {
			t.Errorf("last notice %q, want the suspended reset's", n)
		}
	})
}

// TestSuspendRecentGetsAutomaticResume: sessions marked resume_pending
// while no worker runs (fleetctl session suspend-recent, after an unclean
// stop of the whole fleet) are woken by the watcher's sweep once a worker
// is back, and get their automatic turn without a message from the user.
func TestSuspendRecentGetsAutomaticResume(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	lane, sid := f.startedSession("recent")
	marked, err := f.store.SuspendRecentlyActive(t.Context(), 2*time.Minute)
	if err != nil || len(marked) != 1 {
		t.Fatalf("suspend-recent marked %q: %v", marked, err)
	}
	rec := newRecorder()
	f.startWorker("back", mods(noReset, func(c *worker.Config) { c.WatchInterval, c.Backend = 200*time.Millisecond, rec.backend() }))
	f.waitReply(lane, "the automatic resume", func(r session.Reply) bool { return r.Text == "echo: " })
	turn, ok := rec.turnWith("")
	if !ok || turn.SessionID != sid || !slices.Equal(turn.Notes, []string{specNote("a gateway crash")}) {
		t.Errorf("automatic turn %v in %s with notes %q, want one in %s with the crash's note", ok, turn.SessionID, turn.Notes, sid)
	}
	natstest.WaitFor(t, 10*time.Second, "the marker to clear", func() error {
		if e := f.entry(lane); e.ResumePending || e.Turn != nil {
			return fmt.Errorf("resume_pending %v turn %v", e.ResumePending, e.Turn != nil)
		}
		return nil
	})
}

// TestRefusedNewTitleDiscardsNothing: a /new whose title is refused
// changes nothing, so the /queue items waiting before it are not discarded.
func TestRefusedNewTitleDiscardsNothing(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	lane, sid := f.startedSession("refused")
	f.send("refused", "/queue kept")
	_, s := f.send("refused", "/new "+strings.Repeat("z", 101))
	f.startWorker("w1", noReset)
	e := f.settled(lane, s)
	if e.SessionID != sid || e.DiscardedQueue != 0 {
		t.Errorf("after a refused /new: session %s (was %s) discarded %d", e.SessionID, sid, e.DiscardedQueue)
	}
	if got := texts(f.replies(lane), session.ReplyKindReply); !slices.Equal(got, []string{"echo: hello", "echo: kept"}) {
		t.Errorf("replies %q, want the queued item answered", got)
	}
	if n := f.lastNotice(lane); !strings.HasPrefix(n, "⚠️ No new session: invalid session title: it is too long") {
		t.Errorf("notice %q", n)
	}
}
