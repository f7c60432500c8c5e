package broker_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/broker"
)

// TestDataDirLockedWhileServerRuns: a second embedded server on the data dir
// of a running one (a second `agentfleet up` with the same --data) is refused
// with a message that says what to do, and the first keeps its store; once the
// first is shut down, the dir can be used again.
func TestDataDirLockedWhileServerRuns(t *testing.T) {
	dir := t.TempDir()
	first, err := broker.StartServer(broker.ServerConfig{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			first.Shutdown()
			first.WaitForShutdown()
		}
	}
	defer stop()

	second, err := broker.StartServer(broker.ServerConfig{DataDir: dir})
	if err == nil {
		second.Shutdown()
		second.WaitForShutdown()
		t.Fatal("a second server started on the data dir of a running one")
	}
	if !errors.Is(err, broker.ErrDataDirInUse) {
		t.Fatalf("err = %v, want ErrDataDirInUse", err)
	}
	for _, want := range []string{dir, "still running", "--data"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if !first.Running() || !first.JetStreamEnabled() {
		t.Fatal("the refused start disturbed the running server")
	}

	stop()
	again, err := broker.StartServer(broker.ServerConfig{DataDir: dir})
	if err != nil {
		t.Fatalf("start after the first server stopped: %v", err)
	}
	again.Shutdown()
	again.WaitForShutdown()
}
