package agentfleet_test

import (
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet"
	"github.com/agentfleet/agentfleet/config"
)

func TestBackendsNew(t *testing.T) {
	t.Parallel()
	reg := agentfleet.DefaultBackends()
	if got := strings.Join(reg.Names(), ","); got != "bridge,echo,openai" {
		t.Errorf("names %s", got)
	}
	for _, c := range []struct {
		name string
		set  func(*config.Config)
		want string
	}{
		{"unknown", func(c *config.Config) { c.Agent.Backend = "gpt" }, `unknown agent backend (available: bridge, echo, openai)`},
		{"openai without a model", func(c *config.Config) { c.Agent.Backend = "openai" }, "a model is required"},
		{"bridge without a url", func(c *config.Config) { c.Agent.Backend = "bridge" }, "agent.bridge.url"},
	} {
		cfg := config.Default()
		c.set(&cfg)
		if _, err := reg.New(t.Context(), cfg, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.name, err, c.want)
		}
	}
	for _, name := range []string{"echo", "openai", "bridge"} {
		cfg := config.Default()
		cfg.Agent.Backend = name
		cfg.Agent.OpenAI.Model = "m"
		cfg.Agent.Bridge.URL = "http://127.0.0.1:1/turn"
		b, err := reg.New(t.Context(), cfg, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := b.Close(); err != nil {
			t.Errorf("%s: Close: %v", name, err)
		}
	}
	// A program adds its own backend beside the shipped ones.
	reg["mine"] = reg["echo"]
	cfg := config.Default()
	cfg.Agent.Backend = "mine"
	if _, err := reg.New(t.Context(), cfg, nil); err != nil {
		t.Errorf("own backend: %v", err)
	}
}
