package admin

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/worker"
)

// Minute is one bucket of a History.
type Minute struct {
	Start time.Time `json:"start"`
	// Turns ended in the minute, Failures those that failed or were
	// interrupted (a stopped turn, a command's or a duplicate's is none),
	// DeadLetters the messages dead-lettered.
	Turns       int `json:"turns"`
	Failures    int `json:"failures"`
	DeadLetters int `json:"dead_letters"`
	// P50 and P99 are the accept-to-reply latencies (the first message's
	// store time in the inbox to the turn's end) of the sampled turns that
	// ended in the minute; 0 when none was sampled.
	P50 time.Duration `json:"p50"`
	P99 time.Duration `json:"p99"`
	// Backlog estimates the turns accepted but not answered at the end of
	// the minute: each sampled turn counts from its first message's store
	// time to its end, scaled up by the turns that were not sampled.
	Backlog float64 `json:"backlog"`
}

// History is the fleet's recent activity, minute by minute, derived from
// the events stream (turn ends and dead letters, stored with the time they
// happened) and the inbox (when each turn's first message was accepted).
type History struct {
	From, To time.Time
	Minutes  []Minute
	// Events is how many events were read; Truncated says the read stopped
	// at the bound before the end of the window.
	Events    int
	Truncated bool
}

// HistoryOptions bound the work of ReadHistory.
type HistoryOptions struct {
	// Window is how far back to read. Defaults to an hour.
	Window time.Duration
	// MaxEvents bounds the events read. Defaults to 200000.
	MaxEvents int
	// SamplesPerMinute bounds the turns per minute whose accept time is
	// read from the inbox (one read each). Defaults to 30.
	SamplesPerMinute int
}

type endedTurn struct {
	end      time.Time
	firstSeq uint64
	lane     string
	failed   bool
}

// ReadHistory reads the last Window of turn and dead-letter events.
func (f *Fleet) ReadHistory(ctx context.Context, o HistoryOptions) (*History, error) {
	if o.Window <= 0 {
		o.Window = time.Hour
	}
	if o.MaxEvents <= 0 {
		o.MaxEvents = 200000
	}
	if o.SamplesPerMinute <= 0 {
		o.SamplesPerMinute = 30
	}
	now := time.Now()
	to := now.Truncate(time.Minute).Add(time.Minute)
	from := to.Add(-o.Window)
	n := int(o.Window / time.Minute)
	h := &History{From: from, To: to, Minutes: make([]Minute, n)}
	for i := range h.Minutes {
		h.Minutes[i].Start = from.Add(time.Duration(i) * time.Minute)
	}
	bucket := func(t time.Time) int {
		if t.Before(from) || !t.Before(to) {
			return -1
		}
		return int(t.Sub(from) / time.Minute)
	}
	cons, err := f.JS.OrderedConsumer(ctx, f.Names.EventStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{f.Names.EventSubject("turn", ">"), f.Names.EventSubject("deadletter", ">")},
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy, OptStartTime: &from,
	})
	if err != nil {
		return nil, err
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		return nil, err
	}
	perMinute := make([][]endedTurn, n)
	turnPrefix := f.Names.Prefix() + ".ev.turn."
	left := ci.NumPending
	for left > 0 {
		batch, err := cons.Fetch(min(int(left), 1000), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			h.Events++
			meta, err := m.Metadata()
			if err != nil {
				continue
			}
			left = meta.NumPending
			if !strings.HasPrefix(m.Subject(), turnPrefix) {
				if i := bucket(meta.Timestamp); i >= 0 {
					h.Minutes[i].DeadLetters++
				}
				continue
			}
			var ev worker.TurnEvent
			if json.Unmarshal(m.Data(), &ev) != nil || ev.Type != "end" {
				continue
			}
			at := ev.At
			if at.IsZero() {
				at = meta.Timestamp
			}
			if i := bucket(at); i >= 0 {
				h.Minutes[i].Turns++
				failed := ev.Status == "failed" || ev.Status == "interrupted"
				if failed {
					h.Minutes[i].Failures++
				}
				perMinute[i] = append(perMinute[i], endedTurn{end: at, firstSeq: ev.FirstSeq, lane: ev.Lane, failed: failed})
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
		if got == 0 {
			break // nothing more within the wait: what was stored is read
		}
		if h.Events >= o.MaxEvents {
			h.Truncated = left > 0
			break
		}
	}
	// Accept times of a sample of each minute's turns.
	type span struct {
		from, to time.Time
		weight   float64
	}
	var spans []span
	for i, turns := range perMinute {
		if len(turns) == 0 {
			continue
		}
		step := max(1, len(turns)/o.SamplesPerMinute)
		var lat []time.Duration
		sampled := 0
		for j := 0; j < len(turns); j += step {
			t := turns[j]
			if t.firstSeq == 0 {
				continue
			}
			raw, err := f.inbox(ctx, t.lane).Stream.GetMsg(ctx, t.firstSeq)
			if err != nil {
				continue // the inbox no longer holds it
			}
			sampled++
			if d := t.end.Sub(raw.Time); d > 0 {
				lat = append(lat, d)
				spans = append(spans, span{from: raw.Time, to: t.end})
			}
		}
		if sampled > 0 {
			w := float64(len(turns)) / float64(sampled)
			for k := len(spans) - len(lat); k < len(spans); k++ {
				spans[k].weight = w
			}
		}
		slices.Sort(lat)
		h.Minutes[i].P50, h.Minutes[i].P99 = Percentile(lat, 0.50), Percentile(lat, 0.99)
	}
	for i := range h.Minutes {
		end := h.Minutes[i].Start.Add(time.Minute)
		for _, s := range spans {
			if !s.from.After(end) && s.to.After(end) {
				h.Minutes[i].Backlog += s.weight
			}
		}
	}
	return h, nil
}

// Percentile is the p-th percentile (nearest rank) of sorted, 0 if empty.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
