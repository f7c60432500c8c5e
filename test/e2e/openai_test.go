package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent/openai/openaitest"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
)

// TestOpenAIUp runs `agentfleet up --agent openai` against a local
// chat-completions server (OPENAI_BASE_URL) with a real MCP server process
// for tools: the model's text answers a chat over HTTP, a tool call of the
// model goes to the MCP server and its result back to the model, the
// entry's token counters and cost move, and an interrupt mid-stream keeps
// the partial reply in the transcript.
func TestOpenAIUp(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: multi-process tests are skipped under -short")
	}
	t.Parallel()
	dir := t.TempDir()
	mcpBin := filepath.Join(dir, "mcp-testserver")
	build := exec.Command("go", "build", "-o", mcpBin, "./agent/mcp/internal/testserver")
	build.Dir = repoRoot(t)
	build.Env = withoutEnv(os.Environ(), "GOFLAGS")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the MCP test server: %v\n%s", err, out)
	}
	model := openaitest.New(t)
	model.Tool = "t__echo"
	cfgPath := filepath.Join(dir, "fleet.yaml")
	cfg := fmt.Sprintf(`agent:
  openai:
    model: test-model
    system_prompt: You are the e2e model.
    mcp_servers:
      - name: t
        command: [%q]
    prices:
      test-model: {input: 1000, output: 2000, cache_read: 500}
`, mcpBin)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, natsAddr := freeAddr(t), freeAddr(t)
	up := newProc(t, dir, "up", []string{"AGENTFLEET_SESSION_RESET_MODE=none", "OPENAI_BASE_URL=" + model.URL, "OPENAI_API_KEY=sk-e2e"},
		"--config", cfgPath, "up", "--data", dir+"/data", "--http", addr, "--nats-listen", natsAddr, "--agent", "openai")
	up.start()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c := &cluster{t: t, httpBase: "http://" + addr, hc: &http.Client{Transport: tr, Timeout: 90 * time.Second}, names: broker.MustNames(broker.DefaultPrefix)}
	waitReady(t, c.hc, c.httpBase, up)
	nc, err := nats.Connect("nats://" + natsAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c.nc = nc
	c.js, _ = jetstream.New(nc)
	if c.res, err = broker.Provision(t.Context(), c.js, broker.ProvisionConfig{Names: c.names, LeaseTTL: 15 * time.Second}); err != nil {
		t.Fatal(err)
	}
	c.store = kv.NewStore(c.res, nil)
	if c.tx, err = transcript.New(c.js, c.names, nil); err != nil {
		t.Fatal(err)
	}

	// A chat answered with the model's text; tokens and cost counted.
	a := c.post("oa-1", "hello model", "")
	got := c.waitReplies(a.SessionKey, 1, 60*time.Second)
	if got[0].Text != "echo: hello model" {
		t.Fatalf("reply %+v", got[0])
	}
	waitFor(t, 30*time.Second, "the turn to commit", func() error { return c.committed(a.SessionKey, a.Seq) })
	e := c.mustEntry(a.SessionKey)
	if e.InputTokens <= 0 || e.OutputTokens <= 0 || e.TotalTokens != e.InputTokens+e.OutputTokens || e.EstimatedCostUSD <= 0 ||
		e.CostStatus != "estimated" || e.LastPromptTokens <= 0 || e.CacheReadTokens <= 0 {
		t.Errorf("counters after a turn: in %d out %d total %d cache %d cost %v %q last prompt %d", e.InputTokens, e.OutputTokens,
			e.TotalTokens, e.CacheReadTokens, e.EstimatedCostUSD, e.CostStatus, e.LastPromptTokens)
	}
	reqs := model.Requests()
	if len(reqs) == 0 || reqs[0].Authorization != "Bearer sk-e2e" || !strings.HasPrefix(reqs[0].Messages[0].Text(), "You are the e2e model.") {
		t.Errorf("the model got %+v", reqs)
	}
	before := *e

	// A tool call goes to the MCP server; its result reaches the model.
	a2 := c.post("oa-1", `!tool {"text":"via mcp"}`, "")
	got = c.waitReplies(a.SessionKey, 3, 60*time.Second)
	if got[1].Text != "Looking it up. " && strings.TrimSpace(got[1].Text) != "Looking it up." || got[2].Text != "tool said: echo: via mcp" {
		t.Fatalf("replies %+v, want the interim message, then the model's use of the tool result", got)
	}
	waitFor(t, 30*time.Second, "the tool turn to commit", func() error { return c.committed(a.SessionKey, a2.Seq) })
	entries := c.load(e.SessionID)
	var call, result *transcript.Entry
	for i := range entries {
		if len(entries[i].ToolCalls) == 1 && entries[i].ToolCalls[0].Name == "t__echo" {
			call = &entries[i]
		}
		if entries[i].Role == transcript.RoleTool {
			result = &entries[i]
		}
	}
	if call == nil || result == nil || result.ToolCallID != call.ToolCalls[0].ID || result.Content != "echo: via mcp" || result.Seq < call.Seq {
		t.Errorf("tool entries: call %+v result %+v", call, result)
	}
	if e2 := c.mustEntry(a.SessionKey); e2.InputTokens <= before.InputTokens || e2.EstimatedCostUSD <= before.EstimatedCostUSD {
		t.Errorf("counters did not move with the tool turn: %d → %d tokens, %v → %v", before.InputTokens, e2.InputTokens,
			before.EstimatedCostUSD, e2.EstimatedCostUSD)
	}

	// An interrupt mid-stream keeps the partial reply in the transcript.
	// The interrupt is sent once the model's words reached the fleet (its
	// deltas are on the lane's delta subject).
	deltas := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(c.names.DeltaSubject(session.LaneToken(a.SessionKey)), deltas)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	a3 := c.post("oa-1", "!sleep", "")
	var streamed strings.Builder
	deadline := time.After(60 * time.Second)
	for streamed.String() != "first words" {
		select {
		case m := <-deltas:
			var d session.Delta
			if err := json.Unmarshal(m.Data, &d); err != nil {
				t.Fatal(err)
			}
			if e, _ := c.entry(a.SessionKey); e != nil && e.Turn != nil && e.Turn.LastSeq >= a3.Seq && d.TurnID == e.Turn.ID {
				streamed.WriteString(d.Text)
			}
		case <-deadline:
			t.Fatalf("the slow turn streamed %q", streamed.String())
		}
	}
	a4 := c.post("oa-1", "never mind", "")
	got = c.waitReplies(a.SessionKey, 4, 60*time.Second)
	if got[3].Text != "echo: never mind" {
		t.Fatalf("reply after the interrupt %+v", got[3])
	}
	waitFor(t, 30*time.Second, "the lane to settle", func() error { return c.committed(a.SessionKey, a4.Seq) })
	var partial *transcript.Entry
	for _, en := range c.load(e.SessionID) {
		if en.Role == transcript.RoleAssistant && en.FinishReason == "interrupted" {
			partial = &en
		}
	}
	if partial == nil || partial.Content != "first words" {
		t.Errorf("partial reply %+v, want \"first words\" kept", partial)
	}
	for _, r := range got {
		if strings.Contains(r.Text, "first words") {
			t.Errorf("the partial reply was delivered: %+v", r)
		}
	}
}
