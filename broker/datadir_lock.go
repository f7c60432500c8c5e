package broker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// DataDirLockFile is the file, inside an embedded server's data dir, that
// the running server holds locked: a second server on the same JetStream
// store (a second `agentfleet up` with the same --data, say) would write
// the same files as the first and corrupt them.
const DataDirLockFile = "agentfleet.lock"

// ErrDataDirInUse is returned by StartServer when another server holds the
// data dir.
var ErrDataDirInUse = errors.New("data dir in use")

// dataDirLockWait is how long StartServer waits for a held lock: long
// enough for a server of this process that was just shut down to let go
// of it, short enough that a second `up` fails at once.
const dataDirLockWait = 2 * time.Second

// lockDataDir takes the lock of dir, waiting up to dataDirLockWait while
// it is held. The returned file releases it when closed.
func lockDataDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, DataDirLockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock data dir: %w", err)
	}
	deadline := time.Now().Add(dataDirLockWait)
	for {
		held, err := tryLock(f)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lock data dir %s: %w", dir, err)
		}
		if held {
			break
		}
		if time.Now().After(deadline) {
			owner := "another process"
			if b, err := os.ReadFile(path); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
					owner = "process " + strconv.Itoa(pid)
				}
			}
			f.Close()
			return nil, fmt.Errorf("%w: %s is the JetStream store of a NATS server that is still running (%s holds %s): "+
				"stop it first, or give this one another data dir (--data)", ErrDataDirInUse, dir, owner, path)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The pid is only for the message above; the lock is what counts.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
