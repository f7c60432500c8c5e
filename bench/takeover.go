package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
)

// TakeoverOptions configure Takeover beyond Options.
type TakeoverOptions struct {
	// Kills is how many times a worker is killed. Defaults to 5.
	Kills int
	// LanesPerRound is how many lanes run a long turn in each round.
	// Defaults to twice the workers.
	LanesPerRound int
	// KillSpread spreads the kills: each comes a uniformly random time in
	// [0, KillSpread) after the round's turns started, so its phase against
	// the lease renewals and InProgress (every TTL/3) is uniform. Defaults
	// to the lease TTL; negative kills as soon as the turns run (the worst
	// phase: the deliveries' ack timers just started).
	KillSpread time.Duration
}

// TakeoverRound is one kill.
type TakeoverRound struct {
	// Victim is the id of the killed worker; Lanes how many of the round's
	// long turns it was running; KilledAfter how long after they started.
	Victim      string        `json:"victim"`
	Lanes       int           `json:"lanes"`
	KilledAfter time.Duration `json:"killed_after_ns"`
	// Resumed are, per lane, the times from the kill to the resumed turn's
	// first progress (its "start" event with attempt ≥ 2 on another worker).
	Resumed []time.Duration `json:"resumed_ns"`
}

// TakeoverResult is what Takeover measured.
type TakeoverResult struct {
	Workers  int           `json:"workers"`
	LeaseTTL time.Duration `json:"lease_ttl_ns"`
	Kills    int           `json:"kills"`
	// KillSpread is TakeoverOptions.KillSpread (negative: immediate kills).
	KillSpread time.Duration `json:"kill_spread_ns"`
	// Samples are every kill-to-resume time, sorted.
	Samples []time.Duration `json:"samples_ns"`
	P50     time.Duration   `json:"p50_ns"`
	P99     time.Duration   `json:"p99_ns"`
	Min     time.Duration   `json:"min_ns"`
	Max     time.Duration   `json:"max_ns"`
	Mean    time.Duration   `json:"mean_ns"`
	// LivenessTTL is the workers' liveness lease TTL (the default: the
	// bench does not set it).
	LivenessTTL time.Duration `json:"liveness_ttl_ns"`
	// Goal is GoalTakeoverP99.
	Goal    time.Duration   `json:"goal_ns"`
	Rounds  []TakeoverRound `json:"rounds"`
	LoadAvg string          `json:"load_avg,omitempty"`
	Elapsed time.Duration   `json:"elapsed_ns"`
}

