package console_test

import (
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestMain fails the run if goroutines outlive the tests and their cleanups:
// every event stream, watch and connection the console opens must end.
func TestMain(m *testing.M) { natstest.VerifyNoLeaks(m, 10*time.Second) }
