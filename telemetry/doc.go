// Package telemetry holds the fleet's OpenTelemetry instruments and its
// NATS micro service registration. It depends on the OTel metric API only:
// the SDK, the Prometheus endpoint and the OTLP exporters are set up by
// telemetry/provider, in the processes that want them.
package telemetry
