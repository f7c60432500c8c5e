package session_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/agentfleet/agentfleet/session"
)

func TestNormalizeWhatsAppID(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"60123456789@s.whatsapp.net", "60123456789"},
		{"60123456789:47@s.whatsapp.net", "60123456789"},
		{"999999999999999@lid", "999999999999999"},
		{"+60123456789", "60123456789"},
		{"  +60123456789  ", "60123456789"},
		{"60123456789", "60123456789"},
		{"120363012345678901@g.us", "120363012345678901"},
		{"60123456789@s.whatsapp.net:3", "60123456789"},
		{"++1", "+1"}, // only one leading '+'
		{"", ""},
		{"   ", ""},
		{"@s.whatsapp.net", ""},
		{"+", ""},
	}
	for _, tt := range tests {
		if got := session.NormalizeWhatsAppID(tt.in); got != tt.want {
			t.Errorf("NormalizeWhatsAppID(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// writeMapping writes the bridge file lid-mapping-<name>.json holding the
// JSON text content.
func writeMapping(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "lid-mapping-"+name+".json"), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestWhatsAppResolverCanonical(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// Phone 15551234567 ↔ LID 999999999999999 (forward and reverse files).
	writeMapping(t, dir, "15551234567", `"999999999999999@lid"`)
	writeMapping(t, dir, "999999999999999_reverse", `"15551234567@s.whatsapp.net"`)
	// A chain only reachable transitively: 7777777777777 → 888888888888 (reverse) → 55512 → 4444444444.
	writeMapping(t, dir, "7777777777777_reverse", `"888888888888:12@s.whatsapp.net"`)
	writeMapping(t, dir, "888888888888", `"+55512"`)
	writeMapping(t, dir, "55512_reverse", `"4444444444@lid"`)
	// A cycle: 111111111 → 222222222 → 333333333 → 111111111.
	writeMapping(t, dir, "111111111", `"222222222@lid"`)
	writeMapping(t, dir, "222222222", `"333333333@lid"`)
	writeMapping(t, dir, "333333333", `"111111111@s.whatsapp.net"`)
	// Same length: lexicographic order decides.
	writeMapping(t, dir, "900", `"800"`)
	writeMapping(t, dir, "800_reverse", `"700"`)
	// Malformed, empty and hostile files are ignored.
	writeMapping(t, dir, "123456", `not json`)
	writeMapping(t, dir, "654321", `""`)
	writeMapping(t, dir, "13131313", `"../../etc/passwd"`)
	writeMapping(t, dir, "24242424", `{"id": "1"}`)
	// A bare number is accepted too.
	writeMapping(t, dir, "5550001111", `42`)

	r := session.NewWhatsAppResolver(dir)
	tests := []struct {
		in, want string
	}{
		{"15551234567@s.whatsapp.net", "15551234567"},
		{"999999999999999@lid", "15551234567"},
		{"+15551234567", "15551234567"},
		{"15551234567:3@s.whatsapp.net", "15551234567"},
		{"7777777777777@lid", "55512"},
		{"888888888888", "55512"},
		{"55512", "55512"},
		{"111111111", "111111111"},
		{"222222222@lid", "111111111"},
		{"333333333", "111111111"},
		{"900", "700"},
		{"123456", "123456"},
		{"654321", "654321"},
		{"13131313", "13131313"},
		{"24242424", "24242424"},
		{"5550001111", "42"},
		{"31000000000", "31000000000"}, // no file at all
		{"", ""},
		{"@lid", ""},
	}
	for _, tt := range tests {
		if got := r.Canonical(tt.in); got != tt.want {
			t.Errorf("Canonical(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}

	// The transitive chain from 7777777777777 stops at 55512: the file of
	// 4444444444 does not exist, and forward links are not reversed.
	if got, want := r.Aliases("7777777777777"), []string{"55512", "4444444444", "888888888888", "7777777777777"}; !slices.Equal(got, want) {
		t.Errorf("Aliases() = %q, want %q", got, want)
	}
	// 4444444444 has no file of its own: it only knows itself.
	if got, want := r.Canonical("4444444444"), "4444444444"; got != want {
		t.Errorf("Canonical(4444444444) = %q, want %q", got, want)
	}
	if got := r.Aliases(""); got != nil {
		t.Errorf("Aliases(\"\") = %q, want nil", got)
	}
	// The caller owns the result.
	a := r.Aliases("15551234567")
	a[0] = "mutated"
	if got, want := r.Canonical("15551234567"), "15551234567"; got != want {
		t.Errorf("Canonical after mutating Aliases result = %q, want %q", got, want)
	}
}

func TestWhatsAppResolverWithoutDirectory(t *testing.T) {
	t.Parallel()
	for name, r := range map[string]*session.WhatsAppResolver{
		"nil":           nil,
		"empty dir":     session.NewWhatsAppResolver(""),
		"missing dir":   session.NewWhatsAppResolver(filepath.Join(t.TempDir(), "nope")),
		"unsafe lookup": session.NewWhatsAppResolver(t.TempDir()),
	} {
		if got, want := r.Canonical("+15551234567:2@s.whatsapp.net"), "15551234567"; got != want {
			t.Errorf("%s: Canonical() = %q, want %q", name, got, want)
		}
		if got, want := r.Canonical("a/../b@lid"), "a/../b"; got != want {
			t.Errorf("%s: Canonical() = %q, want %q", name, got, want)
		}
		r.Invalidate() // safe on every resolver
	}
}

func TestWhatsAppResolverInvalidate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := session.NewWhatsAppResolver(dir)
	if got, want := r.Canonical("999999999999999@lid"), "999999999999999"; got != want {
		t.Fatalf("Canonical() = %q, want %q", got, want)
	}
	// The bridge learns the mapping; the cached answer holds until invalidated.
	writeMapping(t, dir, "999999999999999_reverse", `"15551234567@s.whatsapp.net"`)
	if got, want := r.Canonical("999999999999999@lid"), "999999999999999"; got != want {
		t.Fatalf("Canonical() (cached) = %q, want %q", got, want)
	}
	r.Invalidate()
	if got, want := r.Canonical("999999999999999@lid"), "15551234567"; got != want {
		t.Fatalf("Canonical() after Invalidate = %q, want %q", got, want)
	}
	if got, want := r.Dir(), dir; got != want {
		t.Errorf("Dir() = %q, want %q", got, want)
	}
}

func TestWhatsAppResolverConcurrent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for i := range 50 {
		writeMapping(t, dir, fmt.Sprintf("%d_reverse", 900000000+i), fmt.Sprintf(`"1000%d@s.whatsapp.net"`, i))
	}
	r := session.NewWhatsAppResolver(dir)
	var wg sync.WaitGroup
	errs := make(chan string, 1000)
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				id := fmt.Sprintf("%d@lid", 900000000+(i+g)%50)
				want := fmt.Sprintf("1000%d", (i+g)%50)
				if got := r.Canonical(id); got != want {
					errs <- fmt.Sprintf("Canonical(%q) = %q, want %q", id, got, want)
				}
				if g%4 == 0 && i%10 == 0 {
					r.Invalidate()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// Reverse-only mappings (LID → phone) resolve from the LID.
func TestWhatsAppResolverReverseFileOnly(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeMapping(t, dir, "999999999999999_reverse", `"15551234567@s.whatsapp.net"`)
	r := session.NewWhatsAppResolver(dir)
	if got, want := r.Canonical("999999999999999@lid"), "15551234567"; got != want {
		t.Errorf("Canonical(LID) = %q, want %q", got, want)
	}
	// No forward file: the phone form only knows itself.
	if got, want := r.Canonical("15551234567@s.whatsapp.net"), "15551234567"; got != want {
		t.Errorf("Canonical(phone) = %q, want %q", got, want)
	}
}

func TestBuildSessionKeyWhatsApp(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeMapping(t, dir, "15551234567", `"999999999999999@lid"`)
	writeMapping(t, dir, "999999999999999_reverse", `"15551234567@s.whatsapp.net"`)
	// A group whose id also has a mapping file: group ids are not canonicalized.
	writeMapping(t, dir, "120363012345678901", `"1@lid"`)
	resolved := session.DefaultKeyOptions()
	resolved.WhatsApp = session.NewWhatsAppResolver(dir)
	plain := session.DefaultKeyOptions()
	threadPerUser := resolved
	threadPerUser.ThreadSessionsPerUser = true

	tests := []struct {
		name string
		src  session.SessionSource
		opts session.KeyOptions
		want string
	}{
		{
			name: "DM by phone JID",
			src:  session.SessionSource{Platform: "whatsapp", ChatType: "dm", ChatID: "15551234567@s.whatsapp.net", UserID: "15551234567@s.whatsapp.net"},
			opts: resolved, want: "agent:main:whatsapp:dm:15551234567",
		},
		{
			name: "DM by LID canonicalizes to the phone",
			src:  session.SessionSource{Platform: "whatsapp", ChatType: "dm", ChatID: "999999999999999@lid", UserID: "999999999999999@lid"},
			opts: resolved, want: "agent:main:whatsapp:dm:15551234567",
		},
		{
			name: "DM by LID without resolver is only normalized",
			src:  session.SessionSource{Platform: "whatsapp", ChatType: "dm", ChatID: "999999999999999@lid"},
			opts: plain, want: "agent:main:whatsapp:dm:999999999999999",
		},
		{
			name: "DM with device suffix",
			src:  session.SessionSource{Platform: "whatsapp", ChatType: "dm", ChatID: "+15551234567:12@s.whatsapp.net"},
			opts: plain, want: "agent:main:whatsapp:dm:15551234567",
		},
		{
			name: "DM without chat id uses the canonical participant",
			src:  session.SessionSource{Platform: "whatsapp", ChatType: "dm", UserID: "999999999999999@lid"},
			opts: resolved, want: "agent:main:whatsapp:dm:15551234567",
		},
		{
			name: "DM chat id that normalizes to nothing falls back to the participant",
			src:  session.SessionSource{Platform: "whatsapp", ChatType: "dm", ChatID: "@s.whatsapp.net", UserID: "999999999999999@lid"},
			opts: resolved, want: "agent:main:whatsapp:dm:15551234567",
		},
		{
			name: "group participant by LID",
			src:  session.SessionSource{Platform: "whatsapp", ChatType: "group", ChatID: "120363012345678901@g.us", UserID: "999999999999999@lid"},
			opts: resolved, want: "agent:main:whatsapp:group:120363012345678901@g.us:15551234567",
		},
		{
			name: "group participant by phone",
			src:  session.SessionSource{Platform: "whatsapp", ChatType: "group", ChatID: "120363012345678901@g.us", UserID: "15551234567@s.whatsapp.net"},
			opts: resolved, want: "agent:main:whatsapp:group:120363012345678901@g.us:15551234567",
		},
		{
			name: "group participant without resolver is normalized",
			src:  session.SessionSource{Platform: "whatsapp", ChatType: "group", ChatID: "120363012345678901@g.us", UserID: "999999999999999:4@lid"},
			opts: plain, want: "agent:main:whatsapp:group:120363012345678901@g.us:999999999999999",
		},
		{
			name: "shared thread has no participant",
			src:  session.SessionSource{Platform: "whatsapp", ChatType: "group", ChatID: "120363012345678901@g.us", ThreadID: "t", UserID: "999999999999999@lid"},
			opts: resolved, want: "agent:main:whatsapp:group:120363012345678901@g.us:t",
		},
		{
			name: "per-user thread participant is canonical",
			src:  session.SessionSource{Platform: "whatsapp", ChatType: "group", ChatID: "120363012345678901@g.us", ThreadID: "t", UserID: "999999999999999@lid"},
			opts: threadPerUser, want: "agent:main:whatsapp:group:120363012345678901@g.us:t:15551234567",
		},
		{
			name: "participant that normalizes to nothing stays raw",
			src:  session.SessionSource{Platform: "whatsapp", ChatType: "group", ChatID: "g@g.us", UserID: "@lid"},
			opts: resolved, want: "agent:main:whatsapp:group:g@g.us:@lid",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := session.BuildSessionKey(tt.src, tt.opts); got != tt.want {
				t.Errorf("BuildSessionKey() = %q, want %q", got, tt.want)
			}
		})
	}
}
