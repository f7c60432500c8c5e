package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
	"github.com/agentfleet/agentfleet/worker"
)

// sentMsg is a message the ingress accepted (202).
type sentMsg struct {
	seq  uint64
	text string
}

// chaosLane is what the test sent to one lane.
type chaosLane struct {
	chat string
	key  string
	sent []sentMsg
}

// killRec is one SIGKILL of a worker process.
type killRec struct {
	at    time.Time
	id    string
	owner string
	// inFlight is how many lanes had a turn of this owner recorded in their
	// entry just before the kill.
	inFlight int
}

// TestChaos runs one NATS process, three worker processes and one ingress
// process; 50 lanes get 20 messages each (concurrently across lanes, one at
// a time within a lane, with random gaps, some sleeping so that turns
// overlap and get interrupted), while a random worker is SIGKILLed and
// restarted at least five times. Then every accepted message must be in its
// lane's transcript exactly once and in order, in one session per lane;
// every completed turn's reply must be in the mailbox exactly once; and no
// two owners may have run turns of one lane at overlapping times.
func TestChaos(t *testing.T) {
	const (
		lanes    = 50
		perLane  = 20
		minKills = 5
	)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	c := newCluster(t)
	c.startIngress()
	workers := []*workerProc{c.startWorker("w1"), c.startWorker("w2"), c.startWorker("w3")}
	reportSpuriousTakeovers(t, workers)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	sent := make([]*chaosLane, lanes)
	postErrs := make(chan error, lanes)
	begin := time.Now()
	for i := range lanes {
		l := &chaosLane{chat: fmt.Sprintf("chaos-%02d", i)}
		sent[i] = l
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			for m := range perLane {
				// Mostly a pause, sometimes a burst: bursts make turns of
				// several messages, and messages that arrive mid-turn.
				d := time.Duration(400+rng.IntN(3200)) * time.Millisecond
				if rng.IntN(100) < 20 {
					d = time.Duration(rng.IntN(30)) * time.Millisecond
				}
				gap := time.NewTimer(d)
				select {
				case <-ctx.Done():
					gap.Stop()
					return
				case <-gap.C:
				}
				text := fmt.Sprintf("L%02d m%02d", i, m)
				switch r := rng.IntN(100); {
				case r < 30:
					text += fmt.Sprintf("\n!sleep %dms", 300+rng.IntN(600))
				case r < 35:
					text = fmt.Sprintf("!sleep %dms", 100+rng.IntN(300)) // a directive-only message
				case r < 40:
					text += "\n!tools 2"
				}
				a, err := c.tryPostCtx(ctx, l.chat, text, "")
				if err != nil {
					postErrs <- err
					cancel()
					return
				}
				if l.key == "" {
					l.key = a.SessionKey
				} else if l.key != a.SessionKey {
					postErrs <- fmt.Errorf("%s: session key %s, then %s", l.chat, l.key, a.SessionKey)
					cancel()
					return
				}
				l.sent = append(l.sent, sentMsg{seq: a.Seq, text: text})
			}
		})
	}
	posted := make(chan struct{})
	go func() { wg.Wait(); close(posted) }()

	// The chaos: SIGKILL a random worker every 4-6 s and restart it after a
	// short random downtime, until the posting is over and at least
	// minKills kills happened. The timers are the fault schedule.
	rng := rand.New(rand.NewPCG(seed, 1<<32))
	var kills []killRec
	next := time.NewTimer(3 * time.Second)
	defer next.Stop()
	postingDone := false
	for !postingDone || len(kills) < minKills {
		select {
		case <-posted:
			postingDone = true
			posted = nil
			continue
		case <-next.C:
		}
		if ctx.Err() != nil {
			break
		}
		w := workers[rng.IntN(len(workers))]
		// Aim for a moment when the victim is mid-turn on some lane, for
		// up to 2s; then kill it whatever it is doing.
		inFlight := 0
		_ = poll(2*time.Second, func() error {
			inFlight = c.turnsInFlight(w.owner)
			if inFlight == 0 {
				return errors.New("idle")
			}
			return nil
		})
		k := killRec{at: time.Now(), id: w.id, owner: w.owner, inFlight: inFlight}
		w.kill()
		kills = append(kills, k)
		down := time.NewTimer(time.Duration(rng.IntN(1000)) * time.Millisecond)
		<-down.C
		w.restart()
		t.Logf("kill %d at %v: %s (%s) with %d turns in flight, restarted as %s",
			len(kills), k.at.Sub(begin).Round(time.Millisecond), k.id, k.owner, k.inFlight, w.owner)
		next.Reset(time.Duration(4000+rng.IntN(2000)) * time.Millisecond)
	}
	wg.Wait()
	select {
	case err := <-postErrs:
		t.Fatalf("posting failed: %v", err)
	default:
	}
	postedIn := time.Since(begin)
	total := 0
	for _, l := range sent {
		total += len(l.sent)
	}
	t.Logf("posted %d messages to %d lanes in %v with %d kills", total, lanes, postedIn.Round(time.Millisecond), len(kills))

	// Quiescence: every lane committed up to its last accepted message with
	// no turn in flight, every reply copied to the mailboxes, every
	// delivery (redeliveries included) settled.
	settleStart := time.Now()
	waitFor(t, 90*time.Second, "every lane to commit its last message", func() error {
		var behind []string
		for _, l := range sent {
			if err := c.committed(l.key, l.sent[len(l.sent)-1].seq); err != nil {
				behind = append(behind, err.Error())
			}
		}
		if len(behind) > 0 {
			return fmt.Errorf("%d lanes behind, e.g. %s", len(behind), behind[0])
		}
		if err := c.delivered(); err != nil {
			return err
		}
		return c.inboxSettled()
	})
	t.Logf("settled %v after the last post", time.Since(settleStart).Round(time.Millisecond))

	events := c.turnEvents()
	byLane := map[string][]worker.TurnEvent{}
	for _, ev := range events {
		byLane[ev.Lane] = append(byLane[ev.Lane], ev)
	}
	deadLettered := map[string]bool{}
	for _, m := range c.eventsOf("deadletter") {
		lane := strings.TrimPrefix(m.Subject, c.names.EventSubject("deadletter", ""))
		deadLettered[lane] = true
	}

	var completedTurns, replies int
	statuses := map[string]int{}
	for _, l := range sent {
		lane := session.LaneToken(l.key)
		completedTurns += checkChaosLane(t, c, l, byLane[lane], deadLettered[lane], statuses)
		replies += len(c.allReplies(l.key))
	}

	// Exclusivity, from the turn events of every lane.
	st := checkNoOverlap(t, byLane)
	// The checks above and below read the turn events: they must be there,
	// and the run must have done what it is for (kills that interrupted
	// turns, lanes that changed hands), or it proved nothing.
	for _, l := range sent {
		if len(byLane[session.LaneToken(l.key)]) == 0 {
			t.Errorf("lane %s: no turn events at all", l.chat)
		}
	}
	midTurn := 0
	for _, k := range kills {
		if k.inFlight > 0 {
			midTurn++
		}
	}
	if midTurn == 0 || st.resumed == 0 {
		t.Errorf("%d of %d kills landed with turns in flight and %d attempts resumed: the run interrupted no turn", midTurn, len(kills), st.resumed)
	}
	if st.epochs <= st.lanes {
		t.Errorf("%d lane ownerships for %d lanes: no lane changed hands", st.epochs, st.lanes)
	}
	t.Logf("turns: %d started (%d resumed attempts), %d completed with a reply, %d mailbox messages; "+
		"%d lane ownerships (distinct epochs with turns), %d takeovers; %d kills; %d lanes dead-lettered",
		st.starts, st.resumed, completedTurns, replies, st.epochs, st.epochs-st.lanes, len(kills), len(deadLettered))
	t.Logf("turn endings in the transcripts: %v", statuses)
	reportResumes(t, kills, byLane)
}

