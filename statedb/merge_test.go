package statedb_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/statedb"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/transcript"
)

// segmentsOver returns the first level of either FTS table holding more
// than max segments, as an error.
func segmentsOver(db *statedb.DB, max int) error {
	for _, table := range []string{"messages_fts", "messages_fts_trigram"} {
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

	// Without the idle merge: rounds until a level holds several segments.
	stop := run("nomerge", -1)
	for r := 0; segmentsOver(db, 1) == nil; r++ {
		if r == 20 {
			t.Fatal("20 batches left no level with two segments")
		}
		write(1)
	}
	stop()
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

	// Later batches: applied, then merged again once idle.
	write(6)
	natstest.WaitFor(t, 120*time.Second, "the idle indexer to merge again", func() error { return segmentsOver(db, 1) })
	got, err := db.SearchMessages(ctx, "merge", statedb.SearchOptions{Limit: 500})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("after more batches and a merge: %d results, want %d", len(got), n)
	}
}
