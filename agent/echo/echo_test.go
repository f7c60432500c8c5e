package echo_test

import (
	"testing"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/agent/agenttest"
	"github.com/agentfleet/agentfleet/agent/echo"
)

func TestConformance(t *testing.T) {
	agenttest.Run(t, agenttest.Config{
		NewBackend: func(*testing.T) agent.Backend { return echo.Backend(echo.Options{}) },
		Reply:      "hello\nworld",
		Slow:       "first words\n!sleep 120s",
		Fail:       "!fail",
		Tools:      "!tools 3",
		Usage:      true,
	})
}
