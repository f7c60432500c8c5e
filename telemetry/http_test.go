package telemetry_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/telemetry"
)

// TestHTTPHandlerSpans: every request to the ingress address gets a server
// span named after its route (a platform's webhook by its platform), the
// handler's context holds it, a client's traceparent is its parent, and
// probes and scrapes are not traced.
func TestHTTPHandlerSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	var inHandler []trace.SpanContext
	h := telemetry.HTTPHandler(tp, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inHandler = append(inHandler, trace.SpanContextFromContext(r.Context()))
		w.WriteHeader(http.StatusNoContent)
	}))
	do := func(method, path string, hdr map[string]string) {
		req := httptest.NewRequest(method, path, strings.NewReader("{}"))
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	do("POST", "/webhooks/telegram", map[string]string{"traceparent": parent})
	do("POST", "/webhooks/slack", nil)
	do("GET", "/v1/sessions/agent:main:http:dm:c1/replies", nil)
	do("GET", "/healthz", nil)
	do("GET", "/metrics", nil)

	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
		if s.SpanKind() != trace.SpanKindServer {
			t.Errorf("span %s: kind %v", s.Name(), s.SpanKind())
		}
	}
	if got := strings.Join(names, ","); got != "POST /webhooks/telegram,POST /webhooks/slack,GET /v1/sessions" {
		t.Fatalf("spans %s", got)
	}
	first := rec.Ended()[0]
	if first.SpanContext().TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || first.Parent().SpanID().String() != "b7ad6b7169203331" {
		t.Errorf("webhook span %v parent %v: want the client's trace", first.SpanContext(), first.Parent())
	}
	if len(inHandler) != 5 || inHandler[0].SpanID() != first.SpanContext().SpanID() {
		t.Errorf("handler contexts %v: want the request's span", inHandler)
	}
	// Tracing off: the handler is unchanged.
	plain := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	if got := telemetry.HTTPHandler(nil, plain); got == nil {
		t.Fatal("nil handler")
	}
}
