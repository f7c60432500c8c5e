package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/broker"
)

// TestClientEncodingIsJSONs: the load generator's hand-written body and
// its check of the 202 agree with encoding/json.
func TestClientEncodingIsJSONs(t *testing.T) {
	for _, s := range []string{"", "bench-1", "Bench User 7", `a"b\c`, "<&>", "zoë", "tab\there", "\u2028"} {
		want, _ := json.Marshal(s)
		if got := appendJSONString(nil, s); string(got) != string(want) {
			t.Errorf("appendJSONString(%q) = %s, want %s", s, got, want)
		}
	}
	prefix := []byte(`{"session_key":"agent:main:http:dm:bench-1","seq":`)
	for _, tc := range []struct {
		answer string
		seq    uint64
		ok     bool
	}{
		{`{"session_key":"agent:main:http:dm:bench-1","seq":42,"duplicate":false}` + "\n", 42, true},
		{`{"session_key":"agent:main:http:dm:bench-1","seq":42,"duplicate":true}` + "\n", 0, false},
		{`{"session_key":"agent:main:http:dm:bench-2","seq":42,"duplicate":false}`, 0, false},
		{`{"session_key":"agent:main:http:dm:bench-1","seq":4x2,"duplicate":false}`, 0, false},
		{`{"session_key":"agent:main:http:dm:bench-1","seq":42,"duplicate":false}x`, 0, false},
	} {
		seq, ok := acceptedSeq([]byte(tc.answer), prefix)
		if seq != tc.seq || ok != tc.ok {
			t.Errorf("acceptedSeq(%s) = %d %t, want %d %t", tc.answer, seq, ok, tc.seq, tc.ok)
		}
	}
}

// BenchmarkHTTPClientSender: the load generator's POST and the net/http
// server around a handler that answers the canned 202 (no ingress): what
// the HTTP hop costs the bench process besides the ingress's own work.
func BenchmarkHTTPClientSender(b *testing.B) {
	names := broker.MustNames("fleet")
	ids := []laneID{newLaneID(names, "", 1)}
	answer := fmt.Appendf(nil, `{"session_key":%s,"seq":7,"duplicate":false}`+"\n", mustJSON(ids[0].key))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header()["Content-Type"] = []string{"application/json"}
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write(answer)
	})
	send, closeFn, err := httpSender(Options{ReplyTimeout: time.Minute}, ids, h)
	if err != nil {
		b.Fatal(err)
	}
	defer closeFn()
	n := 0
	b.ReportAllocs()
	for b.Loop() {
		n++
		if _, err := send(b.Context(), 0, n); err != nil {
			b.Fatal(err)
		}
	}
}
