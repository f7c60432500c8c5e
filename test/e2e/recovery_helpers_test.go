package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/worker"
)

// Helpers of the restart and crash-recovery tests (recovery_test.go,
// rolling_test.go, poison_test.go).

// startWorkerArgs starts `agentfleet worker --id id ARGS...` with extra
// environment and waits until it pulls.
func (c *cluster) startWorkerArgs(id string, args []string, extraEnv ...string) *workerProc {
	c.t.Helper()
	env := append(append([]string(nil), c.env...), extraEnv...)
	all := append([]string{"worker", "--id", id}, args...)
	w := &workerProc{proc: newProc(c.t, c.dir, "worker-"+id, env, all...), id: id}
	w.restart()
	return w
}

// stopWorker sends SIGTERM and requires the process to exit 0 within
// timeout; it returns how long the stop took.
func stopWorker(t testing.TB, w *workerProc, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	w.signal(syscall.SIGTERM)
	st := w.waitExit(timeout)
	if st == nil {
		t.Fatalf("%s (%s) still runs %v after SIGTERM", w.name, w.owner, timeout)
	}
	if !st.Success() {
		t.Fatalf("%s (%s) exited with %v after SIGTERM, want 0", w.name, w.owner, st)
	}
	return time.Since(start)
}

// fleetctl runs the built fleetctl binary against the cluster as
// `fleetctl GROUP COMMAND --json ARGS...` (urfave/cli reads no flag after the
// first argument) and decodes its one JSON document into out (when out is
// not nil).
func (c *cluster) fleetctl(out any, group, command string, args ...string) error {
	if fleetctlBinary == "" {
		return errors.New("e2e: the fleetctl binary was not built (TestMain)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args = append([]string{group, command, "--json"}, args...)
	cmd := exec.CommandContext(ctx, fleetctlBinary, args...)
	cmd.Env = append(baseEnv(), c.env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("fleetctl %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		return fmt.Errorf("fleetctl %s: %v: %s", strings.Join(args, " "), err, stdout.Bytes())
	}
	return nil
}

// fleetctlWorkers runs `fleetctl worker ls --json`.
func (c *cluster) fleetctlWorkers() ([]worker.WorkerRecord, error) {
	var doc struct {
		Workers []worker.WorkerRecord `json:"workers"`
	}
	err := c.fleetctl(&doc, "worker", "ls")
	return doc.Workers, err
}

// workerRecord reads a worker's registry record straight from the workers
// bucket.
func (c *cluster) workerRecord(id string) (worker.WorkerRecord, error) {
	var r worker.WorkerRecord
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e, err := c.res.Workers.Get(ctx, session.LaneToken(id))
	if err != nil {
		return r, fmt.Errorf("registry record of %s: %w", id, err)
	}
	err = json.Unmarshal(e.Value(), &r)
	return r, err
}

// deadLetterDoc is one row of `fleetctl deadletter ls --json`.
type deadLetterDoc struct {
	Seq        uint64          `json:"seq"`
	Lane       string          `json:"lane"`
	InboxSeq   uint64          `json:"inbox_seq"`
	SessionID  string          `json:"session_id"`
	TurnID     string          `json:"turn_id"`
	Reason     string          `json:"reason"`
	Message    session.Inbound `json:"message"`
	SessionKey string          `json:"session_key"`
}

// laneTurnEvents reads the stored TurnEvents of one lane, in stream order.
func (c *cluster) laneTurnEvents(lane string) []worker.TurnEvent {
	c.t.Helper()
	msgs := c.readStream(c.res.Events, c.names.EventSubject("turn", lane))
	out := make([]worker.TurnEvent, 0, len(msgs))
	for _, m := range msgs {
		var ev worker.TurnEvent
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			c.t.Fatalf("undecodable turn event on %s: %v: %s", m.Subject, err, m.Data)
		}
		out = append(out, ev)
	}
	return out
}

// allEntries reads every SessionEntry, by lane token.
func (c *cluster) allEntries() (map[string]*session.SessionEntry, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lister, err := c.res.Sessions.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var lanes []string
	for lane := range lister.Keys() {
		lanes = append(lanes, lane)
	}
	out := map[string]*session.SessionEntry{}
	for _, lane := range lanes {
		e, _, err := c.store.Get(ctx, lane)
		if err != nil {
			return nil, fmt.Errorf("entry %s: %w", lane, err)
		}
		out[lane] = e
	}
	return out, nil
}

// checkNoMessageSince fails t if the lane's inbox holds, after seq, anything
// but the fleet's own internal messages (wake-ups): a resume must not need
// a message from the user.
func (c *cluster) checkNoMessageSince(t *testing.T, key string, seq uint64) {
	t.Helper()
	lane := session.LaneToken(key)
	subject := c.names.InboxSubject(session.Partition(c.names.Prefix(), lane), lane)
	for next := seq + 1; ; {
		m, err := c.res.Inbox.GetMsg(t.Context(), next, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if kind := m.Header.Get(broker.HdrKind); kind != session.KindInternal {
			t.Errorf("the lane's inbox got seq %d of kind %q after seq %d: the resume needed a message (%s)", m.Sequence, kind, seq, m.Data)
		}
		next = m.Sequence + 1
	}
}

// laneLastSeq returns the last inbox seq stored on a lane's subject.
func (c *cluster) laneLastSeq(key string) uint64 {
	c.t.Helper()
	lane := session.LaneToken(key)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := c.res.Inbox.GetLastMsgForSubject(ctx, c.names.InboxSubject(session.Partition(c.names.Prefix(), lane), lane))
	if err != nil {
		c.t.Fatalf("last inbox message of %s: %v", key, err)
	}
	return m.Sequence
}

// repliesCtx is cluster.replies with a context.
func (c *cluster) repliesCtx(ctx context.Context, key string, after uint64, wait time.Duration) ([]reply, error) {
	q := url.Values{"after": {strconv.FormatUint(after, 10)}, "wait": {wait.String()}}
	status, _, data, err := c.doCtx(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(key)+"/replies?"+q.Encode(), "", nil)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("GET replies of %s: %d %s", key, status, data)
	}
	var r struct {
		Replies []reply `json:"replies"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("GET replies of %s: %w: %s", key, err, data)
	}
	return r.Replies, nil
}

// durations summarizes a sample of durations.
type durations []time.Duration

func (d durations) sorted() durations {
	s := slices.Clone(d)
	slices.Sort(s)
	return s
}

func (d durations) median() time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d.sorted()[len(d)/2]
}

func (d durations) String() string {
	if len(d) == 0 {
		return "n=0"
	}
	s := d.sorted()
	p90 := s[min(len(s)-1, len(s)*9/10)]
	return fmt.Sprintf("n=%d min %v median %v p90 %v max %v", len(s), s[0].Round(time.Millisecond),
		s[len(s)/2].Round(time.Millisecond), p90.Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}

// Closed-loop load: each lane posts a message, waits for its reply, thinks,
// and posts the next, so every message is one turn and its accept-to-reply
// time is measured by the test.

// loadMsg is one message of the closed-loop load and what became of it.
type loadMsg struct {
	seq      uint64
	text     string
	accepted time.Time // when the ingress answered 202
	replied  time.Time // when its reply was read from the mailbox; zero if never
	turnID   string
}

// loadLane is one lane of the closed-loop load.
type loadLane struct {
	chat string
	key  string
	msgs []loadMsg
	err  error // the first thing that went wrong (a lost reply, a wrong text)
}

// asChaosLane converts a lane for the chaos checks.
func (l *loadLane) asChaosLane() *chaosLane {
	cl := &chaosLane{chat: l.chat, key: l.key}
	for _, m := range l.msgs {
		cl.sent = append(cl.sent, sentMsg{seq: m.seq, text: m.text})
	}
	return cl
}

// loadGen makes the text of message n of lane i.
type loadGen func(rng *rand.Rand, lane, n int) string

// post posts text to the lane and checks its session key stays the same.
// It reports false (with l.err set, unless ctx ended) when the lane must
// stop.
func (l *loadLane) post(ctx context.Context, c *cluster, text string) (acceptResp, bool) {
	a, err := c.tryPostCtx(ctx, l.chat, text, "")
	if err != nil {
		if ctx.Err() == nil {
			l.err = err
		}
		return a, false
	}
	if l.key == "" {
		l.key = a.SessionKey
	} else if l.key != a.SessionKey {
		l.err = fmt.Errorf("%s: session key %s, then %s", l.chat, l.key, a.SessionKey)
		return a, false
	}
	return a, true
}

// openLoop posts to lanes until stop is closed, each message maxGap or less
// after the previous one, without waiting for replies, so messages queue up
// on a lane (as the chaos driver does). wait blocks until every lane posted
// its last message; the replies are checked afterwards (checkChaosLane).
// Nothing here calls t.Fatal: problems are recorded in the lane's err.
func (c *cluster) openLoop(ctx context.Context, stop <-chan struct{}, lanes []*loadLane, seed uint64,
	maxGap time.Duration, gen loadGen) (wait func()) {
	var wg sync.WaitGroup
	for i, l := range lanes {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, 1000+uint64(i)))
			for n := 0; ; n++ {
				text := gen(rng, i, n)
				a, ok := l.post(ctx, c, text)
				if !ok {
					return
				}
				l.msgs = append(l.msgs, loadMsg{seq: a.Seq, text: text, accepted: time.Now()})
				gap := time.NewTimer(time.Duration(rng.Int64N(int64(maxGap))))
				select {
				case <-stop:
					gap.Stop()
					return
				case <-ctx.Done():
					gap.Stop()
					return
				case <-gap.C:
				}
			}
		})
	}
	return wg.Wait
}

// closedLoop drives lanes until stop is closed; wait blocks until every lane
// has had the reply of its last message (or gave up on it after
// replyTimeout). Nothing here calls t.Fatal: problems are recorded in the
// lane's err.
func (c *cluster) closedLoop(ctx context.Context, stop <-chan struct{}, lanes []*loadLane, seed uint64,
	maxThink, replyTimeout time.Duration, gen loadGen) (wait func()) {
	var wg sync.WaitGroup
	for i, l := range lanes {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			var after uint64
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				default:
				}
				text := gen(rng, i, n)
				a, ok := l.post(ctx, c, text)
				if !ok {
					return
				}
				m := loadMsg{seq: a.Seq, text: text, accepted: time.Now()}
				deadline := m.accepted.Add(replyTimeout)
				for m.replied.IsZero() {
					if ctx.Err() != nil {
						l.msgs = append(l.msgs, m)
						return
					}
					if time.Now().After(deadline) {
						l.msgs = append(l.msgs, m)
						l.err = fmt.Errorf("%s: no reply to seq %d %q within %v", l.chat, m.seq, text, replyTimeout)
						return
					}
					page, err := c.repliesCtx(ctx, l.key, after, 2*time.Second)
					if err != nil {
						pause := time.NewTimer(100 * time.Millisecond)
						select {
						case <-ctx.Done():
						case <-pause.C:
						}
						pause.Stop()
						continue
					}
					for _, r := range page {
						after = r.Seq
						if r.Kind != session.ReplyKindReply {
							if l.err == nil {
								l.err = fmt.Errorf("%s: unexpected notice %q while waiting for the reply to seq %d", l.chat, r.Text, m.seq)
							}
							continue
						}
						if !m.replied.IsZero() {
							if l.err == nil {
								l.err = fmt.Errorf("%s: a second reply %q (turn %s) while waiting for the reply to seq %d", l.chat, r.Text, r.TurnID, m.seq)
							}
							continue
						}
						m.replied, m.turnID = time.Now(), r.TurnID
						if want := echoText([]string{text}); r.Text != want && l.err == nil {
							l.err = fmt.Errorf("%s: the reply to seq %d is %q, want %q", l.chat, m.seq, r.Text, want)
						}
					}
				}
				l.msgs = append(l.msgs, m)
				if maxThink > 0 {
					think := time.NewTimer(time.Duration(rng.Int64N(int64(maxThink))))
					select {
					case <-stop:
					case <-ctx.Done():
					case <-think.C:
					}
					think.Stop()
				}
			}
		})
	}
	return wg.Wait
}

// waitSettled waits until every lane committed its last accepted message
// with no turn in flight, every reply was delivered to the mailboxes and
// the workers consumer has nothing pending.
func (c *cluster) waitSettled(lanes []*loadLane, timeout time.Duration) {
	c.t.Helper()
	waitFor(c.t, timeout, "every lane to commit its last message", func() error {
		var behind []string
		for _, l := range lanes {
			if len(l.msgs) == 0 {
				continue
			}
			if err := c.committed(l.key, l.msgs[len(l.msgs)-1].seq); err != nil {
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
}

// ackRec is one ack, NAK or progress message a worker sent for a delivery
// of the workers consumer, as a core subscriber of $JS.ACK sees it.
type ackRec struct {
	at        time.Time
	seq       uint64 // stream seq
	delivered uint64 // delivery count
	body      string // +ACK, -NAK, -NAK {"delay":…}, +WPI, …
}

// ackTracer records every ack of the workers consumer while it runs.
type ackTracer struct {
	mu   sync.Mutex
	recs []ackRec
}

// traceAcks subscribes to the workers consumer's ack subjects.
func (c *cluster) traceAcks() *ackTracer {
	c.t.Helper()
	tr := &ackTracer{}
	stream, consumer := c.names.InboxStream(), c.names.WorkersConsumer()
	sub, err := c.nc.Subscribe("$JS.ACK.>", func(m *nats.Msg) {
		tok := strings.Split(m.Subject, ".")
		// $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.… (v1) or
		// $JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<sseq>.… (v2).
		i := 2
		if len(tok) >= 11 {
			i = 4
		}
		if len(tok) < i+4 || tok[i] != stream || tok[i+1] != consumer {
			return
		}
		d, _ := strconv.ParseUint(tok[i+2], 10, 64)
		s, _ := strconv.ParseUint(tok[i+3], 10, 64)
		tr.mu.Lock()
		tr.recs = append(tr.recs, ackRec{at: time.Now(), seq: s, delivered: d, body: string(m.Data)})
		tr.mu.Unlock()
	})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = sub.Unsubscribe() })
	return tr
}

// of returns the recorded acks of one stream seq, formatted relative to t0.
func (tr *ackTracer) of(seq uint64, t0 time.Time) []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []string
	for _, r := range tr.recs {
		if r.seq == seq {
			out = append(out, fmt.Sprintf("%+v delivery %d: %s", r.at.Sub(t0).Round(time.Millisecond), r.delivered, r.body))
		}
	}
	return out
}

// logLines returns, in time order, the lines of the workers' logs that
// contain word as a whole word (followed by a space or the line's end) and
// were logged between from and to.
func logLines(procs []*workerProc, word string, from, to time.Time) []string {
	type line struct {
		at   time.Time
		text string
	}
	var out []line
	for _, p := range procs {
		data, err := os.ReadFile(p.logPath)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(data), "\n") {
			if !hasWord(l, word) || !strings.HasPrefix(l, "time=") {
				continue
			}
			ts, _, _ := strings.Cut(strings.TrimPrefix(l, "time="), " ")
			at, err := time.Parse(time.RFC3339Nano, ts)
			if err != nil || at.Before(from) || at.After(to) {
				continue
			}
			out = append(out, line{at, p.name + ": " + l})
		}
	}
	slices.SortStableFunc(out, func(a, b line) int { return a.at.Compare(b.at) })
	texts := make([]string, len(out))
	for i, l := range out {
		texts[i] = l.text
	}
	return texts
}

func hasWord(line, s string) bool {
	for i := 0; ; {
		j := strings.Index(line[i:], s)
		if j < 0 {
			return false
		}
		end := i + j + len(s)
		if end == len(line) || line[end] == ' ' {
			return true
		}
		i = i + j + 1
	}
}
