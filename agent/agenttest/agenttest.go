// Package agenttest is the conformance suite every agent backend passes:
// Run drives a backend's agents through the situations a worker puts them
// in (a plain reply, tool calls, a user interrupt, a deadline, a failure,
// a failing or panicking emitter) and checks what the contract in package
// agent requires of each.
//
// A backend is driven by user messages: Config names the message that
// makes the agent under test reply, work slowly, fail or call tools. For
// the echo agent these are its directives; a test of a model backend runs
// a fake model that answers those messages accordingly.
package agenttest

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/session"
)

// Config says how to drive the backend under test.
type Config struct {
	// NewBackend returns a backend ready to use; Run closes it.
	NewBackend func(t *testing.T) agent.Backend
	// Reply is a message the agent answers with a non-empty text.
	Reply string
	// Slow is a message the agent answers by streaming at least one delta
	// and then working for longer than a minute, unless cancelled.
	Slow string
	// Fail is a message the agent answers with an error of its own.
	Fail string
	// Tools is a message that makes the agent call at least one tool before
	// it replies. Empty skips the tool checks.
	Tools string
	// Usage says the agent reports usage for Reply.
	Usage bool
	// Patience bounds how long a prompt reaction may take (a return after
	// a cancellation, a deadline). Defaults to 15s: generous on a loaded
	// machine, still far below "ignores the cancellation".
	Patience time.Duration
}

// Run runs the suite as subtests of t.
func Run(t *testing.T, cfg Config) {
	t.Helper()
	if cfg.NewBackend == nil || cfg.Reply == "" || cfg.Slow == "" || cfg.Fail == "" {
		t.Fatal("agenttest: NewBackend, Reply, Slow and Fail are required")
	}
	if cfg.Patience <= 0 {
		cfg.Patience = 15 * time.Second
	}
	t.Run("Reply", func(t *testing.T) { testReply(t, cfg) })
	t.Run("Tools", func(t *testing.T) {
		if cfg.Tools == "" {
			t.Skip("the backend has no tool scenario")
		}
		testTools(t, cfg)
	})
	t.Run("InterruptKeepsPartial", func(t *testing.T) { testInterrupt(t, cfg) })
	t.Run("Deadline", func(t *testing.T) { testDeadline(t, cfg) })
	t.Run("FailureIsAnError", func(t *testing.T) { testFail(t, cfg) })
	t.Run("EmitterErrorStops", func(t *testing.T) { testEmitterError(t, cfg) })
	t.Run("PanicContained", func(t *testing.T) { testPanic(t, cfg) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, cfg) })
}

// Event is one emitter call a Recorder saw.
type Event struct {
	// Kind is delta, message, tool_call, tool_result or usage.
	Kind    string
	Text    string
	Call    agent.ToolCall
	CallID  string
	Name    string
	Content string
	Usage   agent.Usage
}

// Recorder is an agent.Emitter that records the calls in order. OnEvent,
// if set, runs after each call is recorded and may fail it.
type Recorder struct {
	mu      sync.Mutex
	events  []Event
	OnEvent func(Event) error
}

var _ agent.Emitter = (*Recorder)(nil)

func (r *Recorder) add(ctx context.Context, e Event) error {
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	r.mu.Lock()
	r.events = append(r.events, e)
	on := r.OnEvent
	r.mu.Unlock()
	if on != nil {
		return on(e)
	}
	return nil
}

// Events returns a copy of the recorded calls.
func (r *Recorder) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// Streamed is the concatenation of the deltas.
func (r *Recorder) Streamed() string {
	var b strings.Builder
	for _, e := range r.Events() {
		if e.Kind == "delta" {
			b.WriteString(e.Text)
		}
	}
	return b.String()
}

