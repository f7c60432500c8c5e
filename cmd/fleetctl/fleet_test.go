package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

// liveFleet is an embedded NATS server with the fleet provisioned and one
// real worker (echo agent) running on it.
type liveFleet struct {
	t     *testing.T
	srv   *natstest.Server
	js    jetstream.JetStream
	res   *broker.Resources
	names broker.Names
	w     *worker.Worker
}

func startLiveFleet(t *testing.T) *liveFleet {
	t.Helper()
	srv := natstest.RunServer(t)
	nc := srv.Connect(t)
	js := natstest.JetStream(t, nc)
	names := broker.MustNames("fleet")
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	f := &liveFleet{t: t, srv: srv, js: js, res: res, names: names}
	wnc := srv.Connect(t)
	wjs := natstest.JetStream(t, wnc)
	wres, err := broker.Provision(t.Context(), wjs, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(wnc, wjs, wres, worker.Config{ID: "live-1", Version: "9.9.9-test", Names: names, Backend: echo.Backend(echo.Options{}),
		LeaseTTL: 3 * time.Second, LeaseMargin: 500 * time.Millisecond, Linger: 30 * time.Second, PeekInterval: 100 * time.Millisecond,
		DrainTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	f.w = w
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("worker: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("worker did not stop")
			}
		})
	})
	t.Setenv("NATS_URL", srv.URL())
	t.Setenv("AGENTFLEET_LEASE_TTL", "3s") // the fleet's, for stream report's checks
	t.Setenv("AGENTFLEET_LEASE_MARGIN", "500ms")
	t.Setenv("XDG_CONFIG_HOME", t.TempDir()) // no nats context of the machine's user
	return f
}

// post publishes a user message into the lane as an ingress would and
// returns the session key and inbox seq.
func (f *liveFleet) post(chatID, text string) (string, uint64) {
	f.t.Helper()
	src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: chatID, ChatType: session.ChatDM, UserID: "u-" + chatID}
	key := session.BuildSessionKey(src, session.DefaultKeyOptions())
	lane := session.LaneToken(key)
	kind, cmd, args := session.Classify(text)
	in := session.Inbound{Source: src, SessionKey: key, Kind: kind, Text: text, Command: cmd, Args: args, ReceivedAt: time.Now()}
	data, _ := json.Marshal(in)
	msg := nats.NewMsg(f.names.InboxSubject(session.Partition(f.names.Prefix(), lane), lane))
	msg.Data = data
	msg.Header.Set(broker.HdrSessionKey, key)
	msg.Header.Set(broker.HdrKind, kind)
	ack, err := f.js.PublishMsg(f.t.Context(), msg)
	if err != nil {
		f.t.Fatal(err)
	}
	return key, ack.Sequence
}

// jsonCtl runs fleetctl and decodes its output, which must be exactly one
// JSON document.
func jsonCtl(t *testing.T, out any, args ...string) {
	t.Helper()
	s, err := runCtl(t, args...)
	if err != nil {
		t.Fatalf("fleetctl %s: %v", strings.Join(args, " "), err)
	}
	if err := decodeOne(s, out); err != nil {
		t.Fatalf("fleetctl %s: %v\n%s", strings.Join(args, " "), err, s)
	}
}

func decodeOne(s string, out any) error {
	dec := json.NewDecoder(strings.NewReader(s))
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("not a JSON document: %w", err)
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); err == nil {
		return errors.New("more than one JSON document")
	}
	return nil
}

// waitCommitted waits for the lane's entry to have committed seq with no
// turn in flight.
func (f *liveFleet) waitCommitted(key string, seq uint64) {
	f.t.Helper()
	natstest.WaitFor(f.t, 30*time.Second, "the turn to be committed", func() error {
		var doc struct {
			CommittedSeq uint64          `json:"committed_seq"`
			Turn         json.RawMessage `json:"turn"`
		}
		s, err := runCtl(f.t, "lane", "show", key, "--json")
		if err != nil {
			return err
		}
		if err := decodeOne(s, &doc); err != nil {
			return err
		}
		if doc.CommittedSeq < seq || (len(doc.Turn) > 0 && string(doc.Turn) != "null") {
			return fmt.Errorf("committed %d, turn %s", doc.CommittedSeq, doc.Turn)
		}
		return nil
	})
}

