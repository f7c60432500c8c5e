package worker

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/config"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/telemetry"
)

// Busy modes: what a message arriving during a running turn does.
const (
	BusyInterrupt = config.BusyInterrupt
	BusyQueue     = config.BusyQueue
	BusySteer     = config.BusySteer
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
	// LeaseTTL is the lane lease TTL, judged by the server. Defaults to
	// lease.ttl's default (broker.DefaultLeaseTTL).
	LeaseTTL time.Duration
	// LeaseMargin is how long before its lease could expire an owner stops
	// writing. Defaults to lease.margin's default (and at most LeaseTTL/3).
	LeaseMargin time.Duration
	// LivenessTTL is the TTL of the worker's liveness lease, to which its
	// lane leases are bound. Defaults to lease.liveness_ttl's default
	// (broker.DefaultLivenessTTL).
	LivenessTTL time.Duration
	// Linger is how long an idle lane stays owned so follow-ups meet a warm
	// cache. Defaults to worker.linger's default.
	Linger time.Duration
	// PeekInterval is how often a lingering lane re-reads its inbox even
	// without a hint. Defaults to 2s.
	PeekInterval time.Duration
	// MaxLanes bounds the lanes owned at once. Defaults to worker.lanes's default.
	MaxLanes int
	// MaxTurns bounds the turns running at once. Defaults to worker.turns's default.
	MaxTurns int
	// MaxTurnMessages and MaxTurnBytes cap one turn. Default to the
	// configuration's worker.max_turn_messages and worker.max_turn_bytes.
	MaxTurnMessages int
	MaxTurnBytes    int
	// BusyMode is the default busy mode of lanes. Defaults to
	// worker.busy_mode's default.
	BusyMode string
	// CollectWindow keeps a burst of follow-ups together after an interrupt.
	// Defaults to 200ms.
	CollectWindow time.Duration
	// GatewayTimeout bounds one agent run. Defaults to
	// agent.gateway_timeout's default.
	GatewayTimeout time.Duration
	// Freshness is agent.gateway_auto_continue_freshness, with its default.
	Freshness time.Duration
	// DrainTimeout is how long a graceful stop waits for running turns.
	// Defaults to agent.restart_drain_timeout's default.
	DrainTimeout time.Duration
	// StoreRetryBudget is how long the owner of a turn whose writes fail
	// retries it in place without counting the attempts as interrupted
	// (a store outage, a partition from NATS). A turn whose writes fail
	// for longer is counted again, and dead-lettered after
	// MaxInterruptedTurns, so that it ends. Defaults to 5m.
	StoreRetryBudget time.Duration
	// Restart marks a graceful stop as a restart (resume reason
	// restart_timeout instead of shutdown_timeout).
	Restart bool
	// Reset resolves reset policies. Defaults to session.DefaultResetPolicy everywhere.
	Reset session.ResetConfig
	// Location is the zone of at_hour. Defaults to time.Local.
	Location *time.Location
	// Context configures the session context prompt.
	Context session.ContextOptions
	// CacheSize and CacheIdleTTL bound the agent cache. Default to the
	// configuration's worker.cache_size and worker.cache_idle_ttl.
	CacheSize    int
	CacheIdleTTL time.Duration
	// WatchInterval is how often the expiry watcher's leader sweeps for
	// expired sessions and stranded lanes. Defaults to 5m.
	WatchInterval time.Duration
	// BacklogInterval is how often the expiry watcher's leader counts the
	// inbox backlog of every partition for the agentfleet.inbox.backlog
	// gauge (backlog.go). Defaults to 15s.
	BacklogInterval time.Duration
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

	// inboxCheck changes the inbox streams' identity check (tests).
	inboxCheck inboxCheckConfig
}

// inboxCheckConfig sets the inbox streams' identity check (watchInboxes):
// its average periods while the worker follows the streams' advisories
// (live) and while it cannot (poll), and whether it follows them.
type inboxCheckConfig struct {
	live, poll   time.Duration
	noAdvisories bool
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
	// The defaults of the knobs the configuration file has are the
	// configuration's own (config.Default), so each lives in one place;
	// the others are the worker's alone.
	d := config.Default()
	def := func(p *time.Duration, v time.Duration) {
		if *p <= 0 {
			*p = v
		}
	}
	defInt := func(p *int, v int) {
		if *p <= 0 {
			*p = v
		}
	}
	def(&out.LeaseTTL, d.Lease.TTL.Duration())
	def(&out.LeaseMargin, d.Lease.Margin.Duration())
	def(&out.LivenessTTL, d.Lease.LivenessTTL.Duration())
	if out.LeaseMargin > out.LeaseTTL/3 {
		out.LeaseMargin = out.LeaseTTL / 3
	}
	def(&out.Linger, d.Worker.Linger.Duration())
	def(&out.GatewayTimeout, d.Agent.GatewayTimeout.Duration())
	def(&out.Freshness, d.Agent.GatewayAutoContinueFreshness.Duration())
	def(&out.DrainTimeout, d.Agent.RestartDrainTimeout.Duration())
	def(&out.CacheIdleTTL, d.Worker.CacheIdleTTL.Duration())
	defInt(&out.MaxLanes, d.Worker.Lanes)
	defInt(&out.MaxTurns, d.Worker.Turns)
	defInt(&out.MaxTurnMessages, d.Worker.MaxTurnMessages)
	defInt(&out.MaxTurnBytes, d.Worker.MaxTurnBytes)
	defInt(&out.CacheSize, d.Worker.CacheSize)
	def(&out.PeekInterval, 2*time.Second)
	def(&out.CollectWindow, 200*time.Millisecond)
	def(&out.WatchInterval, 5*time.Minute)
	def(&out.BacklogInterval, 15*time.Second)
	def(&out.StoreRetryBudget, 5*time.Minute)
	def(&out.PruneInterval, time.Hour)
	def(&out.inboxCheck.live, inboxCheckLive)
	def(&out.inboxCheck.poll, inboxCheckPoll)
	if out.BusyMode == "" {
		out.BusyMode = d.Worker.BusyMode
	}
	switch out.BusyMode {
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
