package bench_test

import (
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bench"
)

// Flags of BenchmarkTurns, passed after the package:
//
//	go test -run '^$' -bench BenchmarkTurns -benchtime 1x ./bench -turns.lanes 1,8,64,512 -turns.sync always
var (
	flagLanes    = flag.String("turns.lanes", "1,8,64", "comma-separated lane counts of BenchmarkTurns")
	flagSync     = flag.String("turns.sync", "default", `server fsync policy: "default", "always" or a duration`)
	flagDuration = flag.Duration("turns.duration", 3*time.Second, "measured window of each scenario")
	flagWorkers  = flag.Int("turns.workers", 2, "worker loops (fleet) and consumer loops (floor)")
	flagOnly     = flag.String("turns.only", "", `"floor" or "fleet" runs only that scenario (for profiling)`)
	flagIngress  = flag.String("turns.ingress", bench.IngressHTTP, `fleet ingress: "http", "adapter" or "publish"`)
	flagUntil    = flag.String("turns.until", bench.UntilOutbox, `reply measurement point: "outbox" or "mailbox"`)
	flagOps      = flag.Bool("turns.ops", false, "count NATS messages per turn by kind (adds load; rates are not comparable)")
)

func lanesList(b *testing.B) []int {
	var out []int
	for _, f := range strings.Split(*flagLanes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("-turns.lanes %q: want positive integers separated by commas", *flagLanes)
		}
		out = append(out, n)
	}
	return out
}

// BenchmarkTurns measures, for each lane count, the raw JetStream floor and
// then the fleet, in the same run, and reports both with their ratios. Each
// iteration runs both scenarios once (floor, fleet, floor, fleet, ...); with
// several iterations (-benchtime 3x) every metric is the median over them,
// which tames the noise of a shared machine. A benchtime given as a duration
// of a few seconds gives one iteration: one lasts longer than that.
func BenchmarkTurns(b *testing.B) {
	for _, lanes := range lanesList(b) {
		b.Run(fmt.Sprintf("lanes=%d", lanes), func(b *testing.B) {
			opts := bench.Options{
				Lanes: lanes, Workers: *flagWorkers, Duration: *flagDuration, Sync: *flagSync,
				Ingress: *flagIngress, Until: *flagUntil, CountOps: *flagOps,
			}
			var floors, fleets []bench.Result
			for b.Loop() {
				if *flagOnly != "fleet" {
					floor, err := bench.Floor(b.Context(), opts)
					if err != nil {
						b.Fatal(err)
					}
					b.Log(floor)
					logDetails(b, floor)
					floors = append(floors, floor)
				}
				if *flagOnly != "floor" {
					fleet, err := bench.Throughput(b.Context(), opts)
					if err != nil {
						b.Fatal(err)
					}
					if len(floors) > 0 {
						fleet = fleet.WithFloor(floors[len(floors)-1])
					}
					b.Log(fleet)
					logDetails(b, fleet)
					fleets = append(fleets, fleet)
				}
			}
			if len(floors) > 0 {
				b.ReportMetric(median(floors, func(r bench.Result) float64 { return r.Rate }), "floor_turns/s")
				b.ReportMetric(median(floors, func(r bench.Result) float64 { return msf(r.P50) }), "floor_p50_ms")
				b.ReportMetric(median(floors, func(r bench.Result) float64 { return msf(r.P99) }), "floor_p99_ms")
				b.ReportMetric(median(floors, func(r bench.Result) float64 { return msf(r.RoundTripP50) }), "floor_rt_p50_ms")
				b.ReportMetric(median(floors, func(r bench.Result) float64 { return float64(r.CPUPerTurn) / 1e3 }), "floor_cpu_us/turn")
			}
			if len(fleets) > 0 {
				b.ReportMetric(median(fleets, func(r bench.Result) float64 { return r.Rate }), "turns/s")
				b.ReportMetric(median(fleets, func(r bench.Result) float64 { return msf(r.P50) }), "p50_ms")
				b.ReportMetric(median(fleets, func(r bench.Result) float64 { return msf(r.P99) }), "p99_ms")
				b.ReportMetric(median(fleets, func(r bench.Result) float64 { return msf(r.RoundTripP50) }), "rt_p50_ms")
				b.ReportMetric(median(fleets, func(r bench.Result) float64 { return float64(r.CPUPerTurn) / 1e3 }), "cpu_us/turn")
				b.ReportMetric(median(fleets, func(r bench.Result) float64 { return 1e9 / r.Rate }), "ns/op")
			} else {
				b.ReportMetric(median(floors, func(r bench.Result) float64 { return 1e9 / r.Rate }), "ns/op")
			}
			if len(floors) > 0 && len(fleets) > 0 {
				b.ReportMetric(median(fleets, func(r bench.Result) float64 { return r.RatioRate }), "ratio_rate")
				b.ReportMetric(median(fleets, func(r bench.Result) float64 { return r.RatioP50 }), "ratio_p50")
				b.ReportMetric(median(fleets, func(r bench.Result) float64 { return r.RatioRoundTripP50 }), "ratio_rt_p50")
				b.ReportMetric(median(fleets, func(r bench.Result) float64 { return r.RatioCPU }), "ratio_cpu")
			}
		})
	}
}

