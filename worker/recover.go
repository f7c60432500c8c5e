package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/telemetry"
	"github.com/agentfleet/agentfleet/transcript"
)

// MaxInterruptedTurns is how many interrupted attempts in a row suspend a
// lane and dead-letter the turn.
const MaxInterruptedTurns = 3

// Resume reasons.
const (
	ResumeRestartInterrupted = "restart_interrupted"
	ResumeRestartTimeout     = "restart_timeout"
	ResumeShutdownTimeout    = "shutdown_timeout"
)

// User-facing copy.
const (
	noticeDeadLetter = "This session was interrupted repeatedly during restart recovery, so I started a fresh session to avoid getting stuck. Use /resume if you want the old transcript."
	noticeIdle       = "◐ Session automatically reset after a period of inactivity. Use /resume to return to the previous conversation."
	noticeDaily      = "◐ Session automatically reset (daily reset). Use /resume to return to the previous conversation."
	noticeSuspended  = "◐ Session automatically reset (the previous session was stopped or interrupted). Use /resume to return to it."
	// Drain banners, sent only when no other worker can take the turn over.
	bannerRestart  = "♻️ Restarting — your current task was interrupted and will resume automatically in this chat once I'm back."
	bannerShutdown = "⏹ Shutting down — your current task was interrupted. It will resume automatically when the service is back."
)

