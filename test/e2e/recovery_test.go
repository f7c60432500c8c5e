package e2e

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/worker"
)

// resumeNotePrefix opens every restart-resume system note, as the echo agent
// lists it under !notes.
const resumeNotePrefix = "note: [System note: Your previous turn in this same session was interrupted"

// resumeNotes returns the lines of a reply that are restart-resume notes.
func resumeNotes(text string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, resumeNotePrefix) {
			out = append(out, line)
		}
	}
	return out
}

// TestKillMidTurnResumes runs two workers with a 3s lease TTL, SIGKILLs the
// one running a lane's turn in the middle of it, and measures the time from
// the kill to the resumed attempt's start on the other worker (DESIGN §3.5:
// resumed without waiting for the user). The lease expires at most one TTL
// after the last renewal, and the held delivery comes back one AckWait (TTL
// + 0.5s) after the last InProgress sent in the same tick as that renewal, so
// the resume should follow the kill by 2/3·TTL+0.5s..TTL+0.5s plus a takeover; the
// assertion allows TTL+4s for a loaded 2-core box. The resumed turn keeps the
// session id, gets the crash-reason resume note, its reply is delivered once,
// and its commit clears interrupted_turns and resume_pending.
func TestKillMidTurnResumes(t *testing.T) {
	const sleep = 20 * time.Second // a long agent turn, as the requirement has it
	c := newCluster(t)
	c.startIngress()
	workers := []*workerProc{c.startWorker("k1"), c.startWorker("k2")}

	text := fmt.Sprintf("resume me\n!notes\n!sleep %v", sleep)
	a := c.post("kill-1", text, "")
	lane := session.LaneToken(a.SessionKey)

	// The owner is mid-turn: its attempt 1 started and the entry records it.
	var victim, rescuer *workerProc
	var turnID, sid string
	var epoch1 uint64
	waitFor(t, 20*time.Second, "a worker to be mid-turn on the lane", func() error {
		e, err := c.entry(a.SessionKey)
		if err != nil {
			return err
		}
		if e.Turn == nil || e.Turn.Attempt != 1 {
			return fmt.Errorf("no first attempt in flight (committed %d)", e.CommittedSeq)
		}
		for i, w := range workers {
			if e.Owner == w.owner {
				victim, rescuer = w, workers[1-i]
			}
		}
		if victim == nil {
			return fatalf("the lane is owned by %q, neither %s nor %s", e.Owner, workers[0].owner, workers[1].owner)
		}
		started := false
		for _, ev := range c.laneTurnEvents(lane) {
			started = started || (ev.Type == "start" && ev.TurnID == e.Turn.ID)
		}
		if !started {
			return errors.New("no start event yet")
		}
		turnID, sid, epoch1 = e.Turn.ID, e.Turn.SessionID, e.LeaseEpoch
		return nil
	})
	// Let the turn run a moment, so the kill lands mid-sleep with renewals
	// (and InProgress) already sent.
	waitFor(t, 10*time.Second, "the turn to have run 1.5s", func() error {
		for _, ev := range c.laneTurnEvents(lane) {
			if ev.Type == "start" && ev.TurnID == turnID && time.Since(ev.At) >= 1500*time.Millisecond {
				return nil
			}
		}
		return errors.New("not yet")
	})
	lastSeq := c.laneLastSeq(a.SessionKey)
	killAt := time.Now()
	victim.kill()
	t.Logf("killed %s (%s) mid-turn %s at epoch %d", victim.id, victim.owner, turnID, epoch1)

	// The resumed attempt starts on the other worker, with no user message.
	var resumed worker.TurnEvent
	waitFor(t, 30*time.Second, "the resumed attempt to start on the other worker", func() error {
		for _, ev := range c.laneTurnEvents(lane) {
			if ev.Type == "start" && ev.TurnID == turnID && ev.Attempt >= 2 {
				resumed = ev
				return nil
			}
		}
		return errors.New("no resumed attempt yet")
	})
	observed := time.Since(killAt)
	resumeAfter := resumed.At.Sub(killAt)
	t.Logf("MEASURED kill → resumed attempt %d start on %s: %v (lease TTL %v; observed by the test after %v)",
		resumed.Attempt, resumed.Owner, resumeAfter.Round(time.Millisecond), leaseTTL, observed.Round(time.Millisecond))
	if resumed.Owner != rescuer.owner || resumed.Attempt != 2 || resumed.SessionID != sid || resumed.Epoch <= epoch1 {
		t.Errorf("resumed attempt %+v, want attempt 2 by %s in session %s at an epoch above %d", resumed, rescuer.owner, sid, epoch1)
	}
	if bound := leaseTTL + 4*time.Second; resumeAfter > bound {
		t.Errorf("the turn resumed %v after the kill, want at most lease TTL + 4s = %v", resumeAfter, bound)
	}
	// While the resumed attempt runs: resume_pending (restart_interrupted)
	// and one interrupted turn counted.
	if e := c.mustEntry(a.SessionKey); e.Turn != nil && e.Turn.ID == turnID {
		if e.Turn.Attempt != 2 || e.Owner != rescuer.owner || !e.ResumePending ||
			e.ResumeReason != worker.ResumeRestartInterrupted || e.InterruptedTurns != 1 {
			t.Errorf("entry during the resumed attempt: attempt %d owner %q resume_pending %v (%q) interrupted_turns %d; "+
				"want 2, %s, true (%s), 1", e.Turn.Attempt, e.Owner, e.ResumePending, e.ResumeReason, e.InterruptedTurns,
				rescuer.owner, worker.ResumeRestartInterrupted)
		}
	} else {
		t.Errorf("the resumed turn ended within %v of its start, its sleep is %v", time.Since(resumed.At), sleep)
	}

	// The reply, once, with the resume note; nobody posted anything.
	got := c.waitReplies(a.SessionKey, 1, 30*time.Second)
	waitFor(t, 30*time.Second, "the lane to settle", func() error {
		if err := c.committed(a.SessionKey, a.Seq); err != nil {
			return err
		}
		if err := c.delivered(); err != nil {
			return err
		}
		return c.inboxSettled()
	})
	t.Logf("reply after %v from the kill: %q", time.Since(killAt).Round(time.Millisecond), got[0].Text)
	// Only the fleet's own wake-up (the watcher's, at the lease expiry) may
	// have joined the lane's inbox.
	if lastSeq != a.Seq {
		t.Errorf("the lane's inbox ended at seq %d before the kill, want %d", lastSeq, a.Seq)
	}
	c.checkNoMessageSince(t, a.SessionKey, lastSeq)
	box := c.allReplies(a.SessionKey)
	if len(box) != 1 || box[0].Kind != session.ReplyKindReply || box[0].SessionID != sid || box[0].TurnID != turnID {
		t.Fatalf("mailbox %+v, want one reply of turn %s in session %s", box, turnID, sid)
	}
	if !strings.HasPrefix(box[0].Text, "echo: resume me\n") {
		t.Errorf("reply %q, want the echo of the message", box[0].Text)
	}
	notes := resumeNotes(box[0].Text)
	switch {
	case len(notes) != 1:
		t.Errorf("reply %q has %d restart-resume notes, want exactly 1", box[0].Text, len(notes))
	case strings.Contains(notes[0], "shutdown") || strings.Contains(notes[0], "gateway restart"):
		t.Errorf("a crash is not a restart or a shutdown, the note says: %q", notes[0])
	default:
		t.Logf("resume note: %q", notes[0])
	}
	e := c.mustEntry(a.SessionKey)
	if e.SessionID != sid || e.InterruptedTurns != 0 || e.ResumePending || e.ResumeReason != "" || e.LastResumeMarkedAt != nil ||
		e.Suspended || e.LastTurnID != turnID {
		t.Errorf("entry after the resumed turn: session %s interrupted_turns %d resume_pending %v %q marked %v suspended %v last turn %s; "+
			"want %s, 0, false, cleared, false, %s", e.SessionID, e.InterruptedTurns, e.ResumePending, e.ResumeReason,
			e.LastResumeMarkedAt, e.Suspended, e.LastTurnID, sid, turnID)
	}
	entries := c.load(sid)
	if users := userEntries(entries); len(users) != 1 || users[0].InboxSeq != a.Seq {
		t.Errorf("user entries %+v, want the message once", users)
	}
	checkRepliesOnce(t, a.SessionKey, entries, box)
	var ends int
	for _, ev := range c.laneTurnEvents(lane) {
		if ev.Type == "end" {
			ends++
			if ev.Owner != rescuer.owner || ev.Status != "completed" {
				t.Errorf("turn end %+v, want completed by %s", ev, rescuer.owner)
			}
		}
	}
	if ends != 1 {
		t.Errorf("%d turn end events, want 1", ends)
	}
}

