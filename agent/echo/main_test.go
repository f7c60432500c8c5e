package echo_test

import (
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestMain fails the run if goroutines (agent runs, request readers)
// outlive the tests.
func TestMain(m *testing.M) { natstest.VerifyNoLeaks(m, 10*time.Second) }
