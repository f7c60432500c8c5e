package statedb

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// SchemaVersion is the version of the schema this package writes. The
// version-gated migrations below bring any older file up to it.
const SchemaVersion = 11

// column is one column of a table, as declared in the schema.
type column struct{ name, decl string }

// sessionColumns and messageColumns are the declared columns, in order. The
// CREATE TABLE statements are generated from them, and reconcileColumns adds
// any that an existing file lacks (ALTER TABLE ADD COLUMN), so simple column
// additions need no numbered migration.
var sessionColumns = []column{
	{"id", "TEXT PRIMARY KEY"},
	{"source", "TEXT NOT NULL"},
	{"user_id", "TEXT"},
	{"model", "TEXT"},
	{"model_config", "TEXT"},
	{"system_prompt", "TEXT"},
	{"parent_session_id", "TEXT"},
	{"started_at", "REAL NOT NULL"},
	{"ended_at", "REAL"},
	{"end_reason", "TEXT"},
	{"message_count", "INTEGER DEFAULT 0"},
	{"tool_call_count", "INTEGER DEFAULT 0"},
	{"input_tokens", "INTEGER DEFAULT 0"},
	{"output_tokens", "INTEGER DEFAULT 0"},
	{"cache_read_tokens", "INTEGER DEFAULT 0"},
	{"cache_write_tokens", "INTEGER DEFAULT 0"},
	{"reasoning_tokens", "INTEGER DEFAULT 0"},
	{"billing_provider", "TEXT"},
	{"billing_base_url", "TEXT"},
	{"billing_mode", "TEXT"},
	{"estimated_cost_usd", "REAL"},
	{"actual_cost_usd", "REAL"},
	{"cost_status", "TEXT"},
	{"cost_source", "TEXT"},
	{"pricing_version", "TEXT"},
	{"title", "TEXT"},
	{"api_call_count", "INTEGER DEFAULT 0"},
	// lane is the fleet lane (conversation) the session belongs to, from
	// the session index: /resume lists a lane's sessions by it. An
	// agentfleet addition, reconciled like any other column.
	{"lane", "TEXT"},
}

var messageColumns = []column{
	{"id", "INTEGER PRIMARY KEY AUTOINCREMENT"},
	{"session_id", "TEXT NOT NULL REFERENCES sessions(id)"},
	{"role", "TEXT NOT NULL"},
	{"content", "TEXT"},
	{"tool_call_id", "TEXT"},
	{"tool_calls", "TEXT"},
	{"tool_name", "TEXT"},
	{"timestamp", "REAL NOT NULL"},
	{"token_count", "INTEGER"},
	{"finish_reason", "TEXT"},
	{"reasoning", "TEXT"},
	{"reasoning_content", "TEXT"},
	{"reasoning_details", "TEXT"},
	{"codex_reasoning_items", "TEXT"},
	{"codex_message_items", "TEXT"},
	// deleted_at marks a soft-deleted message (a /undo or /retry rewind):
	// kept for the audit trail, left out of reads and search. An agentfleet
	// addition, reconciled like any other column.
	{"deleted_at", "REAL"},
}

func createTable(name string, cols []column, extra string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "CREATE TABLE IF NOT EXISTS %s (\n", name)
	for i, c := range cols {
		if i > 0 {
			b.WriteString(",\n")
		}
		fmt.Fprintf(&b, "    %s %s", c.name, c.decl)
	}
	if extra != "" {
		b.WriteString(",\n    " + extra)
	}
	b.WriteString("\n)")
	return b.String()
}

// schemaTables creates the tables and indexes of the current schema (FTS
// excluded); every statement is idempotent.
func schemaTables() []string {
	return []string{
		createTable("sessions", sessionColumns, "FOREIGN KEY (parent_session_id) REFERENCES sessions(id)"),
		createTable("messages", messageColumns, ""),
		`CREATE TABLE IF NOT EXISTS state_meta (key TEXT PRIMARY KEY, value TEXT)`,
		`CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)`,
		`CREATE INDEX IF NOT EXISTS idx_sessions_source ON sessions(source)`,
		`CREATE INDEX IF NOT EXISTS idx_sessions_parent ON sessions(parent_session_id)`,
		`CREATE INDEX IF NOT EXISTS idx_sessions_started ON sessions(started_at DESC)`,
		`CREATE INDEX IF NOT EXISTS idx_messages_session ON messages(session_id, timestamp)`,
	}
}

const titleIndex = `CREATE UNIQUE INDEX IF NOT EXISTS idx_sessions_title_unique ON sessions(title) WHERE title IS NOT NULL`

// wordPrefixes are the prefix lengths (in characters) the word index keeps
// a prefix index for: a prefix query of one of these lengths (deploy*
// has 6) reads one doclist, newest first, and stops at the candidate
// limit; any other length makes FTS5 merge the doclists of every word
// the prefix expands to before it returns a row. An agentfleet addition to
// the storage design's messages_fts (which has none): readers see the same
// table, and reconcileFTS adds it to a file that lacks it.
const wordPrefixes = "2 3 4"

