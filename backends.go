package agentfleet

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/agent/bridge"
	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/agent/mcp"
	"github.com/agentfleet/agentfleet/agent/openai"
	"github.com/agentfleet/agentfleet/config"
)

// BackendFactory builds an agent backend from the fleet's configuration
// (the agent.* settings). log is for the backend's own messages; it is
// never nil. ctx bounds the construction only.
type BackendFactory func(ctx context.Context, cfg config.Config, log *slog.Logger) (agent.Backend, error)

// Backends maps backend names, the values of the agent.backend setting and
// the --agent flag, to their factories.
type Backends map[string]BackendFactory

// DefaultBackends returns the backends agentfleet ships: echo, openai and
// bridge.
func DefaultBackends() Backends {
	return Backends{
		"echo":   newEcho,
		"openai": newOpenAI,
		"bridge": newBridge,
	}
}

// New builds the backend cfg.Agent.Backend names ("echo" when empty). log may
// be nil.
func (b Backends) New(ctx context.Context, cfg config.Config, log *slog.Logger) (agent.Backend, error) {
	name := cfg.Agent.Backend
	if name == "" {
		name = "echo"
	}
	f := b[name]
	if f == nil {
		return nil, fmt.Errorf("agent %q: unknown agent backend (available: %s)", name, strings.Join(b.Names(), ", "))
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	be, err := f(ctx, cfg, log.With(slog.String("agent_backend", name)))
	if err != nil {
		return nil, fmt.Errorf("agent %q: %w", name, err)
	}
	return be, nil
}

// Names returns the registered names, sorted.
func (b Backends) Names() []string {
	names := make([]string, 0, len(b))
	for n := range b {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func newBridge(_ context.Context, cfg config.Config, log *slog.Logger) (agent.Backend, error) {
	return bridge.New(bridge.Config{URL: cfg.Agent.Bridge.URL, Token: cfg.Agent.Bridge.Token, Logger: log})
}

func newOpenAI(_ context.Context, cfg config.Config, log *slog.Logger) (agent.Backend, error) {
	o := cfg.Agent.OpenAI
	prices := make(map[string]openai.Price, len(o.Prices))
	for model, p := range o.Prices {
		prices[model] = openai.Price{Input: p.Input, Output: p.Output, CacheRead: p.CacheRead, CacheWrite: p.CacheWrite}
	}
	oc := openai.Config{Model: o.Model, BaseURL: o.BaseURL, APIKey: o.APIKey, SystemPrompt: o.SystemPrompt,
		MaxToolSteps: nonZero(o.MaxToolSteps, -1), MaxRetries: nonZero(o.MaxRetries, -1), Prices: prices, Images: o.Images, Logger: log}
	if len(o.MCPServers) > 0 {
		servers := make([]mcp.Server, len(o.MCPServers))
		for i, s := range o.MCPServers {
			servers[i] = mcp.Server{Name: s.Name, Command: s.Command, Env: s.Env, URL: s.URL, Headers: s.Headers}
		}
		tools, err := mcp.New(mcp.Config{Servers: servers, ToolTimeout: o.ToolTimeout.Duration(), Logger: log})
		if err != nil {
			return nil, err
		}
		oc.Tools = tools
	}
	b, err := openai.New(oc)
	if err != nil {
		if oc.Tools != nil {
			_ = oc.Tools.Close()
		}
		return nil, err
	}
	return b, nil
}

// nonZero maps a configured 0 ("none") to the backend's word for none.
func nonZero(v, none int) int {
	if v == 0 {
		return none
	}
	return v
}

func newEcho(_ context.Context, cfg config.Config, _ *slog.Logger) (agent.Backend, error) {
	return echo.Backend(echo.Options{AllowCrash: cfg.Agent.AllowCrash}), nil
}
