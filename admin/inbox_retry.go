package admin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
)

// A migration's steps ride out a brief stall of the cluster (a leader
// election, a node restarting): a JetStream call that fails with an error
// broker.Transient accepts is made again, with backoff, for up to
// MigrateOptions.RetryWait after it first failed. Only calls that are safe
// to repeat are retried: reads, stream subject updates (they set the
// subjects the map gives, the same each time), purges up to a recorded
// bound, the drain markers (a second marker is one more bound above the
// close), and the map's compare-and-set write (see update).
const (
	defaultRetryWait = time.Minute
	// attemptTimeout bounds one attempt of a call: a request lost with a
	// node that stopped, or a proposal of a leader that lost its quorum,
	// must not hang the migration. A call of a loaded cluster that outlasts
	// it is made again.
	attemptTimeout = 10 * time.Second
	retryInitial   = 100 * time.Millisecond
	retryMax       = 2 * time.Second
)

// errInFlight marks a map write that may still be in flight: retried.
var errInFlight = errors.New("an earlier attempt of the write may still be in flight")

// retry runs call (each attempt bounded by attemptTimeout) until it
// succeeds, fails with an error that is not transient, or fails again
// longer than MigrateOptions.RetryWait after its first failure; each
// failure retried is logged.
// call makes one server call, or a few; a step that makes a call per
// partition or per lane uses retryEach.
func retry[T any](ctx context.Context, mg *migration, what string, call func(context.Context) (T, error)) (T, error) {
	return retryAttempts(ctx, mg, what, true, call)
}

// retryEach is retry for a step that makes a server call per partition or
// per lane (a purge, a look over every stream): one bound over the whole
// attempt would cap the partitions and lanes it can cover, and a step that
// outgrew it would fail on every attempt. Its attempts are bounded by ctx
// alone, and call bounds each server call it makes (once, and the
// migration's read helpers: nextOf, lastOf, entry, streamInfo).
func retryEach[T any](ctx context.Context, mg *migration, what string, call func(context.Context) (T, error)) (T, error) {
	return retryAttempts(ctx, mg, what, false, call)
}

func retryAttempts[T any](ctx context.Context, mg *migration, what string, bounded bool, call func(context.Context) (T, error)) (T, error) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = retryInitial, retryMax
	start := time.Now()
	// failed is when the first attempt failed: RetryWait bounds the time
	// spent failing from then on, not the work of the attempt that failed
	// (a pass of retryEach over many partitions or lanes may legitimately
	// outlast it before a leader election fails its last call).
	var failed time.Time
	attempts := 0
	v, err := backoff.Retry(ctx, func() (T, error) {
		attempts++
		actx := ctx
		if bounded {
			var cancel context.CancelFunc
			actx, cancel = context.WithTimeout(ctx, mg.o.attempt)
			defer cancel()
		}
		v, err := call(actx)
		if err == nil {
			return v, nil
		}
		if ctx.Err() != nil || !(broker.Transient(err) || errors.Is(err, errInFlight)) {
			return v, backoff.Permanent(err)
		}
		if failed.IsZero() {
			failed = time.Now()
		} else if time.Since(failed) > mg.o.RetryWait {
			return v, backoff.Permanent(err)
		}
		return v, err
	},
		backoff.WithBackOff(b),
		backoff.WithMaxElapsedTime(0), // bounded by failed above
		backoff.WithNotify(func(err error, next time.Duration) {
			mg.log.Warn(retryingMsg, slog.String("step", what), slog.Int("attempt", attempts),
				slog.String("retry_in", next.Round(time.Millisecond).String()), slog.Any("error", err))
		}),
	)
	if err != nil && attempts > 1 {
		err = fmt.Errorf("%w (tried %d times in %s)", err, attempts, time.Since(start).Round(100*time.Millisecond))
	}
	return v, err
}

// retryingMsg is the warning logged before a step's call is made again.
const retryingMsg = "inbox migration: a step failed on a transient error; retrying"

// retryDo is retry for a call that returns nothing but an error.
func retryDo(ctx context.Context, mg *migration, what string, call func(context.Context) error) error {
	_, err := retry(ctx, mg, what, func(ctx context.Context) (struct{}, error) { return struct{}{}, call(ctx) })
	return err
}

// setSubjects is broker.SetInboxSubjects, retried: it sets the subjects m
// gives stream i, the same on every attempt.
func (mg *migration) setSubjects(ctx context.Context, m broker.InboxMap, i int) error {
	return retryDo(ctx, mg, "set the subjects of "+mg.f.Names.InboxStreamAt(i), func(ctx context.Context) error {
		return broker.SetInboxSubjects(ctx, mg.f.JS, mg.f.Names, m, i)
	})
}

// stream reads inbox stream name's info, retried.
func (mg *migration) stream(ctx context.Context, name string) (jetstream.Stream, error) {
	return retry(ctx, mg, "read "+name, func(ctx context.Context) (jetstream.Stream, error) {
		return mg.f.JS.Stream(ctx, name)
	})
}

