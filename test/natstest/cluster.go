package natstest

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

const (
	// metaLeaderTimeout bounds the wait for a JetStream meta leader.
	metaLeaderTimeout = 20 * time.Second

	// streamLeaderTimeout bounds the wait for a stream leader.
	streamLeaderTimeout = 10 * time.Second

	// startAttempts is how often RunCluster picks new ports when a pre-picked
	// port was taken by someone else before the node could bind it.
	startAttempts = 3
)

// Cluster is an in-process JetStream cluster made by RunCluster.
type Cluster struct {
	// Nodes are the cluster's servers, in a fixed order; StopNode and
	// RestartNode take an index into it. A stopped node stays in the slice.
	Nodes []*Server

	// Name is the cluster name.
	Name string
}

// RunCluster starts an n-node JetStream cluster (n < 1 means 3) on 127.0.0.1.
// Client and route ports are picked up front, so a stopped node can restart on
// the same ones. It returns once every node accepts connections, a meta leader
// is elected and every node follows it, so JetStream API calls work at once.
// All nodes are shut down at the end of the test.
//
// WithStoreDir gives node i the store dir <dir>/n<i>; to start a cluster again
// over the same data, pass the same WithStoreDir and WithServerName, so the nodes
// keep their Raft identities. WithSyncAlways applies to every node. WithPort is
// rejected.
//
// Timing: a fresh cluster usually has a meta leader within a second. The first
// election needs a vote from every node, though, and when it misses (two nodes
// campaign at once on a loaded machine) Raft waits its 4-9s election timeout
// before the next one. A cluster started over existing data always waits for
// that timeout. RunCluster allows 20s before it fails the test.
func RunCluster(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	if n < 1 {
		n = 3
	}
	cfg := newConfig(opts)
	if cfg.portSet {
		t.Fatalf("natstest: RunCluster does not support WithPort")
	}
	base := cfg.storeDir
	if base == "" {
		base = t.TempDir()
	}
	c := &Cluster{Name: cfg.serverName}
	if c.Name == "" {
		c.Name = uniqueName("c")
	}
	t.Cleanup(c.shutdown)

	var err error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		if err = c.start(n, base, cfg.syncAlways); err == nil || !errors.Is(err, errFatal) {
			break
		}
		c.shutdown() // most likely a port collision: pick new ports
	}
	if err != nil {
		t.Fatalf("natstest: start cluster %s: %v", c.Name, err)
	}
	c.WaitForMetaLeader(t)
	return c
}

