package agentfleet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet"
	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/broker"
)

// A Go program runs a worker with its own agent, and the HTTP adapter, on
// an embedded NATS server; a user message posted over HTTP is answered.
func Example() {
	dir, _ := os.MkdirTemp("", "agentfleet-example-")
	defer os.RemoveAll(dir)
	srv, err := broker.StartServer(broker.ServerConfig{DataDir: dir}) // or connect to your NATS cluster
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL(), nats.InProcessServer(srv))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	// The agent: any agent.Agent. This one shouts, streaming as it goes.
	shout := agent.AgentFunc(func(ctx context.Context, t *agent.Turn, emit agent.Emitter) (*agent.Result, error) {
		text := strings.ToUpper(t.Messages[0].Text)
		if err := emit.Delta(ctx, text); err != nil {
			return nil, err
		}
		return &agent.Result{Text: text}, nil
	})
	backend := agent.BackendFunc(func(context.Context, string, string) (agent.Agent, error) { return shout, nil })

	ctx, stop := context.WithCancel(context.Background())
	w, err := agentfleet.NewWorker(ctx, nc, agentfleet.Options{Backend: backend, ID: "example"})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { stop(); <-done; _ = backend.Close() }()

	h, err := agentfleet.NewHTTP(ctx, nc, agentfleet.HTTPOptions{})
	if err != nil {
		log.Fatal(err)
	}
	api := httptest.NewServer(h.Handler())
	defer h.Close()
	defer api.Close()

	resp, err := http.Post(api.URL+"/v1/messages", "application/json", strings.NewReader(`{"chat_id":"c1","text":"hello fleet"}`))
	if err != nil {
		log.Fatal(err)
	}
	var accepted struct {
		SessionKey string `json:"session_key"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&accepted)
	resp.Body.Close()

	resp, err = http.Get(api.URL + "/v1/sessions/" + accepted.SessionKey + "/replies?wait=60s")
	if err != nil {
		log.Fatal(err)
	}
	var got struct {
		Replies []struct{ Text string } `json:"replies"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	fmt.Println(got.Replies[0].Text)
	// Output: HELLO FLEET
}
