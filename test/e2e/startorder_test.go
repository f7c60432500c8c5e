package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestStartOrder starts a fleet in the wrong order, as compose may: a worker
// and the ingress before NATS. Both say they wait for NATS (at the URL given
// in AGENTFLEET_NATS_URL), and once `agentfleet nats` runs — with its
// listen address and store taken from the configuration file, no flags —
// both proceed and a message gets its reply.
func TestStartOrder(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: multi-process tests are skipped under -short")
	}
	t.Parallel()
	dir := t.TempDir()
	natsAddr := freeAddr(t)
	httpAddr := freeAddr(t)
	store := filepath.Join(dir, "store-from-config")
	cfgFile := filepath.Join(dir, "fleet.yaml")
	cfg := fmt.Sprintf("embedded:\n  listen: %s\n  data_dir: %s\nnats:\n  url: nats://127.0.0.1:1\n", natsAddr, store)
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{
		"AGENTFLEET_NATS_URL=nats://" + natsAddr, // over the file's unreachable URL
		"AGENTFLEET_LEASE_TTL=3s", "AGENTFLEET_LEASE_MARGIN=1s", "AGENTFLEET_WORKER_LINGER=1s",
		"AGENTFLEET_SESSION_RESET_MODE=none", "AGENTFLEET_TELEMETRY_LOG_FORMAT=text",
	}
	waiting := regexp.MustCompile(`waiting for NATS at nats://` + regexp.QuoteMeta(natsAddr))

	worker := newProc(t, dir, "worker", env, "--config", cfgFile, "worker", "--id", "early")
	worker.start()
	worker.waitLog(startTimeout, waiting)
	ingress := newProc(t, dir, "ingress", env, "--config", cfgFile, "ingress", "--http", httpAddr)
	ingress.start()
	ingress.waitLog(startTimeout, waiting)

	node := newProc(t, dir, "nats", env, "--config", cfgFile, "nats")
	node.start()
	node.waitLog(startTimeout, regexp.MustCompile(`nats node up.*url=nats://`+regexp.QuoteMeta(natsAddr)))
	if _, err := os.Stat(filepath.Join(store, "jetstream")); err != nil {
		t.Errorf("the node did not use embedded.data_dir from the file: %v", err)
	}

	worker.waitLog(startTimeout, startedRE)
	worker.waitLog(startTimeout, regexp.MustCompile(`connected to NATS at`))
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	base := "http://" + httpAddr
	waitReady(t, hc, base, ingress)

	body, _ := json.Marshal(map[string]string{"chat_id": "late-nats", "text": "hello", "message_id": "1"})
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
		if r.Replies[0].Text != "echo: hello" {
			return fatalf("reply %+v", r.Replies[0])
		}
		return nil
	})
}

// TestStartOrderGivesUp: with no NATS, a worker waits nats.connect_wait
// (here --nats-wait 2s), then exits non-zero saying why.
func TestStartOrderGivesUp(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: multi-process tests are skipped under -short")
	}
	t.Parallel()
	dir := t.TempDir()
	natsAddr := freeAddr(t)
	worker := newProc(t, dir, "worker", []string{"NATS_URL=nats://" + natsAddr},
		"worker", "--id", "lonely", "--nats-wait", "2s")
	worker.start()
	st := worker.waitExit(60 * time.Second)
	if st == nil {
		t.Fatal("the worker still runs long after its wait for NATS ran out")
	}
	out := worker.output()
	if st.Success() {
		t.Fatalf("the worker exited 0 without NATS:\n%s", out)
	}
	if !strings.Contains(out, "waiting for NATS at nats://"+natsAddr) {
		t.Errorf("no 'waiting for NATS' line:\n%s", out)
	}
	if want := "nats not reachable at nats://" + natsAddr + " after waiting 2s"; !strings.Contains(out, want) {
		t.Errorf("the last words do not say %q:\n%s", want, out)
	}
}

// TestReplicasWithoutClusterFailsFast: a worker configured for three
// replicas against a single NATS node is refused on its first attempt, with
// one message that names the setting, instead of retrying for a minute.
func TestReplicasWithoutClusterFailsFast(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: multi-process tests are skipped under -short")
	}
	t.Parallel()
	dir := t.TempDir()
	natsAddr := freeAddr(t)
	node := newProc(t, dir, "nats", nil, "nats", "--listen", natsAddr, "--data", filepath.Join(dir, "nats"))
	node.start()
	node.waitLog(startTimeout, regexp.MustCompile(`nats node up`))
	worker := newProc(t, dir, "worker", []string{"NATS_URL=nats://" + natsAddr, "AGENTFLEET_NATS_REPLICAS=3"}, "worker")
	worker.start()
	st := worker.waitExit(60 * time.Second)
	if st == nil {
		t.Fatal("the worker still runs: the impossible replica count was retried")
	}
	out := worker.output()
	if st.Success() {
		t.Fatalf("the worker exited 0:\n%s", out)
	}
	if !strings.Contains(out, "nats.replicas is 3 but the NATS server at nats://"+natsAddr+" is not part of a cluster") {
		t.Errorf("the error does not explain the setting:\n%s", out)
	}
	if strings.Contains(out, "retrying") {
		t.Errorf("an error no retry can fix was retried:\n%s", out)
	}
}
