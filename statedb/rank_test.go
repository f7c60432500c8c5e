package statedb

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fillRankCorpus writes n messages from the benchmark's generator (Zipf
// words, 1% Chinese), plus a few with accents, punctuation, tool names and
// tool calls, into one write transaction.
func fillRankCorpus(t *testing.T, db *DB, n int) {
	t.Helper()
	ctx := context.Background()
	c := newCorpus(7)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type msg struct{ Role, Content, ToolName, ToolCalls string }
	extra := []msg{
		{Role: "user", Content: "Le café est prêt, CAFÉ crème; naïve résumé"},
		{Role: "assistant", Content: "use chat-send to deploy my-app.config.ts (P2.2) deploy deployment deployed"},
		{Role: "tool", ToolName: "terminal", Content: "kubectl get pods", ToolCalls: `[{"function":{"name":"terminal","arguments":"{\"cmd\":\"deploy\"}"}}]`},
		{Role: "user", Content: "我想部署一个新的服务器 部署 服务器服务器"},
		{Role: "user", Content: "aaaa aaa aaaaaa"},
	}
	err := db.write(ctx, func(tx *sql.Tx) error {
		if err := createSession(ctx, tx, NewSession{ID: "s", Source: "cli", StartedAt: base}); err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			m := msg{Role: "user", Content: c.text()}
			if i%(n/len(extra)) == 0 && i/(n/len(extra)) < len(extra) {
				m = extra[i/(n/len(extra))]
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO messages (session_id, role, content, tool_name, tool_calls, timestamp) VALUES ('s', ?, ?, ?, ?, ?)`,
				m.Role, m.Content, nullIfEmpty(m.ToolName), nullIfEmpty(m.ToolCalls), unix(base.Add(time.Duration(i)*time.Second))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// TestRankMatchesBM25: the ranks computed for the candidates equal FTS5's
// own bm25() for every matching row, on both indexes, for queries of one
// and of several phrases (words, phrases, prefixes, OR, NOT, accents,
// punctuation, tool names and calls, substrings), as long as each phrase
// is held by fewer rows than idfCountCap (the document frequency is then
// counted, not estimated).
func TestRankMatchesBM25(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "state.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	fillRankCorpus(t, db, 900)
	c := newCorpus(7)
	common, rare := c.vocab[2], c.vocab[40]
	check := func(table string, tk tokenizer, match string, ps []qPhrase) {
		t.Helper()
		rows, err := db.r.QueryContext(ctx, `SELECT f.rowid, bm25(`+table+`), m.content, m.tool_name, m.tool_calls FROM `+table+
			` f JOIN messages m ON m.id = f.rowid WHERE `+table+` MATCH ?`, match)
		if err != nil {
			t.Fatalf("%s %q: %v", table, match, err)
		}
		var cands []candidate
		var want []float64
		for rows.Next() {
			var c candidate
			var w float64
			if err := rows.Scan(&c.id, &w, &c.texts[0], &c.texts[1], &c.texts[2]); err != nil {
				t.Fatal(err)
			}
			cands = append(cands, c)
			want = append(want, w)
		}
		rows.Close()
		if len(cands) == 0 {
			t.Fatalf("%s %q matches nothing: not a test", table, match)
		}
		if err := db.rankCandidates(ctx, table, tk, ps, cands); err != nil {
			t.Fatal(err)
		}
		for i, c := range cands {
			// One phrase: bm25's IDF is one factor for every row, left out
			// here; the ratio of the ranks is the same for every row.
			w := want[i]
			if len(ps) == 1 {
				w = want[i] / want[0] * cands[0].rank
			}
			if math.Abs(c.rank-w) > 1e-9*math.Max(1, math.Abs(w)) {
				t.Errorf("%s %q row %d: rank %.12g, bm25 %.12g (texts %v)", table, match, c.id, c.rank, w, c.texts)
			}
		}
	}
	for _, q := range []string{
		common, rare, common + " " + rare, `"` + common + " " + c.vocab[3] + `"`, common[:3] + "*", common + " OR " + rare,
		common + " NOT " + rare, "cafe", "café résumé", "CAFE* naive", `"chat-send"`, `"my-app.config.ts"`, `"P2.2"`, "deploy*",
		"deploy deployment", "terminal", "cmd", "服务器服务器", "aaa",
	} {
		m := SanitizeQuery(q)
		check("messages_fts", &unicode61{}, m, wordPhrases(m))
	}
	for _, terms := range [][]string{{"部署"}, {"服务器"}, {"aaa"}, {"ploy"}, {"ploy", "ter"}, {common[1:5]}, {"CAFÉ"}, {`a"b`}} {
		var long []string
		for _, t := range terms {
			long = append(long, `"`+strings.ReplaceAll(t, `"`, `""`)+`"`)
		}
		match := strings.Join(long, " ")
		var n int
		if err := db.r.QueryRowContext(ctx, `SELECT count(*) FROM messages_fts_trigram WHERE messages_fts_trigram MATCH ?`, match).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			continue // a term below a trigram, or absent: nothing to compare
		}
		check("messages_fts_trigram", &trigram{}, match, trigramPhrases(terms))
	}
}

// TestDocFreqEstimate: a phrase held by more rows than idfCountCap gets
// its document frequency estimated from the newest idfCountCap of them;
// for a word spread evenly over the rows the estimate is near the count.
func TestDocFreqEstimate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "state.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const n = 6000
	err = db.write(ctx, func(tx *sql.Tx) error {
		if err := createSession(ctx, tx, NewSession{ID: "s", Source: "cli", StartedAt: time.Unix(0, 0)}); err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			text := fmt.Sprintf("filler%d", i)
			if i%3 == 0 {
				text += " every third"
			}
			if i%2 == 0 {
				text += " even"
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO messages (session_id, role, content, timestamp) VALUES ('s', 'user', ?, ?)`, text, i); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rows, _, err := db.ftsTotals(ctx, "messages_fts")
	if err != nil || rows != n {
		t.Fatalf("totals: %d rows, %v", rows, err)
	}
	for word, want := range map[string]float64{"third": n / 3, "even": n / 2, "filler42": 1} {
		got, err := db.docFreq(ctx, "messages_fts", qPhrase{fts: word}, rows)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(got-want) > 0.05*want {
			t.Errorf("%s: document frequency %.1f, want about %.0f", word, got, want)
		}
	}
}

// TestSearchRanksNewestCandidates: a query matching more than
// candidateCap messages returns the best among its newest candidateCap
// matches: older messages that bm25 would rank higher are not returned;
// a query matching fewer ranks all of its matches.
func TestSearchRanksNewestCandidates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "state.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const old = 100
	err = db.write(ctx, func(tx *sql.Tx) error {
		if err := createSession(ctx, tx, NewSession{ID: "s", Source: "cli", StartedAt: time.Unix(0, 0)}); err != nil {
			return err
		}
		for i := 0; i < old+candidateCap; i++ {
			text := "needle hay hay hay hay hay"
			if i < old {
				text = "needle needle needle needle oldest"
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO messages (id, session_id, role, content, timestamp) VALUES (?, 's', 'user', ?, ?)`, i+1, text, i); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err := db.SearchMessages(ctx, "needle", SearchOptions{Limit: 50})
	if err != nil || len(res) != 50 {
		t.Fatalf("needle: %d results, %v", len(res), err)
	}
	for _, r := range res {
		if r.ID <= old {
			t.Fatalf("needle returned message %d, older than the newest %d matches", r.ID, candidateCap)
		}
	}
	// Among equals, the newer first.
	if res[0].ID != int64(old+candidateCap) || res[1].ID != int64(old+candidateCap-1) {
		t.Fatalf("ties: first results %d, %d", res[0].ID, res[1].ID)
	}
	res, err = db.SearchMessages(ctx, "needle oldest", SearchOptions{Limit: 5})
	if err != nil || len(res) != 5 || res[0].ID != old {
		t.Fatalf("needle oldest: %+v %v", res, err)
	}
}
