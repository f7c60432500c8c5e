package broker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agentfleet/agentfleet/internal/filelock"
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

// lockDataDir takes the lock of dir. The returned file releases it when
// closed.
func lockDataDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, DataDirLockFile)
	f, err := filelock.Lock(path, dataDirLockWait)
	if errors.Is(err, filelock.ErrLocked) {
		return nil, fmt.Errorf("%w: %s is the JetStream store of a NATS server that is still running (%s holds %s): "+
			"stop it first, or give this one another data dir (--data)", ErrDataDirInUse, dir, filelock.Holder(path), path)
	}
	return f, err
}
