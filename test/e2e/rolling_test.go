package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/worker"
)

// TestRollingRestart runs three workers (started with --restart, drain
// timeout 2s) under continuous closed-loop load on 20 lanes, and restarts
// them one at a time: SIGTERM, exit 0, the clean stop listed by `fleetctl
// worker ls`, start again, wait for the restarted worker to take work and
// for the handed-over turns to finish, next. Some messages sleep longer than
// the drain timeout, and before each stop a probe lane owned by the victim
// gets such a message, so turns are cut by the drain and resumed elsewhere
// (reason restart_timeout): each must resume right after the drain timeout
// (DESIGN §5: release, then NAK, "so another worker resumes at once"). At
// the end the chaos checks hold (nothing lost, nothing twice, in order, one
// session per lane, no overlapping owners), no lane is dead-lettered or
// suspended, nobody got a notice, and the latency of the handed-over turns
// is reported against the others'.
func TestRollingRestart(t *testing.T) {
	const (
		lanes     = 20
		drain     = 2 * time.Second
		longSleep = 5 * time.Second // longer than the drain: cut and resumed
		// A lease TTL far above the drain timeout separates the two ways a
		// cut turn can come back: at once (released and NAKed at the drain
		// timeout) or only after the lease and the ack wait ran out (TTL
		// and more). The bound on the handover sits between the two with
		// room for a loaded machine, so it tests the mechanism, not speed.
		rollTTL       = 12 * time.Second
		handoverSlack = 5 * time.Second
	)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	c := newClusterTTL(t, rollTTL, 2*time.Second)
	c.startIngress()
	args := []string{"--restart"}
	drainEnv := []string{"AGENTFLEET_AGENT_RESTART_DRAIN_TIMEOUT=" + drain.String(), "AGENTFLEET_TELEMETRY_LOG_LEVEL=debug"}
	workers := []*workerProc{
		c.startWorkerArgs("roll1", args, drainEnv...),
		c.startWorkerArgs("roll2", args, drainEnv...),
		c.startWorkerArgs("roll3", args, drainEnv...),
	}
	reportSpuriousTakeovers(t, workers)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := make(chan struct{})
	load := make([]*loadLane, lanes)
	for i := range load {
		load[i] = &loadLane{chat: fmt.Sprintf("roll-%02d", i)}
	}
	wait := c.closedLoop(ctx, stop, load, seed, 1500*time.Millisecond, 60*time.Second, func(rng *rand.Rand, i, n int) string {
		text := fmt.Sprintf("R%02d m%03d", i, n)
		switch r := rng.IntN(100); {
		case r < 6:
			text += fmt.Sprintf("\n!sleep %v", longSleep)
		case r < 60:
			text += fmt.Sprintf("\n!sleep %dms", 100+rng.IntN(500))
		case r < 70:
			text += "\n!tools 2"
		}
		return text
	})
	// A few lanes also get bursts (open loop, as the chaos driver posts):
	// their messages queue up, so handovers happen with messages waiting,
	// and "in order" is tested where it can go wrong.
	bursts := make([]*loadLane, 3)
	for i := range bursts {
		bursts[i] = &loadLane{chat: fmt.Sprintf("roll-burst-%d", i)}
	}
	waitBursts := c.openLoop(ctx, stop, bursts, seed, 400*time.Millisecond, func(rng *rand.Rand, i, n int) string {
		text := fmt.Sprintf("B%d m%03d", i, n)
		if rng.IntN(100) < 40 {
			text += fmt.Sprintf("\n!sleep %dms", 100+rng.IntN(600))
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
			waitBursts()
		}
	}
	defer stopLoad()

	// Every worker has run a turn before the first restart.
	ranTurn := func(owner string) error {
		for _, ev := range c.turnEvents() {
			if ev.Owner == owner && ev.Type == "start" {
				return nil
			}
		}
		return fmt.Errorf("%s has run no turn", owner)
	}
	acks := c.traceAcks()
	begin := time.Now()
	ends := func() int {
		n := 0
		for _, ev := range c.turnEvents() {
			if ev.Type == "end" {
				n++
			}
		}
		return n
	}
	waitFor(t, 30*time.Second, "every worker to run a turn, and 60 turns to end", func() error {
		for _, w := range workers {
			if err := ranTurn(w.owner); err != nil {
				return err
			}
		}
		if n := ends(); n < 60 {
			return fmt.Errorf("%d turns ended", n)
		}
		return nil
	})

	var probes []*loadLane
	probe := func(w *workerProc) *loadLane {
		t.Helper()
		for k := 0; k < 12; k++ {
			l := &loadLane{chat: fmt.Sprintf("probe-%s-%d", w.id, k)}
			warm := c.post(l.chat, "warm "+l.chat, "")
			l.key = warm.SessionKey
			l.msgs = append(l.msgs, loadMsg{seq: warm.Seq, text: "warm " + l.chat, accepted: time.Now()})
			c.waitReplies(l.key, 1, 30*time.Second)
			if e := c.mustEntry(l.key); e.Owner != w.owner {
				probes = append(probes, l) // checked at the end like the others
				continue
			}
			text := "probe " + l.chat + fmt.Sprintf("\n!sleep %v", longSleep)
			a := c.post(l.chat, text, "")
			l.msgs = append(l.msgs, loadMsg{seq: a.Seq, text: text, accepted: time.Now()})
			var owner string
			waitFor(t, 10*time.Second, "the probe to run", func() error {
				e, err := c.entry(l.key)
				if err != nil {
					return err
				}
				if e.Turn == nil || e.Turn.FirstSeq != a.Seq {
					return fmt.Errorf("owner %q turn %+v", e.Owner, e.Turn)
				}
				owner = e.Owner
				return nil
			})
			if owner == w.owner {
				return l
			}
			// The lane was released (linger) before the probe came.
			probes = append(probes, l)
		}
		t.Fatalf("no probe lane landed on %s in 12 tries", w.owner)
		return nil
	}

	type stopRec struct {
		id, owner string
		at        time.Time
		exited    time.Duration
		inFlight  int
	}
	var stops []stopRec
	stoppedListed := 0
	for _, w := range workers {
		// A probe: a long turn on a lane the victim owns, started the way
		// a follow-up usually starts (the owner lingers on the lane after a
		// first message and runs the next one, whichever worker received
		// its delivery), so every stop cuts at least one turn.
		probes = append(probes, probe(w))
		rec := stopRec{id: w.id, owner: w.owner, inFlight: c.turnsInFlight(w.owner), at: time.Now()}
		rec.exited = stopWorker(t, w, drain+rollTTL+20*time.Second)
		stops = append(stops, rec)
		t.Logf("MEASURED %s (%s) with %d turns in flight exited 0 %v after SIGTERM",
			rec.id, rec.owner, rec.inFlight, rec.exited.Round(time.Millisecond))
		// The registry lists the clean stop until the worker runs again:
		// read directly from the workers bucket, and through fleetctl.
		if r, err := c.workerRecord(w.id); err != nil || r.Owner != rec.owner || r.State != worker.StateStopped || r.StoppedAt.IsZero() {
			t.Errorf("the workers bucket's record of %s after its clean stop: %+v (%v), want state %q of %s", w.id, r, err, worker.StateStopped, rec.owner)
		}
		recs, err := c.fleetctlWorkers()
		switch {
		case err != nil:
			t.Errorf("after %s stopped: %v", w.id, err)
		case slices.ContainsFunc(recs, func(r worker.WorkerRecord) bool {
			return r.ID == w.id && r.Owner == rec.owner && r.State == worker.StateStopped && !r.StoppedAt.IsZero()
		}):
			stoppedListed++
		default:
			t.Logf("fleetctl worker ls after %s stopped: %+v", w.id, recs)
		}

		w.restart()
		// The restarted worker takes work, and every turn cut by the drain
		// has been resumed and committed before the next stop (a deploy
		// tool waits for readiness; cutting a resumed turn again and again
		// is the poison path, tested elsewhere).
		waitFor(t, 60*time.Second, "the restarted worker to run a turn and the handed-over turns to finish", func() error {
			if err := ranTurn(w.owner); err != nil {
				return err
			}
			entries, err := c.allEntries()
			if err != nil {
				return err
			}
			for lane, e := range entries {
				if e.ResumePending || (e.Turn != nil && e.Turn.Attempt > 1) {
					return fmt.Errorf("%s: resume_pending %v (%s), turn %+v", lane, e.ResumePending, e.ResumeReason, e.Turn)
				}
			}
			return nil
		})
	}
	// Some more load on the restarted fleet.
	more := ends() + 60
	waitFor(t, 60*time.Second, "60 more turns to end after the last restart", func() error {
		if n := ends(); n < more {
			return fmt.Errorf("%d turns ended, waiting for %d", n, more)
		}
		return nil
	})
	if stoppedListed != len(workers) {
		t.Errorf("fleetctl worker ls listed the clean stop (state %q) of %d of %d stopped workers", worker.StateStopped, stoppedListed, len(workers))
	}

	stopLoad()
	settleStart := time.Now()
	c.waitSettled(slices.Concat(load, probes, bursts), 90*time.Second)
	t.Logf("settled %v after the load stopped", time.Since(settleStart).Round(time.Millisecond))

	events := c.turnEvents()
	byLane := map[string][]worker.TurnEvent{}
	for _, ev := range events {
		byLane[ev.Lane] = append(byLane[ev.Lane], ev)
	}
	dead := c.eventsOf("deadletter")
	if len(dead) > 0 {
		t.Errorf("%d dead letters during a rolling restart, e.g. %s", len(dead), dead[0].Data)
	}
	statuses := map[string]int{}
	total := 0
	for _, l := range slices.Concat(load, probes, bursts) {
		if l.err != nil {
			t.Errorf("load: %v", l.err)
		}
		if len(l.msgs) == 0 {
			t.Errorf("%s: no message was sent", l.chat)
			continue
		}
		total += len(l.msgs)
		checkChaosLane(t, c, l.asChaosLane(), byLane[session.LaneToken(l.key)], false, statuses)
		if e := c.mustEntry(l.key); e.Suspended || e.InterruptedTurns != 0 || e.ResumePending {
			t.Errorf("%s: suspended %v interrupted_turns %d resume_pending %v after the rolling restart", l.chat, e.Suspended, e.InterruptedTurns, e.ResumePending)
		}
		// With other workers alive a rolling restart interrupts nobody
		// visibly: no banner, no notice.
		for _, r := range c.allReplies(l.key) {
			if r.Kind != session.ReplyKindReply {
				t.Errorf("%s: the user got a notice during a rolling restart: %q", l.chat, r.Text)
			}
		}
	}
	st := checkNoOverlap(t, byLane)
	t.Logf("load ran %v", time.Since(begin).Round(time.Millisecond))
	t.Logf("%d messages on %d lanes, %d turn starts (%d resumed attempts), turn endings %v", total, lanes, st.starts, st.resumed, statuses)

	// Latency: each message is one turn (closed loop). A turn is resumed
	// when it has an attempt ≥ 2 (a start by another owner mid-turn); it
	// moved when it is a lane's first turn on another owner than the lane's
	// previous turn, within 10s after that owner was stopped.
	starts := map[string][]worker.TurnEvent{} // by turn id, in stream order
	for _, ev := range events {
		if ev.Type == "start" {
			starts[ev.TurnID] = append(starts[ev.TurnID], ev)
		}
	}
	stopOf := map[string]time.Time{}
	for _, s := range stops {
		stopOf[s.owner] = s.at
	}
	var resumed, moved, others durations
	var handovers durations // SIGTERM of the old owner → the next attempt's start
	for _, l := range load {
		prevOwner := ""
		for _, m := range l.msgs {
			if m.replied.IsZero() {
				continue
			}
			lat := m.replied.Sub(m.accepted)
			evs := starts[m.turnID]
			if len(evs) == 0 {
				t.Errorf("%s: no start event of turn %s (seq %d)", l.chat, m.turnID, m.seq)
				continue
			}
			first, last := evs[0], evs[len(evs)-1]
			stoppedAt, wasStopped := stopOf[prevOwner]
			switch {
			case len(evs) > 1 || last.Attempt > 1:
				resumed = append(resumed, lat)
			case prevOwner != "" && first.Owner != prevOwner && wasStopped &&
				first.At.After(stoppedAt) && first.At.Sub(stoppedAt) < 10*time.Second:
				moved = append(moved, lat)
			default:
				others = append(others, lat)
			}
			prevOwner = last.Owner
		}
	}
	// Handovers: every turn with an attempt started by another owner after
	// the previous attempt's owner was stopped.
	for _, id := range sortedKeys(starts) {
		evs := starts[id]
		for k := 1; k < len(evs); k++ {
			at, ok := stopOf[evs[k-1].Owner]
			if !ok || evs[k].Owner == evs[k-1].Owner {
				continue
			}
			h := evs[k].At.Sub(at)
			handovers = append(handovers, h)
			t.Logf("handover: turn %s (lane %s, seq %d): attempt %d by %s started %v after the SIGTERM of %s",
				id, evs[k].Lane, evs[k].FirstSeq, evs[k].Attempt, evs[k].Owner, h.Round(time.Millisecond), evs[k-1].Owner)
			if h > drain+handoverSlack {
				t.Logf("acks of seq %d (times from the SIGTERM): %v", evs[k].FirstSeq, acks.of(evs[k].FirstSeq, at))
				for _, line := range logLines(workers, "lane="+evs[k].Lane, at.Add(-time.Second), evs[k].At.Add(100*time.Millisecond)) {
					t.Log(line)
				}
			}
		}
	}
	t.Logf("MEASURED accept-to-reply, other turns:   %v", others)
	t.Logf("MEASURED accept-to-reply, resumed turns: %v (added vs the others' median: %v)", resumed, (resumed.median() - others.median()).Round(time.Millisecond))
	t.Logf("MEASURED accept-to-reply, moved turns:   %v (added vs the others' median: %v)", moved, (moved.median() - others.median()).Round(time.Millisecond))
	t.Logf("MEASURED SIGTERM of the old owner → resumed attempt start: %v (drain timeout %v)", handovers, drain)
	// A turn cut by the drain is handed over at once (DESIGN §5: release
	// the leases, then NAK their deliveries so another worker resumes at
	// once): its next attempt starts right after the drain timeout, not
	// after some delayed redelivery.
	if len(handovers) < len(workers) {
		t.Errorf("%d handed-over turns, want at least one per stop (the probes)", len(handovers))
	}
	for _, h := range handovers {
		if h > drain+handoverSlack {
			t.Errorf("a turn cut by the drain resumed %v after the SIGTERM, want at most the drain timeout + %v = %v (a redelivery after the lease TTL %v would take longer)", h, handoverSlack, drain+handoverSlack, rollTTL)
		}
	}
	if len(others) == 0 {
		t.Errorf("no turn completed under the load")
	}
}

// TestDeployLoopSuspendsNothing restarts every worker six times (five
// SIGTERMs, one SIGKILL of owners lingering on idle lanes), with traffic
// committed before some of the restarts and none before others: a deploy
// loop with no turn in flight counts nothing (DESIGN §5: count interrupted
// turns, never restarts). No lane is suspended or marked resume_pending,
// interrupted_turns stays 0, session ids never change, and a new message on
// every lane is answered in the same session with no resume note.
func TestDeployLoopSuspendsNothing(t *testing.T) {
	t.Parallel()
	const lanes = 4
	c := newCluster(t)
	c.startIngress()
	// A long linger keeps the lanes owned between messages, so the
	// restarts hit owners holding idle lanes.
	env := []string{"AGENTFLEET_WORKER_LINGER=30s"}
	args := []string{"--restart"}
	workers := []*workerProc{c.startWorkerArgs("deploy1", args, env...), c.startWorkerArgs("deploy2", args, env...)}
	// Every revision of every entry, not only the state after each round:
	// a takeover that counted an interruption would be cleared by the
	// next commit, and a check between rounds would never see it.
	watch := watchEntries(t, c)
	defer func() {
		n := 0
		for _, r := range watch.snapshot() {
			n++
			if r.suspended || r.resumePending || r.interrupted != 0 {
				t.Errorf("entry %s revision %d (owner %q epoch %d): suspended %v resume_pending %v interrupted_turns %d",
					r.key, r.rev, r.owner, r.epoch, r.suspended, r.resumePending, r.interrupted)
			}
		}
		if n == 0 {
			t.Errorf("the entry watcher saw no revision")
		}
	}()

	keys := make([]string, lanes)
	sids := make([]string, lanes)
	replies := make([]int, lanes)
	traffic := func(round int, extra string) []reply {
		t.Helper()
		accepted := make([]acceptResp, lanes)
		for i := range lanes {
			accepted[i] = c.post(fmt.Sprintf("deploy-%d", i), fmt.Sprintf("round %d lane %d%s", round, i, extra), "")
			keys[i] = accepted[i].SessionKey
		}
		var last []reply
		for i := range lanes {
			got := c.waitReplies(keys[i], replies[i]+1, 60*time.Second)
			replies[i]++
			last = append(last, got[len(got)-1])
		}
		waitFor(t, 30*time.Second, "every lane to commit with no turn in flight", func() error {
			for i := range lanes {
				if err := c.committed(keys[i], accepted[i].Seq); err != nil {
					return err
				}
			}
			return c.delivered()
		})
		return last
	}
	check := func(when string) {
		t.Helper()
		for i := range lanes {
			e := c.mustEntry(keys[i])
			if sids[i] == "" {
				sids[i] = e.SessionID
			}
			if e.SessionID != sids[i] || e.Suspended || e.ResumePending || e.InterruptedTurns != 0 || e.Turn != nil {
				t.Errorf("%s: lane %d: session %s (was %s) suspended %v resume_pending %v (%q) interrupted_turns %d turn %v",
					when, i, e.SessionID, sids[i], e.Suspended, e.ResumePending, e.ResumeReason, e.InterruptedTurns, e.Turn)
			}
		}
	}
	// owned counts the lanes a running worker owns with no turn in flight.
	owned := func() int {
		n := 0
		for i := range lanes {
			e := c.mustEntry(keys[i])
			for _, w := range workers {
				if e.Owner == w.owner && e.Turn == nil {
					n++
				}
			}
		}
		return n
	}

	traffic(0, "")
	check("after the first traffic")
	rounds := []struct {
		traffic bool
		kill    bool
	}{{true, false}, {false, false}, {true, true}, {false, false}, {true, false}, {false, false}}
	for r, round := range rounds {
		if round.traffic {
			traffic(r+1, "")
		}
		held := owned()
		start := time.Now()
		for _, w := range workers {
			if round.kill {
				w.signal(syscall.SIGKILL)
			} else {
				w.signal(syscall.SIGTERM)
			}
		}
		for _, w := range workers {
			st := w.waitExit(30 * time.Second)
			switch {
			case st == nil:
				t.Fatalf("round %d: %s still runs", r+1, w.name)
			case round.kill:
				if ws, ok := st.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
					t.Fatalf("round %d: %s ended with %v, want SIGKILL", r+1, w.name, st)
				}
			case !st.Success():
				t.Fatalf("round %d: %s exited with %v after SIGTERM, want 0", r+1, w.name, st)
			}
		}
		how := "SIGTERM"
		if round.kill {
			how = "SIGKILL"
		}
		t.Logf("round %d: %s of every worker with %d idle lanes owned; all exited within %v", r+1, how, held, time.Since(start).Round(time.Millisecond))
		if round.traffic && held == 0 {
			t.Logf("round %d: no lane was owned at the restart (the 30s linger did not hold?)", r+1)
		}
		for _, w := range workers {
			w.restart()
		}
		check(fmt.Sprintf("after round %d (%s)", r+1, how))
	}

	// A new message on every lane: answered in the same session, with no
	// resume note and no notice.
	last := traffic(len(rounds)+1, "\n!notes")
	check("after the last traffic")
	for i := range lanes {
		r := last[i]
		if r.SessionID != sids[i] || r.Kind != session.ReplyKindReply || strings.Contains(r.Text, "note: ") {
			t.Errorf("lane %d: last reply %+v, want a plain reply in session %s with no system note", i, r, sids[i])
		}
		for _, b := range c.allReplies(keys[i]) {
			if b.Kind != session.ReplyKindReply || b.SessionID != sids[i] {
				t.Errorf("lane %d: mailbox holds %+v", i, b)
			}
		}
	}
	if errs := c.eventsOf("resume"); len(errs) > 0 {
		t.Errorf("%d resume events in a deploy loop with no turn in flight, e.g. %s", len(errs), errs[0].Data)
	}
}
