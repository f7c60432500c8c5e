package statedb

import (
	"bytes"
	"database/sql"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
)

// ftsFixture is a bare SQLite file with FTS5 tables, written one
// transaction at a time so that each commit leaves a segment.
type ftsFixture struct {
	t  testing.TB
	db *sql.DB
	n  int
}

func newFTSFixture(t testing.TB) *ftsFixture {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "fts.db"))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return &ftsFixture{t: t, db: db}
}

func (f *ftsFixture) exec(q string, args ...any) {
	f.t.Helper()
	if _, err := f.db.Exec(q, args...); err != nil {
		f.t.Fatalf("%s: %v", q, err)
	}
}

// commits makes n commits to table, each inserting rows rows: a segment
// each (with FTS5's automerge off), larger as rows grows.
func (f *ftsFixture) commits(table string, n, rows int) {
	f.t.Helper()
	for range n {
		tx, err := f.db.Begin()
		if err != nil {
			f.t.Fatal(err)
		}
		for range rows {
			f.n++
			if _, err := tx.Exec(`INSERT INTO `+table+`(rowid, x) VALUES(?, ?)`, f.n,
				fmt.Sprintf("row %d alpha beta gamma w%d w%d", f.n, f.n*7919, f.n*104729)); err != nil {
				f.t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			f.t.Fatal(err)
		}
	}
}

// record is the table's structure record (rowid 10 of %_data).
func (f *ftsFixture) record(table string) []byte {
	f.t.Helper()
	var b []byte
	if err := f.db.QueryRow(`SELECT block FROM ` + table + `_data WHERE id = 10`).Scan(&b); err != nil {
		f.t.Fatalf("%s structure record: %v", table, err)
	}
	return b
}

// segmentsOnDisk counts the segments of table from another record than the
// structure: %_idx holds the b-tree of each segment, keyed by its id.
func (f *ftsFixture) segmentsOnDisk(table string) int {
	f.t.Helper()
	var n int
	if err := f.db.QueryRow(`SELECT count(DISTINCT segid) FROM ` + table + `_idx`).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// mergeAll runs FTS5 merge steps of the given size until one does
// nothing, as the indexer's idle merge does (mergeStep).
func (f *ftsFixture) mergeAll(table string, pages int) {
	f.t.Helper()
	for i := 0; ; i++ {
		if i == 1000 {
			f.t.Fatalf("%s: merge steps never ended", table)
		}
		var before, after int64
		if err := f.db.QueryRow(`SELECT total_changes()`).Scan(&before); err != nil {
			f.t.Fatal(err)
		}
		f.exec(`INSERT INTO `+table+`(`+table+`, rank) VALUES('merge', ?)`, pages)
		if err := f.db.QueryRow(`SELECT total_changes()`).Scan(&after); err != nil {
			f.t.Fatal(err)
		}
		if after-before < 2 {
			return
		}
	}
}

// twoLevelRecords returns the structure records of two tables (version 1
// and version 2) holding segments on two levels, [2 1].
func (f *ftsFixture) twoLevelRecords() [][]byte {
	f.t.Helper()
	var out [][]byte
	for i, opts := range []string{"", ", content='', contentless_delete=1"} {
		table := fmt.Sprintf("two%d", i)
		f.exec(`CREATE VIRTUAL TABLE ` + table + ` USING fts5(x` + opts + `)`)
		f.exec(`INSERT INTO ` + table + `(` + table + `, rank) VALUES('automerge', 0)`)
		f.exec(`INSERT INTO ` + table + `(` + table + `, rank) VALUES('usermerge', 2)`)
		f.commits(table, 3, 40)
		f.mergeAll(table, 100)
		f.commits(table, 2, 1)
		if levels := f.decodeReal(table, i == 1); !slices.Equal(levels, []int{2, 1}) {
			f.t.Fatalf("%s: levels %v, want [2 1]", table, levels)
		}
		out = append(out, f.record(table))
	}
	return out
}

// v2Marker follows the cookie in a version-2 structure record (a table
// with contentless_delete).
var v2Marker = []byte{0xff, 0, 0, 1}

// decodeReal decodes table's structure record, checks it against the
// segments found on disk and returns its levels.
func (f *ftsFixture) decodeReal(table string, v2 bool) []int {
	f.t.Helper()
	rec := f.record(table)
	if got := len(rec) >= 8 && bytes.Equal(rec[4:8], v2Marker); got != v2 {
		f.t.Fatalf("%s structure record % x: version 2 marker %v, want %v", table, rec, got, v2)
	}
	levels, err := decodeFTSStructure(rec)
	if err != nil {
		f.t.Fatalf("%s: decodeFTSStructure(% x): %v", table, rec, err)
	}
	n := 0
	for _, x := range levels {
		n += x
	}
	if disk := f.segmentsOnDisk(table); n != disk {
		f.t.Fatalf("%s: decoded %v (%d segments), %d segments on disk (record % x)", table, levels, n, disk, rec)
	}
	return levels
}

// TestDecodeFTSStructure decodes structure records written by SQLite's
// FTS5 itself: a new table, one segment per commit (FTS5's own automerge
// off), the levels a merge leaves, segments on several levels, an
// optimized index, and the version-2 record of a contentless-delete table.
// The segment count is checked against the segment ids on disk (%_idx).
func TestDecodeFTSStructure(t *testing.T) {
	t.Parallel()
	for _, v2 := range []bool{false, true} {
		name, opts := "plain", ""
		if v2 {
			name, opts = "contentless_delete", ", content='', contentless_delete=1"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFTSFixture(t)
			table := "t_" + name
			f.exec(`CREATE VIRTUAL TABLE ` + table + ` USING fts5(x` + opts + `)`)
			if got := f.decodeReal(table, v2); len(got) != 0 {
				t.Errorf("new table: levels %v, want none", got)
			}
			f.exec(`INSERT INTO ` + table + `(` + table + `, rank) VALUES('automerge', 0)`)
			f.exec(`INSERT INTO ` + table + `(` + table + `, rank) VALUES('usermerge', 2)`)

			f.commits(table, 5, 40)
			if got, want := f.decodeReal(table, v2), []int{5}; !slices.Equal(got, want) {
				t.Errorf("after 5 commits: levels %v, want %v", got, want)
			}
			// The idle merge's steps: level 0's five segments become one,
			// a level up.
			f.mergeAll(table, 100)
			if got, want := f.decodeReal(table, v2), []int{0, 1}; !slices.Equal(got, want) {
				t.Errorf("after merging: levels %v, want %v", got, want)
			}
			// Segments on two levels: new segments smaller than the merged
			// one stay below it (a segment no larger than a new one would
			// be moved down to its level).
			f.commits(table, 3, 1)
			if got, want := f.decodeReal(table, v2), []int{3, 1}; !slices.Equal(got, want) {
				t.Errorf("after 3 more commits: levels %v, want %v", got, want)
			}
			if v2 {
				// A delete in a contentless-delete table writes a
				// tombstone, not a segment.
				f.exec(`DELETE FROM `+table+` WHERE rowid = ?`, f.n-1)
				if got, want := f.decodeReal(table, v2), []int{3, 1}; !slices.Equal(got, want) {
					t.Errorf("after a delete: levels %v, want %v", got, want)
				}
			}
			// Many commits: FTS5's crisis merge keeps a level below 16.
			f.commits(table, 20, 1)
			got := f.decodeReal(table, v2)
			if slices.ContainsFunc(got, func(n int) bool { return n > 16 }) {
				t.Errorf("after 20 more commits: levels %v, want no level above 16", got)
			}
			f.exec(`INSERT INTO ` + table + `(` + table + `) VALUES('optimize')`)
			got = f.decodeReal(table, v2)
			if nonEmpty := slices.DeleteFunc(slices.Clone(got), func(n int) bool { return n == 0 }); !slices.Equal(nonEmpty, []int{1}) {
				t.Errorf("after optimize: levels %v, want one segment", got)
			}
		})
	}
}

// TestDecodeFTSStructureMalformed: a record that is cut short, or whose
// counts claim more than it holds, is an error, not a panic nor a count.
func TestDecodeFTSStructureMalformed(t *testing.T) {
	t.Parallel()
	f := newFTSFixture(t)
	real := f.twoLevelRecords()
	for _, rec := range real {
		if _, err := decodeFTSStructure(rec); err != nil {
			t.Fatalf("real record % x: %v", rec, err)
		}
		// Every record cut short.
		for n := range len(rec) {
			if levels, err := decodeFTSStructure(rec[:n]); err == nil {
				t.Errorf("record % x cut to %d bytes: levels %v, want an error", rec, n, levels)
			}
		}
	}

	// varint is SQLite's varint of v, as FTS5 writes them.
	varint := func(v uint64) []byte {
		if v <= 0x7f {
			return []byte{byte(v)}
		}
		if v > 1<<56-1 {
			b := make([]byte, 9)
			b[8] = byte(v)
			v >>= 8
			for i := 7; i >= 0; i-- {
				b[i] = byte(v&0x7f) | 0x80
				v >>= 7
			}
			return b
		}
		var rev []byte
		for v > 0 {
			rev = append(rev, byte(v&0x7f)|0x80)
			v >>= 7
		}
		rev[0] &= 0x7f
		slices.Reverse(rev)
		return rev
	}
	rec := func(parts ...[]byte) []byte { return bytes.Join(append([][]byte{{0, 0, 0, 1}}, parts...), nil) }
	vs := func(xs ...uint64) []byte {
		var b []byte
		for _, x := range xs {
			b = append(b, varint(x)...)
		}
		return b
	}
	// The test's varint agrees with the decoder's.
	for _, v := range []uint64{0, 1, 0x7f, 0x80, 0x3fff, 0x4000, 1 << 32, 1<<56 - 1, 1 << 56, 1<<63 + 5, ^uint64(0)} {
		if got, n := sqliteVarint(varint(v)); got != v || n != len(varint(v)) {
			t.Fatalf("varint %d: % x decodes as %d (%d bytes)", v, varint(v), got, n)
		}
	}
	if got, err := decodeFTSStructure(rec(vs(1, 2, 9), vs(0, 2), vs(1, 1, 1), vs(2, 1, 1))); err != nil || !slices.Equal(got, []int{2}) {
		t.Fatalf("a hand-made record of one level with 2 segments: %v, %v", got, err)
	}

	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"nil", nil},
		{"three bytes", []byte{0, 0, 0}},
		{"cookie only", []byte{0, 0, 0, 1}},
		{"version 2 marker only", append([]byte{0, 0, 0, 1}, v2Marker...)},
		{"a varint running off the end", rec([]byte{0x81, 0x80})},
		{"more levels than FTS5 allows", rec(vs(1<<16+1, 0, 0))},
		{"a level missing", rec(vs(2, 1, 5), vs(0, 1, 1, 1, 1))},
		{"a segment missing", rec(vs(1, 2, 5), vs(0, 2, 1, 1, 1))},
		{"version 2 segments of version 1 size", rec(v2Marker, vs(1, 2, 5), vs(0, 2, 1, 1, 1, 2, 2, 2))},
		{"a segment count beyond the record", rec(vs(1, 1<<40, 5), vs(0, 1<<40), vs(1, 1, 1))},
		{"a segment count that overflows an int", rec(vs(1, 0, 5), vs(0, 1<<63+1), vs(1, 1, 1))},
		{"a segment count whose fields overflow an int", rec(vs(1, 0, 5), vs(0, 1<<62), vs(1, 1, 1))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			levels, err := decodeFTSStructure(tc.b)
			if err == nil {
				t.Errorf("decodeFTSStructure(% x) = %v, want an error", tc.b, levels)
			}
		})
	}
}

// FuzzDecodeFTSStructure: any record decodes without a panic, and counts
// no more segments than its bytes can describe (each segment takes at
// least 3 varints, 8 in version 2).
func FuzzDecodeFTSStructure(f *testing.F) {
	// Real records: segments on two levels, of both versions.
	for _, rec := range newFTSFixture(f).twoLevelRecords() {
		f.Add(rec)
	}
	f.Add([]byte{0, 0, 0, 1, 1, 2, 9, 0, 2, 1, 1, 1, 2, 1, 1})
	f.Add(append([]byte{0, 0, 0, 1}, v2Marker...))
	f.Add([]byte{0, 0, 0, 1, 1, 0, 5, 0, 0xc0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		levels, err := decodeFTSStructure(b)
		if err != nil {
			return
		}
		if len(levels) > 1<<16 {
			t.Fatalf("%d levels", len(levels))
		}
		segs := 0
		for _, n := range levels {
			if n < 0 {
				t.Fatalf("levels %v: a negative count", levels)
			}
			segs += n
			if segs < 0 || segs*3 > len(b) {
				t.Fatalf("levels %v from a record of %d bytes", levels, len(b))
			}
		}
	})
}
