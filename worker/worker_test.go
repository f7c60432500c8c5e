package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/transcript"
	"github.com/agentfleet/agentfleet/worker"
)

type fleet struct {
	t     *testing.T
	srv   *natstest.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	res   *broker.Resources
	names broker.Names
	store *kv.Store
	tx    *transcript.Log
}

const testTTL = 3 * time.Second

func newFleet(t *testing.T) *fleet {
	t.Helper()
	srv := natstest.RunServer(t)
	nc := srv.Connect(t)
	js := natstest.JetStream(t, nc)
	names := broker.MustNames("fleet")
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names, LeaseTTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := transcript.New(js, names, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &fleet{t: t, srv: srv, nc: nc, js: js, res: res, names: names, store: kv.NewStore(res, nil), tx: tx}
}

// startWorker runs a worker on its own connection until the test ends.
func (f *fleet) startWorker(id string, mod func(*worker.Config)) *worker.Worker {
	f.t.Helper()
	w, _ := f.startStoppable(id, mod)
	return w
}

// startStoppable is startWorker with a stop function that cancels the
// worker's context (a graceful stop: it drains) and waits for it to end.
func (f *fleet) startStoppable(id string, mod func(*worker.Config)) (*worker.Worker, func()) {
	f.t.Helper()
	nc := f.srv.Connect(f.t)
	js := natstest.JetStream(f.t, nc)
	res, err := broker.Provision(f.t.Context(), js, broker.ProvisionConfig{Names: f.names, LeaseTTL: testTTL})
	if err != nil {
		f.t.Fatal(err)
	}
	cfg := worker.Config{ID: id, Names: f.names, Backend: echo.Backend(echo.Options{}), LeaseTTL: testTTL,
		LeaseMargin: 500 * time.Millisecond, Linger: 500 * time.Millisecond, PeekInterval: 100 * time.Millisecond,
		DrainTimeout: 2 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	w, err := worker.New(nc, js, res, cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					f.t.Errorf("worker %s: %v", id, err)
				}
			case <-time.After(30 * time.Second):
				f.t.Errorf("worker %s did not stop", id)
			}
		})
	}
	f.t.Cleanup(stop)
	return w, stop
}

// post publishes a message as the HTTP ingress would.
func (f *fleet) post(chatID, text, msgID string) (string, uint64) {
	f.t.Helper()
	src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: chatID, ChatType: session.ChatDM, UserID: "u-" + chatID, UserName: "User " + chatID}
	key := session.BuildSessionKey(src, session.DefaultKeyOptions())
	lane := session.LaneToken(key)
	kind, cmd, args := session.Classify(text)
	in := session.Inbound{Source: src, SessionKey: key, Kind: kind, Text: text, Command: cmd, Args: args, ReceivedAt: time.Now()}
	if kind == session.KindQueue {
		in.Text = args
	}
	if msgID != "" {
		in.PlatformMsgID = "http:" + chatID + ":" + msgID
	}
	data, _ := json.Marshal(in)
	msg := nats.NewMsg(f.names.InboxSubject(session.Partition(f.names.Prefix(), lane), lane))
	msg.Data = data
	msg.Header.Set(broker.HdrSessionKey, key)
	msg.Header.Set(broker.HdrKind, kind)
	var opts []jetstream.PublishOpt
	if msgID != "" {
		opts = append(opts, jetstream.WithMsgID(in.PlatformMsgID))
	}
	ack, err := f.js.PublishMsg(f.t.Context(), msg, opts...)
	if err != nil {
		f.t.Fatal(err)
	}
	return lane, ack.Sequence
}

// replies reads every reply published for a lane, in order.
func (f *fleet) replies(lane string) []session.Reply {
	f.t.Helper()
	var out []session.Reply
	seq := uint64(1)
	for {
		raw, err := f.res.Outbox.GetMsg(f.t.Context(), seq, jetstream.WithGetMsgSubject(f.names.OutboxSubject("http", lane)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out
		}
		if err != nil {
			f.t.Fatal(err)
		}
		var r session.Reply
		if err := json.Unmarshal(raw.Data, &r); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, r)
		seq = raw.Sequence + 1
	}
}

func (f *fleet) waitReplies(lane string, n int) []session.Reply {
	f.t.Helper()
	var got []session.Reply
	natstest.WaitFor(f.t, 20*time.Second, fmt.Sprintf("%d replies on %s", n, lane), func() error {
		got = f.replies(lane)
		if len(got) < n {
			return fmt.Errorf("have %d: %+v", len(got), got)
		}
		return nil
	})
	return got
}

