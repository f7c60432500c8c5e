package worker_test

// Lane commands (/new, /reset, /resume, /undo, /retry, /stop, /status,
// /busy), their admin twins published as fleetctl does, automatic reset
// notices and agent failures (DESIGN §5, seed §6).

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/transcript"
	"github.com/agentfleet/agentfleet/worker"
)

// User-facing copy the tests expect (worker/recover.go, worker/commands.go).
const (
	wantStopped     = "⏹ Stopped. Your next message starts a fresh session."
	wantSuspended   = "◐ Session automatically reset (the previous session was stopped or interrupted). Use /resume to return to it."
	wantIdle        = "◐ Session automatically reset after a period of inactivity. Use /resume to return to the previous conversation."
	wantIdleNote    = "[System note: The previous session expired due to inactivity; this is a fresh session.]"
	wantFailure     = "⚠️ Sorry, something went wrong while answering that message. Send it again, or /retry."
	wantResumeNote  = "[System note: Your previous turn in this same session was interrupted by an unexpected stop of the worker running it."
	wantRetryNotice = "🔁 Retrying your last message."
)

// lastNotice returns the text of the lane's last notice.
func (f *fleet) lastNotice(lane string) string {
	f.t.Helper()
	ns := texts(f.replies(lane), session.ReplyKindNotice)
	if len(ns) == 0 {
		f.t.Fatalf("no notice on %s", lane)
	}
	return ns[len(ns)-1]
}

// ---------------------------------------------------------------------------
// /new and /reset.

// /new while /queue items wait: a new session linked to the old one; the
// queued items are recorded as discarded (old transcript, events) and
// counted in the /new notice; the old transcript is closed towards the new
// session; the next message lands in the new session without an auto-reset
// notice.
func TestNewDiscardsQueuedItems(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	lane, s0 := f.send("new", "first\n!sleep 1500ms")
	first := f.waitTurn(lane, s0)
	old := first.SessionID
	_, sa := f.send("new", "/queue a")
	_, sb := f.send("new", "/queue b")
	_, sn := f.send("new", "/new")
	e := f.settled(lane, sn)

	if e.SessionID == old || !session.ValidSessionID(e.SessionID) {
		t.Fatalf("session %q after /new (old %q)", e.SessionID, old)
	}
	if e.ParentSessionID != old {
		t.Errorf("parent %q, want %q", e.ParentSessionID, old)
	}
	if e.WasAutoReset || e.AutoResetReason != "" {
		t.Errorf("/new is not an automatic reset: was_auto_reset=%v reason=%q", e.WasAutoReset, e.AutoResetReason)
	}
	if e.DiscardedQueue != 0 || e.QueueDepth != 0 {
		t.Errorf("discarded_queue %d queue_depth %d left after the /new notice reported the discards", e.DiscardedQueue, e.QueueDepth)
	}
	rs := f.replies(lane)
	if got := texts(rs, session.ReplyKindReply); !slices.Equal(got, []string{"echo: first"}) {
		t.Errorf("replies %q: queued items must not run after /new discarded them", got)
	}
	notice := f.lastNotice(lane)
	if !strings.Contains(notice, e.SessionID) || !strings.Contains(notice, "Discarded 2 queued message(s)") {
		t.Errorf("/new notice %q", notice)
	}

	oldTx := f.load(old)
	var discarded []string
	for _, en := range ofKind(oldTx, transcript.KindNotice) {
		if strings.HasPrefix(en.Content, "Discarded queued message: ") {
			discarded = append(discarded, en.Content)
		}
	}
	if want := []string{"Discarded queued message: a", "Discarded queued message: b"}; !slices.Equal(discarded, want) {
		t.Errorf("old transcript discard notes %q, want %q", discarded, want)
	}
	closed := ofKind(oldTx, transcript.KindClosed)
	if len(closed) != 1 || closed[0].NextSessionID != e.SessionID || closed[0].Reason != session.ReasonNew {
		t.Errorf("old transcript closed entries %+v, want one pointing to %s (reason new)", closed, e.SessionID)
	}
	if users := contents(transcript.Effective(oldTx), transcript.RoleUser); !slices.Equal(users, []string{"first\n!sleep 1500ms"}) {
		t.Errorf("old transcript users %q", users)
	}
	var evSeqs []uint64
	natstest.WaitFor(t, 10*time.Second, "discarded events", func() error {
		evSeqs = nil
		for _, ev := range f.events("discarded", lane) {
			s, _ := ev["seq"].(float64)
			evSeqs = append(evSeqs, uint64(s))
		}
		if len(evSeqs) < 2 {
			return fmt.Errorf("events for seqs %v", evSeqs)
		}
		return nil
	})
	if !slices.Equal(evSeqs, []uint64{sa, sb}) {
		t.Errorf("discarded events for seqs %v, want %v", evSeqs, []uint64{sa, sb})
	}

	nNotices := len(texts(f.replies(lane), session.ReplyKindNotice))
	_, sx := f.send("new", "next")
	e2 := f.settled(lane, sx)
	if e2.SessionID != e.SessionID {
		t.Errorf("the message after /new moved to %s, want %s", e2.SessionID, e.SessionID)
	}
	rs = f.replies(lane)
	if got := texts(rs, session.ReplyKindReply); got[len(got)-1] != "echo: next" {
		t.Errorf("replies %q", got)
	}
	if n := len(texts(rs, session.ReplyKindNotice)); n != nNotices {
		t.Errorf("the first message after /new got a notice: %q", texts(rs, session.ReplyKindNotice))
	}
	if users := contents(f.effective(e.SessionID), transcript.RoleUser); !slices.Equal(users, []string{"next"}) {
		t.Errorf("new session users %q", users)
	}
}

