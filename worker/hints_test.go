package worker_test

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/worker"
)

// countInboxReads counts the direct gets of the inbox stream from now on.
func (f *fleet) countInboxReads() *atomic.Int64 {
	f.t.Helper()
	var n atomic.Int64
	for _, subj := range []string{"$JS.API.DIRECT.GET." + f.names.InboxStream(), "$JS.API.DIRECT.GET." + f.names.InboxStream() + ".>"} {
		sub, err := f.nc.Subscribe(subj, func(m *nats.Msg) {
			// The watcher leader's inbox backlog count (backlog.go) is a
			// batch get, no read of a lane's messages.
			if !bytes.Contains(m.Data, []byte(`"batch"`)) {
				n.Add(1)
			}
		})
		if err != nil {
			f.t.Fatal(err)
		}
		f.t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := f.nc.Flush(); err != nil {
		f.t.Fatal(err)
	}
	return &n
}

// TestOwnedLaneReadsFromHints: once a lane is owned, its new messages come
// with their post-store hints, so its turns read nothing from the inbox
// stream (no direct get), and run in order.
func TestOwnedLaneReadsFromHints(t *testing.T) {
	f := newFleet(t)
	f.startWorker("w1", func(c *worker.Config) {
		c.Linger = time.Minute       // the lane stays owned
		c.PeekInterval = time.Minute // no timed blind reads in the window
	})
	lane, seq := f.post("hinted", "first", "h0")
	f.waitReplies(lane, 1)
	f.waitCommitted(lane, seq)

	reads := f.countInboxReads()
	const n = 10
	for i := 1; i <= n; i++ {
		_, seq = f.post("hinted", fmt.Sprintf("m%d", i), fmt.Sprintf("h%d", i))
		f.waitReplies(lane, 1+i)
	}
	f.waitCommitted(lane, seq)
	got := f.replies(lane)
	for i := 1; i <= n; i++ {
		if want := fmt.Sprintf("echo: m%d", i); got[i].Text != want {
			t.Errorf("reply %d %q, want %q", i, got[i].Text, want)
		}
	}
	if r := reads.Load(); r != 0 {
		t.Errorf("%d direct gets of the inbox for %d turns on an owned lane, want 0", r, n)
	}
}

// TestOwnedLaneWithoutHints: hints are core NATS, at most once. With the
// stream's republish removed (no hint at all), an owned lane still runs its
// new messages, from the delivery or the timed read.
func TestOwnedLaneWithoutHints(t *testing.T) {
	f := newFleet(t)
	f.startWorker("w1", func(c *worker.Config) { c.Linger = time.Minute })
	lane, seq := f.post("unhinted", "first", "u0")
	f.waitReplies(lane, 1)
	f.waitCommitted(lane, seq)

	info, err := f.res.Inbox.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	cfg.RePublish = nil
	if _, err := f.js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	var hints atomic.Int64
	sub, err := f.nc.Subscribe(f.names.HintWildcard(), func(*nats.Msg) { hints.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck
	for i := 1; i <= 3; i++ {
		_, seq = f.post("unhinted", fmt.Sprintf("m%d", i), fmt.Sprintf("u%d", i))
		f.waitReplies(lane, 1+i)
	}
	f.waitCommitted(lane, seq)
	if h := hints.Load(); h != 0 {
		t.Fatalf("%d hints with the republish removed", h)
	}
}