// messagesFTS is the word index's definition.
const messagesFTS = `CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(content, tool_name, tool_calls, prefix='` + wordPrefixes + `')`

// ftsV11 is the full-text layer of version 11: two inline-mode FTS5 tables
// (words, and trigrams for CJK and substring search) over content, tool
// name and tool calls, kept in sync by triggers.
var ftsV11 = []string{
	messagesFTS,
	`CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts_trigram USING fts5(content, tool_name, tool_calls, tokenize='trigram')`,
	`CREATE TRIGGER IF NOT EXISTS messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content, tool_name, tool_calls) VALUES (new.id, new.content, new.tool_name, new.tool_calls);
    INSERT INTO messages_fts_trigram(rowid, content, tool_name, tool_calls) VALUES (new.id, new.content, new.tool_name, new.tool_calls);
END`,
	`CREATE TRIGGER IF NOT EXISTS messages_fts_delete AFTER DELETE ON messages BEGIN
    DELETE FROM messages_fts WHERE rowid = old.id;
    DELETE FROM messages_fts_trigram WHERE rowid = old.id;
END`,
	`CREATE TRIGGER IF NOT EXISTS messages_fts_update AFTER UPDATE OF content, tool_name, tool_calls ON messages BEGIN
    DELETE FROM messages_fts WHERE rowid = old.id;
    DELETE FROM messages_fts_trigram WHERE rowid = old.id;
    INSERT INTO messages_fts(rowid, content, tool_name, tool_calls) VALUES (new.id, new.content, new.tool_name, new.tool_calls);
    INSERT INTO messages_fts_trigram(rowid, content, tool_name, tool_calls) VALUES (new.id, new.content, new.tool_name, new.tool_calls);
END`,
}

// oldTriggers are the trigger names of versions 1 to 10, dropped by 11.
var oldTriggers = []string{
	"messages_fts_insert", "messages_fts_delete", "messages_fts_update",
	"messages_fts_trigram_insert", "messages_fts_trigram_delete", "messages_fts_trigram_update",
}

// migrate brings the file to SchemaVersion inside one write transaction
// (BEGIN IMMEDIATE, so concurrent openers serialise and the second finds
// the work done).
func (db *DB) migrate(ctx context.Context) error {
	return db.write(ctx, func(tx *sql.Tx) error {
		var have int
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM sqlite_master WHERE type='table' AND name='schema_version'`).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			err := tx.QueryRowContext(ctx, `SELECT version FROM schema_version LIMIT 1`).Scan(&have)
			if err != nil && err != sql.ErrNoRows {
				return err
			}
		}
		if have > SchemaVersion {
			return fmt.Errorf("%w: the file is at schema version %d, this build knows %d", ErrSchemaTooNew, have, SchemaVersion)
		}
		if have == SchemaVersion {
			// Still reconcile: a column declared by this build may be
			// missing, or the word index's prefix indexes.
			if err := reconcileColumns(ctx, tx); err != nil {
				return err
			}
			return db.reconcileFTS(ctx, tx)
		}
		fresh := have == 0
		if fresh {
			var tables int
			if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM sqlite_master WHERE type='table' AND name='sessions'`).Scan(&tables); err != nil {
				return err
			}
			fresh = tables == 0
			if !fresh {
				have = 1 // tables without a version row: the initial schema
			}
		}
		for _, s := range schemaTables() {
			if _, err := tx.ExecContext(ctx, s); err != nil {
				return fmt.Errorf("schema: %w", err)
			}
		}
		if err := reconcileColumns(ctx, tx); err != nil {
			return err
		}
		if fresh {
			for _, s := range append([]string{titleIndex}, ftsV11...) {
				if _, err := tx.ExecContext(ctx, s); err != nil {
					return fmt.Errorf("schema: %w", err)
				}
			}
			return setVersion(ctx, tx, SchemaVersion)
		}
		// The version-gated chain: changes a column diff cannot express.
		if have < 4 {
			if err := dedupeTitles(ctx, tx); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, titleIndex); err != nil {
				return fmt.Errorf("migration 4: %w", err)
			}
		}
		if have < 10 {
			// 10: a trigram FTS table beside the word index, backfilled.
			for _, s := range []string{
				`CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts_trigram USING fts5(content, content=messages, content_rowid=id, tokenize='trigram')`,
				`INSERT INTO messages_fts_trigram(messages_fts_trigram) VALUES('rebuild')`,
			} {
				if _, err := tx.ExecContext(ctx, s); err != nil {
					return fmt.Errorf("migration 10: %w", err)
				}
			}
		}
		if have < 11 {
			// 11: both FTS tables cover content, tool name and tool calls,
			// in inline mode; the old triggers go and every row is indexed again.
			for _, t := range oldTriggers {
				if _, err := tx.ExecContext(ctx, `DROP TRIGGER IF EXISTS `+t); err != nil {
					return fmt.Errorf("migration 11: %w", err)
				}
			}
			for _, s := range []string{`DROP TABLE IF EXISTS messages_fts`, `DROP TABLE IF EXISTS messages_fts_trigram`} {
				if _, err := tx.ExecContext(ctx, s); err != nil {
					return fmt.Errorf("migration 11: %w", err)
				}
			}
			for _, s := range ftsV11 {
				if _, err := tx.ExecContext(ctx, s); err != nil {
					return fmt.Errorf("migration 11: %w", err)
				}
			}
			for _, t := range []string{"messages_fts", "messages_fts_trigram"} {
				if _, err := tx.ExecContext(ctx, `INSERT INTO `+t+`(rowid, content, tool_name, tool_calls) SELECT id, content, tool_name, tool_calls FROM messages`); err != nil {
					return fmt.Errorf("migration 11 backfill: %w", err)
				}
			}
		}
		if err := db.reconcileFTS(ctx, tx); err != nil {
			return err
		}
		return setVersion(ctx, tx, SchemaVersion)
	})
}