// echoText is the echo agent's reply to a turn of these messages.
func echoText(texts []string) string {
	var kept []string
	for _, m := range texts {
		var lines []string
		for _, line := range strings.Split(m, "\n") {
			if !strings.HasPrefix(strings.TrimSpace(line), "!") {
				lines = append(lines, line)
			}
		}
		if len(lines) > 0 {
			kept = append(kept, strings.Join(lines, "\n"))
		}
	}
	return "echo: " + strings.Join(kept, "\n")
}

// checkChaosLane checks one lane after the chaos and returns its number of
// completed turns with a reply.
func checkChaosLane(t *testing.T, c *cluster, l *chaosLane, evs []worker.TurnEvent, deadLettered bool, statuses map[string]int) int {
	t.Helper()
	e := c.mustEntry(l.key)
	sid := e.SessionID
	if sid == "" {
		t.Errorf("%s: no session id in the entry", l.chat)
		return 0
	}

	// One session per lane (a dead letter is the one allowed way to start
	// another: DESIGN §3.5).
	sessions := []string{}
	for _, ev := range evs {
		if !slices.Contains(sessions, ev.SessionID) {
			sessions = append(sessions, ev.SessionID)
		}
	}
	if !slices.Contains(sessions, sid) {
		sessions = append(sessions, sid)
	}
	if len(sessions) > 1 {
		if !deadLettered {
			t.Errorf("%s: the lane's turns ran in %d sessions %v, the entry names %s", l.chat, len(sessions), sessions, sid)
		} else {
			t.Logf("%s: dead-lettered; sessions %v", l.chat, sessions)
		}
	}
	var entries []transcript.Entry
	for _, s := range sessions {
		entries = append(entries, c.load(s)...)
	}

	// Every accepted message exactly once, in inbox order.
	users := userEntries(entries)
	count := map[uint64]int{}
	for _, u := range users {
		count[u.InboxSeq]++
	}
	want := map[uint64]string{}
	for _, m := range l.sent {
		want[m.seq] = m.text
		switch n := count[m.seq]; {
		case n == 0:
			t.Errorf("%s: accepted message seq %d %q is not in the transcript", l.chat, m.seq, m.text)
		case n > 1:
			t.Errorf("%s: message seq %d %q is in the transcript %d times", l.chat, m.seq, m.text, n)
		}
	}
	var order []uint64
	for _, u := range users {
		text, ok := want[u.InboxSeq]
		if !ok {
			t.Errorf("%s: user entry %s for seq %d %q was never accepted for this lane", l.chat, u.ID, u.InboxSeq, u.Content)
			continue
		}
		if u.Content != text {
			t.Errorf("%s: user entry for seq %d holds %q, the message was %q", l.chat, u.InboxSeq, u.Content, text)
		}
		order = append(order, u.InboxSeq)
	}
	if !slices.IsSorted(order) {
		t.Errorf("%s: user entries out of inbox order: %v", l.chat, order)
	}
	// Every message was taken by a turn that ended (completed, interrupted
	// by the next message, failed...) and none is left dangling.
	ended := turnEnds(entries)
	for _, ends := range ended {
		statuses[ends[len(ends)-1].Status]++
	}
	for _, u := range users {
		if len(ended[u.TurnID]) == 0 {
			t.Errorf("%s: message seq %d belongs to turn %s, which has no turn_end", l.chat, u.InboxSeq, u.TurnID)
		}
	}

	// Replies: every completed turn's reply once, in transcript order, in
	// the session; the reply text is the echo of the turn's messages.
	box := c.allReplies(l.key)
	completed := checkRepliesOnce(t, l.chat, entries, box)
	if len(box) > 0 && box[0].SessionID != sessions[0] {
		t.Errorf("%s: first reply in session %s, the lane's first session is %s", l.chat, box[0].SessionID, sessions[0])
	}
	if !deadLettered {
		for _, r := range box {
			if r.SessionID != sid {
				t.Errorf("%s: reply %d of turn %s in session %s, the entry names %s", l.chat, r.Seq, r.TurnID, r.SessionID, sid)
			}
		}
	}
	pos := map[string]int{}
	for i, x := range entries {
		if x.Role == transcript.RoleAssistant && len(x.ToolCalls) == 0 && x.Content != "" {
			pos[x.TurnID] = i
		}
	}
	last := -1
	for _, r := range box {
		if r.Kind != session.ReplyKindReply {
			continue
		}
		if p, ok := pos[r.TurnID]; ok {
			if p < last {
				t.Errorf("%s: reply of turn %s delivered after a later turn's reply", l.chat, r.TurnID)
			}
			last = p
		}
	}
	replyOf := replyEntries(entries)
	for _, ev := range evs {
		if ev.Type != "end" || ev.Status != transcript.StatusCompleted || len(replyOf[ev.TurnID]) == 0 {
			continue
		}
		var texts []string
		for _, m := range l.sent {
			if m.seq >= ev.FirstSeq && m.seq <= ev.LastSeq {
				texts = append(texts, m.text)
			}
		}
		if got, want := replyOf[ev.TurnID][0].Content, echoText(texts); got != want {
			t.Errorf("%s: turn %s over seqs %d..%d replied %q, want %q", l.chat, ev.TurnID, ev.FirstSeq, ev.LastSeq, got, want)
		}
	}
	return completed
}

