package telemetry_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/statedb"
	"github.com/agentfleet/agentfleet/telemetry"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

// TestMicroLs lists a worker, an ingress and an indexer's state database
// API, each registered as its role registers it, through the micro
// protocol's INFO (what `nats micro ls` sends), and prints the table `nats
// micro ls` prints.
func TestMicroLs(t *testing.T) {
	srv := natstest.RunServer(t)
	names := broker.MustNames("fleet")
	nc := srv.Connect(t)
	js := natstest.JetStream(t, nc)
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	wnc := srv.Connect(t)
	w, err := worker.New(wnc, natstest.JetStream(t, wnc), res, worker.Config{ID: "ls-1", Names: names,
		Backend: echo.Backend(echo.Options{}), LeaseTTL: 3 * time.Second, DrainTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	wsvc, err := telemetry.AddService(wnc, telemetry.ServiceConfig{Name: names.ServiceName("worker"), Version: "1.4.0",
		Description: "agentfleet worker: runs the turns of the lanes it owns", Metadata: map[string]string{"worker_id": "ls-1"},
		Subject: names.ServiceStatusSubject("worker", session.LaneToken("ls-1")), Status: func() any { return w.Status() }})
	if err != nil {
		t.Fatal(err)
	}
	defer wsvc.Stop() //nolint:errcheck
	inc := srv.Connect(t)
	isvc, err := telemetry.AddService(inc, telemetry.ServiceConfig{Name: names.ServiceName("ingress"), Version: "b162c58-dirty",
		Description: "agentfleet ingress: the HTTP adapter and the reply delivery",
		Subject:     names.ServiceStatusSubject("ingress", "host-1"), Status: func() any { return map[string]any{"nats_connected": true} }})
	if err != nil {
		t.Fatal(err)
	}
	defer isvc.Stop() //nolint:errcheck
	db, err := statedb.Open(t.Context(), filepath.Join(t.TempDir(), "state.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	xnc := srv.Connect(t)
	api, err := statedb.StartAPI(xnc, db, names, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer api.Stop() //nolint:errcheck

	want := []string{"agentfleet-ingress 0.0.0-vb162c58-dirty", "agentfleet-worker 1.4.0", names.APIService() + " " + statedb.APIVersion}
	var out strings.Builder
	natstest.WaitFor(t, 30*time.Second, "three services listed", func() error {
		infos, err := telemetry.ListServices(context.Background(), nc, "", 10*time.Second, 500*time.Millisecond)
		if err != nil {
			return err
		}
		var got []string
		for _, in := range infos {
			got = append(got, in.Name+" "+in.Version)
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			return fmt.Errorf("listed %q, want %q", got, want)
		}
		out.Reset()
		telemetry.WriteServices(&out, infos)
		return nil
	})
	t.Logf("nats micro ls:\n%s", out.String())
	for _, s := range []string{"All Micro Services", "agentfleet-worker", "1.4.0", "runs the turns of the lanes it owns", names.APIService()} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, out.String())
		}
	}
	// Listing by name asks only that service.
	infos, err := telemetry.ListServices(context.Background(), nc, "agentfleet-worker", 10*time.Second, 500*time.Millisecond)
	if err != nil || len(infos) != 1 || infos[0].Metadata["worker_id"] != "ls-1" {
		t.Fatalf("worker services: %+v (%v)", infos, err)
	}
}
