package statedb_test

import (
	"os"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestMain runs the helper processes the multi-process tests start (the
// test binary re-executed with STATEDB_HELPER set), and otherwise fails the
// run if goroutines outlive the tests.
func TestMain(m *testing.M) {
	if mode := os.Getenv("STATEDB_HELPER"); mode != "" {
		os.Exit(runHelper(mode))
	}
	natstest.VerifyNoLeaks(m, 10*time.Second)
}
