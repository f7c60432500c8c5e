package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
)

// arrival is a reply seen by the observer.
type arrival struct {
	at     time.Time
	data   []byte
	turnID string
	// subject and msgID (the Nats-Msg-Id header) say which stored message
	// the reply is: a stray is judged by them (see judgeStrays).
	subject, msgID string
}

// stray is a reply that matched no message in flight.
type stray struct {
	lane int // -1: a subject of no lane
	// n and seq are the lane's message in flight when it arrived.
	n              int
	seq            uint64
	subject, msgID string
	turnID         string
	text           string // the start of the reply
	// answered is true when the lane already took a reply with this Msg-Id
	// (the stray is a second publish of an answered reply).
	answered bool
}

func (s stray) String() string {
	if s.lane < 0 {
		return fmt.Sprintf("a reply on %s, a subject of no lane (Msg-Id %q, turn %q): %q", s.subject, s.msgID, s.turnID, s.text)
	}
	return fmt.Sprintf("lane %d, in flight message %d (inbox seq %d): a reply on %s with Msg-Id %q (turn %q, already answered with it: %t): %q",
		s.lane, s.n, s.seq, s.subject, s.msgID, s.turnID, s.answered, s.text)
}

// maxStrays bounds the strays the driver keeps the details of.
const maxStrays = 32

// sent is what a sendFunc reports about one message.
type sent struct {
	// start is when the send began, accepted when the system acknowledged
	// it (the 202, or the PubAck).
	start, accepted time.Time
	// token must appear in the reply (nil: any reply of the lane will do).
	token []byte
	// seq is the inbox sequence of the message.
	seq uint64
}

// sendFunc sends message n of lane i and returns once it is accepted.
type sendFunc func(ctx context.Context, lane, n int) (sent, error)

// sample is one measured turn.
type sample struct {
	accept, round time.Duration
	// at is the reply's arrival, accepted the message's acceptance.
	at, accepted time.Time
	lane, n      int
	seq          uint64
	// turnID is the reply's Fleet-Turn-Id header.
	turnID string
}

// driver runs the closed loop of every lane and collects replies from a core
// subscription: each lane has one message in flight, sends the next as soon
// as the reply arrives, and nothing polls.
type driver struct {
	o     Options
	label string // the scenario, for progress reports
	// detail, when set, adds a note to the progress reports.
	detail  func() string
	index   map[string]int // reply subject -> lane
	inbox   []chan arrival
	strays  atomic.Int64
	dropped atomic.Int64
	// strayMu guards strayList, the details of the first maxStrays strays.
	strayMu   sync.Mutex
	strayList []stray
	// answered are, per lane, the Msg-Ids of the replies it took.
	answered []map[string]struct{}
	// done counts completed turns (warm-up included), for progress reports.
	done atomic.Int64
	// Per lane, written by the lane's goroutine, read after run returns.
	sent    []int
	lastSeq []uint64
	// seqs are the inbox sequences of every message a lane sent, in order.
	seqs [][]uint64
	// The fewest and most turns one lane completed inside the window.
	minLane, maxLane int
}

func newDriver(o Options, label string, replySubjects []string) *driver {
	d := &driver{
		o:        o,
		label:    label,
		index:    make(map[string]int, len(replySubjects)),
		inbox:    make([]chan arrival, len(replySubjects)),
		sent:     make([]int, len(replySubjects)),
		lastSeq:  make([]uint64, len(replySubjects)),
		seqs:     make([][]uint64, len(replySubjects)),
		answered: make([]map[string]struct{}, len(replySubjects)),
	}
	for i, s := range replySubjects {
		d.index[s] = i
		d.answered[i] = make(map[string]struct{})
		d.inbox[i] = make(chan arrival, 64)
	}
	return d
}

// onReply is the observer's message handler: it timestamps the arrival and
// hands it to its lane.
func (d *driver) onReply(m *nats.Msg) {
	at := time.Now()
	var turnID, msgID string
	if m.Header != nil {
		turnID = m.Header.Get(broker.HdrTurnID)
		msgID = m.Header.Get(jetstream.MsgIDHeader)
	}
	i, ok := d.index[m.Subject]
	if !ok {
		d.addStray(stray{lane: -1, subject: m.Subject, msgID: msgID, turnID: turnID, text: head(m.Data)})
		return
	}
	select {
	case d.inbox[i] <- arrival{at: at, data: m.Data, turnID: turnID, subject: m.Subject, msgID: msgID}:
	default:
		d.dropped.Add(1)
	}
}

