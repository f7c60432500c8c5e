//go:build compose

package compose

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
	"github.com/agentfleet/agentfleet/worker"
)

// committed reports nil once a lane committed seq with no turn in flight.
func (s *stack) committed(key string, seq uint64) error {
	e, err := s.entry(key)
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	switch {
	case e.InboxID != s.res.InboxID:
		return fmt.Errorf("%s: inbox id %q, want %q", key, e.InboxID, s.res.InboxID)
	case e.CommittedSeq < seq:
		return fmt.Errorf("%s: committed_seq %d < %d (owner %q)", key, e.CommittedSeq, seq, e.Owner)
	case e.Turn != nil:
		return fmt.Errorf("%s: turn %s still in flight (owner %q)", key, e.Turn.ID, e.Owner)
	}
	return nil
}

// delivered reports nil once the http delivery consumer copied every reply
// into the mailboxes.
func (s *stack) delivered() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := s.res.Outbox.Consumer(ctx, s.names.DeliveryConsumer(string(session.PlatformHTTP)))
	if err != nil {
		return err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return err
	}
	if info.NumPending != 0 || info.NumAckPending != 0 {
		return fmt.Errorf("delivery consumer: %d pending, %d unacked", info.NumPending, info.NumAckPending)
	}
	return nil
}

// inboxSettled reports nil once the workers consumer has nothing pending
// or unacked.
func (s *stack) inboxSettled() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := s.res.Consumer.Info(ctx)
	if err != nil {
		return err
	}
	if info.NumPending != 0 || info.NumAckPending != 0 {
		return fmt.Errorf("workers consumer: %d pending, %d unacked", info.NumPending, info.NumAckPending)
	}
	return nil
}

// readStream reads every stored message of a stream matching filter. A
// read that fails is tried again from the start for up to two minutes: just
// after the last fault the cluster can still answer a JetStream request
// with "no responders" (a full run once ended there, its checks not run).
func (s *stack) readStream(st jetstream.Stream, filter string) ([]*jetstream.RawStreamMsg, error) {
	var out []*jetstream.RawStreamMsg
	err := poll(2*time.Minute, func() (err error) {
		out, err = s.readStreamOnce(st, filter)
		if err != nil {
			s.t.Logf("read %s: %v (retrying)", filter, err)
		}
		return err
	})
	return out, err
}

func (s *stack) readStreamOnce(st jetstream.Stream, filter string) ([]*jetstream.RawStreamMsg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return nil, err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []*jetstream.RawStreamMsg
	pending := info.NumPending
	for pending > 0 {
		batch, err := cons.Fetch(int(min(pending, 500)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				return nil, err
			}
			out = append(out, &jetstream.RawStreamMsg{Subject: m.Subject(), Sequence: md.Sequence.Stream, Data: m.Data(), Time: md.Timestamp})
			pending = md.NumPending
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, err
		}
		if n == 0 {
			return nil, fmt.Errorf("read %s: no progress with %d pending", filter, pending)
		}
	}
	return out, nil
}

// describeInbox says what the inbox holds at seq, for a failure message.
func (s *stack) describeInbox(seq uint64) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := s.res.Inbox.GetMsg(ctx, seq)
	if err != nil {
		return fmt.Sprintf("inbox seq %d: %v", seq, err)
	}
	return fmt.Sprintf("inbox seq %d: subject %s, headers %v, stored %s, %q", seq, m.Subject, m.Header, m.Time.Format(time.StampMilli), m.Data)
}

// stats are what the invariant checks counted.
type stats struct {
	messages, turns, completed, resumed, epochs, takeovers, fences, deadLettered int
	// retried counts accepted messages the transcript holds under another
	// inbox seq than their 202 named (a publish stored although the
	// ingress answered 503, its retry stored again and run as duplicate).
	retried int
	// unattributed counts entries after a fence whose turn has no event
	// under an epoch that high (see checkFences).
	unattributed int
	// partials counts the partial replies kept by attempts cut short.
	partials int
	statuses map[string]int
	byLane   map[string][]worker.TurnEvent
	// violations counts the failed checks by kind: LOST, DUPLICATED, ORDER,
	// OWNERS.
	violations map[string]int
}

// fail records a violation of an invariant and fails the test.
func (st *stats) fail(t *testing.T, kind, format string, args ...any) {
	t.Helper()
	st.violations[kind]++
	t.Errorf(format, args...)
}

