package e2e

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// TestTraceAcrossProcesses runs a NATS node, a worker and an ingress as
// three processes exporting their spans over OTLP/HTTP to a receiver in
// the test: one message's trace holds the ingress's request and publish,
// the worker's delivery, turn and reply publish, and the ingress's reply
// delivery, the trace context having crossed the processes in NATS headers.
func TestTraceAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: multi-process tests are skipped under -short")
	}
	t.Parallel()
	type span struct{ name, service, trace string }
	var mu sync.Mutex
	var spans []span
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path != "/v1/traces" {
			// Metrics go elsewhere: accepted and dropped.
			w.WriteHeader(http.StatusOK)
			return
		}
		var req coltrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, rs := range req.GetResourceSpans() {
			svc := ""
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.GetKey() == "service.name" {
					svc = kv.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					spans = append(spans, span{s.GetName(), svc, hex.EncodeToString(s.GetTraceId())})
				}
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	t.Cleanup(recv.Close)

	dir := t.TempDir()
	natsAddr, httpAddr := freeAddr(t), freeAddr(t)
	env := []string{"AGENTFLEET_NATS_URL=nats://" + natsAddr, "AGENTFLEET_SESSION_RESET_MODE=none",
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + recv.URL, "OTEL_BSP_SCHEDULE_DELAY=200", "OTEL_METRIC_EXPORT_INTERVAL=600000"}
	node := newProc(t, dir, "nats", env, "nats", "--listen", natsAddr, "--data", filepath.Join(dir, "nats"))
	node.start()
	node.waitLog(startTimeout, regexp.MustCompile(`nats node up`))
	worker := newProc(t, dir, "worker", env, "worker", "--id", "traced")
	worker.start()
	worker.waitLog(startTimeout, regexp.MustCompile(`exporting traces over OTLP`))
	ingress := newProc(t, dir, "ingress", env, "ingress", "--http", httpAddr)
	ingress.start()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	base := "http://" + httpAddr
	waitReady(t, hc, base, ingress)
	worker.waitLog(startTimeout, startedRE)

	body, _ := json.Marshal(map[string]string{"chat_id": "traced", "text": "hello"})
	resp, err := hc.Post(base+"/v1/messages", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var a acceptResp
	if resp.StatusCode != http.StatusAccepted || json.Unmarshal(data, &a) != nil {
		t.Fatalf("POST: %d %s", resp.StatusCode, data)
	}
	waitFor(t, 60*time.Second, "the reply", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/sessions/"+a.SessionKey+"/replies?after=0&wait=5s", nil)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var r struct{ Replies []reply }
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			return err
		}
		if len(r.Replies) == 0 {
			return fmt.Errorf("no reply yet")
		}
		return nil
	})

	want := []span{
		{name: "POST /v1/messages", service: "agentfleet-ingress"},
		{name: "inbox publish", service: "agentfleet-ingress"},
		{name: "inbox delivery", service: "agentfleet-worker"},
		{name: "turn", service: "agentfleet-worker"},
		{name: "agent run", service: "agentfleet-worker"},
		{name: "reply publish", service: "agentfleet-worker"},
		{name: "reply delivery", service: "agentfleet-ingress"},
	}
	waitFor(t, 60*time.Second, "the message's trace at the receiver", func() error {
		mu.Lock()
		defer mu.Unlock()
		traceID := ""
		for _, s := range spans {
			if s.name == "POST /v1/messages" {
				traceID = s.trace
			}
		}
		if traceID == "" {
			return fmt.Errorf("no request span among %d", len(spans))
		}
	next:
		for _, w := range want {
			for _, s := range spans {
				if s.name == w.name && s.service == w.service && s.trace == traceID {
					continue next
				}
			}
			return fmt.Errorf("no %s span of %s in trace %s (%d spans)", w.name, w.service, traceID, len(spans))
		}
		return nil
	})
}
