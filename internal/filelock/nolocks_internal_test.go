package filelock

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// On a file system that takes no locks, Lock goes on without one instead
// of refusing to start, and still records the pid.
func TestLockWhereTheFileSystemTakesNoLocks(t *testing.T) {
	lockFile = func(*os.File) (bool, error) {
		return true, fmt.Errorf("%w: %w", errNoLocks, syscall.ENOLCK)
	}
	t.Cleanup(func() { lockFile = tryLock })
	path := filepath.Join(t.TempDir(), "x.lock")
	f, err := Lock(path, time.Second)
	if err != nil {
		t.Fatalf("Lock where locks are not supported: %v", err)
	}
	defer f.Close()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(b)); got != strconv.Itoa(os.Getpid()) {
		t.Fatalf("lock file holds %q, want this pid", got)
	}
}

// Any other failure to lock is still an error.
func TestLockOtherFailureIsAnError(t *testing.T) {
	lockFile = func(*os.File) (bool, error) { return false, syscall.EBADF }
	t.Cleanup(func() { lockFile = tryLock })
	f, err := Lock(filepath.Join(t.TempDir(), "x.lock"), time.Second)
	if err == nil {
		f.Close()
		t.Fatal("Lock succeeded on a failed lock")
	}
}
