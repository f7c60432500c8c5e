package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/worker"
)

// ScaleOptions configure Scale beyond Options.
type ScaleOptions struct {
	// Sessions are the session entry counts, each measured on a fresh
	// server. Defaults to 1000 and 100000.
	Sessions []int
	// Sweep also times one expiry-watcher sweep (worker.Sweep, what the
	// watcher's leader runs every 5 minutes) over the entries, on a worker
	// in this process, and measures its heap.
	Sweep bool
}

// SweepResult is one expiry-watcher sweep over every entry.
type SweepResult struct {
	Duration time.Duration `json:"duration_ns"`
	// LiveGrowth is the peak live heap (runtime/metrics /gc/heap/live:bytes,
	// as of each GC) during the sweep minus the live heap before it: what
	// the sweep retains. HeapGrowth is the same for HeapInuse, which also
	// counts garbage not yet collected (its ceiling follows the GC target,
	// which the embedded server's heap in this process raises). Both are
	// sampled every 20ms. AllocBytes are the bytes the sweep allocated.
	LiveGrowth uint64 `json:"live_heap_growth_bytes"`
	HeapGrowth uint64 `json:"heap_growth_bytes"`
	AllocBytes uint64 `json:"alloc_bytes"`
	Published  int    `json:"published"`
}

// ScalePoint is the measurement at one session count.
type ScalePoint struct {
	Sessions int `json:"sessions"`
	// Create is the time the bulk creation of the entries took.
	Create     time.Duration `json:"create_ns"`
	CreateRate float64       `json:"create_per_s"`
	// StoreBytes is the size of the sessions bucket's stream.
	StoreBytes uint64 `json:"store_bytes"`
	// Fleet is the throughput measurement on fresh lanes.
	Fleet Result `json:"fleet"`
	// WorkerMem is the workers' memory at the end of the window: the sum of
	// the worker processes' RSS (MemKind "rss"), or the whole process's
	// HeapInuse with in-process workers (MemKind "heap-inuse", which
	// includes the embedded server). WorkerPeak is the sum of the worker
	// processes' peak RSS.
	WorkerMem  uint64 `json:"worker_mem_bytes"`
	WorkerPeak uint64 `json:"worker_peak_bytes,omitempty"`
	MemKind    string `json:"mem_kind"`
	// BenchHeap is this process's HeapInuse after the creation (the embedded
	// server's index of the entries, mostly).
	BenchHeap uint64       `json:"bench_heap_bytes"`
	Sweep     *SweepResult `json:"sweep,omitempty"`
}

