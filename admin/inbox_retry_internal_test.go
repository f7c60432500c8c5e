package admin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// retryTestMigration is a migration with nothing but what retryEach uses:
// its options and a log that keeps what is written to it.
func retryTestMigration(retryWait time.Duration) (*migration, *bytes.Buffer) {
	var buf bytes.Buffer
	return &migration{
		o:   MigrateOptions{RetryWait: retryWait, attempt: time.Second},
		log: slog.New(slog.NewTextHandler(&buf, nil)),
	}, &buf
}

// TestMigrateInboxRetryAfterALongAttempt: a pass of retryEach that does
// more work than RetryWait allows (a purge of many partitions on a slow
// cluster), then fails on a transient error (a leader election: no stream
// answered its last call), is retried, logging a warning, and the retry
// succeeds: RetryWait bounds the time spent failing, not the work of a
// pass.
func TestMigrateInboxRetryAfterALongAttempt(t *testing.T) {
	const wait = 100 * time.Millisecond
	mg, log := retryTestMigration(wait)
	attempts := 0
	v, err := retryEach(t.Context(), mg, "purge", func(ctx context.Context) (int, error) {
		attempts++
		if attempts == 1 {
			time.Sleep(3 * wait) // the pass's work
			return 0, fmt.Errorf("purge: %w", jetstream.ErrNoStreamResponse)
		}
		return 42, nil
	})
	if err != nil || v != 42 {
		t.Fatalf("retryEach = %d, %v after %d attempts, want 42 after a retry (log: %s)", v, err, attempts, log)
	}
	if attempts != 2 {
		t.Fatalf("%d attempts, want 2", attempts)
	}
	if !strings.Contains(log.String(), retryingMsg) {
		t.Fatalf("no retry warning logged: %s", log)
	}
}

// TestMigrateInboxRetryGivesUpAfterRetryWait: a call that keeps failing
// on a transient error, its first attempt a long one, is retried for
// RetryWait after its first failure, then given up with its error.
func TestMigrateInboxRetryGivesUpAfterRetryWait(t *testing.T) {
	const wait = 500 * time.Millisecond
	mg, log := retryTestMigration(wait)
	attempts := 0
	var failed time.Time
	_, err := retryEach(t.Context(), mg, "purge", func(ctx context.Context) (int, error) {
		attempts++
		if attempts == 1 {
			time.Sleep(2 * wait) // the pass's work
			failed = time.Now()
		}
		return 0, fmt.Errorf("purge: %w", jetstream.ErrNoStreamResponse)
	})
	took := time.Since(failed)
	if !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("retryEach = %v, want the transient error given up", err)
	}
	if attempts < 2 || took < wait || took > wait+30*time.Second {
		t.Fatalf("given up after %d attempts, %s after the first failure; want at least 2, about %s (log: %s)", attempts, took, wait, log)
	}
	if n := strings.Count(log.String(), retryingMsg); n != attempts-1 {
		t.Fatalf("%d retry warnings for %d attempts", n, attempts)
	}
}
