package statedb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Session is one row of the sessions table. Times are UTC; the file stores
// them as Unix epoch seconds (REAL).
type Session struct {
	ID               string     `json:"id"`
	Source           string     `json:"source"`
	UserID           string     `json:"user_id,omitempty"`
	Model            string     `json:"model,omitempty"`
	ModelConfig      string     `json:"model_config,omitempty"`
	SystemPrompt     string     `json:"system_prompt,omitempty"`
	ParentSessionID  string     `json:"parent_session_id,omitempty"`
	StartedAt        time.Time  `json:"started_at"`
	EndedAt          *time.Time `json:"ended_at,omitempty"`
	EndReason        string     `json:"end_reason,omitempty"`
	MessageCount     int64      `json:"message_count"`
	ToolCallCount    int64      `json:"tool_call_count"`
	InputTokens      int64      `json:"input_tokens"`
	OutputTokens     int64      `json:"output_tokens"`
	CacheReadTokens  int64      `json:"cache_read_tokens"`
	CacheWriteTokens int64      `json:"cache_write_tokens"`
	ReasoningTokens  int64      `json:"reasoning_tokens"`
	BillingProvider  string     `json:"billing_provider,omitempty"`
	BillingBaseURL   string     `json:"billing_base_url,omitempty"`
	BillingMode      string     `json:"billing_mode,omitempty"`
	EstimatedCostUSD *float64   `json:"estimated_cost_usd,omitempty"`
	ActualCostUSD    *float64   `json:"actual_cost_usd,omitempty"`
	CostStatus       string     `json:"cost_status,omitempty"`
	CostSource       string     `json:"cost_source,omitempty"`
	PricingVersion   string     `json:"pricing_version,omitempty"`
	Title            string     `json:"title,omitempty"`
	APICallCount     int64      `json:"api_call_count"`
	// Lane is the fleet lane (conversation) of the session, when known.
	Lane string `json:"lane,omitempty"`

	// Preview and LastActive are filled by ListSessions: the first user
	// message (63 characters) and the newest message time.
	Preview    string     `json:"preview,omitempty"`
	LastActive *time.Time `json:"last_active,omitempty"`
}

const sessionCols = `id, source, user_id, model, model_config, system_prompt, parent_session_id, started_at, ended_at, end_reason,
	message_count, tool_call_count, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens,
	billing_provider, billing_base_url, billing_mode, estimated_cost_usd, actual_cost_usd, cost_status, cost_source,
	pricing_version, title, api_call_count, lane`

type scanner interface{ Scan(dest ...any) error }

func scanSession(sc scanner, extra ...any) (*Session, error) {
	var s Session
	var userID, model, modelCfg, sysPrompt, parent, endReason, bProv, bURL, bMode, cStatus, cSource, pVer, title, lane sql.NullString
	var started float64
	var ended, est, act sql.NullFloat64
	var mc, tc, in, out, cr, cw, rt, api sql.NullInt64
	dest := []any{&s.ID, &s.Source, &userID, &model, &modelCfg, &sysPrompt, &parent, &started, &ended, &endReason,
		&mc, &tc, &in, &out, &cr, &cw, &rt, &bProv, &bURL, &bMode, &est, &act, &cStatus, &cSource, &pVer, &title, &api, &lane}
	if err := sc.Scan(append(dest, extra...)...); err != nil {
		return nil, err
	}
	s.UserID, s.Model, s.ModelConfig, s.SystemPrompt = userID.String, model.String, modelCfg.String, sysPrompt.String
	s.ParentSessionID, s.EndReason, s.Title, s.Lane = parent.String, endReason.String, title.String, lane.String
	s.BillingProvider, s.BillingBaseURL, s.BillingMode = bProv.String, bURL.String, bMode.String
	s.CostStatus, s.CostSource, s.PricingVersion = cStatus.String, cSource.String, pVer.String
	s.StartedAt = fromUnix(started)
	if ended.Valid {
		t := fromUnix(ended.Float64)
		s.EndedAt = &t
	}
	if est.Valid {
		v := est.Float64
		s.EstimatedCostUSD = &v
	}
	if act.Valid {
		v := act.Float64
		s.ActualCostUSD = &v
	}
	s.MessageCount, s.ToolCallCount, s.InputTokens, s.OutputTokens = mc.Int64, tc.Int64, in.Int64, out.Int64
	s.CacheReadTokens, s.CacheWriteTokens, s.ReasoningTokens, s.APICallCount = cr.Int64, cw.Int64, rt.Int64, api.Int64
	return &s, nil
}

