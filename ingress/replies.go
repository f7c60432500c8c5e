package ingress

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
)

// maxRepliesPerResponse caps the replies of one /replies answer; a client
// asks again with the last seq it got.
const maxRepliesPerResponse = 100

// replyView is one reply as the HTTP API shows it. Seq is the sequence of
// the reply in the lane's mailbox (the outbox stream).
type replyView struct {
	Seq       uint64 `json:"seq"`
	TurnID    string `json:"turn_id"`
	SessionID string `json:"session_id"`
	Text      string `json:"text"`
	Kind      string `json:"kind"`
	// ReplyTo is the platform message id the reply answers: the newest
	// message of its turn (the turn's reply anchor), when it had one.
	ReplyTo string `json:"reply_to,omitempty"`
}

type repliesResponse struct {
	Replies []replyView `json:"replies"`
}

func (s *Server) handleReplies(w http.ResponseWriter, r *http.Request) {
	key, lane, e := sessionKeyFromPath(r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	q := r.URL.Query()
	after, e := parseAfter("after", q.Get("after"))
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	wait, e := parseWait(q.Get("wait"))
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	if wait > 0 {
		// Outlive a short http.Server.WriteTimeout.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + s.cfg.PublishTimeout + 5*time.Second))
	}
	ctx, cancel := s.streamContext(r)
	defer cancel()
	release, e := s.admitReader(r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	defer release()

	subject := s.names.BoxSubject(string(session.PlatformHTTP), lane)
	// Watch before the first read: a reply stored in between still wakes us.
	var wake chan struct{}
	if wait > 0 {
		var stop func()
		wake, stop = s.hub.watch(lane)
		defer stop()
	}
	replies, err := s.collect(ctx, subject, after, wait, wake)
	if err != nil {
		s.writeError(w, r, unavailable("cannot read the replies; retry", err))
		return
	}
	s.log.LogAttrs(r.Context(), slog.LevelDebug, "replies served",
		slog.String("session_key", key), slog.Uint64("after", after), slog.Int("count", len(replies)))
	writeJSON(w, http.StatusOK, repliesResponse{Replies: replies})
}

// collect returns the replies after seq after that are there (at most
// maxRepliesPerResponse), or when there are none, waits up to wait for the
// mailbox to grow (wake) and returns what came. A wait that elapses, or a
// ctx that ends, gives an empty list.
func (s *Server) collect(ctx context.Context, subject string, after uint64, wait time.Duration, wake <-chan struct{}) ([]replyView, error) {
	deadline := time.Now().Add(wait)
	for {
		octx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
		out, last, err := s.readMailbox(octx, subject, after, maxRepliesPerResponse)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return make([]replyView, 0), nil
			}
			return nil, err
		}
		after = last // markers passed over need not be read again
		left := time.Until(deadline)
		if len(out) > 0 || wait <= 0 || left <= 0 || ctx.Err() != nil {
			return out, nil
		}
		t := time.NewTimer(left)
		select {
		case <-wake:
		case <-t.C: // one last read above: a hint may have been lost
		case <-ctx.Done():
		}
		t.Stop()
	}
}

