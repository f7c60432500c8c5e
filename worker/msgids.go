package worker

import (
	"context"
	"log/slog"

	"github.com/agentfleet/agentfleet/kv"
)

// msgidClaims are the msgids claims of a step's messages, in flight.
type msgidClaims map[uint64]*kv.PendingClaim

// ref names m in the msgids record: its seq and its inbox stream.
func (m inboxMsg) ref() kv.MsgRef { return kv.MsgRef{Seq: m.seq, Inbox: m.inboxID} }

// prefetchMsgIDs starts the msgids claim of every message with a platform
// message id; nil when there is none. A claim is idempotent (the same id and
// seq give the same answer), so making it before the turn's intent is
// recorded changes nothing a crash could see: it is the record the ingress
// used to write when it accepted the message. The claims' creates go out
// at once and their answers are read when the messages are incorporated
// (no goroutine per claim).
//
// Two copies of one id in the step (msgs are in seq order) do not race for
// it: the first claims it, and a later copy takes the first's answer, so the
// message is incorporated at its first seq, in order, and the copy skipped.
func (l *lane) prefetchMsgIDs(msgs []inboxMsg) msgidClaims {
	var out msgidClaims
	var first map[string]*kv.PendingClaim
	for _, m := range msgs {
		id := m.body.PlatformMsgID
		if id == "" {
			continue
		}
		if out == nil {
			out = msgidClaims{}
			if len(msgs) > 1 { // a step of one message has no copies
				first = map[string]*kv.PendingClaim{}
			}
		}
		if f := first[id]; f != nil {
			out[m.seq] = f
			continue
		}
		c := l.w.msgids.ClaimAsync(id, m.ref())
		if first != nil {
			first[id] = c
		}
		out[m.seq] = c
	}
	return out
}

// claimMsgID claims m's platform message id for m (its seq in its inbox
// stream) and returns the message that owns it, from the prefetched claims
// when there is one.
func (l *lane) claimMsgID(m inboxMsg) (kv.MsgRef, error) {
	if c := l.msgids[m.seq]; c != nil {
		return c.Wait(l.writeCtx())
	}
	return l.w.msgids.Claim(l.writeCtx(), m.body.PlatformMsgID, m.ref())
}

// duplicate reports whether m repeats a platform message already
// incorporated under another inbox seq (a platform retry that reached the
// inbox again after the stream's de-duplication window, or in another inbox
// stream after its partition moved: the record names the stream, since two
// streams use the same seqs). It claims the id for
// m otherwise: the worker, not the ingress, writes the msgids record, in one
// round trip (a create, and a read only when the id is taken). The ingress
// reads the record while it publishes, so a retry that comes after the
// message was incorporated (beyond the stream's window) is answered there as
// a duplicate of the first seq, but its copy is stored all the same; that
// copy, and one that comes before the message was incorporated, are found
// here and not run.
func (l *lane) duplicate(m inboxMsg) (bool, error) {
	id := m.body.PlatformMsgID
	if id == "" {
		return false, nil
	}
	w := l.w
	owner, err := l.claimMsgID(m)
	if err != nil {
		l.log.Warn("record message id", slog.Any("error", err))
		return false, err
	}
	if owner.Same(m.ref()) {
		return false, nil
	}
	l.log.Info("duplicate platform message not run", slog.String("platform_msg_id", id), slog.Uint64("seq", m.seq),
		slog.Uint64("first_seq", owner.Seq), slog.String("first_inbox_id", owner.Inbox))
	w.event("duplicate", l.lane, map[string]any{"seq": m.seq, "first_seq": owner.Seq, "first_inbox_id": owner.Inbox, "platform_msg_id": id})
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
	owner, found, err := l.w.msgids.Find(context.WithoutCancel(ctx), id)
	return err == nil && found && !owner.Same(m.ref())
}
