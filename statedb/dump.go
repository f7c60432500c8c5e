package statedb

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// Dump renders every row of the sessions, messages and both FTS tables, and
// the indexer cursors, in a stable order: two files with equal dumps hold
// the same data. It is meant for tests and for comparing indexers.
func (db *DB) Dump(ctx context.Context) (string, error) {
	var b strings.Builder
	for _, q := range []struct{ name, sql string }{
		{"sessions", `SELECT ` + sessionCols + ` FROM sessions ORDER BY id`},
		{"messages", `SELECT ` + messageCols + ` FROM messages ORDER BY id`},
		{"messages_fts", `SELECT rowid, content, tool_name, tool_calls FROM messages_fts ORDER BY rowid`},
		{"messages_fts_trigram", `SELECT rowid, content, tool_name, tool_calls FROM messages_fts_trigram ORDER BY rowid`},
		{"state_meta", `SELECT key, value FROM state_meta WHERE key IN ('` + metaTxSeq + `', '` + metaEvSeq + `') ORDER BY key`},
	} {
		fmt.Fprintf(&b, "== %s\n", q.name)
		if err := dumpRows(ctx, db.r, &b, q.sql); err != nil {
			return "", fmt.Errorf("dump %s: %w", q.name, err)
		}
	}
	return b.String(), nil
}

func dumpRows(ctx context.Context, ex execer, b *strings.Builder, q string) error {
	rows, err := ex.QueryContext(ctx, q)
	if err != nil {
		return err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return err
	}
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return err
		}
		for i, v := range vals {
			if i > 0 {
				b.WriteString("|")
			}
			switch x := v.(type) {
			case nil:
				b.WriteString("NULL")
			case []byte:
				fmt.Fprintf(b, "%q", x)
			case string:
				fmt.Fprintf(b, "%q", x)
			default:
				fmt.Fprint(b, x)
			}
		}
		b.WriteString("\n")
	}
	return rows.Err()
}

var _ = sql.ErrNoRows