func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) {
	key, lane, e := sessionKeyFromPath(r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	after, e := parseAfter("after", r.URL.Query().Get("after"))
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	// A reconnecting EventSource sends the id of the last event it got,
	// which is more recent than the after of its URL.
	if last := r.Header.Get("Last-Event-ID"); last != "" {
		if after, e = parseAfter("Last-Event-ID", last); e != nil {
			s.writeError(w, r, e)
			return
		}
	}
	ctx, cancel := s.streamContext(r)
	defer cancel()
	release, e := s.admitReader(r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	defer release()
	subject := s.names.BoxSubject(string(session.PlatformHTTP), lane)
	wake, stop := s.hub.watch(lane)
	defer stop()

	rc := http.NewResponseController(w)
	// The stream lasts as long as the client wants, but each write must get
	// through within two heartbeats: a client that stops reading would
	// otherwise block the handler (and its mailbox consumer) for ever.
	writeDeadline := func() { _ = rc.SetWriteDeadline(time.Now().Add(2 * s.cfg.EventsHeartbeat)) }
	writeDeadline()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if _, err := fmt.Fprint(w, "retry: 2000\n\n"); err != nil {
		return
	}
	if err := rc.Flush(); err != nil {
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "event stream cannot flush", slog.Any("error", err))
		return
	}
	log := s.log.With(slog.String("session_key", key))
	log.LogAttrs(ctx, slog.LevelDebug, "event stream opened", slog.Uint64("after", after))
	defer log.LogAttrs(r.Context(), slog.LevelDebug, "event stream closed")

	// The lane's text deltas go out beside the replies, as "delta" events
	// without an id (they are not replayed: a client that reconnects gets
	// the replies, which hold the whole text).
	var wmu sync.Mutex // one writer at a time: the replies below, the deltas
	stopDeltas, err := s.forwardDeltas(lane, func(data []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		writeDeadline()
		if _, err := fmt.Fprintf(w, "event: delta\ndata: %s\n\n", data); err != nil {
			return err
		}
		return rc.Flush()
	})
	if err != nil {
		log.LogAttrs(ctx, slog.LevelWarn, "event stream without deltas", slog.Any("error", err))
	} else {
		defer stopDeltas()
	}

	heartbeat := time.NewTicker(s.cfg.EventsHeartbeat)
	defer heartbeat.Stop()
	for {
		octx, ocancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
		replies, last, err := s.readMailbox(octx, subject, after, maxRepliesPerResponse)
		ocancel()
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return // the client went away, or Close
		default:
			// The client resumes from its Last-Event-ID.
			log.LogAttrs(ctx, slog.LevelWarn, "event stream ended by a read error", slog.Any("error", err))
			return
		}
		after = last
		wmu.Lock()
		var werr error
		for _, v := range replies {
			data, err := json.Marshal(v)
			if err != nil {
				continue
			}
			writeDeadline()
			if _, werr = fmt.Fprintf(w, "id: %d\nevent: reply\ndata: %s\n\n", v.Seq, data); werr != nil {
				break
			}
		}
		if werr == nil && len(replies) > 0 {
			werr = rc.Flush()
		}
		wmu.Unlock()
		if werr != nil {
			return
		}
		if len(replies) > 0 {
			if len(replies) == maxRepliesPerResponse {
				continue // more may be there already
			}
		}
		select {
		case <-wake:
		case <-heartbeat.C:
			// Also a read: a hint lost to a reconnect costs one heartbeat.
			wmu.Lock()
			writeDeadline()
			_, err := fmt.Fprint(w, ": heartbeat\n\n")
			if err == nil {
				err = rc.Flush()
			}
			wmu.Unlock()
			if err != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// deltaView is a delta event as the HTTP API shows it.
type deltaView struct {
	TurnID    string `json:"turn_id"`
	SessionID string `json:"session_id"`
	Attempt   int    `json:"attempt"`
	N         int    `json:"n"`
	Text      string `json:"text"`
}

// maxPendingDeltas bounds the deltas waiting for one event stream; beyond
// it they are dropped (the replies still carry the whole text).
const maxPendingDeltas = 1024

// forwardDeltas passes the lane's deltas, as they arrive on the core delta
// subject, to write, until stop is called (stop waits for a write in
// progress). A failed write ends the forwarding.
func (s *Server) forwardDeltas(lane string, write func(data []byte) error) (stop func(), err error) {
	ch := make(chan *nats.Msg, maxPendingDeltas)
	sub, err := s.js.Conn().ChanSubscribe(s.names.DeltaSubject(lane), ch)
	if err != nil {
		return nil, fmt.Errorf("subscribe to the deltas of %s: %w", lane, err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case m := <-ch:
				// Re-encoded: one line of JSON whatever was published.
				var d session.Delta
				if json.Unmarshal(m.Data, &d) != nil {
					continue
				}
				data, err := json.Marshal(deltaView{TurnID: d.TurnID, SessionID: d.SessionID, Attempt: d.Attempt, N: d.N, Text: d.Text})
				if err != nil {
					continue
				}
				if write(data) != nil {
					_ = sub.Unsubscribe()
					return
				}
			}
		}
	})
	return func() {
		_ = sub.Unsubscribe()
		close(done)
		wg.Wait()
	}, nil
}

// parseAfter parses a reply seq; empty is 0.
func parseAfter(name, v string) (uint64, *apiError) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n == math.MaxUint64 {
		return 0, badRequest("%s must be a reply seq (a non-negative integer), not %q", name, v)
	}
	return n, nil
}

// parseWait parses a Go duration ("30s", "1m") or a number of seconds; empty
// is 0. Waits above MaxWait are cut to it.
func parseWait(v string) (time.Duration, *apiError) {
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		secs, serr := strconv.ParseUint(v, 10, 32)
		if serr != nil {
			return 0, badRequest("wait must be a duration such as 30s or a number of seconds, not %q", v)
		}
		d = time.Duration(secs) * time.Second
	}
	if d < 0 {
		return 0, badRequest("wait must not be negative, not %q", v)
	}
	return min(d, MaxWait), nil
}

// view decodes a mailbox message; a marker is passed over, an unreadable
// one logged and skipped.
func (s *Server) view(m *jetstream.RawStreamMsg) (replyView, bool) {
	if m.Header.Get(broker.HdrKind) == broker.KindSkip {
		return replyView{}, false // stands for an unreadable reply
	}
	var rep session.Reply
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		s.log.Warn("skipping unreadable mailbox message", slog.String("subject", m.Subject),
			slog.Uint64("seq", m.Sequence), slog.Any("error", err))
		return replyView{}, false
	}
	return replyView{
		Seq:       m.Sequence,
		TurnID:    rep.TurnID,
		SessionID: rep.SessionID,
		Text:      rep.Text,
		Kind:      rep.Kind,
		ReplyTo:   rep.ReplyTo,
	}, true
}
