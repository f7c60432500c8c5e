package worker

import (
	"context"
	"strings"

	"github.com/agentfleet/agentfleet/session"
)

// step is the next unit of lane work: a turn of plain messages, one /queue
// item, or one command.
type step struct {
	kind string
	msgs []inboxMsg
}

// nextStep reads the next unit of work above the committed seq: a maximal run
// of plain messages (capped), or one /queue item, or one command.
func (l *lane) nextStep(ctx context.Context) (*step, error) {
	if !l.mayHaveAfter(l.entry.CommittedSeq) {
		return nil, nil
	}
	blind := l.blind.Swap(false)
	if !blind {
		l.awaitHint(l.entry.CommittedSeq)
	}
	first, err := l.peek(ctx, l.entry.CommittedSeq+1)
	if err != nil || first == nil {
		if err != nil && blind {
			l.blind.Store(true)
		}
		return nil, err
	}
	l.heard(first.seq)
	st := &step{kind: first.kind, msgs: []inboxMsg{*first}}
	if first.kind == session.KindQueue && l.resetAhead(ctx, first.seq) {
		st.kind = kindDiscard
		return st, nil
	}
	if first.kind != session.KindMessage || l.busyMode() == BusyQueue {
		// In queue mode every plain message is its own turn, FIFO, as a
		// /queue item is: nothing merges them.
		return st, nil
	}
	size := len(first.body.Text)
	last := first.seq
	for len(st.msgs) < l.w.cfg.MaxTurnMessages {
		if !blind && !l.mayHaveAfter(last) {
			break
		}
		next, err := l.peek(ctx, last+1)
		if err != nil {
			return nil, err
		}
		if next == nil || next.kind != session.KindMessage || size+len(next.body.Text) > l.w.cfg.MaxTurnBytes {
			break
		}
		st.msgs = append(st.msgs, *next)
		size += len(next.body.Text)
		last = next.seq
	}
	return st, nil
}

// kindDiscard is the step of a /queue item that a later /new or /reset
// discards.
const kindDiscard = "discard"

// resetAhead reports whether a /new or /reset waits in the inbox after seq
// with only /queue items between: those queued items are discarded, as the
// seed's /new clears the queue. The fleet's own wake-ups and /status, which
// change nothing, do not count as between.
func (l *lane) resetAhead(ctx context.Context, seq uint64) bool {
	next := seq + 1
	for i := 0; i < 256; i++ {
		m, err := l.peek(ctx, next)
		if err != nil || m == nil {
			return false
		}
		switch {
		case resetsSession(m):
			return true
		case transparent(m):
		case m.kind != session.KindQueue:
			return false
		}
		next = m.seq + 1
	}
	return false
}

// resetsSession reports whether m is a /reset, or a /new that will start a
// new session (one whose title is refused changes nothing).
func resetsSession(m *inboxMsg) bool {
	if m.kind != session.KindCommand {
		return false
	}
	switch m.body.Command {
	case session.CmdReset:
		return true
	case session.CmdNew:
		args := strings.TrimSpace(m.body.Args)
		if args == "" {
			return true
		}
		_, err := session.SanitizeTitle(args)
		return err == nil
	}
	return false
}

// transparent reports whether m changes nothing a busy check or a queue
// discard looks at: the fleet's own wake-ups (a handover or a sweep may put
// them anywhere) and /status.
func transparent(m *inboxMsg) bool {
	return m.kind == session.KindInternal || m.kind == session.KindCommand && session.ReadOnlyCommand(m.body.Command)
}
