package ingress_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// TestPostIdentitiesNeverShareASession: ids holding ':' and ids a decoder
// would have merged (invalid UTF-8, unpaired surrogates, duplicate or
// re-cased fields) never put two identities into one session.
func TestPostIdentitiesNeverShareASession(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	keys := map[string]string{}
	for _, body := range []string{
		`{"chat_id":"a:b","text":"hi"}`,
		`{"chat_id":"a","thread_id":"b","text":"hi"}`,
		`{"chat_id":"g","chat_type":"group","user_id":"u:v","text":"hi"}`,
		`{"chat_id":"g:u","chat_type":"group","user_id":"v","text":"hi"}`,
	} {
		r := b.post(t, body)
		wantStatus(t, r, http.StatusAccepted)
		key := r.body["session_key"].(string)
		if other, ok := keys[key]; ok {
			t.Fatalf("%s and %s share the session key %q", other, body, key)
		}
		keys[key] = body
	}
	if _, ok := keys["agent:main:http:dm:a%3Ab"]; !ok {
		t.Fatalf("keys %v: chat a:b is not escaped as a%%3Ab", keys)
	}
	before := b.inboxCount(t)
	for body, want := range map[string]string{
		`{"chat_id":"\ud800","text":"hi"}`:               "U+FFFD",
		`{"chat_id":"\udc00","text":"hi"}`:               "U+FFFD",
		"{\"chat_id\":\"\xfe\",\"text\":\"hi\"}":         "not valid UTF-8",
		`{"chat_id":"a","chat_id":"b","text":"hi"}`:      "more than once",
		`{"chat_id":"a","Thread_ID":"b","text":"hi"}`:    "case-sensitive",
		`{"chat_id":"a","text":"hi","TEXT":"/reset"}`:    "case-sensitive",
		`{"chat_id":"a","text":"hi","text":"/new"}`:      "more than once",
		`{"chat_id":"a","user_id":"x\ufffdy","text":""}`: "text is required",
	} {
		wantError(t, b.post(t, body), http.StatusBadRequest, want)
	}
	if after := b.inboxCount(t); after != before {
		t.Fatalf("refused messages were published: inbox %d -> %d", before, after)
	}
}

// TestPostFieldsAreBounded is issue 12's defect 1 at the door: a 535,000
// byte chat_name was accepted (202) and then jammed its lane. Every field
// has a documented bound (docs/http-api.md); a field past it is refused
// with 400 and nothing is published.
func TestPostFieldsAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	long := func(n int) string { return strings.Repeat("n", n) }
	for body, want := range map[string]string{
		`{"chat_id":"pz","chat_name":"` + long(535000) + `","text":"hi"}`: "chat_name: 535000 bytes",
		`{"chat_id":"pz","user_name":"` + long(1025) + `","text":"hi"}`:   "user_name: 1025 bytes",
		`{"chat_id":"` + long(257) + `","text":"hi"}`:                     "chat_id",
		`{"chat_id":"pz","user_id":"` + long(257) + `","text":"hi"}`:      "user_id",
		`{"chat_id":"pz","user_id_alt":"` + long(257) + `","text":"hi"}`:  "user_id_alt",
		`{"chat_id":"pz","thread_id":"` + long(257) + `","text":"hi"}`:    "thread_id",
		`{"chat_id":"pz","message_id":"` + long(257) + `","text":"hi"}`:   "message_id",
		`{"chat_id":"pz","chat_type":"` + long(20) + `","text":"hi"}`:     "chat type",
		`{"chat_id":"pz","platform":"` + long(20) + `","text":"hi"}`:      "platform",
	} {
		wantError(t, b.post(t, body), http.StatusBadRequest, want)
	}
	if n := b.inboxCount(t); n != 0 {
		t.Fatalf("%d messages published", n)
	}
	// At the bounds, accepted.
	r := b.post(t, `{"chat_id":"`+long(256)+`","chat_name":"`+long(1024)+`","user_name":"`+long(1024)+`","text":"hi"}`)
	wantStatus(t, r, http.StatusAccepted)
}

// TestReadersBoundedPerClient: past Config.MaxReadersPerClient open long
// polls and event streams, a client's next reader is answered 429; a
// reader that ends frees its place.
func TestReadersBoundedPerClient(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{maxReaders: 2})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := b.openEvents(t, ctx, "", "")
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	second := b.openEvents(t, ctx2, "", "")
	_ = first
	waitFor(t, "two readers", func() error {
		if n := b.server.Readers(); n != 2 {
			return fmt.Errorf("%d readers", n)
		}
		return nil
	})
	r := b.do(t, http.MethodGet, "/v1/sessions/"+testKey+"/replies?wait=10s", "", nil)
	wantError(t, r, http.StatusTooManyRequests, "too many open reply readers")
	if r.header.Get("Retry-After") == "" {
		t.Fatal("429 without Retry-After")
	}
	cancel2()
	for range second {
	}
	waitFor(t, "one reader", func() error {
		if n := b.server.Readers(); n != 1 {
			return fmt.Errorf("%d readers", n)
		}
		return nil
	})
	wantStatus(t, b.do(t, http.MethodGet, "/v1/sessions/"+testKey+"/replies?wait=10ms", "", nil), http.StatusOK)
}

// TestReadyzFalseWhenStoreFull: /readyz said ready while every POST got
// 503 because the store was full. It now probes whether the store takes a
// write.
func TestReadyzFalseWhenStoreFull(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{serverOpts: func(o *server.Options) { o.JetStreamMaxStore = 4 << 20 }})
	wantStatus(t, b.do(t, http.MethodGet, "/readyz", "", nil), http.StatusOK)
	text := strings.Repeat("x", 200<<10)
	for i := 0; ; i++ {
		r := b.post(t, fmt.Sprintf(`{"chat_id":"fill%d","text":"%s"}`, i, text))
		if r.status == http.StatusServiceUnavailable {
			break
		}
		wantStatus(t, r, http.StatusAccepted)
		if i > 100 {
			t.Fatal("the store never filled")
		}
	}
	waitFor(t, "/readyz to say not ready", func() error {
		r := b.do(t, http.MethodGet, "/readyz", "", nil)
		if r.status != http.StatusServiceUnavailable {
			return fmt.Errorf("status %d %s", r.status, r.raw)
		}
		if !strings.Contains(r.raw, "store does not take writes") {
			t.Fatalf("not ready for another reason: %s", r.raw)
		}
		return nil
	})
}
