package telemetry

import (
	"context"
	"log/slog"
	"sync/atomic"

	"go.opentelemetry.io/otel/trace"
)

// The log attribute keys the fleet shares: every component logs an error
// under ErrorKey, and the lines of a turn carry the lane, session, turn
// and trace keys.
const (
	ErrorKey     = "error"
	LaneKey      = "lane"
	SessionIDKey = "session_id"
	TurnIDKey    = "turn_id"
	TraceIDKey   = "trace_id"
	SpanIDKey    = "span_id"
)

// Err is the fleet's error attribute.
func Err(err error) slog.Attr { return slog.Any(ErrorKey, err) }

// TraceAttrs returns the trace_id and span_id attributes of sc (none when
// sc is invalid).
func TraceAttrs(sc trace.SpanContext) []slog.Attr {
	if !sc.IsValid() {
		return nil
	}
	return []slog.Attr{slog.String(TraceIDKey, sc.TraceID().String()), slog.String(SpanIDKey, sc.SpanID().String())}
}

// TurnLogger returns log with the attributes every line of a turn carries:
// lane, session id, turn id and, when sc is valid, trace id and span id.
func TurnLogger(log *slog.Logger, lane, sessionID, turnID string, sc trace.SpanContext) *slog.Logger {
	attrs := []any{slog.String(LaneKey, lane), slog.String(SessionIDKey, sessionID), slog.String(TurnIDKey, turnID)}
	for _, a := range TraceAttrs(sc) {
		attrs = append(attrs, a)
	}
	return log.With(attrs...)
}

// LogHandler wraps h so that a record logged with a context holding a
// valid span (log.InfoContext(ctx, ...), LogAttrs) carries its trace_id and
// span_id, unless the logger already carries them.
func LogHandler(h slog.Handler) slog.Handler { return &logHandler{h: h} }

type logHandler struct {
	h     slog.Handler
	fixed bool // the logger's attributes name a trace already
}

func (l *logHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return l.h.Enabled(ctx, level)
}

func (l *logHandler) Handle(ctx context.Context, r slog.Record) error {
	if !l.fixed && ctx != nil {
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			r = r.Clone()
			r.AddAttrs(TraceAttrs(sc)...)
		}
	}
	return l.h.Handle(ctx, r)
}

func (l *logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	fixed := l.fixed
	for _, a := range attrs {
		if a.Key == TraceIDKey {
			fixed = true
		}
	}
	return &logHandler{h: l.h.WithAttrs(attrs), fixed: fixed}
}

func (l *logHandler) WithGroup(name string) slog.Handler {
	return &logHandler{h: l.h.WithGroup(name), fixed: l.fixed}
}

// LogScope holds attributes that every record of a logger made by Logger
// carries while they are set: a lane's logger carries its running turn's
// session id, turn id and trace id, including the lines other goroutines
// of the lane (the lease renewal) log meanwhile. Safe for concurrent use.
type LogScope struct {
	attrs atomic.Pointer[[]slog.Attr]
}

// Set replaces the scope's attributes.
func (s *LogScope) Set(attrs ...slog.Attr) { s.attrs.Store(&attrs) }

// Clear removes the scope's attributes.
func (s *LogScope) Clear() { s.attrs.Store(nil) }

// Logger returns log whose records carry the scope's attributes.
func (s *LogScope) Logger(log *slog.Logger) *slog.Logger {
	return slog.New(&scopeHandler{h: log.Handler(), s: s})
}

type scopeHandler struct {
	h slog.Handler
	s *LogScope
}

func (h *scopeHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.h.Enabled(ctx, level)
}

func (h *scopeHandler) Handle(ctx context.Context, r slog.Record) error {
	if p := h.s.attrs.Load(); p != nil && len(*p) > 0 {
		r = r.Clone()
		r.AddAttrs(*p...)
	}
	return h.h.Handle(ctx, r)
}

func (h *scopeHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &scopeHandler{h: h.h.WithAttrs(attrs), s: h.s}
}

func (h *scopeHandler) WithGroup(name string) slog.Handler {
	return &scopeHandler{h: h.h.WithGroup(name), s: h.s}
}

// TurnAttrs are the attributes of a turn's log lines: session id, turn id
// and, when sc is valid, trace id and span id (the lane is the lane
// logger's own).
func TurnAttrs(sessionID, turnID string, sc trace.SpanContext) []slog.Attr {
	return append([]slog.Attr{slog.String(SessionIDKey, sessionID), slog.String(TurnIDKey, turnID)}, TraceAttrs(sc)...)
}
