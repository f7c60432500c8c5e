package broker

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// ServerConfig configures an embedded nats-server with JetStream.
type ServerConfig struct {
	// Name is the server name. Defaults to "agentfleet-<hostname>".
	Name string
	// DataDir holds the JetStream file store. Required.
	DataDir string
	// Listen is host:port of a client listener for other processes and the
	// nats CLI. Empty means in-process connections only.
	Listen string
	// Sync is the fsync policy: "default" (the server's interval, 2m),
	// "always" (fsync every write) or a duration such as "10s".
	Sync string
	// ClusterName, ClusterListen and Routes make the node a member of a
	// cluster. Routes are nats-route URLs; listing the node itself is fine.
	ClusterName   string
	ClusterListen string
	Routes        []string
	// Debug enables the server's own log on stderr.
	Debug bool
	// Users, when set, turn on authentication: every client needs one of
	// these users and gets its role's permissions (Permissions, for the
	// fleet named by Prefix). Users of RoleSystem join the system account
	// SystemAccount. In-process connections made with Connect need no
	// credentials: they use a user the server makes for them at start,
	// valid only in process.
	Users []ServerUser
	// Prefix is the fleet's prefix (nats.prefix), for the users'
	// permissions. Defaults to DefaultPrefix.
	Prefix string
	// TLSCert and TLSKey are PEM files: with them the client port takes
	// TLS connections only. TLSCA, when set, also makes the server ask
	// every client for a certificate signed by one of its CAs.
	TLSCert, TLSKey, TLSCA string
	// Monitor is host:port of the HTTP monitoring endpoints (/varz,
	// /jsz, /healthz ...). Empty: none.
	Monitor string
}

// ParseSync validates a sync policy and returns (always, interval). A
// duration is a Go duration ("30s") or whole seconds ("30"), as the
// configuration's durations are.
func ParseSync(s string) (bool, time.Duration, error) {
	switch s {
	case "", "default":
		return false, 0, nil
	case "always":
		return true, 0, nil
	}
	d, err := time.ParseDuration(s)
	if n, nerr := strconv.Atoi(s); err != nil && nerr == nil {
		d, err = time.Duration(n)*time.Second, nil
	}
	if err != nil || d <= 0 {
		return false, 0, fmt.Errorf("sync %q: want \"default\", \"always\" or a positive duration", s)
	}
	return false, d, nil
}

func splitHostPort(addr string) (string, int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("address %q: %w", addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < -1 || p > 65535 {
		return "", 0, fmt.Errorf("address %q: bad port", addr)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, p, nil
}

// StartServer starts an embedded nats-server and waits until it accepts
// connections and, when clustered, until JetStream has a meta leader.
// While the server runs it holds the lock of its data dir (DataDirLockFile,
// let go once the server has shut down): a second server on the same dir is
// refused with ErrDataDirInUse after waiting 2 s for the lock.
func StartServer(cfg ServerConfig) (*server.Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("embedded server: data dir is required")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("embedded server: %w", err)
	}
	lock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("embedded server: %w", err)
	}
	s, err := startServer(cfg)
	if err != nil {
		lock.Close()
		return nil, err
	}
	go func() {
		s.WaitForShutdown()
		lock.Close()
	}()
	return s, nil
}

// startServer is StartServer once the data dir is locked.
func startServer(cfg ServerConfig) (*server.Server, error) {
	name := cfg.Name
	if name == "" {
		h, _ := os.Hostname()
		name = "agentfleet-" + strings.ReplaceAll(h, ".", "-")
	}
	opts := &server.Options{
		ServerName: name,
		JetStream:  true,
		StoreDir:   cfg.DataDir,
		NoSigs:     true,
		NoLog:      !cfg.Debug,
		Logtime:    cfg.Debug,
		Debug:      false,
	}
	always, interval, err := ParseSync(cfg.Sync)
	if err != nil {
		return nil, err
	}
	opts.SyncAlways = always
	opts.SyncInterval = interval
	if cfg.Listen == "" {
		opts.DontListen = true
	} else {
		host, port, err := splitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("embedded server: listen: %w", err)
		}
		if port == 0 {
			port = -1 // nats-server reads 0 as its default 4222; -1 picks a free port
		}
		opts.Host, opts.Port = host, port
	}
	if cfg.ClusterName != "" || cfg.ClusterListen != "" {
		if cfg.ClusterName == "" || cfg.ClusterListen == "" {
			return nil, errors.New("embedded server: cluster needs both a name and a listen address")
		}
		host, port, err := splitHostPort(cfg.ClusterListen)
		if err != nil {
			return nil, fmt.Errorf("embedded server: cluster listen: %w", err)
		}
		opts.Cluster = server.ClusterOpts{Name: cfg.ClusterName, Host: host, Port: port}
		for _, r := range cfg.Routes {
			r = strings.TrimSpace(r)
			if r == "" {
				continue
			}
			u, err := url.Parse(r)
			if err != nil || u.Host == "" {
				return nil, fmt.Errorf("embedded server: route %q is not a URL like nats-route://host:port", RedactURL(r))
			}
			opts.Routes = append(opts.Routes, u)
		}
	}
	if err := applySecurity(opts, cfg); err != nil {
		return nil, fmt.Errorf("embedded server: %w", err)
	}
	var inproc nkeys.KeyPair
	if len(cfg.Users) > 0 {
		names, err := NewNames(cfg.Prefix)
		if err != nil {
			return nil, fmt.Errorf("embedded server: %w", err)
		}
		if inproc, err = applyUsers(opts, cfg.Users, names); err != nil {
			return nil, fmt.Errorf("embedded server: users: %w", err)
		}
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded server: %w", err)
	}
	if inproc != nil {
		inProcessKeys.Store(s, inproc)
		go func() {
			s.WaitForShutdown()
			inProcessKeys.Delete(s)
		}()
	}
	var fl *fatalLogger
	if cfg.Debug {
		s.ConfigureLogger()
	} else {
		fl = &fatalLogger{}
		s.SetLoggerV2(fl, false, false, false)
	}
	go s.Start()
	if err := waitReady(s, fl, 30*time.Second); err != nil {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, fmt.Errorf("embedded server: %w", err)
	}
	return s, nil
}

// applySecurity sets TLS and the monitoring port.
func applySecurity(opts *server.Options, cfg ServerConfig) error {
	if cfg.TLSCert != "" || cfg.TLSKey != "" || cfg.TLSCA != "" {
		if cfg.TLSCert == "" || cfg.TLSKey == "" {
			return errors.New("tls: a certificate and its key go together (and a CA alone does nothing)")
		}
		if cfg.Listen == "" {
			return errors.New("tls: set without a listen address (in-process connections do not use TLS)")
		}
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cfg.TLSCert, KeyFile: cfg.TLSKey, CaFile: cfg.TLSCA, Verify: cfg.TLSCA != ""})
		if err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		opts.TLSConfig = tc
		opts.TLS = true
		opts.TLSVerify = cfg.TLSCA != ""
		opts.TLSTimeout = 5
	}
	if cfg.Monitor != "" {
		host, port, err := splitHostPort(cfg.Monitor)
		if err != nil {
			return fmt.Errorf("monitor: %w", err)
		}
		if port == 0 {
			port = -1
		}
		opts.HTTPHost, opts.HTTPPort = host, port
	}
	return nil
}
