package e2e

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// binary is the agentfleet binary every test runs, built once by TestMain.
// It is empty under -short, where every test skips.
var binary string

// fleetctlBinary is the fleetctl binary, built with binary.
var fleetctlBinary string

// TestMain builds cmd/agentfleet and cmd/fleetctl once (without -race: the
// child processes are not what is under test for races, and a plain build is
// much faster), runs the tests, removes the build, and fails the run if goroutines of the
// test process are left over (a small stand-in for goleak, which is not a
// dependency of this module).
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "agentfleet-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(2)
	}
	binary = filepath.Join(dir, "agentfleet")
	fleetctlBinary = filepath.Join(dir, "fleetctl")
	build := exec.Command("go", "build", "-o", dir+string(filepath.Separator),
		"github.com/agentfleet/agentfleet/cmd/agentfleet", "github.com/agentfleet/agentfleet/cmd/fleetctl")
	build.Env = withoutEnv(os.Environ(), "GOFLAGS")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: go build ./cmd/agentfleet ./cmd/fleetctl: %v\n%s", err, out)
		_ = os.RemoveAll(dir)
		os.Exit(2)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	if code == 0 {
		if err := waitNoLeaks(10 * time.Second); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// withoutEnv drops the variables named in names from env.
func withoutEnv(env []string, names ...string) []string {
	out := env[:0:0]
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		drop := false
		for _, n := range names {
			if name == n {
				drop = true
			}
		}
		if !drop {
			out = append(out, kv)
		}
	}
	return out
}

// waitNoLeaks polls until this goroutine is the only one left.
func waitNoLeaks(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		leaked := otherGoroutines()
		if len(leaked) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("e2e: leaked goroutines:\n\n" + strings.Join(leaked, "\n\n"))
		}
		<-time.After(20 * time.Millisecond)
	}
}

func otherGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	stacks := strings.Split(string(bytes.TrimSpace(buf)), "\n\n")
	var out []string
	for _, s := range stacks[1:] { // the first one is this goroutine
		// The runtime's own signal watcher (os/signal, started by exec) is
		// not ours to stop.
		if strings.Contains(s, "os/signal.signal_recv") || strings.Contains(s, "os/signal.loop") {
			continue
		}
		out = append(out, s)
	}
	return out
}
