package worker_test

// Busy input: what messages arriving while a turn runs do, per busy mode
// (interrupt, queue, steer), and the /queue FIFO (DESIGN §5, seed §8).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/transcript"
	"github.com/agentfleet/agentfleet/worker"
)

// ---------------------------------------------------------------------------
// Helpers shared by busy_test.go and commands_test.go.

var msgCounter atomic.Int64

// send posts text to chatID as the HTTP ingress would, with a fresh platform
// message id.
func (f *fleet) send(chatID, text string) (string, uint64) {
	f.t.Helper()
	return f.post(chatID, text, fmt.Sprintf("t%d", msgCounter.Add(1)))
}

// laneFor is the lane token of a chat as post derives it.
func laneFor(chatID string) string {
	src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: chatID, ChatType: session.ChatDM, UserID: "u-" + chatID, UserName: "User " + chatID}
	return session.LaneToken(session.BuildSessionKey(src, session.DefaultKeyOptions()))
}

// entry reads a lane's SessionEntry.
func (f *fleet) entry(lane string) *session.SessionEntry {
	f.t.Helper()
	e, _, err := f.store.Get(f.t.Context(), lane)
	if err != nil {
		f.t.Fatalf("entry %s: %v", lane, err)
	}
	return e
}

// waitTurn waits until the lane has a turn in flight whose range covers seq
// and returns that turn's intent.
func (f *fleet) waitTurn(lane string, seq uint64) *session.TurnIntent {
	f.t.Helper()
	var turn *session.TurnIntent
	natstest.WaitFor(f.t, 10*time.Second, fmt.Sprintf("turn in flight over seq %d on %s", seq, lane), func() error {
		e, _, err := f.store.Get(f.t.Context(), lane)
		if err != nil {
			return err
		}
		if e.Turn == nil || e.Turn.FirstSeq > seq || e.Turn.LastSeq < seq {
			return fmt.Errorf("committed %d turn %+v", e.CommittedSeq, e.Turn)
		}
		turn = e.Turn
		return nil
	})
	return turn
}

// settled is waitCommitted with a shorter patience: every step of these
// tests finishes within a few seconds, so a wedged lane fails fast.
func (f *fleet) settled(lane string, seq uint64) *session.SessionEntry {
	f.t.Helper()
	var e *session.SessionEntry
	natstest.WaitFor(f.t, 10*time.Second, fmt.Sprintf("%s committed to %d", lane, seq), func() error {
		var err error
		e, _, err = f.store.Get(f.t.Context(), lane)
		if err != nil {
			return err
		}
		if e.CommittedSeq < seq || e.Turn != nil {
			return fmt.Errorf("committed %d turn %+v", e.CommittedSeq, e.Turn)
		}
		return nil
	})
	return e
}

// load reads a session's whole transcript.
func (f *fleet) load(sid string) []transcript.Entry {
	f.t.Helper()
	entries, _, err := f.tx.Load(f.t.Context(), sid)
	if err != nil {
		f.t.Fatalf("load transcript %s: %v", sid, err)
	}
	return entries
}

// effective is what an agent of the session would see.
func (f *fleet) effective(sid string) []transcript.Entry {
	f.t.Helper()
	return transcript.Effective(f.load(sid))
}

// contents lists the contents of the entries with the given role.
func contents(entries []transcript.Entry, role string) []string {
	var out []string
	for _, e := range entries {
		if e.Kind == transcript.KindMessage && e.Role == role {
			out = append(out, e.Content)
		}
	}
	return out
}

// historyContents is contents for an agent's history.
func historyContents(h []agent.Message, role string) []string {
	var out []string
	for _, m := range h {
		if m.Role == role {
			out = append(out, m.Content)
		}
	}
	return out
}

