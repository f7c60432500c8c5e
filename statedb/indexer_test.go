package statedb_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/statedb"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/transcript"
	"github.com/agentfleet/agentfleet/worker"
)

// fleet is a provisioned embedded server with the handles a workload needs.
type fleet struct {
	srv   *natstest.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	res   *broker.Resources
	names broker.Names
	tx    *transcript.Log
	store *kv.Store
	last  map[string]uint64 // per session: last transcript seq
}

func startFleet(t *testing.T) *fleet {
	t.Helper()
	srv := natstest.RunServer(t)
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	names := broker.MustNames("fleet")
	res, err := broker.Provision(context.Background(), js, broker.ProvisionConfig{Names: names})
	if err != nil {
		t.Fatal(err)
	}
	log, err := transcript.New(js, names, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &fleet{srv: srv, nc: nc, js: js, res: res, names: names, tx: log, store: kv.NewStore(res, nil), last: map[string]uint64{}}
}

func (f *fleet) newSession(t *testing.T, key, title, parent string, at time.Time) string {
	t.Helper()
	sid := session.NewSessionID(at)
	lane := session.LaneToken(key)
	if err := f.store.Index(context.Background(), sid, kv.IndexRecord{Lane: lane, SessionKey: key, CreatedAt: at, ParentSessionID: parent, Title: title}); err != nil {
		t.Fatal(err)
	}
	return sid
}

func (f *fleet) append(t *testing.T, sid string, e transcript.Entry) uint64 {
	t.Helper()
	seq, err := f.tx.Append(context.Background(), sid, f.last[sid], &e)
	if err != nil {
		t.Fatal(err)
	}
	f.last[sid] = seq
	return seq
}

func (f *fleet) event(t *testing.T, kind, lane string, v any) {
	t.Helper()
	data, _ := json.Marshal(v)
	if _, err := f.js.Publish(context.Background(), f.names.EventSubject(kind, lane), data); err != nil {
		t.Fatal(err)
	}
}

func (f *fleet) lastSeqs(t *testing.T) (uint64, uint64) {
	t.Helper()
	ti, err := f.res.Transcripts.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ei, err := f.res.Events.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return ti.State.LastSeq, ei.State.LastSeq
}

// waitIndexed waits until the file holds every message of both streams.
func waitIndexed(t *testing.T, f *fleet, db *statedb.DB) {
	t.Helper()
	tx, ev := f.lastSeqs(t)
	natstest.WaitFor(t, 180*time.Second, "the indexer to catch up", func() error {
		a, b, err := db.Cursors(context.Background())
		if err != nil {
			return err
		}
		if a < tx || b < ev {
			return fmt.Errorf("cursors tx %d/%d ev %d/%d", a, tx, b, ev)
		}
		return nil
	})
}

func runIndexer(t *testing.T, f *fleet, db *statedb.DB, name string) func() {
	t.Helper()
	ix, err := statedb.NewIndexer(f.res, db, statedb.IndexerConfig{Names: f.names, Name: name, BatchSize: 64})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ix.Run(ctx) }()
	stop := func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("indexer: %v", err)
		}
	}
	t.Cleanup(func() {
		select {
		case <-ctx.Done():
		default:
			stop()
		}
	})
	return stop
}

const keyTelegram = "agent:main:telegram:dm:42"
const keySlack = "agent:main:slack:group:C1:u7"

// story writes a conversation with every kind of change the indexer maps:
// titles, a /new with lineage, a rewind, a /resume back, a finalize, usage.
type storyIDs struct{ s1, s2, s3 string }