// reconcileFTS gives messages_fts its prefix indexes (wordPrefixes) when
// the file's definition lacks them (a file of version 11 written before
// they were added, or by another program): FTS5 options are fixed at
// creation, so the table is created again and every message indexed
// again, in the migration's transaction. The triggers name the table and
// stay as they are.
func (db *DB) reconcileFTS(ctx context.Context, tx *sql.Tx) error {
	var def string
	err := tx.QueryRowContext(ctx, `SELECT sql FROM sqlite_master WHERE type='table' AND name='messages_fts'`).Scan(&def)
	if err != nil && err != sql.ErrNoRows {
		return err
	}
	if strings.Contains(def, "prefix='"+wordPrefixes+"'") {
		return nil
	}
	start := time.Now()
	for _, s := range []string{`DROP TABLE IF EXISTS messages_fts`, messagesFTS,
		`INSERT INTO messages_fts(rowid, content, tool_name, tool_calls) SELECT id, content, tool_name, tool_calls FROM messages`} {
		if _, err := tx.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("word index prefixes: %w", err)
		}
	}
	db.log.Info("statedb: word index re-created with its prefix indexes", "prefixes", wordPrefixes, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

func setVersion(ctx context.Context, tx *sql.Tx, v int) error {
	if _, err := tx.ExecContext(ctx, `DELETE FROM schema_version`); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO schema_version(version) VALUES (?)`, v)
	return err
}

// reconcileColumns adds every declared column the live tables lack.
func reconcileColumns(ctx context.Context, tx *sql.Tx) error {
	for _, t := range []struct {
		name string
		cols []column
	}{{"sessions", sessionColumns}, {"messages", messageColumns}} {
		live, err := liveColumns(ctx, tx, t.name)
		if err != nil {
			return err
		}
		for _, c := range t.cols {
			if live[c.name] {
				continue
			}
			// ADD COLUMN takes no PRIMARY KEY/UNIQUE/NOT NULL without a
			// default; the declared columns added this way are all plain.
			decl := strings.ReplaceAll(c.decl, " NOT NULL", "")
			if _, err := tx.ExecContext(ctx, fmt.Sprintf(`ALTER TABLE %s ADD COLUMN %s %s`, t.name, c.name, decl)); err != nil {
				if strings.Contains(err.Error(), "duplicate column") {
					continue
				}
				return fmt.Errorf("add column %s.%s: %w", t.name, c.name, err)
			}
		}
	}
	// The lane index needs the lane column, which an older file gets
	// from the loop above.
	if _, err := tx.ExecContext(ctx, `CREATE INDEX IF NOT EXISTS idx_sessions_lane ON sessions(lane, started_at)`); err != nil {
		return fmt.Errorf("lane index: %w", err)
	}
	return nil
}

func liveColumns(ctx context.Context, tx *sql.Tx, table string) (map[string]bool, error) {
	rows, err := tx.QueryContext(ctx, `SELECT name FROM pragma_table_info(?)`, table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		out[n] = true
	}
	return out, rows.Err()
}

// dedupeTitles renames duplicate titles before the unique index exists
// (migration 4): the oldest session keeps the title, the others get the
// next number of its lineage.
func dedupeTitles(ctx context.Context, tx *sql.Tx) error {
	rows, err := tx.QueryContext(ctx, `SELECT id, title FROM sessions WHERE title IS NOT NULL AND title IN
		(SELECT title FROM sessions WHERE title IS NOT NULL GROUP BY title HAVING COUNT(*) > 1) ORDER BY title, started_at, id`)
	if err != nil {
		return err
	}
	type dup struct{ id, title string }
	var dups []dup
	for rows.Next() {
		var d dup
		if err := rows.Scan(&d.id, &d.title); err != nil {
			rows.Close()
			return err
		}
		dups = append(dups, d)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, d := range dups {
		if !seen[d.title] {
			seen[d.title] = true
			continue
		}
		next, err := nextTitle(ctx, tx, d.title)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE sessions SET title = ? WHERE id = ?`, next, d.id); err != nil {
			return err
		}
	}
	return nil
}
