package worker_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/admin"
	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

// heldMapJS is a JetStream whose watches of the inbox map bucket start only
// once release is closed: a process that has not yet heard of a change of
// the map that the others have made.
type heldMapJS struct {
	jetstream.JetStream
	bucket  string
	release chan struct{}
}

func (js *heldMapJS) KeyValue(ctx context.Context, bucket string) (jetstream.KeyValue, error) {
	kv, err := js.JetStream.KeyValue(ctx, bucket)
	if err != nil || bucket != js.bucket {
		return kv, err
	}
	return &heldWatchKV{KeyValue: kv, release: js.release}, nil
}

type heldWatchKV struct {
	jetstream.KeyValue
	release <-chan struct{}
}

func (kv *heldWatchKV) Watch(ctx context.Context, keys string, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	select {
	case <-kv.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return kv.KeyValue.Watch(ctx, keys, opts...)
}

// countingHandler counts the records whose message is msg and whose stream
// attribute is stream, and passes every record on to next.
type countingHandler struct {
	next        slog.Handler
	msg, stream string
	n           *atomic.Int64
}

func (h countingHandler) Enabled(ctx context.Context, l slog.Level) bool { return true }

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "stream" && a.Value.String() == h.stream {
				h.n.Add(1)
				return false
			}
			return true
		})
	}
	if h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}

func (h countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	h.next = h.next.WithAttrs(as)
	return h
}

func (h countingHandler) WithGroup(name string) slog.Handler {
	h.next = h.next.WithGroup(name)
	return h
}

// labelledGoroutines counts the goroutines labelled key=value (pprof
// labels, which the goroutines a labelled one starts inherit) that have
// the function fn on their stack.
func labelledGoroutines(t *testing.T, key, value, fn string) int {
	t.Helper()
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		t.Fatal(err)
	}
	label := fmt.Sprintf("%q:%q", key, value)
	n := 0
	for _, block := range strings.Split(buf.String(), "\n\n") {
		lines := strings.Split(block, "\n")
		if len(lines) < 2 || !strings.Contains(block, label) || !strings.Contains(block, fn+"+") {
			continue
		}
		count, _, _ := strings.Cut(lines[0], " ")
		c, err := strconv.Atoi(count)
		if err != nil {
			t.Fatalf("goroutine profile: %q: %v", lines[0], err)
		}
		n += c
	}
	return n
}

// TestPullOfAStreamTheMapDroppedEnds: a migration from 2 inbox streams to 1
// writes the map without stream 1, then deletes it. A worker that hears of
// the deletion (its pull on stream 1 ends: consumer deleted) before it
// hears of the map looks for the stream to come back (reopen). Once it has
// the map, which no longer names the stream, that loop and the stream's
// pull end, and the worker goes on answering lanes on the one stream left.
func TestPullOfAStreamTheMapDroppedEnds(t *testing.T) {
	f := newFleetStreams(t, 2)
	gone := f.names.InboxStreamAt(1)

	// The worker, whose watch of the inbox map waits for release.
	wnc := f.srv.Connect(t)
	wjs := &heldMapJS{JetStream: natstest.JetStream(t, wnc), bucket: f.names.InboxMapBucket(), release: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(wjs.release) }) }
	t.Cleanup(release)
	wres, err := broker.Provision(t.Context(), wjs, broker.ProvisionConfig{Names: f.names, LeaseTTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	var reopens atomic.Int64
	log := slog.New(countingHandler{next: slog.Default().Handler(), msg: "reopen inbox stream", stream: gone, n: &reopens})
	w, err := worker.New(wnc, wjs, wres, worker.Config{ID: "w1", Names: f.names, Backend: echo.Backend(echo.Options{}), LeaseTTL: testTTL,
		LeaseMargin: 500 * time.Millisecond, Linger: 200 * time.Millisecond, PeekInterval: 100 * time.Millisecond,
		DrainTimeout: 2 * time.Second, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	// Every goroutine the worker starts carries the label.
	const labelKey = "worker-test"
	labelValue := t.Name()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go pprof.Do(ctx, pprof.Labels(labelKey, labelValue), func(ctx context.Context) { done <- w.Run(ctx) })
	t.Cleanup(func() {
		release()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("worker: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("the worker did not stop")
		}
	})
	pulls := func() int { return labelledGoroutines(t, labelKey, labelValue, "worker.(*Worker).pullLoop") }
	reopenLoops := func() int { return labelledGoroutines(t, labelKey, labelValue, "worker.(*Worker).reopenInbox") }
	natstest.WaitFor(t, 20*time.Second, "a pull loop per inbox stream", func() error {
		if n := pulls(); n != 2 {
			return fmt.Errorf("%d pull loops", n)
		}
		return nil
	})

	// A lane of each stream answered.
	chats := map[int]string{}
	for i := 0; len(chats) < 2; i++ {
		chat := fmt.Sprintf("rm-%d", i)
		key := session.BuildSessionKey(session.SessionSource{Platform: session.PlatformHTTP, ChatID: chat, ChatType: session.ChatDM, UserID: "u-" + chat}, session.DefaultKeyOptions())
		if s := f.res.Inboxes.ForLane(session.LaneToken(key)).Index; chats[s] == "" {
			chats[s] = chat
		}
	}
	lanes := map[int]string{}
	for s, chat := range chats {
		lane, seq := f.post(chat, "before", "b1")
		lanes[s] = lane
		f.waitCommitted(lane, seq)
	}

	// The migration to one stream; the worker hears of the deletion of
	// stream 1 alone, and waits for it to come back.
	fl, err := admin.Open(t.Context(), natstest.JetStream(t, f.srv.Connect(t)), f.names)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fl.MigrateInbox(t.Context(), 1, admin.MigrateOptions{DrainTimeout: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.js.Stream(t.Context(), gone); err == nil {
		t.Fatalf("the migration left %s", gone)
	}
	natstest.WaitFor(t, 30*time.Second, "the worker waiting for "+gone+" to come back", func() error {
		if n := reopens.Load(); n == 0 {
			return fmt.Errorf("no reopen of %s logged", gone)
		}
		if n := reopenLoops(); n != 1 {
			return fmt.Errorf("%d reopen loops", n)
		}
		return nil
	})

	// The worker hears of the map: the loop and the pull of stream 1 end.
	release()
	natstest.WaitFor(t, 30*time.Second, "the reopen loop and the pull of "+gone+" ended", func() error {
		if n := reopenLoops(); n != 0 {
			return fmt.Errorf("%d reopen loops (%d reopens of %s logged)", n, reopens.Load(), gone)
		}
		if n := pulls(); n != 1 {
			return fmt.Errorf("%d pull loops", n)
		}
		return nil
	})

	// Both lanes, now on the one stream, are answered.
	for s, chat := range chats {
		f.post(chat, "after", "a1")
		f.waitReplies(lanes[s], 2)
		f.checkAnsweredOnce(lanes[s], "before", "after")
	}
}
