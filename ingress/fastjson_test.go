package ingress

import (
	"reflect"
	"testing"
	"unicode/utf8"
)

// flatSeeds are bodies the fast path must read as the strict decoder does,
// or leave to it.
var flatSeeds = []string{
	`{"chat_id":"c1","chat_type":"dm","user_id":"u1","user_name":"Bench User 1","message_id":"7","text":"hello"}`,
	" {\"chat_id\":\"a:b\",\"thread_id\":\"\\u00e9\",\"text\":\"hi\"}\n\t ",
	`{"chat_id":"a","text":"line\nbreak \"quoted\" \/ \ud83d\ude00 \ud800"}`,
	`{}`,
	`{ }`,
	`{"chat_id":"a","chat_id":"b","text":"hi"}`,
	`{"chat_id":"a","chat_\u0069d":"b","text":"hi"}`,
	`{"Chat_ID":"a","text":"hi"}`,
	`{"chat_id":"a","text":"hi","x":1}`,
	`{"chat_id":5,"text":"hi"}`,
	`{"chat_id":null,"text":"hi"}`,
	`{"chat_id":"a","text":"hi"} {}`,
	`{"chat_id":"a","text":"hi"`,
	`{"chat_id":"a","text":"hi",}`,
	`{"chat_id":"a" "text":"hi"}`,
	`{"chat_id":"a\x","text":"hi"}`,
	`{"chat_id":"a\u12","text":"hi"}`,
	"{\"chat_id\":\"a\tb\",\"text\":\"hi\"}",
	`{"chat_id":"a","attachments":[{"kind":"photo","url":"https://h/a"}],"text":"x"}`,
	`{"chat_id":"a","text":"x","reply_to":{"message_id":"1"}}`,
	`{"chat_id":"a","text":"x","reply_to":null}`,
	`[{"chat_id":"a"}]`,
	`"hi"`,
	``,
	`{"chat_id":"é","user_name":"Zoë","text":"日本語"}`,
}

// TestFlatDecodeAgreesWithStrict: whatever the fast path accepts, the
// strict decoder accepts with the same values, and the common bodies do
// take the fast path.
func TestFlatDecodeAgreesWithStrict(t *testing.T) {
	t.Parallel()
	for _, body := range flatSeeds {
		checkFlatAgrees(t, []byte(body))
	}
	for _, body := range []string{flatSeeds[0], flatSeeds[1], flatSeeds[2], `{}`} {
		if _, ok := decodeFlatMessage([]byte(body)); !ok {
			t.Errorf("%q did not take the fast path", body)
		}
	}
}

func FuzzFlatDecodeAgreesWithStrict(f *testing.F) {
	for _, s := range flatSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFlatAgrees(t, body)
	})
}

func checkFlatAgrees(t *testing.T, body []byte) {
	t.Helper()
	if !utf8.Valid(body) {
		return // refused before either decoder runs
	}
	fast, ok := decodeFlatMessage(body)
	if !ok {
		return
	}
	strict, e := decodeStrict(body)
	if e != nil {
		t.Fatalf("fast path accepted %q, the strict decoder refuses it: %s", body, e.msg)
	}
	if !reflect.DeepEqual(fast, strict) {
		t.Fatalf("%q: fast path read %+v, the strict decoder %+v", body, fast, strict)
	}
}

func BenchmarkDecodeMessageBody(b *testing.B) {
	body := []byte(`{"chat_id":"bench-17","chat_type":"dm","user_id":"u17","user_name":"Bench User 17","message_id":"4711","text":"bench ~17#4711~ xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`)
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, e := decodeMessageBody(body); e != nil {
				b.Fatal(e)
			}
		}
	})
	b.Run("strict", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, e := decodeStrict(body); e != nil {
				b.Fatal(e)
			}
		}
	})
}
