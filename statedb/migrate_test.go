package statedb_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/statedb"
)

// schemaV1 is the initial schema (version 1): no title, billing or
// reasoning columns, and an external-content FTS5 table on content only.
const schemaV1 = `
CREATE TABLE sessions (
    id TEXT PRIMARY KEY, source TEXT NOT NULL, user_id TEXT, model TEXT, model_config TEXT, system_prompt TEXT,
    parent_session_id TEXT, started_at REAL NOT NULL, ended_at REAL, end_reason TEXT,
    message_count INTEGER DEFAULT 0, tool_call_count INTEGER DEFAULT 0, input_tokens INTEGER DEFAULT 0, output_tokens INTEGER DEFAULT 0,
    FOREIGN KEY (parent_session_id) REFERENCES sessions(id));
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL REFERENCES sessions(id), role TEXT NOT NULL,
    content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT, timestamp REAL NOT NULL, token_count INTEGER);
CREATE INDEX idx_sessions_source ON sessions(source);
CREATE INDEX idx_messages_session ON messages(session_id, timestamp);
CREATE VIRTUAL TABLE messages_fts USING fts5(content, content=messages, content_rowid=id);
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES('delete', old.id, old.content);
END;
CREATE TRIGGER messages_fts_update AFTER UPDATE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES('delete', old.id, old.content);
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version VALUES (1);
INSERT INTO sessions (id, source, model, started_at, input_tokens, output_tokens, message_count, tool_call_count)
    VALUES ('v1a', 'cli', 'gpt-4', 1700000000.5, 10, 20, 3, 1);
INSERT INTO sessions (id, source, parent_session_id, started_at, ended_at, end_reason)
    VALUES ('v1b', 'telegram', 'v1a', 1700000100, 1700000200, 'user_exit');
INSERT INTO messages (session_id, role, content, timestamp) VALUES ('v1a', 'user', 'please deploy the kubernetes cluster', 1700000001);
INSERT INTO messages (session_id, role, content, tool_calls, timestamp) VALUES ('v1a', 'assistant', 'running it', '[{"id":"c1","function":{"name":"terminal","arguments":"{}"}}]', 1700000002);
INSERT INTO messages (session_id, role, content, tool_name, tool_call_id, timestamp) VALUES ('v1a', 'tool', '部署成功了', 'terminal', 'c1', 1700000003);
`

