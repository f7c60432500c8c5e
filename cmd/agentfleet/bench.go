package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v2"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/bench"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/telemetry/provider"
)

// benchStdout receives the report, benchStderr the notes (tests replace them).
var (
	benchStdout io.Writer = os.Stdout
	benchStderr io.Writer = os.Stderr
)

// benchScenarios are the scenarios of `agentfleet bench`, in the order they run.
var benchScenarios = []string{"floor", "throughput", "durability", "takeover", "handover", "scale"}

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure throughput, latency, recovery time and scale against the raw JetStream floor",
		Description: `Runs the selected scenarios, each on its own embedded NATS server in a temporary directory
(or, for floor and throughput, against a running fleet with --nats-url and --ingress-url),
shows a progress line on stderr, and prints a table per scenario (or one JSON document with --json).

Scenarios: floor (the raw JetStream operations of one turn), throughput (N lanes with one message in
flight, echo agent, compared with the floor in the same run), durability (throughput with sync
"always" and the default), takeover (kill -9 a worker running long turns: time to the resumed turn),
handover (rolling restart of every worker under load: added latency, nothing lost or duplicated),
scale (per-turn latency and worker memory with many session entries in the store).

--out updates the generated sections of a Markdown file (docs/benchmarks.md) and --svg writes the
latency chart; see docs/benchmarks.md.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "scenario", Aliases: []string{"s"}, Value: "floor,throughput", Usage: "comma-separated scenarios: " + strings.Join(benchScenarios, ",") + ", or all"},
			&cli.StringFlag{Name: "lanes", Value: "1,8,64,512", Usage: "lane counts of floor, throughput and durability"},
			&cli.DurationFlag{Name: "duration", Value: 10 * time.Second, Usage: "measured window of each throughput run"},
			&cli.IntFlag{Name: "warmup", Value: 2, Usage: "warm-up turns per lane before the window"},
			&cli.IntFlag{Name: "workers", Usage: "workers", DefaultText: "2; 3 for takeover and handover"},
			&cli.StringFlag{Name: "sync", Value: "default", Usage: "fsync policy of the embedded server: default, always or a duration"},
			&cli.DurationFlag{Name: "lease-ttl", Value: broker.DefaultLeaseTTL, Usage: "lane lease TTL of the fleet (takeover's goal is a p99 of 3s with the defaults)"},
			&cli.StringFlag{Name: "ingress", Value: bench.IngressHTTP, Usage: "throughput ingress, or a comma-separated list measured one after the other against each row's floor: http (POST /v1/messages), adapter (in process, the platform adapters' path: no HTTP hop) or publish (the bench's own copy of that path)"},
			&cli.StringFlag{Name: "until", Value: bench.UntilOutbox, Usage: "time replies at the outbox, or at the mailbox (runs the HTTP delivery)"},
			&cli.BoolFlag{Name: "process-workers", Usage: "throughput: run the workers as processes of this binary, over TCP (the floor then uses TCP too)"},
			&cli.BoolFlag{Name: "verify", Value: true, Usage: "throughput: check one reply per message and every lane committed"},
			&cli.IntFlag{Name: "kills", Value: 5, Usage: "takeover: how many times a worker is killed"},
			&cli.DurationFlag{Name: "kill-spread", Usage: "takeover: kill at a random moment this long after the turns start (negative: at once)", DefaultText: "the lease TTL"},
			&cli.IntFlag{Name: "handover-lanes", Value: 16, Usage: "handover: lanes under load"},
			&cli.DurationFlag{Name: "turn-sleep", Value: 200 * time.Millisecond, Usage: "handover: the echo agent's delay per turn"},
			&cli.DurationFlag{Name: "drain-timeout", Usage: "handover: the workers' restart drain timeout", DefaultText: "the fleet's, 1m"},
			&cli.StringFlag{Name: "sessions", Value: "1000,100000,1000000", Usage: "scale: session entry counts"},
			&cli.IntFlag{Name: "scale-lanes", Value: 8, Usage: "scale: fresh lanes measured at each count"},
			&cli.BoolFlag{Name: "sweep", Value: true, Usage: "scale: also time one expiry-watcher sweep over the entries"},
			&cli.StringFlag{Name: "nats-url", Usage: "measure a running fleet on this NATS (floor and throughput only; needs --ingress-url). NATS_URL and AGENTFLEET_NATS_URL are not read: without this flag bench runs its own servers"},
			&cli.StringFlag{Name: "ingress-url", Usage: "the running fleet's HTTP ingress base URL, e.g. http://127.0.0.1:8080"},
			&cli.StringFlag{Name: "prefix", Value: "fleet", Usage: "the running fleet's prefix (nats.prefix)"},
			&cli.IntFlag{Name: "replicas", Value: 1, Usage: "replicas of the floor's temporary streams on a running NATS"},
			&cli.StringFlag{Name: "data", Usage: "parent `DIR` of the temporary server directories, created if missing", DefaultText: "the system's temporary directory"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON document instead of tables"},
			&cli.StringFlag{Name: "out", Usage: "update the generated sections of this Markdown `FILE` (e.g. docs/benchmarks.md)"},
			&cli.StringFlag{Name: "svg", Usage: "write the latency chart to this `FILE` (default with --out: bench-latency.svg beside it)"},
			&cli.StringFlag{Name: "cpuprofile", Usage: "write a CPU profile of each throughput fleet run to `PREFIX`-lanes<N>.pprof"},
			&cli.StringFlag{Name: "report", Usage: "render a JSON report saved with --json (`FILE`) instead of measuring (with --out, --svg)"},
			&cli.BoolFlag{Name: "keep", Usage: "keep the temporary server directories (worker logs included)"},
			&cli.StringFlag{Name: "worker-log-level", Value: "info", Usage: "log level of worker processes (their logs are in the server directory)"},
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "no progress line"},
			&cli.BoolFlag{Name: "trace", Usage: "throughput: trace the in-process fleet, every span recorded and batched; exported over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set, else dropped after the batch (the SDK's cost without a collector's)"},
		},
		Action: runBench,
	}
}

func parseInts(flag, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		mult := 1
		switch {
		case strings.HasSuffix(f, "k"):
			mult, f = 1000, strings.TrimSuffix(f, "k")
		case strings.HasSuffix(f, "M"):
			mult, f = 1000000, strings.TrimSuffix(f, "M")
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("--%s %q: want positive integers separated by commas", flag, s)
		}
		out = append(out, n*mult)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--%s: empty", flag)
	}
	return out, nil
}

func parseScenarios(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		switch {
		case f == "":
		case f == "all":
			return slices.Clone(benchScenarios), nil
		case slices.Contains(benchScenarios, f):
			if !slices.Contains(out, f) {
				out = append(out, f)
			}
		default:
			return nil, fmt.Errorf("--scenario %q: unknown scenario %q (want %s or all)", s, f, strings.Join(benchScenarios, ", "))
		}
	}
	if len(out) == 0 {
		return nil, errors.New("--scenario: empty")
	}
	slices.SortFunc(out, func(a, b string) int { return slices.Index(benchScenarios, a) - slices.Index(benchScenarios, b) })
	return out, nil
}

// progressLine writes the progress line on stderr: rewritten in place on a
// terminal, one line every few seconds otherwise.
type progressLine struct {
	mu    sync.Mutex
	tty   bool
	what  string
	last  time.Time
	shown bool
	quiet bool
}

func newProgressLine(quiet bool) *progressLine {
	p := &progressLine{quiet: quiet}
	if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		p.tty = true
	}
	return p
}

func (p *progressLine) set(what string) {
	p.mu.Lock()
	p.what = what
	p.mu.Unlock()
	p.note("starting")
}

func (p *progressLine) note(msg string) {
	p.print(fmt.Sprintf("bench: %s: %s", p.what, msg), true)
}

func (p *progressLine) report(pr bench.Progress) {
	line := fmt.Sprintf("bench: %s: %s, %s elapsed, %d turns", p.what, pr.Phase, pr.Elapsed.Round(time.Second), pr.Turns)
	if pr.Detail != "" {
		line += ", " + pr.Detail
	}
	p.print(line, false)
}

func (p *progressLine) print(line string, force bool) {
	if p.quiet {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprintf(os.Stderr, "\r\x1b[K%s", line)
		p.shown = true
		return
	}
	if force || time.Since(p.last) >= 5*time.Second {
		fmt.Fprintln(os.Stderr, line)
		p.last = time.Now()
	}
}

func (p *progressLine) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.shown {
		fmt.Fprint(os.Stderr, "\r\x1b[K")
		p.shown = false
	}
}

func runBench(c *cli.Context) error {
	if path := c.String("report"); path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var rep bench.Report
		if err := json.Unmarshal(b, &rep); err != nil {
			return fmt.Errorf("--report %s: %w", path, err)
		}
		rep.EvaluateGoals()
		return writeReport(c, &rep, nil)
	}
	scenarios, err := parseScenarios(c.String("scenario"))
	if err != nil {
		return err
	}
	lanes, err := parseInts("lanes", c.String("lanes"))
	if err != nil {
		return err
	}
	sessions, err := parseInts("sessions", c.String("sessions"))
	if err != nil {
		return err
	}
	ingresses, err := parseIngresses(c.String("ingress"))
	if err != nil {
		return err
	}
	remote := c.String("nats-url") != ""
	// A fleet's NATS in the environment is not a request to load it with
	// benchmark traffic: only --nats-url is. Say so rather than ignore it.
	for _, v := range []string{"AGENTFLEET_NATS_URL", "NATS_URL"} {
		if u := os.Getenv(v); u != "" && !remote {
			fmt.Fprintf(benchStderr, "bench: %s=%s is not used: bench runs its own embedded NATS servers; to measure the fleet there, pass --nats-url (and --ingress-url)\n", v, broker.RedactURL(u))
		}
	}
	if dir := c.String("data"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("--data: %w", err)
		}
	}
	if remote {
		if c.String("ingress-url") == "" {
			return errors.New("--nats-url needs --ingress-url (the running fleet's HTTP ingress)")
		}
		if len(ingresses) > 1 || ingresses[0] != bench.IngressHTTP {
			return errors.New("--ingress: a running fleet is driven through its HTTP ingress only")
		}
		for _, s := range scenarios {
			if s != "floor" && s != "throughput" {
				return fmt.Errorf("scenario %s runs on its own embedded server only; against a running fleet use floor,throughput", s)
			}
		}
	}
	bin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench: the agentfleet binary: %w", err)
	}
	// As every role: the first signal stops the run (and cleans up), a
	// second exits at once.
	ctx, stop := signalContext(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	defer stop()

	pl := newProgressLine(c.Bool("quiet"))
	defer pl.done()
	base := bench.Options{
		Workers: c.Int("workers"), Duration: c.Duration("duration"), WarmupTurns: c.Int("warmup"), Sync: c.String("sync"),
		DataDir: c.String("data"), LeaseTTL: c.Duration("lease-ttl"), Ingress: ingresses[0], Until: c.String("until"),
		NATSURL: c.String("nats-url"), IngressURL: c.String("ingress-url"), Prefix: c.String("prefix"), Replicas: c.Int("replicas"),
		WorkerBinary: bin, ProcessWorkers: c.Bool("process-workers"), Verify: c.Bool("verify"),
		Progress: pl.report, KeepData: c.Bool("keep"), WorkerLogLevel: c.String("worker-log-level"),
	}
	if !c.IsSet("workers") {
		base.Workers = 0
	}
	if c.Bool("trace") {
		tp, shutdown, err := benchTracer(c.Context)
		if err != nil {
			return err
		}
		defer shutdown()
		base.TracerProvider = tp
	}
	rep := &bench.Report{Machine: bench.ReadMachine(version), Scenarios: scenarios,
		Command: "agentfleet " + strings.Join(os.Args[1:], " ")}
	begin := time.Now()
	var errs []error
	fail := func(scn string, err error) {
		errs = append(errs, fmt.Errorf("%s: %w", scn, err))
		rep.Errors = append(rep.Errors, fmt.Sprintf("%s: %v", scn, err))
		pl.done()
		fmt.Fprintf(os.Stderr, "bench: %s failed: %v\n", scn, err)
	}
	throughputOpts := func(n int) bench.Options {
		o := base
		o.Lanes = n
		if o.Workers == 0 {
			o.Workers = 2
		}
		return o
	}
	run := func(scn string) {
		switch scn {
		case "floor":
			if slices.Contains(scenarios, "throughput") {
				return // measured beside each fleet run
			}
			for _, n := range lanes {
				pl.set(fmt.Sprintf("floor, %d lanes", n))
				r, err := bench.Floor(ctx, throughputOpts(n))
				if err != nil {
					fail(scn, err)
					return
				}
				rep.Floors = append(rep.Floors, r)
			}
		case "throughput":
			for _, n := range lanes {
				o := throughputOpts(n)
				pl.set(fmt.Sprintf("throughput %d lanes, floor", n))
				floor, err := bench.Floor(ctx, o)
				if err != nil {
					fail(scn, err)
					return
				}
				for _, mode := range ingresses {
					o.Ingress = mode
					pl.set(fmt.Sprintf("throughput %d lanes, fleet (%s ingress)", n, mode))
					prefix := c.String("cpuprofile")
					if prefix != "" && len(ingresses) > 1 {
						prefix += "-" + mode
					}
					fleet, err := profiled(prefix, n, func() (bench.Result, error) { return bench.Throughput(ctx, o) })
					if err != nil {
						fail(scn, err)
						return
					}
					rep.Throughput = append(rep.Throughput, fleet.WithFloor(floor))
				}
			}
		case "durability":
			reuse := map[int]bench.Result{}
			for _, r := range rep.Throughput {
				if r.Sync == "default" && r.Ingress == base.Ingress {
					reuse[r.Lanes] = r
				}
			}
			o := throughputOpts(1)
			pl.set("durability")
			rows, err := bench.Durability(ctx, o, lanes, reuse)
			rep.Durability = rows
			if err != nil {
				fail(scn, err)
			}
		case "takeover":
			o := base
			pl.set(fmt.Sprintf("takeover (lease TTL %s)", o.LeaseTTL))
			r, err := bench.Takeover(ctx, o, bench.TakeoverOptions{Kills: c.Int("kills"), KillSpread: c.Duration("kill-spread")})
			if err != nil {
				fail(scn, err)
				return
			}
			rep.Takeover = &r
		case "handover":
			o := base
			o.Lanes = c.Int("handover-lanes")
			pl.set(fmt.Sprintf("handover (%d lanes)", o.Lanes))
			r, err := bench.Handover(ctx, o, bench.HandoverOptions{TurnSleep: c.Duration("turn-sleep"), DrainTimeout: c.Duration("drain-timeout")})
			if err != nil {
				// The checks did not run (or not all): no result.
				fail(scn, err)
				return
			}
			rep.Handover = &r
		case "scale":
			o := base
			o.Lanes = c.Int("scale-lanes")
			if o.Workers == 0 {
				o.Workers = 2
			}
			for _, n := range sessions {
				pl.set(fmt.Sprintf("scale, %d sessions", n))
				ps, err := bench.Scale(ctx, o, bench.ScaleOptions{Sessions: []int{n}, Sweep: c.Bool("sweep")})
				rep.Scale = append(rep.Scale, ps...)
				if err != nil {
					fail(scn, err)
					return
				}
			}
		}
	}
	for _, s := range scenarios {
		if ctx.Err() != nil {
			fail(s, ctx.Err())
			break
		}
		run(s)
	}
	pl.done()
	rep.Elapsed = time.Since(begin)
	rep.Machine.LoadEnd = bench.ReadMachine(version).LoadStart
	rep.EvaluateGoals()
	return writeReport(c, rep, errs)
}

// writeReport writes the chart, the Markdown sections and the report on
// stdout, as the flags ask.
func writeReport(c *cli.Context, rep *bench.Report, errs []error) error {
	svgPath := c.String("svg")
	if svgPath == "" && c.String("out") != "" {
		svgPath = filepath.Join(filepath.Dir(c.String("out")), "bench-latency.svg")
	}
	wroteSVG := ""
	if len(errs) > 0 && (svgPath != "" || c.String("out") != "") {
		// A failed or interrupted run is no result to publish: its tables
		// would replace good ones with partial figures.
		fmt.Fprintf(os.Stderr, "bench: the run had errors; %s not updated\n", strings.Trim(c.String("out")+" "+svgPath, " "))
		svgPath = ""
	}
	if svgPath != "" && len(rep.Throughput) > 0 {
		if err := writeChart(svgPath, rep); err != nil {
			errs = append(errs, err)
		} else {
			wroteSVG = svgPath
		}
	}
	if out := c.String("out"); out != "" && len(errs) == 0 {
		rel := ""
		if wroteSVG != "" {
			if r, err := filepath.Rel(filepath.Dir(out), wroteSVG); err == nil {
				rel = filepath.ToSlash(r)
			}
		}
		if err := bench.UpdateMarkdown(out, rep.MarkdownSections(rel)); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Bool("json") {
		if err := rep.WriteJSON(benchStdout); err != nil {
			return err
		}
	} else if err := rep.WriteText(benchStdout); err != nil {
		return err
	}
	return errors.Join(errs...)
}

// profiled runs f, with a CPU profile written to prefix-lanes<n>.pprof when
// prefix is set.
// parseIngresses reads --ingress: one mode or a comma-separated list of
// distinct modes (http, adapter, publish).
func parseIngresses(s string) ([]string, error) {
	var out []string
	for _, m := range strings.Split(s, ",") {
		m = strings.TrimSpace(m)
		switch m {
		case bench.IngressHTTP, bench.IngressAdapter, bench.IngressPublish:
		default:
			return nil, fmt.Errorf("--ingress %q: want %s, %s or %s, or a comma-separated list of them", m, bench.IngressHTTP, bench.IngressAdapter, bench.IngressPublish)
		}
		if slices.Contains(out, m) {
			return nil, fmt.Errorf("--ingress: %s given twice", m)
		}
		out = append(out, m)
	}
	return out, nil
}

func profiled(prefix string, n int, f func() (bench.Result, error)) (bench.Result, error) {
	if prefix == "" {
		return f()
	}
	path := fmt.Sprintf("%s-lanes%d.pprof", prefix, n)
	pf, err := os.Create(path)
	if err != nil {
		return bench.Result{}, err
	}
	defer pf.Close()
	if err := pprof.StartCPUProfile(pf); err != nil {
		return bench.Result{}, err
	}
	defer pprof.StopCPUProfile()
	return f()
}

func writeChart(path string, rep *bench.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	x := rep.Throughput[0]
	m := rep.Machine
	sub := fmt.Sprintf("agentfleet bench, %s: %d workers, sync %s, %s, %s windows; %d CPUs, %s, nats-server %s",
		m.Date.Format("2006-01-02"), x.Workers, x.Sync, x.Conn, x.Window.Round(time.Second), m.CPUs, m.Go, strings.TrimSuffix(m.NATSServer, " (embedded)"))
	// One line per lane count: the chart shows the first ingress mode's rows.
	var rows []bench.Result
	for _, r := range rep.Throughput {
		if r.Ingress == x.Ingress {
			rows = append(rows, r)
		}
	}
	if len(rows) < len(rep.Throughput) {
		sub += ", " + x.Ingress + " ingress"
	}
	if err := bench.WriteSVG(f, rows, "Accept-to-reply latency: fleet vs JetStream floor", sub); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// benchTracer is the tracer provider of bench --trace: the OTEL_*
// configured pipeline when an OTLP endpoint is set, else an SDK provider
// that samples every span and batches them to an exporter that drops them.
func benchTracer(ctx context.Context) (trace.TracerProvider, func(), error) {
	p, err := provider.New(ctx, provider.Config{ServiceName: "agentfleet-bench", Version: version})
	if err != nil {
		return nil, nil, err
	}
	if p.Tracer != nil {
		return p.Tracer, func() { _ = p.Shutdown(context.Background()) }, nil
	}
	_ = p.Shutdown(ctx)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	return tp, func() { _ = tp.Shutdown(context.Background()) }, nil
}