// median returns the median of f over rs.
func median(rs []bench.Result, f func(bench.Result) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func logDetails(b *testing.B, r bench.Result) {
	b.Helper()
	b.Logf("%s: load average %s, turns per lane %d..%d, allocs/turn %.0f, bytes/turn %.0f, client msgs/turn out %.1f in %.1f, strays %d, takeovers in window %d, redelivered %d",
		r.Scenario, r.LoadAvg, r.LaneTurnsMin, r.LaneTurnsMax, r.AllocsPerTurn, r.BytesPerTurn, r.ClientMsgsOutPerTurn, r.ClientMsgsInPerTurn, r.Strays, r.Takeovers, r.Redelivered)
	if r.OpsPerTurn != nil {
		b.Logf("%s: NATS messages per turn:\n%s", r.Scenario, bench.FormatOps(r.OpsPerTurn))
	}
}

func msf(d time.Duration) float64 { return float64(d) / 1e6 }

// TestThroughputSmoke runs a tiny fleet scenario through the HTTP ingress
// and through the in-process adapter path, and checks only correctness:
// every message got its reply, exactly one reply per message is in the
// outbox, and every lane committed its last message.
func TestThroughputSmoke(t *testing.T) {
	for _, mode := range []string{bench.IngressHTTP, bench.IngressAdapter} {
		t.Run(mode, func(t *testing.T) {
			r, err := bench.Throughput(t.Context(), bench.Options{
				Lanes: 4, Workers: 2, Duration: 2 * time.Second, WarmupTurns: 1, Verify: true,
				ReplyTimeout: 20 * time.Second, Ingress: mode,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Log(r)
			if r.Ingress != mode {
				t.Fatalf("ingress %q, want %q", r.Ingress, mode)
			}
			if !r.Verified {
				t.Fatal("the run was not verified")
			}
			if r.Turns == 0 {
				t.Fatal("no turn completed inside the window")
			}
			if r.Strays != 0 {
				t.Fatalf("%d stray replies", r.Strays)
			}
		})
	}
}

// TestFloorSmoke runs a tiny floor scenario: every message got its reply.
func TestFloorSmoke(t *testing.T) {
	r, err := bench.Floor(t.Context(), bench.Options{Lanes: 4, Workers: 2, Duration: 2 * time.Second, ReplyTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if r.Turns == 0 || r.Strays != 0 {
		t.Fatalf("turns %d strays %d", r.Turns, r.Strays)
	}
}

func TestWriteTable(t *testing.T) {
	floor := bench.Result{Scenario: "floor", Lanes: 8, Sync: "default", Rate: 2000, P50: 2 * time.Millisecond,
		P99: 10 * time.Millisecond, RoundTripP50: 3 * time.Millisecond, CPUPerTurn: 500 * time.Microsecond}
	fleet := bench.Result{Scenario: "fleet", Lanes: 8, Sync: "default", Rate: 1000, P50: 4 * time.Millisecond,
		P99: 20 * time.Millisecond, RoundTripP50: 6 * time.Millisecond, CPUPerTurn: 1500 * time.Microsecond}.WithFloor(floor)
	if fleet.RatioRate != 0.5 || fleet.RatioP50 != 2 || fleet.RatioRoundTripP50 != 2 || fleet.RatioCPU != 3 {
		t.Fatalf("ratios rate %v p50 %v send-to-reply %v cpu %v", fleet.RatioRate, fleet.RatioP50, fleet.RatioRoundTripP50, fleet.RatioCPU)
	}
	var b strings.Builder
	if err := bench.WriteTable(&b, []bench.Result{fleet}); err != nil {
		t.Fatal(err)
	}
	want := "| 8 | default | 1000 | 4.000ms | 20.000ms | 6.000ms | 1500µs | 2000 | 2.000ms | 10.000ms | 3.000ms | 500µs | 0.50 | 2.00 | 2.00 | 3.00 |\n"
	if lines := strings.SplitAfter(b.String(), "\n"); len(lines) < 3 || lines[2] != want {
		t.Fatalf("table:\n%s\nwant row:\n%s", b.String(), want)
	}
	if err := bench.WriteTable(&b, []bench.Result{floor}); err == nil {
		t.Fatal("a result without a floor was accepted")
	}
}

// TestScaleSmoke fills the store with a few thousand entries, measures a
// short in-process fleet on fresh lanes and times one sweep.
func TestScaleSmoke(t *testing.T) {
	ps, err := bench.Scale(t.Context(), bench.Options{Lanes: 2, Duration: 2 * time.Second, WarmupTurns: 1, DataDir: t.TempDir()},
		bench.ScaleOptions{Sessions: []int{2000}, Sweep: true})
	if err != nil {
		t.Fatal(err)
	}
	p := ps[0]
	t.Logf("%+v sweep %+v", p, p.Sweep)
	if p.Sessions != 2000 || p.Fleet.Turns == 0 || p.WorkerMem == 0 || p.Sweep == nil {
		t.Fatalf("scale point %+v", p)
	}
}
