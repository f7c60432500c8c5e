package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/worker"
)

// repoRoot is the module's root directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller information")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// startPythonAgent runs examples/bridge-python/agent.py on a free port and
// returns its turn URL.
func startPythonAgent(t *testing.T) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed")
	}
	cmd := exec.Command(py, filepath.Join(repoRoot(t), "examples", "bridge-python", "agent.py"), "--listen", "127.0.0.1:0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "python-agent.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			if data, err := os.ReadFile(logPath); err == nil {
				t.Logf("python agent log:\n%s", data)
			}
		}
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case line := <-lines:
		base, ok := strings.CutPrefix(line, "listening on ")
		if !ok {
			t.Fatalf("the python agent said %q", line)
		}
		return base + "/turn"
	case <-time.After(startTimeout):
		t.Fatal("the python agent did not start")
		return ""
	}
}

// TestBridgeUpAnswers runs `agentfleet up --agent bridge` in front of the
// Python reference agent: an interim message and the reply reach the user.
func TestBridgeUpAnswers(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: multi-process tests are skipped under -short")
	}
	t.Parallel()
	url := startPythonAgent(t)
	dir := t.TempDir()
	addr := freeAddr(t)
	up := newProc(t, dir, "up", []string{"AGENTFLEET_SESSION_RESET_MODE=none", "AGENTFLEET_AGENT_BRIDGE_URL=" + url},
		"up", "--data", dir+"/data", "--http", addr, "--agent", "bridge")
	up.start()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c := &cluster{t: t, httpBase: "http://" + addr, hc: &http.Client{Transport: tr, Timeout: 90 * time.Second}}
	waitReady(t, c.hc, c.httpBase, up)
	a := c.post("bridge-up", "hello from python\n!say one moment", "")
	got := c.waitReplies(a.SessionKey, 2, 60*time.Second)
	if got[0].Text != "one moment" || got[1].Text != "echo: hello from python" || got[1].Kind != session.ReplyKindReply {
		t.Fatalf("replies %+v, want the interim message then the echo", got)
	}
}

// TestBridgeKillMidTurnResumes kills (SIGKILL) the worker whose bridge turn
// is running: another worker resumes the turn through the bridge, and the
// agent gets the restart-resume note.
func TestBridgeKillMidTurnResumes(t *testing.T) {
	url := startPythonAgent(t)
	c := newCluster(t)
	c.startIngress()
	env := []string{"AGENTFLEET_AGENT_BACKEND=bridge", "AGENTFLEET_AGENT_BRIDGE_URL=" + url}
	workers := []*workerProc{c.startWorker("b1", env...), c.startWorker("b2", env...)}

	a := c.post("bridge-kill", "resume me\n!notes\n!sleep 6s", "")
	lane := session.LaneToken(a.SessionKey)
	var victim, rescuer *workerProc
	var turnID string
	waitFor(t, 30*time.Second, "a worker to be mid-turn on the lane", func() error {
		e, err := c.entry(a.SessionKey)
		if err != nil {
			return err
		}
		if e.Turn == nil || e.Turn.Attempt != 1 {
			return fmt.Errorf("no first attempt in flight (committed %d)", e.CommittedSeq)
		}
		for i, w := range workers {
			if e.Owner == w.owner {
				victim, rescuer = w, workers[1-i]
			}
		}
		if victim == nil {
			return fatalf("the lane is owned by %q", e.Owner)
		}
		for _, ev := range c.laneTurnEvents(lane) {
			if ev.Type == "start" && ev.TurnID == e.Turn.ID && time.Since(ev.At) > time.Second {
				turnID = e.Turn.ID
				return nil
			}
		}
		return errors.New("the turn has not run a second yet")
	})
	victim.kill()

	var resumed worker.TurnEvent
	waitFor(t, 60*time.Second, "the resumed attempt to start on the other worker", func() error {
		for _, ev := range c.laneTurnEvents(lane) {
			if ev.Type == "start" && ev.TurnID == turnID && ev.Attempt >= 2 {
				resumed = ev
				return nil
			}
		}
		return errors.New("no resumed attempt yet")
	})
	if resumed.Owner != rescuer.owner {
		t.Errorf("resumed by %s, want %s", resumed.Owner, rescuer.owner)
	}
	got := c.waitReplies(a.SessionKey, 1, 60*time.Second)
	waitFor(t, 30*time.Second, "the lane to settle", func() error { return c.committed(a.SessionKey, a.Seq) })
	box := c.allReplies(a.SessionKey)
	if len(box) != 1 || box[0].TurnID != turnID || !strings.HasPrefix(got[0].Text, "echo: resume me\n") {
		t.Fatalf("mailbox %+v, want the one reply of turn %s", box, turnID)
	}
	if notes := resumeNotes(box[0].Text); len(notes) != 1 {
		t.Errorf("reply %q has %d restart-resume notes, want 1", box[0].Text, len(notes))
	}
	checkRepliesOnce(t, a.SessionKey, c.load(box[0].SessionID), box)
}
