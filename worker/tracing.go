package worker

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/telemetry"
)

// The trace of a lane's work. The ingress puts the trace context of each
// message's publish into its inbox headers; the worker continues it:
//   - "inbox delivery", a span per JetStream delivery of an inbox message,
//     with its delivery count, a child of and linked to the publish;
//   - "turn", a child of the first message's publish (linked to the other
//     messages' publishes; linked to the interrupted attempt's turn span
//     when it resumes one), whose traceparent the intent records;
//   - "agent run", "transcript append" and "reply publish" under the turn;
//     the reply carries the trace context on to the delivery.
// With no TracerProvider (w.tracer nil) no span is made: a turn keeps
// its acceptance time (the reply latency metric) and its log attributes.

// turnTrace is the trace of the turn a lane runs.
type turnTrace struct {
	ctx      context.Context // holds the turn's span
	span     trace.Span      // nil when tracing is off
	accepted time.Time       // the ingress's acceptance of the first message
	status   string          // the turn_end status, "" until committed
}

// traceDelivery records the span of one delivery of an inbox message.
func (w *Worker) traceDelivery(msg jetstream.Msg, laneTok string) {
	if w.tracer == nil {
		return
	}
	h := msg.Headers()
	sc := telemetry.SpanContextOf(h)
	if !sc.IsValid() {
		// A message nobody traced starts no trace here either: the turn's
		// span is the root of the worker's part.
		return
	}
	var count uint64
	if md, err := msg.Metadata(); err == nil {
		count = md.NumDelivered
	}
	_, span := w.tracer.Start(trace.ContextWithRemoteSpanContext(context.Background(), sc), "inbox delivery",
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(telemetry.LinkTo(sc, attribute.String("agentfleet.link", "ingress"))...),
		trace.WithAttributes(telemetry.AttrLane.String(laneTok), telemetry.AttrDeliveryCount.Int64(int64(count)),
			attribute.String("agentfleet.worker", w.owner)))
	span.End()
}

// startTurnTrace starts the span of a turn of msgs, unless one runs; prev
// is the traceparent of the attempt it resumes, if any.
func (l *lane) startTurnTrace(msgs []inboxMsg, prev string) bool {
	if l.tt.Load() != nil {
		return false
	}
	if l.w.tracer == nil {
		tt := &turnTrace{}
		for _, m := range msgs {
			if !m.body.ReceivedAt.IsZero() {
				tt.accepted = m.body.ReceivedAt
				break
			}
		}
		l.tt.Store(tt)
		return true
	}
	parent := context.Background()
	var links []trace.Link
	var accepted time.Time
	for _, m := range msgs {
		if accepted.IsZero() {
			accepted = m.body.ReceivedAt
		}
		if !m.trace.IsValid() {
			continue
		}
		if !trace.SpanContextFromContext(parent).IsValid() {
			parent = trace.ContextWithRemoteSpanContext(parent, m.trace)
			continue
		}
		links = append(links, trace.Link{SpanContext: m.trace,
			Attributes: []attribute.KeyValue{telemetry.AttrInboxSeq.Int64(int64(m.seq))}})
	}
	resumed := telemetry.ParseTraceParent(prev)
	links = append(links, telemetry.LinkTo(resumed, attribute.String("agentfleet.link", "interrupted_attempt"))...)
	ctx, span := l.w.tracer.Start(parent, "turn", trace.WithLinks(links...),
		trace.WithAttributes(telemetry.AttrLane.String(l.lane), attribute.String("agentfleet.worker", l.w.owner)))
	l.tt.Store(&turnTrace{ctx: ctx, span: span, accepted: accepted})
	return true
}

// traceIntent names the running turn's span and log lines after intent.
func (l *lane) traceIntent(intent *session.TurnIntent, resumed bool) {
	tt := l.tt.Load()
	if tt == nil || tt.span == nil {
		l.logScope.Set(telemetry.TurnAttrs(intent.SessionID, intent.ID, trace.SpanContext{})...)
		return
	}
	sc := tt.span.SpanContext()
	tt.span.SetAttributes(telemetry.AttrSessionID.String(intent.SessionID), telemetry.AttrTurnID.String(intent.ID),
		telemetry.AttrTurnAttempt.Int(intent.Attempt), telemetry.AttrResumed.Bool(resumed),
		attribute.String("agentfleet.turn.kind", intent.Kind))
	l.logScope.Set(telemetry.TurnAttrs(intent.SessionID, intent.ID, sc)...)
}

// turnTraceParent is the traceparent of the running turn's span, "" when
// it is not traced.
func (l *lane) turnTraceParent() string {
	if tt := l.tt.Load(); tt != nil && tt.span != nil {
		return telemetry.TraceParent(tt.span.SpanContext())
	}
	return ""
}

// traceTurnEnd notes the turn_end status of the running turn, and logs
// the turn's end: one line per turn, with the turn's ids and trace id.
func (l *lane) traceTurnEnd(status string) {
	if tt := l.tt.Load(); tt != nil {
		tt.status = status
	}
	attrs := []slog.Attr{slog.String("status", status)}
	if !l.turnStarted.IsZero() {
		attrs = append(attrs, slog.Duration("duration", time.Since(l.turnStarted)))
	}
	l.log.LogAttrs(context.Background(), slog.LevelDebug, "turn ended", attrs...)
}

// endTurnTrace ends the running turn's span: an error when the turn failed
// or was not committed (abandoned to the lane's next owner).
func (l *lane) endTurnTrace() {
	tt := l.tt.Swap(nil)
	l.logScope.Clear()
	if tt == nil || tt.span == nil {
		return
	}
	switch tt.status {
	case "":
		tt.span.SetStatus(codes.Error, "abandoned: not committed")
	case StatusFailed, StatusDeadLetter:
		tt.span.SetStatus(codes.Error, tt.status)
	}
	tt.span.SetAttributes(telemetry.AttrTurnStatus.String(tt.status))
	tt.span.End()
}

// childSpan starts a span under the running turn's span (or a root one
// when none), with ctx's cancellation: the context handed to the agent
// carries it, so a backend's own spans nest under it. end records err.
func (o *owner) childSpan(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, func(error)) {
	if o.w.tracer == nil {
		return ctx, nopEnd
	}
	parent := context.Background()
	if tt := o.tt.Load(); tt != nil && tt.ctx != nil {
		parent = tt.ctx
	}
	_, span := o.w.tracer.Start(parent, name, trace.WithAttributes(attrs...))
	return trace.ContextWithSpan(ctx, span), func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// traceReply starts the span of a reply's publish, puts its context into
// the reply's headers and, for a final reply, records the time from the
// ingress's acceptance of the turn's first message.
func (l *lane) traceReply(h nats.Header, replyID, kind string) func(error) {
	ctx, end := context.Background(), nopEnd
	if l.w.tracer != nil {
		ctx, end = l.childSpan(ctx, "reply publish", telemetry.AttrReplyID.String(replyID),
			attribute.String("agentfleet.reply.kind", kind))
		telemetry.Inject(ctx, h)
	}
	return func(err error) {
		end(err)
		if tt := l.tt.Load(); err == nil && tt != nil && kind == session.ReplyKindReply && !tt.accepted.IsZero() {
			l.w.cfg.Metrics.ReplyLatency(ctx, time.Since(tt.accepted))
		}
	}
}

func nopEnd(error) {}
