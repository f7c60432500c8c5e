package ingress_test

import (
	"bufio"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/ingress"
)

// TestScopedTokens: a token scoped to a tenant's key prefixes gets 403 on
// another tenant's lane for POST, the session, replies and events, and
// publishes nothing; its own lanes work; the full token reaches every lane.
func TestScopedTokens(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{token: "admin", scoped: []ingress.ScopedToken{
		{Token: "acme-token", KeyPrefixes: []string{"agent:main:http:dm:acme-", "agent:main:http:group:acme-"}},
		{Token: "globex-token", KeyPrefixes: []string{"agent:main:http:dm:globex-"}},
	}})
	acme := map[string]string{"Authorization": "Bearer acme-token"}
	globex := map[string]string{"Authorization": "Bearer globex-token"}

	// Own lanes: POST, session, replies, events.
	r := b.do(t, http.MethodPost, "/v1/messages", `{"chat_id":"acme-1","text":"hi"}`, acme)
	wantStatus(t, r, http.StatusAccepted)
	r = b.do(t, http.MethodPost, "/v1/messages", `{"chat_id":"acme-2","chat_type":"group","user_id":"u","text":"hi"}`, acme)
	wantStatus(t, r, http.StatusAccepted)
	r = b.do(t, http.MethodPost, "/v1/messages", `{"chat_id":"globex-1","text":"hi"}`, globex)
	wantStatus(t, r, http.StatusAccepted)
	if n := b.inboxCount(t); n != 3 {
		t.Fatalf("inbox holds %d messages, want 3", n)
	}
	const acmeKey, globexKey = "agent:main:http:dm:acme-1", "agent:main:http:dm:globex-1"
	wantStatus(t, b.do(t, http.MethodGet, "/v1/sessions/"+acmeKey+"/replies", "", acme), http.StatusOK)
	if st := eventsStatus(t, b, acmeKey, "acme-token"); st != http.StatusOK {
		t.Fatalf("own events: status %d", st)
	}

	// Another tenant's lane: 403 everywhere, nothing published.
	for _, c := range []struct{ method, path, body string }{
		{http.MethodPost, "/v1/messages", `{"chat_id":"globex-1","text":"forged"}`},
		{http.MethodPost, "/v1/messages", `{"chat_id":"globex-2","chat_type":"group","user_id":"acme-u","text":"x"}`},
		{http.MethodGet, "/v1/sessions/" + globexKey, ""},
		{http.MethodGet, "/v1/sessions/" + globexKey + "/replies", ""},
		{http.MethodGet, "/v1/sessions/" + globexKey + "/replies?wait=1s", ""},
	} {
		r := b.do(t, c.method, c.path, c.body, acme)
		wantError(t, r, http.StatusForbidden, "limited to session keys")
	}
	if st := eventsStatus(t, b, globexKey, "acme-token"); st != http.StatusForbidden {
		t.Fatalf("another tenant's events: status %d, want 403", st)
	}
	wantError(t, b.do(t, http.MethodGet, "/v1/sessions/"+acmeKey+"/replies", "", globex), http.StatusForbidden, "limited")
	if n := b.inboxCount(t); n != 3 {
		t.Fatalf("refused requests published: inbox holds %d messages, want 3", n)
	}

	// The full token reaches every lane; an unknown token is 401.
	wantStatus(t, b.do(t, http.MethodGet, "/v1/sessions/"+globexKey+"/replies", "", nil), http.StatusOK)
	wantStatus(t, b.do(t, http.MethodGet, "/v1/sessions/"+acmeKey+"/replies", "", nil), http.StatusOK)
	wantError(t, b.do(t, http.MethodGet, "/v1/sessions/"+acmeKey+"/replies", "", map[string]string{"Authorization": "Bearer acme"}),
		http.StatusUnauthorized, "invalid bearer token")

	// Scoped tokens alone (no full token) still require authentication.
	only := setup(t, setupOpts{scoped: []ingress.ScopedToken{{Token: "t", KeyPrefixes: []string{"agent:main:http:dm:a"}}}})
	wantError(t, only.do(t, http.MethodPost, "/v1/messages", `{"chat_id":"a1","text":"hi"}`, nil), http.StatusUnauthorized, "missing bearer token")
	wantStatus(t, only.do(t, http.MethodPost, "/v1/messages", `{"chat_id":"a1","text":"hi"}`, map[string]string{"Authorization": "Bearer t"}), http.StatusAccepted)
}

// eventsStatus opens the event stream of key with token and returns its
// status, closing the stream.
func eventsStatus(t *testing.T, b *testBundle, key, token string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.http.URL+"/v1/sessions/"+key+"/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := b.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		// The stream is open: read its first line to be sure it serves.
		if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil && !strings.Contains(err.Error(), "EOF") {
			t.Fatalf("events: %v", err)
		}
	}
	return resp.StatusCode
}

func TestScopedTokensBadConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for name, st := range map[string][]ingress.ScopedToken{
		"empty token":  {{Token: " ", KeyPrefixes: []string{"agent:main:http:dm:a"}}},
		"no prefix":    {{Token: "t"}},
		"bad prefix":   {{Token: "t", KeyPrefixes: []string{"main:http"}}},
		"repeat token": {{Token: "t", KeyPrefixes: []string{"agent:a"}}, {Token: "t", KeyPrefixes: []string{"agent:b"}}},
	} {
		if _, err := ingress.New(b.js, b.res, ingress.Config{Names: b.names, ScopedTokens: st}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestLoadScopedTokens(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	got, err := ingress.LoadScopedTokens(write("ok.json",
		`[{"token":"tok-a","key_prefixes":["agent:main:http:dm:a-","agent:main:http:group:a-"]}]`))
	if err != nil || len(got) != 1 || got[0].Token != "tok-a" || len(got[0].KeyPrefixes) != 2 {
		t.Fatalf("got %+v, %v", got, err)
	}
	for name, body := range map[string]string{
		"unknown field": `[{"token":"tok-b","prefix":"agent:"}]`,
		"no prefix":     `[{"token":"tok-b"}]`,
		"trailing":      `[] []`,
		"not json":      `tok-b`,
	} {
		_, err := ingress.LoadScopedTokens(write(name, body))
		if err == nil {
			t.Errorf("%s: accepted", name)
		} else if strings.Contains(err.Error(), "tok-b") {
			t.Errorf("%s: error shows the token: %v", name, err)
		}
	}
	if _, err := ingress.LoadScopedTokens(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("missing file accepted")
	}
}