func TestMigrateFromVersion1WithData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	raw, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range splitSQL(schemaV1) {
		if _, err := raw.Exec(stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	raw.Close()

	db, err := statedb.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if v, err := db.Version(ctx); err != nil || v != statedb.SchemaVersion {
		t.Fatalf("version %d %v", v, err)
	}
	// The data survived, with the new columns at their defaults.
	s, err := db.GetSession(ctx, "v1a")
	if err != nil || s.Model != "gpt-4" || s.InputTokens != 10 || s.MessageCount != 3 || s.Title != "" || s.APICallCount != 0 ||
		s.StartedAt.Unix() != 1700000000 {
		t.Fatalf("v1a %+v %v", s, err)
	}
	b, _ := db.GetSession(ctx, "v1b")
	if b.ParentSessionID != "v1a" || b.EndReason != "user_exit" || b.EndedAt == nil {
		t.Fatalf("v1b %+v", b)
	}
	msgs, err := db.GetMessages(ctx, "v1a")
	if err != nil || len(msgs) != 3 || msgs[1].ToolCalls == nil {
		t.Fatalf("messages %+v %v", msgs, err)
	}
	// Old rows are in both new indexes, tool names and calls included.
	for q, want := range map[string]int{"kubernetes": 1, "terminal": 2, "部署成功": 1, "ubernet": 1} {
		res, err := db.SearchMessages(ctx, q, statedb.SearchOptions{})
		if err != nil || len(res) != want {
			t.Errorf("search %q after migration: %d results (%v), want %d", q, len(res), err, want)
		}
	}
	// The new columns and the title index work.
	if err := db.SetSessionTitle(ctx, "v1a", "Deploy"); err != nil {
		t.Fatal(err)
	}
	if err := db.SetSessionTitle(ctx, "v1b", "Deploy"); err == nil {
		t.Fatal("the unique title index is missing after migration")
	}
	if _, err := db.AppendMessage(ctx, statedb.NewMessage{SessionID: "v1b", Role: "assistant", Content: "new row", FinishReason: "stop",
		Reasoning: "thought", CodexMessageItems: []int{1}}); err != nil {
		t.Fatal(err)
	}
	if res, _ := db.SearchMessages(ctx, "new row", statedb.SearchOptions{}); len(res) != 1 {
		t.Fatalf("new rows not indexed: %+v", res)
	}
	db.Close()
	// Opening again is a no-op.
	db2, err := statedb.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	if res, _ := db2.SearchMessages(ctx, "kubernetes", statedb.SearchOptions{}); len(res) != 1 {
		t.Fatalf("after reopen: %+v", res)
	}
}

func TestMigrateEveryOlderVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for v := 1; v < statedb.SchemaVersion; v++ {
		path := filepath.Join(t.TempDir(), fmt.Sprintf("v%d.db", v))
		raw, err := sql.Open("sqlite", "file:"+path)
		if err != nil {
			t.Fatal(err)
		}
		stmts := splitSQL(schemaV1)
		for _, stmt := range stmts {
			if strings.HasPrefix(stmt, "INSERT INTO schema_version") {
				stmt = fmt.Sprintf("INSERT INTO schema_version VALUES (%d)", v)
			}
			if _, err := raw.Exec(stmt); err != nil {
				t.Fatal(err)
			}
		}
		// What the versions up to v added, as a file at v would hold it.
		if v >= 3 {
			mustExec(t, raw, `ALTER TABLE sessions ADD COLUMN title TEXT`)
			mustExec(t, raw, `UPDATE sessions SET title = 'Same'`) // duplicates, allowed before 4
		}
		if v >= 4 {
			mustExec(t, raw, `UPDATE sessions SET title = id`)
			mustExec(t, raw, `CREATE UNIQUE INDEX idx_sessions_title_unique ON sessions(title) WHERE title IS NOT NULL`)
		}
		if v >= 10 {
			mustExec(t, raw, `CREATE VIRTUAL TABLE messages_fts_trigram USING fts5(content, content=messages, content_rowid=id, tokenize='trigram')`)
			mustExec(t, raw, `INSERT INTO messages_fts_trigram(messages_fts_trigram) VALUES('rebuild')`)
		}
		raw.Close()
		db, err := statedb.Open(ctx, path, nil)
		if err != nil {
			t.Fatalf("from v%d: %v", v, err)
		}
		if got, _ := db.Version(ctx); got != statedb.SchemaVersion {
			t.Fatalf("from v%d: version %d", v, got)
		}
		if res, err := db.SearchMessages(ctx, "terminal", statedb.SearchOptions{}); err != nil || len(res) != 2 {
			t.Fatalf("from v%d: search %v %v", v, res, err)
		}
		if v == 3 {
			a, _ := db.GetSession(ctx, "v1a")
			b, _ := db.GetSession(ctx, "v1b")
			if a.Title == b.Title {
				t.Fatalf("from v3: duplicate titles kept: %q", a.Title)
			}
		}
		db.Close()
	}
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "new.db")
	raw, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, raw, `CREATE TABLE schema_version (version INTEGER NOT NULL)`)
	mustExec(t, raw, `INSERT INTO schema_version VALUES (99)`)
	raw.Close()
	if _, err := statedb.Open(context.Background(), path, nil); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("open of a newer schema: %v", err)
	}
}