func (r *Recorder) Delta(ctx context.Context, text string) error {
	return r.add(ctx, Event{Kind: "delta", Text: text})
}
func (r *Recorder) Message(ctx context.Context, text string) error {
	return r.add(ctx, Event{Kind: "message", Text: text})
}
func (r *Recorder) ToolCall(ctx context.Context, c agent.ToolCall) error {
	return r.add(ctx, Event{Kind: "tool_call", Call: c})
}
func (r *Recorder) ToolResult(ctx context.Context, callID, name, content string) error {
	return r.add(ctx, Event{Kind: "tool_result", CallID: callID, Name: name, Content: content})
}
func (r *Recorder) Usage(ctx context.Context, u agent.Usage) error {
	return r.add(ctx, Event{Kind: "usage", Usage: u})
}

var turnSeq sync.Mutex
var turnN int

// NewTurn returns a turn of one user message, with the history a worker
// would give it.
func NewTurn(sessionKey, text string) *agent.Turn {
	turnSeq.Lock()
	turnN++
	n := turnN
	turnSeq.Unlock()
	now := time.Now()
	return &agent.Turn{
		SessionKey: sessionKey, SessionID: "20260101_000000_0000abcd", TurnID: fmt.Sprintf("turn-%d", n), Attempt: 1,
		Source:        session.SessionSource{Platform: session.PlatformHTTP, ChatID: "c1", ChatType: session.ChatDM, UserID: "u1", UserName: "Ada"},
		ContextPrompt: "## Current Session Context\nYou are talking with Ada over HTTP.",
		Notes:         []string{"[System note: a test note.]"},
		History: []agent.Message{
			{Role: agent.RoleUser, Content: "earlier question", SenderName: "Ada", InboxSeq: 1, TurnID: "turn-0", Seq: 3, Timestamp: now},
			{Role: agent.RoleAssistant, Content: "earlier answer", TurnID: "turn-0", Seq: 4, Timestamp: now},
			{Role: agent.RoleUser, Content: text, SenderName: "Ada", InboxSeq: 2, TurnID: fmt.Sprintf("turn-%d", n), Seq: 6, Timestamp: now},
		},
		Messages: []agent.UserMessage{{InboxSeq: 2, Text: text, SenderName: "Ada"}},
	}
}

// outcome is what one Run returned, or its panic.
type outcome struct {
	res      *agent.Result
	err      error
	panicked *agent.PanicError
	took     time.Duration
}

// runTurn runs one turn the way a worker does: on its own goroutine, a
// panic recovered into a *agent.PanicError.
func runTurn(ctx context.Context, a agent.Agent, turn *agent.Turn, emit agent.Emitter) <-chan outcome {
	ch := make(chan outcome, 1)
	start := time.Now()
	go func() {
		var o outcome
		defer func() {
			if p := recover(); p != nil {
				o = outcome{panicked: &agent.PanicError{Value: p, Stack: debug.Stack()}}
			}
			o.took = time.Since(start)
			ch <- o
		}()
		o.res, o.err = a.Run(ctx, turn, emit)
	}()
	return ch
}

func newAgent(t *testing.T, cfg Config, key string) agent.Agent {
	t.Helper()
	b := cfg.NewBackend(t)
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("backend Close: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Patience)
	defer cancel()
	a, err := b.NewAgent(ctx, key, "20260101_000000_0000abcd")
	if err != nil {
		t.Fatalf("NewAgent: %v", err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Errorf("agent Close: %v", err)
		}
	})
	return a
}

// wait waits for an outcome, failing the test after limit.
func wait(t *testing.T, ch <-chan outcome, limit time.Duration, what string) outcome {
	t.Helper()
	select {
	case o := <-ch:
		if o.panicked != nil {
			t.Fatalf("%s: the agent panicked: %v\n%s", what, o.panicked.Value, o.panicked.Stack)
		}
		return o
	case <-time.After(limit):
		t.Fatalf("%s: Run did not return within %v", what, limit)
		return outcome{}
	}
}

