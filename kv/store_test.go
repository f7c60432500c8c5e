package kv_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

func TestMutate(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	st := ev.store(t, nil)

	t.Run("creates a missing entry", func(t *testing.T) {
		lane := "mutate.create"
		var calls int
		e, rev, err := st.Mutate(ctx, lane, nil, 0, nil, func(e *session.SessionEntry) (*session.SessionEntry, error) {
			calls++
			if e != nil {
				t.Errorf("fn got %+v for a missing lane", e)
			}
			return &session.SessionEntry{SessionKey: "k", InputTokens: 1}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if calls != 1 || rev == 0 || e.InputTokens != 1 {
			t.Fatalf("calls %d rev %d entry %+v", calls, rev, e)
		}
		if got := revOf(t, st, lane); got != rev {
			t.Errorf("stored revision %d, Mutate returned %d", got, rev)
		}
	})
	t.Run("ErrNoChange writes nothing", func(t *testing.T) {
		lane := "mutate.nochange"
		rev0 := overwrite(t, st, lane, &session.SessionEntry{SessionKey: "k", InputTokens: 5})
		e, rev, err := st.Mutate(ctx, lane, nil, 0, nil, func(e *session.SessionEntry) (*session.SessionEntry, error) {
			e.InputTokens = 99 // changes to the copy must not leak
			return nil, kv.ErrNoChange
		})
		if err != nil {
			t.Fatal(err)
		}
		if rev != rev0 || e.InputTokens != 5 {
			t.Errorf("ErrNoChange returned rev %d entry tokens %d, want %d and 5", rev, e.InputTokens, rev0)
		}
		if got := revOf(t, st, lane); got != rev0 {
			t.Errorf("ErrNoChange wrote: revision %d -> %d", rev0, got)
		}
	})
	t.Run("fn errors abort", func(t *testing.T) {
		lane := "mutate.fnerr"
		rev0 := overwrite(t, st, lane, &session.SessionEntry{SessionKey: "k"})
		boom := errors.New("boom")
		if _, _, err := st.Mutate(ctx, lane, nil, 0, nil, func(*session.SessionEntry) (*session.SessionEntry, error) { return nil, boom }); !errors.Is(err, boom) {
			t.Errorf("err = %v, want boom", err)
		}
		if _, _, err := st.Mutate(ctx, lane, nil, 0, nil, func(*session.SessionEntry) (*session.SessionEntry, error) { return nil, nil }); err == nil {
			t.Error("a nil entry without error was accepted")
		}
		if got := revOf(t, st, lane); got != rev0 {
			t.Errorf("aborted mutate wrote: revision %d -> %d", rev0, got)
		}
	})
	t.Run("stale cache re-reads and re-applies on the fresh entry", func(t *testing.T) {
		lane := "mutate.stale"
		cached := &session.SessionEntry{SessionKey: "k", InputTokens: 1}
		staleRev := overwrite(t, st, lane, cached)
		overwrite(t, st, lane, &session.SessionEntry{SessionKey: "k", InputTokens: 10}) // another writer
		var seen []int64
		e, rev, err := st.Mutate(ctx, lane, cached, staleRev, nil, func(e *session.SessionEntry) (*session.SessionEntry, error) {
			seen = append(seen, e.InputTokens)
			e.InputTokens++
			return e, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(seen, []int64{1, 10}) {
			t.Errorf("fn saw %v, want [1 10] (cached, then fresh)", seen)
		}
		if e.InputTokens != 11 {
			t.Errorf("result %d, want 11", e.InputTokens)
		}
		if cached.InputTokens != 1 {
			t.Errorf("the caller's cached entry was modified: %d", cached.InputTokens)
		}
		stored, srev := mustGet(t, st, lane)
		if stored.InputTokens != 11 || srev != rev {
			t.Errorf("stored %d at rev %d, returned rev %d", stored.InputTokens, srev, rev)
		}
	})
	t.Run("cached write ignores the caller's cancellation", func(t *testing.T) {
		lane := "mutate.cancel"
		cached := &session.SessionEntry{SessionKey: "k"}
		rev := overwrite(t, st, lane, cached)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, newRev, err := st.Mutate(cctx, lane, cached, rev, nil, func(e *session.SessionEntry) (*session.SessionEntry, error) {
			e.LastTurnID = "t1"
			return e, nil
		})
		if err != nil {
			t.Fatalf("durable write with a cancelled turn context: %v", err)
		}
		if stored, srev := mustGet(t, st, lane); stored.LastTurnID != "t1" || srev != newRev {
			t.Errorf("stored %+v at %d", stored, srev)
		}
	})
	t.Run("create after delete", func(t *testing.T) {
		lane := "mutate.recreate"
		rev := overwrite(t, st, lane, &session.SessionEntry{SessionKey: "k"})
		if err := st.Delete(ctx, lane, rev); err != nil {
			t.Fatal(err)
		}
		_, rev2, err := st.Mutate(ctx, lane, nil, 0, nil, func(e *session.SessionEntry) (*session.SessionEntry, error) {
			if e != nil {
				t.Errorf("fn got %+v after delete", e)
			}
			return &session.SessionEntry{SessionKey: "k2"}, nil
		})
		if err != nil || rev2 <= rev {
			t.Fatalf("re-create: rev %d err %v", rev2, err)
		}
	})
}

// TestMutateFence: a fenced mutate whose owner or epoch does not match the
// entry returns ErrLeaseLost, never calls fn and writes nothing.
func TestMutateFence(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	st := ev.store(t, nil)
	stored := &session.SessionEntry{SessionKey: "k", Owner: "w1/aaaa", LeaseEpoch: 7}

	tests := []struct {
		name   string
		fence  *kv.Fence
		absent bool
		ok     bool
	}{
		{name: "matching", fence: &kv.Fence{Owner: "w1/aaaa", Epoch: 7}, ok: true},
		{name: "no fence", fence: nil, ok: true},
		{name: "other owner", fence: &kv.Fence{Owner: "w2/bbbb", Epoch: 7}},
		{name: "other incarnation", fence: &kv.Fence{Owner: "w1/cccc", Epoch: 7}},
		{name: "older epoch", fence: &kv.Fence{Owner: "w1/aaaa", Epoch: 6}},
		{name: "newer epoch", fence: &kv.Fence{Owner: "w1/aaaa", Epoch: 8}},
		{name: "empty fence", fence: &kv.Fence{}},
		{name: "missing entry", fence: &kv.Fence{Owner: "w1/aaaa", Epoch: 7}, absent: true},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Each subtest's own deadline: parallel subtests wait for a
			// slot after the parent returns, on a busy machine for long.
			ctx := testCtx(t)
			lane := fmt.Sprintf("fence.%d", i)
			var rev0 uint64
			if !tc.absent {
				rev0 = overwrite(t, st, lane, stored)
			}
			called := false
			_, _, err := st.Mutate(ctx, lane, nil, 0, tc.fence, func(e *session.SessionEntry) (*session.SessionEntry, error) {
				called = true
				e.CommittedSeq = 100
				return e, nil
			})
			if tc.ok {
				if err != nil {
					t.Fatalf("Mutate: %v", err)
				}
				if e, _ := mustGet(t, st, lane); e.CommittedSeq != 100 {
					t.Errorf("write not applied: %+v", e)
				}
				return
			}
			if !errors.Is(err, kv.ErrLeaseLost) {
				t.Fatalf("err = %v, want ErrLeaseLost", err)
			}
			if called {
				t.Error("fn ran for a fenced-out writer")
			}
			if got := revOf(t, st, lane); got != rev0 {
				t.Errorf("fenced-out mutate wrote: revision %d -> %d", rev0, got)
			}
		})
	}

	// A zombie whose cached entry still names it, writing against its own
	// last revision after a takeover: the CAS fails, the re-read shows the
	// new owner, and nothing is written.
	t.Run("zombie with a stale cache", func(t *testing.T) {
		t.Parallel()
		ctx := testCtx(t)
		lane := "fence.zombie"
		mine := &session.SessionEntry{SessionKey: "k", Owner: "w1/aaaa", LeaseEpoch: 7}
		myRev := overwrite(t, st, lane, mine)
		takeover := edit(t, st, lane, func(e *session.SessionEntry) { e.Owner, e.LeaseEpoch = "w2/bbbb", 12 })
		rev1 := revOf(t, st, lane)
		calls := 0
		_, _, err := st.Mutate(ctx, lane, mine, myRev, &kv.Fence{Owner: "w1/aaaa", Epoch: 7}, func(e *session.SessionEntry) (*session.SessionEntry, error) {
			calls++
			e.CommittedSeq = 999
			return e, nil
		})
		if !errors.Is(err, kv.ErrLeaseLost) {
			t.Fatalf("err = %v, want ErrLeaseLost", err)
		}
		e, rev := mustGet(t, st, lane)
		if rev != rev1 || e.CommittedSeq != 0 || e.Owner != takeover.Owner {
			t.Errorf("zombie wrote: rev %d -> %d, entry %+v", rev1, rev, e)
		}
		if calls > 1 {
			t.Errorf("fn ran %d times, at most once (on the cached entry)", calls)
		}
	})
}

// runIncrements races 8 writers, each with its own connection, JetStream
// context, provisioned handles and Store, doing 50 fenced read-modify-write
// increments each on one entry. No update may be lost: the final count is
// 400 and the 400 successful writes returned the counts 1..400 exactly once.
func runIncrements(t *testing.T, newStore func() *kv.Store) {
	const writers, each = 8, 50
	// 400 contended compare-and-set writes, on R3 with each one replicated:
	// at a load average of 20 they have taken most of a minute, so this
	// deadline is wider than testCtx's.
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	stores := make([]*kv.Store, writers)
	for i := range stores {
		stores[i] = newStore()
	}
	lane := "race.counter"
	fence := &kv.Fence{Owner: "w/one", Epoch: 1}
	overwrite(t, stores[0], lane, &session.SessionEntry{SessionKey: "race", Owner: fence.Owner, LeaseEpoch: fence.Epoch})

	var calls atomic.Int64
	results := make([][]int64, writers)
	errs := make([]error, writers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	began := time.Now()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range each {
				e, _, err := stores[w].Mutate(ctx, lane, nil, 0, fence, func(e *session.SessionEntry) (*session.SessionEntry, error) {
					calls.Add(1)
					e.InputTokens++
					return e, nil
				})
				if err != nil {
					errs[w] = err
					return
				}
				results[w] = append(results[w], e.InputTokens)
			}
		}()
	}
	close(start)
	wg.Wait()
	for w, err := range errs {
		if err != nil {
			t.Errorf("writer %d: %v", w, err)
		}
	}
	// Reads are Direct Gets that any replica may answer, and an R3 follower
	// can lag behind the last write for a moment: wait for the value to
	// settle. A lost update never gets there; a double one overshoots.
	want := int64(writers * each)
	natstest.WaitFor(t, 10*time.Second, "the final count on every replica", func() error {
		for _, st := range stores {
			e, _, err := st.Get(ctx, lane)
			if err != nil {
				return err
			}
			if e.InputTokens != want {
				return fmt.Errorf("input_tokens = %d, want %d", e.InputTokens, want)
			}
		}
		return nil
	})
	var all []int64
	for _, r := range results {
		all = append(all, r...)
	}
	slices.Sort(all)
	for i, v := range all {
		if v != int64(i+1) {
			t.Fatalf("successful writes returned counts %v..., want each of 1..%d once", all[:min(len(all), i+3)], writers*each)
		}
	}
	t.Logf("%d increments by %d connections in %v, %d mutate calls (%d retries after conflicts)",
		len(all), writers, time.Since(began).Round(time.Millisecond), calls.Load(), calls.Load()-int64(len(all)))
	// The writers did race: some writes met a conflict and were retried.
	// (Without that the test would show nothing about lost updates.)
	if calls.Load() <= int64(len(all)) {
		t.Fatalf("no write met a conflict (%d mutate calls for %d writes): the writers never raced", calls.Load(), len(all))
	}
}

func TestMutateConcurrentConnections(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	runIncrements(t, func() *kv.Store {
		_, res := provisionOn(t, natstest.JetStream(t, srv.Connect(t)), 1)
		return kv.NewStore(res, nil)
	})
}

// TestMutateConcurrentConnectionsR3 is the same race on an R3 bucket of a
// 3-node cluster, where contended CAS writes also fail with err_code 10164.
func TestMutateConcurrentConnectionsR3(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster; skipped with -short")
	}
	t.Parallel()
	c := natstest.RunCluster(t, 3)
	runIncrements(t, func() *kv.Store {
		_, res := provisionOn(t, natstest.JetStream(t, c.Connect(t)), 3)
		return kv.NewStore(res, nil)
	})
}

