package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
)

// ErrNATSUnreachable is returned by ConnectWait when NATS could not be
// reached within the wait.
var ErrNATSUnreachable = errors.New("nats not reachable")

// Waiting backoff: the first retry comes quickly (a server starting beside
// this process is usually up within a second), later ones at most every 5s.
const (
	waitInitialInterval = 250 * time.Millisecond
	waitMaxInterval     = 5 * time.Second
)

// ConnectWait connects like Connect, but while NATS cannot be reached
// (connection refused, a name that does not resolve yet, a timeout) it
// retries with exponential backoff for up to wait, logging a warning
// "waiting for NATS at <url>" before each retry (credentials in the URL
// are redacted). Past wait it returns an error wrapping ErrNATSUnreachable
// and the last connection error. An error no retry can fix (authorization,
// TLS, a missing credentials file) is returned at once. wait <= 0 tries
// once. An in-process connection (cfg.InProcess) never waits.
func ConnectWait(ctx context.Context, cfg ConnectConfig, wait time.Duration) (*nats.Conn, error) {
	if cfg.InProcess != nil || wait <= 0 {
		return Connect(cfg)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	where := RedactURL(cfg.URL)
	if where == "" {
		where = nats.DefaultURL
	}
	start := time.Now()
	deadline := start.Add(wait)
	attempts := 0
	var last error
	nc, err := backoff.Retry(ctx, func() (*nats.Conn, error) {
		attempts++
		nc, err := Connect(cfg)
		last = err
		if err != nil && !connectRetryable(err) {
			return nil, backoff.Permanent(err)
		}
		return nc, err
	},
		backoff.WithBackOff(&deadlineBackOff{b: newWaitBackOff(), deadline: deadline}),
		backoff.WithMaxElapsedTime(0), // deadlineBackOff stops at the deadline
		backoff.WithNotify(func(err error, next time.Duration) {
			log.Warn("waiting for NATS at "+where, slog.Int("attempt", attempts), slog.String("retry_in", next.Round(time.Millisecond).String()),
				slog.String("gives_up_in", time.Until(deadline).Round(time.Second).String()), slog.Any("error", err))
		}),
	)
	if err == nil {
		if attempts > 1 {
			log.Info("connected to NATS at "+where, slog.Int("attempts", attempts))
		}
		return nc, nil
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return nil, err // stopped by the caller (a signal): no diagnosis
	}
	if last != nil && connectRetryable(last) {
		// The wait ran out, or the caller's own deadline came first.
		waited := min(wait, time.Since(start)).Round(100 * time.Millisecond)
		hint := "raise nats.connect_wait to wait longer"
		if d, ok := ctx.Deadline(); ok && !d.After(deadline) {
			// Raising connect_wait would change nothing: the caller's
			// deadline (fleetctl's --timeout) bounds the wait.
			hint = "the caller's deadline ended the wait"
		}
		return nil, fmt.Errorf("%w at %s after waiting %s (%d attempts; %s): %w",
			ErrNATSUnreachable, where, waited, attempts, hint, last)
	}
	return nil, err
}

func newWaitBackOff() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = waitInitialInterval
	b.MaxInterval = waitMaxInterval
	b.Multiplier = 2
	return b
}

// deadlineBackOff caps every wait at the time left before deadline, so the
// last attempt is made at the deadline rather than a whole interval before
// it, and stops once the deadline has passed.
type deadlineBackOff struct {
	b        backoff.BackOff
	deadline time.Time
}

func (d *deadlineBackOff) NextBackOff() time.Duration {
	left := time.Until(d.deadline)
	if left <= 0 {
		return backoff.Stop
	}
	return min(d.b.NextBackOff(), left)
}

func (d *deadlineBackOff) Reset() { d.b.Reset() }

// connectRetryable reports whether a failed connection may succeed later:
// nothing listens yet, the name does not resolve yet, the server closed or
// timed out during the handshake. Authorization, TLS and configuration
// errors are not.
func connectRetryable(err error) bool {
	var opErr *net.OpError
	var dnsErr *net.DNSError
	switch {
	case errors.Is(err, nats.ErrNoServers), errors.Is(err, nats.ErrTimeout), errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, os.ErrDeadlineExceeded),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.As(err, &dnsErr), errors.As(err, &opErr):
		return true
	}
	return false
}

// RedactURL returns a NATS URL list (comma-separated) for logs and errors:
// any user name, password or token in a URL is replaced by "[redacted]".
func RedactURL(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		raw := p
		if !strings.Contains(raw, "://") {
			raw = "nats://" + raw
		}
		u, err := url.Parse(raw)
		if err != nil {
			// Keep the scheme: an already redacted URL (its "[redacted]"
			// user does not parse) comes out the same.
			if at := strings.LastIndex(p, "@"); at >= 0 {
				scheme := ""
				if k := strings.Index(p, "://"); k >= 0 && k < at {
					scheme = p[:k+3]
				}
				parts[i] = scheme + "[redacted]@" + p[at+1:]
			}
			continue
		}
		if u.User != nil {
			u.User = url.User("[redacted]")
			s := u.String()
			s = strings.Replace(s, "%5Bredacted%5D", "[redacted]", 1)
			if !strings.Contains(p, "://") {
				s = strings.TrimPrefix(s, "nats://")
			}
			parts[i] = s
			continue
		}
		parts[i] = p
	}
	return strings.Join(parts, ",")
}
