package main

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v2"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet"
	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/config"
	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/telemetry"
	"github.com/agentfleet/agentfleet/telemetry/provider"
	"github.com/agentfleet/agentfleet/worker"
)

// runtime is the wiring shared by the roles.
type runtime struct {
	cfg   config.Config
	log   *slog.Logger
	names broker.Names
	srv   *server.Server // embedded server, when this process runs one
	conns []*nats.Conn
	// ctx bounds the wait for NATS at start (a signal ends it); nil means
	// context.Background().
	ctx context.Context
	// metrics is the process's metric pipeline; its Metrics are nil when
	// nothing is exported.
	metrics *provider.Provider
}

// startMetrics sets up the metric pipeline of role: a Prometheus handler
// when prometheus is true, OTLP when the OTEL_EXPORTER_OTLP_* variables name
// an endpoint. With telemetry.metrics_addr set it also serves /metrics
// there until ctx ends.
func (rt *runtime) startMetrics(ctx context.Context, role string, prometheus bool, wg *sync.WaitGroup, errs chan<- error) error {
	addr := rt.cfg.Telemetry.MetricsAddr
	p, err := provider.New(ctx, provider.Config{ServiceName: "agentfleet-" + role, Version: version, Prometheus: prometheus || addr != ""})
	if err != nil {
		return err
	}
	rt.metrics = p
	if p.OTLP() != "" {
		rt.log.Info("exporting metrics over OTLP", slog.String("protocol", p.OTLP()))
	}
	if p.Traces() != "" {
		rt.log.Info("exporting traces over OTLP", slog.String("protocol", p.Traces()))
	}
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", p.Handler())
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	rt.log.Info("metrics listening", slog.String("addr", ln.Addr().String()))
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("metrics http: %w", err)
		}
	}()
	go func() {
		defer wg.Done()
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	return nil
}

// instruments are the metrics the roles record; nil records nothing.
func (rt *runtime) instruments() *telemetry.Metrics {
	if rt.metrics == nil {
		return nil
	}
	return rt.metrics.Metrics
}

// tracer is the trace pipeline of the roles; nil traces nothing.
func (rt *runtime) tracer() trace.TracerProvider {
	if rt.metrics == nil {
		return nil
	}
	return rt.metrics.Tracer
}

