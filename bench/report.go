package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/broker"
)

// Machine describes where a report was measured.
type Machine struct {
	CPUs        int    `json:"cpus"`
	GOMAXPROCS  int    `json:"gomaxprocs"`
	CPUModel    string `json:"cpu_model,omitempty"`
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
	OS          string `json:"os"`
	Go          string `json:"go"`
	NATSServer  string `json:"nats_server"`
	NATSClient  string `json:"nats_client"`
	Agentfleet  string `json:"agentfleet,omitempty"`
	// LoadStart and LoadEnd are /proc/loadavg (1, 5, 15 minutes) when the
	// run began and ended.
	LoadStart string    `json:"load_start,omitempty"`
	LoadEnd   string    `json:"load_end,omitempty"`
	Date      time.Time `json:"date"`
}

// ReadMachine describes this machine; version is agentfleet's.
func ReadMachine(version string) Machine {
	m := Machine{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), OS: runtime.GOOS + "/" + runtime.GOARCH,
		Go: runtime.Version(), NATSServer: "v" + server.VERSION + " (embedded)", NATSClient: "nats.go v" + nats.Version,
		Agentfleet: version, LoadStart: loadAvg(), Date: time.Now().UTC()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.OS += ", Linux " + strings.TrimSpace(string(b))
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var kb uint64
			if _, err := fmt.Sscanf(sc.Text(), "MemTotal: %d kB", &kb); err == nil {
				m.MemoryBytes = kb << 10
				break
			}
		}
		f.Close()
	}
	return m
}

// Goal is one goal of the issue and where it stands.
type Goal struct {
	Scenario string `json:"scenario"`
	Goal     string `json:"goal"`
	Measured string `json:"measured"`
	// Status is "met", "not met" or "not measured".
	Status string `json:"status"`
}

// Report is everything one `agentfleet bench` run measured.
type Report struct {
	Machine Machine `json:"machine"`
	// Command is the command line that produced the report.
	Command   string   `json:"command"`
	Scenarios []string `json:"scenarios"`
	// Floors are floor-only results (the floor scenario without throughput).
	Floors []Result `json:"floor,omitempty"`
	// Throughput are fleet results with their floors attached.
	Throughput []Result          `json:"throughput,omitempty"`
	Durability []DurabilityRow   `json:"durability,omitempty"`
	Takeover   *TakeoverResult   `json:"takeover,omitempty"`
	Handover   *HandoverResult   `json:"handover,omitempty"`
	Scale      []ScalePoint      `json:"scale,omitempty"`
	Goals      []Goal            `json:"goals,omitempty"`
	Elapsed    time.Duration     `json:"elapsed_ns"`
	Errors     []string          `json:"errors,omitempty"`
	Profiles   map[string]string `json:"profiles,omitempty"`
}

// Goals of the issue.
const (
	GoalRate64     = 0.75
	GoalP50Single  = 2.0
	GoalHandoverMs = 500
	// GoalTakeoverP99 is the p99 kill-to-resume time of the takeover
	// scenario with the default settings.
	GoalTakeoverP99 = 3 * time.Second
	GoalScaleDrift  = 0.10
	// GoalMemFlat is the largest ratio of worker memory between session
	// counts that still counts as flat.
	GoalMemFlat = 1.25
)

func has(list []string, s string) bool { return slices.Contains(list, s) }

// ingressModes are the ingress modes of the throughput rows, in the order
// first measured.
func (r *Report) ingressModes() []string {
	var out []string
	for _, x := range r.Throughput {
		if !slices.Contains(out, x.Ingress) {
			out = append(out, x.Ingress)
		}
	}
	return out
}

// ingressLabel names an ingress mode for the tables.
func ingressLabel(mode string) string {
	switch mode {
	case IngressHTTP:
		return "HTTP ingress rows"
	case IngressAdapter:
		return "adapter ingress rows (in process, no HTTP hop)"
	case IngressPublish:
		return "publish rows (the bench's copy of the ingress, no HTTP hop)"
	}
	return mode + " rows"
}