// waitEntry waits for the lane's entry to have committed seq, reading the
// bucket directly (no fleetctl run).
func (f *liveFleet) waitEntry(key string, seq uint64) {
	f.t.Helper()
	natstest.WaitFor(f.t, 30*time.Second, "the turn to be committed", func() error {
		e, err := f.res.Sessions.Get(f.t.Context(), session.LaneToken(key))
		if err != nil {
			return err
		}
		var se session.SessionEntry
		if err := json.Unmarshal(e.Value(), &se); err != nil {
			return err
		}
		if se.CommittedSeq < seq || se.Turn != nil {
			return fmt.Errorf("committed %d", se.CommittedSeq)
		}
		return nil
	})
}

// TestCommandsAgainstLiveFleet runs the inspection commands against a live
// fleet and checks what their JSON says.
func TestCommandsAgainstLiveFleet(t *testing.T) {
	f := startLiveFleet(t)
	key, seq := f.post("live-1", "hello fleet")
	f.waitCommitted(key, seq)
	lane := session.LaneToken(key)

	var ls struct {
		Sessions []session.SessionEntry `json:"sessions"`
	}
	jsonCtl(t, &ls, "session", "ls", "--json")
	if len(ls.Sessions) != 1 || ls.Sessions[0].SessionKey != key || ls.Sessions[0].CommittedSeq != seq {
		t.Fatalf("session ls: %+v", ls)
	}
	sid := ls.Sessions[0].SessionID
	jsonCtl(t, &ls, "session", "ls", "--json", "--platform", "telegram")
	if len(ls.Sessions) != 0 {
		t.Errorf("session ls --platform telegram lists %d", len(ls.Sessions))
	}
	jsonCtl(t, &ls, "session", "ls", "--json", "--state", "busy")
	if len(ls.Sessions) != 0 {
		t.Errorf("session ls --state busy lists an idle session")
	}
	jsonCtl(t, &ls, "session", "ls", "--json", "--platform", "http", "--active", "1h")
	if len(ls.Sessions) != 1 {
		t.Errorf("session ls --platform http --active 1h lists %d", len(ls.Sessions))
	}
	if _, err := runCtl(t, "session", "ls", "--state", "sleepy"); err == nil || !strings.Contains(err.Error(), "sleepy") {
		t.Errorf("--state sleepy: %v", err)
	}

	// info by key, lane and session id.
	for _, arg := range []string{key, lane, sid} {
		var info struct {
			Lane  string               `json:"lane"`
			Entry session.SessionEntry `json:"entry"`
		}
		jsonCtl(t, &info, "session", "info", arg, "--json")
		if info.Lane != lane || info.Entry.SessionID != sid {
			t.Errorf("session info %s: %+v", arg, info)
		}
	}

	var hist struct {
		Lane      string        `json:"lane"`
		History   int           `json:"bucket_history"`
		Revisions []entryChange `json:"revisions"`
	}
	jsonCtl(t, &hist, "session", "history", key, "--json")
	if hist.Lane != lane || len(hist.Revisions) == 0 || hist.Revisions[len(hist.Revisions)-1].Entry.CommittedSeq != seq || hist.History < 1 {
		t.Errorf("session history: %+v", hist)
	}

	var show struct {
		Lane  string `json:"lane"`
		Lease *struct {
			Owner string `json:"owner"`
			Epoch uint64 `json:"epoch"`
		} `json:"lease"`
		EntryOwner string `json:"entry_owner"`
		EntryEpoch uint64 `json:"entry_epoch"`
		Committed  uint64 `json:"committed_seq"`
		Backlog    int    `json:"backlog"`
	}
	jsonCtl(t, &show, "lane", "show", key, "--json")
	// The worker lingers (30s) on the lane after the turn: it holds it.
	if show.Lane != lane || show.Lease == nil || show.Lease.Owner != f.w.Owner() || show.Lease.Epoch != show.EntryEpoch || show.Committed != seq || show.Backlog != 0 {
		t.Errorf("lane show: %+v (lease %+v), want the lease of %s", show, show.Lease, f.w.Owner())
	}

	var workers struct {
		Workers []workerDoc `json:"workers"`
	}
	natstest.WaitFor(t, 30*time.Second, "the worker's heartbeat to count its lane", func() error {
		s, err := runCtl(t, "worker", "ls", "--json")
		if err != nil {
			return err
		}
		if err := decodeOne(s, &workers); err != nil {
			return err
		}
		if len(workers.Workers) != 1 || workers.Workers[0].LanesOwned != 1 {
			return fmt.Errorf("%+v", workers.Workers)
		}
		return nil
	})
	wd := workers.Workers[0]
	if wd.Owner != f.w.Owner() || wd.Version != "9.9.9-test" || wd.Incarnation == "" || !strings.HasSuffix(wd.Owner, "/"+wd.Incarnation) {
		t.Errorf("worker ls: %+v", wd)
	}
	var one workerDoc
	jsonCtl(t, &one, "worker", "info", "live-1", "--json")
	if one.Owner != f.w.Owner() {
		t.Errorf("worker info: %+v", one)
	}
	if _, err := runCtl(t, "worker", "info", "nobody"); err == nil {
		t.Error("worker info of an unknown worker succeeded")
	}

	var tx struct {
		SessionID string `json:"session_id"`
		Entries   []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"entries"`
	}
	jsonCtl(t, &tx, "transcript", key, "--json")
	if tx.SessionID != sid || len(tx.Entries) != 2 || tx.Entries[0].Content != "hello fleet" || tx.Entries[1].Content != "echo: hello fleet" {
		t.Errorf("transcript by key: %+v", tx)
	}
	var txAll struct {
		Entries []json.RawMessage `json:"entries"`
	}
	jsonCtl(t, &txAll, "transcript", "--all", sid, "--json")
	if len(txAll.Entries) <= 2 {
		t.Errorf("transcript --all shows %d entries, want the control entries too", len(txAll.Entries))
	}

	var events []eventDoc
	s, err := runCtl(t, "events", "tail", "--all", "--kind", "turn", "--lane", key, "--count", "2", "--json")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		var ev eventDoc
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("events tail line %q: %v", line, err)
		}
		events = append(events, ev)
	}
	if len(events) != 2 || events[0].Kind != "turn" || events[0].Lane != lane || !strings.Contains(string(events[1].Event), `"type":"end"`) {
		t.Errorf("events tail: %+v", events)
	}

	var rep fleetReport
	jsonCtl(t, &rep, "stream", "report", "--json")
	if len(rep.Warnings) != 0 {
		t.Errorf("a fleet provisioned by the fleet has warnings: %v", rep.Warnings)
	}
	var inbox *streamReport
	for i := range rep.Streams {
		if rep.Streams[i].Name == f.names.InboxStream() {
			inbox = &rep.Streams[i]
		}
	}
	if inbox == nil || inbox.Messages == 0 || len(rep.Streams) != 10 {
		t.Fatalf("stream report: %+v", rep)
	}
	if i := slices.IndexFunc(inbox.Consumers, func(c consumerReport) bool { return c.Name == "workers" }); i < 0 || inbox.Consumers[i].MaxDeliver != -1 {
		t.Errorf("stream report: inbox consumers %+v", inbox.Consumers)
	}

	var dl struct {
		DeadLetters []DeadLetter `json:"dead_letters"`
	}
	jsonCtl(t, &dl, "dlq", "ls", key, "--json")
	if dl.DeadLetters == nil || len(dl.DeadLetters) != 0 {
		t.Errorf("dlq ls: %+v", dl)
	}
}

// TestStreamReportWarns: a workers consumer changed behind the fleet's
// back (a MaxDeliver) is reported.
func TestStreamReportWarns(t *testing.T) {
	srv := natstest.RunServer(t)
	js := natstest.JetStream(t, srv.Connect(t))
	names := broker.MustNames("fleet")
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names})
	if err != nil {
		t.Fatal(err)
	}
	cfg := res.Consumer.CachedInfo().Config
	cfg.MaxDeliver = 5
	if _, err := res.Inbox.UpdateConsumer(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NATS_URL", srv.URL())
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	var rep fleetReport
	jsonCtl(t, &rep, "stream", "report", "--json")
	if len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "max deliver 5") {
		t.Fatalf("warnings %q", rep.Warnings)
	}
}

// TestSessionWatchAndAdmin: `session watch` follows entry changes while
// admin commands go through the lane's inbox and its owner applies them.
func TestSessionWatchAndAdmin(t *testing.T) {
	f := startLiveFleet(t)
	key, seq := f.post("watch-1", "first")
	f.waitCommitted(key, seq)

	type result struct {
		out string
		err error
	}
	got := make(chan result, 1)
	go func() {
		var out bytes.Buffer
		err := run(&out, []string{"fleetctl", "session", "watch", key, "--json", "--count", "1"})
		got <- result{out.String(), err}
	}()
	// The watch starts with updates only: keep changing the entry (new
	// turns) until it has seen one. (Another fleetctl must not run in this
	// process meanwhile: urfave/cli's shared help flag is written on every
	// parse.)
	var r result
	for i := 0; ; i++ {
		_, seq := f.post("watch-1", fmt.Sprintf("change %d", i))
		f.waitEntry(key, seq)
		select {
		case r = <-got:
		case <-time.After(2 * time.Second):
			if i < 20 {
				continue
			}
			t.Fatal("session watch saw no change")
		}
		break
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	var ch entryChange
	if err := decodeOne(r.out, &ch); err != nil {
		t.Fatalf("%v: %s", err, r.out)
	}
	if ch.Lane != session.LaneToken(key) || ch.Operation != "put" || ch.Entry == nil || ch.Entry.SessionKey != key {
		t.Fatalf("watch: %+v", ch)
	}

	// Admin commands go through the lane protocol: the owner applies them.
	var adm struct {
		Lane    string `json:"lane"`
		Command string `json:"command"`
		Seq     uint64 `json:"seq"`
	}
	jsonCtl(t, &adm, "session", "busy", key, "queue", "--json")
	if adm.Command != "busy" || adm.Seq == 0 || adm.Lane != session.LaneToken(key) {
		t.Fatalf("session busy: %+v", adm)
	}
	f.waitCommitted(key, adm.Seq)
	var info struct {
		Entry session.SessionEntry `json:"entry"`
	}
	jsonCtl(t, &info, "session", "info", key, "--json")
	if info.Entry.BusyMode != "queue" {
		t.Fatalf("after session busy queue: busy mode %q", info.Entry.BusyMode)
	}
	jsonCtl(t, &adm, "session", "suspend", key, "--json")
	f.waitCommitted(key, adm.Seq)
	var ls struct {
		Sessions []session.SessionEntry `json:"sessions"`
	}
	jsonCtl(t, &ls, "session", "ls", "--state", "suspended", "--json")
	if len(ls.Sessions) != 1 || ls.Sessions[0].SessionKey != key {
		t.Fatalf("after session suspend: %+v", ls)
	}
}

// leafCommands lists every runnable command path of app.
func leafCommands(cmds []*cli.Command, prefix []string) [][]string {
	var out [][]string
	for _, c := range cmds {
		p := append(slices.Clone(prefix), c.Name)
		if len(c.Subcommands) > 0 {
			out = append(out, leafCommands(c.Subcommands, p)...)
			continue
		}
		out = append(out, p)
	}
	return out
}

// TestEveryCommandHasJSON: every command but completion (which prints a
// shell script) takes --json.
func TestEveryCommandHasJSON(t *testing.T) {
	app := newApp(&bytes.Buffer{})
	for _, path := range leafCommands(app.Commands, nil) {
		if path[0] == "completion" {
			continue
		}
		cmd := findPath(app.Commands, path)
		if !slices.ContainsFunc(cmd.Flags, func(f cli.Flag) bool { return slices.Contains(f.Names(), "json") }) {
			t.Errorf("fleetctl %s has no --json", strings.Join(path, " "))
		}
	}
}

func findPath(cmds []*cli.Command, path []string) *cli.Command {
	for _, c := range cmds {
		if c.Name == path[0] {
			if len(path) == 1 {
				return c
			}
			return findPath(c.Subcommands, path[1:])
		}
	}
	return nil
}

// TestFlagsInAnyPosition runs every command against a live fleet with its
// flags before the positional arguments, after them, and with the global
// flags after the subcommand: the results are the same JSON document.
func TestFlagsInAnyPosition(t *testing.T) {
	f := startLiveFleet(t)
	key, seq := f.post("pos-1", "position")
	f.waitCommitted(key, seq)
	url := f.srv.URL()
	t.Setenv("NATS_URL", "nats://127.0.0.1:1") // only the flag reaches the server
	cfgFile := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfgFile, []byte("nats:\n  connect_wait: 0s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	type tc struct {
		path  []string // command path
		pos   []string // positional arguments
		flags []string // command flags
	}
	cases := []tc{
		{[]string{"key"}, nil, []string{"--platform", "http", "--chat-id", "pos-1", "--user-id", "u-pos-1", "--json"}},
		{[]string{"session", "info"}, []string{key}, []string{"--json"}},
		{[]string{"session", "ls"}, nil, []string{"--platform", "http", "--state", "suspended", "--json"}},
		{[]string{"session", "history"}, []string{key}, []string{"--json"}},
		{[]string{"session", "watch"}, []string{key}, []string{"--current", "--count", "1", "--json"}},
		{[]string{"lane", "show"}, []string{key}, []string{"--json"}},
		{[]string{"worker", "ls"}, nil, []string{"--json"}},
		{[]string{"worker", "info"}, []string{"live-1"}, []string{"--json"}},
		{[]string{"transcript"}, []string{key}, []string{"--all", "--json"}},
		{[]string{"dlq", "ls"}, []string{key}, []string{"--json"}},
		{[]string{"delivery", "failures"}, nil, []string{"--platform", "telegram", "--since", "1h", "--json"}},
		{[]string{"events", "tail"}, nil, []string{"--all", "--kind", "turn", "--count", "1", "--json"}},
		{[]string{"stream", "report"}, nil, []string{"--json"}},
		{[]string{"config", "show"}, nil, []string{"--json"}},
		{[]string{"session", "suspend-recent"}, nil, []string{"--max-age", "1ns", "--json"}},
		{[]string{"top"}, nil, []string{"--interval", "2s", "--json"}},
		{[]string{"inbox", "show"}, nil, []string{"--json"}},
		{[]string{"inbox", "streams"}, []string{"1"}, []string{"--batch", "4", "--json"}},
	}
	global := []string{"-s", url, "--timeout", "20s", "-c", cfgFile}
	// What a running fleet changes between two calls: clocks, counters
	// (a sweep, a heartbeat, the worker registry catching up with the turn
	// and the lane release), consumer and stream state.
	volatile := []string{"heartbeat_age", "ttl_left", "heartbeat_at", "renewed_at", "at", "turns_per_sec", "sweeps", "expiry_wakes",
		"waiting", "pending", "ack_pending", "messages", "bytes", "backlog", "in_flight", "revision", "took_ns",
		"lanes_owned", "takeovers", "turns", "turns_running", "cache_size", "recoveries", "dead_letters", "watcher", "state"}
	for _, c := range cases {
		orders := [][]string{
			slices.Concat(global, c.path, c.flags, c.pos),
			slices.Concat(c.path, c.pos, c.flags, global),
			slices.Concat(c.path[:1], global[:2], c.path[1:], c.pos, global[2:], c.flags),
		}
		var first map[string]any
		for i, args := range orders {
			var doc map[string]any
			jsonCtl(t, &doc, args...)
			scrub(doc, volatile)
			dropEphemeralConsumers(doc)
			if i == 0 {
				first = doc
				continue
			}
			a, _ := json.Marshal(first)
			b, _ := json.Marshal(doc)
			if !bytes.Equal(a, b) {
				t.Errorf("fleetctl %s: order %d gives\n%s\nwant\n%s", strings.Join(args, " "), i, b, a)
			}
		}
	}
	// Every command is covered (the admin commands publish, so they are
	// exercised in TestSessionWatchAndAdmin; completion prints scripts).
	covered := map[string]bool{}
	for _, c := range cases {
		covered[strings.Join(c.path, " ")] = true
	}
	skip := map[string]bool{"completion": true, "session stop": true, "session reset": true, "session suspend": true,
		"session resume-pending": true, "session busy": true, "lane break-lease": true, "dlq show": true, "dlq replay": true, "dlq purge": true,
		// These query the state database's service; test/e2e TestStateDatabaseLive runs them against a live fleet.
		"search": true, "history": true, "export": true, "stats": true}
	var missing []string
	for _, p := range leafCommands(newApp(&bytes.Buffer{}).Commands, nil) {
		if n := strings.Join(p, " "); !covered[n] && !skip[n] {
			missing = append(missing, n)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("commands without a flag-position case: %v", missing)
	}
}

// dropEphemeralConsumers removes the consumers without acks (the ordered
// consumers of KV watches and stream reads, the previous commands' among
// them, which the server removes after a while) from a stream report: they
// come and go between two calls.
func dropEphemeralConsumers(doc map[string]any) {
	streams, _ := doc["streams"].([]any)
	for _, st := range streams {
		m, ok := st.(map[string]any)
		if !ok {
			continue
		}
		cs, _ := m["consumers"].([]any)
		kept := []any{}
		for _, c := range cs {
			if cm, ok := c.(map[string]any); ok && cm["ack_wait"] == "0s" {
				continue
			}
			kept = append(kept, c)
		}
		if cs != nil {
			m["consumers"] = kept
		}
	}
}

// scrub removes fields that change from one run to the next.
func scrub(v any, names []string) {
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			if slices.Contains(names, k) {
				delete(x, k)
				continue
			}
			scrub(val, names)
		}
	case []any:
		for _, e := range x {
			scrub(e, names)
		}
	}
}

// TestInboxShowSaysClosed: a migration killed during a drain leaves its
// batch closed (its lanes' publishes answered 503); `inbox show` says so,
// since when, and how to finish it, in both outputs.
func TestInboxShowSaysClosed(t *testing.T) {
	f := startLiveFleet(t)
	bucket, err := f.js.KeyValue(t.Context(), f.names.InboxMapBucket())
	if err != nil {
		t.Fatal(err)
	}
	m, rev, err := broker.ReadInboxMap(t.Context(), bucket)
	if err != nil {
		t.Fatal(err)
	}
	// What a migration to 2 streams killed in its first batch's drain
	// leaves (the stream's subjects do not matter to the report).
	closed := time.Now().Add(-3 * time.Minute).UTC().Truncate(time.Second)
	m.Streams, m.Target, m.From = 2, 2, 1
	m.Moving = []broker.Move{{P: 1, From: 0, To: 1, Closed: closed}, {P: 3, From: 0, To: 1, Closed: closed}}
	model, err := f.js.Stream(t.Context(), f.names.InboxStreamAt(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := broker.AddInboxStream(t.Context(), f.js, f.names, m, 1, model); err != nil {
		t.Fatal(err)
	}
	if _, err := bucket.Update(t.Context(), broker.InboxMapKey, m.Encode(), rev); err != nil {
		t.Fatal(err)
	}
	out, err := runCtl(t, "inbox", "show")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CLOSED: 2 partitions", closed.Format(time.RFC3339), "fleetctl inbox streams 2", "partition 3: FLEET_IN -> FLEET_IN_1, draining"} {
		if !strings.Contains(out, want) {
			t.Errorf("inbox show does not say %q:\n%s", want, out)
		}
	}
	var rep struct {
		ClosedSince time.Time     `json:"closed_since"`
		Moving      []broker.Move `json:"moving"`
	}
	jsonCtl(t, &rep, "inbox", "show", "--json")
	if !rep.ClosedSince.Equal(closed) || len(rep.Moving) != 2 || !rep.Moving[0].Closed.Equal(closed) {
		t.Errorf("inbox show --json: %+v, want closed since %s", rep, closed)
	}
}
