package ingress_test

import (
	"net/http"
	"testing"
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
