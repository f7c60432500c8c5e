//go:build !race

// The race detector allows 8128 goroutines at once; net/http alone needs
// more for 5000 open requests. This test runs without -race.

package ingress_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestFiveThousandReaders is issue 12's defect 3: every long poll and event
// stream used to hold a consumer on the outbox, which the server caps at
// 1000 per stream, so 1000 open readers made every other reader fail with
// 503. Here 5000 readers (half long polls, half event streams, each on its
// own lane, all from one client) wait at once; then each lane gets a reply
// and every reader is served it. No reader makes a consumer, and the
// server's goroutines stay within what net/http itself needs per request.
func TestFiveThousandReaders(t *testing.T) {
	if testing.Short() {
		t.Skip("5000 connections")
	}
	const n = 5000
	b := setup(t, setupOpts{maxReaders: n + 100, heartbeat: time.Minute})
	addr := strings.TrimPrefix(b.http.URL, "http://")
	base := runtime.NumGoroutine()

	key := func(i int) string { return fmt.Sprintf("agent:main:http:dm:reader%d", i) }
	conns := make([]net.Conn, n)
	t.Cleanup(func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	})
	for i := range n {
		c, err := net.DialTimeout("tcp", addr, 30*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns[i] = c
		path := "/v1/sessions/" + key(i) + "/replies?after=0&wait=60s"
		if i%2 == 1 {
			path = "/v1/sessions/" + key(i) + "/events"
		}
		if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n", path); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	natstest.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d readers waiting", n), func() error {
		if got := b.server.Readers(); got != n {
			return fmt.Errorf("%d readers", got)
		}
		return nil
	})
	if c := b.outboxConsumers(t); c != 0 {
		t.Fatalf("%d consumers on the outbox with %d readers waiting", c, n)
	}
	goroutines := runtime.NumGoroutine() - base
	t.Logf("%d readers waiting: %d goroutines more than before (net/http's own per connection included)", n, goroutines)
	if goroutines > 3*n {
		t.Fatalf("%d goroutines for %d readers", goroutines, n)
	}

	// A reply into every lane's mailbox, as the delivery writes it.
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	acks := make([]jetstream.PubAckFuture, 0, n)
	for i := range n {
		rep := session.Reply{ID: fmt.Sprintf("s:%d", i), SessionKey: key(i), SessionID: "s", TurnID: fmt.Sprintf("t%d", i),
			Kind: session.ReplyKindReply, Text: fmt.Sprintf("reply %d", i), Platform: session.PlatformHTTP}
		data, _ := json.Marshal(rep)
		m := nats.NewMsg(b.names.BoxSubject("http", session.LaneToken(key(i))))
		m.Data = data
		m.Header.Set(broker.HdrSessionKey, key(i))
		f, err := b.js.PublishMsgAsync(m)
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, f)
		if i%500 == 499 {
			select {
			case <-b.js.PublishAsyncComplete():
			case <-ctx.Done():
				t.Fatal("publish acks")
			}
		}
	}
	for _, f := range acks {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatal("publish acks")
		}
	}

	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Minute))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("reader %d: %v", i, err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("reader %d: status %d", i, resp.StatusCode)
		}
		want := fmt.Sprintf(`"text":"reply %d"`, i)
		if i%2 == 0 {
			var body strings.Builder
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				body.WriteString(sc.Text())
			}
			if !strings.Contains(body.String(), want) {
				t.Fatalf("long poll %d answered %s", i, body.String())
			}
		} else {
			sc := bufio.NewScanner(resp.Body)
			got := ""
			for sc.Scan() {
				if line := sc.Text(); strings.HasPrefix(line, "data: ") {
					got = line
					break
				}
			}
			if !strings.Contains(got, want) {
				t.Fatalf("event stream %d sent %q (%v)", i, got, sc.Err())
			}
		}
		// The connection first: closing an event stream's body would read it
		// to its end, which never comes.
		c.Close()
		resp.Body.Close()
		conns[i] = nil
	}
	t.Logf("%d readers served their reply in %s after the replies were stored", n, time.Since(start).Round(time.Millisecond))
}
