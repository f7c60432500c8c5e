package session

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// fakeClock is a settable clock for the resolver cache.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestWhatsAppResolverCacheExpires(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	clock := &fakeClock{now: time.Date(2026, 6, 16, 12, 0, 0, 0, time.UTC)}
	r := NewWhatsAppResolver(dir)
	r.now = clock.Now

	if got, want := r.Canonical("999999999999999@lid"), "999999999999999"; got != want {
		t.Fatalf("Canonical() = %q, want %q", got, want)
	}
	// The bridge learns the mapping.
	if err := os.WriteFile(filepath.Join(dir, "lid-mapping-999999999999999_reverse.json"), []byte(`"15551234567@s.whatsapp.net"`), 0o600); err != nil {
		t.Fatal(err)
	}
	clock.Advance(whatsAppCacheTTL - time.Nanosecond)
	if got, want := r.Canonical("999999999999999@lid"), "999999999999999"; got != want {
		t.Fatalf("Canonical() before expiry = %q, want cached %q", got, want)
	}
	clock.Advance(time.Nanosecond)
	if got, want := r.Canonical("999999999999999@lid"), "15551234567"; got != want {
		t.Fatalf("Canonical() after expiry = %q, want %q", got, want)
	}
}

func TestWhatsAppResolverCacheIsBounded(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{now: time.Date(2026, 6, 16, 12, 0, 0, 0, time.UTC)}
	r := NewWhatsAppResolver(t.TempDir())
	r.now = clock.Now
	for i := range whatsAppCacheMax + 500 {
		if i == whatsAppCacheMax/2 {
			clock.Advance(whatsAppCacheTTL) // the first half expires
		}
		id := fmt.Sprintf("%d", 1_000_000+i)
		if got := r.Canonical(id); got != id {
			t.Fatalf("Canonical(%q) = %q", id, got)
		}
		r.mu.Lock()
		n := len(r.cache)
		r.mu.Unlock()
		if n > whatsAppCacheMax {
			t.Fatalf("cache holds %d entries, limit %d", n, whatsAppCacheMax)
		}
	}
}

func TestWhatsAppResolverBoundsTheWalk(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// A chain longer than the walk limit.
	for i := range 3 * whatsAppMaxAliases {
		name := filepath.Join(dir, fmt.Sprintf("lid-mapping-%d.json", 500+i))
		if err := os.WriteFile(name, fmt.Appendf(nil, `"%d"`, 501+i), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// An oversized file is ignored.
	big := make([]byte, whatsAppMaxFileSize+10)
	for i := range big {
		big[i] = '1'
	}
	if err := os.WriteFile(filepath.Join(dir, "lid-mapping-77.json"), big, 0o600); err != nil {
		t.Fatal(err)
	}
	r := NewWhatsAppResolver(dir)
	if got := len(r.Aliases("500")); got != whatsAppMaxAliases {
		t.Errorf("len(Aliases()) = %d, want the limit %d", got, whatsAppMaxAliases)
	}
	if got, want := r.Canonical("77"), "77"; got != want {
		t.Errorf("Canonical(77) = %q, want %q", got, want)
	}
}