// unix converts t to the file's representation: Unix epoch seconds, with
// microsecond precision so that values round-trip exactly.
func unix(t time.Time) float64 {
	return float64(t.UnixMicro()) / 1e6
}

func fromUnix(f float64) time.Time {
	return time.UnixMicro(int64(math.Round(f * 1e6))).UTC()
}

func nullStr(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// NewSession is what CreateSession stores.
type NewSession struct {
	ID              string
	Source          string // cli, telegram, http, ...
	UserID          string
	Model           string
	ModelConfig     string
	SystemPrompt    string
	ParentSessionID string
	// StartedAt defaults to now.
	StartedAt time.Time
	// Title, when set, is stored with the session (it must be unique).
	Title string
	// Lane is the fleet lane the session belongs to (optional).
	Lane string
}

// execer is a *sql.Tx or a *sql.DB.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// CreateSession stores a new session. Creating an id that exists changes
// nothing (INSERT OR IGNORE).
func (db *DB) CreateSession(ctx context.Context, s NewSession) error {
	if s.ID == "" || s.Source == "" {
		return fmt.Errorf("%w: a session needs an id and a source", ErrInvalid)
	}
	return db.write(ctx, func(tx *sql.Tx) error { return createSession(ctx, tx, s) })
}

func createSession(ctx context.Context, ex execer, s NewSession) error {
	if s.StartedAt.IsZero() {
		s.StartedAt = time.Now()
	}
	var title any
	if t := cleanTitle(s.Title); t != "" {
		title = t
	}
	_, err := ex.ExecContext(ctx, `INSERT OR IGNORE INTO sessions (id, source, user_id, model, model_config, system_prompt, parent_session_id, started_at, title, lane)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, s.ID, s.Source, nullStr(s.UserID), nullStr(s.Model), nullStr(s.ModelConfig),
		nullStr(s.SystemPrompt), nullStr(s.ParentSessionID), unix(s.StartedAt), title, nullStr(s.Lane))
	if isUniqueTitle(err) {
		return fmt.Errorf("%w: %q", ErrTitleTaken, s.Title)
	}
	return err
}

func isUniqueTitle(err error) bool {
	return err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed: sessions.title")
}

// EndSession records that a session ended, and why ("user_exit", or one of
// the indexer's reasons). Of several ends, the earliest is kept.
func (db *DB) EndSession(ctx context.Context, id, reason string, at time.Time) error {
	return db.write(ctx, func(tx *sql.Tx) error { return endSession(ctx, tx, id, reason, at) })
}

func endSession(ctx context.Context, ex execer, id, reason string, at time.Time) error {
	if at.IsZero() {
		at = time.Now()
	}
	_, err := ex.ExecContext(ctx, `UPDATE sessions SET ended_at = ?, end_reason = ? WHERE id = ? AND (ended_at IS NULL OR ended_at > ?)`,
		unix(at), nullStr(reason), id, unix(at))
	return err
}

// ReopenSession clears ended_at and end_reason.
func (db *DB) ReopenSession(ctx context.Context, id string) error {
	return db.write(ctx, func(tx *sql.Tx) error { return reopenSession(ctx, tx, id) })
}

func reopenSession(ctx context.Context, ex execer, id string) error {
	_, err := ex.ExecContext(ctx, `UPDATE sessions SET ended_at = NULL, end_reason = NULL WHERE id = ?`, id)
	return err
}

// GetSession returns one session, or ErrNotFound.
func (db *DB) GetSession(ctx context.Context, id string) (*Session, error) {
	return getSession(ctx, db.r, id)
}

func getSession(ctx context.Context, ex execer, id string) (*Session, error) {
	s, err := scanSession(ex.QueryRowContext(ctx, `SELECT `+sessionCols+` FROM sessions WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("session %q: %w", id, ErrNotFound)
	}
	return s, err
}

// maxTitleLen caps a title, in characters.
const maxTitleLen = 100

// cleanTitle trims a title, turns control characters and runs of spaces
// into single spaces, and caps its length. An empty result means no title.
func cleanTitle(t string) string {
	t = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, t)
	t = strings.Join(strings.Fields(t), " ")
	if r := []rune(t); len(r) > maxTitleLen {
		t = strings.TrimSpace(string(r[:maxTitleLen]))
	}
	return t
}

