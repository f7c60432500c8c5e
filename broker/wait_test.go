package broker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// recorder is a slog handler that keeps the messages logged through it.
type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	line := rec.Message
	rec.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
	r.msgs = append(r.msgs, line)
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

// count returns how many messages start with prefix.
func (r *recorder) count(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.msgs {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}

func (r *recorder) all() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.msgs, "\n")
}

// freePort returns a TCP port on 127.0.0.1 that nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}

// TestConnectWaitWaitsForServer starts connecting before any server runs:
// ConnectWait logs that it waits (with the URL's credentials redacted),
// and connects once the server is up.
func TestConnectWaitWaitsForServer(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	rec := &recorder{}
	url := "nats://someone:hunter2@127.0.0.1:" + itoa(port)
	type result struct {
		err error
	}
	done := make(chan result, 1)
	go func() {
		nc, err := broker.ConnectWait(t.Context(), broker.ConnectConfig{URL: url, Name: "wait-test", Logger: slog.New(rec)}, 2*time.Minute)
		if nc != nil {
			nc.Close()
		}
		done <- result{err}
	}()
	natstest.WaitFor(t, 30*time.Second, "a 'waiting for NATS' line", func() error {
		if rec.count("waiting for NATS at ") == 0 {
			return errors.New("none yet")
		}
		return nil
	})
	if logs := rec.all(); strings.Contains(logs, "hunter2") || !strings.Contains(logs, "waiting for NATS at nats://[redacted]@127.0.0.1:") {
		t.Fatalf("the waiting line must name the URL without its credentials:\n%s", logs)
	}
	// The server comes up (accepting any user) on the port being tried.
	natstest.RunServer(t, natstest.WithPort(port))
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("ConnectWait: %v\n%s", r.err, rec.all())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("ConnectWait did not connect once the server was up:\n%s", rec.all())
	}
	if rec.count("connected to NATS at ") != 1 {
		t.Errorf("no 'connected' line:\n%s", rec.all())
	}
}

// TestConnectWaitGivesUp: past the wait, a clear error naming the URL and
// the setting to raise.
func TestConnectWaitGivesUp(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	rec := &recorder{}
	_, err := broker.ConnectWait(t.Context(), broker.ConnectConfig{URL: "127.0.0.1:" + itoa(port), Logger: slog.New(rec)}, 1500*time.Millisecond)
	if !errors.Is(err, broker.ErrNATSUnreachable) {
		t.Fatalf("err = %v, want ErrNATSUnreachable", err)
	}
	for _, want := range []string{"127.0.0.1:" + itoa(port), "nats.connect_wait", "1.5s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if rec.count("waiting for NATS at ") == 0 {
		t.Errorf("gave up without saying it waited:\n%s", rec.all())
	}
}

// TestConnectWaitAuthFailsAtOnce: a refused authorization is not retried.
func TestConnectWaitAuthFailsAtOnce(t *testing.T) {
	t.Parallel()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, Authorization: "right-token", NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(30 * time.Second) {
		t.Fatal("server not ready")
	}
	rec := &recorder{}
	_, err = broker.ConnectWait(t.Context(), broker.ConnectConfig{URL: s.ClientURL(), Token: "wrong-token", Logger: slog.New(rec)}, 5*time.Minute)
	if err == nil || errors.Is(err, broker.ErrNATSUnreachable) || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("err = %v, want the authorization error at once", err)
	}
	if n := rec.count("waiting for NATS"); n != 0 {
		t.Fatalf("an authorization error was retried %d times:\n%s", n, rec.all())
	}
}

// TestProvisionReplicasOnSingleServerFailsFast: replicas 3 on a server that
// is not clustered is refused on the first attempt with an error that says
// why, instead of being retried until the wait runs out.
func TestProvisionReplicasOnSingleServerFailsFast(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	js := natstest.JetStream(t, srv.Connect(t))
	rec := &recorder{}
	_, err := broker.ProvisionRetry(t.Context(), js, broker.ProvisionConfig{Names: broker.MustNames("rep"), Replicas: 3}, 5*time.Minute, slog.New(rec))
	if !errors.Is(err, broker.ErrReplicasNeedCluster) {
		t.Fatalf("err = %v, want ErrReplicasNeedCluster", err)
	}
	if broker.Retryable(err) {
		t.Error("Retryable(replicas without a cluster) = true")
	}
	if n := rec.count("provisioning failed; retrying"); n != 0 {
		t.Fatalf("retried %d times:\n%s", n, rec.all())
	}

	// The same against a fleet already provisioned with one replica.
	if _, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: broker.MustNames("rep1")}); err != nil {
		t.Fatal(err)
	}
	_, err = broker.ProvisionRetry(t.Context(), js, broker.ProvisionConfig{Names: broker.MustNames("rep1"), Replicas: 3}, 5*time.Minute, slog.New(rec))
	if !errors.Is(err, broker.ErrReplicasNeedCluster) {
		t.Fatalf("existing fleet: err = %v, want ErrReplicasNeedCluster", err)
	}
	if n := rec.count("provisioning failed; retrying"); n != 0 {
		t.Fatalf("existing fleet: retried %d times:\n%s", n, rec.all())
	}
}