// metricsHandler is /metrics on the ingress address: it takes http.token
// like the other routes when one is set.
func (rt *runtime) metricsHandler() http.Handler {
	h := rt.metrics.Handler()
	token := rt.cfg.HTTP.Token
	if token == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+token)) != 1 {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (rt *runtime) context() context.Context {
	if rt.ctx == nil {
		return context.Background()
	}
	return rt.ctx
}

func newRuntime(cfg config.Config, log *slog.Logger) (*runtime, error) {
	names, err := broker.NewNames(cfg.NATS.Prefix)
	if err != nil {
		return nil, err
	}
	return &runtime{cfg: cfg, log: log, names: names}, nil
}

// connect opens a connection to the embedded server or to nats.url; an
// external server that cannot be reached yet is waited for, up to
// nats.connect_wait, with a "waiting for NATS at <url>" line per retry.
func (rt *runtime) connect(name string) (*nats.Conn, jetstream.JetStream, error) {
	cc := broker.ConnectConfig{
		URL: rt.cfg.NATS.URL, InProcess: rt.srv, Name: name,
		User: rt.cfg.NATS.User, Password: rt.cfg.NATS.Password, Token: rt.cfg.NATS.Token, Creds: rt.cfg.NATS.Creds, NKey: rt.cfg.NATS.NKey,
		TLSCA: rt.cfg.NATS.TLS.CA, TLSCert: rt.cfg.NATS.TLS.Cert, TLSKey: rt.cfg.NATS.TLS.Key, TLSInsecure: rt.cfg.NATS.TLS.InsecureSkipVerify,
		InboxPrefix: rt.cfg.NATS.InboxPrefix, Timeout: rt.cfg.NATS.ConnectTimeout.Duration(), Logger: rt.log,
	}
	if rt.srv != nil {
		// The embedded server takes in-process connections without
		// credentials or TLS (with embedded.users, as a user valid only in
		// process); the nats.* ones are for an external server (a
		// configuration file shared with the fleet's other processes).
		cc = broker.ConnectConfig{InProcess: rt.srv, Name: name, Timeout: rt.cfg.NATS.ConnectTimeout.Duration(), Logger: rt.log}
	}
	nc, err := broker.ConnectWait(rt.context(), cc, rt.cfg.NATS.ConnectWait.Duration())
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	rt.conns = append(rt.conns, nc)
	return nc, js, nil
}

// minProvisionWait is the least time provisioning retries for: a cluster
// that has just started may take that long to elect its meta leader.
const minProvisionWait = 30 * time.Second

// provision provisions the fleet's assets. While JetStream is not ready (a
// cluster electing its meta leader) it retries for nats.connect_wait (at
// least 30s); an error no retry can fix fails at once, with a hint when the
// fix is a setting.
func (rt *runtime) provision(ctx context.Context, js jetstream.JetStream) (*broker.Resources, error) {
	res, err := broker.ProvisionRetry(ctx, js, broker.ProvisionConfig{
		Names: rt.names, Replicas: rt.cfg.NATS.Replicas, LeaseTTL: rt.cfg.Lease.TTL.Duration(), InboxStreams: rt.cfg.NATS.InboxStreams,
		// up's in-process roles provision whatever nats.provision says:
		// their in-process user may.
		BindOnly: !rt.cfg.NATS.Provision && rt.srv == nil,
	}, max(minProvisionWait, rt.cfg.NATS.ConnectWait.Duration()), rt.log)
	if errors.Is(err, broker.ErrReplicasNeedCluster) {
		return nil, fmt.Errorf("nats.replicas is %d but the NATS server at %s is not part of a cluster: set nats.replicas to 1 (AGENTFLEET_NATS_REPLICAS=1), or run a 3-node cluster: %w",
			rt.cfg.NATS.Replicas, broker.RedactURL(rt.cfg.NATS.URL), err)
	}
	if err != nil {
		return nil, err
	}
	for _, w := range res.Warnings {
		rt.log.Warn("provisioning kept an existing setting", slog.String("detail", w))
	}
	return res, nil
}

func (rt *runtime) close() {
	for _, nc := range rt.conns {
		_ = nc.Drain()
	}
	for _, nc := range rt.conns {
		for i := 0; i < 200 && !nc.IsClosed(); i++ {
			time.Sleep(10 * time.Millisecond)
		}
		nc.Close()
	}
	if rt.metrics != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := rt.metrics.Shutdown(ctx); err != nil {
			rt.log.Warn("metrics shutdown", slog.Any("error", err))
		}
		cancel()
	}
	if rt.srv != nil {
		rt.srv.Shutdown()
		rt.srv.WaitForShutdown()
	}
}

// backend builds the configured agent backend from the registry.
func backend(ctx context.Context, cfg config.Config, allowCrash bool, log *slog.Logger) (agent.Backend, error) {
	if allowCrash {
		cfg.Agent.AllowCrash = true
	}
	return agentfleet.DefaultBackends().New(ctx, cfg, log)
}

func (rt *runtime) workerConfig(id string, b agent.Backend, restart bool) (worker.Config, error) {
	wc, err := agentfleet.WorkerConfig(rt.cfg, id, b, restart, rt.log)
	wc.Version = version
	wc.Metrics = rt.instruments()
	wc.TracerProvider = rt.tracer()
	return wc, err
}