// checkOrder checks that tool results answer the call just before them,
// each call once.
func checkOrder(t *testing.T, events []Event) {
	t.Helper()
	seen := map[string]bool{}
	open := ""
	for i, e := range events {
		switch e.Kind {
		case "tool_call":
			if open != "" {
				t.Errorf("event %d: tool call %q while call %q has no result yet", i, e.Call.ID, open)
			}
			if e.Call.ID == "" || e.Call.Name == "" || seen[e.Call.ID] {
				t.Errorf("event %d: tool call %+v without id or name, or repeated", i, e.Call)
			}
			seen[e.Call.ID] = true
			open = e.Call.ID
		case "tool_result":
			if e.CallID != open {
				t.Errorf("event %d: tool result for %q, the open call is %q", i, e.CallID, open)
			}
			open = ""
		}
	}
	if open != "" {
		t.Errorf("tool call %q never got its result", open)
	}
}

func testReply(t *testing.T, cfg Config) {
	t.Parallel()
	a := newAgent(t, cfg, "agent:main:http:dm:reply")
	rec := &Recorder{}
	o := wait(t, runTurn(context.Background(), a, NewTurn("agent:main:http:dm:reply", cfg.Reply), rec), 2*cfg.Patience, "reply")
	if o.err != nil {
		t.Fatalf("Run: %v", o.err)
	}
	if o.res == nil || o.res.Text == "" {
		t.Fatalf("result %+v, want a reply text", o.res)
	}
	if s := rec.Streamed(); s != "" && s != o.res.Text {
		t.Errorf("the deltas make %q, the reply is %q", s, o.res.Text)
	}
	checkOrder(t, rec.Events())
	if cfg.Usage {
		var total agent.Usage
		for _, e := range rec.Events() {
			if e.Kind == "usage" {
				total.Add(e.Usage)
			}
		}
		if total.InputTokens <= 0 && total.OutputTokens <= 0 {
			t.Errorf("no usage reported: %+v", total)
		}
	}
}

func testTools(t *testing.T, cfg Config) {
	t.Parallel()
	a := newAgent(t, cfg, "agent:main:http:dm:tools")
	rec := &Recorder{}
	o := wait(t, runTurn(context.Background(), a, NewTurn("agent:main:http:dm:tools", cfg.Tools), rec), 2*cfg.Patience, "tools")
	if o.err != nil {
		t.Fatalf("Run: %v", o.err)
	}
	events := rec.Events()
	calls := 0
	for _, e := range events {
		if e.Kind == "tool_call" {
			calls++
		}
	}
	if calls == 0 {
		t.Fatalf("no tool call recorded: %+v", events)
	}
	checkOrder(t, events)
	if o.res == nil || o.res.Text == "" {
		t.Errorf("result %+v after the tools, want a reply", o.res)
	}
}

// errInterrupted stands for the worker's interrupt cause.
var errInterrupted = agent.ErrTurnInterrupted

func testInterrupt(t *testing.T, cfg Config) {
	t.Parallel()
	a := newAgent(t, cfg, "agent:main:http:dm:interrupt")
	streaming := make(chan struct{})
	var once sync.Once
	rec := &Recorder{OnEvent: func(e Event) error {
		if e.Kind == "delta" {
			once.Do(func() { close(streaming) })
		}
		return nil
	}}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	ch := runTurn(ctx, a, NewTurn("agent:main:http:dm:interrupt", cfg.Slow), rec)
	select {
	case <-streaming:
	case o := <-ch:
		t.Fatalf("the slow turn ended before it streamed: %+v %v", o.res, o.err)
	case <-time.After(2 * cfg.Patience):
		t.Fatal("the slow turn streamed nothing")
	}
	cancel(errInterrupted)
	o := wait(t, ch, cfg.Patience, "after the interrupt")
	if !errors.Is(o.err, errInterrupted) && !errors.Is(o.err, context.Canceled) {
		t.Errorf("Run returned %v after the interrupt, want the cancellation cause", o.err)
	}
	streamed := rec.Streamed()
	if o.res == nil || o.res.Text == "" || !strings.HasPrefix(streamed, o.res.Text) && !strings.HasPrefix(o.res.Text, streamed) {
		t.Errorf("partial result %+v, want the text streamed so far %q", o.res, streamed)
	}
}