func indexRecord(lane, key string, now time.Time, parent string) kv.IndexRecord {
	return kv.IndexRecord{Lane: lane, SessionKey: key, CreatedAt: now, ParentSessionID: parent}
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

// resumeNote is the restart-resume system note of the resume spec, with the
// interruption named by its reason (a drain of a restart, a drain of a
// shutdown, or a crash). It subsumes the tool-tail note: it tells the agent
// to process unfinished tool results first.
func resumeNote(reason string) string {
	cause := "a gateway crash"
	switch reason {
	case ResumeRestartTimeout:
		cause = "a gateway restart"
	case ResumeShutdownTimeout:
		cause = "a gateway shutdown"
	}
	return "[System note: Your previous turn in this same session was interrupted by " + cause +
		". Continue from the existing transcript. If there are unfinished tool results, process them first, " +
		"summarize what was accomplished, then answer the user's new message.]"
}

// isResumeNote reports whether a note is a restart-resume note.
func isResumeNote(n string) bool {
	return strings.HasPrefix(n, "[System note: Your previous turn in this same session was interrupted by ")
}

// toolTailNote is the note for a transcript that ends in a tool result: the
// previous turn stopped before the agent answered what its tools returned.
// It must be judged before the new turn's user entries are appended.
func toolTailNote(st *txState) string {
	if st.lastRole() == "tool" {
		return "[System note: Your previous turn ended while processing tool results. Finish processing the interrupted tool results before addressing the new user message.]"
	}
	return ""
}

// autoResumeReasons are the resume reasons whose sessions are resumed
// without waiting for the user (the seed's _AUTO_RESUME_REASONS).
func autoResumeReason(reason string) bool {
	switch reason {
	case ResumeRestartInterrupted, ResumeRestartTimeout, ResumeShutdownTimeout:
		return true
	}
	return false
}

// decisionNotes are the system notes and user notices a session decision
// requires (seed §6 "Reset Effects").
//
// The notice of an automatic reset is gated as the seed's gateway gates it
// (see session.ResetConfig.NotifyReset): an idle or daily reset of a session
// that had no activity says nothing, a suspended reset always tells the
// user, and platforms in notify_exclude_platforms are never told.
func (l *lane) decisionNotes(dec session.Decision, policy session.ResetPolicy, platform session.Platform) (notes, notices []string) {
	if dec.KeptForResume {
		notes = append(notes, resumeNote(l.entry.ResumeReason))
	}
	hadActivity := l.entry != nil && l.entry.TotalTokens > 0
	notify := l.w.cfg.Reset.NotifyReset(policy, dec.Reason, hadActivity, platform)
	switch dec.Reason {
	case session.ReasonIdle:
		notes = append(notes, "[System note: The previous session expired due to inactivity; this is a fresh session.]")
		if notify {
			notices = append(notices, noticeIdle)
		}
	case session.ReasonDaily:
		notes = append(notes, "[System note: The previous session ended at the daily reset; this is a fresh session.]")
		if notify {
			notices = append(notices, noticeDaily)
		}
	case session.ReasonSuspended:
		notes = append(notes, "[System note: The previous session was stopped or interrupted; this is a fresh session.]")
		if notify {
			notices = append(notices, noticeSuspended)
		}
	}
	return notes, notices
}

// recoverTurn handles a lane whose previous owner left a turn in flight.
func (l *lane) recoverTurn() error {
	w := l.w
	t := l.entry.Turn.Clone()
	// The recovery's lines are lines of the interrupted turn: they carry
	// its session and turn ids and the trace of its latest attempt, until
	// the resumed attempt (execute) names its own span.
	l.logScope.Set(telemetry.TurnAttrs(t.SessionID, t.ID, telemetry.ParseTraceParent(t.TraceParent))...)
	defer l.logScope.Clear()
	w.stats.Recoveries.Add(1)
	w.cfg.Metrics.LeaseTakeover(context.Background())
	st, err := l.txFor(t.SessionID)
	if err != nil {
		l.log.Warn("load transcript for recovery", slog.Any("error", err))
		return l.failed(err)
	}
	// A turn recorded in another incarnation of the inbox stream than
	// the one the lane is read from now (the stream was deleted and made
	// again while the turn was in flight): its messages went with the old
	// stream, and its seqs name other messages in the new one. None is read
	// or settled by them (see endGoneTurn).
	gone := l.entry.TurnInboxID() != l.inbox().ID
	var msgs []inboxMsg
	if !gone {
		if msgs, err = l.readRange(t.FirstSeq, t.LastSeq); err != nil {
			l.log.Warn("read turn range", slog.Any("error", err))
			return l.failed(err)
		}
	}
	src := sourceOf(l.entry, msgs)
	if err := l.republishInterim(st, t, src); err != nil {
		return l.failed(err)
	}

	// The turn finished before the crash: republish its outputs, commit.
	if status, ended := transcript.TurnEnded(st.entries, t.ID); ended || st.ids[t.ID+":reply"] {
		for _, e := range st.entries {
			if e.TurnID != t.ID {
				continue
			}
			switch {
			case e.Kind == transcript.KindNotice:
				if err := l.publishReply(st, t, e, session.ReplyKindNotice, src); err != nil {
					return l.failed(err)
				}
			case e.ID == t.ID+":reply":
				if err := l.publishReply(st, t, e, session.ReplyKindReply, src); err != nil {
					return l.failed(err)
				}
			}
		}
		if !ended {
			status = StatusCompleted
		}
		return l.finish(st, t, status, nil, l.endedEffect(st, t, status, msgs))
	}
	if gone && t.Kind != session.KindCommand {
		return l.endGoneTurn(st, t, src)
	}
	if t.Kind == session.KindCommand {
		if len(msgs) > 0 && msgs[0].body.Command == session.CmdRetry {
			// /retry runs the agent: its attempts count like a turn's.
			return l.recoverRetry(st, t, msgs, src)
		}
		// Commands are idempotent: run them again, not counted.
		return l.runCommandIntent(t, msgs)
	}

	// A /stop, /new or /reset already waiting cancels the resume: the turn
	// commits as stopped (its messages recorded), and the command follows.
	if l.cancelAhead(t.LastSeq) {
		for _, m := range msgs {
			if st.hasUser(l.inbox(), m.seq) {
				continue
			}
			e := userEntry(t.ID, m, w.cfg.Now())
			if err := l.append(st, &e); err != nil {
				return l.failed(err)
			}
		}
		l.log.Info("resume cancelled by a command already in the inbox")
		return l.finish(st, t, StatusStopped, nil, nil)
	}

	reason := l.resumeReason()
	// A store hiccup (e.g. while the cluster recovers from a lost node) must
	// not dead-letter a message: see interruptedCount.
	interrupted := l.interruptedCount(t)
	if interrupted == l.entry.InterruptedTurns {
		l.log.Info("previous attempt ended by a failed write, not a crash; not counted", slog.Int("attempt", t.Attempt), slog.Int("interrupted_turns", interrupted))
	}
	if interrupted >= MaxInterruptedTurns {
		return l.deadLetter(st, t, msgs, src, interrupted)
	}
	// An interruption older than the freshness window is not run again by
	// itself: the session is kept, resume pending, and the user's next
	// message continues it with the note.
	if at := interruptedAt(st, t, l.entry); !session.ResumeFresh(&at, w.cfg.Now(), w.cfg.Freshness) {
		return l.parkStale(st, t, msgs, reason, at, interrupted)
	}
	if interrupted == MaxInterruptedTurns-1 {
		// The last chance: run alone, so that if this process dies now the
		// turn is the one to blame, and no neighbour's crash can spend it.
		// The gate is taken before the attempt is recorded: a crash while
		// waiting for it does not count against this turn. The wait for
		// the running turns is bounded by the lease TTL.
		release, alone, ok := w.turns.acquireAlone(l.ctx, w.cfg.LeaseTTL)
		if !ok {
			return l.failed(nil)
		}
		defer release()
		l.holdsGate = true
		defer func() { l.holdsGate = false }()
		if alone {
			l.log.Info("last attempt of an interrupted turn: running it alone", slog.Int("interrupted_turns", interrupted))
		} else {
			l.log.Warn("last attempt of an interrupted turn: other turns still run after the wait; running it beside them",
				slog.Int("interrupted_turns", interrupted), slog.Duration("waited", w.cfg.LeaseTTL), slog.Int("turns_running", w.turns.inUse()))
		}
	}
	// Retry only the first message of the range, so a poison message
	// dead-letters alone; the rest follow in later turns.
	t.Attempt++
	if t.LastSeq > t.FirstSeq {
		t.RetryFrom = max(t.RetryFrom, t.LastSeq)
	}
	t.LastSeq = t.FirstSeq
	if len(msgs) > 1 {
		msgs = msgs[:1]
	}
	// In interrupt mode, plain messages that reached the inbox while the
	// lane had no live worker join the resumed turn (rather than cut it
	// short): the turn answers them all. Not for a narrowed retry, whose
	// range is followed by messages that are the next turns', nor for the
	// last attempt, which must hold only the suspect so that a poison
	// message dead-letters alone.
	if t.Kind == session.KindMessage && t.RetryFrom <= t.LastSeq && interrupted < MaxInterruptedTurns-1 && l.busyMode() == BusyInterrupt {
		joined, err := l.joinAhead(t.LastSeq, msgs)
		if err != nil {
			l.log.Warn("read the inbox ahead of the resumed turn", slog.Any("error", err))
			return l.failed(err)
		}
		if len(joined) > len(msgs) {
			msgs = joined
			t.LastSeq = msgs[len(msgs)-1].seq
			t.RetryFrom = 0
		}
	}
	t.Notes = append(keepNonResume(t.Notes), resumeNote(reason))
	if done, err := l.recordAttempt(t, interrupted, func(e *session.SessionEntry) { e.MarkResumePending(reason, w.cfg.Now()) }); done {
		return err
	}
	l.log.Info("resuming interrupted turn", slog.Int("attempt", t.Attempt), slog.String("reason", reason), slog.Int("interrupted_turns", interrupted))
	w.event("resume", l.lane, map[string]any{"turn_id": t.ID, "session_id": t.SessionID, "attempt": t.Attempt, "reason": reason})
	w.cfg.Metrics.TurnResumed(context.Background())
	l.turnEvent("start", t, "")
	return l.execute(t, msgs, true)
}

// endGoneTurn ends an interrupted turn whose inbox messages are gone: its
// seqs count in an incarnation of the inbox stream that the lane is no
// longer read from (the stream was deleted and made again; its new
// incarnation counts from 1). It is not run again, nothing is read by its
// seqs, and none of the new stream's seqs is settled by them: the turn
// ends interrupted with its transcript entries as written, and the commit
// leaves committed_seq, which counts in the new stream since the lane was
// taken there (begin), as it is (see commitTurn). As for any interrupted
// turn (DESIGN §5) the attempt counts, the third in a row suspends the
// lane with the notice (there is nothing left to dead-letter), and the
// session is marked resume_pending from the interruption: the user's next
// message continues it with the resume note, and a fresh marker gets its
// automatic resume, which continues from the transcript.
func (l *lane) endGoneTurn(st *txState, t *session.TurnIntent, src session.SessionSource) error {
	reason := l.resumeReason()
	interrupted := l.interruptedCount(t)
	if interrupted >= MaxInterruptedTurns {
		return l.deadLetter(st, t, nil, src, interrupted)
	}
	at := interruptedAt(st, t, l.entry)
	l.log.Warn("interrupted turn's messages are gone with the inbox stream it was recorded in (deleted and made again); turn ended, not run again",
		slog.String("turn_inbox_id", l.entry.TurnInboxID()), slog.String("inbox_id", l.inbox().ID),
		slog.Uint64("first_seq", t.FirstSeq), slog.Uint64("last_seq", t.LastSeq))
	l.w.event("resume_gone", l.lane, map[string]any{"turn_id": t.ID, "session_id": t.SessionID, "reason": reason,
		"inbox_id": l.entry.TurnInboxID(), "first_seq": t.FirstSeq, "last_seq": t.LastSeq})
	if err := l.endInterrupted(st, t, reason, at, interrupted); err != nil {
		return err
	}
	l.autoCheck = true
	return nil
}

// endInterrupted ends t interrupted without running it again (endGoneTurn,
// parkStale): the commit marks the session resume_pending for reason from
// at and records the interrupted count. The turn_end entry names the
// marker, so that an owner that finds it but not the commit (a crash
// between the two) applies the same (interruptedEffect).
func (l *lane) endInterrupted(st *txState, t *session.TurnIntent, reason string, at time.Time, interrupted int) error {
	updated := l.entry.UpdatedAt
	return l.finishEnd(st, t, StatusInterrupted, nil, func(e *session.SessionEntry) {
		e.MarkResumePending(reason, at)
		e.InterruptedTurns = interrupted
		e.UpdatedAt = updated
	}, nil, func(e *transcript.Entry) {
		e.ResumeReason = reason
		e.InterruptedAt = &at
	})
}

// interruptedEffect is the commit effect of a turn that endInterrupted
// ended, found ended but not committed: the resume marker its turn_end
// names and the interrupted count, as the first commit would have set them
// (the entry is as that owner found it: the count comes out the same). nil
// for any other end (a turn interrupted by the user's next message marks
// nothing). It also has the lane check for an automatic resume.
func (l *lane) interruptedEffect(st *txState, t *session.TurnIntent) func(*session.SessionEntry) {
	var end *transcript.Entry
	for i := len(st.entries) - 1; i >= 0; i-- {
		if e := &st.entries[i]; e.Kind == transcript.KindTurnEnd && e.TurnID == t.ID {
			end = e
			break
		}
	}
	if end == nil || end.Status != StatusInterrupted || end.ResumeReason == "" || end.InterruptedAt == nil {
		return nil
	}
	reason, at := end.ResumeReason, *end.InterruptedAt
	interrupted := l.interruptedCount(t)
	updated := l.entry.UpdatedAt
	l.autoCheck = true
	return func(e *session.SessionEntry) {
		e.MarkResumePending(reason, at)
		e.InterruptedTurns = interrupted
		e.UpdatedAt = updated
	}
}

// recoverRetry resumes an interrupted /retry. Its rewind is stored and is
// not repeated, but its follow-up turn runs the agent on the rewound text,
// which may be the very message that crashed its workers: its interrupted
// attempts count, and at MaxInterruptedTurns the /retry is dead-lettered
// and the lane suspended, as a message turn's would be.
func (l *lane) recoverRetry(st *txState, t *session.TurnIntent, msgs []inboxMsg, src session.SessionSource) error {
	interrupted := l.interruptedCount(t)
	if interrupted >= MaxInterruptedTurns {
		return l.deadLetter(st, t, msgs, src, interrupted)
	}
	t.Attempt++
	if done, err := l.recordAttempt(t, interrupted, nil); done {
		return err
	}
	l.log.Info("resuming interrupted /retry", slog.Int("attempt", t.Attempt), slog.Int("interrupted_turns", interrupted))
	return l.runCommandIntent(t, msgs)
}

// interruptedCount is the lane's interrupted-turn count with t's last
// attempt counted: the first attempt always counts; a resumed one only if
// its agent had started (an attempt that gave up earlier, its store writes
// failing, was not interrupted while running). An attempt this owner
// itself retries in place after a failed write is not counted either: its
// worker did not crash, whatever the attempt had done (see
// retriedInPlace).
func (l *lane) interruptedCount(t *session.TurnIntent) int {
	n := l.entry.InterruptedTurns
	if l.retriedInPlace(t) {
		return n
	}
	if t.Attempt <= 1 || t.AgentStarted >= t.Attempt {
		n++
	}
	return n
}

// recordAttempt records t (its next attempt, owned by this worker) and the
// interrupted count in the entry, with also (when set) applied. done tells
// the caller to return ok: the turn was no longer there (nothing to do) or
// the write failed.
func (l *lane) recordAttempt(t *session.TurnIntent, interrupted int, also func(*session.SessionEntry)) (done bool, err error) {
	t.Owner = l.w.owner
	t.Epoch = l.lease.Epoch
	err = l.mutate(func(e *session.SessionEntry) (*session.SessionEntry, error) {
		if e.Turn == nil || e.Turn.ID != t.ID {
			return nil, kv.ErrNoChange
		}
		e.Turn = t
		e.InterruptedTurns = interrupted
		if also != nil {
			also(e)
		}
		return e, nil
	}, true)
	switch {
	case err == kv.ErrNoChange:
		return true, nil
	case err != nil:
		l.log.Warn("record recovery", slog.Any("error", err))
		return true, l.failed(err)
	}
	return false, nil
}

func keepNonResume(notes []string) []string {
	var out []string
	for _, n := range notes {
		if !isResumeNote(n) {
			out = append(out, n)
		}
	}
	return out
}

// interruptedAt is when an interrupted turn stopped, as well as it is
// known: the latest of its start, its last transcript entry and the resume
// marker a drain set for it.
func interruptedAt(st *txState, t *session.TurnIntent, e *session.SessionEntry) time.Time {
	at := t.StartedAt
	for i := len(st.entries) - 1; i >= 0; i-- {
		if en := st.entries[i]; en.TurnID == t.ID {
			if en.Timestamp.After(at) {
				at = en.Timestamp
			}
			break
		}
	}
	if e.ResumePending && e.LastResumeMarkedAt != nil && e.LastResumeMarkedAt.After(at) {
		at = *e.LastResumeMarkedAt
	}
	return at
}

// parkStale ends an interrupted turn whose interruption is older than the
// freshness window without running it again: its messages are recorded in
// the transcript (nothing accepted is lost), the turn commits as
// interrupted and counted, and the entry stays resume_pending with the
// marker dated from the interruption, so the marker is stale for the reset
// policy and for the automatic resume, and updated_at keeps the time of the
// last real activity. The user's next message continues the session with
// the resume note, unless the policy resets it (session.Decide).
func (l *lane) parkStale(st *txState, t *session.TurnIntent, msgs []inboxMsg, reason string, at time.Time, interrupted int) error {
	for _, m := range msgs {
		if st.hasUser(l.inbox(), m.seq) || m.kind == session.KindInternal {
			continue
		}
		e := userEntry(t.ID, m, l.w.cfg.Now())
		if err := l.append(st, &e); err != nil {
			return l.failed(err)
		}
	}
	l.log.Info("interrupted turn is stale; not resumed until the next message", slog.Time("interrupted_at", at), slog.String("reason", reason))
	l.w.event("resume_stale", l.lane, map[string]any{"turn_id": t.ID, "session_id": t.SessionID, "reason": reason, "interrupted_at": at})
	return l.endInterrupted(st, t, reason, at, interrupted)
}

// joinAhead returns msgs followed by the plain messages that directly
// follow seq in the inbox (the fleet's own wake-ups between them are
// skipped), within the turn caps.
func (l *lane) joinAhead(seq uint64, msgs []inboxMsg) ([]inboxMsg, error) {
	out := msgs
	size := 0
	for _, m := range msgs {
		size += len(m.body.Text)
	}
	for next := seq + 1; len(out) < l.w.cfg.MaxTurnMessages; {
		m, err := l.peek(l.ctx, next)
		if err != nil {
			return nil, err
		}
		if m == nil {
			break
		}
		if m.kind == session.KindInternal && m.body.Command == session.CmdWake {
			next = m.seq + 1
			continue
		}
		if m.kind != session.KindMessage || size+len(m.body.Text) > l.w.cfg.MaxTurnBytes {
			break
		}
		out = append(out[:len(out):len(out)], *m)
		size += len(m.body.Text)
		next = m.seq + 1
	}
	return out, nil
}

// deadLetter suspends the lane after repeated interrupted attempts: the
// turn's messages go to the dead-letter subject with the reason, the user is
// told, and the next message starts a fresh session linked to this one.
func (l *lane) deadLetter(st *txState, t *session.TurnIntent, msgs []inboxMsg, src session.SessionSource, interrupted int) error {
	w := l.w
	reason := fmt.Sprintf("interrupted %d times in a row", interrupted)
	for _, m := range msgs {
		raw, err := l.inbox().Stream.GetMsg(context.WithoutCancel(l.ctx), m.seq)
		if err != nil {
			l.log.Warn("read message to dead-letter", slog.Uint64("seq", m.seq), slog.Any("error", err))
			return l.failed(err)
		}
		dl := nats.NewMsg(w.names.DeadLetterSubject(l.lane))
		dl.Data = raw.Data
		// Only the fleet's own headers travel: the server's (Nats-Expected-
		// Stream and the like) would make the dead-letter stream refuse it.
		for k, v := range raw.Header {
			if strings.HasPrefix(k, "Fleet-") {
				dl.Header[k] = v
			}
		}
		dl.Header.Set(broker.HdrReason, reason)
		dl.Header.Set(broker.HdrInboxSeq, seqString(m.seq))
		dl.Header.Set(broker.HdrSessionID, t.SessionID)
		dl.Header.Set(broker.HdrTurnID, t.ID)
		ctx, cancel := context.WithTimeout(context.WithoutCancel(l.ctx), 5*time.Second)
		_, err = w.js.PublishMsg(ctx, dl, jetstream.WithMsgID(fmt.Sprintf("dlq:%s:%d", l.inbox().ID, m.seq)))
		cancel()
		if err != nil {
			l.log.Warn("dead-letter publish", slog.Any("error", err))
			return l.failed(err)
		}
	}
	if err := l.emitNotice(st, t, t.ID+":deadletter", noticeDeadLetter, src); err != nil {
		return l.failed(err)
	}
	w.stats.DeadLetters.Add(1)
	l.log.Warn("turn dead-lettered; lane suspended", slog.Uint64("first_seq", t.FirstSeq), slog.Uint64("last_seq", t.LastSeq))
	w.event("deadletter", l.lane, map[string]any{"turn_id": t.ID, "session_id": t.SessionID, "first_seq": t.FirstSeq, "last_seq": t.LastSeq, "reason": reason})
	return l.finish(st, t, StatusDeadLetter, nil, suspendDeadLettered)
}

// suspendDeadLettered is the effect of a dead letter on the entry.
func suspendDeadLettered(e *session.SessionEntry) {
	e.Suspended = true
	e.ClearResumePending()
}

// endedEffect is the entry change of a turn whose end is in the transcript
// but whose commit is not: a command's or a dead letter's effect is applied
// in the commit CAS only, so a crash between the two would lose it (the
// lane not suspended after /stop or a dead letter, a /busy not set).
// Command effects are computed again (they are idempotent: a rewind is
// found by its id).
func (l *lane) endedEffect(st *txState, t *session.TurnIntent, status string, msgs []inboxMsg) func(*session.SessionEntry) {
	switch {
	case status == StatusDeadLetter:
		return suspendDeadLettered
	case status == StatusCommand && t.Kind == session.KindCommand && len(msgs) > 0:
		_, apply, _ := l.commandEffect(st, t, msgs[0])
		return apply
	case status == StatusInterrupted:
		return l.interruptedEffect(st, t)
	}
	return nil
}

// readRange reads the lane's inbox messages in [first, last].
func (l *lane) readRange(first, last uint64) ([]inboxMsg, error) {
	var out []inboxMsg
	seq := first
	for seq <= last {
		m, err := l.peek(l.ctx, seq)
		if err != nil {
			return nil, err
		}
		if m == nil || m.seq > last {
			break
		}
		out = append(out, *m)
		seq = m.seq + 1
	}
	return out, nil
}

// cancelAhead reports whether a /stop, /new or /reset waits in the inbox
// after seq.
func (l *lane) cancelAhead(seq uint64) bool {
	next := seq + 1
	for i := 0; i < 256; i++ {
		m, err := l.peek(l.ctx, next)
		if err != nil || m == nil {
			return false
		}
		if m.kind == session.KindCommand && m.body.Command == session.CmdStop || resetsSession(m) {
			return true
		}
		next = m.seq + 1
	}
	return false
}

// resumeReason is the reason an interrupted turn of the lane is resumed
// for: the timeout a drain recorded (restart_timeout, shutdown_timeout) if
// one is pending, else restart_interrupted.
func (l *lane) resumeReason() string {
	if l.entry.ResumePending && (l.entry.ResumeReason == ResumeRestartTimeout || l.entry.ResumeReason == ResumeShutdownTimeout) {
		return l.entry.ResumeReason
	}
	return ResumeRestartInterrupted
}