// update writes next over revision mg.rev by compare-and-set. A write that
// failed on a transient error may still have been applied (or be applied
// later: its proposal is in the stream's log), so it is never taken as
// lost: the next attempt carries the same expected revision, and at most one
// of them lands. An attempt refused because the revision moved, after one
// whose fate is unknown, reads the map from its stream's leader: the map
// written (this write landed) is the new revision, the old revision still
// there means the first attempt may still be in flight (retried), anything
// else is someone else's write (ErrMapChanged).
func (mg *migration) update(ctx context.Context, next broker.InboxMap) (uint64, error) {
	data := next.Encode()
	unsure := false
	return retry(ctx, mg, "write the inbox map", func(ctx context.Context) (uint64, error) {
		rev, err := mg.bucket.Update(ctx, broker.InboxMapKey, data, mg.rev)
		if err == nil {
			return rev, nil
		}
		if !isRevisionMismatch(err) {
			unsure = unsure || broker.Transient(err)
			return 0, fmt.Errorf("write inbox map: %w", err)
		}
		if !unsure {
			return 0, fmt.Errorf("%w: %v", ErrMapChanged, err)
		}
		cur, rev, rerr := mg.read(ctx)
		switch {
		case rerr != nil:
			return 0, fmt.Errorf("write inbox map: an attempt may have landed, and reading it back failed: %w", rerr)
		case rev == mg.rev:
			return 0, fmt.Errorf("write inbox map: %w: %v", errInFlight, err)
		case bytes.Equal(cur, data):
			mg.log.Info("inbox migration: a map write whose answer was lost had landed", slog.Uint64("revision", rev))
			return rev, nil
		}
		return 0, fmt.Errorf("%w: %v", ErrMapChanged, err)
	})
}

// isRevisionMismatch reports whether a map write was refused because the
// map's revision is not the one it expected.
func isRevisionMismatch(err error) bool {
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) ||
		strings.Contains(err.Error(), "wrong last sequence")
}

// nextOfRetried is nextOf, retried.
func nextOfRetried(ctx context.Context, mg *migration, stream, subj string, seq uint64) (uint64, bool, error) {
	return seqRetried(ctx, mg, "read "+stream, func(ctx context.Context) (uint64, bool, error) {
		return mg.nextOf(ctx, stream, subj, seq)
	})
}

// seqRetried is retryEach for a step that finds a message's seq, or none.
func seqRetried(ctx context.Context, mg *migration, what string, call func(context.Context) (uint64, bool, error)) (uint64, bool, error) {
	type found struct {
		seq uint64
		ok  bool
	}
	f, err := retryEach(ctx, mg, what, func(ctx context.Context) (found, error) {
		seq, ok, err := call(ctx)
		return found{seq, ok}, err
	})
	return f.seq, f.ok, err
}

// once makes one server call of a step, bounded by the attempt timeout (see
// retryEach): a step that makes a call per partition or per lane bounds
// each call, never the whole step.
func once[T any](ctx context.Context, mg *migration, call func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, mg.o.attempt)
	defer cancel()
	return call(ctx)
}

// onceDo is once for a call that returns nothing but an error.
func onceDo(ctx context.Context, mg *migration, call func(context.Context) error) error {
	_, err := once(ctx, mg, func(ctx context.Context) (struct{}, error) { return struct{}{}, call(ctx) })
	return err
}

// nextOf is the package's nextOf, one call bounded by the attempt timeout.
func (mg *migration) nextOf(ctx context.Context, stream, subj string, seq uint64) (uint64, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, mg.o.attempt)
	defer cancel()
	return nextOf(ctx, mg.f.JS, stream, subj, seq)
}

// lastOf is the package's lastOf, one call bounded by the attempt timeout.
func (mg *migration) lastOf(ctx context.Context, stream, subj string) (uint64, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, mg.o.attempt)
	defer cancel()
	return lastOf(ctx, mg.f.JS, stream, subj)
}

// entry reads lane's session entry (nil and an error wrapping
// kv.ErrNotFound when it has none), one call bounded by the attempt
// timeout.
func (mg *migration) entry(ctx context.Context, lane string) (*session.SessionEntry, error) {
	return once(ctx, mg, func(ctx context.Context) (*session.SessionEntry, error) {
		e, _, err := mg.f.Store.Get(ctx, lane)
		return e, err
	})
}

// streamInfo binds inbox stream name and reads its info with the subjects
// that match filter, each call bounded by the attempt timeout.
func (mg *migration) streamInfo(ctx context.Context, name, filter string) (jetstream.Stream, *jetstream.StreamInfo, error) {
	st, err := once(ctx, mg, func(ctx context.Context) (jetstream.Stream, error) { return mg.f.JS.Stream(ctx, name) })
	if err != nil {
		return nil, nil, err
	}
	info, err := once(ctx, mg, func(ctx context.Context) (*jetstream.StreamInfo, error) {
		return st.Info(ctx, jetstream.WithSubjectFilter(filter))
	})
	if err != nil {
		return nil, nil, err
	}
	return st, info, nil
}