// TestWholeFleetStopResumes stops the only worker (SIGTERM, drain timeout
// 1s) while a turn runs: the drain marks the lane resume_pending with the
// reason of the stop, tells the user (nobody else can take the turn over),
// cancels the turn at the timeout and keeps its record. A worker started
// later resumes the turn without a user message, and the reply carries the
// reason-aware note: a shutdown is called a shutdown, a restart (--restart)
// a restart. A turn that finishes within the drain timeout is not
// interrupted and nobody is told it was.
func TestWholeFleetStopResumes(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.startIngress()
	for _, tc := range []struct {
		name   string
		args   []string
		reason string
		says   string // what the note and the banner must call the interruption
		not    string // what they must not call it
	}{
		{"shutdown", nil, worker.ResumeShutdownTimeout, "shutdown", "restart"},
		{"restart", []string{"--restart"}, worker.ResumeRestartTimeout, "restart", "shutdown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := c.t
			c.t = t
			defer func() { c.t = parent }()
			drain := "AGENTFLEET_AGENT_RESTART_DRAIN_TIMEOUT=1s"
			w := c.startWorkerArgs("fleet-"+tc.name, tc.args, drain)
			a := c.post("fleet-"+tc.name, "whole fleet "+tc.name+"\n!notes\n!sleep 4s", "")
			lane := session.LaneToken(a.SessionKey)
			var turnID, sid string
			waitFor(t, 20*time.Second, "the turn to run", func() error {
				e, err := c.entry(a.SessionKey)
				if err != nil {
					return err
				}
				if e.Turn == nil || e.Owner != w.owner {
					return fmt.Errorf("owner %q turn %v", e.Owner, e.Turn != nil)
				}
				turnID, sid = e.Turn.ID, e.Turn.SessionID
				return nil
			})
			took := stopWorker(t, w, 30*time.Second)
			t.Logf("MEASURED the only worker exited 0 %v after SIGTERM (drain timeout 1s)", took.Round(time.Millisecond))

			// What the stop left: the marker with its reason, the turn record,
			// no owner, nothing counted yet.
			e := c.mustEntry(a.SessionKey)
			if e.Turn == nil || e.Turn.ID != turnID || e.Turn.Attempt != 1 {
				t.Fatalf("after the stop the entry's turn is %+v, want turn %s attempt 1 kept", e.Turn, turnID)
			}
			if !e.ResumePending || e.ResumeReason != tc.reason || e.LastResumeMarkedAt == nil {
				t.Errorf("after the stop: resume_pending %v reason %q marked %v, want true %q", e.ResumePending, e.ResumeReason, e.LastResumeMarkedAt, tc.reason)
			}
			if e.Owner != "" || e.InterruptedTurns != 0 || e.Suspended || e.SessionID != sid {
				t.Errorf("after the stop: owner %q interrupted_turns %d suspended %v session %s; want released, 0, false, %s",
					e.Owner, e.InterruptedTurns, e.Suspended, e.SessionID, sid)
			}
			// No other worker could take the turn over: the user was told,
			// once, in words that match the stop.
			calls := func(text, word string) bool {
				text = strings.ToLower(text)
				return strings.Contains(text, word) || (word == "shutdown" && strings.Contains(text, "shutting down"))
			}
			var banner reply
			switch box := c.allReplies(a.SessionKey); {
			case len(box) != 1 || box[0].Kind != session.ReplyKindNotice || box[0].TurnID != turnID:
				t.Errorf("mailbox after the stop %+v, want one drain banner (a notice of turn %s)", box, turnID)
			case !calls(box[0].Text, tc.says) || calls(box[0].Text, tc.not):
				t.Errorf("drain banner %q: want it to call the stop a %s, not a %s", box[0].Text, tc.says, tc.not)
			default:
				banner = box[0]
				t.Logf("drain banner: %q", banner.Text)
			}

			// A new worker resumes it on its own.
			lastSeq := c.laneLastSeq(a.SessionKey)
			restartAt := time.Now()
			w2 := c.startWorkerArgs("fleet-"+tc.name+"-next", tc.args, drain)
			var resumed worker.TurnEvent
			waitFor(t, 30*time.Second, "the turn to resume on the new worker", func() error {
				for _, ev := range c.laneTurnEvents(lane) {
					if ev.Type == "start" && ev.TurnID == turnID && ev.Attempt == 2 && ev.Owner == w2.owner {
						resumed = ev
						return nil
					}
				}
				return errors.New("not yet")
			})
			t.Logf("MEASURED new worker start → resumed attempt: %v", resumed.At.Sub(restartAt).Round(time.Millisecond))
			box := c.waitReplies(a.SessionKey, 1, 30*time.Second)
			waitFor(t, 30*time.Second, "the lane to settle", func() error {
				if err := c.committed(a.SessionKey, a.Seq); err != nil {
					return err
				}
				return c.delivered()
			})
			box = c.allReplies(a.SessionKey)
			var replies []reply
			for _, r := range box {
				switch {
				case r.Kind == session.ReplyKindReply:
					replies = append(replies, r)
				case r != banner:
					t.Errorf("a notice besides the drain banner: %+v", r)
				}
			}
			if len(replies) != 1 || replies[0].TurnID != turnID || replies[0].SessionID != sid {
				t.Fatalf("mailbox %+v, want one reply of turn %s in session %s", box, turnID, sid)
			}
			notes := resumeNotes(replies[0].Text)
			if len(notes) != 1 || !strings.Contains(notes[0], "gateway "+tc.says) || calls(notes[0], tc.not) {
				t.Errorf("reply %q: want one resume note that says %q and not %q", replies[0].Text, "gateway "+tc.says, tc.not)
			} else {
				t.Logf("resume note: %q", notes[0])
			}
			c.checkNoMessageSince(t, a.SessionKey, lastSeq)
			e = c.mustEntry(a.SessionKey)
			if e.SessionID != sid || e.ResumePending || e.InterruptedTurns != 0 || e.Turn != nil {
				t.Errorf("after the resumed turn: session %s resume_pending %v interrupted_turns %d turn %v; want %s, false, 0, none",
					e.SessionID, e.ResumePending, e.InterruptedTurns, e.Turn != nil, sid)
			}
			checkRepliesOnce(t, a.SessionKey, c.load(sid), box)
			stopWorker(t, w2, 30*time.Second)
		})
	}

	// A turn that finishes within the drain timeout was not interrupted:
	// its reply, no banner, no marker left.
	t.Run("drained", func(t *testing.T) {
		parent := c.t
		c.t = t
		defer func() { c.t = parent }()
		w := c.startWorkerArgs("fleet-drained", nil, "AGENTFLEET_AGENT_RESTART_DRAIN_TIMEOUT=5s")
		a := c.post("fleet-drained", "drained\n!sleep 1500ms", "")
		waitFor(t, 20*time.Second, "the turn to run", func() error {
			e, err := c.entry(a.SessionKey)
			if err != nil {
				return err
			}
			if e.Turn == nil || e.Owner != w.owner {
				return fmt.Errorf("owner %q turn %v", e.Owner, e.Turn != nil)
			}
			return nil
		})
		took := stopWorker(t, w, 30*time.Second)
		t.Logf("MEASURED the only worker, its turn finishing within the drain, exited 0 %v after SIGTERM", took.Round(time.Millisecond))
		waitFor(t, 30*time.Second, "the turn to be committed and delivered", func() error {
			if err := c.committed(a.SessionKey, a.Seq); err != nil {
				return err
			}
			return c.delivered()
		})
		box := c.allReplies(a.SessionKey)
		if len(box) != 1 || box[0].Kind != session.ReplyKindReply || box[0].Text != "echo: drained" {
			t.Errorf("mailbox %+v, want only the reply \"echo: drained\": the turn finished within the drain, nothing was interrupted", box)
		}
		if e := c.mustEntry(a.SessionKey); e.ResumePending || e.InterruptedTurns != 0 || e.Turn != nil {
			t.Errorf("after a drain the turn survived: resume_pending %v (%q) interrupted_turns %d turn %v", e.ResumePending, e.ResumeReason, e.InterruptedTurns, e.Turn)
		}
	})
}
