package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/worker"
)

// procWorker is one worker process (`agentfleet worker --id <id>`) and its
// restarts. Its output goes to a log file in the scenario's directory, kept
// across restarts; the tail is quoted in errors.
type procWorker struct {
	id      string
	bin     string
	args    []string
	env     []string
	logPath string

	mu     sync.Mutex
	owner  string // the current incarnation's owner id, once registered
	cmd    *exec.Cmd
	done   chan struct{} // closed when the current incarnation was waited for
	state  *os.ProcessState
	starts int
}

// workerEnv is the environment of worker processes: this process's own,
// without any agentfleet or NATS setting, plus the bench's.
func workerEnv(url string, o Options, extra ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "AGENTFLEET_") || name == "NATS_URL" {
			continue
		}
		out = append(out, kv)
	}
	margin := min(2*time.Second, o.LeaseTTL/3) // the fleet's default, valid for short TTLs too
	out = append(out,
		"NATS_URL="+url,
		"AGENTFLEET_LEASE_TTL="+o.LeaseTTL.String(),
		"AGENTFLEET_LEASE_MARGIN="+margin.String(),
		"AGENTFLEET_WORKER_LINGER="+o.Linger.String(),
		"AGENTFLEET_WORKER_LANES="+strconv.Itoa(max(64, o.Lanes)),
		"AGENTFLEET_SESSION_RESET_MODE=none",
		"AGENTFLEET_TELEMETRY_LOG_LEVEL="+o.WorkerLogLevel,
	)
	return append(out, extra...)
}

func newProcWorker(dir, bin, id string, env []string, args ...string) *procWorker {
	return &procWorker{id: id, bin: bin, env: env, args: append([]string{"worker", "--id", id}, args...),
		logPath: filepath.Join(dir, "worker-"+id+".log")}
}

