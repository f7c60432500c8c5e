package natstest

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	host = "127.0.0.1"

	// readyTimeout bounds how long a server may take to accept connections.
	readyTimeout = 10 * time.Second
)

// seq makes server and cluster names unique within the test binary; the pid
// makes them unique across test binaries running at the same time.
var seq atomic.Uint64

func uniqueName(kind string) string {
	return fmt.Sprintf("natstest-%d-%s%d", os.Getpid(), kind, seq.Add(1))
}

// Option configures RunServer and RunCluster.
type Option func(*config)

type config struct {
	storeDir   string
	port       int
	portSet    bool
	syncAlways bool
	serverName string
	user, pass string
	modify     func(*server.Options)
}

func newConfig(opts []Option) *config {
	cfg := &config{}
	for _, o := range opts {
		o(cfg)
	}
	return cfg
}

// WithStoreDir puts the JetStream data in dir instead of a fresh t.TempDir(), so
// that a test can start a new server over the data of an earlier one. RunCluster
// gives node i the subdirectory dir/n<i>.
func WithStoreDir(dir string) Option {
	return func(c *config) { c.storeDir = dir }
}

// WithPort makes RunServer listen for clients on port instead of a random one.
// RunCluster does not accept it: it picks the client ports of its nodes itself.
func WithPort(port int) Option {
	return func(c *config) { c.port, c.portSet = port, true }
}

// WithSyncAlways makes the file store fsync after every write (server option
// SyncAlways), for tests about durability across crashes. It is slower.
func WithSyncAlways() Option {
	return func(c *config) { c.syncAlways = true }
}

// WithServerName sets the server name. In RunCluster it is the cluster name, and
// node i is called <name>-n<i>. By default names are unique per call.
func WithServerName(name string) Option {
	return func(c *config) { c.serverName = name }
}

// WithUser makes a standalone server require this user and password of
// every client (Connect then needs nats.UserInfo). RunCluster ignores it.
func WithUser(user, password string) Option {
	return func(c *config) { c.user, c.pass = user, password }
}

// WithServerOptions lets a test change the options of a standalone server
// (accounts, users and their permissions, limits) each time it starts.
// RunCluster ignores it.
func WithServerOptions(modify func(*server.Options)) Option {
	return func(c *config) { c.modify = modify }
}

// Server is an in-process nats-server with JetStream. The embedded *server.Server
// is the running instance; Restart replaces it.
type Server struct {
	*server.Server

	// StoreDir is the JetStream store directory; it survives Restart.
	StoreDir string

	name       string
	port       int // client port; -1 until the first start resolves it
	syncAlways bool
	user, pass string
	modify     func(*server.Options)

	// Cluster settings; zero for a standalone server.
	clusterName string
	routePort   int
	routes      []*url.URL

	log *serverLogger
}

// RunServer starts a standalone nats-server with JetStream on 127.0.0.1 and waits
// until it accepts connections. The server is shut down at the end of the test.
func RunServer(t testing.TB, opts ...Option) *Server {
	t.Helper()
	cfg := newConfig(opts)
	s := &Server{
		StoreDir:   cfg.storeDir,
		name:       cfg.serverName,
		port:       server.RANDOM_PORT,
		syncAlways: cfg.syncAlways,
		user:       cfg.user,
		pass:       cfg.pass,
		modify:     cfg.modify,
	}
	if s.StoreDir == "" {
		s.StoreDir = t.TempDir()
	}
	if s.name == "" {
		s.name = uniqueName("s")
	}
	if cfg.portSet {
		s.port = cfg.port
	}
	t.Cleanup(s.shutdown)
	if err := s.start(); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	return s
}

