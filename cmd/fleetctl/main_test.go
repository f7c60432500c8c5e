package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runCtl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := newApp(&out).Run(append([]string{"fleetctl"}, args...))
	return out.String(), err
}

func TestKeyHonoursConfig(t *testing.T) {
	out, err := runCtl(t, "key", "--platform", "telegram", "--chat-type", "group", "--chat-id", "-100123", "--user-id", "42")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(out), "agent:main:telegram:group:-100123:42"; got != want {
		t.Fatalf("key %q, want %q", got, want)
	}
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfg, []byte("group_sessions_per_user: false\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = runCtl(t, "--config", cfg, "key", "--json", "--platform", "telegram", "--chat-type", "group", "--chat-id", "-100123", "--user-id", "42")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		SessionKey string `json:"session_key"`
		Lane       string `json:"lane"`
		Partition  int    `json:"partition"`
		Shared     bool   `json:"shared_multi_user"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("--json output is not one JSON document: %v\n%s", err, out)
	}
	if doc.SessionKey != "agent:main:telegram:group:-100123" || !doc.Shared || doc.Lane != "agent.main.telegram.group.-100123" || doc.Partition < 0 || doc.Partition > 63 {
		t.Fatalf("with group_sessions_per_user false: %+v", doc)
	}
}

func TestKeyRejectsBadInput(t *testing.T) {
	if _, err := runCtl(t, "key", "--platform", "bogus"); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("unknown platform: %v", err)
	}
	if _, err := runCtl(t, "key", "--platform", "telegram", "--chat-id", "../etc"); err == nil {
		t.Fatal("path traversal in chat id accepted")
	}
}

func TestTranscriptRejectsBadSessionID(t *testing.T) {
	if _, err := runCtl(t, "transcript", "not-a-session"); err == nil || !strings.Contains(err.Error(), "SESSION_ID") {
		t.Fatalf("bad session id: %v", err)
	}
}