// startWorkers runs n workers, each on its own connection.
func (rt *runtime) startWorkers(ctx context.Context, n int, id string, b agent.Backend, restart bool, wg *sync.WaitGroup, errs chan<- error) error {
	if n < 1 {
		return fmt.Errorf("--workers %d: want at least 1", n)
	}
	for i := 0; i < n; i++ {
		wid := id
		if n > 1 {
			wid = fmt.Sprintf("%s-%d", id, i+1)
		}
		nc, js, err := rt.connect("agentfleet-worker-" + wid)
		if err != nil {
			return err
		}
		res, err := rt.provision(ctx, js)
		if err != nil {
			return err
		}
		wc, err := rt.workerConfig(wid, b, restart)
		if err != nil {
			return err
		}
		w, err := worker.New(nc, js, res, wc)
		if err != nil {
			return err
		}
		svc, err := telemetry.AddService(nc, telemetry.ServiceConfig{Name: rt.names.ServiceName("worker"), Version: version,
			Description: "agentfleet worker: runs the turns of the lanes it owns",
			Metadata:    map[string]string{"worker_id": wid, "host": hostID()},
			Subject:     rt.names.ServiceStatusSubject("worker", session.LaneToken(wid)),
			Status:      func() any { return w.Status() }})
		if err != nil {
			return fmt.Errorf("worker %s: micro service: %w", wid, err)
		}
		unobserve, err := rt.instruments().ObserveWorker(wid, func() telemetry.WorkerGauges {
			s := w.Status()
			return telemetry.WorkerGauges{LanesOwned: s.LanesOwned, TurnsRunning: s.TurnsRunning, CacheSize: s.CacheSize, WatcherLeader: s.Watcher}
		})
		if err != nil {
			_ = svc.Stop()
			return fmt.Errorf("worker %s: gauges: %w", wid, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer unobserve() //nolint:errcheck
			defer svc.Stop()  //nolint:errcheck
			if err := w.Run(ctx); err != nil {
				errs <- fmt.Errorf("worker %s: %w", wid, err)
			}
		}()
	}
	return nil
}

// startIngress serves the HTTP adapter and runs the http delivery consumer.
func (rt *runtime) startIngress(ctx context.Context, addr string, wg *sync.WaitGroup, errs chan<- error, ready func() error) (*http.Server, error) {
	nc, js, err := rt.connect("agentfleet-ingress")
	if err != nil {
		return nil, err
	}
	res, err := rt.provision(ctx, js)
	if err != nil {
		return nil, err
	}
	keys := rt.cfg.KeyOptions()
	if rt.cfg.WhatsApp.MappingDir != "" {
		keys.WhatsApp = session.NewWhatsAppResolver(rt.cfg.WhatsApp.MappingDir)
	}
	var scoped []ingress.ScopedToken
	if f := rt.cfg.HTTP.ScopedTokensFile; f != "" {
		if scoped, err = ingress.LoadScopedTokens(f); err != nil {
			return nil, err
		}
	}
	srv, err := ingress.New(js, res, ingress.Config{Names: rt.names, KeyOptions: keys, Token: rt.cfg.HTTP.Token,
		ScopedTokens: scoped, MaxBodyBytes: int64(rt.cfg.HTTP.MaxBodyBytes), MaxReadersPerClient: rt.cfg.HTTP.MaxReadersPerClient, Logger: rt.log,
		TracerProvider: rt.tracer()})
	if err != nil {
		return nil, err
	}
	srv.SetReady(func() error {
		if !nc.IsConnected() {
			return errors.New("nats not connected")
		}
		if ready != nil {
			return ready()
		}
		return nil
	})
	del := ingress.NewDelivery(js, res, rt.names, rt.log)
	del.SetBackoff(rt.cfg.Delivery.Backoff.Duration())
	del.SetMetrics(rt.instruments())
	del.SetTracerProvider(rt.tracer())
	// Backlog, ack pending and redeliveries of the fleet's consumers.
	// Every inbox stream the map names now (a migration changes them).
	states := func(ctx context.Context) ([]telemetry.ConsumerState, error) {
		var streams []string
		for _, in := range res.Inboxes.All() {
			streams = append(streams, in.Name)
		}
		streams = append(streams, rt.names.OutboxStream())
		return telemetry.ConsumerStates(js, streams...)(ctx)
	}
	if _, err := rt.instruments().ObserveConsumers(states); err != nil {
		return nil, err
	}
	if err := del.Start(ctx); err != nil {
		return nil, err
	}
	plats, err := rt.startPlatforms(ctx, js, res, srv.Publisher(), wg)
	if err != nil {
		del.Stop()
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		del.Stop()
		plats.stop()
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("http listen %s: the address is in use (by another process, another agentfleet up or ingress?, or by this one's metrics address): "+
				"stop it, or listen elsewhere with --http (http.addr): %w", addr, err)
		}
		return nil, fmt.Errorf("http listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	if rt.metrics != nil && rt.metrics.Handler() != nil {
		mux.Handle("GET /metrics", rt.metricsHandler())
	}
	mux.Handle("/", plats.handler(srv.Handler()))
	// A server span per request, the webhooks' included.
	hs := &http.Server{Handler: telemetry.HTTPHandler(rt.tracer(), mux), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	rt.log.Info("http listening", slog.String("addr", ln.Addr().String()))
	instance := fmt.Sprintf("%s-%d", hostID(), os.Getpid())
	svc, err := telemetry.AddService(nc, telemetry.ServiceConfig{Name: rt.names.ServiceName("ingress"), Version: version,
		Description: "agentfleet ingress: the HTTP adapter and the reply delivery",
		Metadata:    map[string]string{"http_addr": ln.Addr().String(), "host": hostID()},
		Subject:     rt.names.ServiceStatusSubject("ingress", session.LaneToken(instance)),
		Status: func() any {
			return map[string]any{"http_addr": ln.Addr().String(), "nats_connected": nc.IsConnected()}
		}})
	if err != nil {
		_ = ln.Close()
		del.Stop()
		plats.stop()
		return nil, fmt.Errorf("ingress micro service: %w", err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("http: %w", err)
		}
	}()
	// Serve returns as soon as Shutdown begins: the shutdown itself is
	// waited for too, so requests in flight get their answers (and the
	// delivery its last ack) before the connections and the server close.
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = svc.Stop()
		srv.Close()
		_ = hs.Shutdown(sctx)
		del.Stop()
		plats.stop()
	}()
	return hs, nil
}

// metricsFlag serves Prometheus metrics on a separate address.
var metricsFlag = &cli.StringFlag{Name: "metrics", Usage: "serve Prometheus metrics at /metrics on `ADDR` (telemetry.metrics_addr)"}

func hostID() string {
	h, _ := os.Hostname()
	return strings.ReplaceAll(h, ".", "-")
}

func upCommand() *cli.Command {
	return &cli.Command{
		Name:  "up",
		Usage: "run everything in one process on an embedded NATS server",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "data", Usage: "data `DIR` (embedded.data_dir)"},
			&cli.StringFlag{Name: "http", Usage: "HTTP listen `ADDR` (http.addr)", DefaultText: config.DefaultHTTPAddr},
			allowUnauthenticatedFlag,
			&cli.StringFlag{Name: "nats-listen", Usage: "also open a NATS client port on `ADDR` (embedded.listen)"},
			&cli.StringFlag{Name: "nats-users", Usage: "users `FILE` of the NATS port, with per-role permissions (embedded.users)"},
			&cli.StringFlag{Name: "nats-monitor", Usage: "serve the NATS monitoring endpoints (/varz, /jsz) on `ADDR` (embedded.monitor)"},
			&cli.IntFlag{Name: "workers", Value: 2, Usage: "worker loops in this process"},
			&cli.StringFlag{Name: "agent", Usage: "agent backend `NAME` (agent.backend)"},
			&cli.BoolFlag{Name: "allow-crash", Usage: "let the echo agent's !crash directive exit the process"},
			metricsFlag,
		},
		Action: func(c *cli.Context) error {
			cfg, src, err := loadConfigSourced(c, map[string]string{"data": "embedded.data_dir", "http": "http.addr", "nats-listen": "embedded.listen",
				"nats-users": "embedded.users", "nats-monitor": "embedded.monitor", "agent": "agent.backend", "metrics": "telemetry.metrics_addr"})
			if err != nil {
				return err
			}
			if err := cfg.CheckUp(src); err != nil {
				return err
			}
			if c.Int("workers") < 1 {
				return fmt.Errorf("--workers %d: want at least 1", c.Int("workers"))
			}
			log := newLogger(cfg, "up")
			if from := src.Of("nats.url"); from != "" {
				log.Info("nats.url is not used by up: it runs its own embedded NATS server, which other processes reach at embedded.listen (--nats-listen)",
					slog.String("url", broker.RedactURL(cfg.NATS.URL)), slog.String("from", from), slog.String("embedded_listen", cfg.Embedded.Listen))
			}
			rt, err := newRuntime(cfg, log)
			if err != nil {
				return err
			}
			b, err := backend(c.Context, cfg, c.Bool("allow-crash"), log)
			if err != nil {
				return err
			}
			defer b.Close() // after the workers stopped: waitRoles waits for them
			scfg, err := serverConfig(cfg)
			if err != nil {
				return err
			}
			scfg.DataDir, scfg.Listen = cfg.Embedded.DataDir, cfg.Embedded.Listen
			srv, err := broker.StartServer(scfg)
			if err != nil {
				return err
			}
			rt.srv = srv
			defer rt.close()
			if cfg.Embedded.Listen != "" {
				log.Info("nats listening", slog.String("url", srv.ClientURL()), slog.Int("users", len(scfg.Users)), slog.Bool("tls", scfg.TLSCert != ""))
			}
			if a := srv.MonitorAddr(); a != nil {
				log.Info("nats monitoring", slog.String("url", "http://"+a.String()))
			}
			ctx, stop := signalContext(log)
			defer stop()
			var wg sync.WaitGroup
			errs := make(chan error, 16)
			if err := rt.startMetrics(ctx, "up", true, &wg, errs); err != nil {
				return abortStart(ctx, stop, &wg, err)
			}
			var provisioned atomic.Bool
			if _, err := rt.startIngress(ctx, cfg.HTTP.Addr, &wg, errs, func() error {
				if !provisioned.Load() {
					return errors.New("provisioning")
				}
				return nil
			}); err != nil {
				return abortStart(ctx, stop, &wg, err)
			}
			if err := rt.startWorkers(ctx, c.Int("workers"), cfg.Worker.ID, b, false, &wg, errs); err != nil {
				return abortStart(ctx, stop, &wg, err)
			}
			if err := rt.startIndexer(ctx, upIndexerPath(cfg.Indexer.DB, cfg.Embedded.DataDir), false, &wg, errs); err != nil {
				return abortStart(ctx, stop, &wg, err)
			}
			provisioned.Store(true)
			log.Info("agentfleet up", slog.String("http", cfg.HTTP.Addr), slog.Int("workers", c.Int("workers")), slog.String("data", cfg.Embedded.DataDir))
			return waitRoles(ctx, stop, &wg, errs)
		},
	}
}

