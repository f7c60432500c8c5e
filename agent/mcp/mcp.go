// Package mcp offers the tools of MCP (Model Context Protocol) servers to
// the openai backend, on the official MCP Go SDK. A server is a command,
// run with its standard input and output as the transport, or the URL of a
// streamable HTTP server. A server whose connection ends (the process
// died, the HTTP session was lost) is connected again on next use; a tool
// call that does not answer within the timeout fails (the model is told),
// and the turn goes on.
package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentfleet/agentfleet/agent/openai"
)

// DefaultToolTimeout bounds a tool call when Config.ToolTimeout is zero.
const DefaultToolTimeout = 2 * time.Minute

// Server is one MCP server: Command or URL.
type Server struct {
	// Name prefixes its tools' names: "<name>__<tool>". Required, unique,
	// [A-Za-z0-9_-]{1,32}.
	Name string
	// Command is the program and its arguments, for the stdio transport.
	Command []string
	// Env adds variables to the command's environment.
	Env map[string]string
	// URL is the endpoint of a streamable HTTP server.
	URL string
	// Headers are sent with every HTTP request.
	Headers map[string]string
}

// Config configures the tools.
type Config struct {
	Servers []Server
	// ToolTimeout bounds one tool call. Defaults to DefaultToolTimeout.
	ToolTimeout time.Duration
	// Logger defaults to discarding.
	Logger *slog.Logger
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

// Tools are the tools of the configured servers. It implements
// openai.Tools and is safe for concurrent use.
type Tools struct {
	cfg     Config
	client  *sdk.Client
	servers []*server
	byName  map[string]*server
}

var _ openai.Tools = (*Tools)(nil)

// New checks cfg and returns the tools. Servers are connected on first use,
// so a server that is down at start does not stop the worker.
func New(cfg Config) (*Tools, error) {
	if cfg.ToolTimeout <= 0 {
		cfg.ToolTimeout = DefaultToolTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	t := &Tools{cfg: cfg, client: sdk.NewClient(&sdk.Implementation{Name: "agentfleet", Version: "1"}, nil), byName: map[string]*server{}}
	for _, s := range cfg.Servers {
		switch {
		case !nameRE.MatchString(s.Name):
			return nil, fmt.Errorf("mcp: server name %q: want 1 to 32 letters, digits, '_' or '-'", s.Name)
		case t.byName[s.Name] != nil:
			return nil, fmt.Errorf("mcp: two servers are named %q", s.Name)
		case (len(s.Command) == 0) == (s.URL == ""):
			return nil, fmt.Errorf("mcp: server %q: give a command or a url", s.Name)
		}
		srv := &server{cfg: s, t: t}
		t.servers = append(t.servers, srv)
		t.byName[s.Name] = srv
	}
	return t, nil
}

// List implements openai.Tools: the tools of every server that answers. A
// server that cannot be reached is left out (and logged); an error is
// returned only when no server answered.
func (t *Tools) List(ctx context.Context) ([]openai.Tool, error) {
	var out []openai.Tool
	var errs []error
	for _, s := range t.servers {
		tools, err := s.list(ctx)
		if err != nil {
			t.cfg.Logger.WarnContext(ctx, "mcp server unavailable", slog.String("mcp_server", s.cfg.Name), slog.Any("error", err))
			errs = append(errs, err)
			continue
		}
		out = append(out, tools...)
	}
	if len(out) == 0 && len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// Call implements openai.Tools.
func (t *Tools) Call(ctx context.Context, name, arguments string) (string, error) {
	srvName, _, ok := strings.Cut(name, "__")
	s := t.byName[srvName]
	if !ok || s == nil {
		return "", fmt.Errorf("no tool %q", name)
	}
	return s.call(ctx, name, arguments)
}

// Close disconnects every server (a command is stopped).
func (t *Tools) Close() error {
	var errs []error
	for _, s := range t.servers {
		if err := s.close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// server is one configured server and its current session.
type server struct {
	cfg   Server
	t     *Tools
	mu    sync.Mutex
	sess  *sdk.ClientSession
	tools map[string]string // model-facing name -> the server's tool name
}

// session returns the live session, connecting (again) when there is none.
func (s *server) session(ctx context.Context) (*sdk.ClientSession, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sess != nil {
		return s.sess, nil
	}
	var tr sdk.Transport
	if len(s.cfg.Command) > 0 {
		cmd := exec.Command(s.cfg.Command[0], s.cfg.Command[1:]...)
		cmd.Env = os.Environ()
		for k, v := range s.cfg.Env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		tr = &sdk.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}
	} else {
		tr = &sdk.StreamableClientTransport{Endpoint: s.cfg.URL, HTTPClient: &http.Client{Transport: headers(s.cfg.Headers)},
			DisableStandaloneSSE: true}
	}
	sess, err := s.t.client.Connect(ctx, tr, nil)
	if err != nil {
		return nil, fmt.Errorf("mcp: connect to %s: %w", s.cfg.Name, err)
	}
	s.sess = sess
	// When the connection ends (the process died), forget the session: the
	// next use connects again.
	go func() {
		_ = sess.Wait()
		s.mu.Lock()
		if s.sess == sess {
			s.sess = nil
		}
		s.mu.Unlock()
	}()
	return sess, nil
}

// drop forgets sess after a failure that may have ended it.
func (s *server) drop(sess *sdk.ClientSession) {
	s.mu.Lock()
	if s.sess == sess {
		s.sess = nil
	}
	s.mu.Unlock()
	_ = sess.Close()
}

func (s *server) list(ctx context.Context) ([]openai.Tool, error) {
	for try := 0; ; try++ {
		sess, err := s.session(ctx)
		if err != nil {
			return nil, err
		}
		res, err := sess.ListTools(ctx, &sdk.ListToolsParams{})
		if err != nil {
			s.drop(sess)
			if try == 0 && ctx.Err() == nil {
				continue // a session that died since: connect again, once
			}
			return nil, fmt.Errorf("mcp: list the tools of %s: %w", s.cfg.Name, err)
		}
		names := map[string]string{}
		var out []openai.Tool
		for _, tl := range res.Tools {
			name := modelName(s.cfg.Name, tl.Name)
			names[name] = tl.Name
			params := map[string]any{"type": "object", "properties": map[string]any{}}
			if tl.InputSchema != nil {
				if data, err := json.Marshal(tl.InputSchema); err == nil {
					var m map[string]any
					if json.Unmarshal(data, &m) == nil && len(m) > 0 {
						params = m
					}
				}
			}
			out = append(out, openai.Tool{Name: name, Description: tl.Description, Parameters: params})
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
		s.mu.Lock()
		s.tools = names
		s.mu.Unlock()
		return out, nil
	}
}

func (s *server) call(ctx context.Context, name, arguments string) (string, error) {
	s.mu.Lock()
	tool, ok := s.tools[name]
	s.mu.Unlock()
	if !ok {
		return "", fmt.Errorf("no tool %q", name)
	}
	var args map[string]any
	if strings.TrimSpace(arguments) != "" {
		if err := json.Unmarshal([]byte(arguments), &args); err != nil {
			return "", fmt.Errorf("the arguments are not a JSON object: %w", err)
		}
	}
	sess, err := s.session(ctx)
	if err != nil {
		return "", err
	}
	cctx, cancel := context.WithTimeoutCause(ctx, s.t.cfg.ToolTimeout, errToolTimeout)
	defer cancel()
	res, err := sess.CallTool(cctx, &sdk.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		if ctx.Err() != nil {
			return "", context.Cause(ctx)
		}
		if errors.Is(context.Cause(cctx), errToolTimeout) {
			return "", fmt.Errorf("tool %s did not answer within %s", name, s.t.cfg.ToolTimeout)
		}
		// The server may have died: the next use connects again. The call
		// is not repeated: it may have had effects.
		s.drop(sess)
		return "", fmt.Errorf("tool %s: %w", name, err)
	}
	var b strings.Builder
	for _, c := range res.Content {
		switch c := c.(type) {
		case *sdk.TextContent:
			b.WriteString(c.Text)
		default:
			if data, err := json.Marshal(c); err == nil {
				b.Write(data)
			}
		}
	}
	if res.IsError {
		return "", fmt.Errorf("tool %s failed: %s", name, b.String())
	}
	return b.String(), nil
}

var errToolTimeout = errors.New("mcp: tool call timed out")

func (s *server) close() error {
	s.mu.Lock()
	sess := s.sess
	s.sess = nil
	s.mu.Unlock()
	if sess == nil {
		return nil
	}
	return sess.Close()
}

// modelName is the name the model sees: "<server>__<tool>", with what a
// model refuses in a name replaced by '_', at most 64 bytes.
func modelName(serverName, tool string) string {
	n := []byte(serverName + "__" + tool)
	for i, c := range n {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			n[i] = '_'
		}
	}
	if len(n) > 64 {
		n = n[:64]
	}
	return string(n)
}

// headers adds fixed headers to every request.
type headers map[string]string

func (h headers) RoundTrip(r *http.Request) (*http.Response, error) {
	if len(h) > 0 {
		r = r.Clone(r.Context())
		for k, v := range h {
			r.Header.Set(k, v)
		}
	}
	return http.DefaultTransport.RoundTrip(r)
}
