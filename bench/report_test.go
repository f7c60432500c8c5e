package bench_test

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bench"
)

func sampleReport() *bench.Report {
	floor := func(lanes int, p50 time.Duration, rate float64) bench.Result {
		return bench.Result{Scenario: "floor", Lanes: lanes, Sync: "default", Rate: rate, P50: p50, P90: 2 * p50, P99: 4 * p50,
			RoundTripP50: p50 + p50/4, CPUPerTurn: 500 * time.Microsecond}
	}
	fleet := func(lanes int, p50 time.Duration, rate float64) bench.Result {
		return bench.Result{Scenario: "fleet", Lanes: lanes, Workers: 2, Sync: "default", Conn: "in-process", Ingress: "http", Until: "outbox",
			Rate: rate, P50: p50, P90: 2 * p50, P99: 5 * p50, RoundTripP50: 2 * p50, CPUPerTurn: 1200 * time.Microsecond, Window: 5 * time.Second}
	}
	r := &bench.Report{
		Machine:   bench.Machine{CPUs: 2, GOMAXPROCS: 2, Go: "go1.26", NATSServer: "v2.15.2", LoadStart: "1.00 1.00 1.00", LoadEnd: "1.50 1.20 1.00", Date: time.Date(2026, 11, 22, 1, 0, 0, 0, time.UTC)},
		Command:   "agentfleet bench --scenario all",
		Scenarios: []string{"floor", "throughput", "takeover", "handover", "scale"},
		Throughput: []bench.Result{
			fleet(1, 900*time.Microsecond, 500).WithFloor(floor(1, 400*time.Microsecond, 1400)),
			fleet(8, 3*time.Millisecond, 1100).WithFloor(floor(8, 2*time.Millisecond, 2900)),
			fleet(64, 30*time.Millisecond, 3000).WithFloor(floor(64, 15*time.Millisecond, 3900)),
		},
		Takeover: &bench.TakeoverResult{Workers: 3, LeaseTTL: 15 * time.Second, LivenessTTL: 2 * time.Second, Kills: 2, Goal: bench.GoalTakeoverP99,
			Samples: []time.Duration{1800 * time.Millisecond, 2 * time.Second}, P50: 1800 * time.Millisecond, P99: 2 * time.Second,
			Rounds: []bench.TakeoverRound{{Victim: "tk1", Lanes: 1, Resumed: []time.Duration{1800 * time.Millisecond}}, {Victim: "tk2", Lanes: 1, Resumed: []time.Duration{2 * time.Second}}}},
		Handover: &bench.HandoverResult{Workers: 3, Lanes: 16, Messages: 900, AddedP99: 600 * time.Millisecond,
			HandedOver: bench.LatencyStats{N: 20, P99: 800 * time.Millisecond}, Others: bench.LatencyStats{N: 800, P99: 200 * time.Millisecond}},
		Scale: []bench.ScalePoint{
			{Sessions: 1000, Fleet: fleet(8, 10*time.Millisecond, 400), WorkerMem: 50 << 20, MemKind: "rss",
				Sweep: &bench.SweepResult{Duration: 300 * time.Millisecond, LiveGrowth: 8 << 20, HeapGrowth: 8 << 20}},
			{Sessions: 1000000, Fleet: fleet(8, 10500*time.Microsecond, 400), WorkerMem: 55 << 20, MemKind: "rss",
				Sweep: &bench.SweepResult{Duration: 300 * time.Second, LiveGrowth: 2 << 30, HeapGrowth: 2 << 30}},
		},
	}
	r.EvaluateGoals()
	return r
}

func TestEvaluateGoals(t *testing.T) {
	r := sampleReport()
	want := map[string]string{
		"throughput at 64 lanes ≥ 75% of the floor's, same run; HTTP ingress rows": "met",     // 3000/3900 = 77%
		"single-lane p50 ≤ 2× the floor's; HTTP ingress rows":                      "not met", // 2.25×
		"takeover p99 ≤ 3s (default settings)":                                     "met",
		"per-turn latency at 1M sessions within 10% of 1k":                         "met",
		"worker memory flat in the number of sessions":                             "met in steady state; not met by the expiry sweep",
	}
	got := map[string]string{}
	for _, g := range r.Goals {
		got[g.Goal] = g.Status
		t.Logf("%s: %s (%s)", g.Goal, g.Status, g.Measured)
	}
	for g, s := range want {
		if got[g] != s {
			t.Errorf("goal %q: %q, want %q", g, got[g], s)
		}
	}
	for _, g := range r.Goals {
		if g.Scenario == "handover" && g.Status != "not met" {
			t.Errorf("handover goal with +600ms p99: %q", g.Status)
		}
	}
}