// waitRoles waits for a signal or a failing role, then for every role to stop.
// abortStart stops what a role started before it failed to start. A
// signal that arrived during the start (provisioning can take a while) is a
// clean stop, not a failure.
func abortStart(ctx context.Context, stop func(), wg *sync.WaitGroup, err error) error {
	interrupted := ctx.Err() != nil
	stop()
	wg.Wait()
	if interrupted {
		return nil
	}
	return err
}

func waitRoles(ctx context.Context, stop func(), wg *sync.WaitGroup, errs chan error) error {
	var first error
	select {
	case <-ctx.Done():
	case first = <-errs:
		stop()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if first == nil {
			first = err
		}
	}
	return first
}

func natsCommand() *cli.Command {
	return &cli.Command{
		Name:  "nats",
		Usage: "run one plain NATS server node with JetStream, standalone or clustered",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "listen", Usage: "client listen `ADDR` (embedded.listen)", DefaultText: natsDefaultListen},
			&cli.StringFlag{Name: "data", Usage: "JetStream store `DIR` (embedded.data_dir)", DefaultText: natsDefaultData},
			&cli.StringFlag{Name: "name", Usage: "server name (defaults to the host name)"},
			&cli.StringFlag{Name: "sync", Usage: "fsync policy: default, always or a duration (embedded.sync)"},
			&cli.StringFlag{Name: "cluster-name", Usage: "cluster `NAME`"},
			&cli.StringFlag{Name: "cluster-listen", Usage: "cluster route listen `ADDR`"},
			&cli.StringFlag{Name: "routes", Usage: "comma-separated route `URLS` (nats-route://host:port)"},
			&cli.StringFlag{Name: "users", Usage: "users `FILE`: clients must log in, and get their role's permissions (embedded.users)"},
			&cli.StringFlag{Name: "monitor", Usage: "serve the monitoring endpoints (/varz, /jsz, /healthz) on `ADDR` (embedded.monitor)"},
			&cli.StringFlag{Name: "tls-cert", Usage: "PEM server certificate `FILE`: TLS connections only (embedded.tls.cert)"},
			&cli.StringFlag{Name: "tls-key", Usage: "PEM key `FILE` of --tls-cert (embedded.tls.key)"},
			&cli.StringFlag{Name: "tls-ca", Usage: "PEM CA `FILE`: clients must present a certificate it signed (embedded.tls.ca)"},
		},
		Action: func(c *cli.Context) error {
			cfg, src, err := loadConfigSourced(c, map[string]string{"sync": "embedded.sync", "listen": "embedded.listen", "data": "embedded.data_dir",
				"users": "embedded.users", "monitor": "embedded.monitor", "tls-cert": "embedded.tls.cert", "tls-key": "embedded.tls.key", "tls-ca": "embedded.tls.ca"})
			if err != nil {
				return err
			}
			listen, data := natsNodeAddrs(cfg, src)
			log := newLogger(cfg, "nats")
			var routes []string
			if r := c.String("routes"); r != "" {
				routes = strings.Split(r, ",")
			}
			scfg, err := serverConfig(cfg)
			if err != nil {
				return err
			}
			scfg.Name, scfg.DataDir, scfg.Listen = c.String("name"), data, listen
			scfg.ClusterName, scfg.ClusterListen, scfg.Routes = c.String("cluster-name"), c.String("cluster-listen"), routes
			// A node's own log (routes, elections, stream leaders) is
			// what an operator reads when a cluster misbehaves.
			scfg.Debug = true
			srv, err := broker.StartServer(scfg)
			if err != nil {
				return err
			}
			log.Info("nats node up", slog.String("url", srv.ClientURL()), slog.String("data", data), slog.String("sync", cfg.Embedded.Sync), slog.String("cluster", c.String("cluster-name")),
				slog.Int("users", len(scfg.Users)), slog.Bool("tls", scfg.TLSCert != ""))
			if a := srv.MonitorAddr(); a != nil {
				log.Info("nats monitoring", slog.String("url", "http://"+a.String()))
			}
			ctx, stop := signalContext(log)
			defer stop()
			<-ctx.Done()
			srv.Shutdown()
			srv.WaitForShutdown()
			log.Info("nats node stopped")
			return nil
		},
	}
}