// checkInvariants checks DESIGN §3 over every message of the run:
//   - nothing lost: every accepted message is in its lane's transcript, in a
//     turn that ended, and every completed turn's reply is in the mailbox;
//   - nothing duplicated: each message once in the transcript, each reply
//     once in the mailbox, each turn ended once;
//   - order kept: a lane's user entries are in inbox order, and the inbox
//     order is the order the lane posted in;
//   - one owner at a time: each lease epoch has one owner; no attempt of a
//     newer epoch started before an attempt of an older one ended; in every
//     transcript the fences' epochs only grow, each fence names the owner
//     its epoch had, and no turn writes after its own turn_end.
func checkInvariants(t *testing.T, s *stack, lanes []*lane) stats {
	t.Helper()
	st := stats{statuses: map[string]int{}, byLane: map[string][]worker.TurnEvent{}, violations: map[string]int{}}
	evMsgs, err := s.readStream(s.res.Events, s.names.EventSubject("turn", ">"))
	if err != nil {
		t.Fatalf("read turn events: %v", err)
	}
	for _, m := range evMsgs {
		var ev worker.TurnEvent
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatalf("undecodable turn event: %v", err)
		}
		st.byLane[ev.Lane] = append(st.byLane[ev.Lane], ev)
	}
	dl, err := s.readStream(s.res.Events, s.names.EventSubject("deadletter", ">"))
	if err != nil {
		t.Fatalf("read dead-letter events: %v", err)
	}
	st.deadLettered = len(dl)
	if len(dl) > 0 {
		t.Errorf("%d dead letters: the run's faults should never interrupt one turn three times", len(dl))
	}
	// The inbox ranges each lane dead-lettered: a message in one is not in
	// the transcript by design (recorded, the user told), so it is reported
	// as DEADLETTERED rather than LOST (the dead letter fails the run
	// above).
	deadRanges := map[string][][2]uint64{}
	for _, m := range dl {
		var ev struct {
			TurnID   string `json:"turn_id"`
			FirstSeq uint64 `json:"first_seq"`
			LastSeq  uint64 `json:"last_seq"`
			Reason   string `json:"reason"`
		}
		if json.Unmarshal(m.Data, &ev) != nil {
			continue
		}
		lane := strings.TrimPrefix(m.Subject, s.names.EventSubject("deadletter", ""))
		deadRanges[lane] = append(deadRanges[lane], [2]uint64{ev.FirstSeq, ev.LastSeq})
		t.Logf("dead letter on %s: turn %s, inbox seqs %d..%d, reason %q, at %s", lane, ev.TurnID, ev.FirstSeq, ev.LastSeq, ev.Reason, m.Time.Format(time.StampMilli))
	}

	for _, l := range lanes {
		if len(l.msgs) == 0 {
			continue
		}
		st.messages += len(l.msgs)
		checkLane(t, s, l, st.byLane[session.LaneToken(l.key)], deadRanges[session.LaneToken(l.key)], &st)
	}
	checkOwnership(t, &st)
	return st
}

