package worker_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/statedb"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// startIndexer runs a state-database indexer (its own SQLite file, its own
// connection) and its fleet.api service until the test ends, as
// `agentfleet indexer` does.
func (f *fleet) startIndexer() *statedb.DB {
	f.t.Helper()
	db, err := statedb.Open(context.Background(), filepath.Join(f.t.TempDir(), "state.db"), nil)
	if err != nil {
		f.t.Fatal(err)
	}
	nc := f.srv.Connect(f.t)
	js := natstest.JetStream(f.t, nc)
	res, err := broker.Provision(f.t.Context(), js, broker.ProvisionConfig{Names: f.names, LeaseTTL: testTTL})
	if err != nil {
		f.t.Fatal(err)
	}
	ix, err := statedb.NewIndexer(res, db, statedb.IndexerConfig{Names: f.names, Name: "test"})
	if err != nil {
		f.t.Fatal(err)
	}
	api, err := statedb.StartAPI(nc, db, f.names, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ix.Run(ctx) }()
	f.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				f.t.Errorf("indexer: %v", err)
			}
		case <-time.After(30 * time.Second):
			f.t.Error("the indexer did not stop")
		}
		if err := api.Stop(); err != nil {
			f.t.Errorf("api stop: %v", err)
		}
		db.Close()
	})
	return db
}

// waitTitled waits until the state database holds the lane's titled
// sessions with these titles.
func waitTitled(t *testing.T, db *statedb.DB, lane string, titles ...string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ss, err := db.ListSessions(t.Context(), statedb.ListOptions{Lane: lane, Titled: true, Limit: 100})
		var have []string
		for _, s := range ss {
			have = append(have, s.Title)
		}
		missing := false
		for _, want := range titles {
			missing = missing || !slices.Contains(have, want)
		}
		if err == nil && !missing {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the state database has titles %q (%v), want %q", have, err, titles)
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestResumeTitleOnlyInStateDatabase: a titled session older than the
// lane's recent sessions (the KV entry lists the last 20) is known by its
// title only to the state database. With no indexer, /resume <title> finds
// nothing and the list does not show it; with an indexer (started late: it
// reads the streams from the start), the same /resume switches to it and
// the list shows it as ended.
func TestResumeTitleOnlyInStateDatabase(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)
	lane, s := f.send("old", "/new Old Project")
	old := f.settled(lane, s).SessionID
	for i := 0; i < session.MaxRecentSessions+1; i++ {
		_, s = f.send("old", "/new")
		f.settled(lane, s)
	}
	e := f.entry(lane)
	if slices.Contains(e.RecentSessions, old) || e.SessionID == old {
		t.Fatalf("the lane's entry still lists %s: not a test", old)
	}
	current := e.SessionID

	_, s = f.send("old", "/resume Old Project")
	if got := f.settled(lane, s).SessionID; got != current {
		t.Fatalf("/resume without an indexer moved the lane to %s", got)
	}
	if n := f.lastNotice(lane); !strings.Contains(n, `No session "Old Project"`) {
		t.Fatalf("/resume without an indexer: %q", n)
	}

	db := f.startIndexer()
	waitTitled(t, db, lane, "Old Project")
	_, s = f.send("old", "/resume")
	f.settled(lane, s)
	if n := f.lastNotice(lane); !strings.Contains(n, "1. Old Project ("+old+", ") || !strings.Contains(n, ", ended)") {
		t.Fatalf("/resume list with the indexer: %q", n)
	}
	_, s = f.send("old", "/resume old project")
	if got := f.settled(lane, s).SessionID; got != old {
		t.Fatalf("/resume by a title only the state database knows: session %s, want %s", got, old)
	}
	if n := f.lastNotice(lane); n != "Resumed session "+old+"." {
		t.Fatalf("/resume notice %q", n)
	}
}

// TestResumeListsMoreThanRecentSessions: with 25 titled sessions in a lane,
// /resume lists the 24 others from the state database, the oldest ones
// (which the lane's entry no longer lists) included, numbered newest first;
// /resume N and /resume <title> reach the oldest.
func TestResumeListsMoreThanRecentSessions(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	db := f.startIndexer()
	f.startWorker("w1", noReset)
	const n = 25
	sids := make([]string, n+1) // sids[i] is session "t<i>"
	titles := make([]string, 0, n)
	var lane string
	for i := 1; i <= n; i++ {
		title := fmt.Sprintf("t%02d", i)
		var s uint64
		lane, s = f.send("many", "/new "+title)
		sids[i] = f.settled(lane, s).SessionID
		titles = append(titles, title)
	}
	if rs := f.entry(lane).RecentSessions; len(rs) != session.MaxRecentSessions || slices.Contains(rs, sids[1]) {
		t.Fatalf("recent sessions %v: not a test", rs)
	}
	// The current session (t25) has no message nor end yet: the indexer
	// records it at either.
	waitTitled(t, db, lane, titles[:n-1]...)

	_, s := f.send("many", "/resume")
	f.settled(lane, s)
	list := f.lastNotice(lane)
	for k := 1; k < n; k++ {
		i := n - k // 1. is t24, 24. is t01
		if want := fmt.Sprintf("%d. t%02d (%s, ", k, i, sids[i]); !strings.Contains(list, want) {
			t.Errorf("/resume list lacks %q:\n%s", want, list)
		}
	}
	if strings.Contains(list, fmt.Sprintf("%d. ", n)) || strings.Contains(list, "t25") {
		t.Errorf("/resume list holds more than the 24 others:\n%s", list)
	}

	_, s = f.send("many", "/resume 24")
	if got := f.settled(lane, s).SessionID; got != sids[1] {
		t.Fatalf("/resume 24: session %s, want t01 %s", got, sids[1])
	}
	_, s = f.send("many", "/resume t02")
	if got := f.settled(lane, s).SessionID; got != sids[2] {
		t.Fatalf("/resume t02: session %s, want %s", got, sids[2])
	}
	// t01 was resumed a moment ago: the entry lists it again, and the
	// list numbers it after t25 (newest first by creation).
	_, s = f.send("many", "/resume")
	f.settled(lane, s)
	if list := f.lastNotice(lane); !strings.Contains(list, "1. t25 ("+sids[25]) || !strings.Contains(list, "24. t01 ("+sids[1]) {
		t.Errorf("/resume list after resuming t02:\n%s", list)
	}
}
