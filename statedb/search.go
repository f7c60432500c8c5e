package statedb

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

var (
	quotedPhrase  = regexp.MustCompile(`"[^"]*"`)
	placeholderRe = regexp.MustCompile("\x00Q(\\d+)\x00")
	starRun       = regexp.MustCompile(`\*{2,}`)
)

// SanitizeQuery turns user input into a valid FTS5 query while keeping the
// FTS5 syntax people type on purpose (the storage design's sanitizer):
//   - balanced "quoted phrases" are kept as they are;
//   - unmatched quotes and the special characters + { } ( ) ^ are dropped;
//   - runs of * become one, and a * that starts a term is dropped (a prefix
//     query needs at least one character before it): deploy* stays a prefix;
//   - AND, OR and NOT with nothing on one side are dropped ("hello AND" →
//     "hello"), as is an operator right after another one;
//   - terms FTS5 would split or misread (chat-send, P2.2, my-app.config.ts,
//     module:auth) are wrapped in quotes, so they match as a phrase;
//   - terms with no letter or digit are dropped.
//
// It returns "" when nothing searchable is left.
func SanitizeQuery(q string) string {
	var phrases []string
	s := quotedPhrase.ReplaceAllStringFunc(q, func(m string) string {
		phrases = append(phrases, m)
		return fmt.Sprintf(" \x00Q%d\x00 ", len(phrases)-1)
	})
	s = strings.Map(func(r rune) rune {
		switch r {
		case '+', '{', '}', '(', ')', '"', '^':
			return ' '
		}
		return r
	}, s)
	s = starRun.ReplaceAllString(s, "*")
	var terms []string
	for _, t := range strings.Fields(s) {
		if placeholderRe.MatchString(t) {
			terms = append(terms, t)
			continue
		}
		t = strings.TrimLeft(t, "*")
		if t == "" {
			continue
		}
		if isOperator(t) {
			terms = append(terms, t)
			continue
		}
		prefix := strings.HasSuffix(t, "*")
		body := strings.TrimRight(t, "*")
		body = strings.ReplaceAll(body, "*", " ")
		if !hasWordChar(body) {
			continue
		}
		if isBareword(body) {
			terms = append(terms, t)
			continue
		}
		quoted := `"` + strings.Join(strings.Fields(body), " ") + `"`
		if prefix {
			quoted += "*"
		}
		terms = append(terms, quoted)
	}
	// Operators need an operand on both sides.
	var out []string
	for _, t := range terms {
		if isOperator(t) && (len(out) == 0 || isOperator(out[len(out)-1])) {
			continue
		}
		out = append(out, t)
	}
	for len(out) > 0 && isOperator(out[len(out)-1]) {
		out = out[:len(out)-1]
	}
	res := strings.Join(out, " ")
	res = placeholderRe.ReplaceAllStringFunc(res, func(m string) string {
		var i int
		fmt.Sscanf(placeholderRe.FindStringSubmatch(m)[1], "%d", &i)
		return phrases[i]
	})
	// A quoted phrase with nothing inside matches nothing; drop it.
	res = strings.Join(strings.Fields(strings.ReplaceAll(res, `""`, " ")), " ")
	return res
}

func isOperator(t string) bool { return t == "AND" || t == "OR" || t == "NOT" }

