package ingress

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
)

// Defaults of SingletonConfig.
const (
	// DefaultSingletonTTL is the server-side TTL of a singleton lease: the
	// longest a dead holder keeps the role.
	DefaultSingletonTTL = 5 * time.Second
	// DefaultSingletonRetry is how often a standby tries to take the lease.
	DefaultSingletonRetry = time.Second
)

// SingletonConfig configures a Singleton.
type SingletonConfig struct {
	// Names are the fleet's names. Defaults to broker.DefaultPrefix's.
	Names broker.Names
	// Kind and ID name the role: the lease key is
	// Names.SingletonLeaseKey(Kind, ID). ID should be TokenID(token).
	Kind, ID string
	// Owner names this process in the lease. Defaults to
	// "<hostname>-<pid>-<random>".
	Owner string
	// TTL is the lease TTL (at least 1s): a holder that dies hands the role
	// over within TTL + Retry. Defaults to DefaultSingletonTTL.
	TTL time.Duration
	// Retry is how often a standby tries to take the lease. Defaults to
	// DefaultSingletonRetry.
	Retry time.Duration
	// Logger receives the role changes. Defaults to a discard logger.
	Logger *slog.Logger
}

// Singleton runs a function in exactly one process of the fleet at a time
// per (Kind, ID): the holder of a lease key with a server-side TTL in the
// leases bucket, renewed every TTL/3 by a conditional write. A holder that
// dies (kill -9, lost network) stops renewing; the server expires the key
// and a standby takes the role within TTL + Retry. The holder also stops
// itself: when a renewal is refused (the lease expired or was taken) or no
// renewal has been confirmed for TTL − TTL/4 on its own monotonic clock, the
// function's context is cancelled before another process can take over.
//
// Whatever the function does must still be safe if two holders overlap for a
// moment (a paused process that resumes): the platform adapters publish
// with de-duplication ids, so an update handled twice is one inbox message.
type Singleton struct {
	leases *kv.Leases
	cfg    SingletonConfig
	key    string
	log    *slog.Logger
}

// NewSingleton returns a Singleton over res's leases bucket.
func NewSingleton(js jetstream.JetStream, res *broker.Resources, cfg SingletonConfig) (*Singleton, error) {
	if js == nil || res == nil || res.Leases == nil {
		return nil, fmt.Errorf("%w: singleton needs JetStream and a provisioned Leases bucket", ErrInvalidConfig)
	}
	if cfg.Kind == "" || cfg.ID == "" {
		return nil, fmt.Errorf("%w: singleton needs a Kind and an ID", ErrInvalidConfig)
	}
	if cfg.Names.Prefix() == "" {
		cfg.Names = broker.MustNames(broker.DefaultPrefix)
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultSingletonTTL
	}
	if cfg.TTL < time.Second {
		return nil, fmt.Errorf("%w: singleton TTL %s is below 1s", ErrInvalidConfig, cfg.TTL)
	}
	if cfg.Retry <= 0 {
		cfg.Retry = DefaultSingletonRetry
	}
	if cfg.Owner == "" {
		cfg.Owner = defaultOwner()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	key := cfg.Names.SingletonLeaseKey(cfg.Kind, cfg.ID)
	return &Singleton{
		leases: kv.NewLeases(js, res, cfg.Names, cfg.TTL),
		cfg:    cfg,
		key:    key,
		log:    cfg.Logger.With(slog.String("singleton", key), slog.String("owner", cfg.Owner)),
	}, nil
}

// Key returns the lease key of the role.
func (s *Singleton) Key() string { return s.key }

// Owner returns this process's owner id in the lease.
func (s *Singleton) Owner() string { return s.cfg.Owner }

// Run waits for the role and runs fn while holding it, until ctx ends. When
// the lease is lost, fn's context is cancelled; once fn returned Run stands
// by again. fn returning by itself (an error included, which is logged)
// releases the role and takes it again after Retry, so a failing holder lets
// another process try. Run returns nil when ctx ends, after fn returned and
// the lease was released.
func (s *Singleton) Run(ctx context.Context, fn func(ctx context.Context) error) error {
	for {
		lease, err := s.leases.Acquire(ctx, s.key, s.cfg.Owner)
		if err == nil {
			s.hold(ctx, lease, fn)
		} else {
			var held *kv.HeldError
			if !errors.As(err, &held) && ctx.Err() == nil {
				s.log.LogAttrs(ctx, slog.LevelWarn, "cannot take the singleton lease", slog.Any("error", err))
			}
		}
		if !sleepCtx(ctx, s.cfg.Retry) {
			return nil
		}
	}
}

// hold runs fn under lease until fn returns, the lease is lost or ctx ends.
func (s *Singleton) hold(ctx context.Context, lease *kv.Lease, fn func(context.Context) error) {
	s.log.LogAttrs(ctx, slog.LevelInfo, "singleton role taken", slog.Uint64("epoch", lease.Epoch))
	fctx, cancel := context.WithCancelCause(ctx)
	done := make(chan error, 1)
	go func() { done <- fn(fctx) }()

	every := s.cfg.TTL / 3
	// Stop before the server could expire the lease: a quarter of the TTL
	// of margin on our own clock.
	fence := s.cfg.TTL - s.cfg.TTL/4
	t := time.NewTicker(every)
	defer t.Stop()
	var fnErr error
	lost := false
loop:
	for {
		select {
		case fnErr = <-done:
			break loop
		case <-t.C:
			err := s.leases.Renew(ctx, lease)
			switch {
			case err == nil:
			case errors.Is(err, kv.ErrLeaseLost):
				s.log.LogAttrs(ctx, slog.LevelWarn, "singleton lease lost; stopping")
				lost = true
				cancel(kv.ErrLeaseLost)
				fnErr = <-done
				break loop
			case time.Since(lease.Renewed) >= fence:
				s.log.LogAttrs(ctx, slog.LevelWarn, "singleton lease not renewed in time; stopping", slog.Any("error", err))
				lost = true
				cancel(kv.ErrLeaseLost)
				fnErr = <-done
				break loop
			default:
				s.log.LogAttrs(ctx, slog.LevelWarn, "singleton lease renewal failed; retrying", slog.Any("error", err))
			}
		}
	}
	cancel(nil)
	if fnErr != nil && ctx.Err() == nil && !lost {
		s.log.LogAttrs(ctx, slog.LevelWarn, "singleton role ended with an error", slog.Any("error", fnErr))
	}
	if !lost {
		if err := s.leases.Release(context.WithoutCancel(ctx), lease); err != nil {
			s.log.LogAttrs(ctx, slog.LevelWarn, "singleton lease not released; it expires by itself", slog.Any("error", err))
		}
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "singleton role given up", slog.Uint64("epoch", lease.Epoch))
}

// TokenID is a short, stable id of a secret (a bot token) for lease keys
// and logs: the first 16 hex digits of its SHA-256.
func TokenID(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:8])
}

func defaultOwner() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "ingress"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