// Scale measures the per-turn cost against the number of sessions in the
// store: for each count, on a fresh embedded server, it creates that many
// valid session entries in bulk (asynchronous publishes to
// $KV.<sessions bucket>.<lane>), then runs the throughput measurement
// (Options.Lanes fresh lanes, closed loop) and reads the workers' memory at
// the end of the window. With Options.WorkerBinary the workers are
// processes (their RSS is the worker memory); otherwise loops in this
// process.
func Scale(ctx context.Context, opts Options, so ScaleOptions) ([]ScalePoint, error) {
	if opts.WorkerBinary != "" {
		opts.ProcessWorkers = true
	}
	if opts.Lanes <= 0 {
		opts.Lanes = 8
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if o.NATSURL != "" {
		return nil, errors.New("bench: scale runs against its own embedded server (it fills the store)")
	}
	if len(so.Sessions) == 0 {
		so.Sessions = []int{1000, 100000}
	}
	var out []ScalePoint
	for _, n := range so.Sessions {
		p, err := scalePoint(ctx, o, so, n)
		if err != nil {
			return out, err
		}
		out = append(out, p)
	}
	return out, nil
}

func scalePoint(ctx context.Context, o Options, so ScaleOptions, n int) (ScalePoint, error) {
	p := ScalePoint{Sessions: n}
	e, err := startEnv(o, "scale", false)
	if err != nil {
		return p, err
	}
	defer e.close()
	_, js, err := e.connect("bench-scale-loader", true)
	if err != nil {
		return p, err
	}
	res, err := e.provision(ctx, js)
	if err != nil {
		return p, err
	}
	label := fmt.Sprintf("scale %d", n)
	var created atomic.Int64
	stop := startProgress(o, func() Progress {
		return Progress{Scenario: label, Phase: "creating entries", Detail: fmt.Sprintf("%d/%d entries", created.Load(), n)}
	})
	begin := time.Now()
	err = createEntries(ctx, js, e.names.SessionsBucket(), n, &created)
	stop()
	if err != nil {
		return p, err
	}
	p.Create = time.Since(begin)
	p.CreateRate = float64(n) / p.Create.Seconds()
	if info, err := res.Sessions.Status(ctx); err == nil {
		p.StoreBytes = info.Bytes()
		if v := info.Values(); v != uint64(n) {
			return p, fmt.Errorf("bench: scale: %d entries in the bucket, want %d", v, n)
		}
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	p.BenchHeap = ms.HeapInuse

	r, err := runFleet(ctx, e, o, fleetExtra{label: label, atEnd: func(ws workerSet) {
		switch w := ws.(type) {
		case *procFleet:
			p.WorkerMem, p.WorkerPeak = w.memory()
			p.MemKind = "rss"
		default:
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			p.WorkerMem, p.MemKind = ms.HeapInuse, "heap-inuse"
		}
	}})
	if err != nil {
		return p, err
	}
	p.Fleet = r
	if so.Sweep {
		s, err := sweep(ctx, e, o)
		if err != nil {
			return p, err
		}
		p.Sweep = &s
	}
	return p, nil
}

// scaleEntry is a session entry like one an idle lane leaves behind.
func scaleEntry(i int, now time.Time) (lane string, data []byte) {
	src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: fmt.Sprintf("scale-%d", i), ChatType: session.ChatDM,
		UserID: fmt.Sprintf("s%d", i), UserName: fmt.Sprintf("Scale User %d", i)}
	src.Normalize()
	key := session.BuildSessionKey(src, session.DefaultKeyOptions())
	e := session.SessionEntry{
		SessionKey: key, SessionID: session.NewSessionID(now), CreatedAt: now, UpdatedAt: now, Origin: &src,
		Platform: src.Platform, ChatType: src.ChatType, CostStatus: "unknown",
		InputTokens: 1000, OutputTokens: 1000, TotalTokens: 2000, LastPromptTokens: 1,
		InboxID: "0123456789abcdef0123456789abcdef", CommittedSeq: 0, LastTurnID: "0123456789abcdef",
	}
	return session.LaneToken(key), mustJSON(e)
}

// createEntries publishes n entries asynchronously, in batches, and checks
// every acknowledgement.
func createEntries(ctx context.Context, js jetstream.JetStream, bucket string, n int, created *atomic.Int64) error {
	const batch = 4096
	now := time.Now().UTC()
	futures := make([]jetstream.PubAckFuture, 0, batch)
	flush := func() error {
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(time.Minute):
			return errors.New("bench: scale: publishes not acknowledged within a minute")
		case <-ctx.Done():
			return ctx.Err()
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return fmt.Errorf("bench: scale: create entry: %w", err)
			}
		}
		created.Add(int64(len(futures)))
		futures = futures[:0]
		return nil
	}
	for i := range n {
		lane, data := scaleEntry(i, now)
		f, err := js.PublishAsync("$KV."+bucket+"."+lane, data)
		if err != nil {
			return fmt.Errorf("bench: scale: create entry: %w", err)
		}
		futures = append(futures, f)
		if len(futures) == batch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// sweep runs one expiry-watcher sweep on a worker of this process (not
// running: Sweep only) and measures it.
func sweep(ctx context.Context, e *env, o Options) (SweepResult, error) {
	nc, js, err := e.connect("bench-scale-sweeper", true)
	if err != nil {
		return SweepResult{}, err
	}
	res, err := e.provision(ctx, js)
	if err != nil {
		return SweepResult{}, err
	}
	w, err := worker.New(nc, js, res, worker.Config{
		ID: "bench-sweeper", Names: e.names, Backend: echo.Backend(echo.Options{}), LeaseTTL: o.LeaseTTL,
		Reset:   session.ResetConfig{Default: session.ResetPolicy{Mode: session.ResetNone}},
		Context: session.ContextOptions{KeyOptions: session.DefaultKeyOptions()}, Logger: o.Logger,
	})
	if err != nil {
		return SweepResult{}, fmt.Errorf("bench: %w", err)
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	liveBefore := liveHeap()
	var peak, livePeak atomic.Uint64
	peak.Store(before.HeapInuse)
	livePeak.Store(liveBefore)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > peak.Load() {
					peak.Store(ms.HeapInuse)
				}
				if l := liveHeap(); l > livePeak.Load() {
					livePeak.Store(l)
				}
			}
		}
	}()
	stop := startProgress(o, func() Progress { return Progress{Scenario: "scale", Phase: "expiry sweep"} })
	begin := time.Now()
	published, err := w.Sweep(ctx)
	d := time.Since(begin)
	stop()
	close(done)
	wg.Wait()
	if err != nil {
		return SweepResult{}, fmt.Errorf("bench: sweep: %w", err)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	growth := uint64(0)
	if p := peak.Load(); p > before.HeapInuse {
		growth = p - before.HeapInuse
	}
	live := uint64(0)
	if p := livePeak.Load(); p > liveBefore {
		live = p - liveBefore
	}
	return SweepResult{Duration: d, LiveGrowth: live, HeapGrowth: growth, AllocBytes: after.TotalAlloc - before.TotalAlloc, Published: published}, nil
}

// liveHeap is the live heap as of the last GC.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
