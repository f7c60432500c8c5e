package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/telemetry"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

// TestHeaderCarrierKeepsCase: the trace context travels in NATS headers
// under "traceparent" as written; the stock HTTP carrier would have
// written "Traceparent", which a case-sensitive nats.Header lookup misses.
func TestHeaderCarrierKeepsCase(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("t").Start(context.Background(), "s")
	defer span.End()

	h := nats.Header{}
	telemetry.Inject(ctx, h)
	if got := h.Get("traceparent"); got == "" || !strings.Contains(got, span.SpanContext().TraceID().String()) {
		t.Fatalf("header %v: want traceparent with trace %s", h, span.SpanContext().TraceID())
	}
	if sc := telemetry.SpanContextOf(h); !sc.Equal(trace.SpanContextFromContext(ctx).WithRemote(true)) {
		t.Fatalf("extracted %v, want %v", sc, span.SpanContext())
	}
	// The canonicalizing carrier writes another key, lost to nats.Header.
	hh := http.Header{}
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(hh))
	if nh := nats.Header(hh); nh.Get("traceparent") != "" {
		t.Fatalf("http.Header carrier wrote %v; expected the canonical key", hh)
	}
	// Persisted form round trip; no span, no header.
	if sc := telemetry.ParseTraceParent(telemetry.TraceParent(span.SpanContext())); sc.SpanID() != span.SpanContext().SpanID() {
		t.Fatalf("traceparent round trip: %v", sc)
	}
	empty := nats.Header{}
	telemetry.Inject(context.Background(), empty)
	if len(empty) != 0 || telemetry.ParseTraceParent("junk").IsValid() {
		t.Fatalf("untraced context injected %v", empty)
	}
}

// syncBuffer is a log sink for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(s.b.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// process is a tracer provider of its own ("a process") writing into the
// shared recorder.
func process(t *testing.T, rec *tracetest.SpanRecorder, name string) *sdktrace.TracerProvider {
	res, err := resource.New(context.Background(), resource.WithAttributes(attribute.String("service.name", name)))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithResource(res))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp
}

