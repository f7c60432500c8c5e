//go:build compose

package compose

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain skips everything, saying why, when no Docker engine answers;
// otherwise it builds the image (make image: the binaries with the host's
// Go toolchain, FROM scratch) so the stack runs the code under test.
func TestMain(m *testing.M) {
	flag.Parse()
	if out, err := exec.Command("docker", "info").CombinedOutput(); err != nil {
		fmt.Printf("compose tests skipped: no Docker engine answers `docker info`: %v\n%s", err, lastLines(out, 2))
		os.Exit(0)
	}
	if os.Getenv("COMPOSE_SKIP_IMAGE") == "" {
		root, _ := filepath.Abs(filepath.Join("..", ".."))
		cmd := exec.Command("make", "image")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "compose tests: make image: %v\n%s", err, out)
			os.Exit(2)
		}
	}
	os.Exit(m.Run())
}

// lastLines returns the last n non-empty lines of b (docker info ends with
// the error that says why the engine did not answer).
func lastLines(b []byte, n int) string {
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n") + "\n"
}

// TestCluster brings up one stack and runs the smoke checks on it, then the
// chaos run.
func TestCluster(t *testing.T) {
	s := newStack(t)
	// The stack's helpers fail the test that uses them: the subtest while
	// it runs, the parent (whose cleanup removes the stack) afterwards.
	sub := func(name string, f func(*testing.T, *stack)) bool {
		return t.Run(name, func(st *testing.T) {
			s.t = st
			defer func() { s.t = t }()
			f(st, s)
		})
	}
	if !sub("smoke", smoke) {
		return
	}
	sub("chaos", chaos)
}