// start creates the nodes on freshly picked ports and starts them all.
func (c *Cluster) start(n int, base string, syncAlways bool) error {
	ports, err := freePorts(2 * n)
	if err != nil {
		return err
	}
	clientPorts, routePorts := ports[:n], ports[n:]
	routes := make([]*url.URL, n)
	for i, p := range routePorts {
		routes[i] = &url.URL{Scheme: "nats", Host: net.JoinHostPort(host, fmt.Sprint(p))}
	}
	c.Nodes = make([]*Server, n)
	for i := range n {
		c.Nodes[i] = &Server{
			StoreDir:    filepath.Join(base, fmt.Sprintf("n%d", i)),
			name:        fmt.Sprintf("%s-n%d", c.Name, i),
			port:        clientPorts[i],
			syncAlways:  syncAlways,
			clusterName: c.Name,
			routePort:   routePorts[i],
			routes:      routes,
		}
	}
	for _, s := range c.Nodes {
		if err := s.create(); err != nil {
			return err
		}
	}
	// Start the nodes together: Start blocks while JetStream recovers data,
	// and the nodes need each other to form the cluster. Starting them at the
	// same moment also keeps the meta group's first election, which needs a
	// vote from every node, from running before all routes are up.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, s := range c.Nodes {
		wg.Go(func() { errs[i] = s.run() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// shutdown stops all nodes concurrently, so that they do not spend the time
// electing new leaders among themselves one by one.
func (c *Cluster) shutdown() {
	var wg sync.WaitGroup
	for _, s := range c.Nodes {
		wg.Go(s.shutdown)
	}
	wg.Wait()
}

// freePorts returns n distinct TCP ports that were free on 127.0.0.1 a moment
// ago. All listeners are held until every port is picked, so none repeats.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("pick free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// running returns the indexes of the nodes that are running.
func (c *Cluster) running() []int {
	var idx []int
	for i, s := range c.Nodes {
		if s.Server != nil && s.Running() {
			idx = append(idx, i)
		}
	}
	return idx
}

// URLs returns the client URLs of the running nodes, comma-separated, as
// nats.Connect takes them.
func (c *Cluster) URLs() string {
	var urls []string
	for _, i := range c.running() {
		urls = append(urls, c.Nodes[i].URL())
	}
	return strings.Join(urls, ",")
}

// Connect connects to the running nodes and closes the connection at the end of
// the test, before the cluster shuts down. It reconnects forever, every 50ms,
// so it survives stopped nodes; opts are applied after these defaults.
func (c *Cluster) Connect(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return connect(t, c.URLs(), opts)
}

// Leader returns the node that is the JetStream meta leader right now, or nil
// if there is none (for example during an election; see WaitForMetaLeader).
func (c *Cluster) Leader() *Server {
	for _, i := range c.running() {
		if c.Nodes[i].JetStreamIsLeader() {
			return c.Nodes[i]
		}
	}
	return nil
}

// WaitForMetaLeader waits up to 20s until a meta leader exists and every running
// node knows it and is current with it; JetStream API calls fail with err_code
// 10008 until then.
func (c *Cluster) WaitForMetaLeader(t testing.TB) {
	t.Helper()
	WaitFor(t, metaLeaderTimeout, "JetStream meta leader in cluster "+c.Name, c.metaReady)
}

func (c *Cluster) metaReady() error {
	idx := c.running()
	if len(idx) == 0 {
		return errors.New("no node is running")
	}
	leader := c.Leader()
	if leader == nil {
		return errors.New("no meta leader elected")
	}
	for _, i := range idx {
		s := c.Nodes[i]
		jsz, err := s.Jsz(nil)
		if err != nil {
			return fmt.Errorf("node %d (%s): %w", i, s.Name(), err)
		}
		if jsz.Meta == nil || jsz.Meta.Leader != leader.Name() {
			return fmt.Errorf("node %d (%s) does not follow meta leader %s yet", i, s.Name(), leader.Name())
		}
		if !s.JetStreamIsCurrent() {
			return fmt.Errorf("node %d (%s) is not current with meta leader %s", i, s.Name(), leader.Name())
		}
	}
	// The leader must also see every running peer online and current, or
	// placing an R3 asset fails with "no suitable peers for placement".
	jsz, err := leader.Jsz(nil)
	if err != nil {
		return err
	}
	if jsz.Meta == nil {
		return fmt.Errorf("meta leader %s reports no meta group", leader.Name())
	}
	// Stopped nodes stay in the peer list, offline; only running ones count.
	peers := make(map[string]bool, len(jsz.Meta.Replicas))
	for _, p := range jsz.Meta.Replicas {
		peers[p.Name] = !p.Offline && p.Current
	}
	for _, i := range idx {
		s := c.Nodes[i]
		if s == leader {
			continue
		}
		if ok, seen := peers[s.Name()]; !seen || !ok {
			return fmt.Errorf("meta leader %s does not see node %d (%s) online and current yet", leader.Name(), i, s.Name())
		}
	}
	return nil
}

// StopNode shuts node i down and waits until it has stopped. Clients made by
// Connect move to the other nodes.
func (c *Cluster) StopNode(t testing.TB, i int) {
	t.Helper()
	c.node(t, i).shutdown()
}

// RestartNode starts node i again, stopping it first if it runs, on the same
// ports and over the same store dir. It returns once the node accepts
// connections and is current with the meta leader.
func (c *Cluster) RestartNode(t testing.TB, i int) {
	t.Helper()
	c.node(t, i).Restart(t)
	c.WaitForMetaLeader(t)
}

// StreamLeader waits up to 10s for a running node to lead the stream and returns
// its index. account is "$G" for the default account.
func (c *Cluster) StreamLeader(t testing.TB, account, stream string) int {
	t.Helper()
	leader := -1
	WaitFor(t, streamLeaderTimeout, fmt.Sprintf("leader of stream %s > %s", account, stream), func() error {
		for _, i := range c.running() {
			if c.Nodes[i].JetStreamIsStreamLeader(account, stream) {
				leader = i
				return nil
			}
		}
		return errors.New("no running node is the stream leader")
	})
	return leader
}

func (c *Cluster) node(t testing.TB, i int) *Server {
	t.Helper()
	if i < 0 || i >= len(c.Nodes) {
		t.Fatalf("natstest: node %d out of range [0,%d)", i, len(c.Nodes))
	}
	return c.Nodes[i]
}
