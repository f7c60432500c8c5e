package worker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// provisionFleet is the set-up the package's internal tests share: an
// embedded server, a connection to it and the fleet "fleet" provisioned on
// it with the lease TTL ttl.
func provisionFleet(t *testing.T, ttl time.Duration) (*natstest.Server, *nats.Conn, jetstream.JetStream, broker.Names, *broker.Resources) {
	t.Helper()
	srv := natstest.RunServer(t)
	nc := srv.Connect(t)
	js := natstest.JetStream(t, nc)
	names := broker.MustNames("fleet")
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names, LeaseTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return srv, nc, js, names, res
}

// runWorker runs w until the returned stop is called, or the test ends.
// stop waits for Run to return and reports its error, prefixed by label,
// as a test error; it may be called more than once.
func runWorker(t *testing.T, w *Worker, label string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: %v", label, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// gatedBackend is an agent backend whose turns in the lanes of chats wait
// until open is called with their chat (or 2 minutes pass) and then answer
// "done"; the turns of every other lane echo. open may be called more than
// once.
func gatedBackend(chats ...string) (backend agent.Backend, open func(chat string)) {
	gates := map[string]chan struct{}{}
	for _, chat := range chats {
		key, _ := chatLane(chat)
		gates[key] = make(chan struct{})
	}
	var gateOnce sync.Map
	open = func(chat string) {
		key, _ := chatLane(chat)
		if _, done := gateOnce.LoadOrStore(key, true); !done {
			close(gates[key])
		}
	}
	echoBackend := echo.Backend(echo.Options{})
	backend = agent.BackendFunc(func(ctx context.Context, key, sid string) (agent.Agent, error) {
		gate := gates[key]
		if gate == nil {
			return echoBackend.NewAgent(ctx, key, sid)
		}
		return agent.AgentFunc(func(ctx context.Context, tn *agent.Turn, emit agent.Emitter) (*agent.Result, error) {
			select {
			case <-gate:
			case <-time.After(2 * time.Minute):
			}
			return &agent.Result{Text: "done"}, nil
		}), nil
	})
	return backend, open
}