// EvaluateGoals fills r.Goals from what the report measured.
func (r *Report) EvaluateGoals() {
	r.Goals = nil
	add := func(scn, goal, measured, status string) {
		r.Goals = append(r.Goals, Goal{Scenario: scn, Goal: goal, Measured: measured, Status: status})
	}
	status := func(ok bool) string {
		if ok {
			return "met"
		}
		return "not met"
	}
	if has(r.Scenarios, "throughput") {
		// Each ingress mode measured is judged on its own rows, and the goal
		// says which: the adapter rows have no HTTP hop and never stand for
		// the HTTP figure.
		modes := r.ingressModes()
		if len(modes) == 0 {
			modes = []string{""}
		}
		for _, mode := range modes {
			which := ""
			if mode != "" {
				which = "; " + ingressLabel(mode)
			}
			g1 := fmt.Sprintf("throughput at 64 lanes ≥ %.0f%% of the floor's, same run%s", GoalRate64*100, which)
			g2 := fmt.Sprintf("single-lane p50 ≤ %.0f× the floor's%s", GoalP50Single, which)
			var r64, r1 *Result
			for i := range r.Throughput {
				if r.Throughput[i].Ingress != mode {
					continue
				}
				switch r.Throughput[i].Lanes {
				case 64:
					r64 = &r.Throughput[i]
				case 1:
					r1 = &r.Throughput[i]
				}
			}
			if r64 != nil && r64.Floor != nil {
				add("throughput", g1, fmt.Sprintf("%.0f%% (fleet %.0f turns/s, floor %.0f)", r64.RatioRate*100, r64.Rate, r64.Floor.Rate), status(r64.RatioRate >= GoalRate64))
			} else {
				add("throughput", g1, "64 lanes not run", "not measured")
			}
			if r1 != nil && r1.Floor != nil {
				// Accept-to-reply counts from the moment the server stored the
				// inbox message, for both (see restamp); the whole path
				// (send-to-reply, with the fleet's ingress) must hold too.
				st := status(r1.RatioP50 <= GoalP50Single && r1.RatioRoundTripP50 <= GoalP50Single)
				if r1.RatioP50 <= GoalP50Single && r1.RatioRoundTripP50 > GoalP50Single {
					st = "met on accept-to-reply only; not met send-to-reply"
				}
				add("throughput", g2, fmt.Sprintf("%.2f× accept-to-reply (%s vs %s); send-to-reply %.2f× (%s vs %s)", r1.RatioP50, fmtDur(r1.P50), fmtDur(r1.Floor.P50),
					r1.RatioRoundTripP50, fmtDur(r1.RoundTripP50), fmtDur(r1.Floor.RoundTripP50)), st)
			} else {
				add("throughput", g2, "1 lane not run", "not measured")
			}
		}
	}
	if t := r.Takeover; t != nil {
		g := fmt.Sprintf("takeover p99 ≤ %s (default settings)", GoalTakeoverP99)
		m := fmt.Sprintf("p99 %s, p50 %s over %d resumed turns (lease TTL %s, liveness TTL %s, goal %s)", fmtDur(t.P99), fmtDur(t.P50), len(t.Samples), t.LeaseTTL, t.LivenessTTL, t.Goal)
		if len(t.Samples) < 100 {
			// Nearest-rank p99 of fewer than 100 samples is their maximum
			// (and the lanes of one kill resume together).
			m += fmt.Sprintf("; with %d samples the p99 is the maximum", len(t.Samples))
		}
		if t.LeaseTTL != broker.DefaultLeaseTTL || t.LivenessTTL != broker.DefaultLivenessTTL {
			m += "; not the default TTL"
		}
		add("takeover", g, m, status(len(t.Samples) > 0 && t.P99 <= t.Goal))
	}
	if h := r.Handover; h != nil {
		g := fmt.Sprintf("handover adds ≤ %d ms p99 to handed-over turns; zero lost, zero duplicated", GoalHandoverMs)
		m := fmt.Sprintf("+%s p99 (+%s p50) over %d handed-over turns; %d lost, %d duplicated of %d messages",
			fmtDur(h.AddedP99), fmtDur(h.AddedP50), h.HandedOver.N, h.Lost, h.Duplicated, h.Messages)
		if len(h.Problems) > 0 {
			m += fmt.Sprintf("; %d other problems (order, commits, replies: see the report)", len(h.Problems))
		}
		ok := h.AddedP99 <= GoalHandoverMs*time.Millisecond && h.Lost == 0 && h.Duplicated == 0 && h.HandedOver.N > 0 && len(h.Problems) == 0
		add("handover", g, m, status(ok))
	}
	if len(r.Scale) > 0 {
		lo, hi := r.Scale[0], r.Scale[0]
		for _, p := range r.Scale {
			if p.Sessions < lo.Sessions {
				lo = p
			}
			if p.Sessions > hi.Sessions {
				hi = p
			}
		}
		g := fmt.Sprintf("per-turn latency at 1M sessions within %.0f%% of 1k", GoalScaleDrift*100)
		if hi.Sessions == lo.Sessions {
			add("scale", g, "one session count only", "not measured")
		} else {
			d50 := float64(hi.Fleet.P50)/float64(lo.Fleet.P50) - 1
			d99 := float64(hi.Fleet.P99)/float64(lo.Fleet.P99) - 1
			m := fmt.Sprintf("p50 %+.0f%%, p99 %+.0f%% at %s vs %s sessions", d50*100, d99*100, count(hi.Sessions), count(lo.Sessions))
			st := status(d50 <= GoalScaleDrift)
			if hi.Sessions < 1000000 {
				m += " (1M not run)"
				if st == "met" {
					st = "met up to " + count(hi.Sessions)
				}
			}
			add("scale", g, m, st)
			g = "worker memory flat in the number of sessions"
			minM, maxM := lo.WorkerMem, lo.WorkerMem
			for _, p := range r.Scale {
				minM, maxM = min(minM, p.WorkerMem), max(maxM, p.WorkerMem)
			}
			ratio := float64(maxM) / float64(max(minM, 1))
			m = fmt.Sprintf("%s %s..%s (×%.2f) from %s to %s sessions", lo.MemKind, fmtBytes(minM), fmtBytes(maxM), ratio, count(lo.Sessions), count(hi.Sessions))
			st = status(ratio <= GoalMemFlat)
			if hi.Sweep != nil {
				m += fmt.Sprintf("; one expiry sweep (the watcher leader's) adds %s of live heap at %s", fmtBytes(hi.Sweep.LiveGrowth), count(hi.Sessions))
				// Flat: no more than the goal's ratio above the growth at the
				// next smaller count (it may saturate), or under 16 MiB.
				var prev *ScalePoint
				for i := range r.Scale {
					p := &r.Scale[i]
					if p.Sweep != nil && p.Sessions < hi.Sessions && (prev == nil || p.Sessions > prev.Sessions) {
						prev = p
					}
				}
				if prev != nil {
					m += fmt.Sprintf(" (%s at %s)", fmtBytes(prev.Sweep.LiveGrowth), count(prev.Sessions))
				}
				if prev != nil && hi.Sweep.LiveGrowth > 16<<20 && float64(hi.Sweep.LiveGrowth) > GoalMemFlat*float64(prev.Sweep.LiveGrowth) {
					if st == "met" {
						st = "met in steady state; not met by the expiry sweep"
					}
				}
			}
			add("scale", g, m, st)
		}
	}
}