// serverConfig is the embedded server's security and sync settings:
// embedded.users (read and checked now), embedded.tls.*, embedded.monitor.
func serverConfig(cfg config.Config) (broker.ServerConfig, error) {
	sc := broker.ServerConfig{Sync: cfg.Embedded.Sync, Prefix: cfg.NATS.Prefix, Monitor: cfg.Embedded.Monitor,
		TLSCert: cfg.Embedded.TLS.Cert, TLSKey: cfg.Embedded.TLS.Key, TLSCA: cfg.Embedded.TLS.CA}
	if f := cfg.Embedded.Users; f != "" {
		users, err := broker.LoadUsers(f)
		if err != nil {
			return sc, err
		}
		sc.Users = users
	}
	return sc, nil
}

// The defaults of `agentfleet nats` where the configuration sets nothing:
// unlike up's in-process server, a plain node always listens, and it keeps
// its store apart from up's ./data.
const (
	natsDefaultListen = "127.0.0.1:4222"
	natsDefaultData   = "./data/nats"
)

// natsNodeAddrs returns the listen address and the store of `agentfleet
// nats`: embedded.listen and embedded.data_dir when a flag, a variable or
// the file sets them, else the node's own defaults.
func natsNodeAddrs(cfg config.Config, src config.Sources) (listen, data string) {
	listen, data = cfg.Embedded.Listen, cfg.Embedded.DataDir
	if src.Of("embedded.listen") == "" || listen == "" {
		listen = natsDefaultListen
	}
	if src.Of("embedded.data_dir") == "" {
		data = natsDefaultData
	}
	return listen, data
}