func TestDelete(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	st := ev.store(t, nil)
	lane := "delete.me"
	stale := overwrite(t, st, lane, &session.SessionEntry{SessionKey: "k"})
	cur := overwrite(t, st, lane, &session.SessionEntry{SessionKey: "k", InputTokens: 1})
	if err := st.Delete(ctx, lane, stale); !errors.Is(err, kv.ErrRevisionMismatch) {
		t.Fatalf("delete at a stale revision: %v, want ErrRevisionMismatch", err)
	}
	if got := revOf(t, st, lane); got != cur {
		t.Fatalf("stale delete changed the entry: revision %d -> %d", cur, got)
	}
	if err := st.Delete(ctx, lane, cur); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Get(ctx, lane); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("Get after delete: %v, want ErrNotFound", err)
	}
}

func TestIndex(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	st := ev.store(t, nil)
	id := session.NewSessionID(t0)
	rec := kv.IndexRecord{Lane: "a.b", SessionKey: "a:b", CreatedAt: t0, ParentSessionID: session.NewSessionID(t0)}
	if err := st.Index(ctx, id, rec); err != nil {
		t.Fatal(err)
	}
	// Idempotent, and the first record stays.
	if err := st.Index(ctx, id, kv.IndexRecord{Lane: "c.d", SessionKey: "c:d"}); err != nil {
		t.Fatalf("second Index: %v", err)
	}
	got, err := st.LookupIndex(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Lane != rec.Lane || got.SessionKey != rec.SessionKey || got.ParentSessionID != rec.ParentSessionID || !got.CreatedAt.Equal(t0) {
		t.Errorf("LookupIndex = %+v, want %+v", got, rec)
	}
	for _, bad := range []string{session.NewSessionID(t0), "../etc", "20260310_120000_XYZ12345", ""} {
		if _, err := st.LookupIndex(ctx, bad); !errors.Is(err, kv.ErrNotFound) {
			t.Errorf("LookupIndex(%q): %v, want ErrNotFound", bad, err)
		}
	}
}

func TestLanesAndAll(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	st := ev.store(t, nil)
	if lanes, err := st.Lanes(ctx); err != nil || len(lanes) != 0 {
		t.Fatalf("Lanes on an empty bucket = %v, %v", lanes, err)
	}
	if all, err := st.All(ctx); err != nil || len(all) != 0 {
		t.Fatalf("All on an empty bucket = %v, %v", all, err)
	}
	revs := map[string]uint64{}
	for _, lane := range []string{"z.lane", "a.lane", "m.lane", "gone.lane"} {
		revs[lane] = overwrite(t, st, lane, &session.SessionEntry{SessionKey: lane})
	}
	revs["m.lane"] = overwrite(t, st, "m.lane", &session.SessionEntry{SessionKey: "m.lane", InputTokens: 2})
	if err := st.Delete(ctx, "gone.lane", revs["gone.lane"]); err != nil {
		t.Fatal(err)
	}
	delete(revs, "gone.lane")
	// A value that is not an entry is skipped by All and refused by Get.
	if _, err := ev.res.Sessions.Put(ctx, "junk.lane", []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Get(ctx, "junk.lane"); err == nil || errors.Is(err, kv.ErrNotFound) {
		t.Errorf("Get of a corrupt value: %v, want a decode error", err)
	}

	lanes, err := st.Lanes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a.lane", "junk.lane", "m.lane", "z.lane"}; !slices.Equal(lanes, want) {
		t.Errorf("Lanes = %v, want %v", lanes, want)
	}
	all, err := st.All(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, r := range all {
		if _, dup := got[r.Lane]; dup {
			t.Errorf("All lists %s twice", r.Lane)
		}
		got[r.Lane] = r.Revision
		if r.Entry.SessionKey != r.Lane {
			t.Errorf("record %s holds %+v", r.Lane, r.Entry)
		}
	}
	if len(got) != len(revs) {
		t.Errorf("All = %v, want %v", got, revs)
	}
	for lane, rev := range revs {
		if got[lane] != rev {
			t.Errorf("All: %s at revision %d, want %d", lane, got[lane], rev)
		}
	}
}