// SetSessionTitle sets a session's title; it must be unique among non-NULL
// titles (ErrTitleTaken otherwise). An empty title clears it.
func (db *DB) SetSessionTitle(ctx context.Context, id, title string) error {
	return db.write(ctx, func(tx *sql.Tx) error { return setTitle(ctx, tx, id, title) })
}

func setTitle(ctx context.Context, ex execer, id, title string) error {
	var v any
	if t := cleanTitle(title); t != "" {
		v = t
	}
	res, err := ex.ExecContext(ctx, `UPDATE sessions SET title = ? WHERE id = ?`, v, id)
	if isUniqueTitle(err) {
		return fmt.Errorf("%w: %q", ErrTitleTaken, title)
	}
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("session %q: %w", id, ErrNotFound)
	}
	return nil
}

// SplitTitle splits a title into its lineage name and number: "Fix build #3"
// is ("Fix build", 3); a title without a number is number 1.
func SplitTitle(title string) (string, int) {
	t := cleanTitle(title)
	if i := strings.LastIndex(t, " #"); i > 0 {
		if n, err := strconv.Atoi(t[i+2:]); err == nil && n >= 1 && !strings.HasPrefix(t[i+2:], "+") {
			return strings.TrimSpace(t[:i]), n
		}
	}
	return t, 1
}

// lineageTitles returns the titles of base's lineage (base, base #2, ...)
// with their numbers and session ids, newest session first.
func lineageTitles(ctx context.Context, ex execer, base string) ([]titled, error) {
	like := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(base) + ` #%`
	rows, err := ex.QueryContext(ctx, `SELECT id, title FROM sessions WHERE title = ? OR title LIKE ? ESCAPE '\'
		ORDER BY started_at DESC, id DESC`, base, like)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []titled
	for rows.Next() {
		var t titled
		if err := rows.Scan(&t.id, &t.title); err != nil {
			return nil, err
		}
		b, n := SplitTitle(t.title)
		if b != base {
			continue
		}
		t.n = n
		out = append(out, t)
	}
	return out, rows.Err()
}

type titled struct {
	id, title string
	n         int
}

// ResolveSessionByTitle returns the session with a title. A title with a
// lineage number ("Fix build #2") names that session; a bare title names
// the most recent session of its lineage ("Fix build", "Fix build #2", ...).
func (db *DB) ResolveSessionByTitle(ctx context.Context, title string) (string, error) {
	t := cleanTitle(title)
	if t == "" {
		return "", fmt.Errorf("%w: empty title", ErrInvalid)
	}
	var id string
	err := db.r.QueryRowContext(ctx, `SELECT id FROM sessions WHERE title = ?`, t).Scan(&id)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return "", err
	}
	base, _ := SplitTitle(t)
	if base != t && id != "" {
		return id, nil // an explicit number
	}
	all, err := lineageTitles(ctx, db.r, base)
	if err != nil {
		return "", err
	}
	if len(all) > 0 {
		return all[0].id, nil
	}
	if id != "" {
		return id, nil
	}
	return "", fmt.Errorf("title %q: %w", title, ErrNotFound)
}

// GetNextTitleInLineage returns the title the next session of title's
// lineage gets: "Fix build" → "Fix build #2" when "Fix build" exists,
// "Fix build #4" when "#3" is the highest; the title itself when unused.
func (db *DB) GetNextTitleInLineage(ctx context.Context, title string) (string, error) {
	return nextTitle(ctx, db.r, title)
}