// Seed §2: is_fresh_reset is set by an explicit /new or /reset and consumed
// by the first message after it; it is not an automatic reset.
func TestNewSetsFreshResetUntilFirstMessage(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	for _, cmd := range []string{"/new", "/reset"} {
		chat := "fresh" + strings.TrimPrefix(cmd, "/")
		lane, s := f.send(chat, "hello")
		before := f.settled(lane, s)
		_, s = f.send(chat, cmd)
		e := f.settled(lane, s)
		if e.SessionID == before.SessionID || e.ParentSessionID != before.SessionID {
			t.Errorf("%s: session %s parent %s (old %s)", cmd, e.SessionID, e.ParentSessionID, before.SessionID)
		}
		if !e.IsFreshReset || e.WasAutoReset {
			t.Errorf("%s: after the command is_fresh_reset=%v was_auto_reset=%v, want true/false until the first message", cmd, e.IsFreshReset, e.WasAutoReset)
		}
		_, s = f.send(chat, "next")
		e = f.settled(lane, s)
		if e.IsFreshReset {
			t.Errorf("%s: is_fresh_reset still set after the first message", cmd)
		}
	}
}

// ---------------------------------------------------------------------------
// /resume.

func TestResume(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	rec := newRecorder()
	f.startWorker("w1", mods(noReset, func(c *worker.Config) { c.Backend = rec.backend() }))

	laneA, s := f.send("ra", "one")
	s1 := f.settled(laneA, s).SessionID
	_, s = f.send("ra", "/new")
	e := f.settled(laneA, s)
	s2 := e.SessionID
	if s2 == s1 || e.ParentSessionID != s1 {
		t.Fatalf("/new: session %s parent %s (old %s)", s2, e.ParentSessionID, s1)
	}
	_, s = f.send("ra", "two")
	f.settled(laneA, s)

	// Without an argument: the named sessions (none has a title here).
	_, s = f.send("ra", "/resume")
	e = f.settled(laneA, s)
	n := f.lastNotice(laneA)
	if !strings.Contains(n, "No other named session") || e.SessionID != s2 {
		t.Errorf("/resume list %q (session now %s)", n, e.SessionID)
	}

	// Another lane's session is forked into a new session of this lane;
	// lane B's transcript is never written by lane A.
	laneB, sB := f.send("rb", "hello")
	sb := f.settled(laneB, sB).SessionID
	_, s = f.send("ra", "/resume "+sb)
	e = f.settled(laneA, s)
	s3 := e.SessionID
	if s3 == s2 || s3 == sb || e.ParentSessionID != sb {
		t.Errorf("after /resume of another lane: session %s parent %s, want a new session with parent %s", s3, e.ParentSessionID, sb)
	}
	if n := f.lastNotice(laneA); !strings.Contains(n, "Forked session "+sb) {
		t.Errorf("fork notice %q", n)
	}
	if users := contents(f.effective(s3), transcript.RoleUser); !slices.Equal(users, []string{"hello"}) {
		t.Errorf("forked transcript users %q", users)
	}
	if eb := f.entry(laneB); eb.SessionID != sb {
		t.Errorf("lane B moved to %s", eb.SessionID)
	}
	bTx := f.load(sb)
	if users := contents(transcript.Effective(bTx), transcript.RoleUser); !slices.Equal(users, []string{"hello"}) {
		t.Errorf("lane B transcript users %q", users)
	}
	for _, en := range bTx {
		if en.Kind == transcript.KindClosed || en.Kind == transcript.KindNotice {
			t.Errorf("lane A wrote into lane B's transcript: %+v", en)
		}
	}

	// By id: back to the old session.
	_, s = f.send("ra", "/resume "+s1)
	e = f.settled(laneA, s)
	if e.SessionID != s1 {
		t.Fatalf("after /resume %s the session is %s", s1, e.SessionID)
	}
	if n := f.lastNotice(laneA); !strings.Contains(n, "Resumed session "+s1) {
		t.Errorf("/resume notice %q", n)
	}
	closed := ofKind(f.load(s2), transcript.KindClosed)
	if len(closed) != 1 || closed[0].NextSessionID != s3 {
		t.Errorf("closed entries of %s: %+v, want one pointing to %s", s2, closed, s3)
	}
	closed = ofKind(f.load(s3), transcript.KindClosed)
	if len(closed) != 1 || closed[0].NextSessionID != s1 {
		t.Errorf("closed entries of %s: %+v, want one pointing to %s", s3, closed, s1)
	}
	_, s = f.send("ra", "three")
	e = f.settled(laneA, s)
	if e.SessionID != s1 {
		t.Errorf("next message went to %s, want %s", e.SessionID, s1)
	}
	if users := contents(f.effective(s1), transcript.RoleUser); !slices.Equal(users, []string{"one", "three"}) {
		t.Errorf("resumed transcript users %q", users)
	}
	if users := contents(f.effective(s2), transcript.RoleUser); !slices.Equal(users, []string{"two"}) {
		t.Errorf("left transcript users %q", users)
	}
	turn, ok := rec.turnWith("three")
	if !ok {
		t.Fatal("no turn recorded for three")
	}
	hist := strings.Join(historyContents(turn.History, transcript.RoleUser), "|")
	if !strings.Contains(hist, "one") || strings.Contains(hist, "two") {
		t.Errorf("resumed turn history users %q", hist)
	}
}

// ---------------------------------------------------------------------------
// /undo and /retry.

func TestUndo(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	rec := newRecorder()
	f.startWorker("w1", mods(noReset, func(c *worker.Config) { c.Backend = rec.backend() }))
	lane, s := f.send("undo", "one")
	f.settled(lane, s)
	_, s = f.send("undo", "two")
	f.settled(lane, s)
	_, s = f.send("undo", "/undo")
	e := f.settled(lane, s)
	if n := f.lastNotice(lane); n != "↩️ Undid 1 turn(s)." {
		t.Errorf("/undo notice %q", n)
	}
	eff := f.effective(e.SessionID)
	if u, a := contents(eff, transcript.RoleUser), contents(eff, transcript.RoleAssistant); !slices.Equal(u, []string{"one"}) || !slices.Equal(a, []string{"echo: one"}) {
		t.Errorf("effective after /undo: users %q assistants %q", u, a)
	}
	_, s = f.send("undo", "three")
	f.settled(lane, s)
	turn, ok := rec.turnWith("three")
	if !ok {
		t.Fatal("no turn recorded for three")
	}
	for _, h := range turn.History {
		if h.Content == "two" || h.Content == "echo: two" {
			t.Errorf("history after /undo still has %s %q", h.Role, h.Content)
		}
	}
	if u := historyContents(turn.History, transcript.RoleUser); !slices.Contains(u, "one") {
		t.Errorf("history users %q lost the turn before the undone one", u)
	}
}

