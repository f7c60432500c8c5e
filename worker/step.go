package worker

import (
	"context"
	"errors"
	"fmt"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/transcript"
	"log/slog"
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
	if first.kind != session.KindMessage {
		return st, nil
	}
	if l.busyMode() == BusyQueue {
		// In queue mode every plain message is its own turn, FIFO, as a
		// /queue item is: nothing merges them but the photos of one album.
		return l.albumStep(ctx, st, blind)
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

// runStep hands one step to its unit: a queue discard (here), a command
// (commands.go), an internal command (internal.go) or a turn (turn.go). An
// error means the step did not complete (settle decides what follows): the
// lane was lost, the worker is stopping, or a write failed; a turn record
// stays for the next attempt or owner.
func (l *lane) runStep(st *step) error {
	switch st.kind {
	case kindDiscard:
		return l.discard(st.msgs[0])
	case session.KindCommand:
		return l.runCommand(st.msgs[0])
	case session.KindInternal:
		return l.runInternal(st.msgs[0])
	default:
		// The platform message ids are claimed while the intent is
		// recorded: both are writes of their own buckets, and the turn
		// needs both before its first append.
		if l.startTurnTrace(st.msgs, "") {
			defer l.endTurnTrace()
		}
		l.msgids = l.prefetchMsgIDs(st.msgs)
		// A claim left unread (the step failed first) needs nothing: its
		// create is idempotent, and the next attempt claims again.
		defer func() { l.msgids = nil }()
		intent, err := l.recordIntent(st)
		if err != nil {
			l.log.Warn("record intent", slog.Any("error", err))
			return l.failed(err)
		}
		return l.execute(intent, st.msgs, false)
	}
}

// discard records a /queue item discarded by a following /new or /reset: a
// transcript note and an event, then the commit past it. The /new notice
// tells the user how many.
func (l *lane) discard(m inboxMsg) error {
	if l.entry.SessionID != "" {
		st, err := l.txFor(l.entry.SessionID)
		if err != nil {
			return l.failed(err)
		}
		id := fmt.Sprintf("discard:%d", m.seq)
		if !st.ids[id] {
			e := transcript.Entry{ID: id, Kind: transcript.KindNotice, Role: "system", Content: "Discarded queued message: " + describeInbound(m.body),
				InboxSeq: m.seq, TurnID: id, Timestamp: l.w.cfg.Now()}
			if err := l.append(st, &e); err != nil {
				return l.failed(err)
			}
		}
	}
	l.w.event("discarded", l.lane, map[string]any{"seq": m.seq, "reason": "reset"})
	err := l.mutate(func(e *session.SessionEntry) (*session.SessionEntry, error) {
		if e.CommittedSeq >= m.seq {
			return nil, kv.ErrNoChange
		}
		e.CommittedSeq = m.seq
		e.DiscardedQueue++
		if e.QueueDepth > 0 {
			e.QueueDepth--
		}
		return e, nil
	}, true)
	if err != nil && !errors.Is(err, kv.ErrNoChange) {
		return l.failed(err)
	}
	l.ackUpTo(l.entry.CommittedSeq)
	return nil
}
