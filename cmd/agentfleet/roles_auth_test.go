package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/config"
)

// logRecorder keeps every log line of a role.
type logRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Level.String() + " " + rec.Message)
	rec.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	r.mu.Lock()
	r.lines = append(r.lines, b.String())
	r.mu.Unlock()
	return nil
}
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *logRecorder) WithGroup(string) slog.Handler      { return r }

func (r *logRecorder) violations() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, l := range r.lines {
		if strings.Contains(strings.ToLower(l), "permissions violation") {
			out = append(out, l)
		}
	}
	return out
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestRolesRunUnderTheirPermissions: on a server whose users have the
// least-privilege permissions of their roles, a role cannot start before
// the fleet is provisioned (and says so); an admin provisions it; then an
// ingress, a worker and an indexer, each as its own user with its own inbox
// prefix and nats.provision false, answer a message end to end, the
// healthchecks pass, and no role hit a permission violation.
func TestRolesRunUnderTheirPermissions(t *testing.T) {
	var users []broker.ServerUser
	for _, role := range []string{broker.RoleAdmin, broker.RoleIngress, broker.RoleWorker, broker.RoleIndexer, broker.RoleHealthcheck, broker.RoleConsole} {
		users = append(users, broker.ServerUser{User: role, Password: role + "-pw", Role: role, InboxPrefix: "_INBOX_" + role})
	}
	srv, err := broker.StartServer(broker.ServerConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Users: users})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()

	logs := map[string]*logRecorder{}
	defer func() {
		if t.Failed() {
			for role, rec := range logs {
				for _, v := range rec.violations() {
					t.Logf("%s: %s", role, v)
				}
			}
		}
	}()
	roleConfig := func(role string) config.Config {
		cfg := config.Default()
		cfg.NATS.URL = srv.ClientURL()
		cfg.NATS.User, cfg.NATS.Password, cfg.NATS.InboxPrefix = role, role+"-pw", "_INBOX_"+role
		cfg.NATS.Provision = role == broker.RoleAdmin
		cfg.NATS.ConnectWait = 0
		return cfg
	}
	newRole := func(role string) *runtime {
		rec := &logRecorder{}
		logs[role] = rec
		cfg := roleConfig(role)
		if role == broker.RoleWorker || role == broker.RoleIndexer {
			cfg.Telemetry.MetricsAddr = freeAddr(t)
		}
		if role == broker.RoleConsole {
			cfg.HTTP.Token = "console-token"
		}
		rt, err := newRuntime(cfg, slog.New(rec))
		if err != nil {
			t.Fatal(err)
		}
		return rt
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Before provisioning, a worker refuses to start and says why.
	early := newRole(broker.RoleWorker)
	_, js, err := early.connect("early")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := early.provision(ctx, js); !errors.Is(err, broker.ErrNotProvisioned) || !strings.Contains(err.Error(), "agentfleet provision") {
		t.Fatalf("worker on an unprovisioned fleet: %v", err)
	}
	early.close()

	admin := newRole(broker.RoleAdmin)
	_, ajs, err := admin.connect("admin")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.provision(ctx, ajs); err != nil {
		t.Fatal(err)
	}
	admin.close()

	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	var rts []*runtime
	defer func() {
		stop()
		wg.Wait()
		for _, rt := range rts {
			rt.close()
		}
	}()
	ing := newRole(broker.RoleIngress)
	rts = append(rts, ing)
	addr := freeAddr(t)
	if err := ing.startMetrics(rctx, "ingress", true, &wg, errs); err != nil {
		t.Fatal(err)
	}
	if _, err := ing.startIngress(rctx, addr, &wg, errs, nil); err != nil {
		t.Fatal(err)
	}
	// A second ingress serving the console, as a console user.
	con := newRole(broker.RoleConsole)
	rts = append(rts, con)
	conAddr := freeAddr(t)
	if _, err := con.startIngress(rctx, conAddr, &wg, errs, nil); err != nil {
		t.Fatal(err)
	}
	wrk := newRole(broker.RoleWorker)
	rts = append(rts, wrk)
	if err := wrk.startMetrics(rctx, "worker", false, &wg, errs); err != nil {
		t.Fatal(err)
	}
	b, err := backend(ctx, wrk.cfg, false, wrk.log)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := wrk.startWorkers(rctx, 1, "w1", b, false, &wg, errs); err != nil {
		t.Fatal(err)
	}
	idx := newRole(broker.RoleIndexer)
	rts = append(rts, idx)
	if err := idx.startMetrics(rctx, "indexer", false, &wg, errs); err != nil {
		t.Fatal(err)
	}
	if err := idx.startIndexer(rctx, filepath.Join(t.TempDir(), "state.db"), false, &wg, errs); err != nil {
		t.Fatal(err)
	}

	resp, err := http.Post("http://"+addr+"/v1/messages", "application/json", strings.NewReader(`{"chat_id":"c1","text":"hello roles"}`))
	if err != nil {
		t.Fatal(err)
	}
	var accepted struct {
		SessionKey string `json:"session_key"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&accepted)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 || accepted.SessionKey == "" {
		t.Fatalf("post: %d", resp.StatusCode)
	}
	resp, err = http.Get("http://" + addr + "/v1/sessions/" + accepted.SessionKey + "/replies?wait=60s")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Replies []struct{ Text string } `json:"replies"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if len(got.Replies) == 0 || !strings.Contains(got.Replies[0].Text, "hello roles") {
		t.Fatalf("replies: %+v", got)
	}

	// The metrics (which list the consumers of each role's streams).
	get := func(url, token string) string {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s", url, resp.StatusCode, body)
		}
		return string(body)
	}
	get("http://"+addr+"/metrics", "")
	get("http://"+wrk.cfg.Telemetry.MetricsAddr+"/metrics", "")
	get("http://"+idx.cfg.Telemetry.MetricsAddr+"/metrics", "")

	// The console's pages, as the console user.
	for _, page := range []string{"/console/fleet", "/console/lanes", "/console/events", "/console/deadletters", "/console/search?q=hello"} {
		get("http://"+conAddr+page, "console-token")
	}

	// The healthchecks, as the healthcheck user, from a container whose
	// nats.* settings are a role's (with a wrong password, so only the
	// AGENTFLEET_HEALTHCHECK_NATS_* settings let them in).
	hc := roleConfig(broker.RoleHealthcheck)
	t.Setenv("AGENTFLEET_NATS_USER", broker.RoleWorker)
	t.Setenv("AGENTFLEET_NATS_PASSWORD", "not-the-worker-password")
	t.Setenv("AGENTFLEET_NATS_INBOX_PREFIX", "_INBOX_worker")
	t.Setenv("AGENTFLEET_HEALTHCHECK_NATS_USER", hc.NATS.User)
	t.Setenv("AGENTFLEET_HEALTHCHECK_NATS_PASSWORD", hc.NATS.Password)
	t.Setenv("AGENTFLEET_HEALTHCHECK_NATS_INBOX_PREFIX", hc.NATS.InboxPrefix)
	t.Setenv("AGENTFLEET_NATS_URL", srv.ClientURL())
	t.Setenv("AGENTFLEET_WORKER_ID", "w1")
	for _, check := range []string{"--nats", "--worker", "--indexer"} {
		args := []string{"agentfleet", "healthcheck", "--timeout", "20s", check}
		if check == "--nats" {
			args = append(args, srv.ClientURL())
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := newApp().Run(args)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("healthcheck %s: %v", check, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	select {
	case err := <-errs:
		t.Fatalf("a role failed: %v", err)
	default:
	}
	for role, rec := range logs {
		if v := rec.violations(); len(v) > 0 {
			t.Errorf("%s hit permission violations:\n%s", role, strings.Join(v, "\n"))
		}
	}
}

// TestNATSPermissionsCommand prints nats-server entries for the roles asked
// for, with an nkey instead of a password when given, and refuses an
// unknown role.
func TestNATSPermissionsCommand(t *testing.T) {
	var out strings.Builder
	app := newApp()
	app.Writer = &out
	nkey := "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"
	t.Setenv("AGENTFLEET_NATS_PREFIX", "acme")
	if err := app.Run([]string{"agentfleet", "nats-permissions", "--role", "worker", "--role", "indexer", "--nkey", nkey, "--inbox-prefix", "_INBOX_w"}); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{`role "worker", prefix "acme"`, `role "indexer"`, `"nkey": "` + nkey + `"`, `"acme.tx.>"`, `"_INBOX_w.>"`, `"$JS.ACK.ACME_IN.>"`} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %s:\n%s", want, s)
		}
	}
	if strings.Contains(s, "password") {
		t.Errorf("an nkey entry has a password:\n%s", s)
	}
	if err := newApp().Run([]string{"agentfleet", "nats-permissions", "--role", "wizard"}); err == nil || !strings.Contains(err.Error(), "wizard") {
		t.Errorf("unknown role: %v", err)
	}
}