func TestRetry(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	rec := newRecorder()
	f.startWorker("w1", mods(noReset, func(c *worker.Config) { c.Backend = rec.backend() }))
	lane, s := f.send("retry", "one")
	f.settled(lane, s)
	_, s = f.send("retry", "/retry")
	e := f.settled(lane, s)

	rs := f.replies(lane)
	if got := texts(rs, session.ReplyKindReply); !slices.Equal(got, []string{"echo: one", "echo: one"}) {
		t.Errorf("replies %q, want the turn answered again", got)
	}
	if !slices.Contains(texts(rs, session.ReplyKindNotice), wantRetryNotice) {
		t.Errorf("notices %q", texts(rs, session.ReplyKindNotice))
	}
	entries := f.load(e.SessionID)
	rewinds := ofKind(entries, transcript.KindRewind)
	if len(rewinds) != 1 || len(rewinds[0].Rewound) == 0 {
		t.Fatalf("rewind entries %+v", rewinds)
	}
	eff := transcript.Effective(entries)
	if u, a := contents(eff, transcript.RoleUser), contents(eff, transcript.RoleAssistant); !slices.Equal(u, []string{"one"}) || !slices.Equal(a, []string{"echo: one"}) {
		t.Errorf("effective after /retry: users %q assistants %q", u, a)
	}
	rec.mu.Lock()
	n := len(rec.turns)
	var retried agent.Turn
	if n > 0 {
		retried = rec.turns[n-1]
	}
	rec.mu.Unlock()
	if n != 2 || len(retried.Messages) != 1 || retried.Messages[0].Text != "one" {
		t.Fatalf("agent turns %d, last messages %+v", n, retried.Messages)
	}
	gone := map[uint64]bool{}
	for _, sq := range rewinds[0].Rewound {
		gone[sq] = true
	}
	for _, h := range retried.History {
		if gone[h.Seq] {
			t.Errorf("retried turn's history has rewound entry %d %s %q", h.Seq, h.Role, h.Content)
		}
		if h.Role == transcript.RoleAssistant {
			t.Errorf("retried turn's history has the old answer %q", h.Content)
		}
	}
}

// Turn.History is the effective transcript of the session ending with the
// turn's own user messages (agent.Turn).
func TestTurnHistoryEndsWithOwnMessages(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	rec := newRecorder()
	f.startWorker("w1", mods(noReset, func(c *worker.Config) { c.Backend = rec.backend() }))
	lane, s := f.send("hist", "one")
	f.settled(lane, s)
	_, s = f.send("hist", "two")
	f.settled(lane, s)
	turn, ok := rec.turnWith("two")
	if !ok {
		t.Fatal("no turn recorded for two")
	}
	var got []string
	for _, h := range turn.History {
		got = append(got, h.Role+":"+h.Content)
	}
	if want := []string{"user:one", "assistant:echo: one", "user:two"}; !slices.Equal(got, want) {
		t.Errorf("history %q, want %q", got, want)
	}
	if last := turn.History[len(turn.History)-1]; last.TurnID != turn.TurnID || last.InboxSeq != turn.Messages[0].InboxSeq {
		t.Errorf("history ends with %+v, not the turn's own message", last)
	}
}

// ---------------------------------------------------------------------------
// /stop.

func TestStopSuspends(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	lane, s0 := f.send("stop", "first\n!sleep 5s")
	first := f.waitTurn(lane, s0)
	old := first.SessionID
	started := time.Now()
	_, ss := f.send("stop", "/stop")
	e := f.settled(lane, ss)
	if d := time.Since(started); d > 4*time.Second {
		t.Errorf("/stop took %v: the running turn was not stopped", d)
	}
	if !e.Suspended {
		t.Errorf("not suspended after /stop")
	}
	if e.InterruptedTurns != 0 || e.ResumePending {
		t.Errorf("/stop counted as an interruption: interrupted_turns=%d resume_pending=%v", e.InterruptedTurns, e.ResumePending)
	}
	if status, _ := transcript.TurnEnded(f.load(old), first.ID); status != worker.StatusStopped {
		t.Errorf("stopped turn end %q, want stopped", status)
	}
	rs := f.replies(lane)
	if got := texts(rs, session.ReplyKindReply); len(got) != 0 {
		t.Errorf("the stopped turn replied %q", got)
	}
	if got := texts(rs, session.ReplyKindNotice); !slices.Equal(got, []string{wantStopped}) {
		t.Errorf("notices %q, want [%q]", got, wantStopped)
	}

	_, sx := f.send("stop", "again")
	e2 := f.settled(lane, sx)
	if e2.SessionID == old || !session.ValidSessionID(e2.SessionID) {
		t.Fatalf("session after /stop and a message: %s (old %s)", e2.SessionID, old)
	}
	if e2.ParentSessionID != old || e2.Suspended {
		t.Errorf("parent %s suspended %v, want parent %s, not suspended", e2.ParentSessionID, e2.Suspended, old)
	}
	rs = f.replies(lane)
	if got := texts(rs, session.ReplyKindNotice); !slices.Equal(got, []string{wantStopped, wantSuspended}) {
		t.Errorf("notices %q, want the suspended auto-reset notice", got)
	}
	if got := texts(rs, session.ReplyKindReply); !slices.Equal(got, []string{"echo: again"}) {
		t.Errorf("replies %q", got)
	}
	closed := ofKind(f.load(old), transcript.KindClosed)
	if len(closed) != 1 || closed[0].NextSessionID != e2.SessionID || closed[0].Reason != session.ReasonSuspended {
		t.Errorf("closed entries %+v", closed)
	}
}

