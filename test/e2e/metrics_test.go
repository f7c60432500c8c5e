package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TestUpMetricsAndServices runs `agentfleet up` with --metrics and a NATS
// port, answers one message, then reads agentfleet_turn_ended_total from
// /metrics on both the HTTP address and the metrics address, and lists the
// process's micro services (two workers, one ingress) with PING.
func TestUpMetricsAndServices(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: multi-process tests are skipped under -short")
	}
	t.Parallel()
	dir := t.TempDir()
	addr, maddr, naddr := freeAddr(t), freeAddr(t), freeAddr(t)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	up := newProc(t, dir, "up", []string{"AGENTFLEET_SESSION_RESET_MODE=none"},
		"up", "--data", dir+"/data", "--http", addr, "--metrics", maddr, "--nats-listen", naddr, "--workers", "2")
	up.start()
	waitReady(t, hc, "http://"+addr, up)

	body, _ := json.Marshal(map[string]string{"chat_id": "metrics-1", "text": "hello"})
	resp, err := hc.Post("http://"+addr+"/v1/messages", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST: %s", resp.Status)
	}
	for _, base := range []string{"http://" + addr, "http://" + maddr} {
		waitFor(t, 60*time.Second, "a completed turn on "+base+"/metrics", func() error {
			resp, err := hc.Get(base + "/metrics")
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			p := expfmt.NewTextParser(model.UTF8Validation)
			fams, err := p.TextToMetricFamilies(resp.Body)
			if err != nil {
				return err
			}
			f := fams["agentfleet_turn_ended_total"]
			if f == nil || len(f.GetMetric()) == 0 {
				return fmt.Errorf("no agentfleet_turn_ended_total yet")
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "agentfleet_turn_status" && l.GetValue() == "completed" && m.GetCounter().GetValue() == 1 {
						return nil
					}
				}
			}
			return fmt.Errorf("agentfleet_turn_ended_total %v", f.GetMetric())
		})
	}

	// The watcher's leader (one of the two workers) exports the inbox
	// backlog of all 64 partitions, nothing waiting once the turn is done.
	waitFor(t, 60*time.Second, "agentfleet_inbox_backlog on "+maddr, func() error {
		resp, err := hc.Get("http://" + maddr + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(resp.Body)
		if err != nil {
			return err
		}
		f := fams["agentfleet_inbox_backlog"]
		if n := len(f.GetMetric()); n != 64 {
			return fmt.Errorf("agentfleet_inbox_backlog has %d series, want 64", n)
		}
		for _, m := range f.GetMetric() {
			if v := m.GetGauge().GetValue(); v != 0 {
				return fmt.Errorf("agentfleet_inbox_backlog %v = %v, want 0", m.GetLabel(), v)
			}
		}
		return nil
	})

	nc, err := nats.Connect("nats://" + naddr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	inbox := nats.NewInbox()
	var mu sync.Mutex
	seen := map[string]int{}
	sub, err := nc.Subscribe(inbox, func(m *nats.Msg) {
		var p micro.Ping
		if json.Unmarshal(m.Data, &p) == nil {
			mu.Lock()
			seen[p.Name+"/"+p.ID]++
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck
	ping, _ := micro.ControlSubject(micro.PingVerb, "", "")
	if err := nc.PublishRequest(ping, inbox, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "PING answers of two workers and one ingress", func() error {
		mu.Lock()
		defer mu.Unlock()
		workers, ingress := 0, 0
		for k := range seen {
			switch {
			case strings.HasPrefix(k, "agentfleet-worker/"):
				workers++
			case strings.HasPrefix(k, "agentfleet-ingress/"):
				ingress++
			}
		}
		if workers != 2 || ingress != 1 {
			return fmt.Errorf("answers %v", seen)
		}
		return nil
	})

	up.signal(syscall.SIGTERM)
	if st := up.waitExit(60 * time.Second); st == nil || !st.Success() {
		t.Fatalf("agentfleet up after SIGTERM: %v\n%s", st, up.output())
	}
}
