package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/worker"
)

// turnEvent is a worker's TurnEvent as the bench received it.
type turnEvent struct {
	worker.TurnEvent
	// at is when the bench received it (core subscription).
	at time.Time
}

// eventWatch collects the fleet's turn events (<prefix>.ev.turn.<lane>) from
// a core subscription as they are published: waiting for one never polls.
type eventWatch struct {
	mu      sync.Mutex
	events  []turnEvent
	changed chan struct{} // closed and replaced on every new event
	sub     *nats.Subscription
}

func watchTurnEvents(nc *nats.Conn, names broker.Names) (*eventWatch, error) {
	w := &eventWatch{changed: make(chan struct{})}
	sub, err := nc.Subscribe(names.EventSubject("turn", ">"), func(m *nats.Msg) {
		at := time.Now()
		var ev worker.TurnEvent
		if json.Unmarshal(m.Data, &ev) != nil {
			return
		}
		w.mu.Lock()
		w.events = append(w.events, turnEvent{TurnEvent: ev, at: at})
		close(w.changed)
		w.changed = make(chan struct{})
		w.mu.Unlock()
	})
	if err != nil {
		return nil, fmt.Errorf("bench: subscribe turn events: %w", err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return nil, err
	}
	w.sub = sub
	return w, nc.Flush()
}

// waitFor returns the first event (in arrival order) that match accepts,
// waiting up to timeout for it.
func (w *eventWatch) waitFor(ctx context.Context, timeout time.Duration, what string, match func(turnEvent) bool) (turnEvent, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	from := 0
	for {
		w.mu.Lock()
		for ; from < len(w.events); from++ {
			if match(w.events[from]) {
				ev := w.events[from]
				w.mu.Unlock()
				return ev, nil
			}
		}
		ch := w.changed
		w.mu.Unlock()
		select {
		case <-ch:
		case <-t.C:
			return turnEvent{}, fmt.Errorf("no %s within %s", what, timeout)
		case <-ctx.Done():
			return turnEvent{}, context.Cause(ctx)
		}
	}
}

// all returns a copy of the events received so far.
func (w *eventWatch) all() []turnEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]turnEvent(nil), w.events...)
}

// serveHTTP serves h on a loopback listener and returns its base URL.
func serveHTTP(h http.Handler) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("bench: %w", err)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
	}, nil
}

// postText POSTs one message with text and message id to the ingress at
// base for lane l, and returns its answer.
func postText(ctx context.Context, client *http.Client, base string, l laneID, messageID, text string) (acceptBody, error) {
	body := mustJSON(httpPost{ChatID: l.chatID, ChatType: session.ChatDM, UserID: l.userID, UserName: l.userName, MessageID: messageID, Text: text})
	ab, _, _, err := postMessage(ctx, client, base+"/v1/messages", body)
	return ab, err
}