// ---------------------------------------------------------------------------
// /status and /busy.

func TestStatusAndBusyUsage(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	_, stop := f.startStoppable("w0", noReset)
	lane, s := f.send("status", "hello")
	sid := f.settled(lane, s).SessionID

	_, s = f.send("status", "/status")
	f.settled(lane, s)
	n := f.lastNotice(lane)
	for _, want := range []string{"Session " + sid, "Busy mode: interrupt", "Queue depth: 0"} {
		if !strings.Contains(n, want) {
			t.Errorf("/status %q lacks %q", n, want)
		}
	}

	// /status counts the /queue items behind it (all in the inbox before a
	// worker takes the lane).
	stop()
	_, ss := f.send("status", "/status")
	f.send("status", "/queue q1")
	_, sq := f.send("status", "/queue q2")
	f.startWorker("w1", noReset)
	f.settled(lane, sq)
	var status string
	for _, r := range f.replies(lane) {
		if r.Kind == session.ReplyKindNotice && strings.HasPrefix(r.Text, "Session ") {
			status = r.Text
		}
	}
	if !strings.Contains(status, "Queue depth: 2") {
		t.Errorf("/status before two /queue items: %q (status seq %d)", status, ss)
	}

	_, s = f.send("status", "/busy queue")
	if e := f.settled(lane, s); e.BusyMode != worker.BusyQueue {
		t.Fatalf("busy mode %q", e.BusyMode)
	}
	_, s = f.send("status", "/busy bogus")
	e := f.settled(lane, s)
	if n := f.lastNotice(lane); !strings.Contains(n, `"bogus"`) || !strings.Contains(n, "/busy interrupt|queue|steer") {
		t.Errorf("/busy bogus answered %q, want the usage", n)
	}
	if e.BusyMode != worker.BusyQueue {
		t.Errorf("/busy bogus changed the mode to %q", e.BusyMode)
	}
	_, s = f.send("status", "/status")
	f.settled(lane, s)
	if n := f.lastNotice(lane); !strings.Contains(n, "Busy mode: queue") || !strings.Contains(n, "Session "+sid) {
		t.Errorf("/status %q", n)
	}
}

// ---------------------------------------------------------------------------
// Admin commands (fleetctl session stop|reset|busy|suspend|resume-pending).

// An admin command published through the inbox has the same effect as the
// user's command.
func TestAdminCommandParity(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	type outcome struct {
		busy      string
		suspended bool
		stopEnd   string
		notices   []string
		reset     bool
		parentOK  bool
	}
	run := func(chat string, command func(lane, text, cmd, args string) uint64) outcome {
		lane, s := f.send(chat, "hello")
		first := f.settled(lane, s).SessionID
		var o outcome
		s = command(lane, "/busy queue", "busy", "queue")
		o.busy = f.settled(lane, s).BusyMode
		_, s0 := f.send(chat, "long\n!sleep 5s")
		turn := f.waitTurn(lane, s0)
		started := time.Now()
		s = command(lane, "/stop", "stop", "")
		e := f.settled(lane, s)
		if d := time.Since(started); d > 4*time.Second {
			t.Errorf("%s: stop took %v", chat, d)
		}
		o.suspended = e.Suspended
		o.stopEnd, _ = transcript.TurnEnded(f.load(first), turn.ID)
		s = command(lane, "/reset", "reset", "")
		e = f.settled(lane, s)
		o.reset = e.SessionID != first && !e.Suspended
		o.parentOK = e.ParentSessionID == first
		for _, n := range texts(f.replies(lane), session.ReplyKindNotice) {
			o.notices = append(o.notices, strings.ReplaceAll(n, e.SessionID, "<sid>"))
		}
		return o
	}
	user := run("adm-user", func(lane, text, _, _ string) uint64 {
		_, s := f.send("adm-user", text)
		return s
	})
	admin := run("adm-admin", func(lane, _, cmd, args string) uint64 { return f.adminCommand(lane, cmd, args) })
	if fmt.Sprint(user) != fmt.Sprint(admin) {
		t.Errorf("user and admin commands differ:\nuser  %+v\nadmin %+v", user, admin)
	}
	if user.busy != worker.BusyQueue || !user.suspended || user.stopEnd != worker.StatusStopped || !user.reset || !user.parentOK {
		t.Errorf("user commands outcome %+v", user)
	}
}

// Admin suspend sets suspended without telling the user; admin
// resume_pending marks the session for an auto-resume.
func TestAdminSuspendAndResumePending(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	lane, s := f.send("adm", "hello")
	sid := f.settled(lane, s).SessionID

	before := len(f.replies(lane))
	s = f.adminCommand(lane, "suspend", "")
	e := f.settled(lane, s)
	if !e.Suspended || e.SessionID != sid {
		t.Errorf("after admin suspend: suspended %v session %s", e.Suspended, e.SessionID)
	}
	if rs := f.replies(lane); len(rs) != before {
		t.Errorf("admin suspend told the user: %q", texts(rs[before:], ""))
	}
	_, s = f.send("adm", "x")
	e = f.settled(lane, s)
	if e.SessionID == sid || e.ParentSessionID != sid {
		t.Errorf("message after admin suspend: session %s parent %s (old %s)", e.SessionID, e.ParentSessionID, sid)
	}
	if n := f.lastNotice(lane); n != wantSuspended {
		t.Errorf("notice %q", n)
	}
	sid = e.SessionID

	// Marked resume_pending with no turn in flight: the owner runs the
	// automatic resume turn (an event with empty text, the resume note),
	// with no user message, and its completion clears the marker.
	before = len(f.replies(lane))
	s = f.adminCommand(lane, "resume_pending", "")
	rs := f.waitReply(lane, "the automatic resume reply", func(r session.Reply) bool {
		return r.Kind == session.ReplyKindReply && r.Text == "echo: "
	})
	if got := texts(rs[before:], ""); !slices.Equal(got, []string{"echo: "}) {
		t.Errorf("after admin resume_pending the user got %q, want only the automatic resume's reply", got)
	}
	natstest.WaitFor(t, 10*time.Second, "the automatic resume to commit", func() error {
		if e = f.entry(lane); e.Turn != nil || e.ResumePending || e.CommittedSeq <= s {
			return fmt.Errorf("turn %v resume_pending %v committed %d", e.Turn != nil, e.ResumePending, e.CommittedSeq)
		}
		return nil
	})
	if e.SessionID != sid || e.AutoResumedAt == nil {
		t.Errorf("after the automatic resume: session %s (was %s) auto_resumed_at %v", e.SessionID, sid, e.AutoResumedAt)
	}
	_, s = f.send("adm", "y\n!notes")
	e = f.settled(lane, s)
	if e.SessionID != sid {
		t.Errorf("resume_pending did not keep the session: %s -> %s", sid, e.SessionID)
	}
	if last := texts(f.replies(lane), session.ReplyKindReply); last[len(last)-1] != "echo: y" {
		t.Errorf("reply %q after the resume completed, want no note", last[len(last)-1])
	}
}