func writeStory(t *testing.T, f *fleet) storyIDs {
	base := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	lane1, lane2 := session.LaneToken(keyTelegram), session.LaneToken(keySlack)
	s1 := f.newSession(t, keyTelegram, "Project", "", base)
	f.append(t, s1, transcript.Entry{Kind: transcript.KindFence, Epoch: 1, Owner: "w1", Timestamp: base})
	f.append(t, s1, transcript.Entry{Kind: transcript.KindMessage, Role: "user", Content: "plan the kubernetes migration", TurnID: "t1", Timestamp: base.Add(time.Second)})
	f.append(t, s1, transcript.Entry{Kind: transcript.KindMessage, Role: "assistant", ToolCalls: []transcript.ToolCall{{ID: "c1", Name: "terminal", Arguments: `{"cmd":"kubectl get pods"}`}}, TurnID: "t1", Timestamp: base.Add(2 * time.Second)})
	f.append(t, s1, transcript.Entry{Kind: transcript.KindMessage, Role: "tool", ToolCallID: "c1", ToolName: "terminal", Content: "3 pods running", TurnID: "t1", Timestamp: base.Add(3 * time.Second)})
	f.append(t, s1, transcript.Entry{Kind: transcript.KindMessage, Role: "assistant", Content: "Here is the migration plan.", TokenCount: 40, FinishReason: "stop", TurnID: "t1", Timestamp: base.Add(4 * time.Second)})
	f.append(t, s1, transcript.Entry{Kind: transcript.KindTurnEnd, TurnID: "t1", Status: transcript.StatusCompleted, Timestamp: base.Add(5 * time.Second)})
	f.event(t, "turn", lane1, worker.TurnEvent{Type: "end", Lane: lane1, TurnID: "t1", SessionID: s1, Status: "completed", InputTokens: 120, OutputTokens: 40})
	u2 := f.append(t, s1, transcript.Entry{Kind: transcript.KindMessage, Role: "user", Content: "wrong question about bananas", TurnID: "t2", Timestamp: base.Add(6 * time.Second)})
	a2 := f.append(t, s1, transcript.Entry{Kind: transcript.KindMessage, Role: "assistant", Content: "bananas are yellow", TokenCount: 5, TurnID: "t2", Timestamp: base.Add(7 * time.Second)})
	f.append(t, s1, transcript.Entry{Kind: transcript.KindTurnEnd, TurnID: "t2", Status: transcript.StatusCompleted, Timestamp: base.Add(8 * time.Second)})
	// /undo
	f.append(t, s1, transcript.Entry{Kind: transcript.KindRewind, Rewound: []uint64{u2, a2}, TurnID: "t3", Timestamp: base.Add(9 * time.Second)})
	// /new Project → "Project #2", a child of s1
	s2 := f.newSession(t, keyTelegram, "Project #2", s1, base.Add(time.Minute))
	f.append(t, s1, transcript.Entry{Kind: transcript.KindClosed, NextSessionID: s2, Reason: session.ReasonNew, TurnID: "t4", Timestamp: base.Add(time.Minute)})
	f.append(t, s2, transcript.Entry{Kind: transcript.KindMessage, Role: "user", Content: "second chapter of the project", TurnID: "t5", Timestamp: base.Add(61 * time.Second)})
	// /resume s1: s2 closes, s1 reopens
	f.append(t, s2, transcript.Entry{Kind: transcript.KindClosed, NextSessionID: s1, Reason: session.ReasonResume, TurnID: "t6", Timestamp: base.Add(2 * time.Minute)})
	f.append(t, s1, transcript.Entry{Kind: transcript.KindMessage, Role: "user", Content: "back to the first one", TurnID: "t7", Timestamp: base.Add(121 * time.Second)})
	// Another conversation whose KV title is also "Project".
	s3 := f.newSession(t, keySlack, "Project", "", base.Add(time.Hour))
	f.append(t, s3, transcript.Entry{Kind: transcript.KindMessage, Role: "user", Content: "我想部署一个新的服务器", TurnID: "t8", Timestamp: base.Add(time.Hour)})
	f.event(t, "finalize", lane2, map[string]any{"session_id": s3, "session_key": keySlack, "reason": "expired"})
	// /title renames s1 (the KV index keeps the new title; the event carries it).
	f.event(t, "title", lane1, map[string]any{"session_id": s1, "title": "Kubernetes Plan"})
	return storyIDs{s1, s2, s3}
}

