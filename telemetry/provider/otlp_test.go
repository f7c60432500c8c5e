package provider_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	colmetric "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/protobuf/proto"

	"github.com/agentfleet/agentfleet/telemetry"
	"github.com/agentfleet/agentfleet/telemetry/provider"
)

// TestOTLPExportWhenEndpointSet: with OTEL_EXPORTER_OTLP_ENDPOINT set the
// metrics are pushed over OTLP/HTTP; a receiver decodes them and finds the
// counter with its value (the last export runs at Shutdown).
func TestOTLPExportWhenEndpointSet(t *testing.T) {
	var mu sync.Mutex
	got := map[string]int64{}
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/metrics" {
			http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, http.StatusNotFound)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var req colmetric.ExportMetricsServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, rm := range req.GetResourceMetrics() {
			for _, sm := range rm.GetScopeMetrics() {
				for _, m := range sm.GetMetrics() {
					for _, dp := range m.GetSum().GetDataPoints() {
						got[m.GetName()] = dp.GetAsInt()
					}
				}
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&colmetric.ExportMetricsServiceResponse{})
		_, _ = w.Write(out)
	}))
	defer recv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")

	p, err := provider.New(t.Context(), provider.Config{ServiceName: "agentfleet-test"})
	if err != nil {
		t.Fatal(err)
	}
	if p.OTLP() != "http/protobuf" || p.Handler() != nil || p.Metrics == nil {
		t.Fatalf("provider: otlp %q, handler %v, metrics %v; want OTLP only", p.OTLP(), p.Handler(), p.Metrics)
	}
	p.Metrics.TurnStarted(t.Context())
	p.Metrics.TurnStarted(t.Context())
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got[telemetry.MetricTurnsStarted] != 2 {
		t.Fatalf("OTLP receiver got %v, want %s = 2", got, telemetry.MetricTurnsStarted)
	}
}

func TestOTLPProtocol(t *testing.T) {
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	for _, tc := range []struct {
		env  []string
		want string
		err  string
	}{
		{nil, "", ""},
		{[]string{"OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"}, "", ""}, // no endpoint: off
		{[]string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:4318"}, "http/protobuf", ""},
		{[]string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:4317", "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"}, "grpc", ""},
		{[]string{"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://x:4317", "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf",
			"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc"}, "grpc", ""},
		{[]string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:4318", "OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"}, "", "not one of grpc, http/protobuf"},
	} {
		got, err := provider.OTLPProtocol(env(tc.env...))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: err %v, want %q", tc.env, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%v: %q, %v; want %q", tc.env, got, err, tc.want)
		}
	}
	// A bad protocol stops the provider before anything is set up.
	if _, err := provider.New(t.Context(), provider.Config{Prometheus: true,
		Getenv: env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:4318", "OTEL_EXPORTER_OTLP_PROTOCOL", "kafka")}); err == nil {
		t.Fatal("provider.New with OTEL_EXPORTER_OTLP_PROTOCOL=kafka: no error")
	}
}
