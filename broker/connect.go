package broker

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// ConnectConfig says how to reach NATS.
type ConnectConfig struct {
	// URL is one or more comma-separated server URLs. Ignored when InProcess is set.
	URL string
	// InProcess connects to an embedded server without TCP.
	InProcess *server.Server
	// Name identifies the connection in server monitoring.
	Name string
	// User and Password, Token or Creds (a credentials file) authenticate.
	User, Password, Token, Creds string
	// NKey is the path of an nkey seed file to authenticate with.
	NKey string
	// InboxPrefix is the prefix of the connection's reply subjects.
	// Empty: "_INBOX". A user whose permissions let it subscribe to its own
	// prefix only cannot read the replies to other users' requests.
	InboxPrefix string
	// TLS settings; a zero value means no client TLS configuration.
	TLSCA, TLSCert, TLSKey string
	TLSInsecure            bool
	// Timeout is the dial timeout. Defaults to 5s.
	Timeout time.Duration
	// Logger receives connection events. Defaults to slog.Default().
	Logger *slog.Logger
}

// Connect opens a connection that reconnects forever.
func Connect(cfg ConnectConfig) (*nats.Conn, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.Timeout(timeout),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		// A server that went silent (a network partition drops packets, it
		// sends no reset) is noticed within about ten seconds, less than a
		// lease TTL, and the connection moves to another cluster node; the
		// library's default (2 min x 2 pings) would leave a worker blind
		// long enough to lose every lane it owns.
		nats.PingInterval(3 * time.Second),
		nats.MaxPingsOutstanding(3),
		nats.ReconnectBufSize(64 << 20),
		nats.RetryOnFailedConnect(false),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "error", err)
			}
		}),
		// Never the plain URL: it may carry a password or a token.
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted()) }),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			log.Warn("nats async error", "subject", subj, "error", err)
		}),
	}
	if cfg.User != "" {
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	}
	if cfg.Token != "" {
		opts = append(opts, nats.Token(cfg.Token))
	}
	if cfg.Creds != "" {
		if _, err := os.Stat(cfg.Creds); err != nil {
			return nil, fmt.Errorf("nats creds: %w", err)
		}
		opts = append(opts, nats.UserCredentials(cfg.Creds))
	}
	if cfg.NKey != "" {
		opt, err := nats.NkeyOptionFromSeed(cfg.NKey)
		if err != nil {
			return nil, fmt.Errorf("nats nkey: %w", err)
		}
		opts = append(opts, opt)
	}
	if cfg.TLSCA != "" || cfg.TLSCert != "" || cfg.TLSInsecure {
		tc, err := tlsConfig(cfg)
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.Secure(tc))
	}
	url := cfg.URL
	if cfg.InProcess != nil && cfg.User == "" && cfg.Token == "" && cfg.Creds == "" && cfg.NKey == "" {
		if v, ok := inProcessKeys.Load(cfg.InProcess); ok {
			kp := v.(nkeys.KeyPair)
			pub, err := kp.PublicKey()
			if err != nil {
				return nil, err
			}
			opts = append(opts, nats.Nkey(pub, kp.Sign))
		}
	}
	if cfg.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(cfg.InboxPrefix))
	}
	if cfg.InProcess != nil {
		opts = append(opts, nats.InProcessServer(cfg.InProcess))
		url = ""
	} else if url == "" {
		url = nats.DefaultURL
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w", RedactURL(url), redactErr(err, secretsOf(cfg)))
	}
	return nc, nil
}

func tlsConfig(cfg ConnectConfig) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cfg.TLSInsecure} //nolint:gosec // opt-in
	if cfg.TLSCA != "" {
		pem, err := os.ReadFile(cfg.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("nats tls ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("nats tls ca %s: no certificates found", cfg.TLSCA)
		}
		tc.RootCAs = pool
	}
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return nil, errors.New("nats tls: cert and key go together")
	}
	if cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("nats tls cert: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
