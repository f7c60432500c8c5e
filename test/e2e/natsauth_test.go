package e2e

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/crypto/bcrypt"
)

// writeServerCert writes a CA and a server certificate for 127.0.0.1 signed
// by it, PEM, into dir.
func writeServerCert(t *testing.T, dir string) (ca, cert, key string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2e ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "nats"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(k)
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", der), write("server-key.pem", "EC PRIVATE KEY", kder)
}

// TestLeastPrivilegeFleet runs a fleet as separate processes on `agentfleet
// nats` with a users file, TLS and a monitoring port: an admin provisions
// (`agentfleet provision`), then an ingress and a worker, each as its own
// least-privilege user over TLS with nats.provision false, answer a
// message without a permission violation. A plain-text client is refused,
// the monitoring port answers /jsz, and the system user gets the server's
// JetStream report over $SYS.
func TestLeastPrivilegeFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: multi-process tests are skipped under -short")
	}
	t.Parallel()
	dir := t.TempDir()
	natsAddr, monAddr, httpAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	ca, cert, key := writeServerCert(t, dir)
	hash, err := bcrypt.GenerateFromPassword([]byte("admin-pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	users := fmt.Sprintf(`users:
  - {user: admin, password: "%s", role: admin}
  - {user: ingress, password: ingress-pw, role: ingress, inbox_prefix: _INBOX_ingress}
  - {user: worker, password: worker-pw, role: worker, inbox_prefix: _INBOX_worker}
  - {user: sys, password: sys-pw, role: system}
`, hash)
	usersFile := filepath.Join(dir, "users.yaml")
	if err := os.WriteFile(usersFile, []byte(users), 0o600); err != nil {
		t.Fatal(err)
	}
	node := newProc(t, dir, "nats", nil, "nats", "--listen", natsAddr, "--data", filepath.Join(dir, "store"),
		"--users", usersFile, "--monitor", monAddr, "--tls-cert", cert, "--tls-key", key)
	node.start()
	node.waitLog(startTimeout, regexp.MustCompile(`nats node up.*users=4 tls=true`))

	url := "tls://" + natsAddr
	common := []string{"AGENTFLEET_NATS_URL=" + url, "AGENTFLEET_NATS_TLS_CA=" + ca,
		"AGENTFLEET_LEASE_TTL=3s", "AGENTFLEET_LEASE_MARGIN=1s", "AGENTFLEET_WORKER_LINGER=1s",
		"AGENTFLEET_SESSION_RESET_MODE=none", "AGENTFLEET_TELEMETRY_LOG_FORMAT=text"}
	as := func(user string) []string {
		return append([]string{"AGENTFLEET_NATS_USER=" + user, "AGENTFLEET_NATS_PASSWORD=" + user + "-pw",
			"AGENTFLEET_NATS_PROVISION=false", "AGENTFLEET_NATS_INBOX_PREFIX=_INBOX_" + user}, common...)
	}

	// Before provisioning, a worker refuses to start, and says what to do.
	early := newProc(t, dir, "early-worker", as("worker"), "worker", "--id", "early")
	early.start()
	if st := early.waitExit(startTimeout); st == nil || st.Success() {
		t.Fatalf("a worker on an unprovisioned fleet did not fail: %v", st)
	}
	early.waitLog(time.Second, regexp.MustCompile(`agentfleet provision`))

	prov := newProc(t, dir, "provision", append([]string{"AGENTFLEET_NATS_USER=admin", "AGENTFLEET_NATS_PASSWORD=admin-pw"}, common...), "provision")
	prov.start()
	if st := prov.waitExit(startTimeout); st == nil || !st.Success() {
		t.Fatalf("provision: %v", st)
	}

	worker := newProc(t, dir, "worker", as("worker"), "worker", "--id", "w1")
	worker.start()
	worker.waitLog(startTimeout, startedRE)
	ingress := newProc(t, dir, "ingress", as("ingress"), "ingress", "--http", httpAddr)
	ingress.start()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	base := "http://" + httpAddr
	waitReady(t, hc, base, ingress)

	body, _ := json.Marshal(map[string]string{"chat_id": "least", "text": "hello", "message_id": "1"})
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

	// Plain text is refused.
	if nc, err := nats.Connect("nats://"+natsAddr, nats.UserInfo("admin", "admin-pw"), nats.Timeout(5*time.Second)); err == nil {
		nc.Close()
		t.Error("a plain-text client was admitted")
	}
	// The monitoring port.
	mresp, err := hc.Get("http://" + monAddr + "/jsz")
	if err != nil {
		t.Fatal(err)
	}
	jsz, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	var mon struct {
		Streams int `json:"streams"`
	}
	if mresp.StatusCode != http.StatusOK || json.Unmarshal(jsz, &mon) != nil || mon.Streams < 5 {
		t.Errorf("/jsz: %d %s", mresp.StatusCode, jsz)
	}
	// The system user: what `nats server report jetstream` asks.
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(ca)
	pool.AppendCertsFromPEM(caPEM)
	sc, err := nats.Connect(url, nats.UserInfo("sys", "sys-pw"), nats.Secure(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	msg, err := sc.Request("$SYS.REQ.SERVER.PING.JSZ", nil, 10*time.Second)
	if err != nil || !strings.Contains(string(msg.Data), `"streams"`) {
		t.Errorf("$SYS jsz: %v", err)
	}

	for _, p := range []*proc{worker, ingress} {
		b, _ := os.ReadFile(p.logPath)
		if strings.Contains(strings.ToLower(string(b)), "permissions violation") {
			t.Errorf("%s hit a permission violation:\n%s", p.name, b)
		}
	}
}

// TestUpWithNATSUsers: `agentfleet up` with a users file on its NATS port
// still answers (its own roles connect in process, as a user no network
// client can use), while a network client needs one of the users.
func TestUpWithNATSUsers(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: multi-process tests are skipped under -short")
	}
	t.Parallel()
	dir := t.TempDir()
	natsAddr, httpAddr := freeAddr(t), freeAddr(t)
	usersFile := filepath.Join(dir, "users.yaml")
	if err := os.WriteFile(usersFile, []byte("users:\n  - {user: worker, password: worker-pw, role: worker}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	up := newProc(t, dir, "up", []string{"AGENTFLEET_SESSION_RESET_MODE=none", "AGENTFLEET_TELEMETRY_LOG_FORMAT=text"},
		"up", "--data", filepath.Join(dir, "data"), "--http", httpAddr, "--nats-listen", natsAddr, "--nats-users", usersFile)
	up.start()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	base := "http://" + httpAddr
	waitReady(t, hc, base, up)
	body, _ := json.Marshal(map[string]string{"chat_id": "up-users", "text": "hello", "message_id": "1"})
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
		resp, err := hc.Get(base + "/v1/sessions/" + a.SessionKey + "/replies?after=0&wait=5s")
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
	if nc, err := nats.Connect("nats://"+natsAddr, nats.Timeout(5*time.Second)); err == nil {
		nc.Close()
		t.Error("a client without credentials was admitted")
	}
	nc, err := nats.Connect("nats://"+natsAddr, nats.UserInfo("worker", "worker-pw"), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("the worker user: %v", err)
	}
	nc.Close()
}
