package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/session"
)

func chatCommand() *cli.Command {
	return &cli.Command{
		Name:  "chat",
		Usage: "talk to the fleet from the terminal, through the HTTP adapter",
		Description: `Each line you type is sent as a message of one conversation (an http DM
whose chat id is --chat); replies are printed as they arrive, streamed over
server-sent events. Fleet commands (/new, /status, /stop, /queue TEXT, /busy
MODE, /undo, /retry, /resume ID) are sent as they are.

Multi-line input: end a line with \ to continue it on the next, or put the
text between two lines holding only """.

Local commands: /history [N] prints the last N replies (default 10),
/session prints the session entry, /help, /quit (or end of input).
With input from a pipe, chat sends every message, waits until the fleet has
handled them and their replies are printed, then exits.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "url", EnvVars: []string{"AGENTFLEET_CHAT_URL"}, Usage: "base `URL` of the ingress (default: http.addr on this host)"},
			&cli.StringFlag{Name: "token", Usage: "bearer `TOKEN` (default: http.token)"},
			&cli.StringFlag{Name: "chat", Usage: "chat `ID` of the conversation (default cli-<user>)"},
			&cli.StringFlag{Name: "user", Usage: "your user `NAME` (default the login name)"},
			&cli.IntFlag{Name: "history", Value: 10, Usage: "replies of earlier turns to show at start"},
			&cli.DurationFlag{Name: "wait", Value: 2 * time.Minute, Usage: "at end of input, how long to wait for outstanding replies"},
		},
		Action: func(c *cli.Context) error {
			cfg, err := loadConfig(c, nil)
			if err != nil {
				return err
			}
			base := c.String("url")
			if base == "" {
				base = localURL(cfg.HTTP.Addr)
			}
			token := c.String("token")
			if token == "" {
				token = cfg.HTTP.Token
			}
			name := c.String("user")
			if name == "" {
				name = "user"
				if u, err := user.Current(); err == nil && u.Username != "" {
					name = u.Username
				}
			}
			chat := c.String("chat")
			if chat == "" {
				chat = "cli-" + name
			}
			cl := &chatClient{
				base: strings.TrimRight(base, "/"), token: token, chatID: chat, user: name,
				hc: &http.Client{}, out: c.App.Writer, history: c.Int("history"), wait: c.Duration("wait"),
			}
			if cl.out == nil {
				cl.out = os.Stdout
			}
			ctx, stop := signalContext(slog.New(slog.DiscardHandler))
			defer stop()
			return cl.run(ctx, c.App.Reader, isTerminal(os.Stdin))
		},
	}
}

// chatClient is one terminal conversation with the HTTP adapter.
type chatClient struct {
	base, token, chatID, user string
	hc                        *http.Client
	history                   int
	wait                      time.Duration

	outMu sync.Mutex
	out   io.Writer

	mu      sync.Mutex
	lastSeq uint64 // last reply seq printed
	sentSeq uint64 // inbox seq of the last message sent
	seen    chan struct{}
}

type chatReply struct {
	Seq       uint64 `json:"seq"`
	TurnID    string `json:"turn_id"`
	SessionID string `json:"session_id"`
	Text      string `json:"text"`
	Kind      string `json:"kind"`
}

func (c *chatClient) key() string {
	return session.BuildSessionKey(session.SessionSource{Platform: session.PlatformHTTP, ChatID: c.chatID, ChatType: session.ChatDM},
		session.KeyOptions{})
}

func (c *chatClient) printf(format string, args ...any) {
	c.outMu.Lock()
	defer c.outMu.Unlock()
	fmt.Fprintf(c.out, format, args...)
}

func (c *chatClient) run(ctx context.Context, in io.Reader, interactive bool) error {
	if in == nil {
		in = os.Stdin
	}
	c.seen = make(chan struct{}, 1)
	if err := c.showHistory(ctx, c.history, true); err != nil {
		return err
	}
	c.printf("connected to %s as %s, session %s (/help for commands)\n", c.base, c.user, c.key())

	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); c.stream(sctx) }()
	defer func() { cancel(); wg.Wait() }()

	lines := make(chan string)
	readErr := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
		readErr <- sc.Err()
		close(lines)
	}()

	prompt := func() {
		if interactive {
			c.printf("you> ")
		}
	}
	prompt()
	var pending []string // lines of a multi-line message
	block := false
	for {
		var line string
		var ok bool
		select {
		case <-ctx.Done():
			return nil
		case line, ok = <-lines:
		}
		if !ok {
			if err := <-readErr; err != nil {
				return fmt.Errorf("reading input: %w", err)
			}
			if len(pending) > 0 {
				if err := c.send(ctx, strings.Join(pending, "\n")); err != nil {
					return err
				}
			}
			return c.drain(ctx)
		}
		switch {
		case strings.TrimSpace(line) == `"""`:
			if block {
				block = false
				text := strings.Join(pending, "\n")
				pending = nil
				if err := c.send(ctx, text); err != nil {
					c.printf("error: %v\n", err)
				}
				prompt()
			} else {
				block = true
			}
			continue
		case block:
			pending = append(pending, line)
			continue
		case strings.HasSuffix(line, `\`):
			pending = append(pending, strings.TrimSuffix(line, `\`))
			continue
		}
		pending = append(pending, line)
		text := strings.Join(pending, "\n")
		pending = nil
		if strings.TrimSpace(text) == "" {
			prompt()
			continue
		}
		quit, err := c.local(ctx, text)
		if quit {
			return c.drain(ctx)
		}
		if err != nil {
			c.printf("error: %v\n", err)
		}
		prompt()
	}
}

// local runs a local command, or sends text; quit is true for /quit.
func (c *chatClient) local(ctx context.Context, text string) (quit bool, err error) {
	fields := strings.Fields(text)
	switch fields[0] {
	case "/quit", "/exit":
		return true, nil
	case "/help":
		c.printf("%s\n", `type a message and press enter; end a line with \ to continue it, or wrap text in """ lines
fleet commands: /new /reset /status /stop /queue TEXT /busy interrupt|queue|steer /undo /retry /resume ID
local commands: /history [N]  /session  /help  /quit`)
		return false, nil
	case "/history":
		n := 10
		if len(fields) > 1 {
			if n, err = strconv.Atoi(fields[1]); err != nil || n < 1 {
				return false, fmt.Errorf("/history N: N must be a positive number, not %q", fields[1])
			}
		}
		return false, c.showHistory(ctx, n, false)
	case "/session":
		body, err := c.do(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(c.key()), nil)
		if err != nil {
			return false, err
		}
		var e map[string]any
		if err := json.Unmarshal(body, &e); err != nil {
			return false, err
		}
		for _, k := range []string{"session_key", "session_id", "created_at", "updated_at", "busy_mode", "committed_seq", "input_tokens", "output_tokens"} {
			if v, ok := e[k]; ok {
				c.printf("  %-14s %v\n", k, v)
			}
		}
		return false, nil
	}
	return false, c.send(ctx, text)
}

// send posts one message; a 503 is retried (the message id makes the
// retry idempotent).
func (c *chatClient) send(ctx context.Context, text string) error {
	var b [8]byte
	_, _ = rand.Read(b[:])
	req := map[string]string{"chat_id": c.chatID, "chat_type": "dm", "user_id": c.user, "user_name": c.user,
		"message_id": "cli-" + hex.EncodeToString(b[:]), "text": text}
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		var body []byte
		body, err = c.do(ctx, http.MethodPost, "/v1/messages", req)
		if err == nil {
			var a struct {
				Seq uint64 `json:"seq"`
			}
			if json.Unmarshal(body, &a) == nil {
				c.mu.Lock()
				c.sentSeq = max(c.sentSeq, a.Seq)
				c.mu.Unlock()
			}
			return nil
		}
		var he *httpError
		if !errors.As(err, &he) || he.status != http.StatusServiceUnavailable {
			return err
		}
		if !sleepOrDone(ctx, time.Second) {
			return ctx.Err()
		}
	}
	return err
}

type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return fmt.Sprintf("%d: %s", e.status, e.msg) }

func (c *chatClient) do(ctx context.Context, method, path string, body any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(data)
	}
	rctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(data, &e)
		return nil, &httpError{status: resp.StatusCode, msg: e.Error}
	}
	return data, nil
}

// replies returns the replies after seq (one page), waiting up to wait for
// the first.
func (c *chatClient) replies(ctx context.Context, after uint64, wait time.Duration) ([]chatReply, error) {
	body, err := c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/sessions/%s/replies?after=%d&wait=%s", url.PathEscape(c.key()), after, wait), nil)
	if err != nil {
		return nil, err
	}
	var r struct {
		Replies []chatReply `json:"replies"`
	}
	return r.Replies, json.Unmarshal(body, &r)
}

// showHistory prints the last n replies of the conversation; at start it
// also sets where the live stream begins.
func (c *chatClient) showHistory(ctx context.Context, n int, start bool) error {
	var all []chatReply
	var after uint64
	for {
		page, err := c.replies(ctx, after, 0)
		var he *httpError
		if errors.As(err, &he) && he.status == http.StatusUnauthorized {
			return fmt.Errorf("the fleet at %s refused the request: %s; give its token with --token, or set http.token (AGENTFLEET_HTTP_TOKEN)", c.base, he.msg)
		}
		if err != nil {
			return fmt.Errorf("cannot reach the fleet at %s: %w", c.base, err)
		}
		if len(page) == 0 {
			break
		}
		all = append(all, page...)
		if len(all) > n {
			all = all[len(all)-n:]
		}
		after = page[len(page)-1].Seq
	}
	if len(all) > 0 {
		c.printf("-- last %d replies --\n", len(all))
		for _, r := range all {
			c.printReply(r)
		}
		c.printf("--\n")
	}
	if start {
		c.mu.Lock()
		c.lastSeq = after
		c.mu.Unlock()
	}
	return nil
}

func (c *chatClient) printReply(r chatReply) {
	who := "agent"
	if r.Kind == session.ReplyKindNotice {
		who = "notice"
	}
	c.printf("%s> %s\n", who, strings.ReplaceAll(r.Text, "\n", "\n"+strings.Repeat(" ", len(who)+2)))
}

// stream prints replies as they arrive, from the event stream, reconnecting
// with Last-Event-ID until ctx ends.
func (c *chatClient) stream(ctx context.Context) {
	backoff := 500 * time.Millisecond
	for ctx.Err() == nil {
		err := c.streamOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			c.printf("(event stream interrupted: %v; reconnecting)\n", err)
		}
		if !sleepOrDone(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

func (c *chatClient) streamOnce(ctx context.Context) error {
	c.mu.Lock()
	after := c.lastSeq
	c.mu.Unlock()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		fmt.Sprintf("%s/v1/sessions/%s/events?after=%d", c.base, url.PathEscape(c.key()), after), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "text/event-stream")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("events: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var data strings.Builder
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "data:"):
			data.WriteString(strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		case line == "":
			if data.Len() == 0 {
				continue
			}
			var r chatReply
			if err := json.Unmarshal([]byte(data.String()), &r); err == nil {
				c.mu.Lock()
				fresh := r.Seq > c.lastSeq
				if fresh {
					c.lastSeq = r.Seq
				}
				c.mu.Unlock()
				if fresh {
					c.printReply(r)
					select {
					case c.seen <- struct{}{}:
					default:
					}
				}
			}
			data.Reset()
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return io.ErrUnexpectedEOF
}

// drain waits, at the end of the input, until the fleet has handled every
// message sent (the session's committed_seq reaches the last one) and no
// further reply arrives for a moment, or until --wait.
func (c *chatClient) drain(ctx context.Context) error {
	c.mu.Lock()
	sent := c.sentSeq
	c.mu.Unlock()
	if sent == 0 {
		return nil
	}
	deadline := time.Now().Add(c.wait)
	for time.Now().Before(deadline) {
		body, err := c.do(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(c.key()), nil)
		if err == nil {
			var e struct {
				CommittedSeq uint64 `json:"committed_seq"`
			}
			if json.Unmarshal(body, &e) == nil && e.CommittedSeq >= sent {
				break
			}
		}
		if !sleepOrDone(ctx, 200*time.Millisecond) {
			return nil
		}
	}
	// The last replies reach the mailbox just after the commit: print
	// until none has come for a while.
	for time.Now().Before(deadline) {
		c.mu.Lock()
		after := c.lastSeq
		c.mu.Unlock()
		page, err := c.replies(ctx, after, 2*time.Second)
		if err != nil || len(page) == 0 {
			break
		}
		// The event stream prints them; wait until it has.
		t := time.NewTimer(5 * time.Second)
		select {
		case <-c.seen:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	if time.Now().After(deadline) {
		c.printf("(gave up waiting for replies after %s)\n", c.wait)
	}
	return nil
}

// localURL is the URL at which this host reaches an HTTP server listening
// on addr (":8080", "0.0.0.0:8080", "[::]:8080" are reached on loopback).
func localURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port)
}

func sleepOrDone(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
