package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
	"github.com/agentfleet/agentfleet/worker"
)

// noticeDeadLetter is the user notice of a dead-lettered turn (DESIGN §5,
// the seed's escalation copy).
const noticeDeadLetter = "This session was interrupted repeatedly during restart recovery, so I started a fresh session to avoid getting stuck. Use /resume if you want the old transcript."

// TestPoisonDeadLettered runs three workers started with --allow-crash (the
// test restarts each one whenever it dies) and closed-loop traffic on six
// lanes, and sends lane P a message whose turn crashes the worker running
// it. After three interrupted attempts the message is dead-lettered: listed
// by `fleetctl deadletter ls` with its inbox seq, the user told, the lane
// suspended; P's next message starts a new session linked to the old one;
// every other lane kept being answered, in order. Then `fleetctl deadletter
// replay` puts a harmless copy of the dead letter back into P's inbox, which
// must be answered, and the real one, whose answer must name its inbox seq.
func TestPoisonDeadLettered(t *testing.T) {
	t.Parallel()
	const lanes = 6
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	c := newCluster(t)
	c.startIngress()
	args := []string{"--allow-crash"}
	workers := []*workerProc{
		c.startWorkerArgs("poison1", args), c.startWorkerArgs("poison2", args), c.startWorkerArgs("poison3", args),
	}
	var crashes []string
	// keep restarts every worker that died, counting the !crash exits.
	keep := func() {
		for _, w := range workers {
			if w.alive() {
				continue
			}
			st := w.waitExit(time.Second)
			if st == nil || st.ExitCode() != 3 {
				t.Errorf("%s (%s) ended with %v, want exit status 3 from !crash", w.name, w.owner, st)
			}
			crashes = append(crashes, w.owner)
			w.restart()
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := make(chan struct{})
	load := make([]*loadLane, lanes)
	for i := range load {
		load[i] = &loadLane{chat: fmt.Sprintf("steady-%d", i)}
	}
	wait := c.closedLoop(ctx, stop, load, seed, 500*time.Millisecond, 90*time.Second, func(rng *rand.Rand, i, n int) string {
		text := fmt.Sprintf("S%d m%03d", i, n)
		if rng.IntN(2) == 0 {
			text += fmt.Sprintf("\n!sleep %dms", 100+rng.IntN(300))
		}
		return text
	})
	stopped := false
	stopLoad := func() {
		if !stopped {
			stopped = true
			if t.Failed() {
				// Do not wait out the reply timeouts of a failed run.
				cancel()
			}
			close(stop)
			wait()
		}
	}
	defer stopLoad()

	// Some traffic first, then the poison (with a platform message id, as
	// every real platform gives one).
	waitFor(t, 30*time.Second, "the steady lanes to get going", func() error {
		if n := len(c.turnEvents()); n < 2*lanes {
			return fmt.Errorf("%d turn events", n)
		}
		return nil
	})
	const poisonText = "poison\n!crash"
	a := c.post("poison-P", poisonText, "poison-1")
	poisonAt := time.Now()
	key, lane := a.SessionKey, session.LaneToken(a.SessionKey)

	var sid string
	var last *session.SessionEntry
	dlErr := poll(60*time.Second, func() error {
		keep()
		e, err := c.entry(key)
		if err != nil {
			return err
		}
		if sid == "" {
			sid = e.SessionID
		}
		last = e
		if !e.Suspended || e.Turn != nil {
			return fmt.Errorf("suspended %v, turn %+v, interrupted_turns %d, %d crashes", e.Suspended, e.Turn, e.InterruptedTurns, len(crashes))
		}
		return nil
	})
	deadAt := time.Now()
	keep()
	if dlErr != nil {
		// Say why, then still check that the other lanes kept working.
		gctx, gcancel := context.WithTimeout(context.Background(), 5*time.Second)
		raw, gerr := c.res.Inbox.GetMsg(gctx, a.Seq)
		gcancel()
		var hdrs []string
		if gerr == nil {
			for k, v := range raw.Header {
				hdrs = append(hdrs, k+"="+strings.Join(v, ","))
			}
			slices.Sort(hdrs)
		}
		logs := logLines(workers, "lane="+lane, poisonAt, deadAt)
		var failures []string
		for _, l := range logs {
			if strings.Contains(l, "dead-letter") || strings.Contains(l, "resuming") {
				failures = append(failures, l)
			}
		}
		if len(failures) > 6 {
			failures = append(failures[:6], fmt.Sprintf("… %d more", len(failures)-6))
		}
		t.Errorf("the poison was not dead-lettered %v after it was posted (%d crashes): %v\n"+
			"entry: turn %+v interrupted_turns %d suspended %v\ninbox seq %d headers: %v\nworker logs:\n%s",
			deadAt.Sub(poisonAt).Round(time.Millisecond), len(crashes), dlErr, last.Turn, last.InterruptedTurns, last.Suspended,
			a.Seq, hdrs, strings.Join(failures, "\n"))
		stopLoad()
		checkSteady(t, c, load, poisonAt, deadAt, keep)
		return
	}
	t.Logf("MEASURED poison posted → lane suspended: %v, after %d crashes (%v)", deadAt.Sub(poisonAt).Round(time.Millisecond), len(crashes), crashes)
	if len(crashes) != 3 {
		t.Errorf("%d worker crashes, want 3 (three interrupted attempts, then the dead letter)", len(crashes))
	}

	// The turn's attempts: 1, 2 and 3, each by another incarnation, then
	// one end, dead-lettered. The start events of a crashing attempt are
	// best effort (published asynchronously, so the crash may beat them):
	// the attempts are read from the workers' logs, which are synchronous.
	var turnID, endStatus string
	for _, ev := range c.laneTurnEvents(lane) {
		if turnID == "" {
			turnID = ev.TurnID
		}
		if ev.TurnID == turnID && ev.Type == "end" {
			endStatus = ev.Status
		}
	}
	attempts := []string{"1"}
	for _, l := range logLines(workers, "turn_id="+turnID, poisonAt, deadAt) {
		if _, rest, ok := strings.Cut(l, "resuming interrupted turn"); ok {
			if _, n, ok := strings.Cut(rest, " attempt="); ok {
				n, _, _ = strings.Cut(n, " ")
				attempts = append(attempts, n)
			}
		}
	}
	if !slices.Equal(attempts, []string{"1", "2", "3"}) || endStatus != transcript.StatusDeadLettered {
		t.Errorf("poison turn %s: attempts %v, ended %q; want attempts [1 2 3], ended %q", turnID, attempts, endStatus, transcript.StatusDeadLettered)
	}

	// fleetctl lists it, with its inbox seq.
	var dl struct {
		DeadLetters []deadLetterDoc `json:"dead_letters"`
	}
	if err := c.fleetctl(&dl, "deadletter", "ls"); err != nil {
		t.Fatal(err)
	}
	var found *deadLetterDoc
	for i, d := range dl.DeadLetters {
		if d.InboxSeq == a.Seq {
			found = &dl.DeadLetters[i]
		}
	}
	if found == nil || len(dl.DeadLetters) != 1 {
		t.Fatalf("fleetctl deadletter ls: %+v; want one dead letter of inbox seq %d", dl.DeadLetters, a.Seq)
	}
	if found.SessionKey != key || found.Lane != lane || found.SessionID != sid || found.TurnID != turnID ||
		found.Message.Text != poisonText || !strings.Contains(found.Reason, "3") {
		t.Errorf("dead letter %+v, want lane %s, session %s, turn %s, text %q, a reason naming 3 interruptions", *found, lane, sid, turnID, poisonText)
	}
	t.Logf("dead letter: seq %d inbox seq %d reason %q", found.Seq, found.InboxSeq, found.Reason)

	// The user was told, in the old session; the entry is suspended.
	box := c.waitReplies(key, 1, 30*time.Second)
	if len(box) != 1 || box[0].Kind != session.ReplyKindNotice || box[0].Text != noticeDeadLetter || box[0].SessionID != sid {
		t.Errorf("P's mailbox %+v, want the dead-letter notice in session %s", box, sid)
	}
	e := c.mustEntry(key)
	if !e.Suspended || e.SessionID != sid || e.ResumePending || e.CommittedSeq < a.Seq {
		t.Errorf("after the dead letter: suspended %v session %s resume_pending %v committed %d; want true, %s, false, ≥ %d",
			e.Suspended, e.SessionID, e.ResumePending, e.CommittedSeq, sid, a.Seq)
	}
	if users := userEntries(c.load(sid)); len(users) != 1 || users[0].InboxSeq != a.Seq {
		t.Errorf("user entries of the old session %+v, want the poison once", users)
	}

	// P's next message: a new session, linked to the old one.
	b := c.post("poison-P", "after the poison", "poison-2")
	var next reply
	waitFor(t, 60*time.Second, "P's next message to be answered", func() error {
		keep()
		for _, r := range c.allReplies(key) {
			if r.Kind == session.ReplyKindReply {
				next = r
				return nil
			}
		}
		return errors.New("no reply yet")
	})
	e = c.mustEntry(key)
	if next.Text != "echo: after the poison" || next.SessionID == sid || next.SessionID != e.SessionID {
		t.Errorf("P's next reply %+v, want \"echo: after the poison\" in a new session (old %s, entry %s)", next, sid, e.SessionID)
	}
	if e.ParentSessionID != sid || e.Suspended || e.CommittedSeq < b.Seq {
		t.Errorf("P's entry after the next message: parent %q suspended %v committed %d; want parent %s, false, ≥ %d",
			e.ParentSessionID, e.Suspended, e.CommittedSeq, sid, b.Seq)
	}
	for _, r := range c.allReplies(key) {
		t.Logf("P's mailbox: %s %q (session %s)", r.Kind, r.Text, r.SessionID)
	}

	// Every other lane kept working: answered during the poison's three
	// crashes, and in full and in order at the end.
	stopLoad()
	checkSteady(t, c, load, poisonAt, deadAt, keep)

	// Replay. First a harmless copy of the dead letter (same headers and
	// message, the text made harmless): replayed, it must be answered.
	raws := c.readStream(c.res.Events, c.names.DeadLetterSubject(lane))
	if len(raws) != 1 {
		t.Fatalf("%d messages on %s, want 1", len(raws), c.names.DeadLetterSubject(lane))
	}
	var in session.Inbound
	if err := json.Unmarshal(raws[0].Data, &in); err != nil {
		t.Fatal(err)
	}
	in.Text = "harmless replay"
	cp := nats.NewMsg(raws[0].Subject)
	cp.Data, _ = json.Marshal(in)
	for k, v := range raws[0].Header {
		if !strings.HasPrefix(k, "Nats-") { // the fleet's headers, not the server's (Msg-Id, Stream…)
			cp.Header[k] = v
		}
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 10*time.Second)
	ack, err := c.js.PublishMsg(pctx, cp)
	pcancel()
	if err != nil || ack.Duplicate || ack.Stream != c.names.EventStream() {
		t.Fatalf("publishing a harmless copy of the dead letter: %+v %v", ack, err)
	}
	type replayDoc struct {
		Replayed  uint64 `json:"replayed"`
		InboxSeq  uint64 `json:"inbox_seq"`
		Duplicate bool   `json:"duplicate"`
		Lane      string `json:"lane"`
	}
	var rp replayDoc
	if err := c.fleetctl(&rp, "deadletter", "replay", fmt.Sprint(ack.Sequence)); err != nil {
		t.Fatal(err)
	}
	if rp.InboxSeq == 0 || rp.Duplicate || rp.Lane != lane || rp.Replayed != ack.Sequence {
		t.Fatalf("replay of the harmless copy answered %+v", rp)
	}
	var again replayDoc
	if err := c.fleetctl(&again, "deadletter", "replay", fmt.Sprint(ack.Sequence)); err != nil {
		t.Fatal(err)
	}
	if !again.Duplicate || again.InboxSeq != rp.InboxSeq {
		t.Errorf("a second replay of dead letter %d answered %+v, want a duplicate of inbox seq %d", ack.Sequence, again, rp.InboxSeq)
	}
	err = poll(30*time.Second, func() error {
		keep()
		for _, r := range c.allReplies(key) {
			if r.Kind == session.ReplyKindReply && r.Text == "echo: harmless replay" {
				return nil
			}
		}
		return c.committed(key, rp.InboxSeq) // a commit without the reply ends the wait
	})
	answered := false
	for _, r := range c.allReplies(key) {
		answered = answered || (r.Kind == session.ReplyKindReply && r.Text == "echo: harmless replay")
	}
	if !answered {
		how := fmt.Sprintf("not committed: %v", err)
		for _, ev := range c.laneTurnEvents(lane) {
			if ev.Type == "end" && ev.FirstSeq <= rp.InboxSeq && rp.InboxSeq <= ev.LastSeq {
				how = fmt.Sprintf("its turn %s ended %q", ev.TurnID, ev.Status)
			}
		}
		t.Errorf("the replayed dead letter (inbox seq %d, platform message id %q) was never run: %s; "+
			"its platform message id still maps to the dead-lettered seq %d in the msgids bucket, so the worker "+
			"takes the replay for a platform retry", rp.InboxSeq, in.PlatformMsgID, how, a.Seq)
	}

	// Then the real one: fleetctl answers with the inbox seq holding it.
	// (Run, it crashes again by design; the test does not wait for that.)
	var real replayDoc
	if err := c.fleetctl(&real, "deadletter", "replay", fmt.Sprint(found.Seq)); err != nil {
		t.Fatal(err)
	}
	if real.InboxSeq <= rp.InboxSeq || real.Duplicate || real.Lane != lane {
		t.Errorf("replay of dead letter %d answered %+v", found.Seq, real)
	} else {
		gctx, gcancel := context.WithTimeout(context.Background(), 5*time.Second)
		m, err := c.res.Inbox.GetMsg(gctx, real.InboxSeq)
		gcancel()
		var got, want session.Inbound
		switch {
		case err != nil:
			t.Errorf("inbox seq %d after the replay: %v", real.InboxSeq, err)
		case json.Unmarshal(m.Data, &got) != nil || json.Unmarshal(raws[0].Data, &want) != nil ||
			got.Text != want.Text || got.Kind != want.Kind || got.SessionKey != key || got.Source != want.Source ||
			m.Header.Get(broker.HdrSessionKey) != key:
			t.Errorf("inbox seq %d after the replay holds %s (headers %v), want the dead-lettered message %s", real.InboxSeq, m.Data, m.Header, raws[0].Data)
		}
	}
	t.Logf("replayed the harmless copy at inbox seq %d and the poison at %d", rp.InboxSeq, real.InboxSeq)
}

// checkSteady checks the steady lanes of TestPoisonDeadLettered once their
// load has stopped: each answered at least one message while the poison
// crashed workers (from poisonAt to deadAt), and every message was answered
// once, in order, in one session.
func checkSteady(t *testing.T, c *cluster, load []*loadLane, poisonAt, deadAt time.Time, keep func()) {
	t.Helper()
	waitFor(t, 90*time.Second, "the steady lanes to settle", func() error {
		keep()
		for _, l := range load {
			if len(l.msgs) == 0 {
				return fatalf("%s sent nothing", l.chat)
			}
			if err := c.committed(l.key, l.msgs[len(l.msgs)-1].seq); err != nil {
				return err
			}
		}
		// (Not inboxSettled: a wedged lane P keeps its delivery unacked.)
		return c.delivered()
	})
	byLane := map[string][]worker.TurnEvent{}
	for _, ev := range c.turnEvents() {
		byLane[ev.Lane] = append(byLane[ev.Lane], ev)
	}
	statuses := map[string]int{}
	for _, l := range load {
		if l.err != nil {
			t.Errorf("load: %v", l.err)
		}
		during := 0
		for _, m := range l.msgs {
			if m.accepted.After(poisonAt) && !m.replied.IsZero() && m.replied.Before(deadAt) {
				during++
			}
		}
		// A lane whose turn ran in the poison's process when it crashed is
		// interrupted with it and resumed (its last attempt alone, so it is
		// never dead-lettered); if that happened twice it may have had no
		// answer inside the window. Every other lane must have.
		resumed := 0
		for _, ev := range byLane[session.LaneToken(l.key)] {
			if ev.Type == "start" && ev.Attempt >= 2 && !ev.At.Before(poisonAt) && !ev.At.After(deadAt.Add(time.Second)) {
				resumed++
			}
		}
		t.Logf("%s: %d messages, %d answered while the poison crashed workers, %d attempts resumed in that time", l.chat, len(l.msgs), during, resumed)
		if during == 0 && resumed == 0 {
			t.Errorf("%s: no message answered in the %v the poison took, and none of its turns was interrupted", l.chat, deadAt.Sub(poisonAt).Round(time.Millisecond))
		}
		checkChaosLane(t, c, l.asChaosLane(), byLane[session.LaneToken(l.key)], false, statuses)
		if e := c.mustEntry(l.key); e.Suspended || e.InterruptedTurns != 0 || e.ResumePending {
			t.Errorf("%s: suspended %v interrupted_turns %d resume_pending %v", l.chat, e.Suspended, e.InterruptedTurns, e.ResumePending)
		}
	}
	checkNoOverlap(t, byLane)
	t.Logf("steady lanes' turn endings: %v", statuses)
}

// TestPoisonSparesNeighbours pins the bystander case on one worker: lane B's
// long turn runs in the same process as lane P's poison each time P crashes
// it. B's turn is interrupted with P's, twice, and then stands on its last
// attempt; a last attempt runs alone in its worker, so P's third crash can
// no longer take B with it. P is dead-lettered after three crashes; B is
// answered, in its session, and never suspended.
func TestPoisonSparesNeighbours(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.startIngress()
	w := c.startWorkerArgs("spare", []string{"--allow-crash"})
	var crashes int
	keep := func() {
		if w.alive() {
			return
		}
		st := w.waitExit(time.Second)
		if st == nil || st.ExitCode() != 3 {
			t.Errorf("%s ended with %v, want exit status 3 from !crash", w.owner, st)
		}
		crashes++
		w.restart()
	}

	b := c.post("bystander-B", "long work\n!sleep 4s", "b-1")
	keyB := b.SessionKey
	waitFor(t, 30*time.Second, "B's turn to start", func() error {
		if e, err := c.entry(keyB); err != nil || e.Turn == nil {
			return fmt.Errorf("no turn in flight on B (%v)", err)
		}
		return nil
	})
	p := c.post("poison-P", "poison\n!sleep 500ms\n!crash", "p-1")
	keyP := p.SessionKey

	err := poll(90*time.Second, func() error {
		keep()
		e, err := c.entry(keyP)
		if err != nil {
			return err
		}
		if !e.Suspended || e.Turn != nil {
			return fmt.Errorf("P: suspended %v, turn %v, interrupted_turns %d; %d crashes", e.Suspended, e.Turn != nil, e.InterruptedTurns, crashes)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("P was not dead-lettered: %v", err)
	}
	var box []reply
	err = poll(60*time.Second, func() error {
		keep()
		box = c.allReplies(keyB)
		if len(box) == 0 {
			return errors.New("B has no reply yet")
		}
		return nil
	})
	eB := c.mustEntry(keyB)
	if err != nil || len(box) != 1 || box[0].Kind != session.ReplyKindReply || box[0].Text != "echo: long work" || box[0].SessionID != eB.SessionID {
		t.Fatalf("B's mailbox %+v (%v), want one reply \"echo: long work\" in session %s", box, err, eB.SessionID)
	}
	if eB.Suspended || eB.InterruptedTurns != 0 || eB.ResumePending || eB.CommittedSeq < b.Seq {
		t.Errorf("B after its answer: suspended %v interrupted_turns %d resume_pending %v committed %d; want false, 0, false, ≥ %d",
			eB.Suspended, eB.InterruptedTurns, eB.ResumePending, eB.CommittedSeq, b.Seq)
	}
	if crashes != 3 {
		t.Errorf("%d crashes, want 3", crashes)
	}
	var dl struct {
		DeadLetters []deadLetterDoc `json:"dead_letters"`
	}
	if err := c.fleetctl(&dl, "deadletter", "ls"); err != nil {
		t.Fatal(err)
	}
	if len(dl.DeadLetters) != 1 || dl.DeadLetters[0].InboxSeq != p.Seq {
		t.Errorf("dead letters %+v, want P's message (inbox seq %d) alone", dl.DeadLetters, p.Seq)
	}
	// B's turn was interrupted with P's (the log says how often), and its
	// last attempt ran alone.
	alone := logLines([]*workerProc{w}, `running it alone"`, time.Time{}, time.Now())
	resumedB := 0
	for _, l := range logLines([]*workerProc{w}, "lane="+session.LaneToken(keyB), time.Time{}, time.Now()) {
		if strings.Contains(l, "resuming interrupted turn") {
			resumedB++
		}
	}
	t.Logf("B's turn resumed %d times; last attempts run alone: %d", resumedB, len(alone))
	if resumedB < 1 || len(alone) == 0 {
		t.Errorf("B resumed %d times and %d last attempts ran alone; the test did not put B beside the poison", resumedB, len(alone))
	}
}
