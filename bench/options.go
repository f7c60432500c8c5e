package bench

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/broker"
)

// Ingress modes of the fleet scenario.
const (
	// IngressHTTP posts every message to POST /v1/messages of the real HTTP
	// adapter, served on a loopback listener.
	IngressHTTP = "http"
	// IngressPublish publishes into the inbox the way the HTTP adapter does
	// (msgids lookup, publish with Msg-Id), without HTTP, from a copy of
	// that path in the bench.
	IngressPublish = "publish"
	// IngressAdapter hands every message to the ingress in process, through
	// ingress.Publisher.Publish: the path the platform adapters (Telegram,
	// Slack, Discord, WhatsApp) take, the ingress's own validation, session
	// key, msgids lookup and publish included, without the HTTP hop.
	IngressAdapter = "adapter"
)

// Measurement points of a reply.
const (
	// UntilOutbox times a reply when the worker publishes it to
	// <prefix>.out.http.<lane>.
	UntilOutbox = "outbox"
	// UntilMailbox also runs the HTTP delivery consumer and times a reply when
	// it reaches the lane's mailbox <prefix>.box.http.<lane>.
	UntilMailbox = "mailbox"
)

// Options configure a scenario. The zero value gives the defaults.
type Options struct {
	// Lanes is the number of lanes, each with one message in flight.
	// Defaults to 1.
	Lanes int
	// Workers is the number of worker loops of the fleet, and the number of
	// consumer loops (each on its own connection) of the floor. Defaults to 2.
	Workers int
	// Duration is the measured window. Defaults to 3s.
	Duration time.Duration
	// WarmupTurns is how many turns every lane completes before the window
	// opens; the first turn of a fleet lane is cold (lease, entry, session,
	// transcript load). Defaults to 2.
	WarmupTurns int
	// Sync is the server's fsync policy: "default", "always" or a duration
	// (see broker.ParseSync). Defaults to "default".
	Sync string
	// DataDir is where the temporary server directory is made (and removed
	// afterwards). Defaults to the system temporary directory.
	DataDir string
	// TextSize is the length in bytes of each user message. Defaults to 100.
	TextSize int
	// ReplyTimeout fails the run when a reply takes longer. Defaults to 30s.
	ReplyTimeout time.Duration

	// LeaseTTL is the fleet's lane lease TTL. Defaults to 15s (the fleet's
	// default; renewals cost one publish per lane every TTL/3).
	LeaseTTL time.Duration
	// Linger is how long an idle fleet lane stays owned. Defaults to the
	// warm-up, the window and a minute together, so no lane is released
	// during the run and every measured turn meets a warm lane.
	Linger time.Duration
	// Ingress is IngressHTTP (default), IngressAdapter or IngressPublish.
	Ingress string
	// Until is UntilOutbox (default) or UntilMailbox.
	Until string
	// Verify checks, after the fleet stopped, that the outbox holds exactly
	// one reply per message sent and that every lane committed its last
	// message. Result.Verified reports it.
	Verify bool
	// CountOps taps every message on the server (a wildcard subscription on
	// its own connection) and classifies it, so Result.OpsPerTurn says what
	// one turn costs in NATS messages. The tap adds load: do not compare rates
	// measured with it.
	CountOps bool
	// Logger receives the fleet's logs. Defaults to discarding them.
	Logger *slog.Logger
	// TracerProvider traces the in-process fleet (ingress requests and
	// publishes, deliveries, turns, replies) as agentfleet does with the
	// OTEL_* variables set. Nil: tracing off, the default.
	TracerProvider trace.TracerProvider

	// NATSURL runs against a running NATS server instead of an embedded
	// one, over TCP. Throughput then also needs IngressURL and measures the
	// running fleet (its workers, its settings) without provisioning
	// anything; Floor provisions a fleet of its own under a temporary
	// prefix on that server and deletes it afterwards.
	NATSURL string
	// IngressURL is the base URL of the running fleet's HTTP ingress
	// (http://host:port), with NATSURL.
	IngressURL string
	// Prefix is the running fleet's prefix, with NATSURL. Defaults to
	// broker.DefaultPrefix.
	Prefix string
	// Replicas of the floor's streams and buckets on a running NATS.
	// Defaults to 1.
	Replicas int

	// WorkerBinary is the agentfleet binary; worker processes run it as
	// `worker --id ...` against the embedded server's client listener.
	// Takeover and Handover need it; Scale and Throughput (ProcessWorkers)
	// use it when set.
	WorkerBinary string
	// ProcessWorkers runs the fleet's workers as processes of WorkerBinary
	// (connected over TCP) instead of loops in this process; the floor it
	// is compared with then uses TCP connections too.
	ProcessWorkers bool

	// Progress, when set, is called about every ProgressEvery (default 1s)
	// while a scenario runs.
	Progress      func(Progress)
	ProgressEvery time.Duration

	// RunID names this run's lanes ("bench-<run id>-<n>"), so that runs
	// against a running fleet never collide. Defaults to a random id with
	// NATSURL, and to none on a fresh embedded server.
	RunID string

	// KeepData keeps the temporary server directory (and the worker
	// processes' logs in it) instead of removing it; its path is logged.
	KeepData bool
	// WorkerLogLevel is the worker processes' telemetry.log_level.
	// Defaults to info.
	WorkerLogLevel string

	// text, when set, makes the text of message n of lane i (it must hold
	// token(i, n)); the default is text(i, n, TextSize).
	text func(i, n int) string
}

