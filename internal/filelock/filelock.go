// Package filelock holds a file locked for as long as a process uses what
// it guards (a data dir, a database file), so that a second process on the
// same files is refused instead of corrupting them.
package filelock

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
)

// ErrLocked is returned by Lock when another holder keeps the lock past
// the wait. Its message names the holder's pid when the file records it.
var ErrLocked = errors.New("locked")

// lockFile is tryLock, replaced by tests.
var lockFile = tryLock

// errNoLocks is tryLock's error where the file system takes no locks.
var errNoLocks = errors.New("file locks are not supported here")

// Lock takes an exclusive lock of the file at path (made if missing),
// waiting up to wait while another open file holds it, and writes this
// process's pid into it. The lock lasts until the returned file is closed
// or the process exits, however it exits.
func Lock(path string, wait time.Duration) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	deadline := time.Now().Add(wait)
	for {
		held, err := lockFile(f)
		if errors.Is(err, errNoLocks) {
			// Refusing to start where locks cannot be taken would stop
			// a server that ran there before: go on without the lock.
			slog.Warn("the file system cannot lock this file; going on without the lock, so nothing refuses a second process on the same files",
				slog.String("file", path), slog.Any("error", err))
			break
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if held {
			break
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("%w: %s is held by %s", ErrLocked, path, Holder(path))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The pid is only for messages; the lock is what counts.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// Holder names the process recorded in the lock file at path: "process
// <pid>", or "another process" when none is recorded.
func Holder(path string) string {
	if b, err := os.ReadFile(path); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
			return "process " + strconv.Itoa(pid)
		}
	}
	return "another process"
}
