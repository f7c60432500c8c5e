package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/worker"
)

// topWindow is how far back `fleetctl top` counts turns.
const topWindow = time.Minute

// turnSample is one ended turn.
type turnSample struct {
	at      time.Time
	latency time.Duration // accept (first message stored) to turn end; 0 if unknown
	failed  bool
}

// turnSampler keeps the turns that ended within the window.
type turnSampler struct {
	mu      sync.Mutex
	samples []turnSample
	dead    []time.Time // dead letters
}

func (s *turnSampler) add(ts turnSample) {
	s.mu.Lock()
	s.samples = append(s.samples, ts)
	s.mu.Unlock()
}

func (s *turnSampler) addDeadLetter(at time.Time) {
	s.mu.Lock()
	s.dead = append(s.dead, at)
	s.mu.Unlock()
}

// topStats are the turn figures of the window ending at now.
type topStats struct {
	Turns       int     `json:"turns"`
	TurnsPerSec float64 `json:"turns_per_sec"`
	Failures    int     `json:"failures"`
	DeadLetters int     `json:"dead_letters"`
	P50         string  `json:"accept_to_reply_p50"`
	P90         string  `json:"accept_to_reply_p90"`
	P99         string  `json:"accept_to_reply_p99"`
}

func (s *turnSampler) stats(now time.Time, window time.Duration) topStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	cut := now.Add(-window)
	s.samples = slices.DeleteFunc(s.samples, func(x turnSample) bool { return x.at.Before(cut) })
	s.dead = slices.DeleteFunc(s.dead, func(t time.Time) bool { return t.Before(cut) })
	st := topStats{Turns: len(s.samples), DeadLetters: len(s.dead), TurnsPerSec: float64(len(s.samples)) / window.Seconds()}
	var lat []time.Duration
	for _, x := range s.samples {
		if x.failed {
			st.Failures++
		}
		if x.latency > 0 {
			lat = append(lat, x.latency)
		}
	}
	slices.Sort(lat)
	pct := func(p float64) string {
		if len(lat) == 0 {
			return "-"
		}
		i := int(p*float64(len(lat))+0.5) - 1
		i = min(max(i, 0), len(lat)-1)
		return lat[i].Round(time.Millisecond).String()
	}
	st.P50, st.P90, st.P99 = pct(0.50), pct(0.90), pct(0.99)
	return st
}

// topWorker is one worker's line.
type topWorker struct {
	Owner        string `json:"owner"`
	State        string `json:"state"`
	Lanes        int    `json:"lanes_owned"`
	TurnsRunning int    `json:"turns_running"`
	Turns        int64  `json:"turns"`
}

// topSnapshot is what one frame of `fleetctl top` shows.
type topSnapshot struct {
	At time.Time `json:"at"`
	topStats
	// Backlog is what the workers consumer has not delivered yet, InFlight
	// what it delivered and awaits acks for.
	Backlog  uint64      `json:"backlog"`
	InFlight int         `json:"in_flight"`
	Workers  []topWorker `json:"workers"`
}

// follow feeds the sampler from the events stream, starting a window back,
// until ctx ends. It closes caughtUp once it has read every event stored
// when it started.
func (s *turnSampler) follow(ctx context.Context, cl *client, caughtUp chan<- struct{}) error {
	var once sync.Once
	ready := func() { once.Do(func() { close(caughtUp) }) }
	start := time.Now().Add(-topWindow)
	cons, err := cl.js.OrderedConsumer(ctx, cl.names.EventStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{cl.names.EventSubject("turn", ">"), cl.names.EventSubject("deadletter", ">")},
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy, OptStartTime: &start,
	})
	if err != nil {
		return err
	}
	if ci, err := cons.Info(ctx); err != nil {
		return err
	} else if ci.NumPending == 0 {
		ready()
	}
	it, err := cons.Messages()
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	turnPrefix := cl.names.Prefix() + ".ev.turn."
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return err
		}
		meta, merr := m.Metadata()
		if !strings.HasPrefix(m.Subject(), turnPrefix) {
			at := time.Now()
			if merr == nil {
				at = meta.Timestamp
			}
			s.addDeadLetter(at)
			ready()
			continue
		}
		var ev worker.TurnEvent
		if json.Unmarshal(m.Data(), &ev) != nil || ev.Type != "end" {
			if merr == nil && meta.NumPending == 0 {
				ready()
			}
			continue
		}
		ts := turnSample{at: ev.At, failed: ev.Status != "completed"}
		// Accepted when its first message was stored in the inbox.
		if raw, err := cl.res.Inboxes.ForLane(ev.Lane).Stream.GetMsg(ctx, ev.FirstSeq); err == nil && ev.FirstSeq > 0 {
			ts.latency = ev.At.Sub(raw.Time)
		}
		s.add(ts)
		if merr == nil && meta.NumPending == 0 {
			ready()
		}
	}
}

