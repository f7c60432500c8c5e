package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proc is one agentfleet OS process (and its restarts). Its stdout and
// stderr go to one log file, kept across restarts and dumped (the tail of
// every incarnation) when the test fails. The process is SIGKILLed at the
// end of the test if it still runs, and it gets SIGKILL from the kernel if
// the test binary dies first (Pdeathsig), so no run leaves orphans.
type proc struct {
	t       testing.TB
	name    string
	args    []string
	env     []string
	logPath string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when the current incarnation has been waited for
	state   *os.ProcessState
	logFrom int64 // offset of the current incarnation in the log
	starts  int
}

// newProc prepares (does not start) a process of the agentfleet binary.
func newProc(t testing.TB, dir, name string, env []string, args ...string) *proc {
	t.Helper()
	if binary == "" {
		t.Fatal("e2e: the agentfleet binary was not built (TestMain)")
	}
	p := &proc{t: t, name: name, args: args, env: env, logPath: filepath.Join(dir, name+".log")}
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			p.dumpLog(60)
		}
	})
	return p
}

// baseEnv is the environment of every child: the test's own, without any
// agentfleet or NATS setting that could leak in from the caller's shell.
func baseEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "AGENTFLEET_") || strings.HasPrefix(name, "OPENAI_") || name == "NATS_URL" || name == "GOFLAGS" {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// start starts a new incarnation; the previous one must have exited.
func (p *proc) start(extraEnv ...string) {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done != nil {
		select {
		case <-p.done:
		default:
			p.t.Fatalf("e2e: %s: start while the previous incarnation still runs", p.name)
		}
	}
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.t.Fatalf("e2e: %s: log: %v", p.name, err)
	}
	p.starts++
	fmt.Fprintf(f, "==== %s incarnation %d, started %s ====\n", p.name, p.starts, time.Now().Format(time.RFC3339Nano))
	off, _ := f.Seek(0, 2)
	cmd := exec.Command(binary, p.args...)
	cmd.Env = append(append(baseEnv(), p.env...), extraEnv...)
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		p.t.Fatalf("e2e: %s: start: %v", p.name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.state, p.logFrom = cmd, done, nil, off
	go func() {
		_ = cmd.Wait()
		f.Close()
		p.mu.Lock()
		p.state = cmd.ProcessState
		p.mu.Unlock()
		close(done)
	}()
}

func (p *proc) current() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.done
}

// pid returns the process id of the current incarnation.
func (p *proc) pid() int {
	cmd, _ := p.current()
	return cmd.Process.Pid
}

// alive reports whether the current incarnation has not exited.
func (p *proc) alive() bool {
	_, done := p.current()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// signal sends sig to the current incarnation.
func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	cmd, _ := p.current()
	if cmd == nil {
		p.t.Fatalf("e2e: %s: signal %v before start", p.name, sig)
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		p.t.Fatalf("e2e: %s: signal %v: %v", p.name, sig, err)
	}
}

// kill SIGKILLs the current incarnation, if it runs, and waits for it.
// A stopped (SIGSTOP) process dies from SIGKILL too.
func (p *proc) kill() {
	cmd, done := p.current()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		p.t.Errorf("e2e: %s (pid %d) did not die from SIGKILL", p.name, cmd.Process.Pid)
	}
}

// waitExit waits up to timeout for the current incarnation to exit and
// returns its state; nil when it still runs.
func (p *proc) waitExit(timeout time.Duration) *os.ProcessState {
	_, done := p.current()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.state
	case <-t.C:
		return nil
	}
}

// output returns what the current incarnation has logged so far.
func (p *proc) output() string {
	p.mu.Lock()
	from := p.logFrom
	p.mu.Unlock()
	data, err := os.ReadFile(p.logPath)
	if err != nil || int64(len(data)) < from {
		return ""
	}
	return string(data[from:])
}

// waitLog waits until the current incarnation logged a line matching re
// and returns the first such line. It fails the test when the process exits
// or timeout passes first.
func (p *proc) waitLog(timeout time.Duration, re *regexp.Regexp) string {
	p.t.Helper()
	var line string
	waitFor(p.t, timeout, fmt.Sprintf("%s to log %q", p.name, re), func() error {
		if l := findLine(p.output(), re); l != "" {
			line = l
			return nil
		}
		if !p.alive() {
			return fatalf("%s exited before logging %q", p.name, re)
		}
		return errors.New("not yet")
	})
	return line
}

func findLine(text string, re *regexp.Regexp) string {
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if re.MatchString(sc.Text()) {
			return sc.Text()
		}
	}
	return ""
}

// dumpLog logs the last n lines of every incarnation's output.
func (p *proc) dumpLog(n int) {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		p.t.Logf("e2e: %s: no log: %v", p.name, err)
		return
	}
	lines := strings.Split(string(bytes.TrimRight(data, "\n")), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	p.t.Logf("---- last %d lines of %s (%s) ----\n%s", len(lines), p.name, p.logPath, strings.Join(lines, "\n"))
}

// freeAddr returns a 127.0.0.1 address with a port nobody listens on now.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// errFatal ends a waitFor at once.
var errFatal = errors.New("fatal")

func fatalf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errFatal, fmt.Sprintf(format, args...))
}

// waitFor polls cond (at once, then every 10-100 ms) until it returns nil,
// and fails the test if that does not happen within timeout or cond returns
// an error wrapping errFatal.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	if err := poll(timeout, cond); err != nil {
		t.Fatalf("e2e: waiting for %s (up to %v): %v", what, timeout, err)
	}
}

// poll calls cond until it returns nil, an error wrapping errFatal, or
// timeout passes; it returns the last error.
func poll(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	interval := 10 * time.Millisecond
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if errors.Is(err, errFatal) || !time.Now().Before(deadline) {
			return err
		}
		timer.Reset(min(interval, time.Until(deadline)))
		<-timer.C
		interval = min(2*interval, 100*time.Millisecond)
	}
}
