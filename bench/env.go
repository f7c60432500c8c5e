package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
)

// env is one scenario's server (embedded, or a running one) and
// connections.
type env struct {
	opts  Options
	dir   string
	srv   *server.Server // nil against a running NATS
	url   string         // client URL: the running NATS, or the embedded server's listener
	tcp   bool           // the scenario's own connections use TCP (url), not in-process
	names broker.Names
	// conns are the scenario's own connections (counted in the client
	// message statistics); aux are the observer and the tap.
	conns []*nats.Conn
	aux   []*nats.Conn
	// cleanups run, newest first, before the connections close.
	cleanups []func()
}

// embeddedListen is the client listener of an embedded server that worker
// processes connect to: a free loopback port (-1; nats-server reads port 0
// as its default 4222).
const embeddedListen = "127.0.0.1:-1"

// startEnv starts an embedded server with the scenario's sync policy in a
// fresh temporary directory, with a client listener when listen is set or
// the options ask for worker processes; or, with Options.NATSURL, uses the
// running server. The scenario's own connections use TCP with worker
// processes or a running server (the connection type of the fleet being
// measured), and in-process connections otherwise.
func startEnv(o Options, scenario string, listen bool) (*env, error) {
	if o.NATSURL != "" {
		return &env{opts: o, url: o.NATSURL, tcp: true, names: broker.MustNames(o.Prefix)}, nil
	}
	dir, err := os.MkdirTemp(o.DataDir, "agentfleet-bench-"+scenario+"-*")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	cfg := broker.ServerConfig{Name: "bench-" + scenario, DataDir: dir, Sync: o.Sync}
	if listen || o.ProcessWorkers {
		cfg.Listen = embeddedListen
	}
	srv, err := broker.StartServer(cfg)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("bench: %w", err)
	}
	e := &env{opts: o, dir: dir, srv: srv, tcp: o.ProcessWorkers, names: broker.MustNames(broker.DefaultPrefix)}
	if cfg.Listen != "" {
		e.url = srv.ClientURL()
	}
	return e, nil
}

// connType names the connection type of the scenario's clients.
func (e *env) connType() string {
	if e.tcp {
		return "tcp"
	}
	return "in-process"
}

// connect opens a connection (in-process, or TCP to e.url); aux
// connections are not counted in the client statistics.
func (e *env) connect(name string, aux bool) (*nats.Conn, jetstream.JetStream, error) {
	cc := broker.ConnectConfig{Name: name, Logger: e.opts.Logger}
	if e.tcp || e.srv == nil {
		cc.URL = e.url
	} else {
		cc.InProcess = e.srv
	}
	nc, err := broker.Connect(cc)
	if err != nil {
		return nil, nil, fmt.Errorf("bench: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("bench: %w", err)
	}
	if aux {
		e.aux = append(e.aux, nc)
	} else {
		e.conns = append(e.conns, nc)
	}
	return nc, js, nil
}

// provision provisions the fleet's streams, buckets and consumer through js
// and returns handles bound to it.
func (e *env) provision(ctx context.Context, js jetstream.JetStream) (*broker.Resources, error) {
	res, err := broker.Provision(ctx, js, broker.ProvisionConfig{Names: e.names, LeaseTTL: e.opts.LeaseTTL, Replicas: e.opts.Replicas})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	return res, nil
}

// dropFleet deletes, on a running server, every stream and bucket of the
// names (the floor's temporary fleet).
func (e *env) dropFleet(js jetstream.JetStream) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := e.names
	for _, s := range []string{n.InboxStream(), n.TranscriptStream(), n.OutboxStream(), n.EventStream()} {
		_ = js.DeleteStream(ctx, s)
	}
	for _, b := range []string{n.SessionsBucket(), n.SessionIDsBucket(), n.LeasesBucket(), n.MsgIDsBucket(), n.DeliveredBucket(), n.WorkersBucket()} {
		_ = js.DeleteKeyValue(ctx, b)
	}
}

// close runs the cleanups, closes every connection and, for an embedded
// server, stops it and removes its directory.
func (e *env) close() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
	for _, nc := range append(append([]*nats.Conn(nil), e.conns...), e.aux...) {
		nc.Close()
	}
	if e.srv != nil {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
		if e.opts.KeepData {
			e.opts.Logger.Info("bench: kept the server directory", slog.String("dir", e.dir))
			fmt.Fprintf(os.Stderr, "bench: kept %s\n", e.dir)
		} else {
			_ = os.RemoveAll(e.dir)
		}
	}
}

// clientStats sums the message counters of the scenario's own connections.
func (e *env) clientStats() (in, out uint64) {
	for _, nc := range e.conns {
		s := nc.Stats()
		in += s.InMsgs
		out += s.OutMsgs
	}
	return in, out
}

// probe snapshots the process and connection counters at the edges of the
// measured window.
type probe struct {
	env     *env
	tap     *tap
	mallocs uint64
	bytes   uint64
	in, out uint64
	cpu     time.Duration
}

func (p *probe) start() {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	p.mallocs, p.bytes = ms.Mallocs, ms.TotalAlloc
	p.in, p.out = p.env.clientStats()
	p.cpu = cpuTime()
	if p.tap != nil {
		p.tap.on.Store(true)
	}
}

func (p *probe) end(r *Result) {
	if p.tap != nil {
		p.tap.on.Store(false)
	}
	cpu := cpuTime()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	in, out := p.env.clientStats()
	r.CPUPerTurn = cpu - p.cpu
	r.AllocsPerTurn = float64(ms.Mallocs - p.mallocs)
	r.BytesPerTurn = float64(ms.TotalAlloc - p.bytes)
	r.ClientMsgsInPerTurn = float64(in - p.in)
	r.ClientMsgsOutPerTurn = float64(out - p.out)
}

// perTurn divides the window totals in r by its turns.
func perTurn(r *Result, t *tap) {
	n := float64(r.Turns)
	if n == 0 {
		n = 1
	}
	r.CPUPerTurn = time.Duration(float64(r.CPUPerTurn) / n)
	r.AllocsPerTurn /= n
	r.BytesPerTurn /= n
	r.ClientMsgsInPerTurn /= n
	r.ClientMsgsOutPerTurn /= n
	if t != nil {
		r.OpsPerTurn = t.perTurn(n)
	}
}

// waitGroup waits for wg, at most d.
func waitGroup(wg *sync.WaitGroup, d time.Duration) error {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		return fmt.Errorf("still running after %s", d)
	}
}