// fmtDur renders a latency with three significant digits.
func fmtDur(d time.Duration) string {
	neg := ""
	if d < 0 {
		neg, d = "-", -d
	}
	ms := float64(d) / 1e6
	switch {
	case d == 0:
		return "0"
	case ms < 1:
		return fmt.Sprintf("%s%.3f ms", neg, ms)
	case ms < 10:
		return fmt.Sprintf("%s%.2f ms", neg, ms)
	case ms < 1000:
		return fmt.Sprintf("%s%.1f ms", neg, ms)
	default:
		return fmt.Sprintf("%s%.2f s", neg, ms/1000)
	}
}

func fmtBytes(b uint64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.0f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

// count renders 1000 as 1k and 1000000 as 1M.
func count(n int) string {
	switch {
	case n >= 1000000 && n%1000000 == 0:
		return fmt.Sprintf("%dM", n/1000000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// WriteJSON writes the report as one indented JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// table is a grid of cells rendered as aligned text or as Markdown.
type table struct {
	head  []string
	right []bool // right-aligned columns (Markdown)
	rows  [][]string
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) text(w io.Writer) {
	flags := tabwriter.AlignRight
	if len(t.right) == 0 {
		flags = 0
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', flags)
	fmt.Fprintln(tw, strings.Join(t.head, "\t")+"\t")
	for _, r := range t.rows {
		fmt.Fprintln(tw, strings.Join(r, "\t")+"\t")
	}
	_ = tw.Flush()
}

func (t *table) markdown(b *strings.Builder) {
	b.WriteString("| " + strings.Join(t.head, " | ") + " |\n|")
	for i := range t.head {
		if i < len(t.right) && t.right[i] {
			b.WriteString("---:|")
		} else {
			b.WriteString("---|")
		}
	}
	b.WriteString("\n")
	for _, r := range t.rows {
		b.WriteString("| " + strings.Join(r, " | ") + " |\n")
	}
}

func rightCols(n int, left ...int) []bool {
	out := make([]bool, n)
	for i := range out {
		out[i] = !slices.Contains(left, i)
	}
	return out
}

func (r *Report) throughputTable() *table {
	t := &table{head: []string{"lanes", "fleet turns/s", "p50", "p90", "p99", "max", "send-to-reply p50", "CPU/turn",
		"floor turns/s", "floor p50", "floor p90", "floor p99", "floor send-to-reply p50", "floor CPU/turn",
		"rate fleet/floor", "p50 fleet/floor", "send-to-reply p50 fleet/floor", "CPU fleet/floor", "takeovers in window"}}
	mixed := len(r.ingressModes()) > 1
	if mixed {
		t.head = slices.Insert(t.head, 1, "ingress")
	}
	t.right = rightCols(len(t.head), 1)
	if !mixed {
		t.right = rightCols(len(t.head))
	}
	for _, x := range r.Throughput {
		f := x.Floor
		if f == nil {
			f = &Result{}
		}
		tk := fmt.Sprint(x.Takeovers)
		if x.Takeovers < 0 {
			tk = "n/a"
		}
		cells := []string{fmt.Sprint(x.Lanes), fmt.Sprintf("%.0f", x.Rate), fmtDur(x.P50), fmtDur(x.P90), fmtDur(x.P99), fmtDur(x.Max),
			fmtDur(x.RoundTripP50), us(x.CPUPerTurn),
			fmt.Sprintf("%.0f", f.Rate), fmtDur(f.P50), fmtDur(f.P90), fmtDur(f.P99), fmtDur(f.RoundTripP50), us(f.CPUPerTurn),
			fmt.Sprintf("%.2f", x.RatioRate), fmt.Sprintf("%.2f", x.RatioP50), fmt.Sprintf("%.2f", x.RatioRoundTripP50),
			ratioOrDash(x.RatioCPU), tk}
		if mixed {
			cells = slices.Insert(cells, 1, x.Ingress)
		}
		t.add(cells...)
	}
	return t
}

func (r *Report) floorTable() *table {
	t := &table{head: []string{"lanes", "floor turns/s", "p50", "p90", "p99", "max", "send-to-reply p50", "CPU/turn"}}
	t.right = rightCols(len(t.head))
	for _, f := range r.Floors {
		t.add(fmt.Sprint(f.Lanes), fmt.Sprintf("%.0f", f.Rate), fmtDur(f.P50), fmtDur(f.P90), fmtDur(f.P99), fmtDur(f.Max),
			fmtDur(f.RoundTripP50), us(f.CPUPerTurn))
	}
	return t
}

func (r *Report) durabilityTable() *table {
	t := &table{head: []string{"lanes", "sync", "fleet turns/s", "fleet p50", "fleet p99", "floor turns/s", "floor p50", "floor p99",
		"rate fleet/floor", "fleet rate always/default", "fleet p50 always/default", "floor rate always/default"}}
	t.right = rightCols(len(t.head), 1)
	for _, d := range r.Durability {
		for _, x := range []Result{d.Default, d.Always} {
			f := x.Floor
			if f == nil {
				f = &Result{}
			}
			cost, p50c, fc := "", "", ""
			if x.Sync == "always" {
				cost, p50c, fc = fmt.Sprintf("%.2f", d.RateCost), fmt.Sprintf("%.2f", d.P50Cost), fmt.Sprintf("%.2f", d.FloorRateCost)
			}
			t.add(fmt.Sprint(d.Lanes), x.Sync, fmt.Sprintf("%.0f", x.Rate), fmtDur(x.P50), fmtDur(x.P99),
				fmt.Sprintf("%.0f", f.Rate), fmtDur(f.P50), fmtDur(f.P99), fmt.Sprintf("%.2f", x.RatioRate), cost, p50c, fc)
		}
	}
	return t
}

func (r *Report) takeoverTable() *table {
	t := r.Takeover
	tb := &table{head: []string{"workers", "lease TTL", "liveness TTL", "kills", "resumed turns", "p50", "p99", "min", "max", "mean", "goal"}}
	tb.right = rightCols(len(tb.head))
	tb.add(fmt.Sprint(t.Workers), t.LeaseTTL.String(), t.LivenessTTL.String(), fmt.Sprint(t.Kills), fmt.Sprint(len(t.Samples)), fmtDur(t.P50), fmtDur(t.P99),
		fmtDur(t.Min), fmtDur(t.Max), fmtDur(t.Mean), t.Goal.String())
	return tb
}

func (r *Report) handoverTable() *table {
	h := r.Handover
	tb := &table{head: []string{"turns", "p50", "p90", "p99", "max"}}
	tb.head = append([]string{"kind"}, tb.head...)
	tb.right = rightCols(len(tb.head), 0)
	row := func(kind string, s LatencyStats) {
		tb.add(kind, fmt.Sprint(s.N), fmtDur(s.P50), fmtDur(s.P90), fmtDur(s.P99), fmtDur(s.Max))
	}
	row(fmt.Sprintf("handed over (%d resumed, %d moved)", h.Resumed, h.Moved), h.HandedOver)
	row("drained (finished on the stopping worker)", h.Drained)
	row("others", h.Others)
	return tb
}

func (r *Report) scaleTable() *table {
	tb := &table{head: []string{"sessions", "creation", "entries/s", "bucket size", "turns/s", "p50", "p90", "p99", "max",
		"CPU/turn (server + ingress)", "worker memory", "worker peak RSS", "bench heap (server)", "sweep time", "sweep live heap growth", "sweep heap-in-use growth"}}
	tb.right = rightCols(len(tb.head))
	for _, p := range r.Scale {
		sw, sl, sh := "—", "—", "—"
		if p.Sweep != nil {
			sw, sl, sh = fmtDur(p.Sweep.Duration), fmtBytes(p.Sweep.LiveGrowth), fmtBytes(p.Sweep.HeapGrowth)
		}
		peak := "—"
		if p.WorkerPeak > 0 {
			peak = fmtBytes(p.WorkerPeak)
		}
		tb.add(count(p.Sessions), fmtDur(p.Create), fmt.Sprintf("%.0f", p.CreateRate), fmtBytes(p.StoreBytes),
			fmt.Sprintf("%.0f", p.Fleet.Rate), fmtDur(p.Fleet.P50), fmtDur(p.Fleet.P90), fmtDur(p.Fleet.P99), fmtDur(p.Fleet.Max),
			us(p.Fleet.CPUPerTurn), fmtBytes(p.WorkerMem)+" "+p.MemKind, peak, fmtBytes(p.BenchHeap), sw, sl, sh)
	}
	return tb
}

func (r *Report) goalsTable(scenario string) *table {
	tb := &table{head: []string{"goal", "measured", "status"}}
	for _, g := range r.Goals {
		if scenario == "" || g.Scenario == scenario {
			tb.add(g.Goal, g.Measured, "**"+g.Status+"**")
		}
	}
	return tb
}

// WriteText writes the human report: one table per scenario, then the goals.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "agentfleet bench — %s, %d CPUs (GOMAXPROCS %d), %s, %s, nats-server %s; load average %s → %s; %s\n",
		m.Date.Format("2006-01-02 15:04 MST"), m.CPUs, m.GOMAXPROCS, fmtBytes(m.MemoryBytes), m.Go, m.NATSServer, m.LoadStart, m.LoadEnd, r.Elapsed.Round(time.Second))
	section := func(title string, t *table) {
		fmt.Fprintf(&b, "\n== %s ==\n", title)
		t.text(&b)
	}
	if len(r.Floors) > 0 {
		section("floor (raw JetStream operations of one turn)", r.floorTable())
	}
	if len(r.Throughput) > 0 {
		x := r.Throughput[0]
		section(fmt.Sprintf("throughput (accept-to-reply; %d workers, sync %s, %s connections, %s ingress)", x.Workers, x.Sync, x.Conn, strings.Join(r.ingressModes(), " and ")), r.throughputTable())
	}
	if len(r.Durability) > 0 {
		section("durability (sync default vs always)", r.durabilityTable())
	}
	if r.Takeover != nil {
		section("takeover (kill -9 → resumed turn's first progress)", r.takeoverTable())
	}
	if h := r.Handover; h != nil {
		section(fmt.Sprintf("handover (rolling restart of %d workers under load on %d lanes; added p99 %s, lost %d, duplicated %d of %d messages)",
			h.Workers, h.Lanes, fmtDur(h.AddedP99), h.Lost, h.Duplicated, h.Messages), r.handoverTable())
		for _, p := range h.Problems {
			fmt.Fprintf(&b, "  problem: %s\n", p)
		}
	}
	if len(r.Scale) > 0 {
		section("scale (per-turn latency and worker memory against the sessions in the store)", r.scaleTable())
	}
	if len(r.Goals) > 0 {
		section("goals", r.goalsTable(""))
	}
	for _, e := range r.Errors {
		fmt.Fprintf(&b, "error: %s\n", e)
	}
	_, err := io.WriteString(w, strings.ReplaceAll(b.String(), "**", ""))
	return err
}

// MarkdownSections renders the report as the generated sections of
// docs/benchmarks.md, by name ("machine", and one per scenario run). svg is
// the chart's path relative to the Markdown file ("" when none).
func (r *Report) MarkdownSections(svg string) map[string]string {
	out := map[string]string{}
	m := r.Machine
	var b strings.Builder
	fmt.Fprintf(&b, "| | |\n|---|---|\n")
	fmt.Fprintf(&b, "| CPU | %d × %s (`GOMAXPROCS=%d`) |\n", m.CPUs, orDash(m.CPUModel), m.GOMAXPROCS)
	fmt.Fprintf(&b, "| memory | %s |\n", fmtBytes(m.MemoryBytes))
	fmt.Fprintf(&b, "| OS | %s |\n", m.OS)
	fmt.Fprintf(&b, "| Go | %s |\n", m.Go)
	fmt.Fprintf(&b, "| NATS | nats-server %s, %s |\n", m.NATSServer, m.NATSClient)
	fmt.Fprintf(&b, "| agentfleet | %s |\n", orDash(m.Agentfleet))
	out["machine"] = b.String()

	head := func(b *strings.Builder) {
		fmt.Fprintf(b, "Measured %s, load average %s at the start and %s at the end (1, 5, 15 min), in %s:\n\n```sh\n%s\n```\n\n",
			m.Date.Format("2006-01-02 15:04 MST"), m.LoadStart, m.LoadEnd, r.Elapsed.Round(time.Second), r.Command)
	}
	goals := func(b *strings.Builder, scn string) {
		t := r.goalsTable(scn)
		if len(t.rows) > 0 {
			b.WriteString("\n")
			t.markdown(b)
		}
	}
	if len(r.Throughput) > 0 {
		var b strings.Builder
		head(&b)
		x := r.Throughput[0]
		fmt.Fprintf(&b, "%d workers, sync `%s`, %s connections, %s ingress, replies timed at the %s, %s windows after %s; "+
			"each row's floor ran just before its fleet, on its own fresh server.\n\n",
			x.Workers, x.Sync, x.Conn, strings.Join(r.ingressModes(), " and "), x.Until, x.Window.Round(100*time.Millisecond), "warm-up")
		if len(r.ingressModes()) > 1 {
			b.WriteString("The rows of each lane count share one floor, measured before them; the ingress column says how messages reached the fleet " +
				"(`http`: POSTed to `/v1/messages` by the bench's HTTP client; `adapter`: handed to the ingress in process, as a platform adapter does, without the HTTP hop).\n\n")
		}
		r.throughputTable().markdown(&b)
		if svg != "" {
			fmt.Fprintf(&b, "\n![accept-to-reply latency percentiles against lanes, floor and fleet](%s)\n", svg)
		}
		goals(&b, "throughput")
		out["throughput"] = b.String()
	}
	if len(r.Floors) > 0 && len(r.Throughput) == 0 {
		var b strings.Builder
		head(&b)
		r.floorTable().markdown(&b)
		out["floor"] = b.String()
	}
	if len(r.Durability) > 0 {
		var b strings.Builder
		head(&b)
		r.durabilityTable().markdown(&b)
		out["durability"] = b.String()
	}
	if t := r.Takeover; t != nil {
		var b strings.Builder
		head(&b)
		spread := "as soon as the round's long turns ran"
		if t.KillSpread > 0 {
			spread = fmt.Sprintf("at a uniformly random moment within %s after the round's long turns started", t.KillSpread)
		}
		fmt.Fprintf(&b, "%d worker processes, lease TTL %s; each kill -9 came %s.\n\n", t.Workers, t.LeaseTTL, spread)
		r.takeoverTable().markdown(&b)
		b.WriteString("\nPer kill (victim, lanes it ran, when it was killed → the time to each resumed turn's first progress):\n\n")
		for i, rd := range t.Rounds {
			var s []string
			for _, d := range rd.Resumed {
				s = append(s, fmtDur(d))
			}
			fmt.Fprintf(&b, "%d. %s, %d lanes, killed %s after the start → %s\n", i+1, rd.Victim, rd.Lanes, fmtDur(rd.KilledAfter), strings.Join(s, ", "))
		}
		goals(&b, "takeover")
		out["takeover"] = b.String()
	}
	if h := r.Handover; h != nil {
		var b strings.Builder
		head(&b)
		drain := "the default drain timeout (1m)"
		if h.DrainTimeout > 0 {
			drain = "drain timeout " + h.DrainTimeout.String()
		}
		fmt.Fprintf(&b, "%d worker processes (`--restart`, %s, lease TTL %s), %d lanes with one message in flight each, "+
			"echo agent sleeping %s per turn. Restarts (SIGTERM → exit; → registered again):", h.Workers, drain, h.LeaseTTL, h.Lanes, h.TurnSleep)
		for _, rs := range h.Restarts {
			fmt.Fprintf(&b, " %s %s; %s (exit %d).", rs.Worker, fmtDur(rs.Exited), fmtDur(rs.Back), rs.ExitCode)
		}
		fmt.Fprintf(&b, "\n\n")
		r.handoverTable().markdown(&b)
		fmt.Fprintf(&b, "\nAdded by the handover: p50 %s, p99 %s. Checked afterwards: %d messages, **%d lost, %d duplicated** "+
			"(user entry in the transcript and reply in the outbox, each exactly once, in order).\n", fmtDur(h.AddedP50), fmtDur(h.AddedP99), h.Messages, h.Lost, h.Duplicated)
		for _, p := range h.Problems {
			fmt.Fprintf(&b, "- problem: %s\n", p)
		}
		goals(&b, "handover")
		out["handover"] = b.String()
	}
	if len(r.Scale) > 0 {
		var b strings.Builder
		head(&b)
		x := r.Scale[0].Fleet
		fmt.Fprintf(&b, "Each row: a fresh server, the entries created in bulk, then %d fresh lanes measured for %s (%d workers, %s connections).\n\n",
			x.Lanes, x.Window.Round(100*time.Millisecond), x.Workers, x.Conn)
		r.scaleTable().markdown(&b)
		goals(&b, "scale")
		out["scale"] = b.String()
	}
	return out
}

func ratioOrDash(v float64) string {
	if v == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f", v)
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// SectionOrder is the order of the generated sections in a new file.
var SectionOrder = []string{"machine", "floor", "throughput", "durability", "takeover", "handover", "scale"}

// UpdateMarkdown replaces, in the Markdown file at path, each generated
// section between its markers
//
//	<!-- BEGIN bench:NAME -->
//	<!-- END bench:NAME -->
//
// and appends the sections that have no markers yet at the end. Everything
// else in the file is kept. A missing file is created.
func UpdateMarkdown(path string, sections map[string]string) error {
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	doc := string(b)
	for _, name := range SectionOrder {
		body, ok := sections[name]
		if !ok {
			continue
		}
		begin := "<!-- BEGIN bench:" + name + " "
		end := "<!-- END bench:" + name + " -->"
		block := begin + "(written by agentfleet bench; do not edit) -->\n" + body + end
		i := strings.Index(doc, begin)
		j := strings.Index(doc, end)
		if i >= 0 && j > i {
			doc = doc[:i] + block + doc[j+len(end):]
			continue
		}
		if doc != "" && !strings.HasSuffix(doc, "\n\n") {
			doc = strings.TrimRight(doc, "\n") + "\n\n"
		}
		doc += block + "\n"
	}
	return os.WriteFile(path, []byte(doc), 0o644)
}
