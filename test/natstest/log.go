package natstest

import (
	"fmt"
	"log"
	"os"
	"sync"
)

// logLevel reads NATSTEST_LOG: "" or "0" (silent), "1" (notices, warnings and
// errors), "debug", or "trace".
func logLevel() (verbose, debug, trace bool) {
	switch os.Getenv("NATSTEST_LOG") {
	case "", "0", "false":
		return false, false, false
	case "debug":
		return true, true, false
	case "trace":
		return true, true, true
	default:
		return true, false, false
	}
}

// serverLogger is the server.Logger installed on every server. Unlike the
// server's own logger, Fatalf does not exit the process: it records the message
// so that start can fail the test (or retry on other ports) instead. It writes to
// stderr, not t.Log, because a server may still log after its test has ended.
type serverLogger struct {
	verbose bool
	out     *log.Logger

	mu    sync.Mutex
	fatal error
}

func newServerLogger(name string, verbose bool) *serverLogger {
	return &serverLogger{verbose: verbose, out: log.New(os.Stderr, "["+name+"] ", log.Lmicroseconds)}
}

func (l *serverLogger) printf(level, format string, v []any) {
	if l.verbose {
		l.out.Printf(level+" "+format, v...)
	}
}

func (l *serverLogger) Noticef(format string, v ...any) { l.printf("[INF]", format, v) }
func (l *serverLogger) Warnf(format string, v ...any)   { l.printf("[WRN]", format, v) }
func (l *serverLogger) Errorf(format string, v ...any)  { l.printf("[ERR]", format, v) }
func (l *serverLogger) Debugf(format string, v ...any)  { l.printf("[DBG]", format, v) }
func (l *serverLogger) Tracef(format string, v ...any)  { l.printf("[TRC]", format, v) }

func (l *serverLogger) Fatalf(format string, v ...any) {
	l.printf("[FTL]", format, v)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fatal == nil {
		l.fatal = fmt.Errorf(format, v...)
	}
}

// fatalErr returns the first fatal error the server reported, if any.
func (l *serverLogger) fatalErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fatal
}