func TestRetryable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"timeout", context.DeadlineExceeded, true},
		{"not enabled yet", jetstream.ErrJetStreamNotEnabled, true},
		{"no peers yet", &jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement"}, true},
		{"temporarily unavailable", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, true},
		{"replicas not supported", &jetstream.APIError{Code: 500, ErrorCode: 10074, Description: "replicas > 1 not supported in non-clustered mode"}, false},
		{"subjects overlap", &jetstream.APIError{Code: 400, ErrorCode: 10065, Description: "subjects overlap with an existing stream"}, false},
		{"invalid config", &jetstream.APIError{Code: 500, ErrorCode: 10052, Description: "bad"}, false},
	} {
		if got := broker.Retryable(tc.err); got != tc.want {
			t.Errorf("%s: Retryable = %v, want %v", tc.name, got, tc.want)
		}
	}
	if broker.Retryable(nil) {
		t.Error("Retryable(nil)")
	}
}

func TestTransient(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"timeout", fmt.Errorf("write: %w", context.DeadlineExceeded), true},
		{"nats timeout", nats.ErrTimeout, true},
		{"no responders", nats.ErrNoResponders, true},
		{"no stream response", jetstream.ErrNoStreamResponse, true},
		{"reconnecting", nats.ErrConnectionReconnecting, true},
		{"temporarily unavailable", fmt.Errorf("set the subjects of FLEET_IN: %w", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}), true},
		{"not leader", &jetstream.APIError{Code: 500, ErrorCode: 10009, Description: "JetStream cluster not leader"}, true},
		{"stream offline", &jetstream.APIError{Code: 500, ErrorCode: 10118, Description: "stream is offline"}, true},
		{"canceled", context.Canceled, false},
		{"stream not found", jetstream.ErrStreamNotFound, false},
		{"revision mismatch", fmt.Errorf("%w: %w", jetstream.ErrKeyRevisionMismatch, &jetstream.APIError{Code: 400, ErrorCode: 10071, Description: "wrong last sequence: 7"}), false},
		{"subjects overlap", &jetstream.APIError{Code: 400, ErrorCode: 10065, Description: "subjects overlap with an existing stream"}, false},
		{"unknown", errors.New("inbox stream FLEET_IN_1 still holds 3 messages"), false},
	} {
		if got := broker.Transient(tc.err); got != tc.want {
			t.Errorf("%s: Transient = %v, want %v", tc.name, got, tc.want)
		}
	}
	if broker.Transient(nil) {
		t.Error("Transient(nil)")
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":           "nats://127.0.0.1:4222",
		"nats://u:p@h:4222":               "nats://[redacted]@h:4222",
		"tls://tok@h:4222,nats://h2:4222": "tls://[redacted]@h:4222,nats://h2:4222",
		"nats://[redacted]@h:4222":        "nats://[redacted]@h:4222", // idempotent
		"u:p@h:4222":                      "[redacted]@h:4222",
		"":                                "",
		"nats://a:b@x:1, nats://c@y:2":    "nats://[redacted]@x:1,nats://[redacted]@y:2",
	} {
		if got := broker.RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestStartServerPortInUse: a listen address already taken is refused at
// once, saying so, not after waiting for a server that never gets ready.
func TestStartServerPortInUse(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s, err := broker.StartServer(broker.ServerConfig{DataDir: t.TempDir(), Listen: ln.Addr().String()})
	if err == nil {
		s.Shutdown()
		t.Fatal("StartServer on a port in use succeeded")
	}
	if !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("err = %v, want the port named as in use", err)
	}
}