// collect reads one snapshot: the sampler's window, the workers consumer's
// backlog and the worker registry.
func collect(ctx context.Context, cl *client, s *turnSampler) (topSnapshot, error) {
	snap := topSnapshot{At: time.Now(), Workers: []topWorker{}}
	snap.topStats = s.stats(snap.At, topWindow)
	backlog, inFlight, err := broker.WorkersBacklog(ctx, cl.res.Inboxes, cl.names)
	if err != nil {
		return snap, err
	}
	snap.Backlog, snap.InFlight = backlog, int(inFlight)
	recs, err := worker.ListWorkers(ctx, cl.res.Workers)
	if err != nil {
		return snap, err
	}
	for _, r := range recs {
		owner := r.Owner
		if owner == "" {
			owner = r.ID
		}
		snap.Workers = append(snap.Workers, topWorker{Owner: owner, State: r.State, Lanes: r.LanesOwned, TurnsRunning: r.TurnsRunning, Turns: r.Turns})
	}
	return snap, nil
}

// renderTop draws one frame.
func renderTop(snap topSnapshot, err error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "fleetctl top  %s  (last %s; q quits)\n\n", snap.At.UTC().Format(time.RFC3339), topWindow)
	fmt.Fprintf(&b, "turns/s  %.2f   turns  %d   failures  %d   dead letters  %d\n", snap.TurnsPerSec, snap.Turns, snap.Failures, snap.DeadLetters)
	fmt.Fprintf(&b, "accept to reply  p50 %s   p90 %s   p99 %s\n", snap.P50, snap.P90, snap.P99)
	fmt.Fprintf(&b, "backlog  %d waiting, %d in flight\n\n", snap.Backlog, snap.InFlight)
	t := newTable("WORKER", "STATE", "LANES", "TURNS RUNNING", "TURNS")
	for _, w := range snap.Workers {
		t.row(w.Owner, w.State, w.Lanes, w.TurnsRunning, w.Turns)
	}
	var tb strings.Builder
	_ = t.print(&tb)
	b.WriteString(tb.String())
	if err != nil {
		fmt.Fprintf(&b, "\nerror: %v\n", err)
	}
	return b.String()
}

// topModel is the bubbletea model: a frame every interval until q.
type topModel struct {
	fetch    func() (topSnapshot, error)
	interval time.Duration
	snap     topSnapshot
	err      error
	frames   int
}

type snapMsg struct {
	snap topSnapshot
	err  error
}

type tickMsg struct{}

func (m topModel) fetchCmd() tea.Cmd {
	return func() tea.Msg {
		s, err := m.fetch()
		return snapMsg{s, err}
	}
}

func (m topModel) Init() tea.Cmd { return m.fetchCmd() }

func (m topModel) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.KeyMsg:
		switch msg.String() {
		case "q", "ctrl+c", "esc":
			return m, tea.Quit
		}
	case snapMsg:
		m.snap, m.err = msg.snap, msg.err
		m.frames++
		return m, tea.Tick(m.interval, func(time.Time) tea.Msg { return tickMsg{} })
	case tickMsg:
		return m, m.fetchCmd()
	}
	return m, nil
}

func (m topModel) View() string {
	if m.frames == 0 {
		return "fleetctl top: reading the fleet…\n"
	}
	return renderTop(m.snap, m.err)
}

func topCommand() *cli.Command {
	return &cli.Command{
		Name: "top",
		Usage: "a live view of the fleet: turns/s, accept-to-reply percentiles, backlog, failures and lanes per worker over the last minute; " +
			"redraws in place, q quits. With --json, one snapshot (once the last minute's events are read) as one JSON document",
		Flags: []cli.Flag{jsonFlag(),
			&cli.DurationFlag{Name: "interval", Value: time.Second, Usage: "redraw every `DUR`"},
		},
		Action: func(c *cli.Context) error {
			if c.Duration("interval") < 100*time.Millisecond {
				return fmt.Errorf("--interval %s: want at least 100ms", c.Duration("interval"))
			}
			cl, ctx, done, err := dialFor(c, true)
			if err != nil {
				return err
			}
			defer done()
			s := &turnSampler{}
			fctx, cancel := context.WithCancel(ctx)
			followed := make(chan error, 1)
			caughtUp := make(chan struct{})
			go func() { followed <- s.follow(fctx, cl, caughtUp) }()
			defer func() { cancel(); <-followed }()
			fetch := func() (topSnapshot, error) {
				qctx, qcancel := context.WithTimeout(ctx, c.Duration("timeout"))
				defer qcancel()
				return collect(qctx, cl, s)
			}
			if c.Bool("json") {
				// The snapshot counts the last minute's events: wait until
				// they are read (within --timeout).
				t := time.NewTimer(c.Duration("timeout"))
				defer t.Stop()
				select {
				case <-caughtUp:
				case err := <-followed:
					followed <- err
					if err != nil {
						return err
					}
				case <-t.C:
					return errors.New("top: the events stream was not read within --timeout")
				}
				snap, err := fetch()
				if err != nil {
					return err
				}
				return printJSON(c.App.Writer, snap)
			}
			p := tea.NewProgram(topModel{fetch: fetch, interval: c.Duration("interval")}, tea.WithContext(ctx), tea.WithAltScreen())
			_, err = p.Run()
			if errors.Is(err, tea.ErrProgramKilled) && ctx.Err() != nil {
				return nil
			}
			return err
		},
	}
}
