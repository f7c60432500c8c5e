package mcp_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent/agenttest"
	"github.com/agentfleet/agentfleet/agent/mcp"
	"github.com/agentfleet/agentfleet/agent/openai"
	"github.com/agentfleet/agentfleet/agent/openai/openaitest"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// serverBin is the test MCP server (internal/testserver), built by TestMain.
var serverBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "mcp-testserver-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	serverBin = filepath.Join(dir, "testserver")
	if out, err := exec.Command("go", "build", "-o", serverBin, "./internal/testserver").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build the test MCP server: %v\n%s", err, out)
		os.Exit(2)
	}
	defer os.RemoveAll(dir)
	natstest.VerifyNoLeaks(m, 10*time.Second)
}

func newTools(t *testing.T, timeout time.Duration, servers ...mcp.Server) *mcp.Tools {
	t.Helper()
	tools, err := mcp.New(mcp.Config{Servers: servers, ToolTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tools.Close() })
	return tools
}

func names(t *testing.T, tools *mcp.Tools) []string {
	t.Helper()
	list, err := tools.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, tl := range list {
		out = append(out, tl.Name)
	}
	return out
}

func TestStdioServer(t *testing.T) {
	t.Parallel()
	tools := newTools(t, 2*time.Second, mcp.Server{Name: "t", Command: []string{serverBin}})
	if got := strings.Join(names(t, tools), ","); got != "t__crash,t__echo,t__pid,t__sleep" {
		t.Fatalf("tools %s", got)
	}
	list, _ := tools.List(t.Context())
	for _, tl := range list {
		if tl.Name == "t__echo" && (tl.Parameters["type"] != "object" || tl.Parameters["properties"] == nil) {
			t.Errorf("echo parameters %v", tl.Parameters)
		}
	}
	out, err := tools.Call(t.Context(), "t__echo", `{"text":"hi"}`)
	if err != nil || out != "echo: hi" {
		t.Fatalf("echo: %q %v", out, err)
	}
	// A call that outlives the timeout fails; the server stays usable.
	start := time.Now()
	if _, err := tools.Call(t.Context(), "t__sleep", `{"seconds":60}`); err == nil || !strings.Contains(err.Error(), "did not answer within") {
		t.Errorf("sleep past the timeout: %v", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the timed-out call took %v", d)
	}
	if out, err := tools.Call(t.Context(), "t__echo", `{"text":"still here"}`); err != nil || out != "echo: still here" {
		t.Errorf("after a timeout: %q %v", out, err)
	}
	// Bad arguments and unknown tools are errors for the model, not panics.
	if _, err := tools.Call(t.Context(), "t__echo", `not json`); err == nil {
		t.Error("bad arguments accepted")
	}
	if _, err := tools.Call(t.Context(), "nope__x", `{}`); err == nil {
		t.Error("unknown tool accepted")
	}
}

// A server process that dies is started again on next use.
func TestDeadServerRestarted(t *testing.T) {
	t.Parallel()
	tools := newTools(t, 10*time.Second, mcp.Server{Name: "t", Command: []string{serverBin}})
	names(t, tools)
	pid1, err := tools.Call(t.Context(), "t__pid", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tools.Call(t.Context(), "t__crash", `{}`); err == nil {
		t.Error("the crashing call succeeded")
	}
	var pid2 string
	natstest.WaitFor(t, 30*time.Second, "the server to answer again", func() error {
		pid2, err = tools.Call(t.Context(), "t__pid", `{}`)
		return err
	})
	if pid2 == pid1 || pid2 == "" {
		t.Errorf("pid %q after the crash, was %q: not a new process", pid2, pid1)
	}
}

// startHTTPServer runs the test server over streamable HTTP.
func startHTTPServer(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(serverBin, "--http", "127.0.0.1:0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
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
	case line := <-lines:
		u, ok := strings.CutPrefix(line, "listening on ")
		if !ok {
			t.Fatalf("server said %q", line)
		}
		return u
	case <-time.After(30 * time.Second):
		t.Fatal("the HTTP MCP server did not start")
		return ""
	}
}

func TestHTTPServer(t *testing.T) {
	t.Parallel()
	url := startHTTPServer(t)
	tools := newTools(t, 5*time.Second, mcp.Server{Name: "web", URL: url, Headers: map[string]string{"X-Test": "1"}})
	if got := strings.Join(names(t, tools), ","); got != "web__crash,web__echo,web__pid,web__sleep" {
		t.Fatalf("tools %s", got)
	}
	if out, err := tools.Call(t.Context(), "web__echo", `{"text":"over http"}`); err != nil || out != "echo: over http" {
		t.Fatalf("echo: %q %v", out, err)
	}
}

// The openai backend calls an MCP tool for the model and hands the result
// back to it.
func TestOpenAIWithMCPTools(t *testing.T) {
	t.Parallel()
	srv := openaitest.New(t)
	srv.Tool = "t__echo"
	tools := newTools(t, 10*time.Second, mcp.Server{Name: "t", Command: []string{serverBin}})
	b, err := openai.New(openai.Config{Model: "m", BaseURL: srv.URL, Tools: tools})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := b.NewAgent(t.Context(), "k", "s")
	rec := &agenttest.Recorder{}
	res, err := a.Run(t.Context(), agenttest.NewTurn("agent:main:http:dm:c1", `!tool {"text":"from the model"}`), rec)
	if err != nil || res.Text != "tool said: echo: from the model" {
		t.Fatalf("Run: %+v %v", res, err)
	}
	var results []string
	for _, e := range rec.Events() {
		if e.Kind == "tool_result" {
			results = append(results, e.Content)
		}
	}
	if len(results) != 1 || results[0] != "echo: from the model" {
		t.Errorf("tool results %q", results)
	}
	if err := b.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

func TestNewChecksServers(t *testing.T) {
	t.Parallel()
	for _, s := range [][]mcp.Server{
		{{Name: "bad name", Command: []string{"x"}}},
		{{Name: "a", Command: []string{"x"}}, {Name: "a", URL: "http://h"}},
		{{Name: "a"}},
		{{Name: "a", Command: []string{"x"}, URL: "http://h"}},
	} {
		if _, err := mcp.New(mcp.Config{Servers: s}); err == nil {
			t.Errorf("New(%+v) accepted", s)
		}
	}
}
