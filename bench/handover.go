package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
)

// HandoverOptions configure Handover beyond Options.
type HandoverOptions struct {
	// TurnSleep is the echo agent's delay in every turn (!sleep), so that
	// turns are in flight when a worker is stopped. Defaults to 200ms.
	TurnSleep time.Duration
	// Settle is the steady load before each restart and after the last.
	// Defaults to 3s.
	Settle time.Duration
	// DrainTimeout is the workers' agent.restart_drain_timeout; zero keeps
	// the fleet's default (1m).
	DrainTimeout time.Duration
}

// Restart is one worker's restart in a rolling restart.
type Restart struct {
	Worker string `json:"worker"`
	// Exited is the time from SIGTERM to the process's exit (it drains);
	// Back the time from SIGTERM to the new incarnation's registration.
	Exited time.Duration `json:"exited_ns"`
	Back   time.Duration `json:"back_ns"`
	// ExitCode is the exit status of the stopped incarnation.
	ExitCode int `json:"exit_code"`
}

// LatencyStats summarize accept-to-reply latencies.
type LatencyStats struct {
	N   int           `json:"n"`
	P50 time.Duration `json:"p50_ns"`
	P90 time.Duration `json:"p90_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
}

func latencyStats(v []time.Duration) LatencyStats {
	if len(v) == 0 {
		return LatencyStats{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return LatencyStats{N: len(s), P50: percentile(s, 0.5), P90: percentile(s, 0.9), P99: percentile(s, 0.99), Max: s[len(s)-1]}
}

// HandoverResult is what Handover measured.
type HandoverResult struct {
	Workers   int           `json:"workers"`
	Lanes     int           `json:"lanes"`
	TurnSleep time.Duration `json:"turn_sleep_ns"`
	LeaseTTL  time.Duration `json:"lease_ttl_ns"`
	// DrainTimeout is the workers' drain timeout (0: the fleet's default).
	DrainTimeout time.Duration `json:"drain_timeout_ns"`
	Restarts     []Restart     `json:"restarts"`
	// Turns are the turns sent during the rolling restart; Messages every
	// message sent (warm-up included), each checked.
	Turns    int `json:"turns"`
	Messages int `json:"messages"`
	// HandedOver are the turns that ran on another worker because theirs
	// stopped: Resumed ones (attempt ≥ 2: cut by a drain and resumed) and
	// Moved ones (the lane's previous turn ran on a worker stopped since).
	// Drained are the turns that were running when their worker got SIGTERM
	// and finished there during its drain. Others are the rest.
	HandedOver LatencyStats `json:"handed_over"`
	Resumed    int          `json:"resumed"`
	Moved      int          `json:"moved"`
	Drained    LatencyStats `json:"drained"`
	Others     LatencyStats `json:"others"`
	// AddedP50 and AddedP99 are the handed-over turns' percentiles minus the
	// others'.
	AddedP50 time.Duration `json:"added_p50_ns"`
	AddedP99 time.Duration `json:"added_p99_ns"`
	// Lost and Duplicated count accepted messages whose user entry (in the
	// lane's transcript) or reply (in the outbox) is missing, or there more
	// than once; Problems says which.
	Lost       int           `json:"lost"`
	Duplicated int           `json:"duplicated"`
	Problems   []string      `json:"problems,omitempty"`
	LoadAvg    string        `json:"load_avg,omitempty"`
	Elapsed    time.Duration `json:"elapsed_ns"`
}

// Handover measures a rolling restart under load: Options.Workers worker
// processes (default 3, started with --restart) serve Options.Lanes lanes
// (default 16), each with one message in flight (closed loop, HTTP ingress,
// the echo agent sleeping TurnSleep per turn); once every lane is warm, each
// worker in turn gets SIGTERM, drains, exits, and is started again, with
// Settle of steady load between restarts. Turns are classified from the
// fleet's turn events (by the turn id of each reply) and their
// accept-to-reply latencies compared. Afterwards every lane is checked:
// each accepted message has exactly one user entry in the lane's transcript
// (transcript.Log Load + Effective), in inbox order, and exactly one reply in
// the outbox; the entry committed the last message with no turn in flight.
func Handover(ctx context.Context, opts Options, ho HandoverOptions) (HandoverResult, error) {
	if opts.Workers <= 0 {
		opts.Workers = 3
	}
	if opts.Lanes <= 0 {
		opts.Lanes = 16
	}
	if opts.ReplyTimeout <= 0 {
		opts.ReplyTimeout = 2 * time.Minute
	}
	o, err := opts.withDefaults()
	if err != nil {
		return HandoverResult{}, err
	}
	if o.NATSURL != "" {
		return HandoverResult{}, errors.New("bench: handover runs against its own embedded server (it restarts workers)")
	}
	if o.WorkerBinary == "" {
		return HandoverResult{}, errors.New("bench: handover needs the agentfleet binary (Options.WorkerBinary)")
	}
	if ho.TurnSleep <= 0 {
		ho.TurnSleep = 200 * time.Millisecond
	}
	if ho.Settle <= 0 {
		ho.Settle = 3 * time.Second
	}
	sleep := ho.TurnSleep
	o.text = func(i, n int) string { return text(i, n, o.TextSize) + "\n!sleep " + sleep.String() }
	begin := time.Now()

	e, err := startEnv(o, "handover", true)
	if err != nil {
		return HandoverResult{}, err
	}
	defer e.close()
	names := e.names
	nc, js, err := e.connect("bench-handover", false)
	if err != nil {
		return HandoverResult{}, err
	}
	res, err := e.provision(ctx, js)
	if err != nil {
		return HandoverResult{}, err
	}
	evs, err := watchTurnEvents(nc, names)
	if err != nil {
		return HandoverResult{}, err
	}
	ids := make([]laneID, o.Lanes)
	subjects := make([]string, o.Lanes)
	for i := range ids {
		ids[i] = newLaneID(names, o.RunID, i)
		subjects[i] = ids[i].outbox
	}
	d := newDriver(o, "handover", subjects)
	onc, _, err := e.connect("bench-handover-observer", true)
	if err != nil {
		return HandoverResult{}, err
	}
	if err := d.observe(onc, names.OutboxWildcard()); err != nil {
		return HandoverResult{}, err
	}
	isrv, err := ingress.New(js, res, ingress.Config{Names: names, KeyOptions: session.DefaultKeyOptions(), Logger: o.Logger})
	if err != nil {
		return HandoverResult{}, fmt.Errorf("bench: %w", err)
	}
	send, closeHTTP, err := httpSender(o, ids, isrv.Handler())
	if err != nil {
		return HandoverResult{}, err
	}
	defer closeHTTP()

	var extra []string
	if ho.DrainTimeout > 0 {
		extra = append(extra, "AGENTFLEET_AGENT_RESTART_DRAIN_TIMEOUT="+ho.DrainTimeout.String())
	}
	fleet, err := startProcFleet(ctx, e.dir, e.url, res, o, o.Workers, "ho", []string{"--restart"}, extra...)
	if err != nil {
		return HandoverResult{}, err
	}
	defer fleet.killAll()
	drainAllowance := 60*time.Second + o.LeaseTTL + 30*time.Second
	if ho.DrainTimeout > 0 {
		drainAllowance = ho.DrainTimeout + o.LeaseTTL + 30*time.Second
	}

	out := HandoverResult{Workers: o.Workers, Lanes: o.Lanes, TurnSleep: ho.TurnSleep, LeaseTTL: o.LeaseTTL, DrainTimeout: ho.DrainTimeout, LoadAvg: loadAvg()}
	type stopRec struct {
		owner string
		at    time.Time
	}
	var stops []stopRec
	var restarting atomic.Value
	restarting.Store("")
	window := func(ctx context.Context) error {
		pause := func(d time.Duration) error {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		for _, p := range fleet.procs {
			if err := pause(ho.Settle); err != nil {
				return err
			}
			restarting.Store(p.id)
			owner := p.ownerID()
			at := time.Now()
			stops = append(stops, stopRec{owner: owner, at: at})
			if err := p.signal(syscall.SIGTERM); err != nil {
				return err
			}
			st, err := p.wait(drainAllowance)
			if err != nil {
				return err
			}
			rec := Restart{Worker: p.id, Exited: time.Since(at), ExitCode: st.ExitCode()}
			if err := p.start(); err != nil {
				return err
			}
			if err := waitRegistered(ctx, res.Workers, p, 30*time.Second); err != nil {
				return err
			}
			rec.Back = time.Since(at)
			out.Restarts = append(out.Restarts, rec)
			restarting.Store("")
		}
		return pause(ho.Settle)
	}
	d.detail = func() string {
		if w := restarting.Load().(string); w != "" {
			return "restarting " + w
		}
		return ""
	}
	samples, _, err := d.run(ctx, send, hooks{window: window, keepLate: true})
	stopErr := fleet.stop()
	if err != nil {
		return out, fmt.Errorf("bench: handover: %w", err)
	}
	if stopErr != nil {
		return out, fmt.Errorf("bench: handover: %w", stopErr)
	}

	// Classify the turns.
	starts := map[string][]turnEvent{}
	for _, ev := range evs.all() {
		if ev.Type == "start" {
			starts[ev.TurnID] = append(starts[ev.TurnID], ev)
		}
	}
	stopOf := map[string]time.Time{}
	for _, s := range stops {
		stopOf[s.owner] = s.at
	}
	byLane := make([][]sample, o.Lanes)
	for _, s := range samples {
		byLane[s.lane] = append(byLane[s.lane], s)
	}
	var handed, drained, others []time.Duration
	out.Turns = len(samples)
	for _, ls := range byLane {
		slices.SortFunc(ls, func(a, b sample) int { return a.n - b.n })
		prevOwner := ""
		for _, s := range ls {
			ev := starts[s.turnID]
			if len(ev) == 0 {
				out.Problems = append(out.Problems, fmt.Sprintf("lane %d message %d: no start event for turn %q", s.lane, s.n, s.turnID))
				others = append(others, s.accept)
				continue
			}
			first, last := ev[0], ev[len(ev)-1]
			stoppedAt, prevStopped := stopOf[prevOwner]
			ownStop, ownStopped := stopOf[first.Owner]
			switch {
			case len(ev) > 1 || last.Attempt > 1:
				out.Resumed++
				handed = append(handed, s.accept)
			case prevOwner != "" && first.Owner != prevOwner && prevStopped && !first.at.Before(stoppedAt):
				out.Moved++
				handed = append(handed, s.accept)
			case ownStopped && first.at.Before(ownStop) && s.at.After(ownStop):
				drained = append(drained, s.accept)
			default:
				others = append(others, s.accept)
			}
			prevOwner = last.Owner
		}
	}
	out.HandedOver, out.Drained, out.Others = latencyStats(handed), latencyStats(drained), latencyStats(others)
	if out.HandedOver.N > 0 && out.Others.N > 0 {
		out.AddedP50 = out.HandedOver.P50 - out.Others.P50
		out.AddedP99 = out.HandedOver.P99 - out.Others.P99
	}

	// Nothing lost, nothing twice.
	for _, sent := range d.sent {
		out.Messages += sent
	}
	if err := checkLanes(ctx, js, res, names, ids, d, &out); err != nil {
		return out, err
	}
	out.Elapsed = time.Since(begin)
	return out, nil
}

// checkLanes verifies, for every lane, that each message the driver sent
// has exactly one user entry in the lane's transcript, in inbox order, and
// exactly one reply in the outbox, and that the entry committed the last
// one with no turn in flight.
func checkLanes(ctx context.Context, js jetstream.JetStream, res *broker.Resources, names broker.Names, ids []laneID, d *driver, out *HandoverResult) error {
	problem := func(f string, a ...any) {
		if len(out.Problems) < 50 {
			out.Problems = append(out.Problems, fmt.Sprintf(f, a...))
		}
	}
	replies, err := readSubjects(ctx, js, names.OutboxStream(), names.OutboxPlatformFilter(string(session.PlatformHTTP)))
	if err != nil {
		return fmt.Errorf("bench: read the outbox: %w", err)
	}
	store := kv.NewStore(res, nil)
	tx, err := transcript.New(js, names, nil)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	for i, l := range ids {
		seqs := d.seqs[i]
		if len(seqs) == 0 {
			continue
		}
		e, _, err := store.Get(ctx, l.lane)
		if err != nil {
			return fmt.Errorf("bench: lane %d: %w", i, err)
		}
		if e.CommittedSeq != seqs[len(seqs)-1] || e.Turn != nil {
			problem("lane %d: committed seq %d (turn in flight: %t), want %d", i, e.CommittedSeq, e.Turn != nil, seqs[len(seqs)-1])
		}
		entries, _, err := tx.Load(ctx, e.SessionID)
		if err != nil {
			return fmt.Errorf("bench: lane %d: load transcript %s: %w", i, e.SessionID, err)
		}
		users := map[uint64]int{}
		var last uint64
		for _, en := range transcript.Effective(entries) {
			if en.Role != transcript.RoleUser || en.InboxSeq == 0 {
				continue
			}
			users[en.InboxSeq]++
			if en.InboxSeq <= last {
				problem("lane %d: user entry of inbox seq %d after %d (out of order)", i, en.InboxSeq, last)
			}
			last = en.InboxSeq
		}
		want := map[uint64]bool{}
		for _, s := range seqs {
			want[s] = true
		}
		for s, c := range users {
			if !want[s] {
				problem("lane %d: user entry of inbox seq %d, which the bench never sent", i, s)
			}
			_ = c
		}
		got := replies[l.outbox]
		for n, s := range seqs {
			switch c := users[s]; {
			case c == 0:
				out.Lost++
				problem("lane %d message %d (inbox seq %d): no user entry in transcript %s", i, n, s, e.SessionID)
			case c > 1:
				out.Duplicated++
				problem("lane %d message %d (inbox seq %d): %d user entries", i, n, s, c)
			}
			tok := token(i, n)
			rc := 0
			for _, r := range got {
				if strings.Contains(r, tok) {
					rc++
				}
			}
			switch {
			case rc == 0:
				out.Lost++
				problem("lane %d message %d (inbox seq %d): no reply in the outbox", i, n, s)
			case rc > 1:
				out.Duplicated++
				problem("lane %d message %d (inbox seq %d): %d replies", i, n, s, rc)
			}
		}
		if len(got) != len(seqs) {
			problem("lane %d: %d replies in the outbox for %d messages", i, len(got), len(seqs))
		}
	}
	return nil
}

// readSubjects reads every message of stream under filter, by subject.
func readSubjects(ctx context.Context, js jetstream.JetStream, stream, filter string) (map[string][]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return nil, err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	left := info.NumPending
	for left > 0 {
		batch, err := cons.Fetch(int(min(left, 1000)), jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			return nil, err
		}
		n := 0
		for m := range batch.Messages() {
			out[m.Subject()] = append(out[m.Subject()], string(m.Data()))
			n++
		}
		if err := batch.Error(); err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, fmt.Errorf("%d messages left unread", left)
		}
		left -= uint64(n)
	}
	return out, nil
}
