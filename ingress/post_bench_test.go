package ingress_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// BenchmarkPostMessage runs the POST /v1/messages handler (decode,
// validation, inbox publish and msgids lookup on an embedded server) on
// the bench's body, each message with its own message id; the allocations
// counted include the embedded server's. p50-ns is the median request.
func BenchmarkPostMessage(b *testing.B) {
	ns := natstest.RunServer(b)
	nc := ns.Connect(b)
	js := natstest.JetStream(b, nc)
	names := broker.MustNames("fleet")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := broker.Provision(ctx, js, broker.ProvisionConfig{Names: names})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := ingress.New(js, res, ingress.Config{Names: names, KeyOptions: session.DefaultKeyOptions()})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	h := srv.Handler()
	prefix := []byte(`{"chat_id":"bench-17","chat_type":"dm","user_id":"u17","user_name":"Bench User 17","message_id":"`)
	suffix := []byte(`","text":"bench ~17#4711~ xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`)
	var body []byte
	n := 0
	var took []time.Duration
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		n++
		body = append(strconv.AppendInt(append(body[:0], prefix...), int64(n), 10), suffix...)
		req := httptest.NewRequest(http.MethodPost, "/v1/messages", io.NopCloser(bytes.NewReader(body)))
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusAccepted {
			b.Fatalf("%d %s", w.Code, w.Body)
		}
		took = append(took, time.Since(start))
	}
	// The median is the one-request latency with less of the machine's
	// other load in it than the mean.
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Nanoseconds()), "p50-ns")
}
