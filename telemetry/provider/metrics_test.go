package provider_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/telemetry"
	"github.com/agentfleet/agentfleet/telemetry/provider"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

const waitTimeout = 60 * time.Second

// embeddedFleet is a worker, the HTTP ingress and its delivery consumer on
// an embedded NATS server, sharing one metric provider whose /metrics is
// served beside the ingress routes, as agentfleet up does.
type embeddedFleet struct {
	base string
	hc   *http.Client
}

func startFleet(t *testing.T, p *provider.Provider) *embeddedFleet {
	t.Helper()
	srv := natstest.RunServer(t)
	names := broker.MustNames("fleet")
	nc := srv.Connect(t)
	js := natstest.JetStream(t, nc)
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(nc, js, res, worker.Config{ID: "m1", Names: names, Backend: echo.Backend(echo.Options{}),
		LeaseTTL: 3 * time.Second, LeaseMargin: 500 * time.Millisecond, Linger: 500 * time.Millisecond,
		PeekInterval: 100 * time.Millisecond, DrainTimeout: 2 * time.Second, BacklogInterval: 200 * time.Millisecond, Metrics: p.Metrics})
	if err != nil {
		t.Fatal(err)
	}
	unobserve, err := p.Metrics.ObserveWorker("m1", func() telemetry.WorkerGauges {
		s := w.Status()
		return telemetry.WorkerGauges{LanesOwned: s.LanesOwned, TurnsRunning: s.TurnsRunning, CacheSize: s.CacheSize, WatcherLeader: s.Watcher}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unobserve() })
	if _, err := p.Metrics.ObserveConsumers(telemetry.ConsumerStates(js, names.InboxStream(), names.OutboxStream())); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := w.Run(ctx); err != nil {
			t.Errorf("worker: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })

	inc := srv.Connect(t)
	ijs := natstest.JetStream(t, inc)
	in, err := ingress.New(ijs, res, ingress.Config{Names: names, KeyOptions: session.DefaultKeyOptions()})
	if err != nil {
		t.Fatal(err)
	}
	del := ingress.NewDelivery(ijs, res, names, nil)
	del.SetMetrics(p.Metrics)
	if err := del.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(del.Stop)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", p.Handler())
	mux.Handle("/", in.Handler())
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	t.Cleanup(in.Close)
	return &embeddedFleet{base: hs.URL, hc: hs.Client()}
}

// send posts text to chat and waits for the reply after seq after; it
// returns the session key and the reply's seq.
func (f *embeddedFleet) send(t *testing.T, chat, text string, after uint64) (string, uint64) {
	t.Helper()
	key := f.post(t, chat, text)
	var seq uint64
	natstest.WaitFor(t, waitTimeout, "a reply to "+text, func() error {
		resp, err := f.hc.Get(fmt.Sprintf("%s/v1/sessions/%s/replies?after=%d&wait=2s", f.base, key, after))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var r struct {
			Replies []struct {
				Seq uint64 `json:"seq"`
			} `json:"replies"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			return err
		}
		if len(r.Replies) == 0 {
			return fmt.Errorf("no reply yet")
		}
		seq = r.Replies[len(r.Replies)-1].Seq
		return nil
	})
	return key, seq
}

// post posts text to chat, waits for nothing but its acceptance, and
// returns the session key.
func (f *embeddedFleet) post(t *testing.T, chat, text string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"chat_id": chat, "text": text})
	resp, err := f.hc.Post(f.base+"/v1/messages", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var acc struct {
		SessionKey string `json:"session_key"`
	}
	if resp.StatusCode != http.StatusAccepted || json.Unmarshal(data, &acc) != nil {
		t.Fatalf("POST %q: %d %s", text, resp.StatusCode, data)
	}
	return acc.SessionKey
}

// scrape reads /metrics with the Prometheus text parser.
func scrape(hc *http.Client, url string) (map[string]*dto.MetricFamily, error) {
	resp, err := hc.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// value sums the samples of family name whose labels include want (a
// counter's value, or a histogram's sample count); a family not exported
// yet is 0.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return 0
	}
	var sum float64
next:
	for _, m := range f.GetMetric() {
		for k, v := range want {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		}
	}
	return sum
}

// TestMetricsAfterWorkload runs a known workload through an embedded fleet
// (two answered turns in one chat, one failing turn in another) and reads
// the counters back from /metrics with the Prometheus text parser.
func TestMetricsAfterWorkload(t *testing.T) {
	p, err := provider.New(t.Context(), provider.Config{ServiceName: "agentfleet-test", Version: "test", Prometheus: true,
		Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	if p.Metrics == nil || p.Handler() == nil || p.OTLP() != "" {
		t.Fatalf("provider: metrics %v, handler %v, otlp %q; want Prometheus only", p.Metrics, p.Handler(), p.OTLP())
	}
	f := startFleet(t, p)

	_, seq := f.send(t, "metrics-a", "one", 0)
	f.send(t, "metrics-a", "two", seq)
	f.send(t, "metrics-b", "!fail", 0)

	type want struct {
		name   string
		labels map[string]string
		value  float64
	}
	wants := []want{
		{"agentfleet_turn_started_total", nil, 3},
		{"agentfleet_turn_ended_total", map[string]string{"agentfleet_turn_status": "completed"}, 2},
		{"agentfleet_turn_ended_total", map[string]string{"agentfleet_turn_status": "failed"}, 1},
		{"agentfleet_turn_ended_total", nil, 3},
		{"agentfleet_turn_duration_seconds", map[string]string{"agentfleet_turn_status": "completed"}, 2},
		// The echo agent reports one input token per message and one
		// output token per answer; the failed turn reports none.
		{"agentfleet_agent_tokens_total", map[string]string{"gen_ai_token_type": "input"}, 2},
		{"agentfleet_agent_tokens_total", map[string]string{"gen_ai_token_type": "output"}, 2},
		// Two answers and the failed turn's notice, each delivered once.
		{"agentfleet_delivery_attempts_total", map[string]string{"agentfleet_platform": "http"}, 3},
		{"agentfleet_delivery_failures_total", nil, 0},
		{"agentfleet_turn_resumed_total", nil, 0},
		{"agentfleet_lease_takeovers_total", nil, 0},
		{"agentfleet_lease_lost_total", nil, 0},
		{"agentfleet_turn_ended_total", map[string]string{"agentfleet_turn_status": "dead_lettered"}, 0},
		{"agentfleet_delivery_given_up_total", map[string]string{"agentfleet_platform": "http"}, 0},
		// Accept to reply: the two answers (the failed turn's notice is
		// not a reply).
		{"agentfleet_reply_latency_seconds", nil, 2},
		// Everything answered and acknowledged: no backlog, nothing in hand.
		{"agentfleet_consumer_pending", map[string]string{"messaging_consumer_group_name": "workers"}, 0},
		{"agentfleet_consumer_ack_pending", map[string]string{"messaging_consumer_group_name": "workers"}, 0},
		{"agentfleet_consumer_ack_pending", map[string]string{"messaging_consumer_group_name": "deliver_http"}, 0},
		{"agentfleet_watcher_leader", map[string]string{"agentfleet_worker_id": "m1"}, 1},
	}
	var fams map[string]*dto.MetricFamily
	// A reply is delivered while its turn commits: wait for the commits.
	natstest.WaitFor(t, waitTimeout, "the workload's metrics", func() error {
		var err error
		if fams, err = scrape(f.hc, f.base+"/metrics"); err != nil {
			return err
		}
		for _, w := range wants {
			if got := value(fams, w.name, w.labels); got != w.value {
				return fmt.Errorf("%s%v = %v, want %v", w.name, w.labels, got, w.value)
			}
		}
		return nil
	})
	// The series checked at zero are there, not merely absent.
	for _, w := range wants {
		if !hasSeries(fams, w.name, w.labels) {
			t.Errorf("no series %s%v in /metrics", w.name, w.labels)
		}
	}
	// Each chat's lane was acquired at least once, and the first turn of
	// each session had to build its agent.
	for _, w := range []want{{"agentfleet_lease_acquired_total", nil, 2}, {"agentfleet_agent_cache_misses_total", nil, 2}} {
		if got := value(fams, w.name, w.labels); got < w.value {
			t.Errorf("%s = %v, want at least %v", w.name, got, w.value)
		}
	}
}

// TestMetricsOffByDefault: with no Prometheus endpoint and no OTLP
// endpoint in the environment nothing is set up, and the nil Metrics the
// fleet gets record nothing.
func TestMetricsOffByDefault(t *testing.T) {
	p, err := provider.New(t.Context(), provider.Config{ServiceName: "agentfleet-test", Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	if p.Metrics != nil || p.Handler() != nil || p.OTLP() != "" || p.Tracer != nil || p.Traces() != "" {
		t.Fatalf("provider with nothing configured: metrics %v, handler %v, otlp %q; want none", p.Metrics, p.Handler(), p.OTLP())
	}
	p.Metrics.TurnStarted(t.Context()) // a nil Metrics is a no-op
	if err := p.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// hasSeries reports whether family name has a series whose labels include
// want.
func hasSeries(fams map[string]*dto.MetricFamily, name string, want map[string]string) bool {
next:
	for _, m := range fams[name].GetMetric() {
		for k, v := range want {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return true
	}
	return false
}
