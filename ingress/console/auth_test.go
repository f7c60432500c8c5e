package console_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/ingress/console"
)

// TestConsoleNeedsAdminToken: every page and action needs the admin token
// (bearer or the login form's cookie), an action must come from the
// console's own pages, and bad input changes nothing.
func TestConsoleNeedsAdminToken(t *testing.T) {
	f := startFleet(t)
	lane, seq := f.post("auth1", `hello <img src=x onerror="alert(1)">`)
	f.waitCommitted(lane, seq)

	resp, _ := f.get("/console/lanes")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/console/login?next=") {
		t.Fatalf("no token: %s to %q, want a redirect to the login form", resp.Status, resp.Header.Get("Location"))
	}
	if resp, _ := f.get("/console/lanes", "Authorization", "Bearer nope"); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong token: %s", resp.Status)
	}
	resp, body := f.get("/console/lanes", "Authorization", "Bearer "+adminToken)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "agent:main:http:dm:auth1") {
		t.Fatalf("lanes with the token: %s\n%s", resp.Status, body)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
		t.Fatalf("Content-Security-Policy %q", csp)
	}
	// What users typed is text on the operator's page, never markup.
	resp, body = f.get("/console/session/"+lane, "Authorization", "Bearer "+adminToken)
	if resp.StatusCode != http.StatusOK || strings.Contains(body, "<img src=x") || !strings.Contains(body, "hello &lt;img src=x onerror=&#34;alert(1)&#34;&gt;") {
		t.Fatalf("session page: %s\n%s", resp.Status, body)
	}

	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	post := func(path string, form url.Values, hdr ...string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, f.url+path, strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	// The login form sets the cookie only for the right token.
	if r := post("/console/login", url.Values{"token": {"nope"}}, "Origin", f.url); r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("login with a wrong token: %s", r.Status)
	}
	r := post("/console/login", url.Values{"token": {adminToken}, "next": {"//evil.example/x"}}, "Origin", f.url)
	if r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/console/fleet" || len(r.Cookies()) != 1 {
		t.Fatalf("login: %s to %q, cookies %v", r.Status, r.Header.Get("Location"), r.Cookies())
	}
	ck := r.Cookies()[0]
	if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/console" {
		t.Fatalf("cookie %+v", ck)
	}
	if resp, _ := f.get("/console/lanes", "Cookie", ck.Name+"="+ck.Value); resp.StatusCode != http.StatusOK {
		t.Fatalf("lanes with the cookie: %s", resp.Status)
	}

	before, err := f.fl.Res.Inbox.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	stop := url.Values{"op": {"stop"}, "lane": {lane}}
	// From another site's page, with the cookie: refused.
	if r := post("/console/action", stop, "Cookie", ck.Name+"="+ck.Value, "Origin", "http://evil.example"); r.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-site action: %s", r.Status)
	}
	// Without a token: refused.
	if r := post("/console/action", stop, "Origin", f.url); r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("action without a token: %s", r.Status)
	}
	// Bad input: refused.
	for _, bad := range []url.Values{{"op": {"explode"}, "lane": {lane}}, {"op": {"busy"}, "lane": {lane}, "args": {"sideways"}},
		{"op": {"stop"}, "lane": {"not a lane"}}, {"op": {"dlq_replay"}, "seq": {"x"}}} {
		if r := post("/console/action", bad, "Cookie", ck.Name+"="+ck.Value, "Origin", f.url); r.StatusCode != http.StatusBadRequest {
			t.Fatalf("action %v: %s, want 400", bad, r.Status)
		}
	}
	after, err := f.fl.Res.Inbox.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if after.State.LastSeq != before.State.LastSeq {
		t.Fatalf("refused actions published into the inbox: last seq %d, was %d", after.State.LastSeq, before.State.LastSeq)
	}
	// With the token and from the console: queued at the next inbox seq.
	if r := post("/console/action", stop, "Authorization", "Bearer "+adminToken); r.StatusCode != http.StatusOK {
		t.Fatalf("stop with the bearer token: %s", r.Status)
	}
	f.waitEntry(lane, "the /stop to suspend the lane", func(e *consoleEntry) error {
		if !e.Suspended {
			return errNotYet
		}
		return nil
	})

	// The Lanes page filters by state and platform.
	key := "agent:main:http:dm:auth1"
	for _, c := range []struct {
		query string
		shown bool
	}{{"?state=suspended", true}, {"?state=idle", false}, {"?state=running", false}, {"?platform=http&state=suspended", true}, {"?platform=slack", false}} {
		resp, body := f.get("/console/lanes"+c.query, "Authorization", "Bearer "+adminToken)
		if resp.StatusCode != http.StatusOK || strings.Contains(body, key) != c.shown {
			t.Fatalf("lanes%s: %s, shows %s: %v, want %v", c.query, resp.Status, key, strings.Contains(body, key), c.shown)
		}
	}
	for _, q := range []string{"?state=sleeping", "?platform=myspace"} {
		if resp, _ := f.get("/console/lanes"+q, "Authorization", "Bearer "+adminToken); resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("lanes%s: %s, want 400", q, resp.Status)
		}
	}
}

// TestConsoleClosedWithoutToken: a console with no admin token admits
// nobody.
func TestConsoleClosedWithoutToken(t *testing.T) {
	f := startFleet(t)
	c, err := console.New(console.Config{JS: f.js, Names: f.names})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/console/fleet", nil)
	req.Header.Set("Authorization", "Bearer anything")
	c.ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized {
		t.Fatalf("closed console: %d", rec.Code)
	}
	rec = httptest.NewRecorder()
	c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/console/login", nil))
	if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "no admin token") || strings.Contains(rec.Body.String(), `name="token"`) {
		t.Fatalf("login form of a closed console: %d %s", rec.Code, rec.Body.String())
	}
	rec = httptest.NewRecorder()
	req = httptest.NewRequest(http.MethodPost, "/console/login", strings.NewReader("token=anything"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://example.com")
	c.ServeHTTP(rec, req)
	if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "no admin token") {
		t.Fatalf("login to a closed console: %d %s", rec.Code, rec.Body.String())
	}
}
