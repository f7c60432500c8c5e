package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// chatProc is an `agentfleet chat` process driven through its stdin and
// stdout.
type chatProc struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	mu    sync.Mutex
	lines []string
	more  chan struct{}
	done  chan struct{}
}

func startChat(t *testing.T, base, chat string) *chatProc {
	t.Helper()
	cmd := exec.Command(binary, "chat", "--url", base, "--chat", chat, "--user", "tester", "--history", "3")
	cmd.Env = baseEnv()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &chatProc{t: t, cmd: cmd, stdin: stdin, more: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
			select {
			case p.more <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("chat output:\n%s\nstderr:\n%s", p.output(), stderr.String())
		}
	})
	return p
}

func (p *chatProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

func (p *chatProc) send(lines ...string) {
	p.t.Helper()
	for _, l := range lines {
		if _, err := io.WriteString(p.stdin, l+"\n"); err != nil {
			p.t.Fatalf("chat stdin: %v", err)
		}
	}
}

// expect waits until the output holds want (after the first `from` bytes).
func (p *chatProc) expect(want string) {
	p.t.Helper()
	waitFor(p.t, 60*time.Second, fmt.Sprintf("chat to print %q", want), func() error {
		if strings.Contains(p.output(), want) {
			return nil
		}
		return fmt.Errorf("output so far:\n%s", p.output())
	})
}

// TestChatClient drives `agentfleet chat` through stdin and stdout against
// a running `agentfleet up`: replies stream in as they come, multi-line
// input (a trailing \ and """ blocks) arrives as one message, fleet
// commands work, end of input waits for outstanding replies, and a new
// chat on the same conversation starts with its history.
func TestChatClient(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: multi-process tests are skipped under -short")
	}
	t.Parallel()
	dir := t.TempDir()
	addr := freeAddr(t)
	base := "http://" + addr
	up := newProc(t, dir, "up", []string{"AGENTFLEET_SESSION_RESET_MODE=none"}, "up", "--data", dir+"/data", "--http", addr)
	up.start()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	waitReady(t, &http.Client{Transport: tr, Timeout: 10 * time.Second}, base, up)

	chat := startChat(t, base, "chat-e2e")
	chat.expect("session agent:main:http:dm:chat-e2e")
	chat.send("hello fleet")
	chat.expect("agent> echo: hello fleet")
	chat.send(`first line \`, "second line")
	chat.expect("agent> echo: first line \n       second line")
	chat.send(`"""`, "block one", "", "block three", `"""`)
	chat.expect("       block three")
	chat.send("/status")
	chat.expect("notice> Session ")
	chat.send("/help")
	chat.expect("local commands:")
	chat.send("last words")
	if err := chat.stdin.Close(); err != nil {
		t.Fatal(err)
	}
	// End of input: chat waits for the reply, prints it, exits 0.
	select {
	case <-chat.done:
	case <-time.After(90 * time.Second):
		t.Fatal("chat did not exit after the end of its input")
	}
	if err := chat.cmd.Wait(); err != nil {
		t.Fatalf("chat exited with %v", err)
	}
	if !strings.Contains(chat.output(), "agent> echo: last words") {
		t.Fatalf("the reply to the last message was not printed before exit:\n%s", chat.output())
	}
	if n := strings.Count(chat.output(), "agent> echo: hello fleet"); n != 1 {
		t.Errorf("a reply printed %d times", n)
	}

	// A new session of the client shows the history first.
	again := startChat(t, base, "chat-e2e")
	again.expect("-- last 3 replies --")
	again.expect("agent> echo: last words")
	again.send("/quit")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	select {
	case <-again.done:
	case <-ctx.Done():
		t.Fatal("chat did not exit on /quit")
	}
}
