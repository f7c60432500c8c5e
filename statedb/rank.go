package statedb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Ranking. FTS5's bm25() would rank the candidates, but it counts, once per
// query, the rows that hold each phrase of the query by walking the
// phrase's whole doclist: for a common word that is most of the index, and
// it is the bulk of a search's cost. The candidates (the newest matches, see
// candidateCap) are ranked here instead, with bm25's formula and
// parameters (k1 1.2, b 0.75, every column weight 1, the minimum IDF 1e-6):
//
//	score = Σ IDF(p) · f(p)·(k1+1) / (f(p) + k1·(1 − b + b·|D|/avgdl))
//
// f(p) is the number of times phrase p occurs in the message (its columns
// content, tool_name and tool_calls), |D| its number of tokens, avgdl the
// average over the table (FTS5's own totals). The message text is split
// the way the table's tokenizer does (unicode61: runs of letters, digits
// and private-use characters, folded to lower case without diacritics;
// trigram: every three characters, folded to lower case).
//
// IDF(p) = log((N − n(p) + 0.5) / (n(p) + 0.5)), n(p) the rows holding p:
// a query of one phrase needs none (the same factor for every row does not
// change the order). With several phrases, n(p) is counted up to
// idfCountCap; a phrase found more often than that has n(p) estimated from
// the newest idfCountCap rows that hold it (the share of the table's rowid
// range they span, applied to the whole).

const (
	bm25K1 = 1.2
	bm25B  = 0.75
	// idfCountCap bounds the count of the rows holding a phrase.
	idfCountCap = 1000
)

// qPhrase is one phrase of a full-text query, as the table's tokenizer
// splits it.
type qPhrase struct {
	fts    string   // the phrase alone, as an FTS5 query
	toks   []string // its tokens (folded)
	prefix bool     // the last token is a prefix
}

// tokenizer splits text the way an FTS table's tokenizer does.
type tokenizer interface {
	// count adds to into[i] the occurrences of ps[i] in s, and returns s's
	// number of tokens.
	count(s string, ps []qPhrase, into []float64) int
}

// unicode61 mimics FTS5's default tokenizer (remove_diacritics on).
type unicode61 struct {
	scratch []string // the tokens of the text being counted
}

func isTokenRune(r rune) bool {
	if r < utf8.RuneSelf {
		return r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
	}
	return unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.Is(unicode.Co, r)
}

// appendTokens61 appends the tokens of s to dst. An ASCII token is a
// slice of s (copied only to lower-case it).
func appendTokens61(dst []string, s string) []string {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if !isTokenRune(rune(c)) {
				i++
				continue
			}
			j, upper := i, false
			for j < len(s) && s[j] < utf8.RuneSelf && isTokenRune(rune(s[j])) {
				upper = upper || s[j] >= 'A' && s[j] <= 'Z'
				j++
			}
			if j == len(s) || s[j] < utf8.RuneSelf {
				t := s[i:j]
				if upper {
					t = strings.ToLower(t)
				}
				dst = append(dst, t)
				i = j
				continue
			}
			// The token goes on with other characters: the general case.
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if !isTokenRune(r) {
			i += n
			continue
		}
		j, ascii := i, true
		for j < len(s) {
			r, n := utf8.DecodeRuneInString(s[j:])
			// A combining mark inside a token belongs to it (FTS5 drops it
			// when it removes diacritics).
			if !isTokenRune(r) && !(j > i && unicode.Is(unicode.Mn, r)) {
				break
			}
			ascii = ascii && r < utf8.RuneSelf
			j += n
		}
		dst = append(dst, fold61(s[i:j], ascii))
		i = j
	}
	return dst
}