// addStray counts a stray and keeps its details.
func (d *driver) addStray(s stray) {
	d.strays.Add(1)
	d.strayMu.Lock()
	defer d.strayMu.Unlock()
	if len(d.strayList) < maxStrays {
		d.strayList = append(d.strayList, s)
	}
}

// head is the start of a reply, for an error message.
func head(data []byte) string {
	const n = 120
	if len(data) > n {
		return string(data[:n]) + "..."
	}
	return string(data)
}

// observe subscribes the driver to subject on nc (its own connection, so the
// timestamps do not queue behind the scenario's traffic).
func (d *driver) observe(nc *nats.Conn, subject string) error {
	sub, err := nc.Subscribe(subject, d.onReply)
	if err != nil {
		return fmt.Errorf("bench: observe %s: %w", subject, err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return err
	}
	return nc.Flush()
}

// turn sends one message and waits for its reply.
func (d *driver) turn(ctx context.Context, send sendFunc, timer *time.Timer, i, n int) (sample, error) {
	s, err := send(ctx, i, n)
	if err != nil {
		return sample{}, fmt.Errorf("lane %d message %d: %w", i, n, err)
	}
	d.sent[i]++
	d.lastSeq[i] = s.seq
	d.seqs[i] = append(d.seqs[i], s.seq)
	timer.Reset(d.o.ReplyTimeout)
	defer timer.Stop()
	for {
		select {
		case a := <-d.inbox[i]:
			if s.token != nil && !bytes.Contains(a.data, s.token) {
				_, answered := d.answered[i][a.msgID]
				d.addStray(stray{lane: i, n: n, seq: s.seq, subject: a.subject, msgID: a.msgID, turnID: a.turnID,
					text: head(a.data), answered: answered && a.msgID != ""})
				continue
			}
			if a.msgID != "" {
				d.answered[i][a.msgID] = struct{}{}
			}
			d.done.Add(1)
			return sample{accept: a.at.Sub(s.accepted), round: a.at.Sub(s.start), at: a.at, accepted: s.accepted,
				lane: i, n: n, seq: s.seq, turnID: a.turnID}, nil
		case <-timer.C:
			return sample{}, fmt.Errorf("lane %d message %d (inbox seq %d): no reply within %s", i, n, s.seq, d.o.ReplyTimeout)
		case <-ctx.Done():
			return sample{}, context.Cause(ctx)
		}
	}
}

// hooks run at the edges of the measured window.
type hooks struct {
	start func()
	end   func()
	// window, when set, is the measured window: it starts once every lane
	// is warm and the window ends when it returns (instead of after
	// Options.Duration). An error fails the run.
	window func(ctx context.Context) error
	// keepLate keeps the turns sent inside the window whose reply arrived
	// after it.
	keepLate bool
}

// run warms every lane up, then measures for the window. It returns the
// samples of the turns whose reply arrived inside the window.
func (d *driver) run(ctx context.Context, send sendFunc, h hooks) ([]sample, time.Duration, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	lanes := len(d.inbox)
	var (
		ready   sync.WaitGroup
		wg      sync.WaitGroup
		start   = make(chan struct{})
		stop    = make(chan struct{})
		results = make([][]sample, lanes)
		phase   atomic.Value
	)
	phase.Store("warm-up")
	stopProgress := startProgress(d.o, func() Progress {
		p := Progress{Scenario: d.label, Phase: phase.Load().(string), Turns: d.done.Load()}
		if d.detail != nil {
			p.Detail = d.detail()
		}
		return p
	})
	defer stopProgress()
	ready.Add(lanes)
	for i := range lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var once sync.Once
			markReady := func() { once.Do(ready.Done) }
			defer markReady()
			timer := time.NewTimer(time.Hour)
			timer.Stop()
			n := 0
			for ; n < d.o.WarmupTurns; n++ {
				if _, err := d.turn(ctx, send, timer, i, n); err != nil {
					cancel(fmt.Errorf("warm-up: %w", err))
					return
				}
			}
			markReady()
			select {
			case <-start:
			case <-ctx.Done():
				return
			}
			local := make([]sample, 0, 256)
			for ; ; n++ {
				select {
				case <-stop:
					results[i] = local
					return
				default:
				}
				s, err := d.turn(ctx, send, timer, i, n)
				if err != nil {
					cancel(err)
					return
				}
				local = append(local, s)
			}
		}()
	}
	ready.Wait()
	if ctx.Err() != nil {
		wg.Wait()
		return nil, 0, context.Cause(ctx)
	}
	if h.start != nil {
		h.start()
	}
	phase.Store("measure")
	begin := time.Now()
	close(start)
	if h.window != nil {
		if err := h.window(ctx); err != nil {
			cancel(err)
		}
	} else {
		t := time.NewTimer(d.o.Duration)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	end := time.Now()
	window := end.Sub(begin)
	close(stop)
	if h.end != nil {
		h.end()
	}
	phase.Store("finishing")
	wg.Wait()
	if ctx.Err() != nil {
		return nil, 0, context.Cause(ctx)
	}
	if n := d.dropped.Load(); n > 0 {
		return nil, 0, fmt.Errorf("bench: %d replies dropped by the observer", n)
	}
	var all []sample
	d.minLane, d.maxLane = -1, 0
	for _, r := range results {
		in := 0
		for _, s := range r {
			if !s.at.After(end) || h.keepLate {
				all = append(all, s)
			}
			if !s.at.After(end) {
				in++
			}
		}
		if d.minLane < 0 || in < d.minLane {
			d.minLane = in
		}
		d.maxLane = max(d.maxLane, in)
	}
	return all, window, nil
}

