package session_test

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/session"
)

// kvKeyRe is the key pattern of JetStream KV (nats.go's validKeyRe).
var kvKeyRe = regexp.MustCompile(`^[-/_=\.a-zA-Z0-9]+$`)

func TestLaneToken(t *testing.T) {
	t.Parallel()
	tests := []struct{ key, want string }{
		{"agent:main:telegram:dm:12345", "agent.main.telegram.dm.12345"},
		{"agent:main:telegram:group:-10012345:user_abc", "agent.main.telegram.group.-10012345.user_abc"},
		{"agent:main:telegram:dm", "agent.main.telegram.dm"},
		{"agent:main:slack:channel:C1:1700000000.1234:U1", "agent.main.slack.channel.C1.1700000000=2E1234.U1"},
		{"agent:main:whatsapp:group:120363@g.us:155", "agent.main.whatsapp.group.120363=40g=2Eus.155"},
		{"agent:main:matrix:group:!room:example.org", "agent.main.matrix.group.=21room.example=2Eorg"},
		{"a=b", "a=3Db"},
		{"a b*c>d", "a=20b=2Ac=3Ed"},
		{"", "="},
		{":", "=.="},
		{"a::b", "a.=.b"},
		{":a:", "=.a.="},
		{"=", "=3D"},
		{"ü", "=C3=BC"},
		{"\x00\xff", "=00=FF"},
		{"a/b", "a=2Fb"},
	}
	for _, tt := range tests {
		got := session.LaneToken(tt.key)
		if got != tt.want {
			t.Errorf("LaneToken(%q) = %q, want %q", tt.key, got, tt.want)
			continue
		}
		back, err := session.ParseLaneToken(got)
		if err != nil {
			t.Errorf("ParseLaneToken(%q): %v", got, err)
			continue
		}
		if back != tt.key {
			t.Errorf("ParseLaneToken(%q) = %q, want %q", got, back, tt.key)
		}
	}
}

func TestParseLaneTokenRejects(t *testing.T) {
	t.Parallel()
	for _, tok := range []string{
		"",             // empty
		".",            // empty segments
		"a..b",         // empty segment
		"a.",           // trailing empty segment
		".a",           // leading empty segment
		"a b",          // space
		"a*b",          // wildcard
		"a>b",          // wildcard
		"a/b",          // not escaped
		"a:b",          // not escaped
		"a=",           // truncated escape
		"a=4",          // truncated escape
		"a=zz",         // not hex
		"a=2e",         // lower-case hex
		"a=41",         // 'A' must be written as itself
		"a=5F",         // '_' must be written as itself
		"==",           // '=' then '=' is not an escape
		"==3D",         // a lone '=' only stands for a whole empty segment
		"a.=.=3",       // truncated
		"ü",            // raw non-ASCII
		"a\x00",        // control byte
		"agent.main\t", // tab
	} {
		got, err := session.ParseLaneToken(tok)
		if !errors.Is(err, session.ErrInvalidLaneToken) {
			t.Errorf("ParseLaneToken(%q) = %q, %v; want ErrInvalidLaneToken", tok, got, err)
		}
	}
}

func TestPartition(t *testing.T) {
	t.Parallel()
	// Hand-computed FNV-1a 32: offset basis 0x811c9dc5, prime 0x01000193.
	fnv1a := func(s string) uint32 {
		h := uint32(0x811c9dc5)
		for i := 0; i < len(s); i++ {
			h ^= uint32(s[i])
			h *= 0x01000193
		}
		return h
	}
	if got, want := fnv1a("a"), uint32(0xe40c292c); got != want {
		t.Fatalf("reference FNV-1a(a) = %#x, want %#x", got, want)
	}
	tests := []struct {
		prefix, lane string
		hash         uint32
		want         int
	}{
		{"fleet", "agent.main.telegram.dm.12345", 0xcbf42c31, 49},
		{"fleet", "agent.main.telegram.group.-10012345.user_abc", 0x804d8155, 21},
	}
	for _, tt := range tests {
		subject := tt.prefix + ".in." + tt.lane
		if got := fnv1a(subject); got != tt.hash {
			t.Errorf("FNV-1a(%q) = %#x, want %#x", subject, got, tt.hash)
		}
		if got := session.Partition(tt.prefix, tt.lane); got != tt.want {
			t.Errorf("Partition(%q, %q) = %d, want %d", tt.prefix, tt.lane, got, tt.want)
		}
	}
	// Every lane maps into range, and agrees with the reference.
	for i := range 2000 {
		lane := session.LaneToken(fmt.Sprintf("agent:main:telegram:group:-100%d:u%d", i, i*7))
		got := session.Partition("fleet", lane)
		if got < 0 || got >= session.NumPartitions {
			t.Fatalf("Partition() = %d, out of range", got)
		}
		if want := int(fnv1a("fleet.in."+lane) % 64); got != want {
			t.Fatalf("Partition(%q) = %d, want %d", lane, got, want)
		}
	}
	if got, want := session.Partition("other", "agent.main.telegram.dm.12345"), int(fnv1a("other.in.agent.main.telegram.dm.12345")%64); got != want {
		t.Errorf("Partition with another prefix = %d, want %d", got, want)
	}
}

