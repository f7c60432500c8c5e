//go:build compose

package compose

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
	"github.com/agentfleet/agentfleet/worker"
)

// The services of compose.yaml.
var (
	natsServices    = []string{"nats1", "nats2", "nats3"}
	ingressServices = []string{"ingress1", "ingress2"}
	workerServices  = []string{"worker1", "worker2", "worker3"}
)

// natsServerName maps a NATS node's server name (compose.yaml --name) to
// its service.
var natsServerName = map[string]string{"n1": "nats1", "n2": "nats2", "n3": "nats3"}

const (
	httpToken     = "compose-test-token"
	adminPassword = "compose-test-admin"
	// workerPassword is the worker user's (deploy/compose/nats-users.yaml).
	workerPassword = "compose-test-worker"
	// leaseTTL is the stack's lease TTL: short, so takeovers are quick.
	leaseTTL = 6 * time.Second
	// healthyTimeout bounds the wait for services to pass their checks.
	healthyTimeout = 4 * time.Minute
)

// stack is one running compose project.
type stack struct {
	t        *testing.T
	root     string
	project  string
	env      []string
	ingress  []string // base URLs of ingress1, ingress2 on the host
	natsURLs string   // the three nodes' client ports on the host
	upTook   time.Duration
	ids      map[string]string // service -> container id

	hc    *http.Client
	nc    *nats.Conn
	js    jetstream.JetStream
	res   *broker.Resources
	names broker.Names
	store *kv.Store
	tx    *transcript.Log
}

// repoRoot is the repository root: compose.yaml, .env and the scripts.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "compose.yaml")); err != nil {
		t.Fatalf("no compose.yaml at %s: %v", root, err)
	}
	return root
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// newStack brings up a compose project of its own and waits until every
// service is healthy. The project (containers, network, volumes) is
// removed when the test ends; on failure the services' last log lines are
// logged first.
func newStack(t *testing.T) *stack {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	// COMPOSE_PROJECT_NAME, when set, is the project name's prefix (so a
	// caller can tell its stacks from others'); the suffix keeps each run's
	// name unique.
	prefix := "afct"
	if p := os.Getenv("COMPOSE_PROJECT_NAME"); p != "" {
		prefix = p + "-"
	}
	s := &stack{t: t, root: repoRoot(t), project: prefix + hex.EncodeToString(b[:]),
		names: broker.MustNames(broker.DefaultPrefix), ids: map[string]string{}}
	ports := map[string]int{}
	for _, k := range []string{"INGRESS1_PORT", "INGRESS2_PORT", "NATS1_PORT", "NATS2_PORT", "NATS3_PORT"} {
		ports[k] = freePort(t)
	}
	s.env = append(os.Environ(),
		"COMPOSE_PROJECT_NAME="+s.project,
		"BIND=127.0.0.1",
		"HTTP_TOKEN="+httpToken,
		"LEASE_TTL="+leaseTTL.String(),
		"WORKER_LINGER=3s",
		"DRAIN_TIMEOUT=10s",
		"WORKER_STOP_GRACE=30s",
		"NATS_ADMIN_PASSWORD="+adminPassword,
		"NATS_INGRESS_PASSWORD=compose-test-ingress",
		"NATS_WORKER_PASSWORD="+workerPassword,
		"NATS_INDEXER_PASSWORD=compose-test-indexer",
		"NATS_HEALTHCHECK_PASSWORD=compose-test-healthcheck",
	)
	for k, p := range ports {
		s.env = append(s.env, k+"="+strconv.Itoa(p))
	}
	s.ingress = []string{fmt.Sprintf("http://127.0.0.1:%d", ports["INGRESS1_PORT"]), fmt.Sprintf("http://127.0.0.1:%d", ports["INGRESS2_PORT"])}
	s.natsURLs = fmt.Sprintf("nats://127.0.0.1:%d,nats://127.0.0.1:%d,nats://127.0.0.1:%d", ports["NATS1_PORT"], ports["NATS2_PORT"], ports["NATS3_PORT"])
	t.Logf("compose project %s: ingress %v, nats %s", s.project, s.ingress, s.natsURLs)

	t.Cleanup(s.down)
	begin := time.Now()
	if out, err := s.compose("up", "-d"); err != nil {
		t.Fatalf("compose up: %v\n%s", err, out)
	}
	s.waitHealthy(healthyTimeout)
	s.upTook = time.Since(begin)
	for _, svc := range slices.Concat(natsServices, ingressServices, workerServices) {
		s.container(svc)
	}
	t.Logf("stack healthy %v after `compose up -d`", s.upTook.Round(100*time.Millisecond))

	tr := &http.Transport{MaxIdleConnsPerHost: 128}
	s.hc = &http.Client{Transport: tr, Timeout: 90 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	s.connect()
	return s
}

// down logs the services' last lines when the test failed, then removes
// the project with its volumes.
func (s *stack) down() {
	if s.t.Failed() {
		if out, err := s.compose("logs", "--no-color", "--tail", "80"); err == nil {
			s.t.Logf("compose logs (last 80 lines per service):\n%s", out)
		}
	}
	s.keepLogs()
	if s.nc != nil {
		s.nc.Close()
	}
	if out, err := s.compose("down", "-v", "--remove-orphans", "-t", "5"); err != nil {
		s.t.Errorf("compose down: %v\n%s", err, out)
	}
}

// keepLogs writes every service's whole log, with timestamps, to
// $COMPOSE_LOG_DIR/<project>/<service>.log when COMPOSE_LOG_DIR is set: the
// last 80 lines logged on failure rarely reach back to a fault.
func (s *stack) keepLogs() {
	dir := os.Getenv("COMPOSE_LOG_DIR")
	if dir == "" {
		return
	}
	dir = filepath.Join(dir, s.project)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		s.t.Logf("keep logs: %v", err)
		return
	}
	for _, svc := range slices.Concat(natsServices, ingressServices, workerServices, []string{"indexer", "provision"}) {
		out, err := s.compose("logs", "--no-color", "--timestamps", svc)
		if err != nil {
			s.t.Logf("keep logs of %s: %v", svc, err)
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, svc+".log"), []byte(out), 0o644); err != nil {
			s.t.Logf("keep logs: %v", err)
		}
	}
	s.t.Logf("services' logs kept in %s", dir)
}

