package broker

import (
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// fatalLogger is the logger of an embedded server that does not log: where
// nats-server's own logger would exit the process on a fatal error (a port
// already in use), it keeps the first one, so StartServer can report it at
// once instead of waiting for a server that will never be ready.
type fatalLogger struct {
	mu    sync.Mutex
	fatal error
}

func (l *fatalLogger) Noticef(string, ...any) {}
func (l *fatalLogger) Warnf(string, ...any)   {}
func (l *fatalLogger) Errorf(string, ...any)  {}
func (l *fatalLogger) Debugf(string, ...any)  {}
func (l *fatalLogger) Tracef(string, ...any)  {}

func (l *fatalLogger) Fatalf(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fatal == nil {
		l.fatal = fmt.Errorf(format, v...)
	}
}

func (l *fatalLogger) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fatal
}

// waitReady waits up to timeout for s to accept connections, and returns
// at once with the server's fatal error if it reports one (l may be nil).
func waitReady(s *server.Server, l *fatalLogger, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if l != nil {
			if err := l.err(); err != nil {
				return err
			}
		}
		if s.ReadyForConnections(100 * time.Millisecond) {
			if l != nil {
				if err := l.err(); err != nil { // e.g. a cluster listener that failed
					return err
				}
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready for connections after %s", timeout)
		}
	}
}
