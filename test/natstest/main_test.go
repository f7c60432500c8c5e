package natstest_test

import (
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestMain fails the run if goroutines are left over once all tests and
// their cleanups are done: the helpers must close every connection and wait
// for every server they start.
func TestMain(m *testing.M) { natstest.VerifyNoLeaks(m, 5*time.Second) }