// overlapStats are counts from checkNoOverlap.
type overlapStats struct {
	lanes, epochs, starts, resumed int
}

// checkNoOverlap checks, lane by lane, that each lease epoch had one owner
// and that no attempt of a higher epoch started before an attempt of a
// lower epoch that recorded its end had ended.
func checkNoOverlap(t *testing.T, byLane map[string][]worker.TurnEvent) overlapStats {
	t.Helper()
	type attempt struct {
		turn, owner       string
		epoch             uint64
		start, end        time.Time
		hasStart, hasEnd  bool
		firstSeq, lastSeq uint64
	}
	var st overlapStats
	for _, lane := range sortedKeys(byLane) {
		st.lanes++
		owners := map[uint64]string{}
		attempts := map[string]*attempt{}
		ends := map[string]int{}
		for _, ev := range byLane[lane] {
			if o, ok := owners[ev.Epoch]; ok && o != ev.Owner {
				t.Errorf("%s: epoch %d used by two owners, %s and %s", lane, ev.Epoch, o, ev.Owner)
			}
			owners[ev.Epoch] = ev.Owner
			k := fmt.Sprintf("%s/%d", ev.TurnID, ev.Epoch)
			a := attempts[k]
			if a == nil {
				a = &attempt{turn: ev.TurnID, owner: ev.Owner, epoch: ev.Epoch}
				attempts[k] = a
			}
			switch ev.Type {
			case "start":
				st.starts++
				if ev.Attempt > 1 {
					st.resumed++
				}
				a.start, a.hasStart = ev.At, true
			case "end":
				ends[ev.TurnID]++
				if ends[ev.TurnID] == 2 {
					t.Errorf("%s: turn %s ended twice", lane, ev.TurnID)
				}
				a.end, a.hasEnd = ev.At, true
			}
		}
		st.epochs += len(owners)
		list := make([]*attempt, 0, len(attempts))
		for _, a := range attempts {
			list = append(list, a)
		}
		sort.Slice(list, func(i, j int) bool { return list[i].epoch < list[j].epoch })
		for _, a := range list {
			if !a.hasEnd {
				continue
			}
			for _, b := range list {
				if b.epoch <= a.epoch || !b.hasStart {
					continue
				}
				if !b.start.After(a.end) {
					t.Errorf("%s: overlap: turn %s of epoch %d (%s) started at %s, before turn %s of epoch %d (%s) ended at %s",
						lane, b.turn, b.epoch, b.owner, b.start.Format(time.StampMicro), a.turn, a.epoch, a.owner, a.end.Format(time.StampMicro))
				}
			}
		}
	}
	return st
}

