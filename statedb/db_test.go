package statedb_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/statedb"
)

func openTemp(t *testing.T) *statedb.DB {
	t.Helper()
	db, err := statedb.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func mustSession(t *testing.T, db *statedb.DB, s statedb.NewSession) {
	t.Helper()
	if err := db.CreateSession(context.Background(), s); err != nil {
		t.Fatal(err)
	}
}

func mustAppend(t *testing.T, db *statedb.DB, m statedb.NewMessage) int64 {
	t.Helper()
	id, err := db.AppendMessage(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestSanitizeQuery(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{`docker deployment`, `docker deployment`},
		{`"exact phrase"`, `"exact phrase"`},
		{`docker OR kubernetes`, `docker OR kubernetes`},
		{`python NOT java`, `python NOT java`},
		{`deploy*`, `deploy*`},
		// unmatched quotes and special characters
		{`"unbalanced phrase`, `unbalanced phrase`},
		{`say "hello" and "bye`, `say "hello" and bye`},
		{`(grouped) +plus ^caret {x}`, `grouped plus caret x`},
		// hyphenated and dotted terms
		{`chat-send`, `"chat-send"`},
		{`fix chat-send bug`, `fix "chat-send" bug`},
		{`P2.2 my-app.config.ts`, `"P2.2" "my-app.config.ts"`},
		{`module:auth`, `"module:auth"`},
		{`chat-send*`, `"chat-send"*`},
		// dangling operators
		{`hello AND`, `hello`},
		{`OR hello`, `hello`},
		{`hello AND OR world`, `hello AND world`},
		{`NOT`, ``},
		{`hello NOT`, `hello`},
		// prefix
		{`***deploy`, `deploy`},
		{`deploy***`, `deploy*`},
		{`*`, ``},
		// nothing searchable
		{`   `, ``},
		{`""`, ``},
		{`- , ;`, ``},
		{`日本語`, `日本語`},
	}
	for _, c := range cases {
		if got := statedb.SanitizeQuery(c.in); got != c.want {
			t.Errorf("SanitizeQuery(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// Every sanitized query is valid FTS5: none makes the search fail.
func TestSearchNeverFailsOnSyntax(t *testing.T) {
	t.Parallel()
	db := openTemp(t)
	ctx := context.Background()
	mustSession(t, db, statedb.NewSession{ID: "s1", Source: "cli"})
	mustAppend(t, db, statedb.NewMessage{SessionID: "s1", Role: "user", Content: "use chat-send to deploy the my-app.config.ts file"})
	for _, q := range []string{`"`, `(`, `)`, `AND`, `a AND`, `NEAR(`, `*`, `chat-send`, `"deploy`, `x:y`, `^`, `{}`, `a OR OR b`, `'`, `\`, `%`, `_`} {
		if _, err := db.SearchMessages(ctx, q, statedb.SearchOptions{}); err != nil {
			t.Errorf("search %q: %v", q, err)
		}
	}
	res, err := db.SearchMessages(ctx, "chat-send", statedb.SearchOptions{})
	if err != nil || len(res) != 1 {
		t.Fatalf("chat-send: %v %v", res, err)
	}
	res, err = db.SearchMessages(ctx, "my-app.config.ts", statedb.SearchOptions{})
	if err != nil || len(res) != 1 {
		t.Fatalf("my-app.config.ts: %v %v", res, err)
	}
}

func TestSearchSnippetContextAndFilters(t *testing.T) {
	t.Parallel()
	db := openTemp(t)
	ctx := context.Background()
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	mustSession(t, db, statedb.NewSession{ID: "a", Source: "telegram", Model: "m1", StartedAt: base})
	mustSession(t, db, statedb.NewSession{ID: "b", Source: "slack", StartedAt: base.Add(time.Hour)})
	mustAppend(t, db, statedb.NewMessage{SessionID: "a", Role: "user", Content: "how do I fix the docker build?", Timestamp: base})
	long := strings.Repeat("x", 300)
	mustAppend(t, db, statedb.NewMessage{SessionID: "a", Role: "assistant", Content: "Run the docker deployment again " + long, Timestamp: base.Add(time.Second)})
	mustAppend(t, db, statedb.NewMessage{SessionID: "a", Role: "user", Content: "thanks " + long, Timestamp: base.Add(2 * time.Second)})
	mustAppend(t, db, statedb.NewMessage{SessionID: "b", Role: "user", Content: "docker deployment on kubernetes", Timestamp: base.Add(time.Hour)})
	mustAppend(t, db, statedb.NewMessage{SessionID: "b", Role: "tool", ToolName: "terminal", Content: "ok", Timestamp: base.Add(time.Hour + time.Second)})

	res, err := db.SearchMessages(ctx, "docker deployment", statedb.SearchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 {
		t.Fatalf("got %d results, want 2: %+v", len(res), res)
	}
	var inA *statedb.SearchResult
	for i := range res {
		if res[i].SessionID == "a" {
			inA = &res[i]
		}
		if !strings.Contains(res[i].Snippet, ">>>docker<<<") || !strings.Contains(res[i].Snippet, ">>>deployment<<<") {
			t.Errorf("snippet %q lacks the marks", res[i].Snippet)
		}
	}
	if inA == nil || inA.Source != "telegram" || inA.Model != "m1" || !inA.SessionStarted.Equal(base) {
		t.Fatalf("result in a: %+v", inA)
	}
	if len(inA.Context) != 2 || inA.Context[0].Role != "user" || inA.Context[1].Role != "user" ||
		!strings.HasPrefix(inA.Context[1].Content, "thanks") || len([]rune(inA.Context[1].Content)) != 200 {
		t.Fatalf("context: %+v", inA.Context)
	}
	for _, c := range []struct {
		o    statedb.SearchOptions
		want int
	}{
		{statedb.SearchOptions{Sources: []string{"slack"}}, 1},
		{statedb.SearchOptions{ExcludeSources: []string{"telegram", "slack"}}, 0},
		{statedb.SearchOptions{Roles: []string{"assistant"}}, 1},
		{statedb.SearchOptions{Roles: []string{"user"}, Sources: []string{"telegram"}}, 0},
		{statedb.SearchOptions{Limit: 1}, 1},
	} {
		res, err := db.SearchMessages(ctx, "docker deployment", c.o)
		if err != nil || len(res) != c.want {
			t.Errorf("%+v: %d results (%v), want %d", c.o, len(res), err, c.want)
		}
	}
	// Prefixes of a length the word index keeps a prefix index for (2 to
	// 4 characters) and of other lengths: every result has its match
	// marked.
	for q, want := range map[string]string{"de*": ">>>deployment<<<", "dep*": ">>>deployment<<<", "deploy*": ">>>deployment<<<",
		"docker deploym*": ">>>deployment<<<", "dock* deployment": ">>>docker<<<"} {
		res, err := db.SearchMessages(ctx, q, statedb.SearchOptions{})
		if err != nil || len(res) != 2 {
			t.Fatalf("%s: %d results (%v), want 2", q, len(res), err)
		}
		for _, r := range res {
			if !strings.Contains(r.Snippet, want) {
				t.Errorf("%s: snippet %q lacks %s", q, r.Snippet, want)
			}
		}
	}
	// Phrase, OR, NOT, prefix; tool names are indexed.
	for q, want := range map[string]int{`"docker deployment"`: 2, `docker NOT kubernetes`: 2, `kubernetes OR build`: 2, `deploy*`: 2, `terminal`: 1, `"deployment docker"`: 0} {
		res, err := db.SearchMessages(ctx, q, statedb.SearchOptions{})
		if err != nil || len(res) != want {
			t.Errorf("%s: %d results (%v), want %d", q, len(res), err, want)
		}
	}
}

func TestSearchCJKAndSubstring(t *testing.T) {
	t.Parallel()
	db := openTemp(t)
	ctx := context.Background()
	mustSession(t, db, statedb.NewSession{ID: "s", Source: "cli"})
	mustAppend(t, db, statedb.NewMessage{SessionID: "s", Role: "user", Content: "我想部署一个新的服务器"})
	mustAppend(t, db, statedb.NewMessage{SessionID: "s", Role: "assistant", Content: "東京の天気は晴れです"})
	mustAppend(t, db, statedb.NewMessage{SessionID: "s", Role: "user", Content: "the quick brown fox jumps"})
	mustAppend(t, db, statedb.NewMessage{SessionID: "s", Role: "user", Content: "서울에서 만나요"})
	for q, want := range map[string]string{
		"部署一个":    "我想部署一个新的服务器",
		"服务器":     "我想部署一个新的服务器",
		"部署":      "我想部署一个新的服务器", // two characters: below a trigram
		"天気":      "東京の天気は晴れです",
		"서울에서":    "서울에서 만나요",
		"ick bro": "the quick brown fox jumps", // substrings the word index cannot find
		"uick":    "the quick brown fox jumps",
	} {
		res, err := db.SearchMessages(ctx, q, statedb.SearchOptions{})
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		if len(res) != 1 {
			t.Errorf("%s: %d results, want 1: %+v", q, len(res), res)
			continue
		}
		if !strings.Contains(res[0].Snippet, ">>>") {
			t.Errorf("%s: snippet %q has no mark", q, res[0].Snippet)
		}
		m, err := db.GetMessages(ctx, "s")
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, x := range m {
			if x.ID == res[0].ID && x.Content == want {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: matched message %d, want %q", q, res[0].ID, want)
		}
	}
	res, err := db.SearchMessages(ctx, "不存在的词", statedb.SearchOptions{})
	if err != nil || len(res) != 0 {
		t.Fatalf("absent CJK: %v %v", res, err)
	}
	// Words the word index holds keep its answer, even an empty one: no
	// substring search behind it ("quick" and "done" are words here, and
	// never in one message as words; "quickly done" holds them only as
	// parts of words).
	mustAppend(t, db, statedb.NewMessage{SessionID: "s", Role: "user", Content: "quickly done"})
	if res, err := db.SearchMessages(ctx, "quick done", statedb.SearchOptions{}); err != nil || len(res) != 0 {
		t.Fatalf("two indexed words never together: %+v %v", res, err)
	}
	// A fragment that is no word of the index is searched as a substring.
	if res, err := db.SearchMessages(ctx, "quickl done", statedb.SearchOptions{}); err != nil || len(res) != 1 || res[0].Snippet == "" {
		t.Fatalf("fragment and word: %+v %v", res, err)
	}
	// A quoted phrase counts word by word: a phrase of indexed words that
	// nobody wrote as words finds nothing, even where its text is part of
	// longer words ("aquick donex"); a phrase with a fragment in it is
	// searched as a substring.
	mustAppend(t, db, statedb.NewMessage{SessionID: "s", Role: "user", Content: "aquick donex"})
	if res, err := db.SearchMessages(ctx, `"quick done"`, statedb.SearchOptions{}); err != nil || len(res) != 0 {
		t.Fatalf("a phrase of indexed words: %+v %v", res, err)
	}
	if res, err := db.SearchMessages(ctx, `"uick brow"`, statedb.SearchOptions{}); err != nil || len(res) != 1 || !strings.Contains(res[0].Snippet, ">>>uick brow<<<") {
		t.Fatalf("a phrase with fragments: %+v %v", res, err)
	}
}

func TestSearchPagesRankedCandidates(t *testing.T) {
	t.Parallel()
	db := openTemp(t)
	ctx := context.Background()
	mustSession(t, db, statedb.NewSession{ID: "s", Source: "cli"})
	for i := 0; i < 30; i++ {
		// Messages with more occurrences of the word rank higher (bm25).
		mustAppend(t, db, statedb.NewMessage{SessionID: "s", Role: "user",
			Content: strings.Repeat("needle ", 1+i%5) + strings.Repeat("hay ", 20)})
	}
	all, err := db.SearchMessages(ctx, "needle", statedb.SearchOptions{Limit: 30})
	if err != nil || len(all) != 30 {
		t.Fatalf("all: %d %v", len(all), err)
	}
	for i, r := range all {
		if !strings.Contains(r.Snippet, ">>>needle<<<") {
			t.Fatalf("result %d snippet %q", i, r.Snippet)
		}
		if i > 0 && strings.Count(all[i-1].Snippet, ">>>") < strings.Count(r.Snippet, ">>>") {
			t.Fatalf("result %d (%q) ranks below one with fewer matches (%q)", i, r.Snippet, all[i-1].Snippet)
		}
	}
	var paged []statedb.SearchResult
	for off := 0; off < 30; off += 7 {
		p, err := db.SearchMessages(ctx, "needle", statedb.SearchOptions{Limit: 7, Offset: off})
		if err != nil {
			t.Fatal(err)
		}
		paged = append(paged, p...)
	}
	if len(paged) != 30 {
		t.Fatalf("pages hold %d results, want 30", len(paged))
	}
	for i := range paged {
		if paged[i].ID != all[i].ID {
			t.Fatalf("page order differs at %d: %d vs %d", i, paged[i].ID, all[i].ID)
		}
	}
}

func TestTitlesUniqueAndLineage(t *testing.T) {
	t.Parallel()
	db := openTemp(t)
	ctx := context.Background()
	base := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	mustSession(t, db, statedb.NewSession{ID: "s1", Source: "cli", StartedAt: base})
	mustSession(t, db, statedb.NewSession{ID: "s2", Source: "cli", StartedAt: base.Add(time.Hour), ParentSessionID: "s1"})
	mustSession(t, db, statedb.NewSession{ID: "s3", Source: "cli", StartedAt: base.Add(2 * time.Hour), ParentSessionID: "s2"})
	if err := db.SetSessionTitle(ctx, "s1", "  Fix Docker\tBuild "); err != nil {
		t.Fatal(err)
	}
	if s, _ := db.GetSession(ctx, "s1"); s.Title != "Fix Docker Build" {
		t.Fatalf("title %q", s.Title)
	}
	if err := db.SetSessionTitle(ctx, "s2", "Fix Docker Build"); !errors.Is(err, statedb.ErrTitleTaken) {
		t.Fatalf("duplicate title: %v", err)
	}
	next, err := db.GetNextTitleInLineage(ctx, "Fix Docker Build")
	if err != nil || next != "Fix Docker Build #2" {
		t.Fatalf("next = %q %v", next, err)
	}
	if err := db.SetSessionTitle(ctx, "s2", next); err != nil {
		t.Fatal(err)
	}
	next, _ = db.GetNextTitleInLineage(ctx, "Fix Docker Build #2")
	if next != "Fix Docker Build #3" {
		t.Fatalf("next after #2 = %q", next)
	}
	if n, _ := db.GetNextTitleInLineage(ctx, "Other"); n != "Other" {
		t.Fatalf("unused title: %q", n)
	}
	// A bare title resolves to the newest of its lineage; a numbered one to itself.
	if id, err := db.ResolveSessionByTitle(ctx, "Fix Docker Build"); err != nil || id != "s2" {
		t.Fatalf("resolve bare: %q %v", id, err)
	}
	if err := db.SetSessionTitle(ctx, "s3", "Fix Docker Build #3"); err != nil {
		t.Fatal(err)
	}
	if id, _ := db.ResolveSessionByTitle(ctx, "Fix Docker Build"); id != "s3" {
		t.Fatalf("resolve bare after #3: %q", id)
	}
	if id, _ := db.ResolveSessionByTitle(ctx, "Fix Docker Build #2"); id != "s2" {
		t.Fatalf("resolve #2: %q", id)
	}
	if _, err := db.ResolveSessionByTitle(ctx, "nope"); !errors.Is(err, statedb.ErrNotFound) {
		t.Fatalf("resolve unknown: %v", err)
	}
	// A LIKE wildcard in a title is literal.
	mustSession(t, db, statedb.NewSession{ID: "w", Source: "cli", Title: "100%_done"})
	if n, _ := db.GetNextTitleInLineage(ctx, "100%"); n != "100%" {
		t.Fatalf("wildcard: %q", n)
	}

	anc, err := db.Ancestors(ctx, "s3")
	if err != nil || len(anc) != 3 || anc[0].ID != "s3" || anc[1].ID != "s2" || anc[2].ID != "s1" || anc[2].Title != "Fix Docker Build" {
		t.Fatalf("ancestors: %+v %v", anc, err)
	}
	desc, err := db.Descendants(ctx, "s1")
	if err != nil || len(desc) != 3 || desc[2].ID != "s3" {
		t.Fatalf("descendants: %+v %v", desc, err)
	}
	if _, err := db.Ancestors(ctx, "zzz"); !errors.Is(err, statedb.ErrNotFound) {
		t.Fatalf("unknown: %v", err)
	}
}

func TestStatsEndReopenExportPruneClearDelete(t *testing.T) {
	t.Parallel()
	db := openTemp(t)
	ctx := context.Background()
	old := time.Now().Add(-100 * 24 * time.Hour)
	mustSession(t, db, statedb.NewSession{ID: "old", Source: "telegram", Model: "gpt", StartedAt: old})
	mustSession(t, db, statedb.NewSession{ID: "oldopen", Source: "telegram", StartedAt: old})
	mustSession(t, db, statedb.NewSession{ID: "new", Source: "cli", Model: "claude", ParentSessionID: "old"})
	tok := int64(7)
	mustAppend(t, db, statedb.NewMessage{SessionID: "old", Role: "user", Content: "hi"})
	mustAppend(t, db, statedb.NewMessage{SessionID: "old", Role: "assistant", Content: "hello", TokenCount: &tok,
		ToolCalls: []map[string]any{{"id": "c1", "function": map[string]any{"name": "terminal", "arguments": "{}"}}}})
	mustAppend(t, db, statedb.NewMessage{SessionID: "new", Role: "user", Content: "again"})
	if err := db.AddUsage(ctx, "old", statedb.Usage{InputTokens: 100, OutputTokens: 20, APICalls: 1}); err != nil {
		t.Fatal(err)
	}
	if err := db.AddUsage(ctx, "new", statedb.Usage{InputTokens: 300, OutputTokens: 50, APICalls: 2}); err != nil {
		t.Fatal(err)
	}
	st, err := db.GetStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Sessions != 3 || st.Messages != 3 || st.InputTokens != 400 || st.OutputTokens != 70 || st.APICalls != 3 {
		t.Fatalf("stats %+v", st)
	}
	if len(st.ByModel) != 2 || len(st.TopSessions) != 3 || st.TopSessions[0].ID != "new" || st.TopSessions[0].TotalTokens != 350 {
		t.Fatalf("stats by model %+v top %+v", st.ByModel, st.TopSessions)
	}
	s, _ := db.GetSession(ctx, "old")
	if s.MessageCount != 2 || s.ToolCallCount != 1 {
		t.Fatalf("counts %+v", s)
	}
	conv, err := db.GetMessagesAsConversation(ctx, "old")
	if err != nil || len(conv) != 2 || conv[1].Role != "assistant" || !strings.Contains(string(conv[1].ToolCalls), "terminal") {
		t.Fatalf("conversation %+v %v", conv, err)
	}

	if err := db.EndSession(ctx, "old", "user_exit", time.Time{}); err != nil {
		t.Fatal(err)
	}
	s, _ = db.GetSession(ctx, "old")
	if s.EndedAt == nil || s.EndReason != "user_exit" {
		t.Fatalf("ended %+v", s)
	}
	if err := db.ReopenSession(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	if s, _ = db.GetSession(ctx, "old"); s.EndedAt != nil || s.EndReason != "" {
		t.Fatalf("reopened %+v", s)
	}
	if err := db.EndSession(ctx, "old", "user_exit", time.Time{}); err != nil {
		t.Fatal(err)
	}

	ex, err := db.ExportSession(ctx, "old")
	if err != nil || ex.ID != "old" || len(ex.Messages) != 2 {
		t.Fatalf("export %+v %v", ex, err)
	}
	var all []string
	if err := db.ExportAll(ctx, statedb.ListOptions{Source: "telegram"}, func(e *statedb.ExportedSession) error {
		all = append(all, e.ID)
		return nil
	}); err != nil || len(all) != 2 {
		t.Fatalf("export all telegram: %v %v", all, err)
	}
	list, err := db.ListSessions(ctx, statedb.ListOptions{})
	if err != nil || len(list) != 3 || list[0].ID != "new" || list[0].Preview != "again" {
		t.Fatalf("list %+v %v", list, err)
	}

	// Prune: only ended sessions older than the cutoff, of the source asked.
	if n, err := db.PruneSessions(ctx, 90*24*time.Hour, "cli"); err != nil || n != 0 {
		t.Fatalf("prune cli: %d %v", n, err)
	}
	n, err := db.PruneSessions(ctx, 90*24*time.Hour, "")
	if err != nil || n != 1 {
		t.Fatalf("prune: %d %v", n, err)
	}
	if _, err := db.GetSession(ctx, "old"); !errors.Is(err, statedb.ErrNotFound) {
		t.Fatalf("pruned session still there: %v", err)
	}
	if _, err := db.GetSession(ctx, "oldopen"); err != nil {
		t.Fatalf("open session pruned: %v", err)
	}
	if s, _ := db.GetSession(ctx, "new"); s.ParentSessionID != "" {
		t.Fatalf("parent link to a pruned session kept: %+v", s)
	}
	if res, _ := db.SearchMessages(ctx, "hello", statedb.SearchOptions{}); len(res) != 0 {
		t.Fatalf("pruned messages still searchable: %+v", res)
	}

	if err := db.ClearMessages(ctx, "new"); err != nil {
		t.Fatal(err)
	}
	if m, _ := db.GetMessages(ctx, "new"); len(m) != 0 {
		t.Fatalf("cleared: %+v", m)
	}
	if s, err := db.GetSession(ctx, "new"); err != nil || s.MessageCount != 0 {
		t.Fatalf("cleared session %+v %v", s, err)
	}
	if err := db.DeleteSession(ctx, "new"); err != nil {
		t.Fatal(err)
	}
	if err := db.DeleteSession(ctx, "new"); !errors.Is(err, statedb.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
}

func TestReadOnlyOpen(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "state.db")
	ctx := context.Background()
	w, err := statedb.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	mustSession(t, w, statedb.NewSession{ID: "s", Source: "cli"})
	r, err := statedb.Open(ctx, path, &statedb.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// The writer keeps writing while the reader reads.
	mustAppend(t, w, statedb.NewMessage{SessionID: "s", Role: "user", Content: "visible to readers"})
	res, err := r.SearchMessages(ctx, "visible", statedb.SearchOptions{})
	if err != nil || len(res) != 1 {
		t.Fatalf("read-only search: %v %v", res, err)
	}
	if err := r.CreateSession(ctx, statedb.NewSession{ID: "x", Source: "cli"}); !errors.Is(err, statedb.ErrReadOnly) {
		t.Fatalf("write on read-only: %v", err)
	}
	if _, err := statedb.Open(ctx, filepath.Join(t.TempDir(), "absent.db"), &statedb.Options{ReadOnly: true}); err == nil {
		t.Fatal("read-only open of a missing file succeeded")
	}
}
