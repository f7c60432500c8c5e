package kv_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/kv"
)

func TestMsgIDs(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	_, res := ev.connect(t)
	m := kv.NewMsgIDs(res)

	// Ids that look alike once ':' and '.' are involved, with characters a
	// KV key can't hold, each get their own key.
	ids := []string{
		"telegram:-100123:42",
		"telegram.-100123.42",
		"telegram:-100123.42",
		"telegram=3A-100123=3A42",
		"slack:T01:C02:1712345678.000100",
		"whatsapp:+15551234567@s.whatsapp.net:ABCDEF",
		"http::",
		":",
		"",
		"with space/and\\slashes",
		"wild*card>chars",
		"ünïcödé:✓",
		"a..b",
	}
	for i, id := range ids {
		seq := uint64(100 + i)
		got, err := m.Record(ctx, id, seq)
		if err != nil {
			t.Fatalf("Record(%q): %v", id, err)
		}
		if got != seq {
			t.Errorf("first Record(%q, %d) = %d, want %d", id, seq, got, seq)
		}
	}
	for i, id := range ids {
		first := uint64(100 + i)
		got, err := m.Record(ctx, id, 9999)
		if err != nil {
			t.Fatalf("second Record(%q): %v", id, err)
		}
		if got != first {
			t.Errorf("duplicate Record(%q) = %d, want the first seq %d", id, got, first)
		}
		seq, ok, err := m.Lookup(ctx, id)
		if err != nil || !ok || seq != first {
			t.Errorf("Lookup(%q) = %d, %v, %v; want %d", id, seq, ok, err, first)
		}
	}
	keys := map[string]string{}
	for _, id := range ids {
		k := m.Key(id)
		if prev, dup := keys[k]; dup {
			t.Errorf("ids %q and %q share the key %q", prev, id, k)
		}
		keys[k] = id
	}
	if seq, ok, err := m.Lookup(ctx, "never:seen"); err != nil || ok || seq != 0 {
		t.Errorf("Lookup of an unknown id = %d, %v, %v", seq, ok, err)
	}
}

// TestMsgIDsRace: writers on their own connections record one id with
// different seqs at once; exactly one seq wins and everybody is told it.
func TestMsgIDsRace(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	const writers = 8
	stores := make([]*kv.MsgIDs, writers)
	for i := range stores {
		_, res := ev.connect(t)
		stores[i] = kv.NewMsgIDs(res)
	}
	for round := range 5 {
		id := fmt.Sprintf("race:%d", round)
		got := make([]uint64, writers)
		errs := make([]error, writers)
		var wg sync.WaitGroup
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[w], errs[w] = stores[w].Record(ctx, id, uint64(w+1))
			}()
		}
		wg.Wait()
		for w := range writers {
			if errs[w] != nil {
				t.Fatalf("writer %d: %v", w, errs[w])
			}
			if got[w] != got[0] {
				t.Fatalf("round %d: writers were told %v, want one winner", round, got)
			}
		}
		if seq, ok, err := stores[0].Lookup(ctx, id); err != nil || !ok || seq != got[0] {
			t.Errorf("Lookup = %d, %v, %v; want %d", seq, ok, err, got[0])
		}
	}
}

// TestMsgIDsRecordAsync: a claim whose create is sent without waiting
// answers as Record does: the first seq owns the id, a later seq gets the
// first's, the same seq again gets itself (idempotent), several waiters
// get one answer, and an id whose record was deleted is claimed again.
func TestMsgIDsRecordAsync(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	js, res := ev.connect(t)
	ajs, err := jetstream.New(js.Conn(), jetstream.WithPublishAsyncTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m := kv.NewMsgIDsAsync(res, ajs)
	for i := range 10 {
		id := fmt.Sprintf("telegram:-100123:%d", i)
		first := uint64(100 + i)
		c := m.RecordAsync(id, first)
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				if got, err := c.Wait(ctx); err != nil || got != first {
					t.Errorf("RecordAsync(%q, %d).Wait = %d, %v; want %d", id, first, got, err, first)
				}
			})
		}
		wg.Wait()
		if got, err := m.RecordAsync(id, 9999).Wait(ctx); err != nil || got != first {
			t.Errorf("later RecordAsync(%q) = %d, %v; want the first seq %d", id, got, err, first)
		}
		if got, err := m.RecordAsync(id, first).Wait(ctx); err != nil || got != first {
			t.Errorf("RecordAsync(%q, %d) again = %d, %v; want %d", id, first, got, err, first)
		}
	}
	// A deleted record (a delete marker is the key's last message) is
	// claimed again by the next seq.
	id := "telegram:-100123:0"
	if err := res.MsgIDs.Delete(ctx, m.Key(id)); err != nil {
		t.Fatal(err)
	}
	if got, err := m.RecordAsync(id, 500).Wait(ctx); err != nil || got != 500 {
		t.Errorf("RecordAsync after delete = %d, %v; want 500", got, err)
	}
}
