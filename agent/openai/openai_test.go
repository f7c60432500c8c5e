package openai_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/agent/agenttest"
	"github.com/agentfleet/agentfleet/agent/openai"
	"github.com/agentfleet/agentfleet/agent/openai/openaitest"
)

// memTools is one in-memory tool, "lookup", answering from a map.
type memTools struct {
	mu     sync.Mutex
	calls  []string
	closed bool
}

func (m *memTools) List(context.Context) ([]openai.Tool, error) {
	return []openai.Tool{{Name: "lookup", Description: "looks a key up",
		Parameters: map[string]any{"type": "object", "properties": map[string]any{"key": map[string]any{"type": "string"}}}}}, nil
}

func (m *memTools) Call(_ context.Context, name, args string) (string, error) {
	m.mu.Lock()
	m.calls = append(m.calls, name+" "+args)
	m.mu.Unlock()
	if strings.Contains(args, "missing") {
		return "", errors.New("no such key")
	}
	return "the answer is 42", nil
}

func (m *memTools) Close() error { m.mu.Lock(); m.closed = true; m.mu.Unlock(); return nil }

func newBackend(t *testing.T, srv *openaitest.Server, tools openai.Tools) *openai.Backend {
	t.Helper()
	b, err := openai.New(openai.Config{Model: "test-model", BaseURL: srv.URL, APIKey: "sk-test", Tools: tools,
		SystemPrompt: "You are a test assistant.", Prices: map[string]openai.Price{"test-model": {Input: 2, Output: 8, CacheRead: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestConformance(t *testing.T) {
	srv := openaitest.New(t)
	agenttest.Run(t, agenttest.Config{
		NewBackend: func(t *testing.T) agent.Backend { return newBackend(t, srv, &memTools{}) },
		Reply:      "hello world",
		Slow:       "!sleep",
		Fail:       "!fail",
		Tools:      `!tool {"key":"answer"}`,
		Usage:      true,
	})
}

func TestToolLoop(t *testing.T) {
	t.Parallel()
	srv := openaitest.New(t)
	tools := &memTools{}
	b := newBackend(t, srv, tools)
	a, _ := b.NewAgent(t.Context(), "k", "s")
	rec := &agenttest.Recorder{}
	res, err := a.Run(t.Context(), agenttest.NewTurn("agent:main:http:dm:c1", `what is it? !tool {"key":"answer"}`), rec)
	if err != nil {
		t.Fatal(err)
	}
	if res.Text != "tool said: the answer is 42" {
		t.Errorf("reply %q", res.Text)
	}
	var kinds []string
	for _, e := range rec.Events() {
		if len(kinds) > 0 && e.Kind == "delta" && kinds[len(kinds)-1] == "delta" {
			continue // a run of deltas counts once
		}
		kinds = append(kinds, e.Kind)
	}
	// The text before the call streams, then goes out as an interim message;
	// the call is recorded before it runs, its result after; then the answer.
	if got := strings.Join(kinds, ","); got != "delta,usage,message,tool_call,tool_result,delta,usage" {
		t.Errorf("events %s", got)
	}
	ev := rec.Events()
	if ev[2].Text != "Looking it up. " || ev[3].Call.Name != "lookup" || ev[3].Call.Arguments != `{"key":"answer"}` || ev[4].Content != "the answer is 42" {
		t.Errorf("events %+v", ev)
	}
	reqs := srv.Requests()
	if len(reqs) != 2 || len(reqs[0].Tools) != 1 || reqs[0].Tools[0].Function.Name != "lookup" {
		t.Fatalf("requests %+v", reqs)
	}
	// The second request carries the call and its result.
	second := reqs[1].Messages
	n := len(second)
	if n < 2 || second[n-2].Role != "assistant" || len(second[n-2].ToolCalls) != 1 || second[n-1].Role != "tool" ||
		second[n-1].ToolCallID != second[n-2].ToolCalls[0].ID || second[n-1].Text() != "the answer is 42" {
		t.Errorf("second request ends with %+v", second[max(n-2, 0):])
	}
	if reqs[0].Authorization != "Bearer sk-test" {
		t.Errorf("authorization %q", reqs[0].Authorization)
	}
	// A failing tool does not fail the turn: the model is told.
	res, err = a.Run(t.Context(), agenttest.NewTurn("agent:main:http:dm:c1", `!tool {"key":"missing"}`), &agenttest.Recorder{})
	if err != nil || res.Text != "tool said: error: no such key" {
		t.Errorf("after a failing tool: %+v %v", res, err)
	}
	if err := b.Close(); err != nil || !tools.closed {
		t.Errorf("Close: %v, tools closed %v", err, tools.closed)
	}
}

// The system prompt holds the configured prompt, the context prompt and
// the notes; the history goes before the new message.
func TestPromptAndHistory(t *testing.T) {
	t.Parallel()
	srv := openaitest.New(t)
	b := newBackend(t, srv, nil)
	defer b.Close()
	a, _ := b.NewAgent(t.Context(), "k", "s")
	turn := agenttest.NewTurn("agent:main:http:dm:c1", "and now?")
	turn.History = append([]agent.Message{
		// A call whose turn was cut before its result, and a result whose
		// call was rewound: the API refuses both as they are.
		{Role: agent.RoleAssistant, ToolCalls: []agent.ToolCall{{ID: "cut", Name: "lookup", Arguments: "{}"}}},
		{Role: agent.RoleTool, ToolCallID: "orphan", Content: "stray"},
	}, turn.History...)
	if _, err := a.Run(t.Context(), turn, &agenttest.Recorder{}); err != nil {
		t.Fatal(err)
	}
	msgs := srv.Requests()[0].Messages
	var got []string
	for _, m := range msgs {
		got = append(got, m.Role+":"+m.Text())
	}
	sys := msgs[0].Text()
	if msgs[0].Role != "system" || !strings.HasPrefix(sys, "You are a test assistant.") || !strings.Contains(sys, turn.ContextPrompt) ||
		!strings.Contains(sys, turn.Notes[0]) {
		t.Errorf("system prompt %q", sys)
	}
	want := []string{"assistant:", "tool:(no result: the call was interrupted)", "user:earlier question", "assistant:earlier answer", "user:and now?"}
	if strings.Join(got[1:], "|") != strings.Join(want, "|") {
		t.Errorf("messages %q, want %q after the system prompt", got[1:], want)
	}
}

func TestUsageAndCost(t *testing.T) {
	t.Parallel()
	srv := openaitest.New(t)
	b := newBackend(t, srv, nil)
	defer b.Close()
	a, _ := b.NewAgent(t.Context(), "k", "s")
	rec := &agenttest.Recorder{}
	if _, err := a.Run(t.Context(), agenttest.NewTurn("agent:main:http:dm:c1", "hi"), rec); err != nil {
		t.Fatal(err)
	}
	var u agent.Usage
	for _, e := range rec.Events() {
		if e.Kind == "usage" {
			u.Add(e.Usage)
		}
	}
	// 4 messages (system + 3) make 40 prompt tokens, 20 of them cached; 2
	// words out. Cost: (20*2 + 20*1 + 2*8) / 1e6.
	if u.InputTokens != 40 || u.CacheReadTokens != 20 || u.OutputTokens != 2 || u.PromptTokens != 40 ||
		u.CostStatus != agent.CostEstimated || fmt.Sprintf("%.9f", u.EstimatedCostUSD) != "0.000076000" {
		t.Errorf("usage %+v", u)
	}
	// A model without a price: cost unknown.
	b2, _ := openai.New(openai.Config{Model: "other", BaseURL: srv.URL})
	defer b2.Close()
	a2, _ := b2.NewAgent(t.Context(), "k", "s")
	rec2 := &agenttest.Recorder{}
	if _, err := a2.Run(t.Context(), agenttest.NewTurn("k", "hi"), rec2); err != nil {
		t.Fatal(err)
	}
	for _, e := range rec2.Events() {
		if e.Kind == "usage" && (e.Usage.CostStatus != agent.CostUnknown || e.Usage.EstimatedCostUSD != 0) {
			t.Errorf("usage without a price %+v", e.Usage)
		}
	}
}

// 503s are retried within the turn.
func TestRetries(t *testing.T) {
	t.Parallel()
	srv := openaitest.New(t)
	srv.FailFirst(2)
	b := newBackend(t, srv, nil)
	defer b.Close()
	a, _ := b.NewAgent(t.Context(), "k", "s")
	res, err := a.Run(t.Context(), agenttest.NewTurn("k", "persist"), &agenttest.Recorder{})
	if err != nil || res.Text != "echo: persist" || len(srv.Requests()) != 3 {
		t.Fatalf("after two 503s: %+v %v, %d requests", res, err, len(srv.Requests()))
	}
	// Beyond the retries the turn fails.
	srv.FailFirst(100)
	b2, _ := openai.New(openai.Config{Model: "m", BaseURL: srv.URL, MaxRetries: 1})
	defer b2.Close()
	a2, _ := b2.NewAgent(t.Context(), "k", "s")
	before := len(srv.Requests())
	if _, err := a2.Run(t.Context(), agenttest.NewTurn("k", "x"), &agenttest.Recorder{}); err == nil || len(srv.Requests())-before != 2 {
		t.Errorf("error %v after %d requests, want a failure after 2", err, len(srv.Requests())-before)
	}
}

func TestNewNeedsModel(t *testing.T) {
	t.Parallel()
	if _, err := openai.New(openai.Config{}); err == nil {
		t.Error("New without a model accepted")
	}
}