// fold61 lower-cases t and removes its diacritics.
func fold61(t string, ascii bool) string {
	if ascii {
		return strings.ToLower(t)
	}
	var b strings.Builder
	for _, r := range norm.NFD.String(t) {
		if unicode.Is(unicode.Mn, r) {
			continue
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

func (u *unicode61) count(s string, ps []qPhrase, into []float64) int {
	u.scratch = appendTokens61(u.scratch[:0], s)
	toks := u.scratch
	for i, p := range ps {
		into[i] += float64(phraseCount(toks, p))
	}
	return len(toks)
}

// phraseCount counts the positions where the phrase's tokens follow each
// other in toks.
func phraseCount(toks []string, p qPhrase) int {
	k := len(p.toks)
	if k == 0 {
		return 0
	}
	n := 0
	for i := 0; i+k <= len(toks); i++ {
		ok := true
		for j, t := range p.toks {
			if j == k-1 && p.prefix {
				ok = strings.HasPrefix(toks[i+j], t)
			} else {
				ok = toks[i+j] == t
			}
			if !ok {
				break
			}
		}
		if ok {
			n++
		}
	}
	return n
}

// trigram mimics FTS5's trigram tokenizer (case-insensitive): every three
// consecutive characters are a token, so a phrase is a substring.
type trigram struct{}

func foldTrigram(s string) string {
	return strings.Map(unicode.ToLower, s)
}

func (*trigram) count(s string, ps []qPhrase, into []float64) int {
	f := foldTrigram(s)
	for i, p := range ps {
		if len(p.toks) == 0 || p.toks[0] == "" {
			continue
		}
		// Occurrences may overlap ("aaaa" holds "aaa" twice).
		for at := 0; ; {
			k := strings.Index(f[at:], p.toks[0])
			if k < 0 {
				break
			}
			into[i]++
			_, n := utf8.DecodeRuneInString(f[at+k:])
			at += k + n
		}
	}
	return max(utf8.RuneCountInString(f)-2, 0)
}

// wordPhrases splits a sanitized FTS5 query into its phrases: barewords
// and "quoted phrases", each possibly followed by * (a prefix); the
// operators AND, OR and NOT are no phrases.
func wordPhrases(q string) []qPhrase {
	var out []qPhrase
	for i := 0; i < len(q); {
		switch {
		case q[i] == ' ':
			i++
			continue
		case q[i] == '"':
			end := strings.IndexByte(q[i+1:], '"')
			if end < 0 {
				end = len(q) - i - 1
			}
			j := i + 1 + end + 1
			if j < len(q) && q[j] == '*' {
				j++
			}
			out = appendPhrase(out, q[i:min(j, len(q))])
			i = j
		default:
			j := strings.IndexByte(q[i:], ' ')
			if j < 0 {
				j = len(q) - i
			}
			t := q[i : i+j]
			if !isOperator(t) {
				out = appendPhrase(out, t)
			}
			i += j
		}
	}
	return out
}

func appendPhrase(out []qPhrase, fts string) []qPhrase {
	body := strings.TrimSuffix(fts, "*")
	p := qPhrase{fts: fts, prefix: body != fts, toks: appendTokens61(nil, strings.Trim(body, `"`))}
	if len(p.toks) == 0 {
		return out
	}
	return append(out, p)
}

// trigramPhrases are the phrases of a substring search: one per term.
func trigramPhrases(terms []string) []qPhrase {
	out := make([]qPhrase, 0, len(terms))
	for _, t := range terms {
		out = append(out, qPhrase{fts: `"` + strings.ReplaceAll(t, `"`, `""`) + `"`, toks: []string{foldTrigram(t)}})
	}
	return out
}

// ftsTotals reads FTS5's totals of table: its number of rows and of tokens
// (all columns). They are FTS5's averages record (rowid 1 of the %_data
// shadow table): the row count, then each column's token total, as SQLite
// varints.
func (db *DB) ftsTotals(ctx context.Context, table string) (rows, tokens int64, err error) {
	var blob []byte
	err = db.r.QueryRowContext(ctx, `SELECT block FROM `+table+`_data WHERE id = 1`).Scan(&blob)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("%s totals: %w", table, err)
	}
	var v []int64
	for len(blob) > 0 {
		x, n := sqliteVarint(blob)
		if n == 0 {
			break
		}
		v = append(v, int64(x))
		blob = blob[n:]
	}
	if len(v) == 0 {
		return 0, 0, nil
	}
	for _, t := range v[1:] {
		tokens += t
	}
	return v[0], tokens, nil
}

// sqliteVarint decodes a SQLite varint (big-endian groups of 7 bits, the
// ninth byte whole). n is 0 when b is too short.
func sqliteVarint(b []byte) (uint64, int) {
	var v uint64
	for i := 0; i < 9; i++ {
		if i >= len(b) {
			return 0, 0
		}
		if i == 8 {
			return v<<8 | uint64(b[i]), 9
		}
		v = v<<7 | uint64(b[i]&0x7f)
		if b[i]&0x80 == 0 {
			return v, i + 1
		}
	}
	return v, 9
}

// docFreq returns the number of rows of table holding the phrase, counted
// up to idfCountCap and estimated beyond (see the ranking comment above).
func (db *DB) docFreq(ctx context.Context, table string, p qPhrase, rows int64) (float64, error) {
	var n int64
	var oldest sql.NullInt64
	err := db.r.QueryRowContext(ctx, `SELECT count(*), min(rowid) FROM (SELECT rowid FROM `+table+` WHERE `+table+
		` MATCH ? ORDER BY rowid DESC LIMIT ?)`, p.fts, idfCountCap).Scan(&n, &oldest)
	if err != nil {
		return 0, err
	}
	if n < idfCountCap || !oldest.Valid {
		return float64(n), nil
	}
	// Two subqueries: SQLite reads MIN or MAX of a rowid from the end of
	// the b-tree only when it is alone in its SELECT.
	var lo, hi int64
	if err := db.r.QueryRowContext(ctx, `SELECT COALESCE((SELECT MIN(id) FROM messages), 0), COALESCE((SELECT MAX(id) FROM messages), 0)`).Scan(&lo, &hi); err != nil {
		return 0, err
	}
	span := float64(hi - oldest.Int64 + 1)
	if span <= 0 || hi <= lo {
		return float64(n), nil
	}
	est := float64(n) * float64(hi-lo+1) / span
	return min(est, float64(rows)), nil
}

// candidate is a matching message with what ranking reads of it.
type candidate struct {
	id    int64
	rank  float64
	texts [3]sql.NullString // content, tool_name, tool_calls
}

// rankCandidates sets each candidate's rank (lower is better, as FTS5's
// bm25 returns it).
func (db *DB) rankCandidates(ctx context.Context, table string, tk tokenizer, ps []qPhrase, cands []candidate) error {
	if len(cands) == 0 || len(ps) == 0 {
		return nil
	}
	rows, tokens, err := db.ftsTotals(ctx, table)
	if err != nil {
		return err
	}
	avgdl := 1.0
	if rows > 0 && tokens > 0 {
		avgdl = float64(tokens) / float64(rows)
	}
	idf := make([]float64, len(ps))
	for i := range idf {
		idf[i] = 1
	}
	if len(ps) > 1 {
		for i, p := range ps {
			n, err := db.docFreq(ctx, table, p, rows)
			if err != nil {
				return fmt.Errorf("search: document frequency of %s: %w", p.fts, err)
			}
			idf[i] = math.Log((float64(rows) - n + 0.5) / (n + 0.5))
			if idf[i] <= 0 {
				idf[i] = 1e-6
			}
		}
	}
	freq := make([]float64, len(ps))
	for c := range cands {
		clear(freq)
		d := 0
		for _, t := range cands[c].texts {
			if t.Valid {
				d += tk.count(t.String, ps, freq)
			}
		}
		norm := bm25K1 * (1 - bm25B + bm25B*float64(d)/avgdl)
		score := 0.0
		for i, f := range freq {
			score += idf[i] * f * (bm25K1 + 1) / (f + norm)
		}
		cands[c].rank = -score
	}
	return nil
}
