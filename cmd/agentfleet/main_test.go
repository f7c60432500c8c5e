package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/cmd/internal/cliutil"
	"github.com/agentfleet/agentfleet/internal/filelock"
	"github.com/agentfleet/agentfleet/test/natstest"
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

// TestUpRefusesImpossibleSettings: nats.replicas 3 cannot work on up's one
// embedded server, and an open HTTP port without a token is not served:
// both are refused at once, together, before anything starts.
func TestUpRefusesImpossibleSettings(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "fleet.yaml")
	if err := os.WriteFile(cfg, []byte("nats:\n  replicas: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := newApp().Run([]string{"agentfleet", "--config", cfg, "up", "--data", filepath.Join(dir, "data"), "--http", ":0"})
	if err == nil {
		t.Fatal("up started with nats.replicas 3 and an open port without a token")
	}
	for _, want := range []string{"nats.replicas", cfg + ":2", "http.addr", "http.token", "flag --http"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if _, statErr := os.Stat(filepath.Join(dir, "data")); statErr == nil {
		t.Error("the data directory was created although the configuration was refused")
	}
}

// TestIngressBind: a non-loopback --http without a token is refused; with
// --allow-unauthenticated (or a token) the ingress goes on to connect.
func TestIngressBind(t *testing.T) {
	dead := "nats://127.0.0.1:1"
	err := newApp().Run([]string{"agentfleet", "ingress", "--http", "0.0.0.0:0", "--nats-url", dead, "--nats-wait", "0"})
	if err == nil || !strings.Contains(err.Error(), "http.token") || !strings.Contains(err.Error(), "allow_unauthenticated") {
		t.Fatalf("open port without a token: %v", err)
	}
	for _, extra := range [][]string{{"--allow-unauthenticated"}, nil} {
		if extra == nil {
			t.Setenv("AGENTFLEET_HTTP_TOKEN", "s3cret")
		}
		args := append([]string{"agentfleet", "ingress", "--http", "0.0.0.0:0", "--nats-url", dead, "--nats-wait", "0"}, extra...)
		err := newApp().Run(args)
		if err == nil || !strings.Contains(err.Error(), "connect to nats nats://127.0.0.1:1") {
			t.Fatalf("%v: want the NATS connection to be tried, got %v", extra, err)
		}
	}
}

// TestConfigShow prints the effective configuration: values from each
// source with the source named, secrets redacted.
func TestConfigShow(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "fleet.yaml")
	if err := os.WriteFile(cfg, []byte("http:\n  token: file-secret\nworker:\n  lanes: 8\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AGENTFLEET_NATS_URL", "nats://user:url-secret@127.0.0.1:4333")
	t.Setenv("NATS_URL", "nats://ignored:4222")
	var out bytes.Buffer
	app := newApp()
	app.Writer = &out
	if err := app.Run([]string{"agentfleet", "--config", cfg, "config", "show", "--nats-wait", "7s"}); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{
		"url: nats://[redacted]@127.0.0.1:4333 # from AGENTFLEET_NATS_URL",
		"token: '[redacted]' # from " + cfg + ":2",
		"lanes: 8 # from " + cfg + ":4",
		"connect_wait: 7s # from flag --nats-wait",
		"turns: 16\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("config show lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "file-secret") || strings.Contains(s, "url-secret") || strings.Contains(s, "ignored") {
		t.Errorf("config show leaks a secret or shows the overridden NATS_URL:\n%s", s)
	}
}

// TestFlagsInAnyPosition: agentfleet reads global flags after the
// subcommand and command flags after anything else.
func TestFlagsInAnyPosition(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfg, []byte("worker:\n  lanes: 7\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"agentfleet", "--config", cfg, "--log-level", "debug", "config", "show", "--nats-url", "nats://h:4222", "--json"},
		{"agentfleet", "config", "show", "--json", "--nats-url", "nats://h:4222", "-c", cfg, "--log-level", "debug"},
		{"agentfleet", "config", "--log-level=debug", "show", "--json", "-c", cfg, "--nats-url=nats://h:4222"},
	} {
		var out bytes.Buffer
		app := newApp()
		app.Writer = &out
		if err := app.Run(cliutil.Reorder(app, args)); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		var doc struct {
			NATS struct {
				URL string `json:"url"`
			} `json:"nats"`
			Worker struct {
				Lanes int `json:"lanes"`
			} `json:"worker"`
			Telemetry struct {
				LogLevel string `json:"log_level"`
			} `json:"telemetry"`
		}
		if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out.String())
		}
		if doc.NATS.URL != "nats://h:4222" || doc.Worker.Lanes != 7 || doc.Telemetry.LogLevel != "debug" {
			t.Errorf("%v: %+v", args, doc)
		}
	}
}

func TestLocalURL(t *testing.T) {
	for addr, want := range map[string]string{
		":8080":          "http://127.0.0.1:8080",
		"0.0.0.0:9000":   "http://127.0.0.1:9000",
		"[::]:9000":      "http://127.0.0.1:9000",
		"10.1.2.3:8080":  "http://10.1.2.3:8080",
		"localhost:1234": "http://localhost:1234",
	} {
		if got := localURL(addr); got != want {
			t.Errorf("localURL(%q) = %q, want %q", addr, got, want)
		}
	}
}

// TestUpHTTPAddressInUse: up on an HTTP address another process listens on
// says that the address is in use and how to choose another one.
func TestUpHTTPAddressInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = newApp().Run([]string{"agentfleet", "up", "--data", t.TempDir(), "--http", ln.Addr().String()})
	if err == nil {
		t.Fatal("up started on an HTTP address in use")
	}
	for _, want := range []string{ln.Addr().String(), "in use (by another process", "--http"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// TestIndexerRefusesADatabaseInUse: an indexer on the file of a running one
// (whose lock the test holds) is refused, naming the holder and --db, and its
// --rebuild does not delete the file under the other one.
func TestIndexerRefusesADatabaseInUse(t *testing.T) {
	srv := natstest.RunServer(t)
	db := filepath.Join(t.TempDir(), "state.db")
	if err := os.WriteFile(db, []byte("the other indexer's database"), 0o600); err != nil {
		t.Fatal(err)
	}
	held, err := filelock.Lock(db+".lock", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	err = newApp().Run([]string{"agentfleet", "indexer", "--db", db, "--rebuild", "--nats-url", srv.URL(), "--nats-wait", "0"})
	if err == nil {
		t.Fatal("a second indexer started on a database in use")
	}
	for _, want := range []string{db, "in use by another indexer", fmt.Sprintf("process %d", os.Getpid()), "--db"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if b, err := os.ReadFile(db); err != nil || string(b) != "the other indexer's database" {
		t.Fatalf("the refused --rebuild touched the database: %q, %v", b, err)
	}
}

// TestChatWithoutTheToken: chat against an ingress that wants a token it was
// not given says the request was refused and how to give the token, not that
// the fleet cannot be reached.
func TestChatWithoutTheToken(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"error":"missing bearer token: send Authorization: Bearer <token>"}`))
	}))
	defer srv.Close()
	t.Setenv("AGENTFLEET_HTTP_TOKEN", "")
	err := newApp().Run([]string{"agentfleet", "chat", "--url", srv.URL})
	if err == nil {
		t.Fatal("chat went on without the token")
	}
	for _, want := range []string{"refused", "missing bearer token", "--token"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "cannot reach") {
		t.Errorf("error %q says the fleet cannot be reached", err)
	}
}
