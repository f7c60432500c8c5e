package statedb

import (
	"context"
	"database/sql"
	"errors"
)

// ExportedSession is a session with all its messages, soft-deleted ones
// included (they carry deleted_at).
type ExportedSession struct {
	Session
	Messages []Message `json:"messages"`
}

// ExportSession returns one session with its messages.
func (db *DB) ExportSession(ctx context.Context, id string) (*ExportedSession, error) {
	s, err := getSession(ctx, db.r, id)
	if err != nil {
		return nil, err
	}
	msgs, err := getMessages(ctx, db.r, id, true)
	if err != nil {
		return nil, err
	}
	return &ExportedSession{Session: *s, Messages: msgs}, nil
}

// ExportAll calls fn for every session matching o (oldest first, so that
// an export reads in the order things happened), with its messages. It
// stops at the first error fn returns. o.Limit 0 exports everything.
func (db *DB) ExportAll(ctx context.Context, o ListOptions, fn func(*ExportedSession) error) error {
	where, args := o.where()
	q := `SELECT s.id FROM sessions s` + where + ` ORDER BY s.started_at, s.id`
	if o.Limit > 0 {
		q += ` LIMIT ? OFFSET ?`
		args = append(args, o.Limit, o.Offset)
	}
	rows, err := db.r.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, id := range ids {
		e, err := db.ExportSession(ctx, id)
		if err != nil {
			if isNotFound(err) {
				continue // deleted meanwhile
			}
			return err
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	return nil
}

func isNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// Stats are the storage design's usage statistics.
type Stats struct {
	Sessions       int64         `json:"sessions"`
	ActiveSessions int64         `json:"active_sessions"`
	Messages       int64         `json:"messages"`
	InputTokens    int64         `json:"input_tokens"`
	OutputTokens   int64         `json:"output_tokens"`
	APICalls       int64         `json:"api_calls"`
	BySource       []SourceStats `json:"by_source"`
	ByModel        []ModelStats  `json:"by_model"`
	TopSessions    []TopSession  `json:"top_sessions"`
}

// SourceStats counts the sessions and messages of one source.
type SourceStats struct {
	Source   string `json:"source"`
	Sessions int64  `json:"sessions"`
	Messages int64  `json:"messages"`
}

// ModelStats is one row of "total tokens by model".
type ModelStats struct {
	Model        string   `json:"model"`
	Sessions     int64    `json:"session_count"`
	InputTokens  int64    `json:"total_input"`
	OutputTokens int64    `json:"total_output"`
	TotalCostUSD *float64 `json:"total_cost,omitempty"`
}

// TopSession is one row of "sessions with the highest token usage".
type TopSession struct {
	ID               string   `json:"id"`
	Title            string   `json:"title,omitempty"`
	Model            string   `json:"model,omitempty"`
	TotalTokens      int64    `json:"total_tokens"`
	EstimatedCostUSD *float64 `json:"estimated_cost_usd,omitempty"`
}

// TokensByModel is the storage design's "total tokens by model" query.
func (db *DB) TokensByModel(ctx context.Context) ([]ModelStats, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT model,
       COUNT(*) as session_count,
       SUM(input_tokens) as total_input,
       SUM(output_tokens) as total_output,
       SUM(estimated_cost_usd) as total_cost
FROM sessions
WHERE model IS NOT NULL
GROUP BY model
ORDER BY total_cost DESC`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []ModelStats{}
	for rows.Next() {
		var m ModelStats
		var in, outT sql.NullInt64
		var cost sql.NullFloat64
		if err := rows.Scan(&m.Model, &m.Sessions, &in, &outT, &cost); err != nil {
			return nil, err
		}
		m.InputTokens, m.OutputTokens = in.Int64, outT.Int64
		if cost.Valid {
			v := cost.Float64
			m.TotalCostUSD = &v
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// TopSessions is the storage design's "sessions with highest token usage".
func (db *DB) TopSessions(ctx context.Context, limit int) ([]TopSession, error) {
	if limit <= 0 {
		limit = 10
	}
	rows, err := db.r.QueryContext(ctx, `SELECT id, title, model, input_tokens + output_tokens AS total_tokens,
       estimated_cost_usd
FROM sessions
ORDER BY total_tokens DESC, started_at DESC
LIMIT ?`, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []TopSession{}
	for rows.Next() {
		var t TopSession
		var title, model sql.NullString
		var total sql.NullInt64
		var cost sql.NullFloat64
		if err := rows.Scan(&t.ID, &title, &model, &total, &cost); err != nil {
			return nil, err
		}
		t.Title, t.Model, t.TotalTokens = title.String, model.String, total.Int64
		if cost.Valid {
			v := cost.Float64
			t.EstimatedCostUSD = &v
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// GetStats returns the totals, per-source counts, tokens by model and the
// ten sessions with the highest token usage.
func (db *DB) GetStats(ctx context.Context) (*Stats, error) {
	var st Stats
	var in, out, api sql.NullInt64
	if err := db.r.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(*) FILTER (WHERE ended_at IS NULL),
		SUM(input_tokens), SUM(output_tokens), SUM(api_call_count) FROM sessions`).Scan(&st.Sessions, &st.ActiveSessions, &in, &out, &api); err != nil {
		return nil, err
	}
	st.InputTokens, st.OutputTokens, st.APICalls = in.Int64, out.Int64, api.Int64
	if err := db.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM messages WHERE deleted_at IS NULL`).Scan(&st.Messages); err != nil {
		return nil, err
	}
	rows, err := db.r.QueryContext(ctx, `SELECT source, COUNT(*), SUM(message_count) FROM sessions GROUP BY source ORDER BY COUNT(*) DESC, source`)
	if err != nil {
		return nil, err
	}
	st.BySource = []SourceStats{}
	for rows.Next() {
		var s SourceStats
		var n sql.NullInt64
		if err := rows.Scan(&s.Source, &s.Sessions, &n); err != nil {
			rows.Close()
			return nil, err
		}
		s.Messages = n.Int64
		st.BySource = append(st.BySource, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if st.ByModel, err = db.TokensByModel(ctx); err != nil {
		return nil, err
	}
	if st.TopSessions, err = db.TopSessions(ctx, 10); err != nil {
		return nil, err
	}
	return &st, nil
}
