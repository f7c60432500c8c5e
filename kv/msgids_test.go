package kv_test

import (
	"fmt"
	"sync"
	"testing"

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
		got, err := m.Claim(ctx, id, kv.MsgRef{Seq: seq})
		if err != nil {
			t.Fatalf("Claim(%q): %v", id, err)
		}
		if got.Seq != seq {
			t.Errorf("first Claim(%q, %d) = %d, want %d", id, seq, got.Seq, seq)
		}
	}
	for i, id := range ids {
		first := uint64(100 + i)
		got, err := m.Claim(ctx, id, kv.MsgRef{Seq: 9999})
		if err != nil {
			t.Fatalf("second Claim(%q): %v", id, err)
		}
		if got.Seq != first {
			t.Errorf("duplicate Claim(%q) = %d, want the first seq %d", id, got.Seq, first)
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

// Renew rewrites a record still at the revision read, value unchanged, and
// leaves one rewritten since (no error).
func TestMsgIDsRenew(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	_, res := ev.connect(t)
	m := kv.NewMsgIDs(res)
	if _, err := m.Claim(ctx, "http:c1:m1", kv.MsgRef{Seq: 7, Inbox: "in-a"}); err != nil {
		t.Fatal(err)
	}
	e, err := res.MsgIDs.Get(ctx, m.Key("http:c1:m1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Renew(ctx, "http:c1:m1", e.Value(), e.Revision()); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	renewed, err := res.MsgIDs.Get(ctx, m.Key("http:c1:m1"))
	if err != nil {
		t.Fatal(err)
	}
	if string(renewed.Value()) != "7 in-a" || renewed.Revision() <= e.Revision() {
		t.Fatalf("renewed record %q at revision %d, want \"7 in-a\" after revision %d", renewed.Value(), renewed.Revision(), e.Revision())
	}
	// A renewal from the revision read before: a conflict, no error, and
	// the record stays.
	if err := m.Renew(ctx, "http:c1:m1", []byte("stale"), e.Revision()); err != nil {
		t.Fatalf("Renew of a rewritten record: %v", err)
	}
	if got, err := res.MsgIDs.Get(ctx, m.Key("http:c1:m1")); err != nil || string(got.Value()) != "7 in-a" || got.Revision() != renewed.Revision() {
		t.Fatalf("after a stale Renew: %v, %v", got, err)
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
		got := make([]kv.MsgRef, writers)
		errs := make([]error, writers)
		var wg sync.WaitGroup
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[w], errs[w] = stores[w].Claim(ctx, id, kv.MsgRef{Seq: uint64(w + 1)})
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
		if seq, ok, err := stores[0].Lookup(ctx, id); err != nil || !ok || seq != got[0].Seq {
			t.Errorf("Lookup = %d, %v, %v; want %d", seq, ok, err, got[0].Seq)
		}
	}
}

// TestMsgIDsNameTheStream: a record names the inbox stream its seq counts
// in, so the same seq in another stream (a platform retry that landed in
// the new stream of a moved partition) is another message; a record
// written before records named their stream is judged by its seq alone.
func TestMsgIDsNameTheStream(t *testing.T) {
	t.Parallel()
	ev := newEnv(t)
	ctx := testCtx(t)
	_, res := ev.connect(t)
	m := kv.NewMsgIDs(res)

	first := kv.MsgRef{Seq: 5, Inbox: "stream-a"}
	if got, err := m.Claim(ctx, "http:c:1", first); err != nil || got != first {
		t.Fatalf("Claim = %+v, %v; want %+v", got, err, first)
	}
	if got, err := m.Claim(ctx, "http:c:1", first); err != nil || !got.Same(first) {
		t.Fatalf("Claim again = %+v, %v; want %+v", got, err, first)
	}
	retry := kv.MsgRef{Seq: 5, Inbox: "stream-b"}
	got, err := m.Claim(ctx, "http:c:1", retry)
	if err != nil || got != first || got.Same(retry) {
		t.Fatalf("Claim of the same seq in another stream = %+v (same: %v), %v; want %+v, another message", got, got.Same(retry), err, first)
	}
	if r, ok, err := m.Find(ctx, "http:c:1"); err != nil || !ok || r != first {
		t.Fatalf("Find = %+v, %v, %v", r, ok, err)
	}

	// An older record: the seq alone.
	if _, err := res.MsgIDs.Put(ctx, m.Key("http:c:2"), []byte("7")); err != nil {
		t.Fatal(err)
	}
	got, err = m.Claim(ctx, "http:c:2", kv.MsgRef{Seq: 7, Inbox: "stream-b"})
	if err != nil || got != (kv.MsgRef{Seq: 7}) || !got.Same(kv.MsgRef{Seq: 7, Inbox: "stream-b"}) || got.Same(kv.MsgRef{Seq: 8, Inbox: "stream-b"}) {
		t.Fatalf("Claim over an older record = %+v, %v", got, err)
	}
	if seq, ok, err := m.Lookup(ctx, "http:c:1"); err != nil || !ok || seq != 5 {
		t.Fatalf("Lookup = %d, %v, %v", seq, ok, err)
	}
}
