package worker_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

// tcpProxy forwards TCP connections to a NATS server. cut closes every
// connection through it and refuses new ones until heal: a client on the
// far side is partitioned from NATS, as a container disconnected from its
// network is.
type tcpProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
	// open is closed while traffic flows; Pause replaces it with an open
	// channel that Resume closes.
	open chan struct{}
}

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	open := make(chan struct{})
	close(open)
	p := &tcpProxy{ln: ln, target: strings.TrimPrefix(target, "nats://"), conns: map[net.Conn]struct{}{}, open: open}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *tcpProxy) URL() string { return "nats://" + p.ln.Addr().String() }

func (p *tcpProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			defer p.wg.Done()
			defer func() { _ = dst.Close(); _ = src.Close() }()
			buf := make([]byte, 32<<10)
			for {
				n, err := src.Read(buf)
				if n > 0 {
					// While paused nothing is passed on: the bytes wait, as
					// TCP retransmits them over a network that is down.
					p.mu.Lock()
					open := p.open
					p.mu.Unlock()
					<-open
					if _, werr := dst.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}
		go pipe(up, c)
		go pipe(c, up)
	}
}

// Cut drops every connection and refuses new ones until Heal.
func (p *tcpProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
}

// Pause stops passing traffic without closing anything, as a network that
// silently drops packets does: neither side sees the connection end.
func (p *tcpProxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default:
	}
}

// Resume passes traffic again after Pause, what was held first.
func (p *tcpProxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
}

// Heal lets connections through again.
func (p *tcpProxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

func (p *tcpProxy) close() {
	p.Resume()
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

// startWorkerVia runs a worker whose NATS connection goes through url.
func (f *fleet) startWorkerVia(id, url string) {
	f.t.Helper()
	f.startWorkerViaWith(id, url, nil)
}

// startWorkerViaWith is startWorkerVia with mod applied to the worker's
// configuration; it returns the worker.
func (f *fleet) startWorkerViaWith(id, url string, mod func(*worker.Config)) *worker.Worker {
	f.t.Helper()
	nc, err := nats.Connect(url, nats.Name(id), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.IgnoreDiscoveredServers(), nats.RetryOnFailedConnect(true))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(nc.Close)
	js := natstest.JetStream(f.t, nc)
	res, err := broker.Provision(f.t.Context(), js, broker.ProvisionConfig{Names: f.names, LeaseTTL: testTTL})
	if err != nil {
		f.t.Fatal(err)
	}
	cfg := worker.Config{ID: id, Names: f.names, Backend: echo.Backend(echo.Options{}), LeaseTTL: testTTL,
		LeaseMargin: 500 * time.Millisecond, Linger: 500 * time.Millisecond, PeekInterval: 100 * time.Millisecond,
		DrainTimeout: 2 * time.Second, BusyMode: worker.BusyQueue}
	if mod != nil {
		mod(&cfg)
	}
	w, err := worker.New(nc, js, res, cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	f.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				f.t.Errorf("worker %s: %v", id, err)
			}
		case <-time.After(30 * time.Second):
			f.t.Errorf("worker %s did not stop", id)
		}
	})
	return w
}

// TestWorkerPartitionedFromNATS: a worker whose connections to NATS are all
// cut for longer than the lease TTL (then healed) while another worker is
// alive, with messages on several lanes before, during and after the cut:
// every accepted message is answered exactly once, in order.
func TestWorkerPartitionedFromNATS(t *testing.T) {
	t.Run("connections closed", func(t *testing.T) { testPartition(t, false) })
	t.Run("packets held", func(t *testing.T) { testPartition(t, true) })
}

func testPartition(t *testing.T, hold bool) {
	if testing.Short() {
		t.Skip("slow (waits out lease expiries across a partition); skipped under -short")
	}
	f := newFleet(t)
	p := newTCPProxy(t, f.srv.URL())
	f.startWorkerVia("cut", p.URL())
	// Queue mode: a message that arrives during a turn is answered by a
	// turn of its own rather than interrupting it.
	f.startWorker("alive", func(c *worker.Config) { c.BusyMode = worker.BusyQueue })

	const lanes = 6
	var order []string
	sent := map[string][]string{}
	// post sends message n on every lane; the agent takes d to answer it.
	post := func(n int, d time.Duration) {
		for i := range lanes {
			chat := fmt.Sprintf("part-%d", i)
			text := fmt.Sprintf("m%d", n)
			body := text
			if d > 0 {
				body += "\n!sleep " + d.String()
			}
			lane, _ := f.post(chat, body, fmt.Sprintf("%s-%d", chat, n))
			if _, ok := sent[lane]; !ok {
				order = append(order, lane)
			}
			sent[lane] = append(sent[lane], text)
		}
	}
	// answered waits until every lane answered all it was sent, each
	// message exactly once and in order (a turn may answer several).
	answered := func(what string) {
		t.Helper()
		for _, lane := range order {
			want := strings.Join(sent[lane], "|")
			var got string
			natstest.WaitFor(t, 120*time.Second, fmt.Sprintf("%s: %d answers on %s", what, len(sent[lane]), lane), func() error {
				var lines []string
				for _, r := range f.replies(lane) {
					lines = append(lines, strings.Split(strings.TrimPrefix(r.Text, "echo: "), "\n")...)
				}
				got = strings.Join(lines, "|")
				if len(lines) < len(sent[lane]) {
					return fmt.Errorf("have %q, want %q", got, want)
				}
				return nil
			})
			if got != want {
				t.Fatalf("%s, lane %s: answers %q, want %q", what, lane, got, want)
			}
		}
	}
	post(0, 0)
	answered("before the cut")
	// Turns in flight on both workers when the cut worker loses NATS.
	post(1, 2*time.Second)
	natstest.WaitFor(t, 60*time.Second, "turns in flight", func() error {
		for _, lane := range order {
			e, _, err := f.store.Get(t.Context(), lane)
			if err != nil {
				return err
			}
			if e.Turn == nil {
				return fmt.Errorf("no turn in flight on %s", lane)
			}
		}
		return nil
	})
	if hold {
		p.Pause()
	} else {
		p.Cut()
	}
	post(2, 0)
	// The lanes the cut worker held are answered once its leases expired
	// on the server and the other worker took them.
	answered("during the cut")
	// A partition longer than several lease TTLs.
	deadline := time.Now().Add(4 * testTTL)
	n := 3
	for ; time.Now().Before(deadline); n++ {
		post(n, 500*time.Millisecond)
		answered(fmt.Sprintf("during the cut, round %d", n))
	}
	post(n, time.Second)
	if hold {
		p.Resume()
	} else {
		p.Heal()
	}
	post(n+1, 0)
	answered("after the heal")
	post(n+2, 0)
	answered("after the heal, again")
}
