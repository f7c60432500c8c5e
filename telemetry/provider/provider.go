// Package provider sets up the OpenTelemetry metric SDK of an agentfleet
// process: a Prometheus /metrics handler on a registry of its own, and an
// OTLP exporter when the standard OTEL_EXPORTER_OTLP_* variables name an
// endpoint. With neither, it sets up nothing and its Metrics are nil.
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
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

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
	mp      *sdkmetric.MeterProvider
	handler http.Handler
	otlp    string
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
	if proto != "" {
		var exp sdkmetric.Exporter
		if proto == "grpc" {
			exp, err = otlpmetricgrpc.New(ctx)
		} else {
			exp, err = otlpmetrichttp.New(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("telemetry: otlp %s exporter: %w", proto, err)
		}
		opts = append(opts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)))
		p.otlp = proto
	}
	if len(opts) == 0 {
		return p, nil
	}
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName(cfg.ServiceName), semconv.ServiceVersion(cfg.Version)))
	if err != nil && res == nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	p.mp = sdkmetric.NewMeterProvider(append(opts, sdkmetric.WithResource(res))...)
	m, err := telemetry.NewMetrics(p.mp)
	if err != nil {
		_ = p.mp.Shutdown(ctx)
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

// Shutdown flushes the OTLP exporter (a last export) and stops the pipeline.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.mp == nil {
		return nil
	}
	err := p.mp.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("telemetry: flush metrics: %w", err)
	}
	return err
}