// reportResumes logs, for each kill, how long the lanes that had a turn in
// flight on the killed worker waited until another owner worked on them.
func reportResumes(t *testing.T, kills []killRec, byLane map[string][]worker.TurnEvent) {
	t.Helper()
	var all []time.Duration
	for i, k := range kills {
		var waits []time.Duration
		for lane, evs := range byLane {
			inFlight := map[string]bool{}
			for _, ev := range evs {
				if ev.Owner != k.owner || ev.At.After(k.at) {
					continue
				}
				if ev.Type == "start" {
					inFlight[ev.TurnID] = true
				} else {
					delete(inFlight, ev.TurnID)
				}
			}
			if len(inFlight) == 0 {
				continue
			}
			found := false
			for _, ev := range evs {
				if ev.Owner != k.owner && ev.At.After(k.at) {
					waits = append(waits, ev.At.Sub(k.at))
					found = true
					break
				}
			}
			if !found {
				t.Logf("kill %d: lane %s had a turn in flight on %s and nobody resumed it", i+1, lane, k.owner)
			}
		}
		if len(waits) > 0 {
			slices.Sort(waits)
			t.Logf("kill %d (%s): %d lanes with a turn in flight, resumed after %v..%v (median %v)",
				i+1, k.owner, len(waits), waits[0].Round(time.Millisecond), waits[len(waits)-1].Round(time.Millisecond),
				waits[len(waits)/2].Round(time.Millisecond))
		} else {
			t.Logf("kill %d (%s): no turn in flight", i+1, k.owner)
		}
		all = append(all, waits...)
	}
	if len(all) > 0 {
		slices.Sort(all)
		t.Logf("kill to resumed progress over %d interrupted lanes: min %v, median %v, max %v",
			len(all), all[0].Round(time.Millisecond), all[len(all)/2].Round(time.Millisecond), all[len(all)-1].Round(time.Millisecond))
	}
}