// checkAnsweredOnce checks the lane's outbox against the messages sent to
// it (their texts, in inbox order): every message answered, none twice, in
// order, and nothing else (no notice). The echo agent answers a turn with
// "echo: " and the texts of its messages, one a line (a turn may merge
// several), so each message is one line of the answers.
func (f *fleet) checkAnsweredOnce(lane string, sent ...string) {
	f.t.Helper()
	rs := f.replies(lane)
	var got []string
	ids := map[string]bool{}
	for _, r := range rs {
		if r.Kind != session.ReplyKindReply || !strings.HasPrefix(r.Text, "echo: ") {
			f.t.Errorf("lane %s: a %s %q among the answers", lane, r.Kind, r.Text)
			continue
		}
		if ids[r.ID] {
			f.t.Errorf("lane %s: reply %s published twice", lane, r.ID)
		}
		ids[r.ID] = true
		got = append(got, strings.Split(strings.TrimPrefix(r.Text, "echo: "), "\n")...)
	}
	count := map[string]int{}
	for _, m := range got {
		count[m]++
	}
	for _, m := range sent {
		switch n := count[m]; {
		case n == 0:
			f.t.Errorf("lane %s: %q never answered", lane, m)
		case n > 1:
			f.t.Errorf("lane %s: %q answered %d times", lane, m, n)
		}
	}
	if !slices.Equal(got, sent) {
		f.t.Errorf("lane %s: answers %q, want %q (each message once, in inbox order)", lane, got, sent)
	}
}

func (f *fleet) waitCommitted(lane string, seq uint64) *session.SessionEntry {
	f.t.Helper()
	var e *session.SessionEntry
	natstest.WaitFor(f.t, 20*time.Second, fmt.Sprintf("%s committed to %d", lane, seq), func() error {
		var err error
		e, _, err = f.store.Get(f.t.Context(), lane)
		if err != nil {
			return err
		}
		if e.CommittedSeq < seq || e.Turn != nil {
			return fmt.Errorf("committed %d turn %v", e.CommittedSeq, e.Turn != nil)
		}
		return nil
	})
	return e
}

func TestTurnEndToEnd(t *testing.T) {
	f := newFleet(t)
	f.startWorker("w1", nil)
	lane, seq := f.post("c1", "hello", "m1")
	r := f.waitReplies(lane, 1)
	if got, want := r[0].Text, "echo: hello"; got != want {
		t.Fatalf("reply %q, want %q", got, want)
	}
	e := f.waitCommitted(lane, seq)
	if e.SessionID == "" || !session.ValidSessionID(e.SessionID) {
		t.Fatalf("session id %q", e.SessionID)
	}
	if r[0].ID != fmt.Sprintf("%s:%d", e.SessionID, r[0].TxSeq) {
		t.Fatalf("reply id %q does not derive from its transcript entry", r[0].ID)
	}
	entries, _, err := f.tx.Load(t.Context(), e.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, en := range entries {
		kinds = append(kinds, en.Kind+"/"+en.Role)
	}
	if got, want := strings.Join(kinds, ","), "message/user,message/assistant,turn_end/"; got != want {
		t.Fatalf("transcript %s, want %s", got, want)
	}
	// A second message keeps the session.
	_, seq2 := f.post("c1", "again", "m2")
	f.waitReplies(lane, 2)
	e2 := f.waitCommitted(lane, seq2)
	if e2.SessionID != e.SessionID {
		t.Fatalf("session changed %s -> %s", e.SessionID, e2.SessionID)
	}
}

func TestManyLanesTwoWorkersInOrder(t *testing.T) {
	f := newFleet(t)
	f.startWorker("w1", nil)
	f.startWorker("w2", nil)
	const lanes, per = 10, 6
	var wg sync.WaitGroup
	laneOf := make([]string, lanes)
	for i := 0; i < lanes; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for j := 0; j < per; j++ {
				laneOf[i], _ = f.post(fmt.Sprintf("chat%d", i), fmt.Sprintf("m%d-%d", i, j), fmt.Sprintf("id%d", j))
			}
		}(i)
	}
	wg.Wait()
	for i := 0; i < lanes; i++ {
		lane := laneOf[i]
		var e *session.SessionEntry
		natstest.WaitFor(t, 30*time.Second, "lane drained "+lane, func() error {
			var err error
			e, _, err = f.store.Get(t.Context(), lane)
			if err != nil {
				return err
			}
			entries, _, err := f.tx.Load(t.Context(), e.SessionID)
			if err != nil {
				return err
			}
			var users []string
			for _, en := range transcript.Effective(entries) {
				if en.Role == "user" {
					users = append(users, en.Content)
				}
			}
			if len(users) != per {
				return fmt.Errorf("users %v", users)
			}
			for j, u := range users {
				if want := fmt.Sprintf("m%d-%d", i, j); u != want {
					t.Fatalf("lane %d user entry %d = %q, want %q (all: %v)", i, j, u, want, users)
				}
			}
			if e.Turn != nil {
				return errors.New("turn in flight")
			}
			return nil
		})
	}
}
