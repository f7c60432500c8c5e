package ingress

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
)

func TestPlatformMsgID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		chat, msg, want string
	}{
		{"c1", "m1", "http:c1:m1"},
		{"-100123", "42", "http:-100123:42"},
		{"a:b", "c", "http:a%3Ab:c"},
		{"a", "b:c", "http:a:b%3Ac"},
		{"50%", "x", "http:50%25:x"},
		{"a%3Ab", "c", "http:a%253Ab:c"},
	} {
		if got := platformMsgID(session.PlatformHTTP, tc.chat, tc.msg); got != tc.want {
			t.Errorf("platformMsgID(%q, %q) = %q, want %q", tc.chat, tc.msg, got, tc.want)
		}
	}
}

func TestValidateSessionKey(t *testing.T) {
	t.Parallel()
	for key, ok := range map[string]bool{
		"agent:main:http:dm:c1":                           true,
		"agent:main:telegram:group:-100123:u42":           true,
		"agent:main:whatsapp:dm:a@b.c":                    true,
		"agent:main:http:dm":                              true,
		"agent:main:http:dm:a%3Ab":                        true,
		"agent:main:http:dm:a%3ab":                        false,
		"agent:main:http:dm:50%":                          false,
		"":                                                false,
		"agent:main:http":                                 false,
		"agent::http:dm:c1":                               false,
		"robot:main:http:dm:c1":                           false,
		"agent:main:myspace:dm:c1":                        false,
		"agent:main:http:room:c1":                         false,
		"agent:main:http:dm:..":                           false,
		"agent:main:http:dm:a/b":                          false,
		"agent:main:http:dm:a\\b":                         false,
		"agent:main:http:dm:a\x00":                        false,
		"agent:main:http:dm:\xff":                         false,
		"agent:main:http:dm:" + strings.Repeat("x", 2000): false,
	} {
		if err := validateSessionKey(key); (err == nil) != ok {
			t.Errorf("validateSessionKey(%q) = %v, want ok=%v", key, err, ok)
		}
	}
}

func TestParseWait(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{
		"":      0,
		"0":     0,
		"250ms": 250 * time.Millisecond,
		"30s":   30 * time.Second,
		"30":    30 * time.Second,
		"2m":    MaxWait,
		"3600":  MaxWait,
	} {
		got, e := parseWait(in)
		if e != nil || got != want {
			t.Errorf("parseWait(%q) = %v, %v; want %v", in, got, e, want)
		}
	}
	for _, in := range []string{"-1s", "soon", "1.5", "-3"} {
		if _, e := parseWait(in); e == nil || e.status != http.StatusBadRequest {
			t.Errorf("parseWait(%q) accepted", in)
		}
	}
}

// FuzzBuildInbound: whatever the body, the adapter either rejects it with a
// 4xx or derives an inbox subject that is valid and reversible.
func FuzzBuildInbound(f *testing.F) {
	for _, seed := range []string{
		`{"chat_id":"c1","text":"hi"}`,
		`{"platform":"telegram","chat_id":"-100123","chat_type":"group","user_id":"u42","message_id":"7","text":"/queue x"}`,
		`{"chat_id":"a.b c*>","user_id":"=41","thread_id":"t:1","text":"x"}`,
		`{"chat_id":"../x","text":"x"}`,
		`{"chat_id":"c1","text":"hi","extra":1}`,
		`[1,2]`, ``, `{`,
	} {
		f.Add(seed)
	}
	names := broker.MustNames("fleet")
	s := &Server{cfg: Config{Names: names, KeyOptions: session.DefaultKeyOptions()}, names: names}
	f.Fuzz(func(t *testing.T, body string) {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(body))
		req, e := decodeMessage(w, r, 1<<16)
		if e != nil {
			if e.status < 400 || e.status > 499 || e.msg == "" {
				t.Fatalf("decode error %+v", e)
			}
			return
		}
		m, e := s.buildInbound(req, time.Now())
		if e != nil {
			if e.status != http.StatusBadRequest || e.msg == "" {
				t.Fatalf("build error %+v", e)
			}
			return
		}
		tokens := strings.Split(m.subject, ".")
		if len(tokens) < 4 || tokens[0] != "fleet" || tokens[1] != "in" {
			t.Fatalf("subject %q", m.subject)
		}
		for _, tok := range tokens {
			if tok == "" || strings.ContainsAny(tok, " \t\r\n*>") {
				t.Fatalf("subject %q has an invalid token %q", m.subject, tok)
			}
		}
		key, err := session.ParseLaneToken(m.lane)
		if err != nil || key != m.inbound.SessionKey {
			t.Fatalf("lane %q does not give back key %q: %q %v", m.lane, m.inbound.SessionKey, key, err)
		}
		if strings.TrimSpace(m.inbound.Source.ChatID) == "" || m.msgID == "" {
			t.Fatalf("accepted %+v", m.inbound)
		}
	})
}

// TestTargetAnchor: groups quote the anchor; DMs only when the user's
// newest message is another one.
func TestTargetAnchor(t *testing.T) {
	for _, c := range []struct {
		t      Target
		latest string
		want   string
	}{
		{Target{ReplyTo: "5"}, "", "5"},
		{Target{ReplyTo: "5"}, "5", "5"},
		{Target{ReplyTo: "5", DM: true}, "", ""},
		{Target{ReplyTo: "5", DM: true}, "5", ""},
		{Target{ReplyTo: "5", DM: true}, "6", "5"},
		{Target{DM: true}, "6", ""},
		{Target{}, "", ""},
	} {
		if got := c.t.Anchor(c.latest); got != c.want {
			t.Errorf("%+v.Anchor(%q) = %q, want %q", c.t, c.latest, got, c.want)
		}
	}
}
