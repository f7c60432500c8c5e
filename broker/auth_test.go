package broker_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/agentfleet/agentfleet/broker"
)

// testPKI writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, all PEM, into dir.
type testPKI struct{ ca, serverCert, serverKey, clientCert, clientKey string }

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, _ := x509.MarshalECPrivateKey(k)
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kder)
	}
	p := testPKI{ca: write("ca.pem", "CERTIFICATE", caDER)}
	p.serverCert, p.serverKey = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = leaf("client", 3, x509.ExtKeyUsageClientAuth)
	return p
}

// TestEmbeddedServerTLSUsersAndMonitor: with a certificate and a CA the
// client port takes only TLS clients with a client certificate; with users
// only known users; a system user reaches $SYS requests (what `nats
// server report jetstream` sends); the monitoring port answers /jsz; and
// in-process connections still need nothing.
func TestEmbeddedServerTLSUsersAndMonitor(t *testing.T) {
	pki := newTestPKI(t)
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	seedFile := filepath.Join(t.TempDir(), "worker.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := broker.StartServer(broker.ServerConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Monitor: "127.0.0.1:0",
		TLSCert: pki.serverCert, TLSKey: pki.serverKey, TLSCA: pki.ca,
		Users: []broker.ServerUser{
			{User: "admin", Password: "admin-pw", Role: broker.RoleAdmin},
			{NKey: pub, Role: broker.RoleWorker},
			{User: "sys", Password: "sys-pw", Role: broker.RoleSystem},
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	url := srv.ClientURL()
	tlsOK := broker.ConnectConfig{URL: url, TLSCA: pki.ca, TLSCert: pki.clientCert, TLSKey: pki.clientKey, Timeout: 10 * time.Second}

	// Plain text is refused, and so is TLS without a client certificate.
	plain := tlsOK
	plain.TLSCA, plain.TLSCert, plain.TLSKey = "", "", ""
	plain.User, plain.Password = "admin", "admin-pw"
	if nc, err := broker.Connect(plain); err == nil {
		nc.Close()
		t.Fatal("a plain-text client was admitted")
	}
	noCert := tlsOK
	noCert.TLSCert, noCert.TLSKey = "", ""
	noCert.User, noCert.Password = "admin", "admin-pw"
	if nc, err := broker.Connect(noCert); err == nil {
		nc.Close()
		t.Fatal("a TLS client without a certificate was admitted")
	}
	// TLS with a certificate but a wrong password, or no user, is refused.
	for _, cc := range []broker.ConnectConfig{func() broker.ConnectConfig { c := tlsOK; c.User, c.Password = "admin", "wrong"; return c }(), tlsOK} {
		if nc, err := broker.Connect(cc); !errors.Is(err, nats.ErrAuthorization) {
			if nc != nil {
				nc.Close()
			}
			t.Fatalf("user %q: want an authorization error, got %v", cc.User, err)
		}
	}
	// The admin works over TLS; the worker's nkey too.
	admin := tlsOK
	admin.User, admin.Password = "admin", "admin-pw"
	nc, err := broker.Connect(admin)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if !nc.TLSRequired() {
		t.Error("the connection does not use TLS")
	}
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := broker.Provision(ctx, js, broker.ProvisionConfig{}); err != nil {
		t.Fatal(err)
	}
	worker := tlsOK
	worker.NKey = seedFile
	wc, err := broker.Connect(worker)
	if err != nil {
		t.Fatal(err)
	}
	wc.Close()

	// The system user reaches the server's $SYS requests.
	sys := tlsOK
	sys.User, sys.Password = "sys", "sys-pw"
	sc, err := broker.Connect(sys)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	msg, err := sc.Request("$SYS.REQ.SERVER.PING.JSZ", nil, 10*time.Second)
	if err != nil {
		t.Fatalf("$SYS jsz request: %v", err)
	}
	var jsz struct {
		Data struct {
			Streams int `json:"streams"`
		} `json:"data"`
	}
	if err := json.Unmarshal(msg.Data, &jsz); err != nil || jsz.Data.Streams < 5 {
		t.Fatalf("$SYS jsz: %v %s", err, msg.Data)
	}
	// The admin, in the fleet's account, does not reach them.
	if _, err := nc.Request("$SYS.REQ.SERVER.PING.JSZ", nil, 2*time.Second); err == nil {
		t.Error("a fleet user got an answer from $SYS")
	}

	// The monitoring port.
	resp, err := http.Get("http://" + srv.MonitorAddr().String() + "/jsz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"streams"`) {
		t.Fatalf("/jsz: %d %s", resp.StatusCode, body)
	}

	// In process: no credentials, no TLS.
	ic, err := broker.Connect(broker.ConnectConfig{InProcess: srv})
	if err != nil {
		t.Fatal(err)
	}
	ic.Close()
}

func TestLoadUsersRefusesBadEntries(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "users.yaml")
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	bad := "users:\n" +
		"  - user: a\n    role: worker\n" + // no password
		"  - user: b\n    password: x\n    role: wizard\n" + // no such role
		"  - nkey: " + string(seed) + "\n    role: worker\n" + // a seed, not a public key
		"  - user: c\n    password: x\n    role: admin\n  - user: c\n    password: y\n    role: worker\n" // twice
	if err := os.WriteFile(f, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := broker.LoadUsers(f)
	if err == nil {
		t.Fatal("bad users accepted")
	}
	for _, want := range []string{"user 1 (a): needs user and password", `role "wizard"`, "not a user public key", "user 5 (c): listed twice"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if err := os.WriteFile(f, []byte("users:\n  - user: a\n    pasword: x\n    role: worker\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := broker.LoadUsers(f); err == nil || !strings.Contains(err.Error(), "pasword") {
		t.Errorf("unknown key: %v", err)
	}
}

// TestRenderedUserMatchesPermissions: the configuration printed for an
// external server, read back by nats-server's own parser, gives every role
// exactly the permissions the embedded server gives it.
func TestRenderedUserMatchesPermissions(t *testing.T) {
	n := broker.MustNames("acme")
	for _, role := range broker.Roles() {
		if role == broker.RoleSystem {
			continue
		}
		want, err := broker.Permissions(role, n, "_INBOX_"+role)
		if err != nil {
			t.Fatal(err)
		}
		entry, err := broker.RenderUser(role, n, "_INBOX_"+role, role, "$2a$11$abcdefghijklmnopqrstuv", "")
		if err != nil {
			t.Fatal(err)
		}
		opts := &server.Options{}
		if err := opts.ProcessConfigString("authorization { users: [\n" + entry + "\n] }"); err != nil {
			t.Fatalf("%s: %v\n%s", role, err, entry)
		}
		if len(opts.Users) != 1 || opts.Users[0].Username != role || opts.Users[0].Password != "$2a$11$abcdefghijklmnopqrstuv" {
			t.Fatalf("%s: parsed users %+v", role, opts.Users)
		}
		if got := opts.Users[0].Permissions; !reflect.DeepEqual(got, want) {
			t.Errorf("%s: rendered permissions differ\n got %+v\nwant %+v", role, got, want)
		}
	}
}

// TestLoadUsersPasswordEnv: password_env reads a user's password from the
// environment, and the server admits that password; an unset variable, or
// password and password_env both, is refused naming the user and variable.
func TestLoadUsersPasswordEnv(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "users.yaml")
	doc := "users:\n" +
		"  - user: admin\n    password_env: AF_TEST_ADMIN_PW\n    role: admin\n" +
		"  - user: worker\n    password: plain-worker\n    role: worker\n"
	if err := os.WriteFile(f, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"AF_TEST_ADMIN_PW": "from-the-env"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	users, err := broker.LoadUsersEnv(f, lookup)
	if err != nil {
		t.Fatal(err)
	}
	if users[0].Password != "from-the-env" || users[1].Password != "plain-worker" {
		t.Fatalf("passwords: %q, %q", users[0].Password, users[1].Password)
	}
	srv, err := broker.StartServer(broker.ServerConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Users: users})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("admin", "from-the-env"))
	if err != nil {
		t.Fatalf("admin with the password from the environment: %v", err)
	}
	nc.Close()
	if nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("admin", "AF_TEST_ADMIN_PW")); err == nil {
		nc.Close()
		t.Fatal("the variable's name was taken as the password")
	}

	delete(env, "AF_TEST_ADMIN_PW")
	if _, err := broker.LoadUsersEnv(f, lookup); err == nil || !strings.Contains(err.Error(), "user 1 (admin): password_env AF_TEST_ADMIN_PW is not set") {
		t.Errorf("unset variable: %v", err)
	}
	env["AF_TEST_ADMIN_PW"] = "x"
	both := "users:\n  - user: admin\n    password: p\n    password_env: AF_TEST_ADMIN_PW\n    role: admin\n"
	if err := os.WriteFile(f, []byte(both), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := broker.LoadUsersEnv(f, lookup); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Errorf("password and password_env: %v", err)
	}
}
