package natstest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// VerifyNoLeaks runs the tests of a package, then fails the run if
// goroutines are left over once all tests and their cleanups are done: every
// connection, server, worker loop and long poll they start must end. Call it
// from TestMain. (goleak is not a dependency of this module; this is a small
// stand-in for goleak.VerifyTestMain.) Goroutines whose stack contains one of
// ignore are not counted.
func VerifyNoLeaks(m *testing.M, timeout time.Duration, ignore ...string) {
	code := m.Run()
	if code == 0 {
		if err := waitNoLeaks(timeout, ignore); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// waitNoLeaks polls until the calling goroutine is the only one left.
// Goroutines of a closed connection or a shut-down server take a moment to
// return.
func waitNoLeaks(timeout time.Duration, ignore []string) error {
	deadline := time.Now().Add(timeout)
	for {
		leaked := otherGoroutines(ignore)
		if len(leaked) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("leaked goroutines:\n\n" + strings.Join(leaked, "\n\n"))
		}
		<-time.After(20 * time.Millisecond)
	}
}

func otherGoroutines(ignore []string) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
next:
	for _, g := range strings.Split(string(bytes.TrimSpace(buf)), "\n\n")[1:] { // the first is the caller
		// The signal loop lives as long as the process once anything called
		// signal.Notify; it is not a test's.
		if strings.Contains(g, "os/signal.loop") {
			continue
		}
		for _, s := range ignore {
			if strings.Contains(g, s) {
				continue next
			}
		}
		out = append(out, g)
	}
	return out
}