func checkLane(t *testing.T, s *stack, l *lane, evs []worker.TurnEvent, dead [][2]uint64, st *stats) {
	t.Helper()
	e, err := s.entry(l.key)
	if err != nil {
		t.Errorf("%s: entry: %v", l.chat, err)
		return
	}
	// The lane's inbox order is its posting order.
	for i := 1; i < len(l.msgs); i++ {
		if l.msgs[i].seq <= l.msgs[i-1].seq {
			t.Errorf("%s: message %d got seq %d after message %d's %d", l.chat, l.msgs[i].idx, l.msgs[i].seq, l.msgs[i-1].idx, l.msgs[i-1].seq)
		}
	}
	sessions := []string{}
	for _, ev := range evs {
		if !slices.Contains(sessions, ev.SessionID) {
			sessions = append(sessions, ev.SessionID)
		}
	}
	if !slices.Contains(sessions, e.SessionID) {
		sessions = append(sessions, e.SessionID)
	}
	if len(sessions) > 1 {
		t.Errorf("%s: turns ran in %d sessions %v", l.chat, len(sessions), sessions)
	}
	var all []transcript.Entry
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, sid := range sessions {
		var entries []transcript.Entry
		// A read may time out while the cluster is still busy catching a
		// node up: retry.
		if err := poll(2*time.Minute, func() (err error) {
			entries, _, err = s.tx.Load(ctx, sid)
			return err
		}); err != nil {
			t.Errorf("%s: transcript %s: %v", l.chat, sid, err)
			return
		}
		checkFences(t, l.chat, sid, entries, evs, e.LeaseEpoch, st)
		all = append(all, entries...)
	}

	// Every accepted message exactly once, in order, with its text.
	var users []transcript.Entry
	for _, x := range transcript.Effective(all) {
		if x.Role == transcript.RoleUser {
			users = append(users, x)
		}
	}
	// Matched by platform message id (see matchMessages), from the lane's
	// inbox messages.
	idOfSeq := map[uint64]string{}
	lt := session.LaneToken(l.key)
	inbox, err := s.readStream(s.res.Inbox, s.names.InboxSubject(session.Partition(s.names.Prefix(), lt), lt))
	if err != nil {
		t.Errorf("%s: read the lane's inbox: %v", l.chat, err)
	}
	for _, m := range inbox {
		var in session.Inbound
		if json.Unmarshal(m.Data, &in) == nil && in.PlatformMsgID != "" {
			idOfSeq[m.Sequence] = in.PlatformMsgID
		}
	}
	sentMsgs := make([]sent, len(l.msgs))
	for i, m := range l.msgs {
		sentMsgs[i] = sent{idx: m.idx, id: m.id, seq: m.seq, text: m.text}
	}
	match := matchMessages(sentMsgs, users, func(seq uint64) (string, bool) { id, ok := idOfSeq[seq]; return id, ok })
	for i, m := range l.msgs {
		deadLettered := func(seq uint64) bool {
			for _, r := range dead {
				if seq >= r[0] && seq <= r[1] {
					return true
				}
			}
			return false
		}
		switch n := match.count[i]; {
		case n == 0 && deadLettered(m.seq):
			st.violations["DEADLETTERED"]++
			t.Errorf("%s: DEADLETTERED: accepted message %d (id %s, seq %d) is in a dead-lettered turn's range, not in the transcript", l.chat, m.idx, m.id, m.seq)
		case n == 0:
			var copies []uint64 // every inbox copy of the message, for the report
			for seq, id := range idOfSeq {
				if id == m.id {
					copies = append(copies, seq)
				}
			}
			slices.Sort(copies)
			st.fail(t, "LOST", "%s: LOST: accepted message %d (id %s, seq %d; inbox copies at %v) is not in the transcript; %s",
				l.chat, m.idx, m.id, m.seq, copies, s.describeInbox(m.seq))
		case n > 1:
			st.fail(t, "DUPLICATED", "%s: DUPLICATED: message %d (id %s, seq %d) is in the transcript %d times", l.chat, m.idx, m.id, m.seq, n)
		}
		if match.at[i] != 0 && match.at[i] != m.seq {
			st.retried++
			m.seq = match.at[i] // where the transcript has it, for the echo check below
		}
	}
	for _, u := range match.stray {
		t.Errorf("%s: user entry for seq %d %q was never accepted for this lane", l.chat, u.InboxSeq, u.Content)
	}
	var order []int
	for _, u := range users {
		i := -1
		if id, ok := idOfSeq[u.InboxSeq]; ok {
			i = slices.IndexFunc(sentMsgs, func(x sent) bool { return x.id == id })
		} else {
			i = slices.IndexFunc(sentMsgs, func(x sent) bool { return x.seq == u.InboxSeq })
		}
		if i < 0 {
			continue
		}
		if u.Content != l.msgs[i].text {
			t.Errorf("%s: seq %d holds %q, the message was %q", l.chat, u.InboxSeq, u.Content, l.msgs[i].text)
		}
		order = append(order, i)
	}
	if !slices.IsSorted(order) {
		st.fail(t, "ORDER", "%s: ORDER: user entries out of posting order (message indexes): %v", l.chat, order)
	}
	ends := map[string][]transcript.Entry{}
	replyOf := map[string][]transcript.Entry{}
	for _, x := range all {
		switch {
		case x.Kind == transcript.KindTurnEnd:
			ends[x.TurnID] = append(ends[x.TurnID], x)
		case x.Kind == transcript.KindMessage && x.Role == transcript.RoleAssistant && x.FinishReason == "interrupted":
			// The partial reply an attempt cut short kept (its lease lost
			// mid-stream, say): history, never delivered; the attempt that
			// resumes the turn writes the reply. A delivered partial shows
			// as a mailbox text that is not the turn's reply entry.
			st.partials++
		case x.Kind == transcript.KindMessage && x.Role == transcript.RoleAssistant && len(x.ToolCalls) == 0 && x.Content != "":
			replyOf[x.TurnID] = append(replyOf[x.TurnID], x)
		}
	}
	for _, u := range users {
		if len(ends[u.TurnID]) == 0 {
			t.Errorf("%s: message seq %d belongs to turn %s, which never ended", l.chat, u.InboxSeq, u.TurnID)
		}
	}
	for turn, es := range ends {
		if len(es) > 1 {
			t.Errorf("%s: turn %s ended %d times", l.chat, turn, len(es))
		}
		st.statuses[es[len(es)-1].Status]++
		st.turns++
	}

	// The mailbox, read through the other ingress than the reader used:
	// every completed turn's reply once, with the echo of its messages.
	var box []reply
	if err := poll(2*time.Minute, func() (err error) {
		box, err = s.allReplies(s.ingress[(l.n+1)%2], l.key)
		return err
	}); err != nil {
		t.Errorf("%s: mailbox: %v", l.chat, err)
		return
	}
	got := map[string]int{}
	for _, r := range box {
		if r.Kind == session.ReplyKindReply {
			got[r.TurnID]++
			if len(replyOf[r.TurnID]) == 0 {
				t.Errorf("%s: mailbox reply of turn %s has no reply entry in the transcript", l.chat, r.TurnID)
			} else if r.Text != replyOf[r.TurnID][0].Content {
				t.Errorf("%s: turn %s: delivered %q, transcript has %q", l.chat, r.TurnID, r.Text, replyOf[r.TurnID][0].Content)
			}
		}
	}
	for turn, rs := range replyOf {
		es := ends[turn]
		if len(es) == 0 || es[len(es)-1].Status != transcript.StatusCompleted {
			continue
		}
		st.completed++
		if len(rs) > 1 {
			st.fail(t, "DUPLICATED", "%s: DUPLICATED: turn %s has %d reply entries", l.chat, turn, len(rs))
		}
		switch got[turn] {
		case 0:
			st.fail(t, "LOST", "%s: LOST: completed turn %s's reply never reached the mailbox", l.chat, turn)
		case 1:
		default:
			st.fail(t, "DUPLICATED", "%s: DUPLICATED: turn %s's reply is in the mailbox %d times", l.chat, turn, got[turn])
		}
	}
	for _, ev := range evs {
		if ev.Type != "end" || ev.Status != transcript.StatusCompleted || len(replyOf[ev.TurnID]) == 0 {
			continue
		}
		var texts []string
		for _, m := range l.msgs {
			if m.seq >= ev.FirstSeq && m.seq <= ev.LastSeq {
				texts = append(texts, m.text)
			}
		}
		if got, want := replyOf[ev.TurnID][0].Content, echoText(texts); got != want {
			t.Errorf("%s: turn %s over seqs %d..%d replied %q, want %q", l.chat, ev.TurnID, ev.FirstSeq, ev.LastSeq, got, want)
		}
	}
}