// isBareword reports whether FTS5 reads s as one plain term: ASCII letters,
// digits, '_' and any non-ASCII character.
func isBareword(s string) bool {
	for _, r := range s {
		if r < 0x80 && !(r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return s != ""
}

func hasWordChar(s string) bool {
	for _, r := range s {
		if unicode.IsLetter(r) || unicode.IsDigit(r) || r >= 0x80 && !unicode.IsSpace(r) && !unicode.IsPunct(r) && !unicode.IsSymbol(r) {
			return true
		}
	}
	return false
}

// HasCJK reports whether s holds Chinese, Japanese or Korean characters,
// which the word tokenizer cannot split (they go to the trigram index).
func HasCJK(s string) bool {
	for _, r := range s {
		if unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Hangul) {
			return true
		}
	}
	return false
}

// SearchOptions filter SearchMessages.
type SearchOptions struct {
	// Sources keeps only sessions of these sources; empty keeps all.
	Sources []string
	// ExcludeSources drops sessions of these sources.
	ExcludeSources []string
	// Roles keeps only messages of these roles (user, assistant, tool, system).
	Roles []string
	// SessionID keeps only one session's messages.
	SessionID string
	// Limit caps the results. Defaults to 20; at most 500.
	Limit int
	// Offset skips results.
	Offset int
}

// SearchResult is one matching message.
type SearchResult struct {
	ID        int64     `json:"id"`
	SessionID string    `json:"session_id"`
	Role      string    `json:"role"`
	Timestamp time.Time `json:"timestamp"`
	// Snippet is the matching text with each match marked >>>like this<<<.
	Snippet string `json:"snippet"`
	// Context is the message before and the one after (content cut at 200
	// characters), when there are such.
	Context        []ContextMessage `json:"context"`
	Source         string           `json:"source"`
	Model          string           `json:"model,omitempty"`
	Title          string           `json:"title,omitempty"`
	SessionStarted time.Time        `json:"session_started"`
}

// ContextMessage is a neighbour of a search result.
type ContextMessage struct {
	ID        int64     `json:"id"`
	Role      string    `json:"role"`
	Content   string    `json:"content"`
	Timestamp time.Time `json:"timestamp"`
}

const contextChars = 200

// SearchMessages runs a full-text search over content, tool names and tool
// calls. The query goes through SanitizeQuery, so FTS5 syntax works
// (phrases, OR, NOT, prefix*) and stray syntax is harmless. Queries with
// CJK characters use the trigram index (terms shorter than three
// characters fall back to a substring scan), and a query the word index
// finds nothing for is tried again as substrings on the trigram index when
// one of its words is not an indexed word (allWords).
//
// Results are the best matches among the newest candidateCap (1 000) live
// matches that pass the filters, best first by bm25 (rank.go), the newer
// first on a tie; Offset and Limit page through that order.
// Soft-deleted messages are never returned.
func (db *DB) SearchMessages(ctx context.Context, query string, o SearchOptions) ([]SearchResult, error) {
	if o.Limit <= 0 {
		o.Limit = 20
	}
	o.Limit = min(o.Limit, 500)
	o.Offset = max(o.Offset, 0)
	q := SanitizeQuery(query)
	if q == "" {
		return []SearchResult{}, nil
	}
	var res []SearchResult
	var err error
	if HasCJK(query) {
		res, err = db.substringSearch(ctx, query, o)
	} else {
		res, err = db.ftsSearch(ctx, "messages_fts", q, o)
		if err == nil && len(res) == 0 && o.Offset == 0 {
			var words bool
			if words, err = db.allWords(ctx, query); err == nil && !words {
				res, err = db.substringSearch(ctx, query, o)
			}
		}
	}
	if err != nil {
		return nil, err
	}
	if err := db.addContexts(ctx, res); err != nil {
		return nil, err
	}
	return res, nil
}

// allWords reports whether every word of query (the words of its quoted
// phrases included) is a word the word index holds. When it is, the word
// index's answer stands even when it is empty (two words that never meet,
// a phrase nobody wrote): a substring search could only add messages where
// a word is part of a longer one, and on a large file it costs a scan of
// the trigram index (for a phrase of common words, of their long trigram
// doclists). A word that is not in the index (a fragment such as "kube"
// of "kubernetes", a typo) is what the substring search is for. Each check
// reads the first row of one doclist.
func (db *DB) allWords(ctx context.Context, query string) (bool, error) {
	seen := map[string]bool{}
	for _, term := range searchTerms(query) {
		for _, w := range appendTokens61(nil, term) {
			if seen[w] {
				continue
			}
			seen[w] = true
			var one int
			err := db.r.QueryRowContext(ctx, `SELECT 1 FROM messages_fts WHERE messages_fts MATCH ? LIMIT 1`,
				`"`+strings.ReplaceAll(w, `"`, `""`)+`"`).Scan(&one)
			if err == sql.ErrNoRows {
				return false, nil
			}
			if err != nil {
				return false, fmt.Errorf("search %q: %w", query, err)
			}
		}
	}
	return true, nil
}

func (o SearchOptions) filters() (string, []any) {
	var b strings.Builder
	var args []any
	in := func(col string, vals []string, not bool) {
		if len(vals) == 0 {
			return
		}
		op := " IN ("
		if not {
			op = " NOT IN ("
		}
		b.WriteString(" AND " + col + op + placeholders(len(vals)) + ")")
		for _, v := range vals {
			args = append(args, v)
		}
	}
	in("s.source", o.Sources, false)
	in("s.source", o.ExcludeSources, true)
	in("m.role", o.Roles, false)
	if o.SessionID != "" {
		b.WriteString(" AND m.session_id = ?")
		args = append(args, o.SessionID)
	}
	return b.String(), args
}

// candidateCap bounds the matches a search ranks: the newest candidateCap
// live matches (highest ids) that pass the filters are ranked (bm25,
// rank.go) and the best are returned. A query matching fewer messages is
// ranked over all of them; one matching more (a very common word) returns
// the best of the newest, and costs the same as a rare one.
const candidateCap = 1000

func (db *DB) ftsSearch(ctx context.Context, table, match string, o SearchOptions) ([]SearchResult, error) {
	return db.rankedSearch(ctx, table, match, "", nil, o, nil, &unicode61{}, wordPhrases(match))
}

// rankedSearch runs match on an FTS table (plus extra conditions on m),
// ranks the bounded candidates (rank.go) and fills each result's snippet.
//
// It costs three statements whatever the number of matches (plus, for a
// query of several phrases, one count per phrase for its IDF): the
// candidate scan (the FTS table is the outer loop, walked newest rowid
// first, so the candidate LIMIT stops it early; it reads the candidates'
// text, which ranking needs), then, for the page of results alone, one
// statement for their sessions and one for their snippets.
func (db *DB) rankedSearch(ctx context.Context, table, match, extra string, extraArgs []any, o SearchOptions, mark func(string) string,
	tk tokenizer, ps []qPhrase) ([]SearchResult, error) {
	filters, args := o.filters()
	// The sessions are joined only to filter on their source: each
	// candidate costs one more b-tree lookup.
	join := ""
	if len(o.Sources) > 0 || len(o.ExcludeSources) > 0 {
		join = " CROSS JOIN sessions s ON s.id = m.session_id"
	}
	q := `SELECT f.rowid, m.content, m.tool_name, m.tool_calls FROM ` + table + ` f
			CROSS JOIN messages m ON m.id = f.rowid` + join + `
		WHERE ` + table + ` MATCH ? AND m.deleted_at IS NULL` + filters + extra + `
		ORDER BY f.rowid DESC LIMIT ?`
	all := append([]any{match}, args...)
	all = append(append(all, extraArgs...), candidateCap)
	rows, err := db.r.QueryContext(ctx, q, all...)
	if err != nil {
		return nil, fmt.Errorf("search %q: %w", match, err)
	}
	var cands []candidate
	for rows.Next() {
		var c candidate
		if err := rows.Scan(&c.id, &c.texts[0], &c.texts[1], &c.texts[2]); err != nil {
			rows.Close()
			return nil, err
		}
		cands = append(cands, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("search %q: %w", match, err)
	}
	if err := db.rankCandidates(ctx, table, tk, ps, cands); err != nil {
		return nil, err
	}
	// bm25 is lower for better matches; ties go to the newer message.
	slices.SortFunc(cands, func(a, b candidate) int {
		if c := cmp.Compare(a.rank, b.rank); c != 0 {
			return c
		}
		return cmp.Compare(b.id, a.id)
	})
	if o.Offset >= len(cands) {
		return []SearchResult{}, nil
	}
	cands = cands[o.Offset:min(o.Offset+o.Limit, len(cands))]
	ids := make([]any, len(cands))
	for i, c := range cands {
		ids[i] = c.id
	}
	in := placeholders(len(ids))
	rows, err = db.r.QueryContext(ctx, `SELECT m.id, m.session_id, m.role, m.timestamp, '', s.source, s.model, s.title, s.started_at
		FROM messages m JOIN sessions s ON s.id = m.session_id WHERE m.id IN (`+in+`)`, ids...)
	if err != nil {
		return nil, fmt.Errorf("search %q: %w", match, err)
	}
	found, err := scanResults(rows, nil)
	rows.Close()
	if err != nil {
		return nil, err
	}
	byID := make(map[int64]*SearchResult, len(found))
	for i := range found {
		byID[found[i].ID] = &found[i]
	}
	// The page's snippets in one statement. FTS5 sets a MATCH up once per
	// statement, or once per value of an IN list on rowid; each set-up
	// seeks every phrase's doclist to the row. That is cheap, except for a
	// prefix query of a length the word index keeps no prefix index for:
	// its set-up merges the doclists of every word the prefix expands to.
	// Such a query reads the page's rowid range under one MATCH instead,
	// the snippet evaluated for the page's rows only.
	var snipQ string
	var snipArgs []any
	if mergedPrefix(table, ps) {
		lo, hi := cands[0].id, cands[0].id
		for _, c := range cands {
			lo, hi = min(lo, c.id), max(hi, c.id)
		}
		snipQ = `SELECT rowid, CASE WHEN rowid IN (` + in + `) THEN snippet(` + table + `, -1, '>>>', '<<<', '...', 40) END FROM ` + table +
			` WHERE ` + table + ` MATCH ? AND rowid BETWEEN ? AND ?`
		snipArgs = append(append(append([]any{}, ids...), match), lo, hi)
	} else {
		snipQ = `SELECT rowid, snippet(` + table + `, -1, '>>>', '<<<', '...', 40) FROM ` + table +
			` WHERE ` + table + ` MATCH ? AND rowid IN (` + in + `)`
		snipArgs = append([]any{match}, ids...)
	}
	rows, err = db.r.QueryContext(ctx, snipQ, snipArgs...)
	if err != nil {
		return nil, fmt.Errorf("search %q: snippets: %w", match, err)
	}
	for rows.Next() {
		var id int64
		var snip sql.NullString
		if err := rows.Scan(&id, &snip); err != nil {
			rows.Close()
			return nil, err
		}
		if r := byID[id]; r != nil && snip.Valid {
			r.Snippet = snip.String
			if mark != nil {
				r.Snippet = mark(r.Snippet)
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("search %q: snippets: %w", match, err)
	}
	res := make([]SearchResult, 0, len(cands))
	for _, c := range cands {
		if r := byID[c.id]; r != nil {
			res = append(res, *r)
		}
	}
	return res, nil
}

// mergedPrefix reports whether FTS5 evaluates a phrase of ps by merging
// doclists: a prefix on the word index of a length it keeps no prefix
// index for (wordPrefixes).
func mergedPrefix(table string, ps []qPhrase) bool {
	if table != "messages_fts" {
		return false
	}
	for _, p := range ps {
		if !p.prefix {
			continue
		}
		// The prefix is the phrase's last token, as the tokenizer folds it.
		last := p.toks[len(p.toks)-1]
		if !slices.Contains(strings.Fields(wordPrefixes), strconv.Itoa(utf8.RuneCountInString(last))) {
			return true
		}
	}
	return false
}

func scanResults(rows *sql.Rows, mark func(content string) string) ([]SearchResult, error) {
	out := []SearchResult{}
	for rows.Next() {
		var r SearchResult
		var ts, started float64
		var snippet, model, title sql.NullString
		if err := rows.Scan(&r.ID, &r.SessionID, &r.Role, &ts, &snippet, &r.Source, &model, &title, &started); err != nil {
			return nil, err
		}
		r.Timestamp, r.SessionStarted = fromUnix(ts), fromUnix(started)
		r.Snippet, r.Model, r.Title = snippet.String, model.String, title.String
		if mark != nil {
			r.Snippet = mark(r.Snippet)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// searchTerms splits a query into the literal strings a substring search
// looks for: quoted phrases whole, other words on spaces, FTS5 operators
// and syntax characters dropped.
func searchTerms(q string) []string {
	var terms []string
	s := quotedPhrase.ReplaceAllStringFunc(q, func(m string) string {
		if p := strings.TrimSpace(strings.Trim(m, `"`)); p != "" {
			terms = append(terms, p)
		}
		return " "
	})
	s = strings.Map(func(r rune) rune {
		switch r {
		case '+', '{', '}', '(', ')', '"', '^', '*':
			return ' '
		}
		return r
	}, s)
	for _, t := range strings.Fields(s) {
		if isOperator(t) || !hasWordChar(t) {
			continue
		}
		terms = append(terms, t)
	}
	return terms
}

// substringSearch finds messages that contain every term as a substring:
// terms of three or more characters through the trigram index, shorter
// ones by a LIKE filter (SQLite's LIKE is case-insensitive for ASCII).
func (db *DB) substringSearch(ctx context.Context, query string, o SearchOptions) ([]SearchResult, error) {
	terms := searchTerms(query)
	if len(terms) == 0 {
		return []SearchResult{}, nil
	}
	var long, longTerms, short []string
	for _, t := range terms {
		if utf8.RuneCountInString(t) >= 3 {
			longTerms = append(longTerms, t)
			long = append(long, `"`+strings.ReplaceAll(t, `"`, `""`)+`"`)
		} else {
			short = append(short, t)
		}
	}
	filters, args := o.filters()
	var likes strings.Builder
	var likeArgs []any
	for _, t := range short {
		likes.WriteString(` AND (m.content LIKE ? ESCAPE '\' OR m.tool_name LIKE ? ESCAPE '\' OR m.tool_calls LIKE ? ESCAPE '\')`)
		p := "%" + strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(t) + "%"
		likeArgs = append(likeArgs, p, p, p)
	}
	mark := func(s string) string { return markTerms(s, short) }
	if len(long) > 0 {
		return db.rankedSearch(ctx, "messages_fts_trigram", strings.Join(long, " "), likes.String(), likeArgs, o, mark,
			&trigram{}, trigramPhrases(longTerms))
	}
	q := `SELECT m.id, m.session_id, m.role, m.timestamp, COALESCE(m.content, m.tool_name, m.tool_calls, ''),
		s.source, s.model, s.title, s.started_at
		FROM messages m JOIN sessions s ON s.id = m.session_id
		WHERE m.deleted_at IS NULL` + filters + likes.String() + `
		ORDER BY m.timestamp DESC, m.id DESC LIMIT ? OFFSET ?`
	rows, err := db.r.QueryContext(ctx, q, append(append(args, likeArgs...), o.Limit, o.Offset)...)
	if err != nil {
		return nil, fmt.Errorf("substring search: %w", err)
	}
	defer rows.Close()
	return scanResults(rows, func(s string) string { return snippetAround(s, short) })
}

// markTerms marks the occurrences of terms that are not marked yet (the
// short terms a trigram snippet does not highlight).
func markTerms(s string, terms []string) string {
	for _, t := range terms {
		if t == "" || strings.Contains(s, ">>>"+t+"<<<") {
			continue
		}
		s = strings.ReplaceAll(s, t, ">>>"+t+"<<<")
	}
	return s
}

// snippetAround cuts about 40 characters either side of the first term
// and marks every term.
func snippetAround(s string, terms []string) string {
	r := []rune(s)
	at := -1
	for _, t := range terms {
		if i := strings.Index(s, t); i >= 0 {
			at = utf8.RuneCountInString(s[:i])
			break
		}
	}
	if at < 0 {
		at = 0
	}
	from, to := max(at-40, 0), min(at+40, len(r))
	out := string(r[from:to])
	if from > 0 {
		out = "..." + out
	}
	if to < len(r) {
		out += "..."
	}
	return markTerms(out, terms)
}

// addContexts fills each result's context, the message before and the one
// after it in its session, in one statement for the page: per result and
// side, one seek into the session's (session_id, timestamp) index.
func (db *DB) addContexts(ctx context.Context, res []SearchResult) error {
	if len(res) == 0 {
		return nil
	}
	var vals strings.Builder
	args := make([]any, 0, 3*len(res))
	at := make(map[int64]int, len(res))
	for i := range res {
		if i > 0 {
			vals.WriteString(",")
		}
		vals.WriteString("(?,?,?)")
		args = append(args, res[i].ID, res[i].SessionID, unix(res[i].Timestamp))
		at[res[i].ID] = i
		res[i].Context = []ContextMessage{}
	}
	side := func(n int, cmpTS, cmpID, order string) string {
		return `SELECT r.id, ` + strconv.Itoa(n) + `, c.id, c.role, COALESCE(c.content, ''), c.timestamp FROM r
		JOIN messages c ON c.id = (SELECT id FROM messages WHERE session_id = r.sid AND deleted_at IS NULL
			AND timestamp ` + cmpTS + `= r.ts AND (timestamp ` + cmpTS + ` r.ts OR id ` + cmpID + ` r.id)
			ORDER BY timestamp ` + order + `, id ` + order + ` LIMIT 1)`
	}
	q := `WITH r(id, sid, ts) AS (VALUES ` + vals.String() + `) ` +
		side(0, "<", "<", "DESC") + ` UNION ALL ` + side(1, ">", ">", "")
	rows, err := db.r.QueryContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("search context: %w", err)
	}
	defer rows.Close()
	type found struct {
		c     ContextMessage
		after bool
	}
	got := make([][]found, len(res))
	for rows.Next() {
		var id int64
		var after int
		var c ContextMessage
		var t float64
		if err := rows.Scan(&id, &after, &c.ID, &c.Role, &c.Content, &t); err != nil {
			return err
		}
		c.Timestamp = fromUnix(t)
		if rr := []rune(c.Content); len(rr) > contextChars {
			c.Content = string(rr[:contextChars])
		}
		got[at[id]] = append(got[at[id]], found{c, after == 1})
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("search context: %w", err)
	}
	// The message before, then the one after.
	for i, fs := range got {
		slices.SortFunc(fs, func(a, b found) int {
			if a.after == b.after {
				return 0
			}
			if a.after {
				return 1
			}
			return -1
		})
		for _, f := range fs {
			res[i].Context = append(res[i].Context, f.c)
		}
	}
	return nil
}
