package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/transcript"
	"github.com/agentfleet/agentfleet/worker"
)

func runCtl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := run(&out, append([]string{"fleetctl"}, args...))
	return out.String(), err
}

func TestKeyHonoursConfig(t *testing.T) {
	out, err := runCtl(t, "key", "--platform", "telegram", "--chat-type", "group", "--chat-id", "-100123", "--user-id", "42")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(out), "agent:main:telegram:group:-100123:42"; got != want {
		t.Fatalf("key %q, want %q", got, want)
	}
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfg, []byte("group_sessions_per_user: false\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = runCtl(t, "--config", cfg, "key", "--json", "--platform", "telegram", "--chat-type", "group", "--chat-id", "-100123", "--user-id", "42")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		SessionKey string `json:"session_key"`
		Lane       string `json:"lane"`
		Partition  int    `json:"partition"`
		Shared     bool   `json:"shared_multi_user"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("--json output is not one JSON document: %v\n%s", err, out)
	}
	if doc.SessionKey != "agent:main:telegram:group:-100123" || !doc.Shared || doc.Lane != "agent.main.telegram.group.-100123" || doc.Partition < 0 || doc.Partition > 63 {
		t.Fatalf("with group_sessions_per_user false: %+v", doc)
	}
}

func TestKeyRejectsBadInput(t *testing.T) {
	if _, err := runCtl(t, "key", "--platform", "bogus"); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("unknown platform: %v", err)
	}
	if _, err := runCtl(t, "key", "--platform", "telegram", "--chat-id", "../etc"); err == nil {
		t.Fatal("path traversal in chat id accepted")
	}
}

func TestTranscriptRejectsBadSessionID(t *testing.T) {
	if _, err := runCtl(t, "transcript", "not/a session"); err == nil || !strings.Contains(err.Error(), "not a session key, lane or SESSION_ID") {
		t.Fatalf("bad session id: %v", err)
	}
}

// TestSessionInfoCountsInboxBacklog: `session info` counts what waits in
// the lane's inbox above committed_seq now (the entry's queue_depth is as
// of its last turn), and names the default busy mode of a lane that chose
// none.
func TestSessionInfoCountsInboxBacklog(t *testing.T) {
	srv := natstest.RunServer(t)
	js := natstest.JetStream(t, srv.Connect(t))
	names := broker.MustNames("fleet")
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names})
	if err != nil {
		t.Fatal(err)
	}
	src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: "c1", ChatType: session.ChatDM}
	key := session.BuildSessionKey(src, session.DefaultKeyOptions())
	lane := session.LaneToken(key)
	publish := func(kind string) uint64 {
		t.Helper()
		m := nats.NewMsg(names.InboxSubject(session.Partition(names.Prefix(), lane), lane))
		m.Header.Set(broker.HdrKind, kind)
		m.Header.Set(broker.HdrSessionKey, key)
		m.Data = []byte(`{}`)
		ack, err := js.PublishMsg(t.Context(), m)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	done := publish(session.KindMessage) // committed below
	publish(session.KindQueue)
	publish(session.KindMessage)
	publish(session.KindQueue)
	publish(session.KindCommand)
	store := kv.NewStore(res, nil)
	if _, _, err := store.Mutate(t.Context(), lane, nil, 0, nil, func(*session.SessionEntry) (*session.SessionEntry, error) {
		return &session.SessionEntry{SessionKey: key, SessionID: "20260101_000000_abcdef01", InboxID: res.InboxID, CommittedSeq: done}, nil
	}); err != nil {
		t.Fatal(err)
	}

	t.Setenv("NATS_URL", srv.URL())
	out, err := runCtl(t, "session", "info", "--json", key)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		QueueDepth int `json:"queue_depth"`
		Pending    int `json:"pending"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if doc.QueueDepth != 2 || doc.Pending != 4 {
		t.Fatalf("queue_depth %d pending %d, want 2 and 4", doc.QueueDepth, doc.Pending)
	}
	out, err = runCtl(t, "session", "info", key)
	if err != nil {
		t.Fatal(err)
	}
	flat := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{"queue_depth: 2 ", "pending_messages: 4 ", "busy_mode: interrupt (default) "} {
		if !strings.Contains(flat, want) {
			t.Errorf("text output lacks %q:\n%s", want, out)
		}
	}
}

func TestTranscriptUnknownSession(t *testing.T) {
	srv := natstest.RunServer(t)
	js := natstest.JetStream(t, srv.Connect(t))
	if _, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NATS_URL", srv.URL())
	if _, err := runCtl(t, "transcript", "20260101_000000_abcdef01"); err == nil || !strings.Contains(err.Error(), "no session 20260101_000000_abcdef01") {
		t.Fatalf("unknown session: %v", err)
	}
}

// TestUnknownKeySaysSoInTheUsersWords: session info, lane show and
// transcript of a key with no session say "no session <key>", as typed,
// not the store's "session <lane>: not found" (transcript said it twice).
func TestUnknownKeySaysSoInTheUsersWords(t *testing.T) {
	srv := natstest.RunServer(t)
	js := natstest.JetStream(t, srv.Connect(t))
	if _, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NATS_URL", srv.URL())
	const key = "agent:main:http:dm:nosuch"
	for _, args := range [][]string{{"session", "info", key}, {"session", "info", key, "--json"}, {"lane", "show", key}, {"transcript", key}, {"transcript", "nosuch"}} {
		_, err := runCtl(t, args...)
		want := "no session " + args[len(args)-1]
		if args[len(args)-1] == "--json" {
			want = "no session " + key
		}
		if err == nil || !strings.Contains(err.Error(), want) || strings.Count(err.Error(), "session") > 2 {
			t.Errorf("fleetctl %v: error %v, want one mentioning %q", args, err, want)
		}
	}
}

// TestWaitsForNATS: fleetctl started before NATS waits for it (within its
// --timeout) instead of failing at once; with nothing to wait for it fails
// with a clear error once --timeout has passed.
func TestWaitsForNATS(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	t.Setenv("AGENTFLEET_NATS_URL", fmt.Sprintf("nats://127.0.0.1:%d", port))

	_, err = runCtl(t, "--timeout", "1s", "worker", "ls")
	if err == nil || !strings.Contains(err.Error(), "nats not reachable at nats://127.0.0.1:") {
		t.Fatalf("no NATS: %v", err)
	}
	// What ended the wait is --timeout: the error says to raise that, not
	// nats.connect_wait (1m already).
	if !strings.Contains(err.Error(), "raise it to wait longer") || !strings.Contains(err.Error(), "--timeout") || strings.Contains(err.Error(), "connect_wait") {
		t.Fatalf("no NATS: the error does not point at --timeout: %v", err)
	}

	// A provisioned store, served later on the port fleetctl tries (so
	// fleetctl never sees the server before the fleet's assets exist).
	store := t.TempDir()
	first := natstest.RunServer(t, natstest.WithStoreDir(store))
	nc := first.Connect(t)
	if _, err := broker.Provision(t.Context(), natstest.JetStream(t, nc), broker.ProvisionConfig{}); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	first.Shutdown()
	first.WaitForShutdown()

	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		var out bytes.Buffer
		err := newApp(&out).Run([]string{"fleetctl", "--timeout", "2m", "worker", "ls", "--json"})
		done <- result{out.String(), err}
	}()
	natstest.RunServer(t, natstest.WithPort(port), natstest.WithStoreDir(store))
	select {
	case r := <-done:
		if r.err != nil || !strings.Contains(r.out, `"workers"`) {
			t.Fatalf("fleetctl started before NATS: %v\n%s", r.err, r.out)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("fleetctl did not finish")
	}
}

// TestWorkerLsShowsOwner: `worker ls` names a worker the way logs, leases
// and session entries do, <worker id>/<incarnation>.
func TestWorkerLsShowsOwner(t *testing.T) {
	srv := natstest.RunServer(t)
	js := natstest.JetStream(t, srv.Connect(t))
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(worker.WorkerRecord{ID: "host-42", Owner: "host-42/0a1b2c3d", State: worker.StateRunning, Host: "host", PID: 42, HeartbeatAt: time.Now()})
	if _, err := res.Workers.Put(t.Context(), session.LaneToken("host-42"), rec); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NATS_URL", srv.URL())
	out, err := runCtl(t, "worker", "ls")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "WORKER") || !strings.Contains(out, "host-42/0a1b2c3d ") {
		t.Fatalf("worker ls does not show the owner id:\n%s", out)
	}
}

