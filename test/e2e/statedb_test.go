package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/statedb"
)

// TestStateDatabaseLive runs `agentfleet up` (which runs the indexer into
// <data>/state.db), talks to it over HTTP (a message, /new with a title,
// another message, /undo, /title), then uses fleetctl search, history, export and
// stats against it; a second indexer process with its own file builds the
// same database; the files open read-only while the indexers run.
func TestStateDatabaseLive(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: multi-process tests are skipped under -short")
	}
	t.Parallel()
	dir := t.TempDir()
	addr, natsAddr := freeAddr(t), freeAddr(t)
	base := "http://" + addr
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	env := []string{"AGENTFLEET_SESSION_RESET_MODE=none"}
	up := newProc(t, dir, "up", env, "up", "--data", dir+"/data", "--http", addr, "--nats-listen", natsAddr)
	up.start()
	waitReady(t, hc, base, up)

	post := func(text string) acceptResp {
		t.Helper()
		data, _ := json.Marshal(map[string]string{"chat_id": "db-1", "user_id": "u1", "text": text})
		resp, err := hc.Post(base+"/v1/messages", "application/json", bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var a acceptResp
		if resp.StatusCode != http.StatusAccepted || json.Unmarshal(body, &a) != nil {
			t.Fatalf("POST: %d %s", resp.StatusCode, body)
		}
		return a
	}
	var after uint64
	waitReply := func(key string, want string) reply {
		t.Helper()
		var got reply
		waitFor(t, 30*time.Second, "a reply containing "+want, func() error {
			resp, err := hc.Get(fmt.Sprintf("%s/v1/sessions/%s/replies?after=%d&wait=5s", base, key, after))
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			var r struct{ Replies []reply }
			if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
				return err
			}
			for _, x := range r.Replies {
				after = x.Seq
				if strings.Contains(x.Text, want) {
					got = x
					return nil
				}
			}
			return fmt.Errorf("no reply with %q yet", want)
		})
		return got
	}
	a := post("first question about kubernetes")
	r1 := waitReply(a.SessionKey, "echo: first question about kubernetes")
	post("/new Project Alpha")
	waitReply(a.SessionKey, "Project Alpha")
	post("second question about bananas")
	r2 := waitReply(a.SessionKey, "echo: second question about bananas")
	post("/undo")
	waitReply(a.SessionKey, "Undid 1 turn")
	post("/title Renamed Alpha")
	waitReply(a.SessionKey, "Session title set")
	if r1.SessionID == r2.SessionID {
		t.Fatalf("/new kept the session %s", r1.SessionID)
	}

	ctlEnv := append(baseEnv(), "NATS_URL=nats://"+natsAddr)
	ctl := func(args ...string) ([]byte, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, fleetctlBinary, args...)
		cmd.Env = ctlEnv
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("fleetctl %s: %v: %s", strings.Join(args, " "), err, stderr.Bytes())
		}
		return stdout.Bytes(), nil
	}
	ctlJSON := func(out any, args ...string) error {
		data, err := ctl(args...)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("fleetctl %s: not one JSON document: %v: %s", strings.Join(args, " "), err, data)
		}
		return nil
	}

	// history: both sessions, the first ended by /new, the second a titled child.
	var hist statedb.SessionsResponse
	waitFor(t, 60*time.Second, "the indexer to record both sessions and the /undo", func() error {
		if err := ctlJSON(&hist, "history", "--json"); err != nil {
			return err
		}
		if len(hist.Sessions) != 2 || hist.Sessions[0].MessageCount != 0 || hist.Sessions[0].Title != "Renamed Alpha" {
			return fmt.Errorf("history %+v", hist.Sessions)
		}
		return nil
	})
	second, first := hist.Sessions[0], hist.Sessions[1]
	if second.ID != r2.SessionID || second.Title != "Renamed Alpha" || second.ParentSessionID != r1.SessionID || second.Source != "http" {
		t.Fatalf("second session %+v", second)
	}
	if first.ID != r1.SessionID || first.EndedAt == nil || first.EndReason != "new" || first.MessageCount != 2 || first.Preview != "first question about kubernetes" {
		t.Fatalf("first session %+v", first)
	}

	var sr statedb.SearchResponse
	if err := ctlJSON(&sr, "search", "--json", "--role", "assistant", "kubernetes"); err != nil {
		t.Fatal(err)
	}
	if len(sr.Results) != 1 || sr.Results[0].SessionID != r1.SessionID || !strings.Contains(sr.Results[0].Snippet, ">>>kubernetes<<<") {
		t.Fatalf("search %+v", sr)
	}
	if err := ctlJSON(&sr, "search", "--json", "bananas"); err != nil || len(sr.Results) != 0 {
		t.Fatalf("an undone turn is searchable: %+v %v", sr, err)
	}
	if err := ctlJSON(&sr, "search", "--json", "--source", "telegram", "kubernetes"); err != nil || len(sr.Results) != 0 {
		t.Fatalf("--source telegram: %+v %v", sr, err)
	}
	if out, err := ctl("search", "kubernetes"); err != nil || !strings.Contains(string(out), r1.SessionID) {
		t.Fatalf("search table: %s %v", out, err)
	}

	// These commands keep fleetctl's conventions: command flags after the
	// positional arguments and global flags after the subcommand give the
	// same document.
	for _, orders := range [][2][]string{
		{{"search", "--json", "--role", "assistant", "--limit", "5", "kubernetes"}, {"search", "kubernetes", "--limit", "5", "--json", "--role", "assistant"}},
		{{"--timeout", "20s", "history", "--json", "--limit", "5"}, {"history", "--limit", "5", "--json", "--timeout", "20s"}},
		{{"export", "--json", r2.SessionID}, {"export", r2.SessionID, "--json"}},
		{{"--timeout", "20s", "stats", "--json"}, {"stats", "--json", "--timeout", "20s"}},
	} {
		a, errA := ctl(orders[0]...)
		b, errB := ctl(orders[1]...)
		if errA != nil || errB != nil || len(a) == 0 || !bytes.Equal(a, b) {
			t.Errorf("fleetctl %v and %v differ: %v %v\n%s\n%s", orders[0], orders[1], errA, errB, a, b)
		}
	}

	var ex struct{ Sessions []statedb.ExportedSession }
	if err := ctlJSON(&ex, "export", "--json", r2.SessionID); err != nil || len(ex.Sessions) != 1 || len(ex.Sessions[0].Messages) != 2 ||
		ex.Sessions[0].Messages[0].DeletedAt == nil {
		t.Fatalf("export one: %+v %v", ex, err)
	}
	out, err := ctl("export", "--all")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		t.Fatalf("export --all: %d lines: %s", len(lines), out)
	}
	for _, l := range lines {
		var e statedb.ExportedSession
		if err := json.Unmarshal([]byte(l), &e); err != nil || e.ID == "" {
			t.Fatalf("export line %q: %v", l, err)
		}
	}
	if _, err := ctl("export"); err == nil {
		t.Fatal("export with neither an id nor --all succeeded")
	}
	if _, err := ctl("export", "--json", "20200101_000000_deadbeef"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("export of an unknown session: %v", err)
	}

	var st statedb.Stats
	if err := ctlJSON(&st, "stats", "--json"); err != nil || st.Sessions != 2 || st.Messages != 2 || st.APICalls < 1 {
		t.Fatalf("stats %+v %v", st, err)
	}

	// /resume lists from the state database when an indexer serves it:
	// the session /new ended is listed as ended (the session index in KV
	// does not know that), and it is resumable by its title.
	post("/new Beta")
	waitReply(a.SessionKey, "Beta")
	waitFor(t, 60*time.Second, "/resume to list the ended session from the state database", func() error {
		post("/resume")
		r := waitReply(a.SessionKey, "Named sessions")
		if want := "Renamed Alpha (" + r2.SessionID + ", "; !strings.Contains(r.Text, want) || !strings.Contains(r.Text, ", ended)") {
			return fmt.Errorf("/resume listed %q", r.Text)
		}
		return nil
	})
	post("/resume Renamed Alpha")
	waitReply(a.SessionKey, "Resumed session "+r2.SessionID)

	// A second indexer, its own file and durable consumers, builds the same database.
	other := filepath.Join(dir, "other.db")
	ix := newProc(t, dir, "indexer", env, "indexer", "--db", other, "--name", "second")
	ix.start("NATS_URL=nats://" + natsAddr)
	upDB := filepath.Join(dir, "data", "state.db")
	var dumps [2]string
	waitFor(t, 60*time.Second, "both indexers to hold the same data", func() error {
		for i, p := range []string{upDB, other} {
			db, err := statedb.Open(context.Background(), p, &statedb.Options{ReadOnly: true})
			if err != nil {
				return err
			}
			dumps[i], err = db.Dump(context.Background())
			db.Close()
			if err != nil {
				return err
			}
		}
		if dumps[0] != dumps[1] {
			return fmt.Errorf("dumps differ")
		}
		return nil
	})
	ix.signal(syscall.SIGTERM)
	if st := ix.waitExit(30 * time.Second); st == nil || !st.Success() {
		t.Fatalf("indexer exit: %v", st)
	}
	up.signal(syscall.SIGTERM)
	if st := up.waitExit(30 * time.Second); st == nil || !st.Success() {
		t.Fatalf("up exit: %v", st)
	}

	// --rebuild recreates the file from the streams; it is the same again.
	up.start()
	waitReady(t, hc, base, up)
	ix2 := newProc(t, dir, "rebuild", env, "indexer", "--db", other, "--name", "second", "--rebuild")
	ix2.start("NATS_URL=nats://" + natsAddr)
	ix2.waitLog(60*time.Second, regexp.MustCompile("indexer consuming"))
	waitFor(t, 60*time.Second, "the rebuilt file to equal the first", func() error {
		db, err := statedb.Open(context.Background(), other, &statedb.Options{ReadOnly: true})
		if err != nil {
			return err
		}
		defer db.Close()
		d, err := db.Dump(context.Background())
		if err != nil {
			return err
		}
		if d != dumps[0] {
			return fmt.Errorf("rebuilt dump differs")
		}
		return nil
	})
}
