package session_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/agentfleet/agentfleet/session"
)

// TestSessionKeysOfDifferentIdentitiesDiffer holds the merges of issue 12:
// an id holding ':' must not read as two segments.
func TestSessionKeysOfDifferentIdentitiesDiffer(t *testing.T) {
	t.Parallel()
	opts := session.DefaultKeyOptions()
	for _, pair := range [][2]session.SessionSource{
		{
			{Platform: "http", ChatType: "dm", ChatID: "a:b"},
			{Platform: "http", ChatType: "dm", ChatID: "a", ThreadID: "b"},
		},
		{
			{Platform: "http", ChatType: "group", ChatID: "g", UserID: "u:v"},
			{Platform: "http", ChatType: "group", ChatID: "g:u", UserID: "v"},
		},
		{
			{Platform: "http", ChatType: "group", ChatID: "g", ThreadID: "t:u"},
			{Platform: "http", ChatType: "group", ChatID: "g:t", ThreadID: "u"},
		},
		{
			{Platform: "http", ChatType: "dm", ChatID: "a%3Ab"},
			{Platform: "http", ChatType: "dm", ChatID: "a:b"},
		},
	} {
		k0, k1 := session.BuildSessionKey(pair[0], opts), session.BuildSessionKey(pair[1], opts)
		if k0 == k1 {
			t.Errorf("%+v and %+v share the session key %q", pair[0], pair[1], k0)
		}
	}
}

func TestEscapeKeySegment(t *testing.T) {
	t.Parallel()
	for id, want := range map[string]string{
		"":              "",
		"12345":         "12345",
		"-100123":       "-100123",
		"a@b.c":         "a@b.c",
		"1700000000.12": "1700000000.12",
		"a:b":           "a%3Ab",
		"50%":           "50%25",
		"%3A":           "%253A",
		"::":            "%3A%3A",
	} {
		got := session.EscapeKeySegment(id)
		if got != want {
			t.Errorf("EscapeKeySegment(%q) = %q, want %q", id, got, want)
		}
		back, err := session.UnescapeKeySegment(got)
		if err != nil || back != id {
			t.Errorf("UnescapeKeySegment(%q) = %q, %v; want %q", got, back, err, id)
		}
	}
	for _, bad := range []string{"a:b", "%", "%3", "%3a", "%41", "x%2"} {
		if got, err := session.UnescapeKeySegment(bad); !errors.Is(err, session.ErrInvalidKeySegment) {
			t.Errorf("UnescapeKeySegment(%q) = %q, %v; want ErrInvalidKeySegment", bad, got, err)
		}
	}
}

// keyPart is one identifier of a session key and the role it plays there.
type keyPart struct{ role, id string }

// referenceKeyParts is an independent reading of the key rules
// (seeds/session-lifecycle.md §4): which identifiers, in which roles, a
// source's key carries. WhatsApp is left out (its ids are canonicalized, so
// different spellings of one number rightly share a key).
func referenceKeyParts(src session.SessionSource, opts session.KeyOptions) []keyPart {
	participant := src.UserIDAlt
	if participant == "" {
		participant = src.UserID
	}
	var parts []keyPart
	if src.ChatType == "" || src.ChatType == "dm" {
		switch {
		case src.ChatID != "":
			parts = append(parts, keyPart{"chat", src.ChatID})
		case participant != "":
			parts = append(parts, keyPart{"participant", participant})
		}
		if src.ThreadID != "" {
			parts = append(parts, keyPart{"thread", src.ThreadID})
		}
		return parts
	}
	if src.ChatID != "" {
		parts = append(parts, keyPart{"chat", src.ChatID})
	}
	perUser := opts.GroupSessionsPerUser
	if src.ThreadID != "" {
		parts = append(parts, keyPart{"thread", src.ThreadID})
		perUser = opts.ThreadSessionsPerUser
	}
	if perUser && participant != "" {
		parts = append(parts, keyPart{"participant", participant})
	}
	return parts
}

