package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/transcript"
)

// TestNodeLossR3: a three-node cluster of `agentfleet nats` processes with
// R3 streams and buckets; workers and ingress connected to all three. One
// NATS node is killed with SIGKILL between two batches of traffic: every
// accepted message is still incorporated exactly once and in order, and
// every reply is delivered once. The node then comes back over its data.
func TestNodeLossR3(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: multi-process tests are skipped under -short")
	}
	dir := t.TempDir()
	clientAddrs := []string{freeAddr(t), freeAddr(t), freeAddr(t)}
	routeAddrs := []string{freeAddr(t), freeAddr(t), freeAddr(t)}
	var routes, urls []string
	for i := range routeAddrs {
		routes = append(routes, "nats-route://"+routeAddrs[i])
		urls = append(urls, "nats://"+clientAddrs[i])
	}
	c := &cluster{t: t, dir: dir, natsURL: strings.Join(urls, ","), names: broker.MustNames(broker.DefaultPrefix)}
	c.env = []string{
		"NATS_URL=" + c.natsURL,
		"AGENTFLEET_NATS_REPLICAS=3",
		"AGENTFLEET_LEASE_TTL=" + leaseTTL.String(),
		"AGENTFLEET_LEASE_MARGIN=1s",
		"AGENTFLEET_WORKER_LINGER=1s",
		"AGENTFLEET_SESSION_RESET_MODE=none",
	}
	nodes := make([]*proc, 3)
	for i := range nodes {
		nodes[i] = newProc(t, dir, fmt.Sprintf("nats%d", i), c.env, "nats", "--listen", clientAddrs[i],
			"--data", fmt.Sprintf("%s/nats%d", dir, i), "--name", fmt.Sprintf("n%d", i),
			"--cluster-name", "e2e-r3", "--cluster-listen", routeAddrs[i], "--routes", strings.Join(routes, ","))
		nodes[i].start()
	}
	nc, err := nats.Connect(c.natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c.nc = nc
	if c.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "R3 provisioning on the three-node cluster", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		res, err := broker.Provision(ctx, c.js, broker.ProvisionConfig{Names: c.names, Replicas: 3, LeaseTTL: leaseTTL})
		if err != nil {
			return err
		}
		c.res = res
		return nil
	})
	c.store = kv.NewStore(c.res, nil)
	if c.tx, err = transcript.New(c.js, c.names, nil); err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	c.hc = &http.Client{Transport: tr, Timeout: 90 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	c.startIngress()
	c.startWorker("r3a")
	c.startWorker("r3b")

	const lanes = 5
	var keys []string
	sent := map[string][]string{}
	batch := func(tag string, n int) {
		for i := 0; i < lanes; i++ {
			chat := fmt.Sprintf("r3-%d", i)
			for j := 0; j < n; j++ {
				text := fmt.Sprintf("%s-%d-%d", tag, i, j)
				var acc acceptResp
				waitFor(t, 30*time.Second, "POST "+text, func() error {
					var err error
					acc, err = c.tryPost(chat, text, text)
					return err
				})
				if len(sent[acc.SessionKey]) == 0 {
					keys = append(keys, acc.SessionKey)
				}
				sent[acc.SessionKey] = append(sent[acc.SessionKey], text)
			}
		}
	}
	settle := func() {
		for _, key := range keys {
			want := sent[key]
			waitFor(t, 2*time.Minute, "lane "+key+" to incorporate every message", func() error {
				e, err := c.entry(key)
				if err != nil {
					return err
				}
				if e.Turn != nil {
					return fmt.Errorf("turn in flight")
				}
				entries, _, err := c.tx.Load(context.Background(), e.SessionID)
				if err != nil {
					return err
				}
				var users []string
				for _, u := range userEntries(entries) {
					users = append(users, u.Content)
				}
				if len(users) < len(want) {
					return fmt.Errorf("%d of %d messages incorporated", len(users), len(want))
				}
				if strings.Join(users, "|") != strings.Join(want, "|") {
					t.Fatalf("lane %s: transcript users %q, want exactly %q", key, users, want)
				}
				return nil
			})
		}
	}
	batch("before", 4)
	settle()

	// Lose one node while the fleet is connected to all three.
	const killed = 0
	nodes[killed].kill()
	t.Logf("killed nats node n%d", killed)
	batch("after", 4)
	settle()
	// Replies reach the mailboxes through the delivery consumer, whose
	// leader may have been on the lost node: wait for it to drain before
	// counting them (a reply never published would still be missing).
	waitFor(t, 2*time.Minute, "the delivery consumer to drain", c.delivered)

	for _, key := range keys {
		e := c.mustEntry(key)
		entries := c.load(e.SessionID)
		var box []reply
		waitFor(t, 30*time.Second, "the mailbox of "+key, func() error {
			var err error
			box, err = c.tryAllReplies(key)
			if err != nil && strings.Contains(err.Error(), "out of order") {
				t.Fatal(err)
			}
			return err
		})
		checkRepliesOnce(t, key, entries, box)
	}

	// The node comes back over its data and the fleet keeps working.
	nodes[killed].start()
	batch("back", 1)
	settle()
}
