package worker

import (
	"context"
	"fmt"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
)

// checkBusy looks at what arrived after the running turn: a /stop stops it;
// in interrupt mode a plain message that directly follows the turn's range
// interrupts a turn of plain messages (it joins the next turn). A /queue item
// or command in between means the next step is not a turn that message could
// join, so nothing is interrupted; /queue turns are never interrupted. A
// second inbox copy of a platform message already incorporated (see
// duplicateCopy), a message or a /stop, interrupts nothing. With mode "" it only looks for a /stop.
func (l *lane) checkBusy(ctx context.Context, cancel context.CancelCauseFunc, intent *session.TurnIntent, mode string, stopCause *error) {
	if *stopCause != nil {
		return
	}
	// The rest of a narrowed retry's first range follows in the next turns;
	// only what lies beyond it is news.
	seq := max(l.turnLastSeq(intent), intent.RetryFrom) + 1
	joinable := intent.Kind == session.KindMessage && mode == BusyInterrupt
	limit := 256
	if mode == "" {
		// The look for a /stop at the start of every turn stays short: a
		// lane with a long backlog must not pay a long scan per turn (a
		// /stop further back stops the turn it reaches).
		limit = 16
	}
	for i := 0; i < limit; i++ {
		if !l.mayHaveAfter(seq - 1) {
			return
		}
		m, err := l.peek(ctx, seq)
		if err != nil || m == nil {
			return
		}
		switch {
		case m.kind == session.KindCommand && m.body.Command == session.CmdStop && l.duplicateCopy(ctx, m):
			// A copy of a /stop already run (it stopped what it was sent
			// for): its own step skips it; it stops nothing here.
		case m.kind == session.KindCommand && m.body.Command == session.CmdStop:
			*stopCause = errStopped
			cancel(errStopped)
			return
		case m.kind == session.KindMessage && joinable && l.duplicateCopy(ctx, m):
			// A second inbox copy of a message already incorporated (its
			// own turn skips it): no news, and interrupting for it would
			// leave this turn's messages without an answer.
		case m.kind == session.KindMessage && joinable:
			*stopCause = agent.ErrTurnInterrupted
			cancel(agent.ErrTurnInterrupted)
			return
		case m.kind == session.KindInternal:
			// A wake-up of the fleet's own (a handover may leave one
			// anywhere) does not change what the user sent.
		case m.kind != session.KindMessage:
			joinable = false
		}
		seq = m.seq + 1
	}
}

// answerReadOnly answers at once, while a turn runs, the commands that only
// report (/status, /help) waiting right after the turn's range: with
// nothing between them and the turn but other such commands and the
// fleet's wake-ups, so an answer never overtakes a message sent before it.
// The turn goes on. The answer is a notice entry of the turn's session with
// the id "answer:<inbox seq>"; when the command's turn comes in inbox order
// it finds that entry and only republishes it (same Msg-Id) and commits.
func (l *lane) answerReadOnly(ctx context.Context, st *txState, intent *session.TurnIntent, stopCause error) {
	if stopCause != nil {
		return
	}
	seq := max(l.turnLastSeq(intent), intent.RetryFrom) + 1
	for i := 0; i < 16; i++ {
		if !l.mayHaveAfter(seq - 1) {
			return
		}
		m, err := l.peek(ctx, seq)
		if err != nil || m == nil {
			return
		}
		switch {
		case m.kind == session.KindInternal && m.body.Command == session.CmdWake:
		case m.kind == session.KindCommand && session.ReadOnlyCommand(m.body.Command):
			if err := l.answerEarly(st, m); err != nil {
				l.log.Warn("answer read-only command", "seq", m.seq, "error", err)
				return
			}
		default:
			return
		}
		seq = m.seq + 1
	}
}

// answerEarly answers one read-only command while a turn runs (once).
func (l *lane) answerEarly(st *txState, m *inboxMsg) error {
	id := answerID(m.seq)
	l.opMu.Lock()
	done := st.ids[id]
	e := l.entry.Clone()
	l.opMu.Unlock()
	if done {
		return nil
	}
	if dup, err := l.duplicate(*m); err != nil || dup {
		return err // a duplicate is committed past in its turn
	}
	text := l.readOnlyText(e, *m)
	en := transcript.Entry{ID: id, Kind: transcript.KindNotice, Role: "system", Content: text, InboxSeq: m.seq, TurnID: id, Timestamp: l.w.cfg.Now()}
	if err := l.append(st, &en); err != nil {
		return err
	}
	// The agent goroutine may be recording steered input (which writes the
	// entry the publish reads): hold the lane's write lock.
	l.opMu.Lock()
	defer l.opMu.Unlock()
	return l.publishReply(st, &session.TurnIntent{ID: id}, en, session.ReplyKindNotice, sourceOf(e, []inboxMsg{*m}))
}

// answerID is the transcript entry id of a read-only command's answer.
func answerID(seq uint64) string { return "answer:" + seqString(seq) }

func (l *lane) busyMode() string {
	if l.entry != nil && l.entry.BusyMode != "" {
		return l.entry.BusyMode
	}
	return l.w.cfg.BusyMode
}

// turnLastSeq is the turn's current last seq (steer input extends it).
func (l *lane) turnLastSeq(intent *session.TurnIntent) uint64 {
	l.opMu.Lock()
	defer l.opMu.Unlock()
	return intent.LastSeq
}

// steer records the plain messages that arrived after the running turn's
// range into the turn (CAS turn.last_seq, then their user entries) and hands
// them to the agent.
func (l *lane) steer(ctx context.Context, st *txState, intent *session.TurnIntent) ([]agent.UserMessage, error) {
	var msgs []inboxMsg
	seq := l.turnLastSeq(intent) + 1
	for len(msgs) < l.w.cfg.MaxTurnMessages {
		m, err := l.peek(ctx, seq)
		if err != nil {
			// Nothing recorded yet: the turn is intact, the messages are
			// the next turn's if the agent does not ask again.
			return nil, fmt.Errorf("%w: %w", errNothingSteered, err)
		}
		if m == nil || m.kind != session.KindMessage {
			break
		}
		msgs = append(msgs, *m)
		seq = m.seq + 1
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	last := msgs[len(msgs)-1].seq
	if err := l.mutate(func(e *session.SessionEntry) (*session.SessionEntry, error) {
		if e.Turn == nil || e.Turn.ID != intent.ID {
			return nil, kv.ErrLeaseLost
		}
		if e.Turn.LastSeq < last {
			e.Turn.LastSeq = last
		}
		return e, nil
	}, true); err != nil {
		return nil, err
	}
	l.opMu.Lock()
	intent.LastSeq = last
	l.opMu.Unlock()
	var out []agent.UserMessage
	for _, m := range msgs {
		if !st.userSeqs[m.seq] {
			if dup, err := l.duplicate(m); err != nil {
				return nil, err
			} else if dup {
				continue
			}
			e := userEntry(intent.ID, m, l.w.cfg.Now())
			if err := l.append(st, &e); err != nil {
				return nil, err
			}
		}
		out = append(out, userMessage(m))
	}
	return out, nil
}