// checkFences checks one transcript against the lane's turn events: the
// fences' epochs grow, each names the owner of its epoch (when an event of
// that epoch survived), and no entry of a turn follows its turn_end.
func checkFences(t *testing.T, chat, sid string, entries []transcript.Entry, evs []worker.TurnEvent, entryEpoch uint64, st *stats) {
	t.Helper()
	ownerOf := map[uint64]string{}
	maxEpoch := map[string]uint64{} // turn id -> highest epoch it ran under
	for _, ev := range evs {
		if ev.SessionID != sid {
			continue
		}
		ownerOf[ev.Epoch] = ev.Owner
		maxEpoch[ev.TurnID] = max(maxEpoch[ev.TurnID], ev.Epoch)
	}
	var fence uint64
	ended := map[string]bool{}
	for _, x := range entries {
		if x.Kind == transcript.KindFence {
			st.fences++
			if x.Epoch <= fence {
				st.fail(t, "OWNERS", "%s %s: OWNERS: fence of epoch %d (seq %d) after a fence of epoch %d", chat, sid, x.Epoch, x.Seq, fence)
			}
			if o, ok := ownerOf[x.Epoch]; ok && o != x.Owner {
				st.fail(t, "OWNERS", "%s %s: OWNERS: fence of epoch %d names %s, the epoch's turns ran on %s", chat, sid, x.Epoch, x.Owner, o)
			}
			fence = x.Epoch
			continue
		}
		if x.TurnID == "" {
			continue
		}
		if ended[x.TurnID] {
			st.fail(t, "OWNERS", "%s %s: OWNERS: entry seq %d (%s) of turn %s after the turn's turn_end", chat, sid, x.Seq, x.Kind, x.TurnID)
		}
		if x.Kind == transcript.KindTurnEnd {
			ended[x.TurnID] = true
		}
		// Turn events are best effort (a core publish, lost while the
		// events stream elects a leader), so an entry whose turn shows no
		// event under the fence's epoch may be a resumed attempt whose
		// events were lost: counted and shown, not failed.
		if e, ok := maxEpoch[x.TurnID]; ok && e < fence {
			st.unattributed++
			if st.unattributed <= 10 {
				t.Logf("%s %s: entry seq %d (%s) of turn %s, whose turn events stop at epoch %d, after the fence of epoch %d",
					chat, sid, x.Seq, x.Kind, x.TurnID, e, fence)
			}
		}
	}
	if fence > entryEpoch {
		st.fail(t, "OWNERS", "%s %s: OWNERS: fence of epoch %d above the entry's lease epoch %d", chat, sid, fence, entryEpoch)
	}
}

