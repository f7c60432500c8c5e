package telemetry_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/telemetry"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

// collect sends a $SRV request on subject and gathers n answers.
func collect(t *testing.T, nc *nats.Conn, subject string, n int) [][]byte {
	t.Helper()
	inbox := nats.NewInbox()
	var mu sync.Mutex
	var got [][]byte
	attempt := 0
	sub, err := nc.Subscribe(inbox+".*", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		if m.Subject == fmt.Sprintf("%s.%d", inbox, attempt) { // answers to an older request are dropped
			got = append(got, m.Data)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck
	// A request the services missed (their subscriptions not yet seen by
	// this connection's server) is sent again, with the answers reset.
	var sent time.Time
	natstest.WaitFor(t, 30*time.Second, fmt.Sprintf("%d answers on %s", n, subject), func() error {
		mu.Lock()
		k := len(got)
		if k >= n {
			mu.Unlock()
			return nil
		}
		if !sent.IsZero() && time.Since(sent) < 2*time.Second {
			mu.Unlock()
			return fmt.Errorf("%d answers", k)
		}
		got = nil
		sent = time.Now()
		attempt++
		reply := fmt.Sprintf("%s.%d", inbox, attempt)
		mu.Unlock()
		if err := nc.PublishRequest(subject, reply, nil); err != nil {
			return err
		}
		return fmt.Errorf("request sent")
	})
	mu.Lock()
	defer mu.Unlock()
	return got
}

// TestWorkersListedAsMicroServices registers two real workers' micro
// services, as agentfleet worker does, and discovers them with the micro
// protocol's PING, INFO and STATS ($SRV.*), and asks one for its status.
func TestWorkersListedAsMicroServices(t *testing.T) {
	srv := natstest.RunServer(t)
	names := broker.MustNames("fleet")
	nc := srv.Connect(t)
	js := natstest.JetStream(t, nc)
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, id := range []string{"svc-1", "svc-2"} {
		wnc := srv.Connect(t)
		w, err := worker.New(wnc, natstest.JetStream(t, wnc), res, worker.Config{ID: id, Names: names,
			Backend: echo.Backend(echo.Options{}), LeaseTTL: 3 * time.Second, DrainTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		svc, err := telemetry.AddService(wnc, telemetry.ServiceConfig{Name: names.ServiceName("worker"), Version: "1.2.3",
			Description: "test worker", Metadata: map[string]string{"worker_id": id},
			Subject: names.ServiceStatusSubject("worker", session.LaneToken(id)), Status: func() any { return w.Status() }})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer svc.Stop() //nolint:errcheck
			if err := w.Run(ctx); err != nil {
				t.Errorf("worker %s: %v", id, err)
			}
		}()
	}

	ping, _ := micro.ControlSubject(micro.PingVerb, "", "")
	var ids []string
	for _, data := range collect(t, nc, ping, 2) {
		var p micro.Ping
		if err := json.Unmarshal(data, &p); err != nil {
			t.Fatal(err)
		}
		if p.Name != "agentfleet-worker" || p.Version != "1.2.3" {
			t.Fatalf("PING answer %+v, want agentfleet-worker 1.2.3", p)
		}
		ids = append(ids, p.Metadata["worker_id"])
	}
	sort.Strings(ids)
	if fmt.Sprint(ids) != "[svc-1 svc-2]" {
		t.Fatalf("PING lists workers %v, want [svc-1 svc-2]", ids)
	}

	info, _ := micro.ControlSubject(micro.InfoVerb, "agentfleet-worker", "")
	for _, data := range collect(t, nc, info, 2) {
		var in micro.Info
		if err := json.Unmarshal(data, &in); err != nil {
			t.Fatal(err)
		}
		want := names.ServiceStatusSubject("worker", session.LaneToken(in.Metadata["worker_id"]))
		if len(in.Endpoints) != 1 || in.Endpoints[0].Subject != want {
			t.Fatalf("INFO endpoints %+v, want one on %s", in.Endpoints, want)
		}
	}

	stats, _ := micro.ControlSubject(micro.StatsVerb, "agentfleet-worker", "")
	for _, data := range collect(t, nc, stats, 2) {
		var st micro.Stats
		if err := json.Unmarshal(data, &st); err != nil {
			t.Fatal(err)
		}
		if len(st.Endpoints) != 1 {
			t.Fatalf("STATS endpoints %+v, want one", st.Endpoints)
		}
		var ws map[string]any
		if err := json.Unmarshal(st.Endpoints[0].Data, &ws); err != nil {
			t.Fatalf("STATS data %s: %v", st.Endpoints[0].Data, err)
		}
		for _, k := range []string{"lanes_owned", "turns_running", "cache_size"} {
			if _, ok := ws[k]; !ok {
				t.Fatalf("STATS data %s has no %s", st.Endpoints[0].Data, k)
			}
		}
		if ws["id"] != st.Metadata["worker_id"] {
			t.Fatalf("STATS of %s reports worker %v", st.Metadata["worker_id"], ws["id"])
		}
	}

	msg, err := nc.Request(names.ServiceStatusSubject("worker", session.LaneToken("svc-2")), nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var s worker.Status
	if err := json.Unmarshal(msg.Data, &s); err != nil || s.ID != "svc-2" {
		t.Fatalf("status of svc-2: %s (%v)", msg.Data, err)
	}
}
