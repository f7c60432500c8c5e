package ingress_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// logRecorder counts log records by message and, with -v, writes them to
// t.Log (until the test's cleanups are done, so a late record cannot panic).
type logRecorder struct {
	mu     sync.Mutex
	counts map[string]int
	t      *testing.T
	done   bool
}

func (l *logRecorder) logger(t *testing.T) *slog.Logger {
	l.mu.Lock()
	if l.t == nil {
		l.t = t
		t.Cleanup(func() {
			l.mu.Lock()
			l.done = true
			l.mu.Unlock()
		})
	}
	l.mu.Unlock()
	return slog.New(&recordHandler{rec: l})
}

// count returns how many records had msg.
func (l *logRecorder) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts[msg]
}

type recordHandler struct {
	rec   *logRecorder
	attrs []slog.Attr
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	l := h.rec
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.counts == nil {
		l.counts = map[string]int{}
	}
	l.counts[r.Message]++
	if testing.Verbose() && !l.done && l.t != nil {
		var b strings.Builder
		b.WriteString(r.Level.String() + " " + r.Message)
		for _, a := range h.attrs {
			b.WriteString(" " + a.String())
		}
		r.Attrs(func(a slog.Attr) bool {
			b.WriteString(" " + a.String())
			return true
		})
		l.t.Log(b.String())
	}
	return nil
}

func (h *recordHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &recordHandler{rec: h.rec, attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

func (h *recordHandler) WithGroup(string) slog.Handler { return h }
