package statedb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// ftsSegments returns the number of segments (b-trees) on each level of an
// FTS5 table's index, read from its structure record (rowid 10 of the
// %_data shadow table): a 4-byte cookie, an optional 4-byte version-2
// marker, the level and segment counts and a write counter, then per
// level its merge count and segment count followed by each segment's
// fields, all as SQLite varints.
func (db *DB) ftsSegments(ctx context.Context, table string) ([]int, error) {
	var blob []byte
	err := db.r.QueryRowContext(ctx, `SELECT block FROM `+table+`_data WHERE id = 10`).Scan(&blob)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s structure: %w", table, err)
	}
	return decodeFTSStructure(blob)
}

func decodeFTSStructure(b []byte) ([]int, error) {
	bad := fmt.Errorf("fts5 structure record of %d bytes: malformed", len(b))
	if len(b) < 4 {
		return nil, bad
	}
	b = b[4:]
	v2 := len(b) >= 4 && b[0] == 0xff && b[1] == 0 && b[2] == 0 && b[3] == 1
	if v2 {
		b = b[4:]
	}
	next := func() (uint64, bool) {
		v, n := sqliteVarint(b)
		if n == 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	nLevel, ok1 := next()
	_, ok2 := next() // total segments
	_, ok3 := next() // write counter
	if !ok1 || !ok2 || !ok3 || nLevel > 1<<16 {
		return nil, bad
	}
	perSeg := 3
	if v2 {
		perSeg = 8
	}
	levels := make([]int, nLevel)
	for l := range levels {
		_, ok1 := next() // segments being merged
		n, ok2 := next()
		// Each segment takes perSeg varints of a byte or more: a count
		// beyond what is left is malformed (and int(n)*perSeg could
		// overflow into a count that reads nothing).
		if !ok1 || !ok2 || n > uint64(len(b)/perSeg) {
			return nil, bad
		}
		levels[l] = int(n)
		for range int(n) * perSeg {
			if _, ok := next(); !ok {
				return nil, bad
			}
		}
	}
	return levels, nil
}

// ftsTables are the full-text tables the indexer keeps merged.
var ftsTables = []string{"messages_fts", "messages_fts_trigram"}

// mergeStep runs one step of FTS5's incremental merge on table, in its own
// write transaction: FTS5 merges segments until about pages pages of
// output are written. A positive step merges the segments of a level that
// holds at least usermerge of them (or goes on with a merge in progress);
// a negative one first puts every segment on one level, so that repeated
// steps end with a single segment. It reports whether the step did any
// work (FTS5 then changes total_changes() by 2 or more).
func (db *DB) mergeStep(ctx context.Context, table string, pages int) (bool, error) {
	var did bool
	err := db.write(ctx, func(tx *sql.Tx) error {
		var before, after int64
		if err := tx.QueryRowContext(ctx, `SELECT total_changes()`).Scan(&before); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+table+`(`+table+`, rank) VALUES('merge', ?)`, pages); err != nil {
			return err
		}
		if err := tx.QueryRowContext(ctx, `SELECT total_changes()`).Scan(&after); err != nil {
			return err
		}
		did = after-before >= 2
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("merge %s: %w", table, err)
	}
	return did, nil
}

// mergePages is the output of one idle merge step, in FTS5 pages (about
// 4 KB each).
const mergePages = 100

// userMerge is the segment count from which an idle merge step merges a
// level of an FTS index (FTS5's usermerge option; its default is 4).
const userMerge = 2

// prepareMerge sets each FTS table's usermerge option to userMerge (a
// setting stored in the table's %_config shadow table) when it differs.
func (db *DB) prepareMerge(ctx context.Context) error {
	return db.write(ctx, func(tx *sql.Tx) error {
		for _, t := range ftsTables {
			var v sql.NullInt64
			err := tx.QueryRowContext(ctx, `SELECT v FROM `+t+`_config WHERE k = 'usermerge'`).Scan(&v)
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				return err
			}
			if v.Valid && v.Int64 == userMerge {
				continue
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO `+t+`(`+t+`, rank) VALUES('usermerge', ?)`, userMerge); err != nil {
				return fmt.Errorf("usermerge %s: %w", t, err)
			}
		}
		return nil
	})
}

// idleMerge is the indexer's merge of the full-text indexes while it has
// nothing to apply. FTS5 writes each transaction's rows as a new segment
// (b-tree) of each index and merges segments as it goes only when a level
// holds automerge (4) of them, so a file written in batches keeps up to
// three segments on each of several levels. A query reads every segment:
// each term's doclist is looked up in each, and walking it merges them
// row by row. The idle merge brings every level down to one segment
// (usermerge 2), in steps of mergePages pages, each its own short write
// transaction, and stops when FTS5 reports nothing left to merge on
// either index until the next batch is applied.
type idleMerge struct {
	table int  // the index being merged (ftsTables)
	quiet int  // consecutive indexes that had nothing to merge
	done  bool // nothing left to merge since the last batch
}

// step runs one merge step on the current index.
func (m *idleMerge) step(ctx context.Context, db *DB) error {
	t := ftsTables[m.table]
	did, err := db.mergeStep(ctx, t, mergePages)
	if err != nil {
		return err
	}
	if did {
		m.quiet = 0
		return nil
	}
	m.quiet++
	m.table = (m.table + 1) % len(ftsTables)
	if m.quiet >= len(ftsTables) {
		m.done, m.quiet = true, 0
	}
	return nil
}