func workerCommand() *cli.Command {
	return &cli.Command{
		Name:  "worker",
		Usage: "run worker loops against NATS (nats.url)",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "id", Usage: "worker `ID` (worker.id)"},
			&cli.StringFlag{Name: "agent", Usage: "agent backend `NAME` (agent.backend)"},
			&cli.IntFlag{Name: "workers", Value: 1, Usage: "worker loops in this process"},
			&cli.BoolFlag{Name: "allow-crash", Usage: "let the echo agent's !crash directive exit the process"},
			&cli.BoolFlag{Name: "restart", Usage: "a graceful stop of this process is a restart (resume reason restart_timeout)"},
			metricsFlag,
		}, natsFlags()...),
		Action: func(c *cli.Context) error {
			if c.Int("workers") < 1 {
				return fmt.Errorf("--workers %d: want at least 1", c.Int("workers"))
			}
			cfg, err := loadConfig(c, map[string]string{"id": "worker.id", "agent": "agent.backend", "metrics": "telemetry.metrics_addr"})
			if err != nil {
				return err
			}
			log := newLogger(cfg, "worker")
			rt, err := newRuntime(cfg, log)
			if err != nil {
				return err
			}
			defer rt.close()
			b, err := backend(c.Context, cfg, c.Bool("allow-crash"), log)
			if err != nil {
				return err
			}
			defer b.Close() // after the workers stopped: waitRoles waits for them
			ctx, stop := signalContext(log)
			defer stop()
			rt.ctx = ctx
			var wg sync.WaitGroup
			errs := make(chan error, 16)
			if err := rt.startMetrics(ctx, "worker", false, &wg, errs); err != nil {
				return abortStart(ctx, stop, &wg, err)
			}
			if err := rt.startWorkers(ctx, c.Int("workers"), cfg.Worker.ID, b, c.Bool("restart"), &wg, errs); err != nil {
				return abortStart(ctx, stop, &wg, err)
			}
			return waitRoles(ctx, stop, &wg, errs)
		},
	}
}