func nextTitle(ctx context.Context, ex execer, title string) (string, error) {
	base, _ := SplitTitle(title)
	if base == "" {
		return "", fmt.Errorf("%w: empty title", ErrInvalid)
	}
	all, err := lineageTitles(ctx, ex, base)
	if err != nil {
		return "", err
	}
	if len(all) == 0 {
		return base, nil
	}
	highest := 0
	for _, t := range all {
		highest = max(highest, t.n)
	}
	return fmt.Sprintf("%s #%d", base, highest+1), nil
}

// ListOptions filter ListSessions and ExportAll.
type ListOptions struct {
	// Source keeps only sessions of this source (platform); empty keeps all.
	Source string
	// ExcludeSources drops sessions of these sources.
	ExcludeSources []string
	// Limit caps the rows; 0 means 20 for ListSessions and no cap for exports.
	Limit int
	// Offset skips rows (newest first).
	Offset int
	// ActiveOnly keeps sessions that have not ended.
	ActiveOnly bool
	// Lane keeps the sessions of one fleet lane (conversation).
	Lane string
	// Titled keeps sessions that have a title.
	Titled bool
}

func (o ListOptions) where() (string, []any) {
	var conds []string
	var args []any
	if o.Source != "" {
		conds = append(conds, "s.source = ?")
		args = append(args, o.Source)
	}
	if len(o.ExcludeSources) > 0 {
		conds = append(conds, "s.source NOT IN ("+placeholders(len(o.ExcludeSources))+")")
		for _, x := range o.ExcludeSources {
			args = append(args, x)
		}
	}
	if o.ActiveOnly {
		conds = append(conds, "s.ended_at IS NULL")
	}
	if o.Lane != "" {
		conds = append(conds, "s.lane = ?")
		args = append(args, o.Lane)
	}
	if o.Titled {
		conds = append(conds, "s.title IS NOT NULL")
	}
	if len(conds) == 0 {
		return "", nil
	}
	return " WHERE " + strings.Join(conds, " AND "), args
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?,", n), ",")
}

