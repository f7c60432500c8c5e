package broker_test

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// syncBuffer is a log sink safe for the connection's callback goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestConnectErrorsHideSecrets: a password or token in NATS_URL, or given
// as an option, never appears in a connection error.
func TestConnectErrorsHideSecrets(t *testing.T) {
	t.Parallel()
	for _, cfg := range []broker.ConnectConfig{
		{URL: "nats://alice:s3cret@127.0.0.1:1"},
		{URL: "nats://s3cret@127.0.0.1:1"},
		{URL: "nats://alice:s3cret@127.0.0.1:notaport"},
		{URL: "nats://alice:s3cret@[::1"},
		{URL: "nats://127.0.0.1:1", User: "alice", Password: "s3cret"},
		{URL: "nats://127.0.0.1:1", Token: "s3cret"},
	} {
		cfg.Timeout = 2 * time.Second
		cfg.Logger = slog.New(slog.DiscardHandler)
		nc, err := broker.Connect(cfg)
		if err == nil {
			nc.Close()
			t.Fatalf("%s: connected", cfg.URL)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("error %q shows the secret", err)
		}
	}
}

// TestReconnectLogHidesPassword is issue 12's defect 5: after a NATS
// restart the "nats reconnected" line logged NATS_URL with its password.
func TestReconnectLogHidesPassword(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t, natstest.WithUser("alice", "s3cret-pw"))
	var logs syncBuffer
	url := strings.Replace(srv.URL(), "nats://", "nats://alice:s3cret-pw@", 1)
	nc, err := broker.Connect(broker.ConnectConfig{URL: url, Name: "redact-test",
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	srv.Restart(t)
	natstest.WaitFor(t, 30*time.Second, "the reconnect log line", func() error {
		if !strings.Contains(logs.String(), "nats reconnected") {
			return errors.New(logs.String())
		}
		return nil
	})
	out := logs.String()
	if strings.Contains(out, "s3cret-pw") {
		t.Fatalf("the logs show the password:\n%s", out)
	}
	// The redacted URL still says where it connected.
	if !strings.Contains(out, "alice:xxxxx@127.0.0.1") {
		t.Fatalf("the reconnect line lacks the redacted URL:\n%s", out)
	}
}
