package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBadConfigIsRefusedNamingFieldAndValue(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "agentfleet.yaml")
	if err := os.WriteFile(cfg, []byte("lease:\n  ttl: 1s\nsession_reset:\n  mode: sometimes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := newApp().Run([]string{"agentfleet", "--config", cfg, "up", "--data", filepath.Join(dir, "data")})
	if err == nil {
		t.Fatal("a bad configuration started")
	}
	for _, want := range []string{"lease.ttl", "1s", "session_reset.mode", "sometimes"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if _, statErr := os.Stat(filepath.Join(dir, "data")); statErr == nil {
		t.Error("the data directory was created although the configuration was refused")
	}
}

func TestBadEnvAndFlagRefused(t *testing.T) {
	t.Setenv("AGENTFLEET_WORKER_LINGER", "forever")
	err := newApp().Run([]string{"agentfleet", "worker"})
	if err == nil || !strings.Contains(err.Error(), "AGENTFLEET_WORKER_LINGER") || !strings.Contains(err.Error(), "forever") {
		t.Fatalf("bad env value: %v", err)
	}
	t.Setenv("AGENTFLEET_WORKER_LINGER", "")
	err = newApp().Run([]string{"agentfleet", "up", "--workers", "0"})
	if err == nil || !strings.Contains(err.Error(), "--workers") {
		t.Fatalf("--workers 0: %v", err)
	}
	err = newApp().Run([]string{"agentfleet", "worker", "--workers", "-1"})
	if err == nil || !strings.Contains(err.Error(), "--workers -1") {
		t.Fatalf("worker --workers -1: %v", err)
	}
	err = newApp().Run([]string{"agentfleet", "up", "--agent", "gpt-nonexistent", "--data", t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "gpt-nonexistent") {
		t.Fatalf("unknown agent: %v", err)
	}
}