// TestHumanOutputEscapesTerminalControls is issue 12's fleetctl defect: a
// user's text with an escape sequence, a carriage return or a bidi
// override reached the operator's terminal raw. Human output escapes them;
// --json stays exact.
func TestHumanOutputEscapesTerminalControls(t *testing.T) {
	srv := natstest.RunServer(t)
	js := natstest.JetStream(t, srv.Connect(t))
	names := broker.MustNames("fleet")
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names})
	if err != nil {
		t.Fatal(err)
	}
	const evil = "hi\x1b[2J\rroot\u202eexe.txt\n9 fake line"
	sid := "20260101_000000_abcdef01"
	log, err := transcript.New(js, names, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := log.Append(t.Context(), sid, 0, &transcript.Entry{ID: "e1", Kind: transcript.KindMessage, Role: "user", Content: evil}); err != nil {
		t.Fatal(err)
	}
	src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: "c1", ChatType: session.ChatDM}
	key := session.BuildSessionKey(src, session.DefaultKeyOptions())
	lane := session.LaneToken(key)
	store := kv.NewStore(res, nil)
	if _, _, err := store.Mutate(t.Context(), lane, nil, 0, nil, func(*session.SessionEntry) (*session.SessionEntry, error) {
		return &session.SessionEntry{SessionKey: key, SessionID: sid, Owner: "w\x1b]0;pwned\x07", ResumeReason: "x\u2066y"}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := store.Index(t.Context(), sid, kv.IndexRecord{Lane: lane, SessionKey: key}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NATS_URL", srv.URL())
	for _, args := range [][]string{{"transcript", sid}, {"session", "info", key}, {"session", "ls"}} {
		out, err := runCtl(t, args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		for _, bad := range []string{"\x1b", "\r", "\u202e", "\u2066", "\x07", "\n9 fake"} {
			if strings.Contains(out, bad) {
				t.Errorf("%v prints %q raw:\n%s", args, bad, out)
			}
		}
	}
	out, _ := runCtl(t, "transcript", sid)
	if !strings.Contains(out, `hi\x1b[2J\rroot\u202eexe.txt\n9 fake line`) {
		t.Errorf("transcript text not shown escaped:\n%s", out)
	}
	out, err = runCtl(t, "transcript", "--json", sid)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Entries []struct {
			Content string `json:"content"`
		} `json:"entries"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || len(doc.Entries) != 1 || doc.Entries[0].Content != evil {
		t.Fatalf("--json is not exact: %v %+v", err, doc)
	}
}

// TestDeliveryFailures: the delivery_failed events of the events stream are
// listed, filtered by platform, as a table and as one JSON document.
func TestDeliveryFailures(t *testing.T) {
	ns := natstest.RunServer(t)
	nc := ns.Connect(t)
	js := natstest.JetStream(t, nc)
	names := broker.MustNames("fleet")
	if _, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names}); err != nil {
		t.Fatal(err)
	}
	for i, p := range []session.Platform{session.PlatformTelegram, session.PlatformSlack} {
		f := ingress.DeliveryFailure{Platform: p, ReplyID: fmt.Sprintf("sid:%d", i), SessionKey: "agent:main:" + string(p) + ":dm:1",
			Attempts: 8, Chunks: 2, SentChunks: 1, Error: "outcome unknown: 502", FailedAt: time.Now().UTC()}
		data, _ := json.Marshal(f)
		if _, err := js.Publish(t.Context(), names.EventSubject(broker.DeliveryFailedKind, "agent.main.x.dm.1"), data); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("NATS_URL", ns.URL())
	out, err := runCtl(t, "delivery", "failures")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "sid:0") || !strings.Contains(out, "sid:1") || !strings.Contains(out, "1/2") || !strings.Contains(out, "outcome unknown: 502") {
		t.Fatalf("table:\n%s", out)
	}
	out, err = runCtl(t, "delivery", "failures", "--json", "--platform", "slack")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Failures []DeliveryFailureView `json:"failures"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(doc.Failures) != 1 || doc.Failures[0].ReplyID != "sid:1" || doc.Failures[0].Seq == 0 {
		t.Fatalf("--platform slack: %+v", doc.Failures)
	}
	out, err = runCtl(t, "delivery", "failures", "--json", "--since", "1h")
	if err != nil || !strings.Contains(out, "sid:0") {
		t.Fatalf("--since 1h: %v\n%s", err, out)
	}
}