// textOf makes the text of message n of lane i: o.text's, or the default.
func (o *Options) textOf(i, n int) string {
	if o.text != nil {
		return o.text(i, n)
	}
	return text(i, n, o.TextSize)
}

// Progress is what a running scenario reports.
type Progress struct {
	Scenario string
	// Phase is "warm-up", "measure", or a scenario's own step.
	Phase   string
	Elapsed time.Duration
	// Turns is the number of turns completed so far (warm-up included).
	Turns int64
	// Detail is an optional short note (the current kill, restart, ...).
	Detail string
}

func (o Options) withDefaults() (Options, error) {
	if o.Lanes <= 0 {
		o.Lanes = 1
	}
	if o.Workers <= 0 {
		o.Workers = 2
	}
	if o.Duration <= 0 {
		o.Duration = 3 * time.Second
	}
	if o.WarmupTurns <= 0 {
		o.WarmupTurns = 2
	}
	if o.Sync == "" {
		o.Sync = "default"
	}
	if _, _, err := broker.ParseSync(o.Sync); err != nil {
		return o, fmt.Errorf("bench: %w", err)
	}
	if o.TextSize <= 0 {
		o.TextSize = 100
	}
	if o.ReplyTimeout <= 0 {
		o.ReplyTimeout = 30 * time.Second
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = 15 * time.Second
	}
	if o.Linger <= 0 {
		// A generous allowance for the warm-up (cold first turns of many lanes
		// on a small machine) on top of the window.
		o.Linger = o.Duration + time.Minute + time.Duration(o.WarmupTurns)*10*time.Second
	}
	switch o.Ingress {
	case "":
		o.Ingress = IngressHTTP
	case IngressHTTP, IngressAdapter, IngressPublish:
	default:
		return o, fmt.Errorf("bench: ingress %q: want %q, %q or %q", o.Ingress, IngressHTTP, IngressAdapter, IngressPublish)
	}
	switch o.Until {
	case "":
		o.Until = UntilOutbox
	case UntilOutbox, UntilMailbox:
	default:
		return o, fmt.Errorf("bench: until %q: want %q or %q", o.Until, UntilOutbox, UntilMailbox)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Prefix == "" {
		o.Prefix = broker.DefaultPrefix
	}
	if _, err := broker.NewNames(o.Prefix); err != nil {
		return o, fmt.Errorf("bench: %w", err)
	}
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	if o.WorkerLogLevel == "" {
		o.WorkerLogLevel = "info"
	}
	if o.ProgressEvery <= 0 {
		o.ProgressEvery = time.Second
	}
	if o.NATSURL != "" && o.RunID == "" {
		o.RunID = randomID(4)
	}
	if o.NATSURL != "" && o.Ingress != IngressHTTP {
		// A running fleet's ingress is another process: only its HTTP API
		// is reachable.
		return o, fmt.Errorf("bench: ingress %q: a running fleet is driven through its HTTP ingress only", o.Ingress)
	}
	if o.ProcessWorkers && o.WorkerBinary == "" {
		return o, errors.New("bench: process workers need Options.WorkerBinary")
	}
	return o, nil
}

// randomID returns n random bytes in hex.
func randomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Result is what one scenario measured. Durations are in nanoseconds in
// JSON.
type Result struct {
	// Scenario is "floor" or "fleet".
	Scenario string `json:"scenario"`
	Lanes    int    `json:"lanes"`
	Workers  int    `json:"workers"`
	// Sync is the server's fsync policy.
	Sync       string `json:"sync"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	// Conn is how the scenario's clients reach NATS: "in-process" or "tcp".
	Conn string `json:"conn"`
	// LoadAvg is /proc/loadavg as the measurement began (empty elsewhere):
	// other processes on the machine skew every number here.
	LoadAvg string `json:"load_avg,omitempty"`

	// Window is the measured wall time; Turns the turns whose reply arrived
	// inside it; Rate is Turns per second.
	Window time.Duration `json:"window_ns"`
	Turns  int           `json:"turns"`
	Rate   float64       `json:"turns_per_s"`

	// Accept-to-reply latency: from the 202 (fleet) or the inbound PubAck
	// (floor) to the reply's arrival.
	P50  time.Duration `json:"p50_ns"`
	P90  time.Duration `json:"p90_ns"`
	P99  time.Duration `json:"p99_ns"`
	Max  time.Duration `json:"max_ns"`
	Mean time.Duration `json:"mean_ns"`
	// Send-to-reply latency: from the start of the POST (fleet) or of the
	// inbound publish (floor) to the reply's arrival.
	RoundTripP50 time.Duration `json:"send_to_reply_p50_ns"`
	RoundTripP99 time.Duration `json:"send_to_reply_p99_ns"`

	// CPUPerTurn is the CPU time (user and system) the whole process used
	// during the window, per turn. Unlike the rates it hardly depends on what
	// else runs on the machine. With worker processes it covers this process
	// only (server, ingress, clients), not the workers.
	CPUPerTurn time.Duration `json:"cpu_per_turn_ns"`
	// AllocsPerTurn and BytesPerTurn are the heap allocations of the whole
	// process (server, clients and fleet) during the window, per turn.
	AllocsPerTurn float64 `json:"allocs_per_turn"`
	BytesPerTurn  float64 `json:"bytes_per_turn"`
	// ClientMsgsPerTurn counts the messages the scenario's own connections
	// sent and received during the window, per turn (requests, replies,
	// acks, deliveries, hints).
	ClientMsgsOutPerTurn float64 `json:"client_msgs_out_per_turn"`
	ClientMsgsInPerTurn  float64 `json:"client_msgs_in_per_turn"`
	// OpsPerTurn classifies every message the server routed during the
	// window, per turn (only with Options.CountOps).
	OpsPerTurn map[string]float64 `json:"ops_per_turn,omitempty"`

	// LaneTurnsMin and LaneTurnsMax are the fewest and the most turns one
	// lane completed inside the window: a lane stuck behind a stall shows
	// here long before it moves a percentile.
	LaneTurnsMin int `json:"lane_turns_min"`
	LaneTurnsMax int `json:"lane_turns_max"`

	// Strays are replies that matched no message in flight (duplicates seen
	// by the core subscription, notices).
	Strays int64 `json:"strays"`
	// Republished are the strays the verify found to be second publishes
	// of a reply the lane had already taken, which the outbox refused as
	// duplicates (its Msg-Id): no platform sees them.
	Republished int64 `json:"republished"`

	// Fleet settings and counters.
	Ingress  string        `json:"ingress,omitempty"`
	Until    string        `json:"until,omitempty"`
	LeaseTTL time.Duration `json:"lease_ttl_ns,omitempty"`
	Linger   time.Duration `json:"linger_ns,omitempty"`
	// Takeovers counts lane acquisitions during the window: zero means every
	// measured turn met a lane already owned (warm). -1 when unknown (a
	// running fleet, or worker processes).
	Takeovers   int64 `json:"takeovers"`
	Redelivered int64 `json:"redelivered"`
	// Verified is true when Options.Verify ran and found one reply per
	// message and every lane committed.
	Verified bool `json:"verified"`
	// Remote is true when the fleet measured was a running one;
	// WorkerProcesses when its workers ran as processes of their own. In both
	// cases CPUPerTurn and the allocations cover this process only.
	Remote          bool `json:"remote,omitempty"`
	WorkerProcesses bool `json:"worker_processes,omitempty"`

	// Floor, when set, is the floor measured in the same run, and the ratios
	// are fleet/floor: RatioRate of the rates, RatioP50 of the p50 latencies.
	Floor     *Result `json:"floor,omitempty"`
	RatioRate float64 `json:"ratio_rate,omitempty"`
	RatioP50  float64 `json:"ratio_p50,omitempty"`
	// RatioRoundTripP50 is the ratio of the send-to-reply p50 latencies.
	RatioRoundTripP50 float64 `json:"ratio_send_to_reply_p50,omitempty"`
	// RatioCPU is the ratio of the CPU time per turn.
	RatioCPU float64 `json:"ratio_cpu,omitempty"`
}

// WithFloor returns r with floor attached and the fleet/floor ratios set.
func (r Result) WithFloor(floor Result) Result {
	f := floor
	r.Floor = &f
	if floor.Rate > 0 {
		r.RatioRate = r.Rate / floor.Rate
	}
	if floor.P50 > 0 {
		r.RatioP50 = float64(r.P50) / float64(floor.P50)
	}
	if floor.CPUPerTurn > 0 && !r.Remote && !r.WorkerProcesses {
		r.RatioCPU = float64(r.CPUPerTurn) / float64(floor.CPUPerTurn)
	}
	if floor.RoundTripP50 > 0 {
		r.RatioRoundTripP50 = float64(r.RoundTripP50) / float64(floor.RoundTripP50)
	}
	return r
}

// ms renders a duration in milliseconds with three decimals.
func ms(d time.Duration) string { return fmt.Sprintf("%.3fms", float64(d)/1e6) }

// String is a one-line summary.
func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s lanes=%d workers=%d sync=%s: %d turns in %s = %.0f turns/s, p50 %s p90 %s p99 %s max %s (send-to-reply p50 %s)",
		r.Scenario, r.Lanes, r.Workers, r.Sync, r.Turns, r.Window.Round(time.Millisecond), r.Rate,
		ms(r.P50), ms(r.P90), ms(r.P99), ms(r.Max), ms(r.RoundTripP50))
	if r.CPUPerTurn > 0 {
		fmt.Fprintf(&b, ", cpu %.0fµs/turn", float64(r.CPUPerTurn)/1e3)
	}
	if r.Floor != nil {
		fmt.Fprintf(&b, "; floor %.0f turns/s p50 %s; ratio rate %.2f p50 %.2f send-to-reply p50 %.2f cpu %.2f",
			r.Floor.Rate, ms(r.Floor.P50), r.RatioRate, r.RatioP50, r.RatioRoundTripP50, r.RatioCPU)
	}
	return b.String()
}

// WriteTable writes fleet results with their floors (see Compare) as the
// Markdown table of docs/benchmarks.md.
func WriteTable(w io.Writer, rs []Result) error {
	const head = "| lanes | sync | fleet turns/s | fleet p50 | fleet p99 | fleet send-to-reply p50 | fleet CPU/turn | " +
		"floor turns/s | floor p50 | floor p99 | floor send-to-reply p50 | floor CPU/turn | " +
		"rate fleet/floor | p50 fleet/floor | send-to-reply p50 fleet/floor | CPU fleet/floor |\n" +
		"|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
	if _, err := io.WriteString(w, head); err != nil {
		return err
	}
	for _, r := range rs {
		if r.Floor == nil {
			return errors.New("bench: WriteTable needs results with a floor (use Compare)")
		}
		f := r.Floor
		if _, err := fmt.Fprintf(w, "| %d | %s | %.0f | %s | %s | %s | %s | %.0f | %s | %s | %s | %s | %.2f | %.2f | %.2f | %.2f |\n",
			r.Lanes, r.Sync, r.Rate, ms(r.P50), ms(r.P99), ms(r.RoundTripP50), us(r.CPUPerTurn),
			f.Rate, ms(f.P50), ms(f.P99), ms(f.RoundTripP50), us(f.CPUPerTurn),
			r.RatioRate, r.RatioP50, r.RatioRoundTripP50, r.RatioCPU); err != nil {
			return err
		}
	}
	return nil
}

// us renders a duration in microseconds.
func us(d time.Duration) string { return fmt.Sprintf("%.0fµs", float64(d)/1e3) }

func procs() int { return runtime.GOMAXPROCS(0) }

// loadAvg reads /proc/loadavg, or "" where there is none.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