// checkLaneToken asserts every property of the token of key.
func checkLaneToken(t *testing.T, key string) {
	t.Helper()
	tok := session.LaneToken(key)
	for i, seg := range strings.Split(tok, ".") {
		if seg == "" {
			t.Fatalf("LaneToken(%q) = %q: segment %d is empty", key, tok, i)
		}
		if strings.ContainsAny(seg, "*> \t\r\n\f\v") {
			t.Fatalf("LaneToken(%q) = %q: segment %q is not a subject token", key, tok, seg)
		}
		for j := 0; j < len(seg); j++ {
			c := seg[j]
			ok := c == '=' || c == '_' || c == '-' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
			if !ok {
				t.Fatalf("LaneToken(%q) = %q: byte %q in segment %q", key, tok, c, seg)
			}
		}
	}
	if !kvKeyRe.MatchString(tok) {
		t.Fatalf("LaneToken(%q) = %q: not a valid KV key", key, tok)
	}
	if got, want := strings.Count(tok, "."), strings.Count(key, ":"); got != want {
		t.Fatalf("LaneToken(%q) = %q: %d dots for %d colons", key, tok, got, want)
	}
	back, err := session.ParseLaneToken(tok)
	if err != nil {
		t.Fatalf("ParseLaneToken(LaneToken(%q) = %q): %v", key, tok, err)
	}
	if back != key {
		t.Fatalf("ParseLaneToken(LaneToken(%q)) = %q", key, back)
	}
	if p := session.Partition("fleet", tok); p < 0 || p >= session.NumPartitions {
		t.Fatalf("Partition(%q) = %d", tok, p)
	}
}

func FuzzLaneToken(f *testing.F) {
	for _, seed := range []string{
		"",
		":",
		"::",
		"=",
		"==",
		"=3D",
		"agent:main:telegram:dm:12345",
		"agent:main:telegram:dm:12345:thread_678",
		"agent:main:telegram:dm",
		"agent:main:telegram:group:-10012345:user_abc",
		"agent:main:discord:group:12345:thread_678:user_abc",
		"agent:main:slack:channel:C12345:1700000000.1234",
		"agent:main:whatsapp:group:120363012345678901@g.us:15551234567",
		"agent:main:matrix:group:!room:example.org:@alice:example.org",
		"agent:main:email:dm:alice@example.com",
		"a b\tc\nd",
		"*.>",
		"../../etc/passwd",
		"ünïcødé:用户",
		"\x00\x01\x7f\x80\xff",
		"$KV.fleet_sessions.x",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, key string) {
		checkLaneToken(t, key)
	})
}

// FuzzParseLaneToken checks that ParseLaneToken accepts exactly the tokens
// LaneToken produces.
func FuzzParseLaneToken(f *testing.F) {
	for _, seed := range []string{"", "=", "=.=", "agent.main.telegram.dm.12345", "a=3Db", "a=2e", "a=41", "a..b", "==", "a=", "=C3=BC"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		key, err := session.ParseLaneToken(tok)
		if err != nil {
			if !errors.Is(err, session.ErrInvalidLaneToken) {
				t.Fatalf("ParseLaneToken(%q) error %v does not wrap ErrInvalidLaneToken", tok, err)
			}
			return
		}
		if got := session.LaneToken(key); got != tok {
			t.Fatalf("ParseLaneToken(%q) = %q, but LaneToken of that is %q", tok, key, got)
		}
	})
}

func TestLaneTokenOfEverySeedKey(t *testing.T) {
	t.Parallel()
	for _, key := range []string{
		"agent:main:telegram:dm:12345",
		"agent:main:telegram:dm:12345:thread_678",
		"agent:main:signal:dm:user_abc",
		"agent:main:telegram:dm",
		"agent:main:telegram:group:-10012345",
		"agent:main:telegram:group:-10012345:user_abc",
		"agent:main:discord:group:12345:thread_678",
		"agent:main:discord:group:12345:thread_678:user_abc",
		"agent:main:slack:channel:C12345",
	} {
		checkLaneToken(t, key)
		// Keys made of safe segments read the same in the nats CLI.
		if got, want := session.LaneToken(key), strings.ReplaceAll(key, ":", "."); got != want {
			t.Errorf("LaneToken(%q) = %q, want %q", key, got, want)
		}
	}
}
