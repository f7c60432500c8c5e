package ingress_test

import (
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestMain fails the run if goroutines outlive the tests and their cleanups:
// every long poll, event stream, delivery loop and connection must end.
func TestMain(m *testing.M) { natstest.VerifyNoLeaks(m, 10*time.Second) }
