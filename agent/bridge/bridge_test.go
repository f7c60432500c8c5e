package bridge_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/agent/agenttest"
	"github.com/agentfleet/agentfleet/agent/bridge"
	"github.com/agentfleet/agentfleet/agent/echo"
)

// startPythonAgent runs the Python reference agent as a real process on a
// free port and returns its turn URL.
func startPythonAgent(t *testing.T) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed")
	}
	cmd := exec.Command(py, "../../examples/bridge-python/agent.py", "--listen", "127.0.0.1:0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("python agent stderr:\n%s", stderr.String())
		}
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case line, ok := <-lines:
		base, found := strings.CutPrefix(line, "listening on ")
		if !ok || !found {
			t.Fatalf("python agent said %q", line)
		}
		return base + "/turn"
	case <-time.After(30 * time.Second):
		t.Fatal("the python agent did not start")
		return ""
	}
}

func newBackend(t *testing.T, url string) agent.Backend {
	t.Helper()
	b, err := bridge.New(bridge.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The bridge backend against the Python reference agent, a real process.
func TestConformancePython(t *testing.T) {
	url := startPythonAgent(t)
	agenttest.Run(t, agenttest.Config{
		NewBackend: func(t *testing.T) agent.Backend { return newBackend(t, url) },
		Reply:      "hello\nworld",
		Slow:       "first words\n!sleep 120s",
		Fail:       "!fail",
		Tools:      "!tools 3",
		Usage:      true,
	})
}

// The bridge backend against a Go agent served by bridge.Handler.
func TestConformanceGoHandler(t *testing.T) {
	srv := httptest.NewServer(bridge.Handler(echo.New(echo.Options{}), nil))
	t.Cleanup(srv.Close)
	agenttest.Run(t, agenttest.Config{
		NewBackend: func(t *testing.T) agent.Backend { return newBackend(t, srv.URL) },
		Reply:      "hello\nworld",
		Slow:       "first words\n!sleep 120s",
		Fail:       "!fail",
		Tools:      "!tools 3",
		Usage:      true,
	})
}

// The turn request carries what the protocol promises.
func TestRequestAndEvents(t *testing.T) {
	t.Parallel()
	var got bridge.Request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer s3cret" || r.Header.Get("Content-Type") != bridge.RequestContentType {
			http.Error(w, "bad headers", http.StatusUnauthorized)
			return
		}
		if err := jsonDecode(r.Body, &got); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprint(w, `{"type":"delta","text":"hi "}`+"\n\n")
		fmt.Fprint(w, `{"type":"message","text":"one moment"}`+"\n")
		fmt.Fprint(w, `{"type":"tool_call","id":"c1","name":"lookup","arguments":"{\"q\":1}"}`+"\n")
		fmt.Fprint(w, `{"type":"tool_result","id":"c1","name":"lookup","content":"42"}`+"\n")
		fmt.Fprint(w, `{"type":"something_newer","x":1}`+"\n")
		fmt.Fprint(w, `{"type":"usage","input_tokens":10,"output_tokens":2,"estimated_cost_usd":0.01,"cost_status":"estimated","prompt_tokens":10}`+"\n")
		fmt.Fprint(w, `{"type":"final","text":"hi there","finish_reason":"stop"}`+"\n")
	}))
	t.Cleanup(srv.Close)
	b, err := bridge.New(bridge.Config{URL: srv.URL, Token: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a, _ := b.NewAgent(t.Context(), "k", "s")
	turn := agenttest.NewTurn("agent:main:http:dm:c1", "hello")
	rec := &agenttest.Recorder{}
	res, err := a.Run(t.Context(), turn, rec)
	if err != nil || res.Text != "hi there" || res.FinishReason != "stop" {
		t.Fatalf("Run: %+v %v", res, err)
	}
	if got.TurnID != turn.TurnID || got.SessionKey != turn.SessionKey || got.Attempt != 1 || got.ContextPrompt != turn.ContextPrompt ||
		len(got.Notes) != 1 || len(got.History) != 3 || got.History[2].Content != "hello" || len(got.Messages) != 1 || got.Messages[0].Text != "hello" ||
		got.Source.UserName != "Ada" {
		t.Errorf("request %+v", got)
	}
	var kinds []string
	for _, e := range rec.Events() {
		kinds = append(kinds, e.Kind)
	}
	if strings.Join(kinds, ",") != "delta,message,tool_call,tool_result,usage" {
		t.Errorf("events %v", kinds)
	}
	ev := rec.Events()
	if ev[2].Call != (agent.ToolCall{ID: "c1", Name: "lookup", Arguments: `{"q":1}`}) || ev[3].Content != "42" ||
		ev[4].Usage.EstimatedCostUSD != 0.01 || ev[4].Usage.CostStatus != agent.CostEstimated {
		t.Errorf("event details %+v", ev)
	}
}

// Answers that are not a well-formed event stream fail the turn clearly.
func TestBadAnswers(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, body string
		status     int
		want       string
	}{
		{"no final", `{"type":"delta","text":"x"}` + "\n", 200, "without a final"},
		{"error event", `{"type":"error","message":"model down"}` + "\n", 200, "model down"},
		{"bad line", "not json\n", 200, "bad event line"},
		{"tool call without id", `{"type":"tool_call","name":"x"}` + "\n", 200, "without an id"},
		{"refused", "no such agent", 404, "answered 404: no such agent"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(c.status)
				fmt.Fprint(w, c.body)
			}))
			t.Cleanup(srv.Close)
			a, _ := newBackend(t, srv.URL).NewAgent(t.Context(), "k", "s")
			_, err := a.Run(t.Context(), agenttest.NewTurn("k", "hi"), &agenttest.Recorder{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one saying %q", err, c.want)
			}
		})
	}
}

// An agent that is briefly unavailable (503) is tried again within the turn.
func TestRetriesUnavailable(t *testing.T) {
	t.Parallel()
	var tries atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tries.Add(1) < 3 {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, `{"type":"final","text":"up"}`+"\n")
	}))
	t.Cleanup(srv.Close)
	a, _ := newBackend(t, srv.URL).NewAgent(t.Context(), "k", "s")
	res, err := a.Run(t.Context(), agenttest.NewTurn("k", "hi"), &agenttest.Recorder{})
	if err != nil || res.Text != "up" || tries.Load() != 3 {
		t.Fatalf("Run: %+v %v after %d tries", res, err, tries.Load())
	}
	// A client error is not retried.
	var bad atomic.Int32
	srv2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		bad.Add(1)
		http.Error(w, "no", http.StatusBadRequest)
	}))
	t.Cleanup(srv2.Close)
	a2, _ := newBackend(t, srv2.URL).NewAgent(t.Context(), "k", "s")
	_, err = a2.Run(t.Context(), agenttest.NewTurn("k", "hi"), &agenttest.Recorder{})
	var ae *bridge.AgentError
	if !errors.As(err, &ae) || ae.Status != 400 || bad.Load() != 1 {
		t.Errorf("error %v after %d tries, want one 400", err, bad.Load())
	}
}

func TestNewChecksURL(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"", "ftp://x", "not a url", "http://"} {
		if _, err := bridge.New(bridge.Config{URL: u}); err == nil {
			t.Errorf("New(%q) accepted", u)
		}
	}
}