// start starts a new incarnation; the previous one must have exited.
func (p *procWorker) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("worker %s: start while the previous incarnation runs", p.id)
		}
	}
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("worker %s: log: %w", p.id, err)
	}
	p.starts++
	fmt.Fprintf(f, "==== worker %s incarnation %d, started %s ====\n", p.id, p.starts, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = p.env
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("worker %s: start %s: %w", p.id, p.bin, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.state = cmd, done, nil
	go func() {
		_ = cmd.Wait()
		f.Close()
		p.mu.Lock()
		p.state = cmd.ProcessState
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

func (p *procWorker) current() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.done
}

// ownerID is the owner id of the current incarnation ("" before it
// registered).
func (p *procWorker) ownerID() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.owner
}

// pid is the process id of the current incarnation (0 before the first).
func (p *procWorker) pid() int {
	cmd, _ := p.current()
	if cmd == nil {
		return 0
	}
	return cmd.Process.Pid
}

func (p *procWorker) alive() bool {
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
func (p *procWorker) signal(sig syscall.Signal) error {
	cmd, _ := p.current()
	if cmd == nil {
		return fmt.Errorf("worker %s: not started", p.id)
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("worker %s: signal %v: %w", p.id, sig, err)
	}
	return nil
}

// wait waits up to timeout for the current incarnation to exit.
func (p *procWorker) wait(timeout time.Duration) (*os.ProcessState, error) {
	_, done := p.current()
	if done == nil {
		return nil, nil
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.state, nil
	case <-t.C:
		return nil, fmt.Errorf("worker %s (pid %d) still runs after %s", p.id, p.pid(), timeout)
	}
}

// stop sends SIGTERM and waits up to timeout, then SIGKILLs.
func (p *procWorker) stop(timeout time.Duration) error {
	if !p.alive() {
		return nil
	}
	if err := p.signal(syscall.SIGTERM); err != nil {
		return err
	}
	if _, err := p.wait(timeout); err != nil {
		_ = p.signal(syscall.SIGKILL)
		_, _ = p.wait(10 * time.Second)
		return err
	}
	return nil
}

// kill SIGKILLs the current incarnation, if it runs, and waits for it.
func (p *procWorker) kill() {
	if !p.alive() {
		return
	}
	_ = p.signal(syscall.SIGKILL)
	_, _ = p.wait(30 * time.Second)
}

// memory reads VmRSS and VmHWM (peak RSS) of the current incarnation from
// /proc, in bytes; zeros where there is no /proc.
func (p *procWorker) memory() (rss, hwm uint64) {
	pid := p.pid()
	if pid == 0 {
		return 0, 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			rss = v << 10
		case "VmHWM:":
			hwm = v << 10
		}
	}
	return rss, hwm
}

// logTail returns the last n lines of the worker's log.
func (p *procWorker) logTail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitRegistered waits until the worker registry shows the current
// incarnation of p running (its first heartbeat, written as it starts
// pulling).
func waitRegistered(ctx context.Context, workers jetstream.KeyValue, p *procWorker, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pid := p.pid()
	w, err := workers.Watch(ctx, session.LaneToken(p.id))
	if err != nil {
		return fmt.Errorf("worker %s: watch registry: %w", p.id, err)
	}
	defer w.Stop() //nolint:errcheck
	_, exited := p.current()
	for {
		select {
		case <-exited:
			return fmt.Errorf("worker %s exited before it registered; log:\n%s", p.id, p.logTail(20))
		case <-ctx.Done():
			return fmt.Errorf("worker %s (pid %d) did not register within %s; log:\n%s", p.id, pid, timeout, p.logTail(20))
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("worker %s: registry watch closed", p.id)
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var r worker.WorkerRecord
			if json.Unmarshal(e.Value(), &r) == nil && r.PID == pid && r.State == worker.StateRunning {
				p.mu.Lock()
				p.owner = r.Owner
				p.mu.Unlock()
				return nil
			}
		}
	}
}

// procFleet is a set of worker processes.
type procFleet struct {
	dir     string
	procs   []*procWorker
	workers jetstream.KeyValue
	drain   time.Duration
}

// startProcFleet starts n worker processes ("<prefix>1".."<prefix>n") of
// o.WorkerBinary against url and waits until each has registered.
func startProcFleet(ctx context.Context, dir, url string, res *broker.Resources, o Options, n int, prefix string, args []string, extraEnv ...string) (*procFleet, error) {
	f := &procFleet{dir: dir, workers: res.Workers, drain: fleetDrainTimeout}
	env := workerEnv(url, o, extraEnv...)
	for i := range n {
		p := newProcWorker(dir, o.WorkerBinary, fmt.Sprintf("%s%d", prefix, i+1), env, args...)
		if err := p.start(); err != nil {
			f.killAll()
			return nil, err
		}
		f.procs = append(f.procs, p)
	}
	for _, p := range f.procs {
		if err := waitRegistered(ctx, res.Workers, p, 30*time.Second); err != nil {
			f.killAll()
			return nil, fmt.Errorf("bench: %w", err)
		}
	}
	return f, nil
}

// byOwner returns the worker whose incarnation wrote owner (id/incarnation).
func (f *procFleet) byOwner(owner string) *procWorker {
	id, _, _ := strings.Cut(owner, "/")
	for _, p := range f.procs {
		if p.id == id {
			return p
		}
	}
	return nil
}

func (f *procFleet) killAll() {
	for _, p := range f.procs {
		p.kill()
	}
}

// counters are unknown for processes (their registry records lag by up to
// a heartbeat).
func (f *procFleet) counters() (int64, int64, bool) { return 0, 0, false }

// stop stops every worker gracefully (SIGTERM), in parallel; one that does
// not exit within its drain allowance is killed.
func (f *procFleet) stop() error {
	var wg sync.WaitGroup
	errs := make([]error, len(f.procs))
	for i, p := range f.procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.stop(f.drain + 30*time.Second)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// memory sums the RSS and the peak RSS of the running workers.
func (f *procFleet) memory() (rss, hwm uint64) {
	for _, p := range f.procs {
		r, h := p.memory()
		rss += r
		hwm += h
	}
	return rss, hwm
}
