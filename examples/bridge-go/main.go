// Command bridge-go is a reference agent for the agentfleet bridge, written
// in Go: it implements agent.Agent and serves it with bridge.Handler, which
// speaks the protocol of docs/agents.md. Point the fleet at it:
//
//	go run ./examples/bridge-go --listen 127.0.0.1:8091
//	AGENTFLEET_AGENT_BRIDGE_URL=http://127.0.0.1:8091/turn agentfleet up --agent bridge
//
// It answers in capitals, streaming word by word; a message that asks for
// "the time" makes it call a clock tool first. Replace Run with a call to
// your model and tools.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/agent/bridge"
)

// shouter answers every turn in capitals.
type shouter struct {
	now func() time.Time
}

func (s shouter) Run(ctx context.Context, t *agent.Turn, emit agent.Emitter) (*agent.Result, error) {
	var in []string
	for _, m := range t.Messages {
		in = append(in, m.Text)
	}
	text := strings.Join(in, " ")
	if strings.Contains(strings.ToLower(text), "the time") {
		// A tool call is recorded before the tool runs, its result after.
		call := agent.ToolCall{ID: t.TurnID + "-clock", Name: "clock", Arguments: "{}"}
		if err := emit.ToolCall(ctx, call); err != nil {
			return nil, err
		}
		if err := emit.ToolResult(ctx, call.ID, call.Name, s.now().UTC().Format(time.Kitchen)); err != nil {
			return nil, err
		}
	}
	var reply strings.Builder
	for i, w := range strings.Fields(strings.ToUpper(text)) {
		if i > 0 {
			w = " " + w
		}
		reply.WriteString(w)
		if err := emit.Delta(ctx, w); err != nil {
			// Cancelled: what was streamed is the partial reply.
			return &agent.Result{Text: reply.String()}, err
		}
	}
	if err := emit.Usage(ctx, agent.Usage{InputTokens: int64(len(text)), OutputTokens: int64(reply.Len())}); err != nil {
		return nil, err
	}
	return &agent.Result{Text: reply.String(), FinishReason: "stop"}, nil
}

func (shouter) Close() error { return nil }

func main() {
	listen := flag.String("listen", "127.0.0.1:8091", "`HOST:PORT` to listen on (port 0: any free port)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error("listen", slog.Any("error", err))
		os.Exit(1)
	}
	fmt.Printf("listening on http://%s\n", ln.Addr())
	mux := http.NewServeMux()
	mux.Handle("POST /turn", bridge.Handler(shouter{now: time.Now}, log))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		log.Error("serve", slog.Any("error", err))
		os.Exit(1)
	}
}