func testDeadline(t *testing.T, cfg Config) {
	t.Parallel()
	a := newAgent(t, cfg, "agent:main:http:dm:deadline")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	o := wait(t, runTurn(ctx, a, NewTurn("agent:main:http:dm:deadline", cfg.Slow), &Recorder{}), 2*time.Second+cfg.Patience, "past the deadline")
	if !errors.Is(o.err, context.DeadlineExceeded) {
		t.Errorf("Run returned %v past its deadline, want context.DeadlineExceeded", o.err)
	}
}

func testFail(t *testing.T, cfg Config) {
	t.Parallel()
	a := newAgent(t, cfg, "agent:main:http:dm:fail")
	o := wait(t, runTurn(context.Background(), a, NewTurn("agent:main:http:dm:fail", cfg.Fail), &Recorder{}), 2*cfg.Patience, "fail")
	if o.err == nil {
		t.Fatalf("Run returned %+v and no error for the failing message", o.res)
	}
	if errors.Is(o.err, context.Canceled) || errors.Is(o.err, context.DeadlineExceeded) {
		t.Errorf("the failure %v reads as a cancellation", o.err)
	}
}

var errStore = errors.New("agenttest: the store refused the entry")

// An emitter error (a lost lease, a store failure) stops the turn: Run
// returns it, and records nothing after it.
func testEmitterError(t *testing.T, cfg Config) {
	t.Parallel()
	a := newAgent(t, cfg, "agent:main:http:dm:emitfail")
	msg := cfg.Tools
	if msg == "" {
		msg = cfg.Slow
	}
	var failed bool
	rec := &Recorder{}
	rec.OnEvent = func(e Event) error {
		if failed {
			t.Errorf("the agent went on after the emitter failed: %+v", e)
		}
		if e.Kind == "tool_call" || e.Kind == "delta" {
			failed = true
			return errStore
		}
		return nil
	}
	o := wait(t, runTurn(context.Background(), a, NewTurn("agent:main:http:dm:emitfail", msg), rec), 2*cfg.Patience, "emitter error")
	if !errors.Is(o.err, errStore) {
		t.Errorf("Run returned %v after the emitter failed, want that error", o.err)
	}
}

// A panic raised in an emitter call reaches the goroutine that called Run,
// where the worker recovers it: an agent must not call its emitter from a
// goroutine of its own, where a panic would end the process.
func testPanic(t *testing.T, cfg Config) {
	t.Parallel()
	a := newAgent(t, cfg, "agent:main:http:dm:panic")
	rec := &Recorder{OnEvent: func(Event) error { panic("agenttest: emitter panic") }}
	select {
	case o := <-runTurn(context.Background(), a, NewTurn("agent:main:http:dm:panic", cfg.Reply), rec):
		if o.panicked == nil && o.err == nil && len(rec.Events()) > 0 {
			t.Errorf("the emitter panicked and Run returned %+v with no error", o.res)
		}
	case <-time.After(2 * cfg.Patience):
		t.Fatal("Run did not return after its emitter panicked")
	}
}

// Agents of several sessions run at once.
func testConcurrent(t *testing.T, cfg Config) {
	t.Parallel()
	const n = 4
	var chans []<-chan outcome
	var recs []*Recorder
	for i := range n {
		key := fmt.Sprintf("agent:main:http:dm:conc%d", i)
		a := newAgent(t, cfg, key)
		rec := &Recorder{}
		recs = append(recs, rec)
		chans = append(chans, runTurn(context.Background(), a, NewTurn(key, cfg.Reply), rec))
	}
	for i, ch := range chans {
		o := wait(t, ch, 2*cfg.Patience, fmt.Sprintf("concurrent turn %d", i))
		if o.err != nil || o.res == nil || o.res.Text == "" {
			t.Errorf("concurrent turn %d: %+v %v", i, o.res, o.err)
		}
		if s := recs[i].Streamed(); s != "" && o.res != nil && s != o.res.Text {
			t.Errorf("concurrent turn %d: deltas %q, reply %q", i, s, o.res.Text)
		}
	}
}
