package admin_test

import (
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/test/natstest"
)

func TestMain(m *testing.M) { natstest.VerifyNoLeaks(m, 10*time.Second) }
