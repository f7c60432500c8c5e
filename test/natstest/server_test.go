package natstest_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/test/natstest"
)

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestRunServer_KeyValue(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)

	s := natstest.RunServer(t)
	if !strings.HasPrefix(s.URL(), "nats://127.0.0.1:") || strings.HasSuffix(s.URL(), ":-1") {
		t.Fatalf("URL() = %q, want nats://127.0.0.1:<port>", s.URL())
	}
	if s.URL() != s.ClientURL() {
		t.Fatalf("URL() = %q, server ClientURL() = %q", s.URL(), s.ClientURL())
	}
	if s.StoreDir == "" {
		t.Fatal("StoreDir is empty")
	}

	nc := s.Connect(t)
	if got := nc.ConnectedUrl(); got != s.URL() {
		t.Fatalf("connected to %q, want %q", got, s.URL())
	}
	js := natstest.JetStream(t, nc)

	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "sessions"})
	if err != nil {
		t.Fatalf("create bucket: %v", err)
	}
	rev, err := kv.Put(ctx, "sess.1", []byte("hello"))
	if err != nil {
		t.Fatalf("put: %v", err)
	}
	e, err := kv.Get(ctx, "sess.1")
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if string(e.Value()) != "hello" || e.Revision() != rev {
		t.Fatalf("get = %q rev %d, want %q rev %d", e.Value(), e.Revision(), "hello", rev)
	}
}

func TestRunServer_UniqueNames(t *testing.T) {
	t.Parallel()
	a, b := natstest.RunServer(t), natstest.RunServer(t)
	if a.Name() == b.Name() {
		t.Fatalf("both servers are named %q", a.Name())
	}
	if a.URL() == b.URL() {
		t.Fatalf("both servers listen on %s", a.URL())
	}
	if a.StoreDir == b.StoreDir {
		t.Fatalf("both servers store in %s", a.StoreDir)
	}
}

func TestRunServer_Options(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	dir := t.TempDir()

	s := natstest.RunServer(t,
		natstest.WithPort(port),
		natstest.WithServerName("custom"),
		natstest.WithStoreDir(dir),
		natstest.WithSyncAlways(),
	)
	if want := fmt.Sprintf("nats://127.0.0.1:%d", port); s.URL() != want {
		t.Fatalf("URL() = %q, want %q", s.URL(), want)
	}
	if s.Name() != "custom" {
		t.Fatalf("Name() = %q, want custom", s.Name())
	}
	if s.StoreDir != dir {
		t.Fatalf("StoreDir = %q, want %q", s.StoreDir, dir)
	}
	jsz, err := s.Jsz(nil)
	if err != nil {
		t.Fatalf("jsz: %v", err)
	}
	if !jsz.Config.SyncAlways {
		t.Fatal("SyncAlways is off")
	}
	if !strings.HasPrefix(jsz.Config.StoreDir, dir) {
		t.Fatalf("JetStream store dir %q is not under %q", jsz.Config.StoreDir, dir)
	}
}

func TestRunServer_PortTaken(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })

	ft := &fakeTB{TB: t}
	runAsTest(func() { natstest.RunServer(ft, natstest.WithPort(l.Addr().(*net.TCPAddr).Port)) })
	if !strings.Contains(ft.failure, "address already in use") {
		t.Fatalf("failure = %q, want it to mention the taken port", ft.failure)
	}
}