// ---------------------------------------------------------------------------
// Automatic reset (idle) with an injected clock.

type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestIdleAutoReset(t *testing.T) {
	t.Parallel()
	for _, notify := range []bool{true, false} {
		t.Run(fmt.Sprintf("notify=%v", notify), func(t *testing.T) {
			t.Parallel()
			f := newFleet(t)
			clk := &testClock{now: time.Date(2030, 1, 2, 10, 0, 0, 0, time.UTC)}
			chat := fmt.Sprintf("idle-%v", notify)
			lane := laneFor(chat)
			rec := newRecorder()
			var mu sync.Mutex
			var during []*session.SessionEntry
			rec.onRun = func(*agent.Turn) {
				if e, _, err := f.store.Get(context.Background(), lane); err == nil {
					mu.Lock()
					during = append(during, e)
					mu.Unlock()
				}
			}
			f.startWorker("w1", func(c *worker.Config) {
				c.Now = clk.Now
				c.Location = time.UTC
				c.Reset.Default = session.ResetPolicy{Mode: session.ResetIdle, IdleMinutes: 1, Notify: notify}
				c.Backend = rec.backend()
			})

			_, s := f.send(chat, "one")
			s1 := f.settled(lane, s).SessionID
			clk.Advance(30 * time.Second)
			_, s = f.send(chat, "two")
			if e := f.settled(lane, s); e.SessionID != s1 {
				t.Fatalf("reset before the idle deadline: %s -> %s", s1, e.SessionID)
			}
			clk.Advance(2 * time.Minute)
			_, s = f.send(chat, "three\n!notes")
			e := f.settled(lane, s)
			if e.SessionID == s1 || !session.ValidSessionID(e.SessionID) {
				t.Fatalf("no reset after the idle deadline: session %s", e.SessionID)
			}
			if e.ParentSessionID != s1 {
				t.Errorf("parent %q, want %q", e.ParentSessionID, s1)
			}
			if e.WasAutoReset {
				t.Errorf("was_auto_reset not consumed by the first turn")
			}
			mu.Lock()
			last := during[len(during)-1]
			mu.Unlock()
			if !last.WasAutoReset || last.AutoResetReason != session.ReasonIdle || last.Turn == nil || last.Turn.ResetReason != session.ReasonIdle {
				t.Errorf("during the first turn: was_auto_reset %v reason %q turn %+v", last.WasAutoReset, last.AutoResetReason, last.Turn)
			}
			rs := f.replies(lane)
			replies := texts(rs, session.ReplyKindReply)
			if got, want := replies[len(replies)-1], "echo: three\nnote: "+wantIdleNote; got != want {
				t.Errorf("reply %q, want %q", got, want)
			}
			notices := texts(rs, session.ReplyKindNotice)
			if notify && !slices.Equal(notices, []string{wantIdle}) {
				t.Errorf("notices %q, want [%q]", notices, wantIdle)
			}
			if !notify && len(notices) != 0 {
				t.Errorf("notify off, but notices %q", notices)
			}
			if notify {
				// The notice goes out before the reply of the turn.
				var order []string
				for _, r := range rs {
					order = append(order, r.Kind)
				}
				if !slices.Equal(order, []string{"reply", "reply", "notice", "reply"}) {
					t.Errorf("reply kinds in order %q", order)
				}
			}
			closed := ofKind(f.load(s1), transcript.KindClosed)
			if len(closed) != 1 || closed[0].NextSessionID != e.SessionID || closed[0].Reason != session.ReasonIdle {
				t.Errorf("closed entries %+v", closed)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// Agent failures.

// A failing or panicking agent: the user is told, the turn ends failed, it
// is not counted as interrupted, and the lane and worker keep working.
func TestAgentFailureAndPanic(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	rec := newRecorder()
	rec.panicOn = "boom"
	w := f.startWorker("w1", mods(noReset, func(c *worker.Config) { c.Backend = rec.backend() }))
	lane := laneFor("fail")
	var sid string
	for i, bad := range []string{"!fail", "boom"} {
		_, s := f.send("fail", bad)
		e := f.settled(lane, s)
		if sid == "" {
			sid = e.SessionID
		}
		if status, _ := transcript.TurnEnded(f.load(e.SessionID), e.LastTurnID); status != worker.StatusFailed {
			t.Errorf("%s: turn end %q, want failed", bad, status)
		}
		if e.InterruptedTurns != 0 || e.ResumePending || e.Suspended || e.SessionID != sid {
			t.Errorf("%s: interrupted_turns %d resume_pending %v suspended %v session %s", bad, e.InterruptedTurns, e.ResumePending, e.Suspended, e.SessionID)
		}
		if n := f.lastNotice(lane); n != wantFailure {
			t.Errorf("%s: notice %q", bad, n)
		}
		next := fmt.Sprintf("after %d", i)
		_, s = f.send("fail", next)
		f.settled(lane, s)
		rs := texts(f.replies(lane), session.ReplyKindReply)
		if len(rs) != i+1 || rs[i] != "echo: "+next {
			t.Errorf("after %s: replies %q", bad, rs)
		}
	}
	if n := w.Stats().TurnsFailed.Load(); n != 2 {
		t.Errorf("turns failed %d, want 2", n)
	}
}

// A /retry whose re-run is interrupted again and again (here: each worker
// stops with a drain timeout shorter than the turn) is dead-lettered like a
// message turn: its attempts count, and after the third the /retry goes to
// the dead-letter subject, the user is told, the lane is suspended, and the
// next message starts a new session. (Uncounted, a /retry of a message that
// crashes its worker would crash every worker that picks the lane up.)
func TestRetryInterruptedRepeatedlyDeadLetters(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	lane := laneFor("retrycut")
	_, stop0 := f.startStoppable("w0", noReset)
	_, s := f.send("retrycut", "again\n!sleep 1500ms")
	sid := f.settled(lane, s).SessionID
	stop0()

	quick := func(c *worker.Config) { c.DrainTimeout = 200 * time.Millisecond }
	_, sr := f.send("retrycut", "/retry")
	for attempt := 1; attempt <= worker.MaxInterruptedTurns; attempt++ {
		_, stop := f.startStoppable(fmt.Sprintf("w%d", attempt), mods(noReset, quick))
		natstest.WaitFor(t, 10*time.Second, fmt.Sprintf("attempt %d of the /retry to run its agent", attempt), func() error {
			e := f.entry(lane)
			if e.Turn == nil || e.Turn.FirstSeq != sr || e.Turn.Attempt != attempt {
				return fmt.Errorf("turn %+v", e.Turn)
			}
			if attempt > 1 && e.Turn.AgentStarted != attempt {
				return fmt.Errorf("agent of attempt %d not started: %+v", attempt, e.Turn)
			}
			if attempt == 1 && !slices.Contains(texts(f.replies(lane), session.ReplyKindNotice), wantRetryNotice) {
				return errString("no retry notice yet")
			}
			return nil
		})
		stop()
	}

	w := f.startWorker("last", noReset)
	e := f.settled(lane, sr)
	if !e.Suspended || e.SessionID != sid {
		t.Fatalf("after the third interrupted /retry: suspended %v session %s (was %s)", e.Suspended, e.SessionID, sid)
	}
	if n := f.lastNotice(lane); !strings.Contains(n, "interrupted repeatedly") {
		t.Fatalf("last notice %q, want the dead-letter notice", n)
	}
	if n := w.Stats().DeadLetters.Load(); n != 1 {
		t.Fatalf("dead letters %d, want 1", n)
	}
	dl, err := f.res.Events.GetLastMsgForSubject(t.Context(), f.names.DeadLetterSubject(lane))
	if err != nil {
		t.Fatalf("dead-letter message: %v", err)
	}
	if got := dl.Header.Get(broker.HdrInboxSeq); got != fmt.Sprint(sr) {
		t.Fatalf("dead-lettered inbox seq %q, want the /retry's %d", got, sr)
	}

	_, sn := f.send("retrycut", "next")
	if e := f.settled(lane, sn); e.SessionID == sid || e.Suspended || e.ParentSessionID != sid {
		t.Fatalf("next message: session %s (old %s) parent %q suspended %v", e.SessionID, sid, e.ParentSessionID, e.Suspended)
	}
}

// The entry's queue depth follows the queue: counted while an item runs,
// back to 0 once a /new discarded the rest.
func TestQueueDepthAfterNew(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	// The entry's depth is the snapshot a /queue turn takes when it starts,
	// so b and c must be in the inbox before a starts: a turn holds the lane
	// while the three are sent. a runs long enough for the depth to be seen
	// on a loaded machine (with a 1s run the check could come after a ended
	// and b had started).
	lane, sh := f.send("qdepth", "hold\n!sleep 5s")
	f.waitTurn(lane, sh)
	_, sa := f.send("qdepth", "/queue a\n!sleep 8s")
	f.send("qdepth", "/queue b")
	f.send("qdepth", "/queue c")
	if e := f.entry(lane); e.Turn == nil || e.Turn.FirstSeq != sh {
		t.Fatalf("the holding turn ended before the queue was sent: the test needs a longer hold")
	}
	f.waitTurn(lane, sa)
	natstest.WaitFor(t, 8*time.Second, "queue depth 2 while a runs", func() error {
		if d := f.entry(lane).QueueDepth; d != 2 {
			return fmt.Errorf("queue depth %d", d)
		}
		return nil
	})
	_, sn := f.send("qdepth", "/new")
	e := f.settled(lane, sn)
	if e.QueueDepth != 0 {
		t.Fatalf("queue depth %d after /new discarded b and c, want 0", e.QueueDepth)
	}
	if n := f.lastNotice(lane); !strings.Contains(n, "Discarded 2 queued message(s)") {
		t.Fatalf("/new notice %q", n)
	}
}

// After /stop the current session is suspended; /resume of it (by id, or by
// the title /new gave it) carries on in it instead of answering that it does
// not exist, and the next message stays in it.
func TestResumeSuspendedCurrentSession(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	lane, s := f.send("rcur", "/new Project X")
	sid := f.settled(lane, s).SessionID
	_, s = f.send("rcur", "one")
	f.settled(lane, s)
	for _, arg := range []string{sid, "project x"} {
		_, s = f.send("rcur", "/stop")
		if e := f.settled(lane, s); !e.Suspended {
			t.Fatalf("not suspended after /stop")
		}
		_, s = f.send("rcur", "/resume "+arg)
		e := f.settled(lane, s)
		if e.Suspended || e.SessionID != sid {
			t.Fatalf("/resume %s: suspended %v session %s, want %s", arg, e.Suspended, e.SessionID, sid)
		}
		if n := f.lastNotice(lane); n != "Resumed session "+sid+"." {
			t.Fatalf("/resume %s notice %q", arg, n)
		}
		_, s = f.send("rcur", "after "+arg)
		if e := f.settled(lane, s); e.SessionID != sid {
			t.Fatalf("the message after /resume %s went to session %s, want %s", arg, e.SessionID, sid)
		}
	}
	_, s = f.send("rcur", "/resume "+sid)
	f.settled(lane, s)
	if n := f.lastNotice(lane); n != "You are already in session "+sid+"." {
		t.Fatalf("/resume of the current, live session: notice %q", n)
	}
}

// A follow-up and a /stop sent together during a turn: the follow-up
// interrupts the running turn, and the /stop, which arrived while that turn
// wound down, stops the follow-up's turn as soon as it starts rather than
// after it ran to its end.
func TestStopWaitingWhenTurnStarts(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	lane, s0 := f.send("stopwait", "first\n!sleep 5s")
	f.waitTurn(lane, s0)
	_, sm := f.send("stopwait", "second\n!sleep 5s")
	_, ss := f.send("stopwait", "/stop")
	e := f.settled(lane, ss)
	if !e.Suspended {
		t.Fatalf("not suspended after /stop")
	}
	if got := texts(f.replies(lane), session.ReplyKindReply); len(got) != 0 {
		t.Fatalf("replies %q: the follow-up's turn ran to its end despite the /stop behind it", got)
	}
	turns := userTurns(f.load(e.SessionID))
	if status, _ := transcript.TurnEnded(f.load(e.SessionID), turns["second\n!sleep 5s"]); status != worker.StatusStopped {
		t.Fatalf("the follow-up's turn ended %q, want stopped (seq %d)", status, sm)
	}
}

// /retry and /undo work on turns, not single messages: a burst answered in
// one turn is retried whole, and undone whole.
func TestRetryAndUndoWholeTurn(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	lane, _ := f.send("burst", "a")
	_, sb := f.send("burst", "b") // before any worker: one turn takes both
	f.startWorker("w1", noReset)
	f.settled(lane, sb)
	_, s := f.send("burst", "/retry")
	e := f.settled(lane, s)
	if got, want := texts(f.replies(lane), session.ReplyKindReply), []string{"echo: a\nb", "echo: a\nb"}; !slices.Equal(got, want) {
		t.Fatalf("replies %q, want %q", got, want)
	}
	if u := contents(f.effective(e.SessionID), transcript.RoleUser); !slices.Equal(u, []string{"a\nb"}) {
		t.Fatalf("effective users after /retry %q", u)
	}
	_, s = f.send("burst", "c")
	f.settled(lane, s)
	_, s = f.send("burst", "/undo 2")
	e = f.settled(lane, s)
	if n := f.lastNotice(lane); n != "↩️ Undid 2 turn(s)." {
		t.Fatalf("/undo notice %q", n)
	}
	if eff := f.effective(e.SessionID); len(contents(eff, transcript.RoleUser)) != 0 || len(contents(eff, transcript.RoleAssistant)) != 0 {
		t.Fatalf("after /undo 2: users %q assistants %q", contents(eff, transcript.RoleUser), contents(eff, transcript.RoleAssistant))
	}
}

// A /status between queued items and a /new changes nothing: the items are
// still discarded by the /new.
func TestNewDiscardsQueuedItemsAcrossStatus(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	lane, s0 := f.send("newst", "first\n!sleep 1500ms")
	f.waitTurn(lane, s0)
	f.send("newst", "/queue a")
	f.send("newst", "/status")
	_, sn := f.send("newst", "/new")
	f.settled(lane, sn)
	if got := texts(f.replies(lane), session.ReplyKindReply); !slices.Equal(got, []string{"echo: first"}) {
		t.Fatalf("replies %q: the queued item ran despite the /new after it", got)
	}
	if n := f.lastNotice(lane); !strings.Contains(n, "Discarded 1 queued message(s)") {
		t.Fatalf("/new notice %q", n)
	}
}

// The first turn after /new is told it starts a fresh session (to inject
// topic or channel context again), even with a /status in between; the
// turn after it is not.
func TestFreshResetReachesFirstTurn(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	rec := newRecorder()
	f.startWorker("w1", mods(noReset, func(c *worker.Config) { c.Backend = rec.backend() }))
	lane, s := f.send("fresh", "before")
	f.settled(lane, s)
	f.send("fresh", "/new")
	f.send("fresh", "/status")
	_, s = f.send("fresh", "m1")
	f.settled(lane, s)
	_, s = f.send("fresh", "m2")
	f.settled(lane, s)
	for text, want := range map[string]bool{"before": false, "m1": true, "m2": false} {
		turn, ok := rec.turnWith(text)
		if !ok {
			t.Fatalf("no turn with %q", text)
		}
		if turn.FreshReset != want {
			t.Errorf("turn with %q: FreshReset %v, want %v", text, turn.FreshReset, want)
		}
	}
}

// Titles form a lineage: a second /new with a title already used is
// numbered ("Project #2"), and /resume by the title goes to the newest of
// its lineage.
func TestTitleLineage(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	lane, s := f.send("lineage", "/new Project")
	p1 := f.settled(lane, s).SessionID
	_, s = f.send("lineage", "/new Project")
	p2 := f.settled(lane, s).SessionID
	if n := f.lastNotice(lane); n != fmt.Sprintf("✨ Started a new session %q (%s).", "Project #2", p2) {
		t.Fatalf("second /new Project notice %q", n)
	}
	_, s = f.send("lineage", "/new Other")
	f.settled(lane, s)
	_, s = f.send("lineage", "/resume project")
	if e := f.settled(lane, s); e.SessionID != p2 {
		t.Fatalf("/resume project went to %s, want the newest of the lineage %s (first %s)", e.SessionID, p2, p1)
	}
	_, s = f.send("lineage", "/resume Other")
	f.settled(lane, s)
	_, s = f.send("lineage", "/resume Project #1")
	if e := f.settled(lane, s); e.SessionID != p1 {
		t.Fatalf("/resume Project #1 went to %s, want the first of the lineage %s", e.SessionID, p1)
	}
}

// postCopy publishes a second inbox copy of a platform message: the same
// platform message id, another Nats-Msg-Id (as a retry after the stream's
// de-duplication window, whose msgids record a crashed ingress missed).
func (f *fleet) postCopy(chatID, text, msgID string) uint64 {
	f.t.Helper()
	src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: chatID, ChatType: session.ChatDM, UserID: "u-" + chatID, UserName: "User " + chatID}
	key := session.BuildSessionKey(src, session.DefaultKeyOptions())
	lane := session.LaneToken(key)
	kind, cmd, args := session.Classify(text)
	in := session.Inbound{Source: src, SessionKey: key, Kind: kind, Text: text, Command: cmd, Args: args, ReceivedAt: time.Now(),
		PlatformMsgID: "http:" + chatID + ":" + msgID}
	data, _ := json.Marshal(in)
	msg := nats.NewMsg(f.names.InboxSubject(session.Partition(f.names.Prefix(), lane), lane))
	msg.Data = data
	msg.Header.Set(broker.HdrSessionKey, key)
	msg.Header.Set(broker.HdrKind, kind)
	ack, err := f.js.PublishMsg(f.t.Context(), msg, jetstream.WithMsgID("copy:"+in.PlatformMsgID))
	if err != nil {
		f.t.Fatal(err)
	}
	return ack.Sequence
}

// Second inbox copies of a platform message are never run twice: not as a
// message, not as a command (an /undo applied twice), not as steered input.
func TestDuplicateCopiesNotRunTwice(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	lane, s := f.post("dupw", "one", "m1")
	f.settled(lane, s)
	_, s = f.post("dupw", "two", "m2")
	f.settled(lane, s)
	f.settled(lane, f.postCopy("dupw", "one", "m1"))
	_, s = f.post("dupw", "/undo", "m3")
	f.settled(lane, s)
	e := f.settled(lane, f.postCopy("dupw", "/undo", "m3"))
	if users := contents(f.effective(e.SessionID), transcript.RoleUser); !slices.Equal(users, []string{"one"}) {
		t.Fatalf("effective users %q: want \"two\" undone once and the copy of \"one\" not run", users)
	}
	if got := texts(f.replies(lane), session.ReplyKindReply); !slices.Equal(got, []string{"echo: one", "echo: two"}) {
		t.Fatalf("replies %q", got)
	}

	_, s = f.send("dupw", "/busy steer")
	f.settled(lane, s)
	_, sx := f.post("dupw", "x\n!sleep 1500ms", "m4")
	f.waitTurn(lane, sx)
	f.post("dupw", "y", "m5")
	e = f.settled(lane, f.postCopy("dupw", "y", "m5"))
	users := contents(f.effective(e.SessionID), transcript.RoleUser)
	if n := len(slices.DeleteFunc(slices.Clone(users), func(u string) bool { return u != "y" })); n != 1 {
		t.Fatalf("user entries %q: want y once", users)
	}
}

// With RedactPII the agent's session context prompt carries hashes, not the
// user's or the chat's ids; routing still uses the real ones (the reply
// reaches the lane).
func TestContextPromptRedaction(t *testing.T) {
	t.Parallel()
	for _, redact := range []bool{false, true} {
		f := newFleet(t)
		rec := newRecorder()
		f.startWorker("w1", mods(noReset, func(c *worker.Config) {
			c.Backend = rec.backend()
			c.Context = session.ContextOptions{KeyOptions: session.DefaultKeyOptions(), RedactPII: redact}
		}))
		lane, s := f.send("pii-chat-42", "hello")
		f.settled(lane, s)
		if got := texts(f.replies(lane), session.ReplyKindReply); !slices.Equal(got, []string{"echo: hello"}) {
			t.Fatalf("redact %v: replies %q", redact, got)
		}
		turn, ok := rec.turnWith("hello")
		if !ok {
			t.Fatal("no turn")
		}
		// The user's display name ("User pii-chat-42") is not an id: look
		// for the ids themselves.
		raw := strings.Contains(turn.ContextPrompt, `"pii-chat-42"`) || strings.Contains(turn.ContextPrompt, `"u-pii-chat-42"`)
		if redact && (raw || !strings.Contains(turn.ContextPrompt, "user_")) {
			t.Errorf("redacted prompt shows raw ids or no hashes:\n%s", turn.ContextPrompt)
		}
		if !redact && !raw {
			t.Errorf("prompt without redaction lacks the chat id:\n%s", turn.ContextPrompt)
		}
	}
}

// A message whose transcript entry would be larger than the server takes
// (here: stored in the inbox without HTML escaping, as an older ingress
// did, its '<' grow to six bytes in the transcript) cannot be stored by any
// retry: the turn fails with a notice and the lane goes on, instead of
// retrying it for ever.
func TestMessageTooLargeForTranscriptFails(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: "huge", ChatType: session.ChatDM, UserID: "u-huge"}
	key := session.BuildSessionKey(src, session.DefaultKeyOptions())
	lane := session.LaneToken(key)
	text := strings.Repeat("<", int(f.nc.MaxPayload())/3)
	var buf strings.Builder
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(session.Inbound{Source: src, SessionKey: key, Kind: session.KindMessage, Text: text, ReceivedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg(f.names.InboxSubject(session.Partition(f.names.Prefix(), lane), lane))
	msg.Data = []byte(buf.String())
	msg.Header.Set(broker.HdrSessionKey, key)
	msg.Header.Set(broker.HdrKind, session.KindMessage)
	ack, err := f.js.PublishMsg(t.Context(), msg)
	if err != nil {
		t.Fatal(err)
	}
	e := f.settled(lane, ack.Sequence)
	if n := f.lastNotice(lane); n != wantFailure {
		t.Fatalf("notice %q, want the failure notice", n)
	}
	if e.InterruptedTurns != 0 || e.Suspended {
		t.Fatalf("interrupted_turns %d suspended %v", e.InterruptedTurns, e.Suspended)
	}
	_, s := f.post("huge", "after", "a1")
	f.settled(lane, s)
	if got := texts(f.replies(lane), session.ReplyKindReply); !slices.Equal(got, []string{"echo: after"}) {
		t.Fatalf("replies %q", got)
	}
}
