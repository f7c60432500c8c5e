package main

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
)

// TestFleetctlAsAdminUser: on a server with per-role users, fleetctl works
// as the admin user, while a worker's user cannot run its admin commands.
func TestFleetctlAsAdminUser(t *testing.T) {
	srv, err := broker.StartServer(broker.ServerConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Users: []broker.ServerUser{
		{User: "admin", Password: "admin-pw", Role: broker.RoleAdmin},
		{User: "worker", Password: "worker-pw", Role: broker.RoleWorker},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	nc, err := broker.Connect(broker.ConnectConfig{URL: srv.ClientURL(), User: "admin", Password: "admin-pw"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	t.Setenv("NATS_URL", "")
	t.Setenv("AGENTFLEET_NATS_CONNECT_WAIT", "0s")
	url := srv.ClientURL()

	var rep struct {
		Streams []struct {
			Name string `json:"name"`
		} `json:"streams"`
	}
	jsonCtl(t, &rep, "-s", url, "--user", "admin", "--password", "admin-pw", "stream", "report", "--json")
	if len(rep.Streams) < 5 {
		t.Fatalf("stream report as admin: %+v", rep)
	}
	var doc struct {
		Workers []workerDoc `json:"workers"`
	}
	jsonCtl(t, &doc, "-s", url, "--user", "admin", "--password", "admin-pw", "worker", "ls", "--json")
	if doc.Workers == nil {
		t.Fatal("worker ls as admin: no list")
	}
	start := time.Now()
	if _, err := runCtl(t, "-s", url, "--user", "worker", "--password", "worker-pw", "--timeout", "3s", "stream", "report", "--json"); err == nil {
		t.Fatal("stream report as a worker's user succeeded")
	}
	t.Logf("refused after %s", time.Since(start).Round(time.Millisecond))
}