func ingressCommand() *cli.Command {
	return &cli.Command{
		Name:  "ingress",
		Usage: "serve the ingress adapters and run the delivery consumers against NATS (nats.url)",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "http", Usage: "HTTP listen `ADDR` (http.addr)", DefaultText: config.DefaultHTTPAddr},
			allowUnauthenticatedFlag,
		}, natsFlags()...),
		Action: func(c *cli.Context) error {
			cfg, src, err := loadConfigSourced(c, map[string]string{"http": "http.addr"})
			if err != nil {
				return err
			}
			if err := cfg.CheckHTTP(src); err != nil {
				return err
			}
			log := newLogger(cfg, "ingress")
			rt, err := newRuntime(cfg, log)
			if err != nil {
				return err
			}
			defer rt.close()
			ctx, stop := signalContext(log)
			defer stop()
			rt.ctx = ctx
			var wg sync.WaitGroup
			errs := make(chan error, 16)
			if err := rt.startMetrics(ctx, "ingress", true, &wg, errs); err != nil {
				return abortStart(ctx, stop, &wg, err)
			}
			if _, err := rt.startIngress(ctx, cfg.HTTP.Addr, &wg, errs, nil); err != nil {
				return abortStart(ctx, stop, &wg, err)
			}
			return waitRoles(ctx, stop, &wg, errs)
		},
	}
}

