package worker

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/telemetry"
)

// Busy modes: what a message arriving during a running turn does.
const (
	BusyInterrupt = "interrupt"
	BusyQueue     = "queue"
	BusySteer     = "steer"
)

// Config configures a Worker.
type Config struct {
	// ID names the worker. Required. A random incarnation is appended to it
	// to form the owner id written into leases and entries.
	ID string
	// Version is the build's version, reported in the worker registry.
	Version string
	// Names are the fleet's names. Defaults to the "fleet" prefix.
	Names broker.Names
	// Backend creates agents. Required.
	Backend agent.Backend
	// LeaseTTL is the lane lease TTL, judged by the server. Defaults to 15s.
	LeaseTTL time.Duration
	// LeaseMargin is how long before its lease could expire an owner stops
	// writing. Defaults to 2s (and at most LeaseTTL/3).
	LeaseMargin time.Duration
	// Linger is how long an idle lane stays owned so follow-ups meet a warm
	// cache. Defaults to 30s.
	Linger time.Duration
	// PeekInterval is how often a lingering lane re-reads its inbox even
	// without a hint. Defaults to 2s.
	PeekInterval time.Duration
	// MaxLanes bounds the lanes owned at once. Defaults to 64.
	MaxLanes int
	// MaxTurns bounds the turns running at once. Defaults to 16.
	MaxTurns int
	// MaxTurnMessages and MaxTurnBytes cap one turn. Defaults 50 and 256 KiB.
	MaxTurnMessages int
	MaxTurnBytes    int
	// BusyMode is the default busy mode of lanes. Defaults to interrupt.
	BusyMode string
	// CollectWindow keeps a burst of follow-ups together after an interrupt.
	// Defaults to 200ms.
	CollectWindow time.Duration
	// GatewayTimeout bounds one agent run. Defaults to 30m.
	GatewayTimeout time.Duration
	// Freshness is agent.gateway_auto_continue_freshness. Defaults to 1h.
	Freshness time.Duration
	// DrainTimeout is how long a graceful stop waits for running turns.
	// Defaults to 60s.
	DrainTimeout time.Duration
	// Restart marks a graceful stop as a restart (resume reason
	// restart_timeout instead of shutdown_timeout).
	Restart bool
	// Reset resolves reset policies. Defaults to session.DefaultResetPolicy everywhere.
	Reset session.ResetConfig
	// Location is the zone of at_hour. Defaults to time.Local.
	Location *time.Location
	// Context configures the session context prompt.
	Context session.ContextOptions
	// CacheSize and CacheIdleTTL bound the agent cache. Defaults 128 and 1h.
	CacheSize    int
	CacheIdleTTL time.Duration
	// WatchInterval is how often the expiry watcher's leader sweeps for
	// expired sessions and stranded lanes. Defaults to 5m.
	WatchInterval time.Duration
	// MaxAgeDays prunes entries not updated for that many days
	// (session_store_max_age_days); 0 disables pruning.
	MaxAgeDays int
	// PruneInterval is how often the leader prunes. Defaults to 1h.
	PruneInterval time.Duration
	// Now is the clock for timestamps and policies (never for leases).
	// Defaults to time.Now.
	Now func() time.Time
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Metrics records the worker's metrics; nil records nothing.
	Metrics *telemetry.Metrics
	// TracerProvider traces deliveries and turns, continuing the trace
	// the ingress put in each inbox message's headers; nil traces nothing.
	TracerProvider trace.TracerProvider
}

func (c *Config) withDefaults() (Config, error) {
	out := *c
	if out.ID == "" {
		return out, errors.New("worker: ID is required")
	}
	if out.Backend == nil {
		return out, errors.New("worker: Backend is required")
	}
	if out.Names.Prefix() == "" {
		out.Names = broker.MustNames(broker.DefaultPrefix)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&out.LeaseTTL, 15*time.Second)
	def(&out.LeaseMargin, 2*time.Second)
	if out.LeaseMargin > out.LeaseTTL/3 {
		out.LeaseMargin = out.LeaseTTL / 3
	}
	def(&out.Linger, 30*time.Second)
	def(&out.PeekInterval, 2*time.Second)
	def(&out.CollectWindow, 200*time.Millisecond)
	def(&out.GatewayTimeout, 30*time.Minute)
	def(&out.Freshness, time.Hour)
	def(&out.DrainTimeout, 60*time.Second)
	def(&out.CacheIdleTTL, time.Hour)
	def(&out.WatchInterval, 5*time.Minute)
	def(&out.PruneInterval, time.Hour)
	if out.MaxLanes <= 0 {
		out.MaxLanes = 64
	}
	if out.MaxTurns <= 0 {
		out.MaxTurns = 16
	}
	if out.MaxTurnMessages <= 0 {
		out.MaxTurnMessages = 50
	}
	if out.MaxTurnBytes <= 0 {
		out.MaxTurnBytes = 256 << 10
	}
	if out.CacheSize <= 0 {
		out.CacheSize = 128
	}
	switch out.BusyMode {
	case "":
		out.BusyMode = BusyInterrupt
	case BusyInterrupt, BusyQueue, BusySteer:
	default:
		return out, fmt.Errorf("worker: busy mode %q: want interrupt, queue or steer", out.BusyMode)
	}
	if out.Reset.Default.Mode == "" {
		out.Reset.Default = session.DefaultResetPolicy()
	}
	if out.Location == nil {
		out.Location = time.Local
	}
	if out.Now == nil {
		out.Now = time.Now
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out, nil
}

func (c *Config) policy() kv.Policy {
	return kv.Policy{Reset: c.Reset, Location: c.Location, Freshness: c.Freshness, Keys: c.Context.KeyOptions}
}