// TestGoalsJudgeEachIngress: with rows of the HTTP ingress and of the
// in-process adapter, each mode gets its own verdicts, named after it, from
// its own rows only (a fast adapter row never passes for the HTTP figure),
// and the table tells the rows apart.
func TestGoalsJudgeEachIngress(t *testing.T) {
	r := sampleReport()
	var rows []bench.Result
	for _, x := range r.Throughput {
		x.Rate = x.Floor.Rate * 0.5 // HTTP: 50 % of the floor
		rows = append(rows, x)
		a := x
		a.Ingress = bench.IngressAdapter
		a.P50, a.RoundTripP50 = x.Floor.P50, x.Floor.RoundTripP50
		a.Rate = x.Floor.Rate * 0.8
		rows = append(rows, a.WithFloor(*x.Floor))
	}
	r.Throughput = rows
	for i := range r.Throughput {
		r.Throughput[i] = r.Throughput[i].WithFloor(*r.Throughput[i].Floor)
	}
	r.EvaluateGoals()
	want := map[string]string{
		"throughput at 64 lanes ≥ 75% of the floor's, same run; HTTP ingress rows":                              "not met",
		"single-lane p50 ≤ 2× the floor's; HTTP ingress rows":                                                   "not met",
		"throughput at 64 lanes ≥ 75% of the floor's, same run; adapter ingress rows (in process, no HTTP hop)": "met",
		"single-lane p50 ≤ 2× the floor's; adapter ingress rows (in process, no HTTP hop)":                      "met",
	}
	got := map[string]string{}
	for _, g := range r.Goals {
		if g.Scenario == "throughput" {
			got[g.Goal] = g.Status
		}
	}
	if len(got) != len(want) {
		t.Errorf("throughput goals %v, want %v", got, want)
	}
	for g, s := range want {
		if got[g] != s {
			t.Errorf("goal %q: %q, want %q", g, got[g], s)
		}
	}
	md := r.MarkdownSections("")["throughput"]
	for _, s := range []string{"| lanes | ingress |", "| 64 | http |", "| 64 | adapter |", "http and adapter ingress"} {
		if !strings.Contains(md, s) {
			t.Errorf("throughput section lacks %q:\n%s", s, md)
		}
	}
}

func TestReportTextAndJSON(t *testing.T) {
	r := sampleReport()
	var b bytes.Buffer
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"== throughput", "== takeover", "== handover", "== scale", "== goals", "not met"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("text report lacks %q:\n%s", s, b.String())
		}
	}
	b.Reset()
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back bench.Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Throughput) != 3 || back.Throughput[2].Floor == nil || back.Takeover == nil || back.Takeover.P99 != 2*time.Second {
		t.Fatalf("JSON round trip lost data: %s", b.String())
	}
}

func TestWriteSVG(t *testing.T) {
	r := sampleReport()
	var b bytes.Buffer
	if err := bench.WriteSVG(&b, r.Throughput, "title <&>", "sub"); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(&b)
	lines, circles := 0, 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			switch se.Name.Local {
			case "polyline":
				lines++
			case "circle":
				circles++
			}
		}
	}
	// fleet and floor × p50, p90, p99; a marker per point plus one per legend entry.
	if lines != 6 || circles != 6*3+6 {
		t.Fatalf("%d polylines and %d circles, want 6 and 24", lines, circles)
	}
	if err := bench.WriteSVG(&b, nil, "", ""); err == nil {
		t.Fatal("an empty chart was drawn")
	}
}

func TestUpdateMarkdown(t *testing.T) {
	path := filepath.Join(t.TempDir(), "b.md")
	if err := os.WriteFile(path, []byte("# Benchmarks\n\nprose before\n\n<!-- BEGIN bench:throughput (old) -->\nold table\n<!-- END bench:throughput -->\n\nprose after\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := bench.UpdateMarkdown(path, map[string]string{"throughput": "new table\n", "takeover": "kills\n"}); err != nil {
		t.Fatal(err)
	}
	if err := bench.UpdateMarkdown(path, map[string]string{"takeover": "kills again\n"}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	s := string(b)
	for _, want := range []string{"prose before", "new table", "prose after", "kills again"} {
		if !strings.Contains(s, want) {
			t.Errorf("missing %q in:\n%s", want, s)
		}
	}
	for _, gone := range []string{"old table", "kills\n"} {
		if strings.Contains(s, gone) {
			t.Errorf("%q still there:\n%s", gone, s)
		}
	}
	if strings.Index(s, "new table") > strings.Index(s, "prose after") {
		t.Errorf("the throughput section moved:\n%s", s)
	}
	if n := strings.Count(s, "<!-- BEGIN bench:takeover"); n != 1 {
		t.Errorf("%d takeover sections", n)
	}
	secs := sampleReport().MarkdownSections("bench-latency.svg")
	for _, k := range []string{"machine", "throughput", "takeover", "handover", "scale"} {
		if secs[k] == "" {
			t.Errorf("no %s section", k)
		}
	}
	if !strings.Contains(secs["throughput"], "![") {
		t.Error("the throughput section does not show the chart")
	}
}

// TestEvaluateGoalsSweepSaturates: a sweep whose live heap stops growing
// between the two largest counts is flat.
func TestEvaluateGoalsSweepSaturates(t *testing.T) {
	pt := func(n int, live uint64) bench.ScalePoint {
		return bench.ScalePoint{Sessions: n, Fleet: bench.Result{P50: time.Millisecond, P99: time.Millisecond}, WorkerMem: 60 << 20, MemKind: "rss",
			Sweep: &bench.SweepResult{LiveGrowth: live}}
	}
	r := &bench.Report{Scenarios: []string{"scale"}, Scale: []bench.ScalePoint{pt(1000, 0), pt(100000, 55<<20), pt(1000000, 56<<20)}}
	r.EvaluateGoals()
	for _, g := range r.Goals {
		if strings.HasPrefix(g.Goal, "worker memory") && g.Status != "met" {
			t.Fatalf("%s: %s (%s)", g.Goal, g.Status, g.Measured)
		}
	}
}