// checkOwnership checks, lane by lane, that each epoch had one owner and
// that no attempt of a newer epoch started before an attempt of an older
// epoch had ended.
func checkOwnership(t *testing.T, st *stats) {
	t.Helper()
	type attempt struct {
		turn, owner      string
		epoch            uint64
		start, end       time.Time
		hasStart, hasEnd bool
	}
	for _, lane := range sortedKeys(st.byLane) {
		owners := map[uint64]string{}
		attempts := map[string]*attempt{}
		for _, ev := range st.byLane[lane] {
			if o, ok := owners[ev.Epoch]; ok && o != ev.Owner {
				st.fail(t, "OWNERS", "%s: OWNERS: epoch %d used by %s and %s", lane, ev.Epoch, o, ev.Owner)
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
				if ev.Attempt > 1 {
					st.resumed++
				}
				a.start, a.hasStart = ev.At, true
			case "end":
				a.end, a.hasEnd = ev.At, true
			}
		}
		st.epochs += len(owners)
		// A takeover is a lease epoch whose owner differs from the previous
		// epoch's (a lane released and taken again by its owner is not one).
		epochs := make([]uint64, 0, len(owners))
		for e := range owners {
			epochs = append(epochs, e)
		}
		slices.Sort(epochs)
		for i := 1; i < len(epochs); i++ {
			if owners[epochs[i]] != owners[epochs[i-1]] {
				st.takeovers++
			}
		}
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
					st.fail(t, "OWNERS", "%s: OWNERS: turn %s of epoch %d (%s) started at %s, before turn %s of epoch %d (%s) ended at %s",
						lane, b.turn, b.epoch, b.owner, b.start.Format(time.StampMicro), a.turn, a.epoch, a.owner, a.end.Format(time.StampMicro))
				}
			}
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// report logs the figures of the run: messages, faults, takeover times and
// the latency messages saw during each fault against the calm ones.
func report(t *testing.T, s *stack, lanes []*lane, faults []*fault, st stats) {
	t.Helper()
	var all []*msg
	retries := 0
	for _, l := range lanes {
		all = append(all, l.msgs...)
		for _, x := range l.msgs {
			retries += x.retries
		}
	}
	kills, partitions, restarts := 0, 0, 0
	for _, f := range faults {
		switch {
		case strings.HasPrefix(f.name, "kill"):
			kills++
		case strings.HasPrefix(f.name, "partition"):
			partitions++
		default:
			restarts++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n== chaos figures\n")
	fmt.Fprintf(&b, "messages accepted: %d on %d lanes (POST retries during faults: %d); turns ended: %d (%v), completed with a reply: %d\n",
		st.messages, len(lanes), retries, st.turns, st.statuses, st.completed)
	fmt.Fprintf(&b, "faults: %d kills, %d partitions, %d graceful restarts; lease epochs with turns: %d, of which a lane changed workers: %d; resumed attempts: %d; fences: %d; dead letters: %d\n",
		kills, partitions, restarts, st.epochs, st.takeovers, st.resumed, st.fences, st.deadLettered)
	fmt.Fprintf(&b, "accepted messages the transcript holds under an earlier inbox seq than their 202 named (first publish stored despite a 503; the retry ran as duplicate): %d\n", st.retried)
	fmt.Fprintf(&b, "partial replies kept by attempts cut short (not delivered; the resumed attempt replied): %d\n", st.partials)
	fmt.Fprintf(&b, "entries after a fence whose turn shows no turn event of that epoch or later (events are best effort; not a failure): %d\n", st.unattributed)
	fmt.Fprintf(&b, "invariants: lost %d (and %d in dead-lettered turns), duplicated %d, order violations %d, overlapping owners %d\n",
		st.violations["LOST"], st.violations["DEADLETTERED"], st.violations["DUPLICATED"], st.violations["ORDER"], st.violations["OWNERS"])

	// The baseline: messages sent before the first fault.
	var calm []time.Duration
	for _, x := range all {
		if !x.replied.IsZero() && len(faults) > 0 && x.firstTry.Before(faults[0].start) {
			calm = append(calm, x.replied.Sub(x.firstTry))
		}
	}
	base := pct(calm)
	fmt.Fprintf(&b, "send-to-reply (first POST attempt to the reply seen through an ingress) before the first fault: %s\n", base)
	fmt.Fprintf(&b, "fault windows run from the injection until the target was healthy again, plus 5 s; a message counts in the window it was sent in\n")
	fmt.Fprintf(&b, "%-40s %-9s %-38s %-22s %s\n", "fault", "target", "send-to-reply in the window", "added p50 / p99", "lanes with a turn in flight on the target: next turn on another worker after")
	for _, f := range faults {
		var d []time.Duration
		for _, x := range all {
			if !x.replied.IsZero() && !x.firstTry.Before(f.start) && !x.firstTry.After(f.end.Add(5*time.Second)) {
				d = append(d, x.replied.Sub(x.firstTry))
			}
		}
		p := pct(d)
		added := "-"
		if p.n > 0 && base.n > 0 {
			added = fmt.Sprintf("%v / %v", (p.p50 - base.p50).Round(time.Millisecond), (p.p99 - base.p99).Round(time.Millisecond))
		}
		fmt.Fprintf(&b, "%-40s %-9s %-38s %-22s %s\n", f.name, f.target, p, added, takeover(st.byLane, f))
		for _, d := range f.detail {
			fmt.Fprintf(&b, "    %s\n", d)
		}
	}
	t.Log(b.String())
}

// takeover says, for the lanes on which a worker fault's target had a turn
// in flight, how long after the fault another worker started a turn there
// (the interrupted turn resumed, or the next one).
func takeover(byLane map[string][]worker.TurnEvent, f *fault) string {
	if f.victimOwner == "" {
		return "-"
	}
	var waits []time.Duration
	inFlight := 0
	for _, evs := range byLane {
		running := map[string]bool{}
		for _, ev := range evs {
			if ev.Owner != f.victimOwner || ev.At.After(f.start) {
				continue
			}
			if ev.Type == "start" {
				running[ev.TurnID] = true
			} else {
				delete(running, ev.TurnID)
			}
		}
		if len(running) == 0 {
			continue
		}
		inFlight++
		for _, ev := range evs {
			if ev.Type == "start" && ev.Owner != f.victimOwner && ev.At.After(f.start) {
				waits = append(waits, ev.At.Sub(f.start))
				break
			}
		}
	}
	if inFlight == 0 {
		return "no turn in flight"
	}
	if len(waits) == 0 {
		return fmt.Sprintf("%d lanes, all finished by the target", inFlight)
	}
	w := sortedDurations(waits)
	return fmt.Sprintf("%d of %d lanes: min %v, median %v, max %v", len(w), inFlight, w[0].Round(10*time.Millisecond),
		w[len(w)/2].Round(10*time.Millisecond), w[len(w)-1].Round(10*time.Millisecond))
}

type percentiles struct {
	n             int
	p50, p99, max time.Duration
}

func pct(d []time.Duration) percentiles {
	if len(d) == 0 {
		return percentiles{}
	}
	s := sortedDurations(d)
	return percentiles{n: len(s), p50: s[len(s)/2], p99: s[min(len(s)-1, len(s)*99/100)], max: s[len(s)-1]}
}

func (p percentiles) String() string {
	if p.n == 0 {
		return "no messages"
	}
	return fmt.Sprintf("n=%d p50 %v p99 %v max %v", p.n, p.p50.Round(time.Millisecond), p.p99.Round(time.Millisecond), p.max.Round(time.Millisecond))
}
