//go:build unix && !solaris && !aix

package filelock

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// tryLock takes an exclusive flock of f without blocking. The lock belongs
// to the open file, so a second open of the same file, in this process or
// another, cannot take it while f is open; the kernel drops it when the
// process exits, however it exits.
func tryLock(f *os.File) (bool, error) {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, syscall.EWOULDBLOCK):
		return false, nil
	case errors.Is(err, syscall.ENOLCK), errors.Is(err, syscall.EOPNOTSUPP), errors.Is(err, syscall.ENOSYS):
		// A file system without flock (NFS without its lock daemon,
		// some FUSE mounts): there is no lock to take here.
		return true, fmt.Errorf("%w: %w", errNoLocks, err)
	}
	return false, err
}
