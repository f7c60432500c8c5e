package session

import (
	"cmp"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// WhatsApp resolver limits.
const (
	// whatsAppCacheTTL is how long a resolved alias set is reused before the
	// mapping files are read again (the bridge adds mappings as it learns them).
	whatsAppCacheTTL = 30 * time.Second
	// whatsAppCacheMax bounds the number of cached ids.
	whatsAppCacheMax = 4096
	// whatsAppMaxAliases bounds one alias walk, whatever the files say.
	whatsAppMaxAliases = 64
	// whatsAppMaxFileSize bounds one mapping file read.
	whatsAppMaxFileSize = 4 << 10
)

// NormalizeWhatsAppID strips WhatsApp JID/LID syntax down to the bare
// identifier: surrounding spaces, a leading '+', a device suffix after ':'
// and a domain after '@' are removed, so "+60123456789:47@s.whatsapp.net",
// "60123456789@s.whatsapp.net" and "60123456789" all become "60123456789".
func NormalizeWhatsAppID(s string) string {
	s = strings.TrimSpace(s)
	s = strings.TrimPrefix(s, "+")
	s, _, _ = strings.Cut(s, ":")
	s, _, _ = strings.Cut(s, "@")
	return s
}

// WhatsAppResolver canonicalizes WhatsApp identities across the phone-number
// (JID) and LID aliases the bridge may surface for one person. It follows
// the bridge's mapping files lid-mapping-<id>.json and
// lid-mapping-<id>_reverse.json in its directory, each holding a JSON string
// that names another alias.
//
// A resolver caches what it resolved for a short time and is safe for
// concurrent use. The nil *WhatsAppResolver and one with an empty directory
// only normalize.
type WhatsAppResolver struct {
	dir string
	ttl time.Duration
	now func() time.Time // the clock of the cache; tests replace it

	mu    sync.Mutex
	cache map[string]whatsAppCacheEntry // normalized id → its alias set
}

type whatsAppCacheEntry struct {
	aliases []string // sorted, canonical first
	expires time.Time
}

// NewWhatsAppResolver returns a resolver reading the mapping files in dir
// (the bridge's session directory). Missing files, and a missing directory,
// mean an id has no alias but itself.
func NewWhatsAppResolver(dir string) *WhatsAppResolver {
	return &WhatsAppResolver{
		dir:   dir,
		ttl:   whatsAppCacheTTL,
		now:   time.Now,
		cache: make(map[string]whatsAppCacheEntry),
	}
}

// Dir returns the directory the resolver reads.
func (r *WhatsAppResolver) Dir() string {
	if r == nil {
		return ""
	}
	return r.dir
}

// Canonical returns the stable identity of id: id is normalized
// (NormalizeWhatsAppID), its aliases are followed transitively through the
// mapping files (cycles are harmless), and the shortest alias wins, the
// lexicographically smallest among equals. It returns "" when id normalizes
// to "", and the normalized id when it has no alias.
func (r *WhatsAppResolver) Canonical(id string) string {
	aliases := r.Aliases(id)
	if len(aliases) == 0 {
		return ""
	}
	return aliases[0]
}

// Aliases returns every known alias of id (normalized, id included), the
// canonical one first, the rest in canonical order. It returns nil when id
// normalizes to "". It serves authorization, which must match any alias of
// a sender against an allow-list. The caller may modify the result.
func (r *WhatsAppResolver) Aliases(id string) []string {
	n := NormalizeWhatsAppID(id)
	if n == "" {
		return nil
	}
	if r == nil || r.dir == "" || !safeWhatsAppID(n) {
		return []string{n}
	}

	now := r.now()
	r.mu.Lock()
	if e, ok := r.cache[n]; ok && now.Before(e.expires) {
		r.mu.Unlock()
		return slices.Clone(e.aliases)
	}
	r.mu.Unlock()

	// Read outside the lock: two callers may resolve the same id at once,
	// which costs a few reads and gives the same answer.
	aliases := r.walk(n)

	r.mu.Lock()
	r.store(n, aliases, now)
	r.mu.Unlock()
	return slices.Clone(aliases)
}

// Invalidate drops every cached alias set, so the next lookups read the
// mapping files again.
func (r *WhatsAppResolver) Invalidate() {
	if r == nil {
		return
	}
	r.mu.Lock()
	clear(r.cache)
	r.mu.Unlock()
}

// store caches aliases for n, keeping the cache bounded. r.mu is held.
func (r *WhatsAppResolver) store(n string, aliases []string, now time.Time) {
	if len(r.cache) >= whatsAppCacheMax {
		for k, e := range r.cache {
			if !now.Before(e.expires) {
				delete(r.cache, k)
			}
		}
		// Still full of live entries: drop an arbitrary eighth at once, so a
		// full cache does not scan on every insert.
		for k := range r.cache {
			if len(r.cache) <= whatsAppCacheMax-whatsAppCacheMax/8 {
				break
			}
			delete(r.cache, k)
		}
	}
	r.cache[n] = whatsAppCacheEntry{aliases: aliases, expires: now.Add(r.ttl)}
}

// walk collects the alias set of the normalized id n, breadth first, and
// returns it sorted canonical-first.
func (r *WhatsAppResolver) walk(n string) []string {
	seen := map[string]bool{n: true}
	queue := []string{n}
	for len(queue) > 0 && len(seen) < whatsAppMaxAliases {
		cur := queue[0]
		queue = queue[1:]
		for _, suffix := range []string{"", "_reverse"} {
			mapped, ok := r.readMapping(cur, suffix)
			if !ok || seen[mapped] || len(seen) >= whatsAppMaxAliases {
				continue
			}
			seen[mapped] = true
			queue = append(queue, mapped)
		}
	}
	aliases := make([]string, 0, len(seen))
	for a := range seen {
		aliases = append(aliases, a)
	}
	slices.SortFunc(aliases, compareWhatsAppCanonical)
	return aliases
}

// readMapping reads lid-mapping-<id><suffix>.json and returns the normalized
// alias it names. A missing, unreadable or malformed file, or an alias that
// is not a safe identifier, yields ok=false.
func (r *WhatsAppResolver) readMapping(id, suffix string) (string, bool) {
	f, err := os.Open(filepath.Join(r.dir, "lid-mapping-"+id+suffix+".json"))
	if err != nil {
		return "", false
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, whatsAppMaxFileSize+1))
	if err != nil || len(data) > whatsAppMaxFileSize {
		return "", false
	}
	mapped := NormalizeWhatsAppID(decodeWhatsAppMapping(data))
	if mapped == "" || !safeWhatsAppID(mapped) {
		return "", false
	}
	return mapped, true
}

// decodeWhatsAppMapping accepts the JSON string the bridge writes, and a
// bare JSON number for robustness; anything else is "".
func decodeWhatsAppMapping(data []byte) string {
	var s string
	if err := json.Unmarshal(data, &s); err == nil {
		return s
	}
	var n json.Number
	if err := json.Unmarshal(data, &n); err == nil {
		return n.String()
	}
	return ""
}

// safeWhatsAppID reports whether a normalized id may be part of a mapping
// file name: only characters WhatsApp ids use, and no "..".
func safeWhatsAppID(s string) bool {
	if s == "" || strings.Contains(s, "..") {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			c == '.' || c == '-' || c == '_' || c == '+'
		if !ok {
			return false
		}
	}
	return true
}

// compareWhatsAppCanonical orders aliases shortest first, then
// lexicographically.
func compareWhatsAppCanonical(a, b string) int {
	return cmp.Or(cmp.Compare(len(a), len(b)), strings.Compare(a, b))
}
