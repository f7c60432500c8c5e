package ingress

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestDecodeMessageBodyIsStrict: what encoding/json would quietly accept
// and read differently from what the client meant is refused.
func TestDecodeMessageBodyIsStrict(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, body, want string
	}{
		{"duplicate key", `{"chat_id":"a","chat_id":"b","text":"hi"}`, `field "chat_id" appears more than once`},
		{"duplicate key spelled with an escape", `{"chat_id":"a","chat_\u0069d":"b","text":"hi"}`, `appears more than once`},
		{"other letter case", `{"Chat_ID":"a","text":"hi"}`, `field names are case-sensitive`},
		{"other letter case beside the real one", `{"chat_id":"a","CHAT_ID":"b","text":"hi"}`, `case-sensitive`},
		{"invalid UTF-8 in an id", "{\"chat_id\":\"a\xffb\",\"text\":\"hi\"}", "not valid UTF-8 (at byte 13)"},
		{"invalid UTF-8 in the text", "{\"chat_id\":\"a\",\"text\":\"h\xc3\"}", "not valid UTF-8"},
		{"unknown field", `{"chat_id":"a","text":"hi","x":1}`, `unknown field "x"`},
		{"array", `[{"chat_id":"a"}]`, "must be a JSON object, not an array"},
		{"string", `"hi"`, "must be a JSON object, not a string"},
		{"trailing object", `{"chat_id":"a","text":"hi"} {}`, "exactly one JSON object"},
		{"empty", ``, "request body is empty"},
		{"truncated", `{"chat_id":"a"`, "malformed JSON"},
		{"wrong type", `{"chat_id":5,"text":"hi"}`, "chat_id must be a string"},
		{"unknown attachment field", `{"chat_id":"a","attachments":[{"kind":"photo","url":"https://h/a","data":"AAAA"}]}`, `attachments[0]: unknown field "data"`},
		{"attachment field in other case", `{"chat_id":"a","attachments":[{"kind":"photo","URL":"https://h/a"}]}`, `attachments[0]: unknown field "URL": field names are case-sensitive`},
		{"duplicate attachment field", `{"chat_id":"a","attachments":[{"kind":"photo","url":"https://h/a","url":"https://h/b"}]}`, `attachments[0]: field "url" appears more than once`},
		{"attachment not an object", `{"chat_id":"a","attachments":["https://h/a"]}`, `attachments[0]: must be a JSON object, not a string`},
		{"attachments not an array", `{"chat_id":"a","attachments":{"kind":"photo"}}`, `attachments must be an array`},
		{"too many attachments", `{"chat_id":"a","attachments":[` + strings.Repeat(`{"kind":"photo","url":"https://h/a"},`, 20) + `{"kind":"photo","url":"https://h/a"}]}`, `21 items, at most 20`},
		{"unknown quote field", `{"chat_id":"a","text":"x","reply_to":{"message_id":"1","from":"b"}}`, `reply_to: unknown field "from"`},
		{"quote not an object", `{"chat_id":"a","text":"x","reply_to":"1"}`, `reply_to: must be a JSON object, not a string`},
		{"size not a number", `{"chat_id":"a","attachments":[{"kind":"photo","url":"https://h/a","size":"1"}]}`, `attachments.size must be a int64`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req, e := decodeMessageBody([]byte(tc.body))
			if e == nil {
				t.Fatalf("accepted %q as %+v", tc.body, req)
			}
			if e.status != http.StatusBadRequest || !strings.Contains(e.msg, tc.want) {
				t.Fatalf("%d %q, want 400 mentioning %q", e.status, e.msg, tc.want)
			}
		})
	}
	req, e := decodeMessageBody([]byte(" {\"chat_id\":\"a:b\",\"thread_id\":\"\\u00e9\",\"text\":\"hi\"}\n\t "))
	if e != nil {
		t.Fatal(e)
	}
	if req.ChatID != "a:b" || req.ThreadID != "é" || req.Text != "hi" {
		t.Fatalf("decoded %+v", req)
	}
}

// FuzzDecodeMessage: the decoder never panics; whatever it accepts is valid
// UTF-8, one object whose names are exactly the documented ones, each once,
// and decodes to the same request through a plain encoding/json decode.
func FuzzDecodeMessage(f *testing.F) {
	for _, s := range []string{
		`{"chat_id":"c1","text":"hello"}`,
		`{"platform":"http","chat_id":"a:b","chat_type":"group","user_id":"u","user_id_alt":"x","user_name":"A","thread_id":"t","chat_name":"n","message_id":"m","text":"hi"}`,
		`{"chat_id":"a","chat_id":"b","text":"hi"}`,
		`{"Chat_Id":"a","text":"hi"}`,
		"{\"chat_id\":\"\xff\",\"text\":\"hi\"}",
		`{"chat_id":"\ud800","text":"hi"}`,
		`{"chat_id":"a","text":"hi"} x`,
		`{"chat_id":"c","attachments":[{"kind":"photo","url":"https://h/p.jpg","mime_type":"image/jpeg","size":12,"caption":"c"}],"reply_to":{"message_id":"9","text":"t","sender_id":"u","sender_name":"n"}}`,
		`{"chat_id":"c","attachments":[{"kind":"voice","url":"https://h/v","Kind":"x"}]}`,
		`{"chat_id":"c","attachments":null,"reply_to":null,"text":"x"}`,
		`[]`, `null`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, e := decodeMessageBody(body)
		if e != nil {
			if e.status != http.StatusBadRequest || e.msg == "" {
				t.Fatalf("refused with %d %q", e.status, e.msg)
			}
			return
		}
		if !utf8.Valid(body) {
			t.Fatalf("accepted invalid UTF-8 %q", body)
		}
		// Every member name, as the client spelled it, is known and unique.
		dec := json.NewDecoder(bytes.NewReader(body))
		if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
			t.Fatalf("accepted %q, which does not start with an object (%v, %v)", body, tok, err)
		}
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				t.Fatal(err)
			}
			name := tok.(string)
			if !messageFields[name] || seen[name] {
				t.Fatalf("accepted %q with member %q (known %v, seen %v)", body, name, messageFields[name], seen[name])
			}
			seen[name] = true
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := dec.Token(); err != nil {
			t.Fatal(err)
		}
		if _, err := dec.Token(); !errors.Is(err, io.EOF) {
			t.Fatalf("accepted %q with data after the object", body)
		}
		// The nested objects too.
		for _, a := range req.Attachments {
			b, _ := json.Marshal(a)
			if e := checkObjectFields(b, attachmentFields, "a"); e != nil {
				t.Fatalf("accepted an attachment that re-encodes badly: %v", e)
			}
		}
		if e := checkMediaFields(body); e != nil {
			t.Fatalf("accepted %q, whose nested objects are refused: %v", body, e.msg)
		}
		var plain messageRequest
		if err := json.Unmarshal(body, &plain); err != nil || !reflect.DeepEqual(plain, *req) {
			t.Fatalf("accepted %q as %+v; encoding/json reads %+v (%v)", body, *req, plain, err)
		}
	})
}
