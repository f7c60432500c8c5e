package agent_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLeaf checks that the agent packages import nothing of the fleet but
// the session domain: a backend must be buildable without NATS, the KV
// store, the broker, the transcript log, the worker or the ingress.
func TestLeaf(t *testing.T) {
	t.Parallel()
	const mod = "github.com/agentfleet/agentfleet/"
	out, err := exec.Command("go", "list", "-deps", "-test=false", "./...").Output()
	if err != nil {
		t.Fatalf("go list -deps ./agent/...: %v", err)
	}
	var checked int
	for _, p := range strings.Fields(string(out)) {
		if !strings.HasPrefix(p, mod) {
			continue
		}
		checked++
		rel := strings.TrimPrefix(p, mod)
		if rel == "session" || rel == "agent" || strings.HasPrefix(rel, "agent/") {
			continue
		}
		t.Errorf("the agent packages depend on %s", p)
	}
	if checked < 2 {
		t.Fatalf("go list saw %d packages of the module: %q", checked, out)
	}
}