func TestServer_Restart(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)

	s := natstest.RunServer(t)
	url, name, before := s.URL(), s.Name(), s.Server
	nc := s.Connect(t)
	js := natstest.JetStream(t, nc)

	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}
	for i := range 3 {
		if _, err := js.Publish(ctx, "orders.new", fmt.Appendf(nil, "order-%d", i)); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}

	s.Restart(t)

	if s.Server == before || !s.Running() || before.Running() {
		t.Fatal("Restart did not replace the server instance")
	}
	if s.URL() != url || s.Name() != name {
		t.Fatalf("after restart URL %q name %q, want %q %q", s.URL(), s.Name(), url, name)
	}
	// The old connection reconnects by itself.
	natstest.WaitFor(t, 5*time.Second, "stream ORDERS with 3 messages after restart", func() error {
		// Bound each attempt: a request sent while the client reconnects may
		// never get its reply.
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		info, err := stream.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 3 {
			return fmt.Errorf("stream has %d messages", info.State.Msgs)
		}
		return nil
	})
	if nc.Reconnects == 0 {
		t.Fatal("connection did not reconnect")
	}
	for i := range 3 {
		msg, err := stream.GetMsg(ctx, uint64(i+1))
		if err != nil {
			t.Fatalf("get msg %d: %v", i+1, err)
		}
		if want := fmt.Sprintf("order-%d", i); string(msg.Data) != want {
			t.Fatalf("msg %d = %q, want %q", i+1, msg.Data, want)
		}
	}
}

func TestRunServer_StoreDirReuse(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	dir := t.TempDir()

	first := natstest.RunServer(t, natstest.WithStoreDir(dir))
	nc := first.Connect(t)
	kv, err := natstest.JetStream(t, nc).CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b"})
	if err != nil {
		t.Fatalf("create bucket: %v", err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v1")); err != nil {
		t.Fatalf("put: %v", err)
	}
	nc.Close()
	first.Shutdown()
	first.WaitForShutdown()

	second := natstest.RunServer(t, natstest.WithStoreDir(dir))
	kv, err = natstest.JetStream(t, second.Connect(t)).KeyValue(ctx, "b")
	if err != nil {
		t.Fatalf("open bucket: %v", err)
	}
	e, err := kv.Get(ctx, "k")
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if string(e.Value()) != "v1" {
		t.Fatalf("get = %q, want v1", e.Value())
	}
}

func TestConnect_UserOptionsWin(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := s.Connect(t, nats.Name("mine"))
	if nc.Opts.Name != "mine" {
		t.Fatalf("connection name = %q, want mine", nc.Opts.Name)
	}
	if nc.Opts.MaxReconnect != -1 {
		t.Fatalf("MaxReconnect = %d, want -1", nc.Opts.MaxReconnect)
	}
}

func TestWaitFor(t *testing.T) {
	t.Parallel()

	t.Run("Succeeds", func(t *testing.T) {
		t.Parallel()
		calls := 0
		natstest.WaitFor(t, 5*time.Second, "third call", func() error {
			calls++
			if calls < 3 {
				return fmt.Errorf("call %d", calls)
			}
			return nil
		})
		if calls != 3 {
			t.Fatalf("cond called %d times, want 3", calls)
		}
	})

	t.Run("TimesOut", func(t *testing.T) {
		t.Parallel()
		ft := &fakeTB{TB: t}
		calls := 0
		start := time.Now()
		runAsTest(func() {
			natstest.WaitFor(ft, 200*time.Millisecond, "the impossible", func() error {
				calls++
				return errors.New("still not there")
			})
		})
		elapsed := time.Since(start)
		if !strings.Contains(ft.failure, "the impossible") || !strings.Contains(ft.failure, "still not there") {
			t.Fatalf("failure = %q, want what and last error", ft.failure)
		}
		if elapsed < 200*time.Millisecond || elapsed > 2*time.Second {
			t.Fatalf("gave up after %v, want about 200ms", elapsed)
		}
		// 10, 20, 40, then every 50 ms: about 7 polls in 200 ms.
		if calls < 4 || calls > 20 {
			t.Fatalf("cond called %d times in 200ms, want a poll every 10-50ms", calls)
		}
	})
}

// fakeTB records a failure instead of failing the real test. Its Fatal methods
// end the goroutine like the real ones, so run code that uses it in runAsTest.
type fakeTB struct {
	testing.TB
	failure string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failure = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (f *fakeTB) Fatal(args ...any) {
	f.failure = fmt.Sprint(args...)
	runtime.Goexit()
}

// runAsTest runs fn in its own goroutine, as the testing package runs a test,
// and waits for it to return or call Goexit.
func runAsTest(fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	<-done
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
