package openai_test

import (
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/agentfleet/agentfleet/agent/agenttest"
	"github.com/agentfleet/agentfleet/agent/openai/openaitest"
)

// TestSpansPerRequestAndTool: a turn run under a traced context gets a
// span per model request and per tool call, children of the caller's span,
// with the GenAI attributes (model, usage, tool name).
func TestSpansPerRequestAndTool(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	ctx, parent := tp.Tracer("test").Start(t.Context(), "agent run")

	srv := openaitest.New(t)
	b := newBackend(t, srv, &memTools{})
	a, _ := b.NewAgent(ctx, "k", "s")
	if _, err := a.Run(ctx, agenttest.NewTurn("agent:main:http:dm:c1", `what is it? !tool {"key":"answer"}`), &agenttest.Recorder{}); err != nil {
		t.Fatal(err)
	}
	parent.End()
	var chats, tools int
	for _, s := range rec.Ended() {
		if s.Name() == "agent run" {
			continue
		}
		if s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("span %s: parent %v, want the caller's", s.Name(), s.Parent().SpanID())
		}
		attrs := map[string]string{}
		for _, kv := range s.Attributes() {
			attrs[string(kv.Key)] = kv.Value.Emit()
		}
		switch s.Name() {
		case "chat test-model":
			chats++
			if attrs["gen_ai.request.model"] != "test-model" || attrs["gen_ai.usage.output_tokens"] == "" {
				t.Errorf("chat span attributes %v", attrs)
			}
		case "execute_tool lookup":
			tools++
			if attrs["gen_ai.tool.name"] != "lookup" || attrs["gen_ai.tool.call.id"] == "" {
				t.Errorf("tool span attributes %v", attrs)
			}
		default:
			t.Errorf("unexpected span %s", s.Name())
		}
	}
	if chats != 2 || tools != 1 {
		t.Errorf("%d chat spans and %d tool spans, want 2 and 1", chats, tools)
	}
}