func TestIndexerStory(t *testing.T) {
	t.Parallel()
	f := startFleet(t)
	ids := writeStory(t, f)
	// Garbage on a transcript or event subject is skipped, not fatal.
	for subj, data := range map[string]string{
		f.names.TranscriptSubject(ids.s3):                     `not json`,
		f.names.TranscriptSubject("20260501_120000_00000000"): `{"kind":"message","role":"","content":"no role"}`,
		f.names.EventSubject("finalize", "x"):                 `{"session_id":"not a session id"}`,
	} {
		if _, err := f.js.Publish(context.Background(), subj, []byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	db := openTemp(t)
	stop := runIndexer(t, f, db, "story")
	waitIndexed(t, f, db)
	ctx := context.Background()

	s1, err := db.GetSession(ctx, ids.s1)
	if err != nil {
		t.Fatal(err)
	}
	if s1.Source != "telegram" || s1.Title != "Kubernetes Plan" || s1.EndedAt != nil || s1.InputTokens != 120 || s1.OutputTokens != 45 ||
		s1.APICallCount != 2 || s1.MessageCount != 5 || s1.ToolCallCount != 1 {
		t.Fatalf("s1 %+v", s1)
	}
	msgs, _ := db.GetMessages(ctx, ids.s1)
	if len(msgs) != 5 || msgs[1].ToolCalls == nil || !strings.Contains(string(msgs[1].ToolCalls), `"name":"terminal"`) || msgs[4].Content != "back to the first one" {
		t.Fatalf("s1 messages %+v", msgs)
	}
	// The rewound turn is soft-deleted: kept in the export, out of search.
	if res, _ := db.SearchMessages(ctx, "bananas", statedb.SearchOptions{}); len(res) != 0 {
		t.Fatalf("rewound message searchable: %+v", res)
	}
	ex, _ := db.ExportSession(ctx, ids.s1)
	deleted := 0
	for _, m := range ex.Messages {
		if m.DeletedAt != nil {
			deleted++
		}
	}
	if deleted != 2 || len(ex.Messages) != 7 {
		t.Fatalf("export: %d messages, %d deleted", len(ex.Messages), deleted)
	}
	if _, err := db.GetSession(ctx, "20260501_120000_00000000"); !errors.Is(err, statedb.ErrNotFound) {
		t.Fatalf("a message without a role made a session: %v", err)
	}
	s2, _ := db.GetSession(ctx, ids.s2)
	if s2.Title != "Project #2" || s2.ParentSessionID != ids.s1 || s2.EndedAt == nil || s2.EndReason != session.ReasonResume {
		t.Fatalf("s2 %+v", s2)
	}
	s3, _ := db.GetSession(ctx, ids.s3)
	if s3.Source != "slack" || s3.Title != "Project #3" || s3.EndReason != statedb.EndReasonExpired {
		t.Fatalf("s3 %+v", s3)
	}
	if res, _ := db.SearchMessages(ctx, "部署", statedb.SearchOptions{}); len(res) != 1 || res[0].SessionID != ids.s3 {
		t.Fatalf("CJK search: %+v", res)
	}
	if res, _ := db.SearchMessages(ctx, "kubectl", statedb.SearchOptions{}); len(res) != 1 || res[0].Role != "assistant" {
		t.Fatalf("tool call search: %+v", res)
	}
	anc, _ := db.Ancestors(ctx, ids.s2)
	if len(anc) != 2 || anc[1].ID != ids.s1 || anc[1].Title != "Kubernetes Plan" {
		t.Fatalf("lineage %+v", anc)
	}
	if id, _ := db.ResolveSessionByTitle(ctx, "Project"); id != ids.s3 {
		t.Fatalf("resolve Project = %s", id)
	}
	// Each session carries its lane: /resume lists one conversation's
	// named sessions, ended ones included, newest first.
	byLane, err := db.ListSessions(ctx, statedb.ListOptions{Lane: session.LaneToken(keyTelegram), Titled: true})
	if err != nil || len(byLane) != 2 || byLane[0].ID != ids.s2 || byLane[1].ID != ids.s1 || byLane[0].EndedAt == nil ||
		byLane[0].Lane != session.LaneToken(keyTelegram) {
		t.Fatalf("sessions of the telegram lane: %+v %v", byLane, err)
	}
	if other, err := db.ListSessions(ctx, statedb.ListOptions{Lane: session.LaneToken(keySlack)}); err != nil || len(other) != 1 || other[0].ID != ids.s3 {
		t.Fatalf("sessions of the slack lane: %+v %v", other, err)
	}

	// A restart applies nothing twice; new entries are picked up.
	stop()
	before := dump(t, db)
	runIndexer(t, f, db, "story")
	f.append(t, ids.s2, transcript.Entry{Kind: transcript.KindMessage, Role: "user", Content: "after the restart", Timestamp: time.Date(2026, 5, 2, 0, 0, 0, 0, time.UTC)})
	waitIndexed(t, f, db)
	after := dump(t, db)
	// One message row and its two FTS rows more, nothing applied twice.
	if strings.Count(after, "\n") != strings.Count(before, "\n")+3 {
		t.Fatalf("after restart:\n%s\nbefore:\n%s", after, before)
	}
	if m, _ := db.GetMessages(ctx, ids.s2); len(m) != 2 || m[1].Content != "after the restart" {
		t.Fatalf("s2 after restart: %+v", m)
	}
	if s, _ := db.GetSession(ctx, ids.s2); s.MessageCount != 2 {
		t.Fatalf("s2 count after restart: %+v", s)
	}
}

// dump renders the file's tables in a stable order, for comparisons.
func dump(t *testing.T, db *statedb.DB) string {
	t.Helper()
	s, err := db.Dump(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// writeBulk adds many sessions and messages (with rewinds and closes).
func writeBulk(t *testing.T, f *fleet, sessions, perSession int) {
	base := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	prev := ""
	for i := 0; i < sessions; i++ {
		key := fmt.Sprintf("agent:main:http:dm:user%d", i%5)
		at := base.Add(time.Duration(i) * time.Minute)
		sid := f.newSession(t, key, fmt.Sprintf("Topic %d", i%7), prev, at)
		var seqs []uint64
		for j := 0; j < perSession; j++ {
			role := "user"
			if j%2 == 1 {
				role = "assistant"
			}
			seqs = append(seqs, f.append(t, sid, transcript.Entry{Kind: transcript.KindMessage, Role: role, TokenCount: j,
				Content: fmt.Sprintf("session %d message %d about deployment number %d", i, j, i*perSession+j), Timestamp: at.Add(time.Duration(j) * time.Second)}))
			if j%4 == 3 {
				f.append(t, sid, transcript.Entry{Kind: transcript.KindTurnEnd, TurnID: fmt.Sprintf("t%d-%d", i, j), Status: transcript.StatusCompleted, Timestamp: at.Add(time.Duration(j) * time.Second)})
				f.event(t, "turn", session.LaneToken(key), worker.TurnEvent{Type: "end", SessionID: sid, InputTokens: int64(j)})
			}
		}
		if i%3 == 0 && len(seqs) >= 2 {
			f.append(t, sid, transcript.Entry{Kind: transcript.KindRewind, Rewound: seqs[len(seqs)-2:], Timestamp: at.Add(time.Hour)})
		}
		if prev != "" {
			f.append(t, prev, transcript.Entry{Kind: transcript.KindClosed, NextSessionID: sid, Reason: session.ReasonIdle, Timestamp: at})
		}
		prev = sid
	}
}

// Kill -9 the indexer process in the middle of a batch transaction;
// after a restart the file equals one built from scratch.
func TestIndexerKilledMidBatchEqualsScratch(t *testing.T) {
	t.Parallel()
	f := startFleet(t)
	writeStory(t, f)
	writeBulk(t, f, 12, 20)
	dir := t.TempDir()
	path := filepath.Join(dir, "crash.db")
	marker := filepath.Join(dir, "in-batch")

	start := func(hook bool) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "STATEDB_HELPER=indexer", "STATEDB_PATH="+path, "STATEDB_NATS_URL="+f.srv.ClientURL())
		if hook {
			cmd.Env = append(cmd.Env, "STATEDB_BLOCK_IN_BATCH="+marker, "STATEDB_BLOCK_AT=3")
		}
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	cmd := start(true)
	natstest.WaitFor(t, 60*time.Second, "the indexer to block inside its 3rd batch", func() error {
		_, err := os.Stat(marker)
		return err
	})
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	ctx := context.Background()
	ro, err := statedb.Open(ctx, path, &statedb.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	txc, _, err := ro.Cursors(ctx)
	if err != nil {
		t.Fatal(err)
	}
	last, _ := f.lastSeqs(t)
	if txc == 0 || txc >= last {
		t.Fatalf("killed at cursor %d of %d: not mid-stream", txc, last)
	}

	cmd = start(false)
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	waitIndexed(t, f, ro)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("indexer exit: %v", err)
	}

	scratch := openTemp(t)
	runIndexer(t, f, scratch, "scratch")
	waitIndexed(t, f, scratch)
	got, want := dump(t, ro), dump(t, scratch)
	if got != want {
		t.Fatalf("the restarted file differs from a scratch build:\n%s", firstDiff(got, want))
	}
	if !strings.Contains(got, "Topic 3 #") {
		t.Fatalf("the dump lacks lineage titles:\n%.2000s", got)
	}
}

func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < min(len(al), len(bl)); i++ {
		if al[i] != bl[i] {
			return fmt.Sprintf("line %d:\n got  %s\n want %s", i, al[i], bl[i])
		}
	}
	return fmt.Sprintf("lengths %d and %d lines", len(al), len(bl))
}

// runIndexerHelper runs an indexer in a helper process until SIGTERM.
func runIndexerHelper(mode string) int {
	if mode != "indexer" {
		fmt.Fprintln(os.Stderr, "unknown helper", mode)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if marker := os.Getenv("STATEDB_BLOCK_IN_BATCH"); marker != "" {
		at, _ := strconv.Atoi(os.Getenv("STATEDB_BLOCK_AT"))
		n := 0
		statedb.SetTestHookInBatch(func() {
			n++
			if n == at {
				_ = os.WriteFile(marker, nil, 0o644)
				select {} // hold the transaction open until the kill
			}
		})
	}
	nc, err := nats.Connect(os.Getenv("STATEDB_NATS_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	names := broker.MustNames("fleet")
	res, err := broker.Provision(ctx, js, broker.ProvisionConfig{Names: names})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	db, err := statedb.Open(ctx, os.Getenv("STATEDB_PATH"), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer db.Close()
	ix, err := statedb.NewIndexer(res, db, statedb.IndexerConfig{Names: names, Name: "crash", BatchSize: 50})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := ix.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
