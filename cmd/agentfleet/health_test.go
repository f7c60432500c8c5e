package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/statedb"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

func runHealth(args ...string) error {
	return newApp().Run(append([]string{"agentfleet", "healthcheck"}, args...))
}

func TestHealthcheckURL(t *testing.T) {
	status := http.StatusOK
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(status)
		_, _ = w.Write([]byte("not provisioned"))
	}))
	defer hs.Close()
	if err := runHealth("--url", hs.URL+"/readyz"); err != nil {
		t.Fatalf("200: %v", err)
	}
	status = http.StatusServiceUnavailable
	err := runHealth("--url", hs.URL+"/readyz")
	if err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "not provisioned") {
		t.Fatalf("503: %v", err)
	}
	hs.Close()
	if err := runHealth("--url", hs.URL+"/readyz", "--timeout", "2s"); err == nil {
		t.Fatal("a closed server is healthy")
	}
}

func TestHealthcheckArgs(t *testing.T) {
	for _, args := range [][]string{nil, {"--url", "http://x", "--worker"}, {"--url", "http://x", "--timeout", "0s"}} {
		if err := runHealth(args...); err == nil {
			t.Errorf("%q: accepted", args)
		}
	}
}

func TestHealthcheckNATSAndWorker(t *testing.T) {
	srv := natstest.RunServer(t)
	if err := runHealth("--nats", srv.URL()); err != nil {
		t.Fatalf("jetstream up: %v", err)
	}
	// A server without JetStream is not a healthy node.
	if err := runHealth("--nats", "nats://127.0.0.1:1", "--timeout", "2s"); err == nil {
		t.Fatal("nothing listening, yet healthy")
	}

	t.Setenv("NATS_URL", srv.URL())
	t.Setenv("AGENTFLEET_WORKER_ID", "hw1")
	err := runHealth("--worker")
	if err == nil {
		t.Fatal("no registry, yet healthy")
	}
	nc := srv.Connect(t)
	js := natstest.JetStream(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := broker.Provision(ctx, js, broker.ProvisionConfig{Names: broker.MustNames(broker.DefaultPrefix)})
	if err != nil {
		t.Fatal(err)
	}
	if err := runHealth("--worker"); err == nil || !strings.Contains(err.Error(), "not in the registry") {
		t.Fatalf("unregistered worker: %v", err)
	}
	put := func(state string) {
		b, _ := json.Marshal(worker.WorkerRecord{ID: "hw1", State: state, HeartbeatAt: time.Now()})
		if _, err := res.Workers.Put(ctx, session.LaneToken("hw1"), b); err != nil {
			t.Fatal(err)
		}
	}
	put(worker.StateRunning)
	if err := runHealth("--worker"); err != nil {
		t.Fatalf("running worker: %v", err)
	}
	put(worker.StateDraining)
	if err := runHealth("--worker"); err == nil || !strings.Contains(err.Error(), "draining") {
		t.Fatalf("draining worker: %v", err)
	}
}

// TestHealthcheckIndexer: --indexer fails while no state database API
// answers and passes once an indexer's API serves one.
func TestHealthcheckIndexer(t *testing.T) {
	srv := natstest.RunServer(t)
	t.Setenv("NATS_URL", srv.URL())
	if err := runHealth("--indexer", "--timeout", "2s"); err == nil {
		t.Fatal("no indexer, yet healthy")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := statedb.Open(ctx, filepath.Join(t.TempDir(), "state.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	api, err := statedb.StartAPI(srv.Connect(t), db, broker.MustNames(broker.DefaultPrefix), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = api.Stop() }()
	if err := runHealth("--indexer"); err != nil {
		t.Fatalf("indexer serving: %v", err)
	}
}