// Takeover measures recovery after a crash: Options.Workers worker processes
// (default 3) of Options.WorkerBinary on an embedded server run long turns
// (the echo agent's !sleep) on several lanes; each round, a random moment
// within TakeoverOptions.KillSpread after they started, kill -9s the worker
// running the most of them and times, for each of its lanes, the kill to the
// resumed turn's first progress: the TurnEvent "start" with attempt ≥ 2 that
// another worker publishes on <prefix>.ev.turn.<lane>, received on a core
// subscription. Then the killed worker is started again, the round's lanes
// are stopped (/stop), and the next round uses fresh lanes. The lease TTL is
// Options.LeaseTTL (default 15s, the fleet's).
func Takeover(ctx context.Context, opts Options, to TakeoverOptions) (TakeoverResult, error) {
	if opts.Workers <= 0 {
		opts.Workers = 3
	}
	o, err := opts.withDefaults()
	if err != nil {
		return TakeoverResult{}, err
	}
	if o.NATSURL != "" {
		return TakeoverResult{}, errors.New("bench: takeover runs against its own embedded server (it kills workers)")
	}
	if o.WorkerBinary == "" {
		return TakeoverResult{}, errors.New("bench: takeover needs the agentfleet binary (Options.WorkerBinary)")
	}
	if o.Workers < 2 {
		return TakeoverResult{}, errors.New("bench: takeover needs at least 2 workers")
	}
	if to.Kills <= 0 {
		to.Kills = 5
	}
	if to.LanesPerRound <= 0 {
		to.LanesPerRound = 2 * o.Workers
	}
	if to.KillSpread == 0 {
		to.KillSpread = o.LeaseTTL
	}
	begin := time.Now()
	e, err := startEnv(o, "takeover", true)
	if err != nil {
		return TakeoverResult{}, err
	}
	defer e.close()
	names := e.names
	nc, js, err := e.connect("bench-takeover", false)
	if err != nil {
		return TakeoverResult{}, err
	}
	res, err := e.provision(ctx, js)
	if err != nil {
		return TakeoverResult{}, err
	}
	isrv, err := ingress.New(js, res, ingress.Config{Names: names, KeyOptions: session.DefaultKeyOptions(), Logger: o.Logger})
	if err != nil {
		return TakeoverResult{}, fmt.Errorf("bench: %w", err)
	}
	base, closeHTTP, err := serveHTTP(isrv.Handler())
	if err != nil {
		return TakeoverResult{}, err
	}
	defer closeHTTP()
	client := &http.Client{Timeout: 30 * time.Second}
	evs, err := watchTurnEvents(nc, names)
	if err != nil {
		return TakeoverResult{}, err
	}
	fleet, err := startProcFleet(ctx, e.dir, e.url, res, o, o.Workers, "tk", nil)
	if err != nil {
		return TakeoverResult{}, err
	}
	defer fleet.killAll()

	out := TakeoverResult{Workers: o.Workers, LeaseTTL: o.LeaseTTL, Kills: to.Kills, KillSpread: to.KillSpread, LivenessTTL: broker.DefaultLivenessTTL, Goal: GoalTakeoverP99, LoadAvg: loadAvg()}
	var round atomic.Int64
	var resumed atomic.Int64
	stopProgress := startProgress(o, func() Progress {
		return Progress{Scenario: "takeover", Phase: fmt.Sprintf("kill %d/%d", round.Load()+1, to.Kills), Turns: resumed.Load(),
			Detail: fmt.Sprintf("%d turns resumed so far", resumed.Load())}
	})
	defer stopProgress()

	resumeTimeout := 3*o.LeaseTTL + 30*time.Second
	for r := range to.Kills {
		round.Store(int64(r))
		lanes := make([]laneID, to.LanesPerRound)
		owner := make([]string, len(lanes))
		for i := range lanes {
			lanes[i] = namedLaneID(names, fmt.Sprintf("takeover-%s-r%d-%d", o.RunID, r, i), i)
			text := fmt.Sprintf("takeover round %d lane %d\n!sleep 1h", r, i)
			if _, err := postText(ctx, client, base, lanes[i], "1", text); err != nil {
				return out, fmt.Errorf("bench: takeover: %w", err)
			}
		}
		var started time.Time
		for i, l := range lanes {
			ev, err := evs.waitFor(ctx, 60*time.Second, "start of the long turn of "+l.chatID, func(ev turnEvent) bool {
				return ev.Lane == l.lane && ev.Type == "start"
			})
			if err != nil {
				return out, fmt.Errorf("bench: takeover: %w", err)
			}
			owner[i] = ev.Owner
			started = ev.at
		}
		if to.KillSpread > 0 {
			t := time.NewTimer(rand.N(to.KillSpread))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return out, context.Cause(ctx)
			}
		}
		// The victim: the worker running the most of this round's turns
		// (ties go round-robin).
		count := map[*procWorker]int{}
		for _, ow := range owner {
			if p := fleet.byOwner(ow); p != nil {
				count[p]++
			}
		}
		var victim *procWorker
		for k := range fleet.procs {
			p := fleet.procs[(r+k)%len(fleet.procs)]
			if victim == nil || count[p] > count[victim] {
				victim = p
			}
		}
		if count[victim] == 0 {
			return out, errors.New("bench: takeover: no worker runs any of the long turns")
		}
		victimOwners := map[string]bool{}
		for _, ow := range owner {
			if fleet.byOwner(ow) == victim {
				victimOwners[ow] = true
			}
		}
		killedAt := time.Now()
		rec := TakeoverRound{Victim: victim.id, Lanes: count[victim], KilledAfter: killedAt.Sub(started)}
		if err := victim.signal(syscall.SIGKILL); err != nil {
			return out, err
		}
		if _, err := victim.wait(30 * time.Second); err != nil {
			return out, err
		}
		for i, l := range lanes {
			if !victimOwners[owner[i]] {
				continue
			}
			ev, err := evs.waitFor(ctx, resumeTimeout, "resumed start of "+l.chatID, func(ev turnEvent) bool {
				return ev.Lane == l.lane && ev.Type == "start" && ev.Attempt >= 2 && !victimOwners[ev.Owner] && ev.at.After(killedAt)
			})
			if err != nil {
				return out, fmt.Errorf("bench: takeover round %d (killed %s): %w", r+1, victim.id, err)
			}
			rec.Resumed = append(rec.Resumed, ev.at.Sub(killedAt))
			resumed.Add(1)
		}
		out.Rounds = append(out.Rounds, rec)
		out.Samples = append(out.Samples, rec.Resumed...)
		// Back to full strength, and the round's turns stopped.
		if err := victim.start(); err != nil {
			return out, err
		}
		if err := waitRegistered(ctx, res.Workers, victim, 30*time.Second); err != nil {
			return out, fmt.Errorf("bench: %w", err)
		}
		stopAt := time.Now()
		for _, l := range lanes {
			if _, err := postText(ctx, client, base, l, "2", "/stop"); err != nil {
				return out, fmt.Errorf("bench: takeover: /stop: %w", err)
			}
		}
		for _, l := range lanes {
			// Best effort: the next round does not depend on it.
			_, _ = evs.waitFor(ctx, 15*time.Second, "end of "+l.chatID, func(ev turnEvent) bool {
				return ev.Lane == l.lane && ev.Type == "end" && ev.at.After(stopAt)
			})
		}
	}
	stopProgress()
	if err := fleet.stop(); err != nil {
		return out, fmt.Errorf("bench: takeover: %w", err)
	}
	slices.Sort(out.Samples)
	if n := len(out.Samples); n > 0 {
		out.P50 = percentile(out.Samples, 0.50)
		out.P99 = percentile(out.Samples, 0.99)
		out.Min, out.Max = out.Samples[0], out.Samples[n-1]
		var sum time.Duration
		for _, s := range out.Samples {
			sum += s
		}
		out.Mean = sum / time.Duration(n)
	}
	out.Elapsed = time.Since(begin)
	return out, nil
}
