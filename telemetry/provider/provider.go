// Package provider sets up the OpenTelemetry SDK of an agentfleet process:
// for metrics, a Prometheus /metrics handler on a registry of its own and
// an OTLP exporter when the standard OTEL_EXPORTER_OTLP_* variables name an
// endpoint; for traces, an OTLP exporter under the same variables (and
// OTEL_TRACES_EXPORTER, OTEL_TRACES_SAMPLER, OTEL_RESOURCE_ATTRIBUTES).
// With none of them it sets up nothing: its Metrics and Tracer are nil.
package provider

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/telemetry"
)

// Config says what a process exports.
type Config struct {
	// ServiceName is the resource's service.name unless OTEL_SERVICE_NAME
	// sets one, e.g. "agentfleet-worker".
	ServiceName string
	// Version is the resource's service.version.
	Version string
	// Prometheus serves the metrics on Handler.
	Prometheus bool
	// Getenv reads the OTEL_* variables; nil is os.Getenv. The OTLP
	// exporters themselves read the process environment.
	Getenv func(string) string
}

// Provider is a process's metric pipeline.
type Provider struct {
	// Metrics are the fleet's instruments; nil when nothing is exported.
	Metrics *telemetry.Metrics
	// Tracer is the trace pipeline; nil when tracing is off (the default:
	// it is on when OTEL_EXPORTER_OTLP_ENDPOINT or
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set and OTEL_TRACES_EXPORTER
	// is not "none").
	Tracer  trace.TracerProvider
	tp      *sdktrace.TracerProvider
	mp      *sdkmetric.MeterProvider
	handler http.Handler
	otlp    string
	traces  string
}

// New sets up what cfg and the environment ask for. Shutdown releases it.
func New(ctx context.Context, cfg Config) (*Provider, error) {
	getenv := cfg.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	p := &Provider{}
	var opts []sdkmetric.Option
	if cfg.Prometheus {
		reg := prometheus.NewRegistry()
		exp, err := otelprom.New(otelprom.WithRegisterer(reg))
		if err != nil {
			return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
		}
		opts = append(opts, sdkmetric.WithReader(exp))
		p.handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	}
	proto, err := OTLPProtocol(getenv)
	if err != nil {
		return nil, err
	}
	if err := p.startTraces(ctx, cfg, getenv); err != nil {
		return nil, err
	}
	if proto != "" {
		var exp sdkmetric.Exporter
		if proto == "grpc" {
			exp, err = otlpmetricgrpc.New(ctx)
		} else {
			exp, err = otlpmetrichttp.New(ctx)
		}
		if err != nil {
			p.shutdownTraces(ctx)
			return nil, fmt.Errorf("telemetry: otlp %s exporter: %w", proto, err)
		}
		opts = append(opts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)))
		p.otlp = proto
	}
	if len(opts) == 0 {
		return p, nil
	}
	res, err := newResource(ctx, cfg)
	if err != nil {
		p.shutdownTraces(ctx)
		return nil, err
	}
	p.mp = sdkmetric.NewMeterProvider(append(opts, sdkmetric.WithResource(res))...)
	m, err := telemetry.NewMetrics(p.mp)
	if err != nil {
		_ = p.mp.Shutdown(ctx)
		p.shutdownTraces(ctx)
		return nil, err
	}
	p.Metrics = m
	return p, nil
}

// OTLPProtocol returns the OTLP protocol metrics are exported with, "grpc"
// or "http/protobuf", or "" when no OTLP endpoint is configured
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT).
// OTEL_EXPORTER_OTLP_METRICS_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL,
// picks the protocol; the default is http/protobuf.
func OTLPProtocol(getenv func(string) string) (string, error) {
	if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") == "" {
		return "", nil
	}
	proto := getenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
	if proto == "" {
		proto = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch strings.TrimSpace(proto) {
	case "", "http/protobuf":
		return "http/protobuf", nil
	case "grpc":
		return "grpc", nil
	default:
		return "", fmt.Errorf("telemetry: OTEL_EXPORTER_OTLP_PROTOCOL %q is not one of grpc, http/protobuf", proto)
	}
}

// Handler serves the metrics in the Prometheus text format; nil when
// Config.Prometheus was false.
func (p *Provider) Handler() http.Handler { return p.handler }

// OTLP returns the OTLP protocol in use, "" when none.
func (p *Provider) OTLP() string { return p.otlp }

// Shutdown flushes the OTLP exporters (a last export) and stops the
// pipelines.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	var errs []error
	if p.tp != nil {
		if err := p.tp.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("telemetry: flush traces: %w", err))
		}
	}
	if p.mp != nil {
		if err := p.mp.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("telemetry: flush metrics: %w", err))
		}
	}
	return errors.Join(errs...)
}

// newResource is the resource of cfg's process: service name and version,
// then OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME over them.
func newResource(ctx context.Context, cfg Config) (*resource.Resource, error) {
	res, err := resource.New(ctx, resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName(cfg.ServiceName), semconv.ServiceVersion(cfg.Version)),
		resource.WithFromEnv())
	if err != nil && res == nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	return res, nil
}

// TracesProtocol returns the OTLP protocol traces are exported with,
// "grpc" or "http/protobuf", or "" when tracing is off: no OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT),
// OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true.
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL,
// picks the protocol; the default is http/protobuf.
func TracesProtocol(getenv func(string) string) (string, error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return "", nil
	}
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "", "otlp":
	case "none":
		return "", nil
	default:
		return "", fmt.Errorf("telemetry: OTEL_TRACES_EXPORTER %q is not one of otlp, none", exp)
	}
	if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return "", nil
	}
	proto := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch strings.TrimSpace(proto) {
	case "", "http/protobuf":
		return "http/protobuf", nil
	case "grpc":
		return "grpc", nil
	default:
		return "", fmt.Errorf("telemetry: OTEL_EXPORTER_OTLP_PROTOCOL %q is not one of grpc, http/protobuf", proto)
	}
}

// startTraces sets up the trace pipeline when the environment asks for
// one: a batching OTLP exporter, the sampler of OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG (the SDK reads them; the default is
// parentbased_always_on) and the process's resource.
func (p *Provider) startTraces(ctx context.Context, cfg Config, getenv func(string) string) error {
	proto, err := TracesProtocol(getenv)
	if err != nil || proto == "" {
		return err
	}
	var exp sdktrace.SpanExporter
	if proto == "grpc" {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return fmt.Errorf("telemetry: otlp %s trace exporter: %w", proto, err)
	}
	res, err := newResource(ctx, cfg)
	if err != nil {
		_ = exp.Shutdown(ctx)
		return err
	}
	p.tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	p.Tracer = p.tp
	p.traces = proto
	return nil
}

func (p *Provider) shutdownTraces(ctx context.Context) {
	if p.tp != nil {
		_ = p.tp.Shutdown(ctx)
	}
}

// Traces returns the OTLP protocol traces are exported with, "" when
// tracing is off.
func (p *Provider) Traces() string { return p.traces }