func roles(parts []keyPart) []string {
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = p.role
	}
	return out
}

func ids(parts []keyPart) []string {
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = p.id
	}
	return out
}

var fuzzPlatforms = []session.Platform{"telegram", "discord", "slack", "signal", "matrix", "http"}
var fuzzChatTypes = []string{"", "dm", "group", "channel", "thread"}

// FuzzSessionKeyInjective builds the keys of two random sources and checks
// that a key is an injective encoding of its identifiers: SplitSessionKey
// gives back exactly the ids the key rules put in (so no id can pass for
// two, or two for one), and two sources whose keys carry ids in the same
// roles share a key only when those ids are equal. (Keys whose roles differ
// can meet by the seed's own design, e.g. a DM keyed by its participant and
// one keyed by a chat id of the same value: see docs/security.md.)
func FuzzSessionKeyInjective(f *testing.F) {
	f.Add(uint8(0), uint8(1), uint8(1), "a:b", "", "", "", "a", "b", "", "")
	f.Add(uint8(5), uint8(2), uint8(1), "g", "", "u:v", "", "g:u", "", "v", "")
	f.Add(uint8(4), uint8(3), uint8(3), "!r:x.org", "t%3A", "@a:x.org", "alt", "!r", "x.org:t:", "a", "")
	f.Add(uint8(2), uint8(4), uint8(0), "C1", "1700.1", "U1", "", "C1", "1700.1", "U2", "")
	f.Fuzz(func(t *testing.T, platform, chatType, optBits uint8, chat1, thread1, user1, alt1, chat2, thread2, user2, alt2 string) {
		opts := session.KeyOptions{GroupSessionsPerUser: optBits&1 != 0, ThreadSessionsPerUser: optBits&2 != 0}
		p := fuzzPlatforms[int(platform)%len(fuzzPlatforms)]
		ct := fuzzChatTypes[int(chatType)%len(fuzzChatTypes)]
		a := session.SessionSource{Platform: p, ChatType: ct, ChatID: chat1, ThreadID: thread1, UserID: user1, UserIDAlt: alt1}
		b := session.SessionSource{Platform: p, ChatType: ct, ChatID: chat2, ThreadID: thread2, UserID: user2, UserIDAlt: alt2}
		if a.Validate() != nil || b.Validate() != nil {
			return // refused at the door: no key is ever built for it
		}
		ka, kb := session.BuildSessionKey(a, opts), session.BuildSessionKey(b, opts)
		pa, pb := referenceKeyParts(a, opts), referenceKeyParts(b, opts)
		for _, c := range []struct {
			key   string
			parts []keyPart
		}{{ka, pa}, {kb, pb}} {
			gotP, gotT, gotIDs, err := session.SplitSessionKey(c.key)
			if err != nil {
				t.Fatalf("SplitSessionKey(%q): %v", c.key, err)
			}
			wantT := ct
			if wantT == "" {
				wantT = "dm"
			}
			if gotP != p || gotT != wantT || !slices.Equal(gotIDs, ids(c.parts)) {
				t.Fatalf("key %q splits into %s, %s, %q; the rules put in %s, %s, %q", c.key, gotP, gotT, gotIDs, p, wantT, ids(c.parts))
			}
			if session.LaneToken(c.key) == "" {
				t.Fatalf("empty lane token for %q", c.key)
			}
		}
		if slices.Equal(roles(pa), roles(pb)) {
			if same, equal := ka == kb, slices.Equal(pa, pb); same != equal {
				t.Fatalf("keys %q and %q: same key %v, same identity %v (%q vs %q)", ka, kb, same, equal, pa, pb)
			}
		}
		// The lane token is injective too (it is the KV key and the subject).
		if (ka == kb) != (session.LaneToken(ka) == session.LaneToken(kb)) {
			t.Fatalf("keys %q and %q, lane tokens %q and %q", ka, kb, session.LaneToken(ka), session.LaneToken(kb))
		}
	})
}