// restamp makes each sample's acceptance the moment the server stored its
// inbox message (the message's stream timestamp), the same moment for the
// fleet and the floor whatever acknowledges the send: the fleet's HTTP 202
// comes only after the ingress has also recorded the message id (the worker
// is already at work by then), the floor's PubAck as soon as the message is
// stored. The server must run on this machine (one clock): not for a remote
// fleet.
func restamp(ctx context.Context, inbox jetstream.Stream, samples []sample) error {
	const workers = 16
	var (
		wg      sync.WaitGroup
		next    atomic.Int64
		errOnce sync.Once
		first   error
	)
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(samples) || ctx.Err() != nil {
					return
				}
				s := &samples[i]
				m, err := inbox.GetMsg(ctx, s.seq)
				if err != nil {
					errOnce.Do(func() { first = fmt.Errorf("bench: the stored time of inbox seq %d: %w", s.seq, err) })
					return
				}
				s.accepted = m.Time
				s.accept = s.at.Sub(m.Time)
			}
		})
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// fill sets the rate and latency fields of r from the samples of a window.
func fill(r *Result, d *driver, samples []sample, window time.Duration) error {
	r.LaneTurnsMin, r.LaneTurnsMax = d.minLane, d.maxLane
	r.Strays = d.strays.Load()
	if len(samples) == 0 {
		return errors.New("bench: no turn completed inside the window")
	}
	r.Window = window
	r.Turns = len(samples)
	r.Rate = float64(len(samples)) / window.Seconds()
	acc := make([]time.Duration, len(samples))
	round := make([]time.Duration, len(samples))
	var sum time.Duration
	for i, s := range samples {
		acc[i], round[i] = s.accept, s.round
		sum += s.accept
	}
	slices.Sort(acc)
	slices.Sort(round)
	r.P50 = percentile(acc, 0.50)
	r.P90 = percentile(acc, 0.90)
	r.P99 = percentile(acc, 0.99)
	r.Max = acc[len(acc)-1]
	r.Mean = sum / time.Duration(len(acc))
	r.RoundTripP50 = percentile(round, 0.50)
	r.RoundTripP99 = percentile(round, 0.99)
	return nil
}

// percentile is the nearest-rank percentile of sorted values.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	k := int(math.Ceil(p*float64(len(sorted)))) - 1
	k = max(0, min(k, len(sorted)-1))
	return sorted[k]
}
