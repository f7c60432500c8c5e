package worker

import (
	"context"
)

// msgidLookups are the msgids lookups of a step's messages, in flight.
type msgidLookups map[uint64]*msgidLookup

type msgidLookup struct {
	done  chan struct{}
	owner uint64
	found bool
	err   error
}

// prefetchMsgIDs starts the msgids lookup of every message with a platform
// message id; nil when there is none.
func (l *lane) prefetchMsgIDs(msgs []inboxMsg) msgidLookups {
	var out msgidLookups
	for _, m := range msgs {
		id := m.body.PlatformMsgID
		if id == "" {
			continue
		}
		if out == nil {
			out = msgidLookups{}
		}
		r := &msgidLookup{done: make(chan struct{})}
		out[m.seq] = r
		ctx := context.WithoutCancel(l.ctx)
		go func() {
			defer close(r.done)
			r.owner, r.found, r.err = l.w.msgids.Lookup(ctx, id)
		}()
	}
	return out
}

// lookupMsgID returns the inbox seq recorded for m's platform message id,
// from the prefetched lookups when there is one.
func (l *lane) lookupMsgID(m inboxMsg) (uint64, bool, error) {
	if r := l.msgids[m.seq]; r != nil {
		<-r.done
		return r.owner, r.found, r.err
	}
	return l.w.msgids.Lookup(context.WithoutCancel(l.ctx), m.body.PlatformMsgID)
}

// wait waits for every lookup to end.
func (p msgidLookups) wait() {
	for _, r := range p {
		<-r.done
	}
}

// duplicate reports whether m repeats a platform message already
// incorporated under another inbox seq (a platform retry that reached the
// inbox again: after the stream's de-duplication window, with its msgids
// record missed by a crashed ingress). It claims the id for m otherwise.
// The ingress normally recorded the id already: it reads first, and writes
// only when the record is missing.
func (l *lane) duplicate(m inboxMsg) (bool, error) {
	id := m.body.PlatformMsgID
	if id == "" {
		return false, nil
	}
	w := l.w
	owner, found, err := l.lookupMsgID(m)
	if err == nil && !found {
		owner, err = w.msgids.Record(context.WithoutCancel(l.ctx), id, m.seq)
	}
	if err != nil {
		l.log.Warn("record message id", "error", err)
		return false, err
	}
	if owner == m.seq {
		return false, nil
	}
	l.log.Info("duplicate platform message not run", "platform_msg_id", id, "seq", m.seq, "first_seq", owner)
	w.event("duplicate", l.lane, map[string]any{"seq": m.seq, "first_seq": owner, "platform_msg_id": id})
	return true, nil
}

// duplicateCopy reports whether m is a second inbox copy of a platform
// message that msgids records under another inbox seq: its turn will skip
// it (see duplicate), so a busy check must not take it for news. Copies
// are rare (a retried publish stored twice across a NATS failover, or a
// retry after the stream's de-duplication window), but one that arrives
// while the turn of its original runs would otherwise interrupt that turn
// in busy mode interrupt and then be skipped: the message would be
// incorporated and never answered. A failed lookup counts as no copy (the
// message interrupts, as any new one does).
func (l *lane) duplicateCopy(ctx context.Context, m *inboxMsg) bool {
	id := m.body.PlatformMsgID
	if id == "" {
		return false
	}
	owner, found, err := l.w.msgids.Lookup(context.WithoutCancel(ctx), id)
	return err == nil && found && owner != m.seq
}
