package ingress

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
)

// mailboxHub serves every reply reader of a process from one subscription:
// the server republishes the headers of each message stored in a mailbox
// (<prefix>.boxhint.http.<lane>), and the hub wakes the readers of that
// lane, which then read the mailbox by direct get. No reader holds a
// consumer, so their number is bounded by memory and connections, not by
// the server's consumer limit, and a reader that dies leaves nothing on the
// server.
//
// Hints are core NATS (at most once): a reader also reads the mailbox when
// it starts, at the end of a long poll and at every event-stream
// heartbeat, so a hint lost to a reconnect delays a reply, never loses it.
type mailboxHub struct {
	prefix string

	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
	sub     *nats.Subscription
}

func newMailboxHub(nc *nats.Conn, names broker.Names) (*mailboxHub, error) {
	h := &mailboxHub{
		prefix:  strings.TrimSuffix(names.BoxHintPlatformFilter(string(session.PlatformHTTP)), ">"),
		waiters: map[string]map[chan struct{}]struct{}{},
	}
	sub, err := nc.Subscribe(names.BoxHintPlatformFilter(string(session.PlatformHTTP)), h.hint)
	if err != nil {
		return nil, fmt.Errorf("subscribe to mailbox hints: %w", err)
	}
	// Hints are headers only; a burst of many thousands must not make the
	// subscription a slow consumer.
	_ = sub.SetPendingLimits(1<<20, 256<<20)
	h.sub = sub
	return h, nil
}

func (h *mailboxHub) hint(m *nats.Msg) {
	lane := strings.TrimPrefix(m.Subject, h.prefix)
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.waiters[lane] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// watch registers a reader of lane; the returned channel receives a value
// (coalesced) whenever the lane's mailbox may have grown. stop unregisters.
func (h *mailboxHub) watch(lane string) (ch chan struct{}, stop func()) {
	ch = make(chan struct{}, 1)
	h.mu.Lock()
	set := h.waiters[lane]
	if set == nil {
		set = map[chan struct{}]struct{}{}
		h.waiters[lane] = set
	}
	set[ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(set, ch)
		if len(set) == 0 && h.waiters[lane] != nil && len(h.waiters[lane]) == 0 {
			delete(h.waiters, lane)
		}
	}
}

// watching is the number of readers registered.
func (h *mailboxHub) watching() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, set := range h.waiters {
		n += len(set)
	}
	return n
}

func (h *mailboxHub) close() {
	if h.sub != nil {
		_ = h.sub.Unsubscribe()
	}
}

// readMailbox returns the replies in subject after seq after, in order, at
// most max, by direct gets (next message of the subject at or after a
// seq). last is the seq of the last mailbox message read, readable or not
// (markers and unreadable messages are passed over), or after when none.
func (s *Server) readMailbox(ctx context.Context, subject string, after uint64, max int) (out []replyView, last uint64, err error) {
	out = make([]replyView, 0)
	last = after
	for len(out) < max {
		m, err := s.res.Outbox.GetMsg(ctx, last+1, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, last, nil
		}
		if err != nil {
			if len(out) > 0 {
				return out, last, nil // answer what we have
			}
			return nil, after, fmt.Errorf("read mailbox %s after %d: %w", subject, last, err)
		}
		last = m.Sequence
		if v, ok := s.view(m); ok {
			out = append(out, v)
		}
	}
	return out, last, nil
}
