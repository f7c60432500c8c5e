package statedb_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/statedb"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/transcript"
)

// ftsTables are the full-text tables the idle merge keeps merged.
var ftsTables = []string{"messages_fts", "messages_fts_trigram"}

// segmentsOver returns the first level of either FTS table holding more
// than max segments, as an error.
func segmentsOver(db *statedb.DB, max int) error {
	for _, table := range ftsTables {
		levels, err := statedb.FTSSegments(db, table)
		if err != nil {
			return err
		}
		for l, n := range levels {
			if n > max {
				return fmt.Errorf("%s: %d segments on level %d (%v)", table, n, l, levels)
			}
		}
	}
	return nil
}

// ftsLevels reads the segment count of each level of both FTS tables; a
// table without a structure record yet has no level.
func ftsLevels(t *testing.T, db *statedb.DB) map[string][]int {
	t.Helper()
	out := map[string][]int{}
	for _, table := range ftsTables {
		levels, err := statedb.FTSSegments(db, table)
		if err != nil {
			t.Fatal(err)
		}
		out[table] = levels
	}
	return out
}

func sum(levels []int) int {
	n := 0
	for _, x := range levels {
		n += x
	}
	return n
}

// several reports whether some level holds more than one segment: there is
// something for the idle merge to do.
func several(levels []int) bool {
	return slices.ContainsFunc(levels, func(n int) bool { return n > 1 })
}

// checkMerged checks that each table's index is merged as the idle merge
// intends: at most one segment per level, and at least one segment (an
// index with rows has one), fewer than before when before is given.
func checkMerged(t *testing.T, db *statedb.DB, before map[string][]int) {
	t.Helper()
	for table, levels := range ftsLevels(t, db) {
		if several(levels) || sum(levels) == 0 {
			t.Errorf("%s after the merge: segments per level %v, want one on each level that has any", table, levels)
		}
		if b, ok := before[table]; ok && sum(levels) >= sum(b) {
			t.Errorf("%s: %d segments after the merge (%v), %d before (%v): want fewer", table, sum(levels), levels, sum(b), b)
		}
	}
}

// TestIndexerMergesWhenIdle: batches applied one by one leave several FTS
// segments on a level; an indexer with nothing to apply merges them down
// to one per level (idleMerge), search answers the same, and batches
// applied afterwards are merged again in the next idle time.
func TestIndexerMergesWhenIdle(t *testing.T) {
	t.Parallel()
	f := startFleet(t)
	db := openTemp(t)
	ctx := context.Background()
	base := time.Date(2026, 6, 1, 10, 0, 0, 0, time.UTC)
	sid := f.newSession(t, keyTelegram, "", "", base)
	n := 0
	write := func(rounds int) {
		for r := 0; r < rounds; r++ {
			for i := 0; i < 3; i++ {
				n++
				f.append(t, sid, transcript.Entry{Kind: transcript.KindMessage, Role: "user", TurnID: fmt.Sprint("t", n),
					Content: fmt.Sprintf("merge check %d 部署服务器 round%d", n, r), Timestamp: base.Add(time.Duration(n) * time.Second)})
			}
			// Each round is its own batch: one new segment per index.
			waitIndexed(t, f, db)
		}
	}
	run := func(name string, idle time.Duration) func() {
		ix, err := statedb.NewIndexer(f.res, db, statedb.IndexerConfig{Names: f.names, Name: name, BatchSize: 64, MergeIdle: idle})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- ix.Run(rctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("indexer: %v", err)
			}
		}
	}

	// Without the idle merge: rounds until a level of each index holds
	// several segments, so the merge has something to do (a read error
	// fails the test rather than passing for "several").
	stop := run("nomerge", -1)
	var unmerged map[string][]int
	for r := 0; ; r++ {
		unmerged = ftsLevels(t, db)
		if several(unmerged[ftsTables[0]]) && several(unmerged[ftsTables[1]]) {
			break
		}
		if r == 20 {
			t.Fatalf("20 batches left no level with two segments: %v", unmerged)
		}
		write(1)
	}
	stop()
	t.Logf("segments per level before the merge: %v", unmerged)
	before, err := db.SearchMessages(ctx, "merge", statedb.SearchOptions{Limit: 500})
	if err != nil {
		t.Fatal(err)
	}
	beforeCJK, err := db.SearchMessages(ctx, "部署服务器", statedb.SearchOptions{Limit: 500})
	if err != nil {
		t.Fatal(err)
	}

	stop = run("nomerge", 50*time.Millisecond)
	defer stop()
	natstest.WaitFor(t, 120*time.Second, "the idle indexer to merge", func() error { return segmentsOver(db, 1) })
	checkMerged(t, db, unmerged)
	t.Logf("segments per level after the merge: %v", ftsLevels(t, db))
	after, err := db.SearchMessages(ctx, "merge", statedb.SearchOptions{Limit: 500})
	if err != nil {
		t.Fatal(err)
	}
	afterCJK, err := db.SearchMessages(ctx, "部署服务器", statedb.SearchOptions{Limit: 500})
	if err != nil {
		t.Fatal(err)
	}
	if len(before) != n || len(after) != n || len(beforeCJK) != n || len(afterCJK) != n {
		t.Fatalf("search before/after the merge: %d/%d words, %d/%d CJK, want %d", len(before), len(after), len(beforeCJK), len(afterCJK), n)
	}
	for i := range before {
		if before[i].ID != after[i].ID || before[i].Snippet != after[i].Snippet {
			t.Fatalf("result %d: %d %q before the merge, %d %q after", i, before[i].ID, before[i].Snippet, after[i].ID, after[i].Snippet)
		}
	}

	// Later batches, applied by the same indexer: merged again in the
	// next idle time (it may merge between them too). Without that merge
	// six batches cannot leave one segment per level: each adds one to
	// level 0, and FTS5's own automerge only merges a level once it holds
	// four.
	write(6)
	natstest.WaitFor(t, 120*time.Second, "the idle indexer to merge again", func() error { return segmentsOver(db, 1) })
	checkMerged(t, db, nil)
	got, err := db.SearchMessages(ctx, "merge", statedb.SearchOptions{Limit: 500})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("after more batches and a merge: %d results, want %d", len(got), n)
	}
}
