package ingress

import (
	"context"
	"encoding/json"
	"errors"
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

const (
	// maxRepliesPerResponse caps the replies of one /replies answer; a client
	// asks again with the last seq it got.
	maxRepliesPerResponse = 100
	// mailboxInactiveThreshold lets the server remove a mailbox reader whose
	// process died; a live reader deletes its consumer when it is done.
	mailboxInactiveThreshold = 2 * time.Minute
	// mailboxResetAttempts bounds how often a reader recreates its ordered
	// consumer after a NATS hiccup before the request fails (503, or the end
	// of an event stream the client then resumes with Last-Event-ID).
	mailboxResetAttempts = 3
)

// replyView is one reply as the HTTP API shows it. Seq is the sequence of
// the reply in the lane's mailbox (the outbox stream).
type replyView struct {
	Seq       uint64 `json:"seq"`
	TurnID    string `json:"turn_id"`
	SessionID string `json:"session_id"`
	Text      string `json:"text"`
	Kind      string `json:"kind"`
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

	box, err := s.openMailbox(r, lane, after)
	if err != nil {
		s.writeError(w, r, unavailable("cannot read the replies; retry", err))
		return
	}
	defer box.close()
	replies, err := box.collect(ctx, wait, s.cfg.PublishTimeout)
	if err != nil {
		s.writeError(w, r, unavailable("cannot read the replies; retry", err))
		return
	}
	s.log.LogAttrs(r.Context(), slog.LevelDebug, "replies served",
		slog.String("session_key", key), slog.Uint64("after", after), slog.Int("count", len(replies)))
	writeJSON(w, http.StatusOK, repliesResponse{Replies: replies})
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

	box, err := s.openMailbox(r, lane, after)
	if err != nil {
		s.writeError(w, r, unavailable("cannot read the replies; retry", err))
		return
	}
	defer box.close()

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

	for {
		hctx, hcancel := context.WithTimeout(ctx, s.cfg.EventsHeartbeat)
		m, err := box.it.Next(jetstream.NextContext(hctx))
		hcancel()
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return // the client went away, or Close
		case hctx.Err() != nil:
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
			continue
		default:
			// The client resumes from its Last-Event-ID.
			log.LogAttrs(ctx, slog.LevelWarn, "event stream ended by a read error", slog.Any("error", err))
			return
		}
		v, ok := box.view(m)
		if !ok {
			continue
		}
		data, err := json.Marshal(v)
		if err != nil {
			continue
		}
		wmu.Lock()
		writeDeadline()
		_, err = fmt.Fprintf(w, "id: %d\nevent: reply\ndata: %s\n\n", v.Seq, data)
		if err == nil {
			err = rc.Flush()
		}
		wmu.Unlock()
		if err != nil {
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

// mailbox reads a lane's mailbox from a seq on, in order, through an
// ordered consumer. The consumer's pull requests are what a long poll
// waits on: the server hands a new reply over the moment it is stored.
type mailbox struct {
	s    *Server
	cons jetstream.Consumer
	it   jetstream.MessagesContext
	// pending is the number of replies after the start seq when the reader
	// was created.
	pending uint64
	lane    string
}

func (s *Server) openMailbox(r *http.Request, lane string, after uint64) (*mailbox, error) {
	ctx, cancel := s.opContext(r)
	defer cancel()
	subject := s.names.BoxSubject(string(session.PlatformHTTP), lane)
	cons, err := s.js.OrderedConsumer(ctx, s.names.OutboxStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{subject},
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       after + 1,
		InactiveThreshold: mailboxInactiveThreshold,
		MaxResetAttempts:  mailboxResetAttempts,
	})
	if err != nil {
		return nil, fmt.Errorf("open mailbox %s: %w", subject, err)
	}
	b := &mailbox{s: s, cons: cons, lane: lane}
	if info := cons.CachedInfo(); info != nil {
		b.pending = info.NumPending
	}
	b.it, err = cons.Messages(jetstream.PullMaxMessages(maxRepliesPerResponse))
	if err != nil {
		b.deleteConsumer()
		return nil, fmt.Errorf("read mailbox %s: %w", subject, err)
	}
	return b, nil
}

// collect returns the replies that are there (up to maxRepliesPerResponse),
// or when there are none, waits up to wait for the first one and returns it
// with any that came along. A wait that elapses, or a ctx that ends, gives
// an empty list.
func (b *mailbox) collect(ctx context.Context, wait, opTimeout time.Duration) ([]replyView, error) {
	out := make([]replyView, 0)
	pending := b.pending
	if pending == 0 {
		if wait <= 0 {
			return out, nil
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		m, err := b.it.Next(jetstream.NextContext(wctx))
		cancel()
		if err != nil {
			if wctx.Err() != nil {
				return out, nil
			}
			return nil, err
		}
		if pending, err = numPending(m); err != nil {
			return nil, err
		}
		if v, ok := b.view(m); ok {
			out = append(out, v)
		}
	}
	for pending > 0 && len(out) < maxRepliesPerResponse {
		nctx, cancel := context.WithTimeout(ctx, opTimeout)
		m, err := b.it.Next(jetstream.NextContext(nctx))
		cancel()
		if err != nil {
			if len(out) > 0 {
				break // answer what we have; the client asks for the rest
			}
			return nil, err
		}
		if pending, err = numPending(m); err != nil {
			return nil, err
		}
		if v, ok := b.view(m); ok {
			out = append(out, v)
		}
	}
	return out, nil
}

func numPending(m jetstream.Msg) (uint64, error) {
	meta, err := m.Metadata()
	if err != nil {
		return 0, fmt.Errorf("mailbox message metadata: %w", err)
	}
	return meta.NumPending, nil
}

// view decodes a mailbox message; an unreadable one is logged and skipped.
func (b *mailbox) view(m jetstream.Msg) (replyView, bool) {
	meta, err := m.Metadata()
	if err != nil {
		b.s.log.Warn("mailbox message without metadata", slog.String("lane", b.lane), slog.Any("error", err))
		return replyView{}, false
	}
	if m.Headers().Get(broker.HdrKind) == broker.KindSkip {
		return replyView{}, false // stands for an unreadable reply
	}
	var rep session.Reply
	if err := json.Unmarshal(m.Data(), &rep); err != nil {
		b.s.log.Warn("skipping unreadable mailbox message", slog.String("lane", b.lane),
			slog.Uint64("seq", meta.Sequence.Stream), slog.Any("error", err))
		return replyView{}, false
	}
	return replyView{
		Seq:       meta.Sequence.Stream,
		TurnID:    rep.TurnID,
		SessionID: rep.SessionID,
		Text:      rep.Text,
		Kind:      rep.Kind,
	}, true
}

// close stops the reader and removes its consumer from the server.
func (b *mailbox) close() {
	b.it.Stop()
	b.deleteConsumer()
}

func (b *mailbox) deleteConsumer() {
	info := b.cons.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.s.cfg.PublishTimeout)
	defer cancel()
	err := b.s.js.DeleteConsumer(ctx, b.s.names.OutboxStream(), info.Name)
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		// The server removes it after mailboxInactiveThreshold anyway.
		b.s.log.Debug("cannot delete mailbox reader", slog.String("consumer", info.Name), slog.Any("error", err))
	}
}