// compose runs deploy/compose/compose (the installed Compose) in the
// repository root with the project's environment.
func (s *stack) compose(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(s.root, "deploy", "compose", "compose"), args...)
	cmd.Dir = s.root
	cmd.Env = s.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// docker runs the docker CLI.
func docker(args ...string) (string, error) {
	out, err := exec.Command("docker", args...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// waitHealthy runs deploy/compose/wait-healthy: every service healthy.
func (s *stack) waitHealthy(timeout time.Duration) {
	s.t.Helper()
	cmd := exec.Command(filepath.Join(s.root, "deploy", "compose", "wait-healthy"))
	cmd.Dir = s.root
	cmd.Env = append(s.env, fmt.Sprintf("WAIT_TIMEOUT=%d", int(timeout.Seconds())))
	if out, err := cmd.CombinedOutput(); err != nil {
		s.t.Fatalf("services not healthy: %v\n%s", err, out)
	}
}

// container returns the container id of a service. The id is looked up
// once, while the container runs (the compose plugin's ps lists only
// running containers), and stays valid across docker stop, kill and start.
func (s *stack) container(service string) string {
	s.t.Helper()
	if id, ok := s.ids[service]; ok {
		return id
	}
	out, err := s.compose("ps", "-q", service)
	id := strings.TrimSpace(out)
	if err != nil || id == "" {
		s.t.Fatalf("container of %s: %v %s", service, err, out)
	}
	s.ids[service] = strings.Fields(id)[0]
	return s.ids[service]
}

// health is a container's health status (healthy, unhealthy, starting) or
// its state when it has no health check or is not running.
func (s *stack) health(service string) string {
	out, err := docker("inspect", "-f", "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}", s.container(service))
	if err != nil {
		return "unknown: " + out
	}
	st, h, _ := strings.Cut(out, " ")
	if st != "running" || h == "" {
		return st
	}
	return h
}

// waitServiceHealthy waits until one service passes its health check and
// returns how long that took.
func (s *stack) waitServiceHealthy(service string, timeout time.Duration) time.Duration {
	s.t.Helper()
	begin := time.Now()
	waitFor(s.t, timeout, service+" healthy", func() error {
		if h := s.health(service); h != "healthy" {
			return errors.New(h)
		}
		return nil
	})
	return time.Since(begin)
}

// network is the project's network (compose.yaml's "fleet").
func (s *stack) network() string { return s.project + "_fleet" }

// kill sends SIGKILL to a service's container.
func (s *stack) kill(service string) {
	s.t.Helper()
	if out, err := docker("kill", s.container(service)); err != nil {
		s.t.Fatalf("docker kill %s: %v %s", service, err, out)
	}
}

// start starts a stopped service container again.
func (s *stack) start(service string) {
	s.t.Helper()
	if out, err := docker("start", s.container(service)); err != nil {
		s.t.Fatalf("docker start %s: %v %s", service, err, out)
	}
}

// stop stops a service container gracefully (SIGTERM, SIGKILL after grace).
func (s *stack) stop(service string, grace time.Duration) {
	s.t.Helper()
	if out, err := docker("stop", "-t", strconv.Itoa(int(grace.Seconds())), s.container(service)); err != nil {
		s.t.Fatalf("docker stop %s: %v %s", service, err, out)
	}
}

// disconnect cuts a service's container off the project network: it can
// reach no other container, and its published ports go dead.
func (s *stack) disconnect(service string) {
	s.t.Helper()
	if out, err := docker("network", "disconnect", s.network(), s.container(service)); err != nil {
		s.t.Fatalf("docker network disconnect %s: %v %s", service, err, out)
	}
}

// connectNet heals a disconnect; the service name is given back as the
// container's DNS alias (the others reach it by that name).
func (s *stack) connectNet(service string) {
	s.t.Helper()
	if out, err := docker("network", "connect", "--alias", service, s.network(), s.container(service)); err != nil {
		s.t.Fatalf("docker network connect %s: %v %s", service, err, out)
	}
}

// logs returns a service's log since a moment.
func (s *stack) logs(service string, since time.Time) string {
	out, _ := docker("logs", "--since", since.UTC().Format(time.RFC3339Nano), s.container(service))
	return out
}

// connect opens the test's own NATS connection to the three nodes, as the
// admin user, and the fleet's resources (provisioned already by the
// `provision` service; Provision with the stack's settings changes nothing).
func (s *stack) connect() {
	s.t.Helper()
	nc, err := nats.Connect(s.natsURLs, nats.Name("compose-test"), nats.Timeout(5*time.Second),
		nats.UserInfo("admin", adminPassword), nats.MaxReconnects(-1), nats.ReconnectWait(200*time.Millisecond),
		// Leave a partitioned node quickly, as the fleet's processes do.
		nats.PingInterval(2*time.Second), nats.MaxPingsOutstanding(3))
	if err != nil {
		s.t.Fatalf("connect to %s: %v", s.natsURLs, err)
	}
	s.nc = nc
	if s.js, err = jetstream.New(nc); err != nil {
		s.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s.res, err = broker.Provision(ctx, s.js, broker.ProvisionConfig{Names: s.names, Replicas: 3, LeaseTTL: leaseTTL})
	if err != nil {
		s.t.Fatalf("provision: %v", err)
	}
	for _, w := range s.res.Warnings {
		s.t.Logf("provision: %s", w)
	}
	s.store = kv.NewStore(s.res, nil)
	if s.tx, err = transcript.New(s.js, s.names, nil); err != nil {
		s.t.Fatal(err)
	}
}

// acceptResp is the answer to POST /v1/messages.
type acceptResp struct {
	SessionKey string `json:"session_key"`
	Seq        uint64 `json:"seq"`
	Duplicate  bool   `json:"duplicate"`
}

// reply is one mailbox message.
type reply struct {
	Seq       uint64 `json:"seq"`
	TurnID    string `json:"turn_id"`
	SessionID string `json:"session_id"`
	Text      string `json:"text"`
	Kind      string `json:"kind"`
}

func (s *stack) do(ctx context.Context, base, method, path string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+httpToken)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}

// post sends one message to an ingress and wants 202.
func (s *stack) post(ctx context.Context, base, chatID, text, messageID string) (acceptResp, error) {
	body, _ := json.Marshal(map[string]string{"chat_id": chatID, "user_id": "u-" + chatID, "text": text, "message_id": messageID})
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	status, data, err := s.do(ctx, base, http.MethodPost, "/v1/messages", body)
	if err != nil {
		return acceptResp{}, err
	}
	if status != http.StatusAccepted {
		return acceptResp{}, fmt.Errorf("POST %s/v1/messages: %d %s", base, status, data)
	}
	var a acceptResp
	if err := json.Unmarshal(data, &a); err != nil || a.Seq == 0 || a.SessionKey == "" {
		return acceptResp{}, fmt.Errorf("POST %s/v1/messages: bad answer %s (%v)", base, data, err)
	}
	return a, nil
}

// replies reads one page of a lane's mailbox after seq, long-polling up to
// wait for the first one.
func (s *stack) replies(ctx context.Context, base, key string, after uint64, wait time.Duration) ([]reply, error) {
	q := url.Values{"after": {strconv.FormatUint(after, 10)}}
	if wait > 0 {
		q.Set("wait", wait.String())
	}
	ctx, cancel := context.WithTimeout(ctx, wait+30*time.Second)
	defer cancel()
	status, data, err := s.do(ctx, base, http.MethodGet, "/v1/sessions/"+url.PathEscape(key)+"/replies?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("GET replies of %s: %d %s", key, status, data)
	}
	var r struct {
		Replies []reply `json:"replies"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("GET replies of %s: %w", key, err)
	}
	return r.Replies, nil
}

// allReplies reads a lane's whole mailbox through one ingress.
func (s *stack) allReplies(base, key string) ([]reply, error) {
	var out []reply
	var after uint64
	for {
		page, err := s.replies(context.Background(), base, key, after, 0)
		if err != nil {
			return nil, err
		}
		if len(page) == 0 {
			return out, nil
		}
		for _, r := range page {
			if r.Seq <= after {
				return nil, fmt.Errorf("replies of %s: seq %d after %d: out of order", key, r.Seq, after)
			}
			after = r.Seq
		}
		out = append(out, page...)
	}
}

// entry reads a lane's session entry.
func (s *stack) entry(key string) (*session.SessionEntry, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, _, err := s.store.Get(ctx, session.LaneToken(key))
	return e, err
}

// entryByLane reads a lane's session entry by its lane token.
func (s *stack) entryByLane(lane string) (*session.SessionEntry, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, _, err := s.store.Get(ctx, lane)
	return e, err
}

// workers reads the worker registry.
func (s *stack) workers() ([]worker.WorkerRecord, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return worker.ListWorkers(ctx, s.res.Workers)
}

// workerOwner returns the running incarnation ("id/incarnation") of a
// worker id.
func (s *stack) workerOwner(id string) string {
	s.t.Helper()
	var owner string
	waitFor(s.t, time.Minute, "worker "+id+" registered as running", func() error {
		recs, err := s.workers()
		if err != nil {
			return err
		}
		for _, r := range recs {
			if r.ID == id && r.State == worker.StateRunning {
				owner = r.Owner
				return nil
			}
		}
		return fmt.Errorf("worker %s not running in %+v", id, recs)
	})
	return owner
}

// inboxLeader returns the service of the NATS node leading the inbox stream.
func (s *stack) inboxLeader() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := s.res.Inbox.Info(ctx)
	if err != nil {
		return "", err
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return "", errors.New("the inbox stream has no leader")
	}
	svc, ok := natsServerName[info.Cluster.Leader]
	if !ok {
		return "", fmt.Errorf("unknown inbox leader %q", info.Cluster.Leader)
	}
	return svc, nil
}

// waitReplicasCurrent waits until every stream of the fleet has a leader
// and all its replicas current: a restarted or healed node has caught up.
func (s *stack) waitReplicasCurrent(timeout time.Duration) time.Duration {
	s.t.Helper()
	begin := time.Now()
	waitFor(s.t, timeout, "every stream's replicas to be current", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		names := s.js.StreamNames(ctx)
		n := 0
		for name := range names.Name() {
			n++
			st, err := s.js.Stream(ctx, name)
			if err != nil {
				return err
			}
			info := st.CachedInfo()
			if info.Cluster == nil || info.Cluster.Leader == "" {
				return fmt.Errorf("%s: no leader", name)
			}
			if len(info.Cluster.Replicas) != info.Config.Replicas-1 {
				return fmt.Errorf("%s: %d replicas besides the leader", name, len(info.Cluster.Replicas))
			}
			for _, p := range info.Cluster.Replicas {
				if !p.Current || p.Offline {
					return fmt.Errorf("%s: replica %s not current", name, p.Name)
				}
			}
		}
		if err := names.Err(); err != nil {
			return err
		}
		if n == 0 {
			return errors.New("no streams listed")
		}
		return nil
	})
	return time.Since(begin)
}

// waitFor polls cond until it returns nil or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	if err := poll(timeout, cond); err != nil {
		t.Fatalf("timed out after %v waiting for %s: %v", timeout, what, err)
	}
}

func poll(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		<-tick.C
	}
}
