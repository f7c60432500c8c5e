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
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
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

// TestOTLPTracesWhenEndpointSet: with an OTLP endpoint the provider sets
// up tracing; a receiver decodes the spans with the process's resource
// (service.name, OTEL_RESOURCE_ATTRIBUTES); OTEL_TRACES_SAMPLER applies,
// and OTEL_TRACES_EXPORTER=none turns tracing off.
func TestOTLPTracesWhenEndpointSet(t *testing.T) {
	var mu sync.Mutex
	spans := map[string]map[string]string{} // span name -> resource attributes
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/v1/metrics" {
			out, _ := proto.Marshal(&colmetric.ExportMetricsServiceResponse{})
			_, _ = w.Write(out)
			return
		}
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
			http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, http.StatusNotFound)
			return
		}
		var req coltrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, rs := range req.GetResourceSpans() {
			attrs := map[string]string{}
			for _, kv := range rs.GetResource().GetAttributes() {
				attrs[kv.GetKey()] = kv.GetValue().GetStringValue()
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					spans[s.GetName()] = attrs
				}
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	defer recv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.URL)
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=test")

	run := func(sampler, exporter, name string) *provider.Provider {
		t.Setenv("OTEL_TRACES_SAMPLER", sampler)
		t.Setenv("OTEL_TRACES_EXPORTER", exporter)
		p, err := provider.New(t.Context(), provider.Config{ServiceName: "agentfleet-test", Version: "1.0.0"})
		if err != nil {
			t.Fatal(err)
		}
		if p.Tracer != nil {
			_, span := telemetry.Tracer(p.Tracer).Start(t.Context(), name)
			span.End()
		}
		if err := p.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := run("always_on", "", "kept"); p.Traces() != "http/protobuf" {
		t.Fatalf("traces protocol %q, want http/protobuf", p.Traces())
	}
	run("always_off", "otlp", "sampled out")
	if p := run("always_on", "none", "not traced"); p.Tracer != nil {
		t.Fatal("OTEL_TRACES_EXPORTER=none: a tracer")
	}
	mu.Lock()
	defer mu.Unlock()
	res, ok := spans["kept"]
	if !ok || res["service.name"] != "agentfleet-test" || res["service.version"] != "1.0.0" || res["deployment.environment.name"] != "test" {
		t.Fatalf("spans %v: want \"kept\" with the process's resource", spans)
	}
	if _, ok := spans["sampled out"]; ok {
		t.Fatal("OTEL_TRACES_SAMPLER=always_off: the span was exported")
	}
}

func TestTracesProtocol(t *testing.T) {
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
		{[]string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:4318"}, "http/protobuf", ""},
		{[]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://x:4317", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"}, "grpc", ""},
		{[]string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:4317", "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"}, "grpc", ""},
		{[]string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:4318", "OTEL_TRACES_EXPORTER", "none"}, "", ""},
		{[]string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:4318", "OTEL_SDK_DISABLED", "true"}, "", ""},
		{[]string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:4318", "OTEL_TRACES_EXPORTER", "zipkin"}, "", "not one of otlp, none"},
		{[]string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:4318", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"}, "", "not one of grpc"},
	} {
		got, err := provider.TracesProtocol(env(tc.env...))
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
}