func provisionCommand() *cli.Command {
	return &cli.Command{
		Name:  "provision",
		Usage: "create or update the fleet's streams, buckets and workers consumer on NATS (nats.url), then exit",
		Description: "Every role provisions at start unless nats.provision is false. Roles that run as least-privilege\n" +
			"NATS users (docs/security.md) may not create streams: run this once, and after each upgrade, as a\n" +
			"user of role admin, and give the other roles nats.provision false.",
		Flags: natsFlags(),
		Action: func(c *cli.Context) error {
			cfg, err := loadConfig(c, nil)
			if err != nil {
				return err
			}
			cfg.NATS.Provision = true
			log := newLogger(cfg, "provision")
			rt, err := newRuntime(cfg, log)
			if err != nil {
				return err
			}
			defer rt.close()
			ctx, stop := signalContext(log)
			defer stop()
			rt.ctx = ctx
			_, js, err := rt.connect("agentfleet-provision")
			if err != nil {
				return err
			}
			res, err := rt.provision(ctx, js)
			if err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "provisioned prefix %s: streams %s %s %s %s %s, consumer %s\n", rt.names.Prefix(),
				res.Inbox.CachedInfo().Config.Name, res.Transcripts.CachedInfo().Config.Name, res.Outbox.CachedInfo().Config.Name,
				res.Events.CachedInfo().Config.Name, res.Probe.CachedInfo().Config.Name, res.Consumer.CachedInfo().Name)
			return nil
		},
	}
}

func natsPermissionsCommand() *cli.Command {
	return &cli.Command{
		Name:  "nats-permissions",
		Usage: "print the nats-server configuration of a user of a role, with its least-privilege permissions, for an external server",
		Description: "The entry goes in the users list of the server's authorization block (or of the account holding\n" +
			"the fleet). The embedded server (embedded.users) gives its users the same permissions. Roles: " + strings.Join(broker.Roles(), ", ") + ".\n" +
			"The prefix is nats.prefix.",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "role", Usage: "`ROLE` to print (repeat for several); default all but system"},
			&cli.StringFlag{Name: "user", Usage: "user `NAME` (default: the role's name)"},
			&cli.StringFlag{Name: "password", Value: "$2a$11$REPLACE-WITH-nats-server-passwd-OUTPUT", Usage: "password or bcrypt `HASH` to print"},
			&cli.StringFlag{Name: "nkey", Usage: "nkey public `KEY` (U...) instead of user and password"},
			&cli.StringFlag{Name: "inbox-prefix", Usage: "the role's nats.inbox_prefix `PREFIX` (default _INBOX)"},
		},
		Action: func(c *cli.Context) error {
			cfg, err := loadConfig(c, nil)
			if err != nil {
				return err
			}
			names, err := broker.NewNames(cfg.NATS.Prefix)
			if err != nil {
				return err
			}
			roles := c.StringSlice("role")
			if len(roles) == 0 {
				for _, r := range broker.Roles() {
					if r != broker.RoleSystem {
						roles = append(roles, r)
					}
				}
			}
			for _, role := range roles {
				user := c.String("user")
				if user == "" {
					user = role
				}
				out, err := broker.RenderUser(role, names, c.String("inbox-prefix"), user, c.String("password"), c.String("nkey"))
				if err != nil {
					return err
				}
				fmt.Fprint(c.App.Writer, out)
			}
			return nil
		},
	}
}