// ofKind returns the entries of a kind.
func ofKind(entries []transcript.Entry, kind string) []transcript.Entry {
	var out []transcript.Entry
	for _, e := range entries {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// texts lists the texts of the replies of a kind (reply or notice); "" = all.
func texts(rs []session.Reply, kind string) []string {
	var out []string
	for _, r := range rs {
		if kind == "" || r.Kind == kind {
			out = append(out, r.Text)
		}
	}
	return out
}

// waitReply waits for a reply (or notice) of the lane satisfying match and
// returns every reply so far.
func (f *fleet) waitReply(lane, what string, match func(session.Reply) bool) []session.Reply {
	f.t.Helper()
	var got []session.Reply
	natstest.WaitFor(f.t, 10*time.Second, what, func() error {
		got = f.replies(lane)
		for _, r := range got {
			if match(r) {
				return nil
			}
		}
		return fmt.Errorf("replies %q", texts(got, ""))
	})
	return got
}

// adminCommand publishes a command into a lane's inbox exactly as fleetctl's
// publishCommand does (body built from the stored entry, admin Msg-Id).
func (f *fleet) adminCommand(lane, command, args string) uint64 {
	f.t.Helper()
	e := f.entry(lane)
	in := session.Inbound{SessionKey: e.SessionKey, Kind: session.KindCommand, Command: command, Args: args, ReceivedAt: time.Now()}
	if e.Origin != nil {
		in.Source = *e.Origin
	}
	data, err := json.Marshal(in)
	if err != nil {
		f.t.Fatal(err)
	}
	msg := nats.NewMsg(f.names.InboxSubject(session.Partition(f.names.Prefix(), lane), lane))
	msg.Data = data
	msg.Header.Set(broker.HdrSessionKey, e.SessionKey)
	msg.Header.Set(broker.HdrKind, session.KindCommand)
	var b [8]byte
	_, _ = rand.Read(b[:])
	ack, err := f.js.PublishMsg(f.t.Context(), msg, jetstream.WithMsgID("admin:"+hex.EncodeToString(b[:])))
	if err != nil {
		f.t.Fatal(err)
	}
	return ack.Sequence
}

// events reads every event of a kind published for a lane, in order.
func (f *fleet) events(kind, lane string) []map[string]any {
	f.t.Helper()
	var out []map[string]any
	seq := uint64(1)
	for {
		raw, err := f.res.Events.GetMsg(f.t.Context(), seq, jetstream.WithGetMsgSubject(f.names.EventSubject(kind, lane)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out
		}
		if err != nil {
			f.t.Fatal(err)
		}
		var v map[string]any
		if err := json.Unmarshal(raw.Data, &v); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, v)
		seq = raw.Sequence + 1
	}
}

// noReset turns the automatic reset policy off, so a test never meets the
// 4 AM boundary by chance.
func noReset(c *worker.Config) { c.Reset.Default = session.ResetPolicy{Mode: session.ResetNone} }

// mods chains config modifiers.
func mods(ms ...func(*worker.Config)) func(*worker.Config) {
	return func(c *worker.Config) {
		for _, m := range ms {
			m(c)
		}
	}
}

// recorder is an agent backend that records every turn it is given, then
// answers like the echo agent. panicOn makes a turn whose message has that
// exact text panic. onRun, if set, runs at the start of every turn (in the
// agent goroutine: it must not call t.Fatal).
type recorder struct {
	mu      sync.Mutex
	turns   []agent.Turn
	panicOn string
	onRun   func(t *agent.Turn)
	echo    *echo.Agent
}

func newRecorder() *recorder { return &recorder{echo: echo.New(echo.Options{})} }

func (r *recorder) backend() agent.Backend {
	a := agent.AgentFunc(func(ctx context.Context, t *agent.Turn, emit agent.Emitter) (*agent.Result, error) {
		cp := *t
		cp.History = slices.Clone(t.History)
		cp.Messages = slices.Clone(t.Messages)
		cp.Notes = slices.Clone(t.Notes)
		r.mu.Lock()
		r.turns = append(r.turns, cp)
		onRun := r.onRun
		r.mu.Unlock()
		if onRun != nil {
			onRun(&cp)
		}
		for _, m := range t.Messages {
			if r.panicOn != "" && m.Text == r.panicOn {
				panic("recorder: asked to panic")
			}
		}
		return r.echo.Run(ctx, t, emit)
	})
	return agent.BackendFunc(func(context.Context, string, string) (agent.Agent, error) { return a, nil })
}

// turnWith returns the last recorded turn that had a message with text.
func (r *recorder) turnWith(text string) (agent.Turn, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.turns) - 1; i >= 0; i-- {
		for _, m := range r.turns[i].Messages {
			if m.Text == text {
				return r.turns[i], true
			}
		}
	}
	return agent.Turn{}, false
}

// userTurns maps each effective user entry's content to its turn id.
func userTurns(entries []transcript.Entry) map[string]string {
	out := map[string]string{}
	for _, e := range transcript.Effective(entries) {
		if e.Role == transcript.RoleUser {
			out[e.Content] = e.TurnID
		}
	}
	return out
}

// ---------------------------------------------------------------------------
// Interrupt mode (the default).

// Follow-ups sent while a turn runs cancel it at its next safe point (it
// commits as interrupted, without a reply) and the next turn takes all of
// them, in order, never overwritten.
func TestBusyInterruptCollectsFollowUps(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	lane, s0 := f.send("int", "first\n!sleep 5s")
	first := f.waitTurn(lane, s0)
	started := time.Now()
	f.send("int", "a")
	f.send("int", "b")
	_, sc := f.send("int", "c")
	e := f.settled(lane, sc)
	if d := time.Since(started); d > 4*time.Second {
		t.Errorf("follow-ups answered after %v: the running turn was not interrupted", d)
	}

	rs := f.replies(lane)
	if got := texts(rs, session.ReplyKindReply); !slices.Equal(got, []string{"echo: a\nb\nc"}) {
		t.Fatalf("replies %q, want exactly [\"echo: a\\nb\\nc\"]", got)
	}
	for _, r := range rs {
		if r.TurnID == first.ID {
			t.Errorf("the interrupted turn sent %s %q", r.Kind, r.Text)
		}
	}
	entries := f.load(e.SessionID)
	if status, ok := transcript.TurnEnded(entries, first.ID); !ok || status != worker.StatusInterrupted {
		t.Errorf("first turn end = %q (%v), want %q", status, ok, worker.StatusInterrupted)
	}
	users := contents(transcript.Effective(entries), transcript.RoleUser)
	if want := []string{"first\n!sleep 5s", "a", "b", "c"}; !slices.Equal(users, want) {
		t.Errorf("user entries %q, want %q (each once, in order)", users, want)
	}
	turns := userTurns(entries)
	if turns["a"] == first.ID || turns["a"] != turns["b"] || turns["b"] != turns["c"] {
		t.Errorf("follow-ups not in one later turn: %v (first %s)", turns, first.ID)
	}
	if e.InterruptedTurns != 0 || e.ResumePending || e.Suspended {
		t.Errorf("a user interrupt left flags: interrupted_turns=%d resume_pending=%v suspended=%v", e.InterruptedTurns, e.ResumePending, e.Suspended)
	}
}

// ---------------------------------------------------------------------------
// Queue mode.

// In queue mode the running turn finishes, and every follow-up then gets a
// turn of its own, in order.
func TestBusyQueueLetsTurnFinish(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"command", "config"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			f := newFleet(t)
			mod := noReset
			if how == "config" {
				mod = mods(noReset, func(c *worker.Config) { c.BusyMode = worker.BusyQueue })
			}
			f.startWorker("w1", mod)
			chat := "queue-" + how
			lane := laneFor(chat)
			if how == "command" {
				_, s := f.send(chat, "/busy queue")
				if e := f.settled(lane, s); e.BusyMode != worker.BusyQueue {
					t.Fatalf("busy mode %q after /busy queue", e.BusyMode)
				}
			}
			_, s0 := f.send(chat, "first\n!sleep 1s")
			first := f.waitTurn(lane, s0)
			f.send(chat, "a")
			_, sb := f.send(chat, "b")
			e := f.settled(lane, sb)

			// Each follow-up keeps its own turn, FIFO, as /queue items do:
			// queue mode never merges a burst.
			got := texts(f.replies(lane), session.ReplyKindReply)
			if want := []string{"echo: first", "echo: a", "echo: b"}; !slices.Equal(got, want) {
				t.Fatalf("replies %q, want %q", got, want)
			}
			entries := f.load(e.SessionID)
			if status, _ := transcript.TurnEnded(entries, first.ID); status != worker.StatusCompleted {
				t.Errorf("first turn end %q, want completed", status)
			}
			turns := userTurns(entries)
			if turns["a"] == first.ID || turns["b"] == first.ID || turns["a"] == turns["b"] {
				t.Errorf("follow-ups not each in a turn of its own: %v", turns)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// Steer mode.

// In steer mode a message sent while the turn runs is recorded into the
// running turn (its range is extended) and handed to the agent: one reply.
func TestBusySteerExtendsRunningTurn(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	lane, s := f.send("steer", "/busy steer")
	if e := f.settled(lane, s); e.BusyMode != worker.BusySteer {
		t.Fatalf("busy mode %q after /busy steer", e.BusyMode)
	}
	_, sx := f.send("steer", "x\n!sleep 2s")
	turn := f.waitTurn(lane, sx)
	_, sy := f.send("steer", "y")
	// The steered message joins the running turn: the recorded range grows
	// while the agent still sleeps.
	extended := false
	natstest.WaitFor(t, 10*time.Second, "turn range extended over y", func() error {
		e := f.entry(lane)
		if e.Turn != nil && e.Turn.ID == turn.ID && e.Turn.LastSeq >= sy {
			extended = true
			return nil
		}
		if e.CommittedSeq >= sy {
			return nil // over already: the checks below tell
		}
		return fmt.Errorf("turn %+v", e.Turn)
	})
	if !extended {
		t.Errorf("never saw turn %s extended over y (seq %d)", turn.ID, sy)
	}
	e := f.settled(lane, sy)
	if e.LastTurnID != turn.ID {
		t.Errorf("last turn %s, want the steered turn %s", e.LastTurnID, turn.ID)
	}
	rs := texts(f.replies(lane), session.ReplyKindReply)
	if len(rs) != 1 || !strings.Contains(rs[0], "x") || !strings.Contains(rs[0], "y") {
		t.Fatalf("replies %q, want one reply with x and y", rs)
	}
	entries := f.load(e.SessionID)
	turns := userTurns(entries)
	if turns["x\n!sleep 2s"] != turn.ID || turns["y"] != turn.ID {
		t.Errorf("user entries' turns %v, want both %s", turns, turn.ID)
	}
	if users := contents(transcript.Effective(entries), transcript.RoleUser); !slices.Equal(users, []string{"x\n!sleep 2s", "y"}) {
		t.Errorf("user entries %q", users)
	}
	if ends := ofKind(entries, transcript.KindTurnEnd); len(ends) != 2 { // the /busy command's and the steered turn's
		t.Errorf("turn ends %+v", ends)
	}
}

// DESIGN §10: the echo reply is "echo: " + the turn's user texts joined by a
// newline, in order. A steered message comes after the one it joined.
func TestBusySteerReplyKeepsOrder(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", mods(noReset, func(c *worker.Config) { c.BusyMode = worker.BusySteer }))
	lane, sx := f.send("steer-order", "x\n!sleep 1s")
	f.waitTurn(lane, sx)
	_, sy := f.send("steer-order", "y")
	f.settled(lane, sy)
	if got := texts(f.replies(lane), session.ReplyKindReply); !slices.Equal(got, []string{"echo: x\ny"}) {
		t.Fatalf("replies %q, want [\"echo: x\\ny\"]", got)
	}
}

// ---------------------------------------------------------------------------
// /queue.

// /queue items sent during a long turn each make their own turn, FIFO,
// never merged.
func TestQueueItemsRunFIFO(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	lane, s0 := f.send("fifo", "first\n!sleep 1500ms")
	first := f.waitTurn(lane, s0)
	_, sa := f.send("fifo", "/queue a\n!sleep 500ms")
	f.send("fifo", "/q b")
	_, sc := f.send("fifo", "/queue c")
	// While a runs, b and c wait: the entry says so.
	f.waitTurn(lane, sa)
	if d := f.entry(lane).QueueDepth; d != 2 {
		t.Errorf("queue depth %d while a runs, want 2", d)
	}
	e := f.settled(lane, sc)
	if e.QueueDepth != 0 {
		t.Errorf("queue depth %d after the last item, want 0", e.QueueDepth)
	}

	got := texts(f.replies(lane), session.ReplyKindReply)
	if want := []string{"echo: first", "echo: a", "echo: b", "echo: c"}; !slices.Equal(got, want) {
		t.Fatalf("replies %q, want %q (the running turn is not interrupted by /queue)", got, want)
	}
	entries := f.load(e.SessionID)
	turns := userTurns(entries)
	ids := map[string]bool{first.ID: true}
	for _, q := range []string{"a\n!sleep 500ms", "b", "c"} {
		if ids[turns[q]] {
			t.Errorf("queued %q shares turn %s: %v", q, turns[q], turns)
		}
		ids[turns[q]] = true
	}
}

// m1, /queue q1, m2, /queue q2 sent during a running turn: steps run
// strictly in inbox order, each /queue item alone. Queue mode: every step
// answers.
func TestQueueInterleavedStrictOrder(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", mods(noReset, func(c *worker.Config) { c.BusyMode = worker.BusyQueue }))
	lane, s0 := f.send("inter-q", "first\n!sleep 1s")
	f.waitTurn(lane, s0)
	f.send("inter-q", "m1")
	f.send("inter-q", "/queue q1")
	f.send("inter-q", "m2")
	_, last := f.send("inter-q", "/queue q2")
	e := f.settled(lane, last)

	got := texts(f.replies(lane), session.ReplyKindReply)
	if want := []string{"echo: first", "echo: m1", "echo: q1", "echo: m2", "echo: q2"}; !slices.Equal(got, want) {
		t.Fatalf("replies %q, want %q", got, want)
	}
	checkSeparateTurns(t, f.load(e.SessionID), []string{"first\n!sleep 1s", "m1", "q1", "m2", "q2"})
}

// The same in interrupt mode: m1 interrupts the running turn; m2 cannot join
// m1's turn (q1 stands between them), so it must not cancel m1's turn
// either: m1, q1, m2 and q2 are each answered, in order.
func TestQueueInterleavedInterruptMode(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	lane, s0 := f.send("inter-i", "first\n!sleep 5s")
	first := f.waitTurn(lane, s0)
	f.send("inter-i", "m1")
	f.send("inter-i", "/queue q1")
	f.send("inter-i", "m2")
	_, last := f.send("inter-i", "/queue q2")
	e := f.settled(lane, last)

	entries := f.load(e.SessionID)
	if status, _ := transcript.TurnEnded(entries, first.ID); status != worker.StatusInterrupted {
		t.Errorf("first turn end %q, want interrupted", status)
	}
	checkSeparateTurns(t, entries, []string{"first\n!sleep 5s", "m1", "q1", "m2", "q2"})
	got := texts(f.replies(lane), session.ReplyKindReply)
	if want := []string{"echo: m1", "echo: q1", "echo: m2", "echo: q2"}; !slices.Equal(got, want) {
		var ends []string
		for _, en := range ofKind(entries, transcript.KindTurnEnd) {
			ends = append(ends, en.Status)
		}
		t.Fatalf("replies %q, want %q (turn ends %q)", got, want, ends)
	}
}

// In interrupt mode only a plain message that can join the next turn (no
// /queue item or command between it and the running turn's range) cancels
// the running turn. Here m2 arrives while m1's turn runs, behind /queue q1:
// cancelling m1's turn would leave m1 unanswered while q1 runs next anyway.
func TestInterruptOnlyByJoinableMessage(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	lane, s1 := f.send("join", "m1\n!sleep 1500ms")
	m1 := f.waitTurn(lane, s1)
	f.send("join", "/queue q1")
	_, s2 := f.send("join", "m2")
	e := f.settled(lane, s2)
	got := texts(f.replies(lane), session.ReplyKindReply)
	if want := []string{"echo: m1", "echo: q1", "echo: m2"}; !slices.Equal(got, want) {
		status, _ := transcript.TurnEnded(f.load(e.SessionID), m1.ID)
		t.Fatalf("replies %q, want %q (m1's turn ended %q)", got, want, status)
	}
}

// A /queue item always gets its own full turn (seed §8 FIFO invariant): a
// plain message arriving while it runs waits for it, in every busy mode.
func TestQueueTurnNotInterrupted(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{worker.BusyInterrupt, worker.BusyQueue, worker.BusySteer} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			f := newFleet(t)
			f.startWorker("w1", mods(noReset, func(c *worker.Config) { c.BusyMode = mode }))
			lane, sq := f.send("qturn", "/queue q1\n!sleep 1500ms")
			q := f.waitTurn(lane, sq)
			_, sm := f.send("qturn", "m2")
			e := f.settled(lane, sm)
			got := texts(f.replies(lane), session.ReplyKindReply)
			if want := []string{"echo: q1", "echo: m2"}; !slices.Equal(got, want) {
				status, _ := transcript.TurnEnded(f.load(e.SessionID), q.ID)
				t.Fatalf("replies %q, want %q (the /queue turn ended %q)", got, want, status)
			}
			checkSeparateTurns(t, f.load(e.SessionID), []string{"q1\n!sleep 1500ms", "m2"})
		})
	}
}

// checkSeparateTurns checks that the effective user entries are want, in
// order, each in its own turn.
func checkSeparateTurns(t *testing.T, entries []transcript.Entry, want []string) {
	t.Helper()
	eff := transcript.Effective(entries)
	var users, turnIDs []string
	for _, e := range eff {
		if e.Role == transcript.RoleUser {
			users = append(users, e.Content)
			turnIDs = append(turnIDs, e.TurnID)
		}
	}
	if !slices.Equal(users, want) {
		t.Fatalf("user entries %q, want %q in inbox order", users, want)
	}
	seen := map[string]bool{}
	for i, id := range turnIDs {
		if seen[id] {
			t.Errorf("user entry %q merged into an earlier turn %s", users[i], id)
		}
		seen[id] = true
	}
}
