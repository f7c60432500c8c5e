package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/agentfleet/agentfleet/broker"
)

// authServer runs a nats-server that wants a user and password or an
// nkey, with the fleet provisioned, and returns its URL and the nkey seed
// file.
func authServer(t *testing.T) (string, string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	seedFile := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	opts := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		Users: []*server.User{{Username: "ops", Password: "s3cret"}}, Nkeys: []*server.NkeyUser{{Nkey: pub}}}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(30 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("ops", "s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{}); err != nil {
		t.Fatal(err)
	}
	return s.ClientURL(), seedFile
}

func writeContext(t *testing.T, name string, v map[string]string) {
	t.Helper()
	dir := filepath.Join(os.Getenv("XDG_CONFIG_HOME"), "nats", "context")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(v)
	if err := os.WriteFile(filepath.Join(dir, name+".json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestConnectionFlagsAndContexts: -s/--user/--password, --nkey, --context
// (the nats CLI's context files), the selected context and NATS_CREDS reach
// an authenticating server the way the nats CLI's do.
func TestConnectionFlagsAndContexts(t *testing.T) {
	url, seedFile := authServer(t)
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	t.Setenv("NATS_URL", "")
	t.Setenv("AGENTFLEET_NATS_CONNECT_WAIT", "0s")
	ok := func(args ...string) {
		t.Helper()
		var doc struct {
			Workers []workerDoc `json:"workers"`
		}
		jsonCtl(t, &doc, append(args, "worker", "ls", "--json")...)
		if doc.Workers == nil {
			t.Fatalf("%v: no workers list", args)
		}
	}
	// Without credentials the server refuses.
	if _, err := runCtl(t, "worker", "ls", "-s", url); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("no credentials: %v", err)
	}
	ok("-s", url, "--user", "ops", "--password", "s3cret")
	ok("--nkey", seedFile, "-s", url)
	// The nats.nkey key (here from its environment variable) authenticates
	// like the flag, and a --user flag replaces it.
	t.Setenv("AGENTFLEET_NATS_NKEY", seedFile)
	ok("-s", url)
	ok("-s", url, "--user", "ops", "--password", "s3cret")
	t.Setenv("AGENTFLEET_NATS_NKEY", "")

	writeContext(t, "ops", map[string]string{"url": url, "user": "ops", "password": "s3cret", "description": "the fleet"})
	ok("--context", "ops")
	t.Setenv("NATS_CONTEXT", "ops")
	ok()
	t.Setenv("NATS_CONTEXT", "")
	// An nkey flag replaces the context's user and password.
	ok("--context", "ops", "--nkey", seedFile)
	// The selected context is used when nothing else names a server.
	if err := os.WriteFile(filepath.Join(os.Getenv("XDG_CONFIG_HOME"), "nats", "context.txt"), []byte("ops\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ok()
	// An unknown context is an error, not a silent fallback.
	if _, err := runCtl(t, "--context", "nope", "worker", "ls"); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("unknown context: %v", err)
	}
	if _, err := runCtl(t, "--context", "../x", "worker", "ls"); err == nil {
		t.Fatal("a context name with a path accepted")
	}

	// config show says where each connection setting came from, the
	// password redacted.
	var cs struct {
		Config struct {
			NATS struct {
				URL      string `json:"url"`
				User     string `json:"user"`
				Password string `json:"password"`
			} `json:"nats"`
		} `json:"config"`
		Sources map[string]string `json:"sources"`
		Context string            `json:"nats_context"`
	}
	jsonCtl(t, &cs, "config", "show", "--context", "ops", "--user", "admin", "--json")
	if cs.Config.NATS.URL != url || cs.Config.NATS.User != "admin" || cs.Config.NATS.Password != "[redacted]" || cs.Context != "ops" ||
		cs.Sources["nats.url"] != "nats context ops" || cs.Sources["nats.user"] != "flag --user" {
		t.Fatalf("config show: %+v", cs)
	}
	human, err := runCtl(t, "config", "show", "--context", "ops")
	if err != nil || strings.Contains(human, "s3cret") || !strings.Contains(human, "from nats context ops") {
		t.Fatalf("config show (human): %v\n%s", err, human)
	}

	// NATS_CREDS names a credentials file, which must exist.
	t.Setenv("NATS_CREDS", filepath.Join(t.TempDir(), "missing.creds"))
	if _, err := runCtl(t, "-s", url, "worker", "ls"); err == nil || !strings.Contains(err.Error(), "nats.creds") {
		t.Fatalf("NATS_CREDS of a missing file: %v", err)
	}
}
