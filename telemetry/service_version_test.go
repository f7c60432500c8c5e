package telemetry_test

import (
	"testing"

	"github.com/agentfleet/agentfleet/telemetry"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// A binary built with a version that is not a semantic version (what `make
// image` sets from git describe) still registers its micro service.
func TestServiceVersionFromAnyBuildString(t *testing.T) {
	for in, want := range map[string]string{
		"1.2.3":         "1.2.3",
		"0.1.0-dev":     "0.1.0-dev",
		"b162c58":       "0.0.0-vb162c58",
		"b162c58-dirty": "0.0.0-vb162c58-dirty",
		"":              "0.0.0-vdev",
		"v1.2/x y":      "0.0.0-vv1-2-x-y",
	} {
		if got := telemetry.ServiceVersion(in); got != want {
			t.Errorf("ServiceVersion(%q) = %q, want %q", in, got, want)
		}
	}
	srv := natstest.RunServer(t)
	nc := srv.Connect(t)
	svc, err := telemetry.AddService(nc, telemetry.ServiceConfig{Name: "fleet-test", Version: "b162c58-dirty",
		Subject: "fleet.svc.test.status", Status: func() any { return map[string]int{} }})
	if err != nil {
		t.Fatalf("AddService with a git describe version: %v", err)
	}
	defer svc.Stop()
	if info := svc.Info(); info.Version != "0.0.0-vb162c58-dirty" || info.Metadata["build"] != "b162c58-dirty" {
		t.Fatalf("info %+v", info)
	}
}
