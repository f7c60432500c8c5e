package worker

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
)

// tryGate starts an acquisition (alone: with an hour's bound); the channel
// yields its release function, or nil when it failed or did not get the
// whole gate when it asked for it.
func tryGate(g *turnGate, ctx context.Context, alone bool) chan func() {
	ch := make(chan func(), 1)
	go func() {
		if !alone {
			rel, ok := g.acquire(ctx)
			if !ok {
				rel = nil
			}
			ch <- rel
			return
		}
		rel, got, ok := g.acquireAlone(ctx, time.Hour)
		if !ok || !got {
			if ok {
				rel()
			}
			rel = nil
		}
		ch <- rel
	}()
	return ch
}

func mustGet(t *testing.T, ch chan func(), what string) func() {
	t.Helper()
	select {
	case rel := <-ch:
		if rel == nil {
			t.Fatalf("%s: acquisition failed", what)
		}
		return rel
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not acquired", what)
		return nil
	}
}

func mustWait(t *testing.T, ch chan func(), what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("%s: acquired, want it to wait", what)
	case <-time.After(50 * time.Millisecond): // a negative check: nothing to wait on
	}
}

func TestTurnGate(t *testing.T) {
	ctx := context.Background()
	g := newTurnGate(2)
	a := mustGet(t, tryGate(g, ctx, false), "shared a")
	b := mustGet(t, tryGate(g, ctx, false), "shared b")
	c := tryGate(g, ctx, false)
	mustWait(t, c, "shared c beyond the bound")

	// An exclusive waiter waits for every shared holder and goes before
	// shared waiters.
	x := tryGate(g, ctx, true)
	mustWait(t, x, "exclusive while two shared run")
	a()
	a() // a second release is harmless
	mustWait(t, x, "exclusive while one shared runs")
	if got := g.inUse(); got != 1 {
		t.Errorf("inUse %d, want 1", got)
	}
	b()
	relX := mustGet(t, x, "exclusive once the shared ended")
	mustWait(t, c, "shared c while the exclusive runs")
	if got := g.inUse(); got != 1 {
		t.Errorf("inUse with the exclusive holder %d, want 1", got)
	}
	relX()
	relC := mustGet(t, c, "shared c after the exclusive")
	relC()

	// A cancelled exclusive waiter lets shared waiters through.
	d := mustGet(t, tryGate(g, ctx, false), "shared d")
	cctx, cancel := context.WithCancel(ctx)
	y := tryGate(g, cctx, true)
	mustWait(t, y, "exclusive y behind d")
	e := tryGate(g, ctx, false)
	mustWait(t, e, "shared e behind the exclusive waiter")
	cancel()
	if rel := <-y; rel != nil {
		t.Fatal("a cancelled exclusive acquisition succeeded")
	}
	mustGet(t, e, "shared e once the exclusive waiter gave up")()
	d()
	if got, want := g.inUse(), 0; got != want {
		t.Errorf("inUse %d, want %d", got, want)
	}
	if got := g.exclusives(); got != 1 {
		t.Errorf("exclusives %d, want 1", got)
	}

	// Past its bound, a turn that asked for the whole gate takes an
	// ordinary slot beside the running turns, and new turns start again.
	long := mustGet(t, tryGate(g, ctx, false), "a long shared turn")
	bounded := make(chan bool, 1)
	go func() {
		rel, alone, ok := g.acquireAlone(ctx, 100*time.Millisecond)
		if ok {
			rel()
		}
		bounded <- ok && !alone
	}()
	select {
	case beside := <-bounded:
		if !beside {
			t.Error("past its bound the acquisition did not take an ordinary slot")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the bounded acquisition never returned")
	}
	mustGet(t, tryGate(g, ctx, false), "a new turn after the bound")()
	long()
	if got := g.exclusives(); got != 1 {
		t.Errorf("exclusives %d after the bounded acquisition, want still 1", got)
	}
}

func TestHeldRetryDelay(t *testing.T) {
	ttl := 15 * time.Second
	now := time.Now()
	for _, c := range []struct {
		name     string
		expires  time.Time
		min, max time.Duration
	}{
		{"unknown expiry: a whole TTL", time.Time{}, ttl, ttl},
		{"expires in 4s: just after", now.Add(4 * time.Second), 4 * time.Second, 4*time.Second + 250*time.Millisecond},
		{"already expired: the minimum", now.Add(-time.Second), 250 * time.Millisecond, 250 * time.Millisecond},
		{"clock skew far ahead: capped at the TTL", now.Add(time.Hour), ttl, ttl},
	} {
		if d := heldRetryDelay(c.expires, ttl); d < c.min || d > c.max {
			t.Errorf("%s: %v, want within [%v, %v]", c.name, d, c.min, c.max)
		}
	}
}

// hint builds a republished inbox message as the server sends it.
func hint(seq, last uint64, text string) *nats.Msg {
	m := nats.NewMsg("fleet.hint.0.lane")
	m.Header.Set(jetstream.SequenceHeader, strconv.FormatUint(seq, 10))
	m.Header.Set(jetstream.LastSequenceHeader, strconv.FormatUint(last, 10))
	m.Header.Set(broker.HdrKind, session.KindMessage)
	m.Data, _ = json.Marshal(session.Inbound{Kind: session.KindMessage, Text: text})
	return m
}

func TestHintedMessages(t *testing.T) {
	l := &owner{log: slog.New(slog.DiscardHandler)}
	for _, h := range []*nats.Msg{hint(5, 0, "a"), hint(9, 5, "b"), hint(12, 9, "c")} {
		if seq, ok := l.keepHint(h); !ok || seq == 0 {
			t.Fatalf("keepHint refused %v", h.Header)
		}
	}
	// A repeat or an older hint changes nothing.
	l.keepHint(hint(9, 5, "b again"))
	// A headers-only hint (an inbox provisioned by an older version) is a
	// hint, not a message.
	ho := hint(20, 12, "")
	ho.Header.Set("Nats-Msg-Size", "10")
	ho.Data = nil
	if seq, ok := l.keepHint(ho); !ok || seq != 20 {
		t.Fatalf("headers-only hint: %d %v", seq, ok)
	}
	for _, c := range []struct {
		seq  uint64
		want string // "" for a read from the stream
	}{
		{1, "a"}, {5, "a"}, {6, "b"}, {9, "b"}, {10, "c"}, {12, "c"},
		{13, ""}, // 20 came without its message
		{21, ""},
	} {
		got := ""
		if m := l.hintedAt(c.seq); m != nil {
			got = m.body.Text
		}
		if got != c.want {
			t.Errorf("hintedAt(%d) = %q, want %q", c.seq, got, c.want)
		}
	}
	// A hint whose previous seq is unknown to us says nothing about the
	// seqs before it: a message between 12 and 30 may have had its hint
	// lost.
	l.keepHint(hint(30, 25, "d"))
	if m := l.hintedAt(13); m != nil {
		t.Errorf("hintedAt(13) = seq %d, want a read (26..30 is all the hint covers)", m.seq)
	}
	if m := l.hintedAt(26); m == nil || m.seq != 30 {
		t.Errorf("hintedAt(26) = %v, want seq 30", m)
	}
	// Committed messages are forgotten.
	l.dropHinted(9)
	if m := l.hintedAt(1); m != nil {
		t.Errorf("hintedAt(1) after dropping up to 9 = seq %d", m.seq)
	}
	if m := l.hintedAt(10); m == nil || m.body.Text != "c" {
		t.Errorf("hintedAt(10) after dropping up to 9 = %v", m)
	}
	// The cache is bounded: the oldest go first.
	for i := uint64(0); i < maxHinted+10; i++ {
		l.keepHint(hint(100+i, 99+i, "x"))
	}
	if n := len(l.hinted); n != maxHinted {
		t.Errorf("%d hinted messages kept, want %d", n, maxHinted)
	}
	if m := l.hintedAt(100); m != nil {
		t.Errorf("the oldest hinted message survived the bound")
	}
}