// ListSessions returns sessions newest first, ended ones included, each with
// a preview (the first user message, 63 characters) and its last activity.
func (db *DB) ListSessions(ctx context.Context, o ListOptions) ([]Session, error) {
	if o.Limit <= 0 {
		o.Limit = 20
	}
	where, args := o.where()
	q := `SELECT ` + prefixed("s.", sessionCols) + `,
		COALESCE((SELECT SUBSTR(m.content, 1, 63) FROM messages m
			WHERE m.session_id = s.id AND m.role = 'user' AND m.content IS NOT NULL AND m.deleted_at IS NULL
			ORDER BY m.timestamp, m.id LIMIT 1), '') AS preview,
		COALESCE((SELECT MAX(m2.timestamp) FROM messages m2 WHERE m2.session_id = s.id), s.started_at) AS last_active
		FROM sessions s` + where + ` ORDER BY s.started_at DESC, s.id DESC LIMIT ? OFFSET ?`
	rows, err := db.r.QueryContext(ctx, q, append(args, o.Limit, o.Offset)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Session
	for rows.Next() {
		var preview string
		var last float64
		s, err := scanSession(rows, &preview, &last)
		if err != nil {
			return nil, err
		}
		s.Preview = preview
		t := fromUnix(last)
		s.LastActive = &t
		out = append(out, *s)
	}
	return out, rows.Err()
}

func prefixed(p, cols string) string {
	parts := strings.Split(cols, ",")
	for i, c := range parts {
		parts[i] = p + strings.TrimSpace(c)
	}
	return strings.Join(parts, ", ")
}

// LineageEntry is one session of a lineage.
type LineageEntry struct {
	ID              string    `json:"id"`
	Title           string    `json:"title,omitempty"`
	StartedAt       time.Time `json:"started_at"`
	ParentSessionID string    `json:"parent_session_id,omitempty"`
}

// Ancestors returns the session and its ancestors through parent_session_id,
// the session first (the storage design's lineage query).
func (db *DB) Ancestors(ctx context.Context, id string) ([]LineageEntry, error) {
	return db.lineage(ctx, `WITH RECURSIVE lineage AS (
    SELECT * FROM sessions WHERE id = ?
    UNION ALL
    SELECT s.* FROM sessions s JOIN lineage l ON s.id = l.parent_session_id
)
SELECT id, title, started_at, parent_session_id FROM lineage`, id)
}

// Descendants returns the session and every session descending from it.
func (db *DB) Descendants(ctx context.Context, id string) ([]LineageEntry, error) {
	return db.lineage(ctx, `WITH RECURSIVE descendants AS (
    SELECT * FROM sessions WHERE id = ?
    UNION ALL
    SELECT s.* FROM sessions s JOIN descendants d ON s.parent_session_id = d.id
)
SELECT id, title, started_at, parent_session_id FROM descendants`, id)
}

func (db *DB) lineage(ctx context.Context, q, id string) ([]LineageEntry, error) {
	rows, err := db.r.QueryContext(ctx, q, id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []LineageEntry
	seen := map[string]bool{}
	for rows.Next() {
		var e LineageEntry
		var title, parent sql.NullString
		var started float64
		if err := rows.Scan(&e.ID, &title, &started, &parent); err != nil {
			return nil, err
		}
		if seen[e.ID] {
			break // a cycle (a hand-edited file): stop rather than loop
		}
		seen[e.ID] = true
		e.Title, e.ParentSessionID, e.StartedAt = title.String, parent.String, fromUnix(started)
		out = append(out, e)
		if len(out) > 10000 {
			break
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("session %q: %w", id, ErrNotFound)
	}
	return out, nil
}

// DeleteSession deletes a session and all its messages; sessions that
// named it as parent keep their rows with the link cleared.
func (db *DB) DeleteSession(ctx context.Context, id string) error {
	return db.write(ctx, func(tx *sql.Tx) error {
		n, err := deleteSessions(ctx, tx, `id = ?`, id)
		if err == nil && n == 0 {
			return fmt.Errorf("session %q: %w", id, ErrNotFound)
		}
		return err
	})
}

// deleteSessions deletes the sessions matching cond, with their messages.
func deleteSessions(ctx context.Context, tx *sql.Tx, cond string, args ...any) (int, error) {
	rows, err := tx.QueryContext(ctx, `SELECT id FROM sessions WHERE `+cond, args...)
	if err != nil {
		return 0, err
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	for _, id := range ids {
		for _, q := range []string{
			`DELETE FROM messages WHERE session_id = ?`,
			`UPDATE sessions SET parent_session_id = NULL WHERE parent_session_id = ?`,
			`DELETE FROM sessions WHERE id = ?`,
		} {
			if _, err := tx.ExecContext(ctx, q, id); err != nil {
				return 0, err
			}
		}
	}
	return len(ids), nil
}

// PruneSessions deletes ended sessions that started more than olderThan
// ago, with their messages, optionally only those of one source. Sessions
// still open are never pruned. It returns how many it deleted.
func (db *DB) PruneSessions(ctx context.Context, olderThan time.Duration, source string) (int, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("%w: negative age %s", ErrInvalid, olderThan)
	}
	cutoff := unix(time.Now().Add(-olderThan))
	var n int
	err := db.write(ctx, func(tx *sql.Tx) error {
		var err error
		if source != "" {
			n, err = deleteSessions(ctx, tx, `started_at < ? AND ended_at IS NOT NULL AND source = ?`, cutoff, source)
		} else {
			n, err = deleteSessions(ctx, tx, `started_at < ? AND ended_at IS NOT NULL`, cutoff)
		}
		return err
	})
	return n, err
}

// ClearMessages deletes a session's messages and keeps the session record
// (its message and tool call counts go to zero).
func (db *DB) ClearMessages(ctx context.Context, id string) error {
	return db.write(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM messages WHERE session_id = ?`, id); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE sessions SET message_count = 0, tool_call_count = 0 WHERE id = ?`, id)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("session %q: %w", id, ErrNotFound)
		}
		return nil
	})
}
