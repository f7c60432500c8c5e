package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/session"
)

// sse writes server-sent events.
type sse struct {
	w http.ResponseWriter
	f http.Flusher
}

func startSSE(w http.ResponseWriter) (*sse, error) {
	f, ok := w.(http.Flusher)
	if !ok {
		return nil, errors.New("streaming is not supported by this connection")
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	f.Flush()
	return &sse{w: w, f: f}, nil
}

// send writes one event; data may hold several lines.
func (s *sse) send(event, data string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "event: %s\n", event)
	for _, line := range strings.Split(data, "\n") {
		fmt.Fprintf(&b, "data: %s\n", line)
	}
	b.WriteString("\n")
	if _, err := s.w.Write([]byte(b.String())); err != nil {
		return err
	}
	s.f.Flush()
	return nil
}

func (s *sse) comment() error {
	if _, err := s.w.Write([]byte(": keep-alive\n\n")); err != nil {
		return err
	}
	s.f.Flush()
	return nil
}

// handleLanesStream sends the lanes of the filter as they change: a row
// event with the row's HTML for a lane that changed (or appeared), a remove
// event with the row's id for one that left the filter. Changes come from
// watches of the sessions and leases buckets; every Refresh the rows are
// read again for what no watch reports (inbox backlogs).
func (c *Console) handleLanesStream(w http.ResponseWriter, r *http.Request) {
	f, err := filterOf(r)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	ctx, cancel := c.streamCtx(r)
	defer cancel()
	octx, ocancel := context.WithTimeout(ctx, c.cfg.Timeout)
	fl, err := c.fleetFor(octx)
	ocancel()
	if err != nil {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	sw, err := fl.Res.Sessions.Watch(ctx, ">", jetstream.UpdatesOnly())
	if err != nil {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	defer func() { _ = sw.Stop() }()
	lw, err := fl.Res.Leases.Watch(ctx, ">", jetstream.UpdatesOnly())
	if err != nil {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	defer func() { _ = lw.Stop() }()
	out, err := startSSE(w)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	shown := map[string]string{} // lane -> the row's HTML last sent
	sendRow := func(row laneRow) error {
		html, err := c.fragment("lanerow", row)
		if err != nil {
			return err
		}
		if shown[row.Lane] == html {
			return nil
		}
		shown[row.Lane] = html
		return out.send("row", html)
	}
	refreshLane := func(lane string) error {
		rctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
		e, _, err := fl.Store.Get(rctx, lane)
		if err != nil {
			if _, was := shown[lane]; was {
				delete(shown, lane)
				return out.send("remove", "lane-"+lane)
			}
			return nil
		}
		row := c.laneRow(rctx, fl, e)
		if !f.match(row) {
			if _, was := shown[lane]; was {
				delete(shown, lane)
				return out.send("remove", "lane-"+lane)
			}
			return nil
		}
		return sendRow(row)
	}
	refreshAll := func() error {
		rctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
		rows, _, err := c.laneRows(rctx, fl, f)
		if err != nil {
			return nil // the next tick tries again
		}
		seen := map[string]bool{}
		for _, row := range rows {
			seen[row.Lane] = true
			if err := sendRow(row); err != nil {
				return err
			}
		}
		for lane := range shown {
			if !seen[lane] {
				delete(shown, lane)
				if err := out.send("remove", "lane-"+lane); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := refreshAll(); err != nil {
		return
	}
	tick := time.NewTicker(c.cfg.Refresh)
	defer tick.Stop()
	beat := time.NewTicker(c.cfg.Heartbeat)
	defer beat.Stop()
	for {
		var err error
		select {
		case <-ctx.Done():
			return
		case u, ok := <-sw.Updates():
			if !ok {
				return
			}
			if u != nil {
				err = refreshLane(u.Key())
			}
		case u, ok := <-lw.Updates():
			if !ok {
				return
			}
			if u != nil {
				if _, perr := session.ParseLaneToken(u.Key()); perr == nil {
					err = refreshLane(u.Key())
				}
			}
		case <-tick.C:
			err = refreshAll()
		case <-beat.C:
			err = out.comment()
		}
		if err != nil {
			return // the client went away
		}
	}
}

// handleEventsStream sends each new message of the events stream as an
// event row.
func (c *Console) handleEventsStream(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := c.streamCtx(r)
	defer cancel()
	octx, ocancel := context.WithTimeout(ctx, c.cfg.Timeout)
	fl, err := c.fleetFor(octx)
	var cons jetstream.Consumer
	if err == nil {
		cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy}
		if after, perr := parseSeq(r.URL.Query().Get("after")); perr == nil && after > 0 {
			cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, after+1
		}
		cons, err = fl.JS.OrderedConsumer(octx, fl.Names.EventStream(), cfg)
	}
	ocancel()
	if err != nil {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	it, err := cons.Messages()
	if err != nil {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	out, err := startSSE(w)
	if err != nil {
		return
	}
	msgs := make(chan jetstream.Msg)
	go func() {
		defer close(msgs)
		for {
			m, err := it.Next()
			if err != nil {
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	beat := time.NewTicker(c.cfg.Heartbeat)
	defer beat.Stop()
	for {
		select {
		case <-ctx.Done():
			it.Stop()
			for range msgs {
			}
			return
		case m, ok := <-msgs:
			if !ok {
				return
			}
			meta, err := m.Metadata()
			if err != nil {
				continue
			}
			html, err := c.fragment("eventrow", c.eventRow(fl, meta.Sequence.Stream, meta.Timestamp, m.Subject(), m.Data()))
			if err != nil || out.send("event", html) != nil {
				cancel()
			}
		case <-beat.C:
			if out.comment() != nil {
				cancel()
			}
		}
	}
}

func parseSeq(s string) (uint64, error) {
	var n uint64
	_, err := fmt.Sscan(s, &n)
	return n, err
}
