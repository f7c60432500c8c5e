package telemetry

import (
	"context"
	"net/http"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The attribute keys of the fleet's spans.
const (
	// AttrLane is a lane token.
	AttrLane = attribute.Key("agentfleet.lane")
	// AttrSessionKey is a session key.
	AttrSessionKey = attribute.Key("agentfleet.session.key")
	// AttrSessionID is a session id.
	AttrSessionID = attribute.Key("agentfleet.session.id")
	// AttrTurnID is a turn id.
	AttrTurnID = attribute.Key("agentfleet.turn.id")
	// AttrTurnAttempt is the attempt of a turn (above 1 when resumed).
	AttrTurnAttempt = attribute.Key("agentfleet.turn.attempt")
	// AttrResumed marks a turn span that resumes an interrupted attempt.
	AttrResumed = attribute.Key("agentfleet.turn.resumed")
	// AttrDeliveryCount is the JetStream delivery count of the message a
	// span handles (1 on the first delivery).
	AttrDeliveryCount = attribute.Key("agentfleet.delivery.count")
	// AttrInboxSeq is an inbox stream sequence.
	AttrInboxSeq = attribute.Key("agentfleet.inbox.seq")
	// AttrReplyID is a reply id.
	AttrReplyID = attribute.Key("agentfleet.reply.id")
)

// The trace context's header names (W3C Trace Context). NATS headers keep
// their case, so they travel in lower case, as the standard writes them.
const (
	HdrTraceParent = "traceparent"
	HdrTraceState  = "tracestate"
)

// propagator is the fleet's only propagation format: W3C Trace Context.
var propagator = propagation.TraceContext{}

// HeaderCarrier adapts a nats.Header to a propagation.TextMapCarrier
// without changing the case of its keys: nats.Header is a plain map whose
// Get is case-sensitive, so the canonicalizing http.Header carrier would
// write "Traceparent" that a reader looking for "traceparent" misses.
type HeaderCarrier nats.Header

// Get returns the first value of key, or "".
func (c HeaderCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set replaces the values of key with value.
func (c HeaderCarrier) Set(key, value string) { c[key] = []string{value} }

// Keys lists the header's keys.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Inject writes the span context of ctx into h (nothing when ctx has no
// valid span context). h must not be nil.
func Inject(ctx context.Context, h nats.Header) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	propagator.Inject(ctx, HeaderCarrier(h))
}

// Extract returns ctx with the remote span context h carries, if any.
func Extract(ctx context.Context, h nats.Header) context.Context {
	if h == nil || len(h[HdrTraceParent]) == 0 {
		return ctx
	}
	return propagator.Extract(ctx, HeaderCarrier(h))
}

// SpanContextOf returns the span context h carries (invalid when none).
func SpanContextOf(h nats.Header) trace.SpanContext {
	return trace.SpanContextFromContext(Extract(context.Background(), h))
}

// TraceParent returns the W3C traceparent of sc, "" when sc is invalid: the
// form a span context is persisted in (a turn intent, a reply).
func TraceParent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagator.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
	return c[HdrTraceParent]
}

// ParseTraceParent returns the span context of a traceparent written by
// TraceParent; invalid when s is empty or malformed.
func ParseTraceParent(s string) trace.SpanContext {
	s = strings.TrimSpace(s)
	if s == "" {
		return trace.SpanContext{}
	}
	ctx := propagator.Extract(context.Background(), propagation.MapCarrier{HdrTraceParent: s})
	return trace.SpanContextFromContext(ctx)
}

// Tracer returns the fleet's tracer of tp, nil when tp is nil: the
// components skip every span (and the attributes, links and contexts
// around it) when their tracer is nil, so tracing that is off costs a nil
// check.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(ScopeName)
}

// LinkTo returns the link to sc, nil when sc is invalid, for
// trace.WithLinks.
func LinkTo(sc trace.SpanContext, attrs ...attribute.KeyValue) []trace.Link {
	if !sc.IsValid() {
		return nil
	}
	return []trace.Link{{SpanContext: sc, Attributes: attrs}}
}

// HTTPHandler wraps h with a server span per request, named "METHOD
// /route" (/webhooks/<platform>, /v1/<resource>); the trace context of a traceparent header the client sent is
// the span's parent. With tp nil, h is returned unchanged.
func HTTPHandler(tp trace.TracerProvider, h http.Handler) http.Handler {
	if tp == nil {
		return h
	}
	return otelhttp.NewHandler(h, "http",
		otelhttp.WithTracerProvider(tp),
		otelhttp.WithPropagators(propagator),
		otelhttp.WithFilter(func(r *http.Request) bool {
			// Probes and scrapes are not worth a trace each.
			switch r.URL.Path {
			case "/healthz", "/readyz", "/metrics":
				return false
			}
			return true
		}),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
			return r.Method + " " + routeOf(r.URL.Path)
		}))
}

// routeOf bounds a span name's path: /webhooks/<platform> and /v1/<first
// segment>; anything else is its first segment.
func routeOf(path string) string {
	parts := strings.SplitN(strings.TrimPrefix(path, "/"), "/", 3)
	switch {
	case len(parts) >= 2 && (parts[0] == "webhooks" || parts[0] == "v1"):
		return "/" + parts[0] + "/" + parts[1]
	default:
		return "/" + parts[0]
	}
}