// TestTraceFromRequestToDeliveredReply: the ingress, a worker cut by its
// drain mid-turn and the successor that resumes the turn are separately
// constructed, with a tracer provider each, and talk only through NATS.
// One trace runs from the HTTP request through the inbox publish, the
// deliveries to the workers, both turn attempts (the resumed one linked
// to the interrupted one), the agent runs, the appends, the reply publish
// and the reply's delivery to the mailbox; each turn logs a line with its
// trace id.
func TestTraceFromRequestToDeliveredReply(t *testing.T) {
	srv := natstest.RunServer(t)
	names := broker.MustNames("fleet")
	nc := srv.Connect(t)
	js := natstest.JetStream(t, nc)
	const ttl = 3 * time.Second
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names, LeaseTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()

	// The ingress process: HTTP adapter and reply delivery.
	tpIn := process(t, rec, "agentfleet-ingress")
	inc := srv.Connect(t)
	ijs := natstest.JetStream(t, inc)
	in, err := ingress.New(ijs, res, ingress.Config{Names: names, KeyOptions: session.DefaultKeyOptions(), TracerProvider: tpIn})
	if err != nil {
		t.Fatal(err)
	}
	del := ingress.NewDelivery(ijs, res, names, nil)
	del.SetTracerProvider(tpIn)
	if err := del.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(del.Stop)
	hs := httptest.NewServer(telemetry.HTTPHandler(tpIn, in.Handler()))
	t.Cleanup(hs.Close)
	t.Cleanup(in.Close)

	var logs syncBuffer
	startWorker := func(id string, drain time.Duration) (stop func()) {
		wnc := srv.Connect(t)
		wjs := natstest.JetStream(t, wnc)
		log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		w, err := worker.New(wnc, wjs, res, worker.Config{ID: id, Names: names, Backend: echo.Backend(echo.Options{}),
			LeaseTTL: ttl, LeaseMargin: 500 * time.Millisecond, Linger: 5 * time.Second, DrainTimeout: drain,
			PeekInterval: 100 * time.Millisecond, Logger: log, TracerProvider: process(t, rec, "agentfleet-worker-"+id),
			Reset: session.ResetConfig{Default: session.ResetPolicy{Mode: session.ResetNone}}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		var once sync.Once
		stop = func() {
			once.Do(func() {
				cancel()
				select {
				case err := <-done:
					if err != nil {
						t.Errorf("worker %s: %v", id, err)
					}
				case <-time.After(60 * time.Second):
					t.Errorf("worker %s did not stop", id)
				}
			})
		}
		t.Cleanup(stop)
		return stop
	}

	stopCut := startWorker("cut", 300*time.Millisecond)
	body, _ := json.Marshal(map[string]string{"chat_id": "traced", "text": "hello\n!sleep 6s"})
	resp, err := hs.Client().Post(hs.URL+"/v1/messages", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var acc struct {
		SessionKey string `json:"session_key"`
	}
	if resp.StatusCode != http.StatusAccepted || json.Unmarshal(data, &acc) != nil {
		t.Fatalf("POST: %d %s", resp.StatusCode, data)
	}

	// The first attempt's agent runs; then its worker drains and gives up.
	natstest.WaitFor(t, 60*time.Second, "the first attempt's agent run", func() error {
		for _, s := range rec.Started() {
			if s.Name() == "agent run" {
				return nil
			}
		}
		return fmt.Errorf("no agent run yet")
	})
	stopCut()
	startWorker("successor", 2*time.Second)

	natstest.WaitFor(t, 90*time.Second, "the resumed turn's reply", func() error {
		resp, err := hs.Client().Get(fmt.Sprintf("%s/v1/sessions/%s/replies?after=0&wait=2s", hs.URL, acc.SessionKey))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var r struct {
			Replies []struct {
				Kind, Text string
			} `json:"replies"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			return err
		}
		for _, rp := range r.Replies {
			if rp.Kind == session.ReplyKindReply && strings.HasPrefix(rp.Text, "echo: hello") {
				return nil
			}
		}
		return fmt.Errorf("replies %+v", r.Replies)
	})

	// The spans are ended shortly after the reply is in the mailbox (the
	// delivery's span ends with its ack, the turn's with its commit).
	var spans []sdktrace.ReadOnlySpan
	var httpSpan, publish sdktrace.ReadOnlySpan
	var turns []sdktrace.ReadOnlySpan
	natstest.WaitFor(t, 60*time.Second, "the trace's spans", func() error {
		spans = rec.Ended()
		httpSpan, publish, turns = nil, nil, nil
		for _, s := range spans {
			switch {
			case s.Name() == "POST /v1/messages" && s.SpanKind() == trace.SpanKindServer:
				httpSpan = s
			case s.Name() == "inbox publish":
				publish = s
			case s.Name() == "turn":
				turns = append(turns, s)
			}
		}
		if httpSpan == nil || publish == nil {
			return fmt.Errorf("no request or publish span among %d", len(spans))
		}
		// Every reply publish of the trace (the cut attempt's notices, the
		// resumed attempt's reply) has an ended delivery under it: the
		// first delivery to end is not necessarily the reply's.
		undelivered := map[trace.SpanID]bool{}
		for _, s := range spans {
			if s.Name() == "reply publish" && s.SpanContext().TraceID() == httpSpan.SpanContext().TraceID() {
				undelivered[s.SpanContext().SpanID()] = true
			}
		}
		for _, s := range spans {
			if s.Name() == "reply delivery" {
				delete(undelivered, s.Parent().SpanID())
			}
		}
		if len(turns) < 2 || len(undelivered) > 0 {
			return fmt.Errorf("%d turn spans, %d reply publishes with no ended delivery", len(turns), len(undelivered))
		}
		return nil
	})

	traceID := httpSpan.SpanContext().TraceID()
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byID[s.SpanContext().SpanID()] = s
	}
	service := func(s sdktrace.ReadOnlySpan) string {
		v, _ := s.Resource().Set().Value("service.name")
		return v.AsString()
	}
	attr := func(s sdktrace.ReadOnlySpan, key attribute.Key) attribute.Value {
		for _, kv := range s.Attributes() {
			if kv.Key == key {
				return kv.Value
			}
		}
		return attribute.Value{}
	}
	if publish.Parent().SpanID() != httpSpan.SpanContext().SpanID() || publish.SpanContext().TraceID() != traceID {
		t.Fatalf("inbox publish: parent %v, want the request's span %v", publish.Parent().SpanID(), httpSpan.SpanContext().SpanID())
	}
	// Every delivery of the message to a worker: a child of the publish,
	// linked to it, with its delivery count.
	var deliveries int
	for _, s := range spans {
		if s.Name() != "inbox delivery" {
			continue
		}
		deliveries++
		if s.Parent().SpanID() != publish.SpanContext().SpanID() || len(s.Links()) != 1 ||
			s.Links()[0].SpanContext.SpanID() != publish.SpanContext().SpanID() {
			t.Errorf("inbox delivery %v: parent %v links %v, want the publish", s.SpanContext().SpanID(), s.Parent().SpanID(), s.Links())
		}
		if n := attr(s, telemetry.AttrDeliveryCount).AsInt64(); n < 1 {
			t.Errorf("inbox delivery: delivery count %d", n)
		}
	}
	if deliveries == 0 {
		t.Error("no inbox delivery span")
	}

	// Two attempts of one turn, on two workers, both in the request's trace.
	var cut, resumed sdktrace.ReadOnlySpan
	for _, s := range turns {
		if s.SpanContext().TraceID() != traceID || s.Parent().SpanID() != publish.SpanContext().SpanID() {
			t.Errorf("turn span on %s: trace %v parent %v, want a child of the publish", service(s), s.SpanContext().TraceID(), s.Parent().SpanID())
		}
		switch service(s) {
		case "agentfleet-worker-cut":
			cut = s
		case "agentfleet-worker-successor":
			resumed = s
		}
	}
	if cut == nil || resumed == nil {
		t.Fatalf("turn spans by service: cut %v resumed %v", cut != nil, resumed != nil)
	}
	if !attr(resumed, telemetry.AttrResumed).AsBool() || attr(resumed, telemetry.AttrTurnAttempt).AsInt64() != 2 ||
		attr(resumed, telemetry.AttrTurnID).AsString() != attr(cut, telemetry.AttrTurnID).AsString() {
		t.Errorf("resumed turn attributes %v; cut %v", resumed.Attributes(), cut.Attributes())
	}
	linked := false
	for _, l := range resumed.Links() {
		if l.SpanContext.SpanID() == cut.SpanContext().SpanID() {
			linked = true
		}
	}
	if !linked {
		t.Errorf("resumed turn links %v, want the interrupted attempt %v", resumed.Links(), cut.SpanContext().SpanID())
	}
	if attr(cut, telemetry.AttrTurnStatus).AsString() != "" {
		t.Errorf("cut attempt status %q, want none (not committed)", attr(cut, telemetry.AttrTurnStatus).AsString())
	}
	if got := attr(resumed, telemetry.AttrTurnStatus).AsString(); got != worker.StatusCompleted {
		t.Errorf("resumed attempt status %q", got)
	}

	// Under the resumed turn: its agent run, appends and the reply
	// publish; under the publish, the reply's delivery (in the ingress).
	children := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		if p, ok := byID[s.Parent().SpanID()]; ok && s.Parent().IsValid() {
			children[p.Name()+"/"+s.Name()] = append(children[p.Name()+"/"+s.Name()], s)
		}
	}
	for _, pair := range []string{"turn/agent run", "turn/transcript append", "turn/reply publish", "reply publish/reply delivery", "reply delivery/mailbox put"} {
		if len(children[pair]) == 0 {
			t.Errorf("no %s span pair in the trace", pair)
		}
	}
	var replyDelivered bool
	for _, s := range children["reply publish/reply delivery"] {
		if s.SpanContext().TraceID() == traceID && service(s) == "agentfleet-ingress" && byID[s.Parent().SpanID()].Parent().SpanID() == resumed.SpanContext().SpanID() {
			replyDelivered = true
		}
	}
	if !replyDelivered {
		t.Error("the resumed turn's reply delivery is not in the request's trace")
	}

	// The turn's log line carries its lane, session, turn and trace ids.
	var turnLines int
	for _, l := range logs.lines() {
		if l["msg"] != "turn ended" {
			continue
		}
		turnLines++
		if l[telemetry.TraceIDKey] != traceID.String() || l[telemetry.TurnIDKey] != attr(resumed, telemetry.AttrTurnID).AsString() ||
			l[telemetry.LaneKey] == nil || l[telemetry.SessionIDKey] == nil {
			t.Errorf("turn log line %v: want trace %s and the turn's ids", l, traceID)
		}
	}
	if turnLines == 0 {
		t.Error("no turn log line")
	}
	// Every line logged about the turn (those naming its turn id: the cut
	// attempt's, the recovery's, the resumed attempt's) carries the lane,
	// the session id and the request's trace id.
	inTurn := map[string]int{}
	for _, l := range logs.lines() {
		if l[telemetry.TurnIDKey] == nil {
			continue
		}
		inTurn[fmt.Sprint(l["msg"])]++
		if l[telemetry.TraceIDKey] != traceID.String() || l[telemetry.LaneKey] == nil || l[telemetry.SessionIDKey] == nil ||
			l[telemetry.TurnIDKey] != attr(resumed, telemetry.AttrTurnID).AsString() {
			t.Errorf("log line of the turn %v: want its lane, session id, turn id and trace %s", l, traceID)
		}
	}
	// The cut attempt's end, the recovery's decision and the resumed
	// attempt's end.
	for _, msg := range []string{"turn abandoned", "resuming interrupted turn", "turn ended"} {
		if inTurn[msg] == 0 {
			t.Errorf("log lines of the turn %v: no %q line", inTurn, msg)
		}
	}
}