// options builds fresh server options; the server writes resolved ports into
// the struct it is given, so it is never reused.
func (s *Server) options() *server.Options {
	verbose, _, _ := logLevel()
	o := &server.Options{
		ServerName: s.name,
		Host:       host,
		Port:       s.port,
		JetStream:  true,
		StoreDir:   s.StoreDir,
		SyncAlways: s.syncAlways,
		NoLog:      !verbose,
		NoSigs:     true,
		Username:   s.user,
		Password:   s.pass,
	}
	if s.clusterName != "" {
		o.Cluster = server.ClusterOpts{Name: s.clusterName, Host: host, Port: s.routePort}
		o.Routes = s.routes
	}
	if s.modify != nil {
		s.modify(o)
	}
	return o
}

// start starts a new server instance and waits until it accepts connections.
// On failure the instance is shut down again.
func (s *Server) start() error {
	if err := s.create(); err != nil {
		return err
	}
	return s.run()
}

// create makes a new, not yet started server instance.
func (s *Server) create() error {
	ns, err := server.NewServer(s.options())
	if err != nil {
		return fmt.Errorf("new server %s: %w", s.name, err)
	}
	verbose, debug, trace := logLevel()
	s.log = newServerLogger(s.name, verbose)
	ns.SetLoggerV2(s.log, debug, trace, false)
	s.Server = ns
	return nil
}

// run starts the instance made by create and waits until it accepts
// connections. On failure the instance is shut down again.
func (s *Server) run() error {
	s.Server.Start()
	err := poll(readyTimeout, func() error {
		if err := s.log.fatalErr(); err != nil {
			return errors.Join(errFatal, err)
		}
		if !s.Server.ReadyForConnections(pollMin) {
			return errors.New("not ready for connections")
		}
		return nil
	})
	if err == nil {
		if ferr := s.log.fatalErr(); ferr != nil { // e.g. a failed route listener
			err = errors.Join(errFatal, ferr)
		}
	}
	if err != nil {
		s.shutdown()
		return fmt.Errorf("start server %s: %w", s.name, err)
	}
	s.port = s.Server.Addr().(*net.TCPAddr).Port
	return nil
}

// errFatal marks a start failure the server reported itself, typically a port
// that is already taken.
var errFatal = errors.New("server reported a fatal error")

// shutdown stops the current instance and waits for its goroutines. It is a
// no-op on a server that is not running.
func (s *Server) shutdown() {
	if s.Server == nil {
		return
	}
	s.Server.Shutdown()
	s.Server.WaitForShutdown()
}

// URL returns the client URL, nats://127.0.0.1:<port>. It stays valid across
// Restart.
func (s *Server) URL() string {
	return fmt.Sprintf("nats://%s", net.JoinHostPort(host, fmt.Sprint(s.port)))
}

// Restart shuts the server down, if it is running, and starts a new instance
// with the same name, port and store dir. It returns once the new instance
// accepts connections; the embedded *server.Server then points to it. Clients
// made by Connect reconnect by themselves.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.shutdown()
	if err := s.start(); err != nil {
		t.Fatalf("natstest: restart: %v", err)
	}
}

// Connect connects to the server over TCP and closes the connection at the end
// of the test, before the server shuts down. It reconnects forever, every 50ms,
// so it survives Restart; opts are applied after these defaults.
func (s *Server) Connect(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return connect(t, s.URL(), opts)
}

func connect(t testing.TB, urls string, opts []nats.Option) *nats.Conn {
	t.Helper()
	all := append([]nats.Option{
		nats.Name(t.Name()),
		// nats.go's 2 s connect timeout has run out at a load average of 30
		// on two cores; a test's own connection waits longer.
		nats.Timeout(20 * time.Second),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond),
		nats.ReconnectJitter(10*time.Millisecond, 10*time.Millisecond),
	}, opts...)
	nc, err := nats.Connect(urls, all...)
	if err != nil {
		t.Fatalf("natstest: connect to %s: %v", urls, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// JetStream returns a JetStream context for nc and fails the test on error.
func JetStream(t testing.TB, nc *nats.Conn, opts ...jetstream.JetStreamOpt) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		t.Fatalf("natstest: jetstream: %v", err)
	}
	return js
}
