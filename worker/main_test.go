package worker_test

import (
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestMain fails the run if goroutines outlive the tests: every worker loop,
// lane runner, renewal, heartbeat and agent goroutine must end when its
// worker stops.
func TestMain(m *testing.M) { natstest.VerifyNoLeaks(m, 10*time.Second) }