func mustExec(t *testing.T, db *sql.DB, q string) {
	t.Helper()
	if _, err := db.Exec(q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// splitSQL splits a script on statement ends, keeping trigger bodies whole.
func splitSQL(script string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(script, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		cur.WriteString(line + "\n")
		s := strings.TrimSpace(cur.String())
		inTrigger := strings.HasPrefix(s, "CREATE TRIGGER")
		if strings.HasSuffix(s, ";") && (!inTrigger || strings.HasSuffix(s, "END;")) {
			out = append(out, s)
			cur.Reset()
		}
	}
	return out
}

// Several OS processes append to one file at once; no write is lost.
func TestSeveralProcessesWriteOneFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "shared.db")
	db, err := statedb.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const procs, writes = 4, 60
	var wg sync.WaitGroup
	errs := make(chan error, procs)
	for i := 0; i < procs; i++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "STATEDB_HELPER=writer", "STATEDB_PATH="+path,
			"STATEDB_NAME=p"+strconv.Itoa(i), "STATEDB_WRITES="+strconv.Itoa(writes))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, err := cmd.CombinedOutput(); err != nil {
				errs <- fmt.Errorf("writer %v: %v\n%s", cmd.Env[len(cmd.Env)-2], err, out)
			}
		}()
	}
	// This process writes too, meanwhile.
	mustSession(t, db, statedb.NewSession{ID: "parent", Source: "cli"})
	for j := 0; j < writes; j++ {
		mustAppend(t, db, statedb.NewMessage{SessionID: "parent", Role: "user", Content: fmt.Sprintf("parent message %d", j)})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := 0; i < procs; i++ {
		id := "p" + strconv.Itoa(i)
		s, err := db.GetSession(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := db.GetMessages(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if s.MessageCount != writes || len(msgs) != writes {
			t.Fatalf("%s: message_count %d, rows %d, want %d", id, s.MessageCount, len(msgs), writes)
		}
		for j, m := range msgs {
			if want := fmt.Sprintf("%s message %d", id, j); m.Content != want {
				t.Fatalf("%s row %d: %q, want %q", id, j, m.Content, want)
			}
		}
	}
	st, err := db.GetStats(ctx)
	if err != nil || st.Messages != (procs+1)*writes {
		t.Fatalf("stats %+v %v", st, err)
	}
	if res, err := db.SearchMessages(ctx, "p3 message", statedb.SearchOptions{Limit: 500}); err != nil || len(res) != writes {
		t.Fatalf("search: %d %v", len(res), err)
	}
}

// runHelper is the body of a helper process.
func runHelper(mode string) int {
	switch mode {
	case "writer":
		ctx := context.Background()
		n, _ := strconv.Atoi(os.Getenv("STATEDB_WRITES"))
		name := os.Getenv("STATEDB_NAME")
		db, err := statedb.Open(ctx, os.Getenv("STATEDB_PATH"), nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer db.Close()
		if err := db.CreateSession(ctx, statedb.NewSession{ID: name, Source: "cli"}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		for j := 0; j < n; j++ {
			if _, err := db.AppendMessage(ctx, statedb.NewMessage{SessionID: name, Role: "user", Content: fmt.Sprintf("%s message %d", name, j),
				Timestamp: time.Now()}); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		return 0
	}
	return runIndexerHelper(mode)
}

// TestReconcileWordIndexPrefixes: a file at the current version whose word
// index has no prefix indexes (the storage design's definition, or a file
// written before they were added) gets them when it is opened: the table
// is created again with them and every message indexed again; search finds
// the same messages (prefix queries included), new messages are indexed,
// FTS5's integrity check passes, and opening again changes nothing.
func TestReconcileWordIndexPrefixes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "v11.db")
	db, err := statedb.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.CreateSession(ctx, statedb.NewSession{ID: "s", Source: "cli"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"deploy the kubernetes cluster", "deployment failed twice", "a tool said ok"} {
		if _, err := db.AppendMessage(ctx, statedb.NewMessage{SessionID: "s", Role: "user", Content: c}); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	raw, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, raw, `DROP TABLE messages_fts`)
	mustExec(t, raw, `CREATE VIRTUAL TABLE messages_fts USING fts5(content, tool_name, tool_calls)`)
	mustExec(t, raw, `INSERT INTO messages_fts(rowid, content, tool_name, tool_calls) SELECT id, content, tool_name, tool_calls FROM messages`)
	raw.Close()

	definition := func() string {
		raw, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		var def string
		if err := raw.QueryRow(`SELECT sql FROM sqlite_master WHERE name = 'messages_fts'`).Scan(&def); err != nil {
			t.Fatal(err)
		}
		return def
	}
	if strings.Contains(definition(), "prefix=") {
		t.Fatal("the old definition has prefixes: not a test")
	}
	for i := 0; i < 2; i++ {
		db, err := statedb.Open(ctx, path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if def := definition(); !strings.Contains(def, "prefix='2 3 4'") {
			t.Fatalf("open %d: messages_fts is %s", i, def)
		}
		if _, err := db.AppendMessage(ctx, statedb.NewMessage{SessionID: "s", Role: "user", Content: fmt.Sprintf("deploying again %d", i)}); err != nil {
			t.Fatal(err)
		}
		for q, want := range map[string]int{"de*": 3 + i, "dep*": 3 + i, "depl*": 3 + i, "deplo*": 3 + i, "deployment": 1, "kube*": 1, "ok": 1} {
			res, err := db.SearchMessages(ctx, q, statedb.SearchOptions{})
			if err != nil || len(res) != want {
				t.Errorf("open %d: %s: %d results (%v), want %d", i, q, len(res), err, want)
			}
		}
		db.Close()
		raw, err := sql.Open("sqlite", "file:"+path)
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, raw, `INSERT INTO messages_fts(messages_fts, rank) VALUES('integrity-check', 1)`)
		raw.Close()
	}
}
