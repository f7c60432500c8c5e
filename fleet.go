package agentfleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/config"
	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/worker"
)

// Options configure a Worker.
type Options struct {
	// Settings are the fleet's settings (lease, worker, agent, reset
	// policy, ...), as config.Load returns them. Defaults to
	// config.Default(). Settings.Agent.Backend is not used: Backend is.
	Settings *config.Config
	// Backend runs the turns. Required. The worker never closes it: close
	// it after Run returned.
	Backend agent.Backend
	// ID names the worker in leases and logs. Defaults to
	// Settings.Worker.ID, else "<hostname>-<pid>".
	ID string
	// Restart says the process stops to be restarted (the drain then tells
	// the agent's next attempt "restart", not "shutdown"). Defaults to false.
	Restart bool
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// Worker runs turns of the fleet's lanes with a Backend, on one NATS
// connection. Start as many as you like, in as many processes as you like:
// each lane is handled by one of them at a time.
type Worker struct {
	w *worker.Worker
}

// NewWorker provisions the fleet's streams, buckets and consumers on nc if
// they are missing (idempotent: every process may do it) and returns a
// worker ready to Run.
func NewWorker(ctx context.Context, nc *nats.Conn, opts Options) (*Worker, error) {
	if opts.Backend == nil {
		return nil, errors.New("agentfleet: Options.Backend is required")
	}
	s, js, res, err := prepare(ctx, nc, opts.Settings)
	if err != nil {
		return nil, err
	}
	id := opts.ID
	if id == "" {
		id = s.Worker.ID
	}
	if id == "" {
		id = config.DefaultWorkerID()
	}
	wc, err := WorkerConfig(s, id, opts.Backend, opts.Restart, opts.Logger)
	if err != nil {
		return nil, err
	}
	w, err := worker.New(nc, js, res, wc)
	if err != nil {
		return nil, err
	}
	return &Worker{w: w}, nil
}

// Run runs the worker until ctx is done, then stops it gracefully: running
// turns get the drain timeout (agent.restart_drain_timeout) to finish, and
// what is left is handed over to other workers. It returns once stopped.
func (w *Worker) Run(ctx context.Context) error { return w.w.Run(ctx) }

// WorkerConfig is the worker configuration the fleet's settings describe,
// for worker id and backend b: what the agentfleet command runs.
func WorkerConfig(s config.Config, id string, b agent.Backend, restart bool, log *slog.Logger) (worker.Config, error) {
	names, err := broker.NewNames(s.NATS.Prefix)
	if err != nil {
		return worker.Config{}, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	keys := s.KeyOptions()
	if s.WhatsApp.MappingDir != "" {
		keys.WhatsApp = session.NewWhatsAppResolver(s.WhatsApp.MappingDir)
	}
	return worker.Config{
		ID: id, Names: names, Backend: b,
		LeaseTTL: s.Lease.TTL.Duration(), LeaseMargin: s.Lease.Margin.Duration(), LivenessTTL: s.Lease.LivenessTTL.Duration(),
		Linger: s.Worker.Linger.Duration(), MaxLanes: s.Worker.Lanes, MaxTurns: s.Worker.Turns,
		MaxTurnMessages: s.Worker.MaxTurnMessages, MaxTurnBytes: s.Worker.MaxTurnBytes, BusyMode: s.Worker.BusyMode,
		GatewayTimeout: s.Agent.GatewayTimeout.Duration(), Freshness: s.Agent.GatewayAutoContinueFreshness.Duration(),
		DrainTimeout: s.Agent.RestartDrainTimeout.Duration(), Restart: restart,
		Reset: s.ResetConfig(), Location: s.Location(),
		Context: session.ContextOptions{KeyOptions: keys, RedactPII: s.Privacy.RedactPII,
			// The platforms this deployment delivers to.
			ConnectedPlatforms: s.ConnectedPlatforms()},
		MaxAgeDays: s.SessionStoreMaxAgeDays,
		CacheSize:  s.Worker.CacheSize, CacheIdleTTL: s.Worker.CacheIdleTTL.Duration(),
		Logger: log,
	}, nil
}

// HTTPOptions configure an HTTP adapter.
type HTTPOptions struct {
	// Settings as for Options; the http.* settings count (token, body size).
	// Defaults to config.Default().
	Settings *config.Config
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// HTTP is the HTTP adapter (POST /v1/messages, the replies, their event
// stream; docs in README) with the delivery of its replies.
type HTTP struct {
	srv *ingress.Server
	del *ingress.Delivery
}

// NewHTTP provisions the fleet on nc if needed (as NewWorker) and starts
// the delivery of HTTP replies. Serve Handler; Close when done.
func NewHTTP(ctx context.Context, nc *nats.Conn, opts HTTPOptions) (*HTTP, error) {
	s, js, res, err := prepare(ctx, nc, opts.Settings)
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	names, _ := broker.NewNames(s.NATS.Prefix) // checked by prepare
	keys := s.KeyOptions()
	if s.WhatsApp.MappingDir != "" {
		keys.WhatsApp = session.NewWhatsAppResolver(s.WhatsApp.MappingDir)
	}
	var scoped []ingress.ScopedToken
	if f := s.HTTP.ScopedTokensFile; f != "" {
		if scoped, err = ingress.LoadScopedTokens(f); err != nil {
			return nil, err
		}
	}
	srv, err := ingress.New(js, res, ingress.Config{Names: names, KeyOptions: keys, Token: s.HTTP.Token,
		ScopedTokens: scoped, MaxBodyBytes: int64(s.HTTP.MaxBodyBytes), Logger: log})
	if err != nil {
		return nil, err
	}
	srv.SetReady(func() error {
		if !nc.IsConnected() {
			return errors.New("nats not connected")
		}
		return nil
	})
	del := ingress.NewDelivery(js, res, names, log)
	del.SetBackoff(s.Delivery.Backoff.Duration())
	if err := del.Start(context.WithoutCancel(ctx)); err != nil {
		srv.Close()
		return nil, err
	}
	return &HTTP{srv: srv, del: del}, nil
}

// Handler serves the HTTP API.
func (h *HTTP) Handler() http.Handler { return h.srv.Handler() }

// Close ends the event streams and long polls and stops the delivery.
// Shut your http.Server down first, so requests in flight get answers.
func (h *HTTP) Close() {
	h.srv.Close()
	h.del.Stop()
}

// prepare checks the settings and provisions the fleet on nc.
func prepare(ctx context.Context, nc *nats.Conn, settings *config.Config) (config.Config, jetstream.JetStream, *broker.Resources, error) {
	s := config.Default()
	if settings != nil {
		s = *settings
	}
	if err := s.Validate(); err != nil {
		return s, nil, nil, fmt.Errorf("agentfleet: settings: %w", err)
	}
	names, err := broker.NewNames(s.NATS.Prefix)
	if err != nil {
		return s, nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return s, nil, nil, err
	}
	res, err := broker.Provision(ctx, js, broker.ProvisionConfig{Names: names, Replicas: s.NATS.Replicas, LeaseTTL: s.Lease.TTL.Duration(),
		InboxStreams: s.NATS.InboxStreams, BindOnly: !s.NATS.Provision})
	if err != nil {
		return s, nil, nil, fmt.Errorf("agentfleet: provision: %w", err)
	}
	return s, js, res, nil
}
