package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
)

// runCommand records a command's intent and runs it. Commands travel through
// the lane inbox, so they are ordered with the messages around them; each
// answers the user with a short notice.
func (l *lane) runCommand(m inboxMsg) error {
	w := l.w
	// A platform retry of a command is not applied twice (an /undo undoing
	// two turns).
	if dup, err := l.duplicate(m); err != nil {
		return l.failed(err)
	} else if dup {
		return l.commit(m.seq)
	}
	if session.ReadOnlyCommand(m.body.Command) && l.entry.SessionID != "" {
		// Answered at once while a turn ran: its answer is in the
		// transcript; republish it (same Msg-Id) and move on.
		st, err := l.txFor(l.entry.SessionID)
		if err != nil {
			return l.failed(err)
		}
		if e, ok := findEntry(st, answerID(m.seq)); ok {
			if err := l.publishReply(st, &session.TurnIntent{ID: e.TurnID}, *e, session.ReplyKindNotice, sourceOf(l.entry, []inboxMsg{m})); err != nil {
				return l.failed(err)
			}
			return l.commit(m.seq)
		}
	}
	now := w.cfg.Now()
	intent := &session.TurnIntent{
		ID: newID(), FirstSeq: m.seq, LastSeq: m.seq, InboxID: l.inbox().ID, Kind: session.KindCommand, Attempt: 1,
		SessionID: l.entry.SessionID, Owner: w.owner, Epoch: l.lease.Epoch, StartedAt: now,
	}
	cmd := m.body.Command
	args := strings.TrimSpace(m.body.Args)
	title, titleErr := "", error(nil)
	if cmd == session.CmdNew && args != "" {
		title, titleErr = session.SanitizeTitle(args)
	}
	// A /new whose title is refused changes nothing (unless the lane has
	// no session yet).
	reset := intent.SessionID == "" || cmd == session.CmdNew && titleErr == nil || cmd == session.CmdReset
	var resumeTarget *kv.IndexRecord
	if cmd == session.CmdResume && args != "" {
		target := l.resumeTarget(args)
		rec, err := w.store.LookupIndex(context.WithoutCancel(l.ctx), target)
		switch {
		case err == nil && rec.Lane == l.lane && target != l.entry.SessionID:
			resumeTarget = rec
			intent.SessionID = target
			intent.PreviousSessionID = l.entry.SessionID
			intent.ResetReason = session.ReasonResume
		case err == nil && rec.Lane != l.lane:
			// Another lane's session is forked into a new session of this
			// lane, so one transcript subject is only ever written by one lane.
			intent.SessionID = session.NewSessionID(now)
			intent.PreviousSessionID = l.entry.SessionID
			intent.ResetReason = session.ReasonFork
			intent.ForkFrom = target
			if err := w.store.Index(context.WithoutCancel(l.ctx), intent.SessionID, indexRecord(l.lane, l.entry.SessionKey, now, target)); err != nil {
				return l.failed(err)
			}
		}
	}
	if reset {
		intent.SessionID = session.NewSessionID(now)
		if l.entry.SessionID != "" {
			intent.PreviousSessionID = l.entry.SessionID
		}
		switch cmd {
		case session.CmdNew:
			intent.ResetReason = session.ReasonNew
		case session.CmdReset:
			intent.ResetReason = session.ReasonReset
		}
		rec := indexRecord(l.lane, l.entry.SessionKey, now, intent.PreviousSessionID)
		if cmd == session.CmdNew && title != "" {
			rec.Title = l.nextTitle(title, "")
		}
		if err := w.store.Index(context.WithoutCancel(l.ctx), intent.SessionID, rec); err != nil {
			return l.failed(err)
		}
	}
	src := sourceOf(l.entry, []inboxMsg{m})
	err := l.mutate(func(e *session.SessionEntry) (*session.SessionEntry, error) {
		e.Turn = intent
		if reset {
			e.StartSession(intent.SessionID, intent.ResetReason, now)
		}
		if intent.ForkFrom != "" {
			e.StartSession(intent.SessionID, session.ReasonFork, now)
			e.ParentSessionID = intent.ForkFrom
		}
		if resumeTarget != nil {
			e.StartSession(intent.SessionID, session.ReasonResume, now)
			e.CreatedAt = resumeTarget.CreatedAt
			e.ParentSessionID = resumeTarget.ParentSessionID
		}
		if e.SessionKey == "" {
			e.SessionKey = m.body.SessionKey
		}
		if e.Origin == nil {
			e.SetOrigin(src)
		}
		return e, nil
	}, true)
	if err != nil {
		return l.failed(err)
	}
	return l.runCommandIntent(intent, []inboxMsg{m})
}

// runCommandIntent executes a recorded command intent; it is idempotent, so
// recovery simply runs it again.
func (l *lane) runCommandIntent(intent *session.TurnIntent, msgs []inboxMsg) error {
	if len(msgs) == 0 {
		// The message is gone (pruned): nothing to do but commit.
		return l.commitTurn(intent, StatusCommand, nil, nil)
	}
	m := msgs[0]
	src := sourceOf(l.entry, msgs)
	st, err := l.txFor(intent.SessionID)
	if err != nil {
		return l.failed(err)
	}
	if intent.PreviousSessionID != "" {
		if err := l.closeOld(intent); err != nil {
			return l.failed(err)
		}
	}
	if intent.ForkFrom != "" {
		if err := l.copyFork(st, intent); err != nil {
			l.log.Warn("fork session", slog.String("from", intent.ForkFrom), slog.Any("error", err))
			return l.failed(err)
		}
	}
	text, apply, follow := l.commandEffect(st, intent, m)
	if follow != nil {
		// /retry: the rewind is stored; run the rewound text as a turn.
		if err := l.emitNotice(st, intent, intent.ID+":notice:0", text, src); err != nil {
			return l.failed(err)
		}
		// The intent stays a command in the entry (recovery finds the
		// stored rewind and counts the attempt, see recoverRetry): the turn
		// runs on a copy, since the entry may hold this very intent. A
		// resumed attempt records its agent start like any turn's.
		run := intent.Clone()
		run.Kind = session.KindMessage
		return l.execute(run, []inboxMsg{*follow}, run.Attempt > 1)
	}
	if text != "" {
		if err := l.emitNotice(st, intent, intent.ID+":notice:0", text, src); err != nil {
			return l.failed(err)
		}
	}
	return l.finish(st, intent, StatusCommand, nil, apply)
}

// commandEffect computes a command's notice and its effect on the entry
// (applied in the commit CAS).
func (l *lane) commandEffect(st *txState, intent *session.TurnIntent, m inboxMsg) (string, func(*session.SessionEntry), *inboxMsg) {
	e := l.entry
	args := strings.TrimSpace(m.body.Args)
	switch m.body.Command {
	case session.CmdStop:
		return "⏹ Stopped. Your next message starts a fresh session.", func(e *session.SessionEntry) { e.Suspended = true }, nil
	case session.CmdNew, session.CmdReset:
		_, titleErr := session.SanitizeTitle(args)
		if m.body.Command == session.CmdNew && args != "" && titleErr != nil && intent.ResetReason != session.ReasonNew {
			return "⚠️ No new session: " + titleErr.Error() + ".", nil, nil
		}
		text := "✨ Started a new session (" + intent.SessionID + ")."
		if m.body.Command == session.CmdNew && args != "" && titleErr == nil {
			title := args
			if rec, err := l.w.store.LookupIndex(context.WithoutCancel(l.ctx), intent.SessionID); err == nil && rec.Title != "" {
				title = rec.Title // numbered in its lineage
			}
			text = fmt.Sprintf("✨ Started a new session %q (%s).", title, intent.SessionID)
		}
		if n := e.DiscardedQueue; n > 0 {
			text += fmt.Sprintf(" Discarded %d queued message(s).", n)
		}
		return text, func(e *session.SessionEntry) {
			e.DiscardedQueue = 0
			e.IsFreshReset = true // consumed by the first turn of the new session
		}, nil
	case session.CmdSuspend:
		return "", func(e *session.SessionEntry) { e.Suspended = true }, nil
	case session.CmdResumePending:
		reason := args
		if reason == "" {
			reason = ResumeRestartInterrupted
		}
		return "", func(e *session.SessionEntry) { e.MarkResumePending(reason, l.w.cfg.Now()) }, nil
	case session.CmdBusy:
		switch args {
		case BusyInterrupt, BusyQueue, BusySteer:
			return "Busy mode set to " + args + ".", func(e *session.SessionEntry) { e.BusyMode = args }, nil
		case "":
			return "Busy mode is " + l.busyMode() + ". Use /busy interrupt|queue|steer to change it.", nil, nil
		default:
			return fmt.Sprintf("Unknown busy mode %q. Use /busy interrupt|queue|steer.", args), nil, nil
		}
	case session.CmdStatus, session.CmdHelp:
		return l.readOnlyText(e, m), nil, nil
	case session.CmdTitle:
		return l.setTitle(e, args), nil, nil
	case session.CmdQueue:
		return "Usage: /queue <text> queues a message that gets its own turn.", nil, nil
	case session.CmdUndo, session.CmdRetry:
		n := 1
		if m.body.Command == session.CmdUndo && args != "" {
			v, err := strconv.Atoi(args)
			if err != nil || v < 1 {
				return "Usage: /undo [n] with n ≥ 1.", nil, nil
			}
			n = v
		}
		var turns int
		var target string
		if done, ok := findEntry(st, intent.ID+":rewind"); ok {
			// Recovery of this very command: the rewind is already stored.
			turns, target = rewoundSummary(st, done)
		} else {
			var ctl *transcript.Entry
			ctl, turns, target = transcript.RewindUserTurns(st.entries, n)
			if ctl == nil {
				if m.body.Command == session.CmdRetry {
					return "Nothing to retry.", nil, nil
				}
				return "Nothing to undo.", nil, nil
			}
			ctl.ID = intent.ID + ":rewind"
			ctl.TurnID = intent.ID
			if err := l.append(st, ctl); err != nil {
				return "Could not rewind: " + err.Error(), nil, nil
			}
		}
		if m.body.Command == session.CmdRetry {
			follow := m
			follow.body.Text = target
			follow.kind = session.KindMessage
			return "🔁 Retrying your last message.", nil, &follow
		}
		return fmt.Sprintf("↩️ Undid %d turn(s).", turns), nil, nil
	case session.CmdResume:
		if intent.ResetReason == session.ReasonFork {
			return fmt.Sprintf("Forked session %s (from another conversation) into a new session %s.", intent.ForkFrom, intent.SessionID), nil, nil
		}
		if intent.ResetReason == session.ReasonResume {
			return "Resumed session " + intent.SessionID + ".", nil, nil
		}
		if args != "" && e.SessionID != "" && l.resumeTarget(args) == e.SessionID {
			// The current session: after a /stop or a dead letter it is
			// suspended, and resuming it means carrying on in it.
			if e.Suspended {
				return "Resumed session " + e.SessionID + ".", func(e *session.SessionEntry) { e.Suspended = false }, nil
			}
			return "You are already in session " + e.SessionID + ".", nil, nil
		}
		return l.lineage(args), nil, nil
	}
	return "Unknown command.", nil, nil
}

// namedSession is one entry of the /resume list.
type namedSession struct {
	id, title string
	created   time.Time
	ended     bool // known from the state database
}

// namedSessions lists the lane's other sessions that have a title, newest
// first: the list /resume shows and /resume N picks from.
func (l *lane) namedSessions() []namedSession {
	var out []namedSession
	for _, sid := range l.entry.RecentSessions {
		if sid == l.entry.SessionID {
			continue
		}
		rec, err := l.w.store.LookupIndex(context.WithoutCancel(l.ctx), sid)
		if err != nil || rec.Lane != l.lane || rec.Title == "" {
			continue
		}
		out = append(out, namedSession{id: sid, title: rec.Title, created: rec.CreatedAt})
	}
	return l.withStateDB(out)
}

// resumeTarget resolves the argument of /resume to a session id: N picks
// the N-th of the named sessions /resume lists; a session id stands for
// itself; anything else is a title, the newest session of this lane's
// lineage that has it. It returns "" for a number outside the list, and
// the argument itself when nothing matches.
func (l *lane) resumeTarget(args string) string {
	if n, err := strconv.Atoi(args); err == nil {
		named := l.namedSessions()
		if n < 1 || n > len(named) {
			return ""
		}
		return named[n-1].id
	}
	if session.ValidSessionID(args) {
		return args
	}
	if t, err := session.SanitizeTitle(args); err == nil {
		args = t
	}
	return l.findTitle(args)
}

// lineage is the /resume list: the lane's named sessions, numbered, newest
// first, without the current one.
func (l *lane) lineage(asked string) string {
	var b strings.Builder
	if asked != "" {
		if _, err := strconv.Atoi(asked); err == nil {
			fmt.Fprintf(&b, "No session number %s in the list.\n", asked)
		} else {
			fmt.Fprintf(&b, "No session %q in this conversation.\n", asked)
		}
	}
	named := l.namedSessions()
	if len(named) == 0 {
		b.WriteString("No other named session in this conversation. Name the current one with /title NAME.")
		return b.String()
	}
	b.WriteString("Named sessions of this conversation:\n")
	for i, n := range named {
		ended := ""
		if n.ended {
			ended = ", ended"
		}
		fmt.Fprintf(&b, "%d. %s (%s, %s%s)\n", i+1, n.title, n.id, n.created.Format(time.RFC3339), ended)
	}
	b.WriteString("Use /resume N to switch to one (or /resume <id or title>).")
	return b.String()
}

// readOnlyText is the answer of /status or /help.
func (l *lane) readOnlyText(e *session.SessionEntry, m inboxMsg) string {
	if m.body.Command == session.CmdHelp {
		return helpText
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Session %s\n", e.SessionID)
	if rec, err := l.w.store.LookupIndex(context.WithoutCancel(l.ctx), e.SessionID); err == nil && rec.Title != "" {
		fmt.Fprintf(&b, "Title: %s\n", rec.Title)
	}
	if !e.CreatedAt.IsZero() {
		fmt.Fprintf(&b, "Age: %s\n", l.w.cfg.Now().Sub(e.CreatedAt).Round(time.Second))
	}
	fmt.Fprintf(&b, "Tokens: %d (in %d, out %d)\n", e.TotalTokens, e.InputTokens, e.OutputTokens)
	mode := l.w.cfg.BusyMode
	if e.BusyMode != "" {
		mode = e.BusyMode
	}
	fmt.Fprintf(&b, "Busy mode: %s\n", mode)
	if t := e.Turn; t != nil && t.Kind != session.KindCommand {
		fmt.Fprintf(&b, "Running: a turn since %s\n", t.StartedAt.Format(time.RFC3339))
	}
	fmt.Fprintf(&b, "Queue depth: %d\n", l.queueDepth(m.seq))
	fmt.Fprintf(&b, "Worker: %s\n", l.w.owner)
	var flags []string
	if e.Suspended {
		flags = append(flags, "suspended")
	}
	if e.ResumePending {
		flags = append(flags, "resume_pending("+e.ResumeReason+")")
	}
	if e.InterruptedTurns > 0 {
		flags = append(flags, "interrupted_turns="+strconv.Itoa(e.InterruptedTurns))
	}
	if len(flags) == 0 {
		flags = append(flags, "none")
	}
	fmt.Fprintf(&b, "Flags: %s", strings.Join(flags, ", "))
	return b.String()
}

// helpText is the answer of /help.
const helpText = `Commands:
/new [title] — start a new session (optionally titled)
/reset — start a new session
/stop — stop the running turn; the next message starts a fresh session
/status — this session's state (answered at once, even during a turn)
/help — this list
/title [name] — show or set this session's title
/resume [N|id|title] — list the named sessions, or switch to one
/undo [n] — forget the last n turns
/retry — run your last message again
/queue <text> — queue a message as its own turn
/busy [interrupt|queue|steer] — what a message sent during a turn does`

// setTitle shows (args empty) or sets the current session's title: the
// name is sanitized (control and invisible characters dropped, white space
// collapsed, at most session.MaxTitleLength characters), and when another
// session of this lane already has it, it takes the next number of that
// title's lineage ("Project #2"), so titles stay unique.
func (l *lane) setTitle(e *session.SessionEntry, args string) string {
	ctx := context.WithoutCancel(l.ctx)
	if args == "" {
		if rec, err := l.w.store.LookupIndex(ctx, e.SessionID); err == nil && rec.Title != "" {
			return fmt.Sprintf("Session %s\nTitle: %s", e.SessionID, rec.Title)
		}
		return fmt.Sprintf("Session %s has no title. Set one with /title NAME.", e.SessionID)
	}
	title, err := session.SanitizeTitle(args)
	if err != nil {
		return "⚠️ Title not set: " + err.Error() + "."
	}
	final := l.nextTitle(title, e.SessionID)
	err = l.w.store.SetTitle(ctx, e.SessionID, final)
	if errors.Is(err, kv.ErrNotFound) {
		rec := indexRecord(l.lane, e.SessionKey, e.CreatedAt, e.ParentSessionID)
		rec.Title = final
		err = l.w.store.Index(ctx, e.SessionID, rec)
	}
	if err != nil {
		return "Could not set the title: " + err.Error()
	}
	l.titleEvent(e.SessionID, final)
	if final != title {
		return fmt.Sprintf("✏️ Session title set: %s (%q is already the title of another session here).", final, title)
	}
	return "✏️ Session title set: " + final
}

// queueDepth counts /queue items waiting in the inbox after seq.
func (l *lane) queueDepth(after uint64) int {
	n := 0
	seq := after + 1
	for i := 0; i < 1000; i++ {
		m, err := l.peek(l.ctx, seq)
		if err != nil || m == nil {
			break
		}
		if m.kind == session.KindQueue {
			n++
		}
		seq = m.seq + 1
	}
	return n
}

// rewoundSummary recounts a stored rewind: the user turns it covers and the
// text of the earliest one.
func rewoundSummary(st *txState, ctl *transcript.Entry) (int, string) {
	covered := map[uint64]bool{}
	for _, s := range ctl.Rewound {
		covered[s] = true
	}
	turns, target := 0, ""
	for _, e := range st.entries {
		if covered[e.Seq] && e.Kind == transcript.KindMessage && e.Role == "user" {
			if turns == 0 {
				target = e.Content
			}
			turns++
		}
	}
	return turns, target
}

// copyFork copies the effective conversation of the forked session into the
// new session's transcript, each entry once.
func (l *lane) copyFork(st *txState, intent *session.TurnIntent) error {
	src, _, err := l.w.tx.Load(context.WithoutCancel(l.ctx), intent.ForkFrom)
	if err != nil {
		return err
	}
	for i, e := range transcript.Effective(src) {
		id := fmt.Sprintf("%s:fork:%d", intent.ID, i)
		if st.ids[id] {
			continue
		}
		c := e
		c.ID, c.Seq, c.InboxSeq, c.TurnID = id, 0, 0, intent.ID
		if err := l.append(st, &c); err != nil {
			return err
		}
	}
	return nil
}

// findTitle resolves a session title to the newest session of this lane
// in its lineage: "Project" finds the newest of "Project", "Project #2",
// "Project #3"...; "Project #2" finds that one. The current session comes
// first, then the recent ones, newest first. It returns the title itself
// when none matches.
func (l *lane) findTitle(title string) string {
	base, n := titleBase(title)
	exact := strings.HasSuffix(strings.TrimSpace(title), "#"+strconv.Itoa(n))
	for _, sid := range append([]string{l.entry.SessionID}, l.entry.RecentSessions...) {
		rec, err := l.w.store.LookupIndex(context.WithoutCancel(l.ctx), sid)
		if err != nil || rec.Lane != l.lane || rec.Title == "" {
			continue
		}
		b, m := titleBase(rec.Title)
		if strings.EqualFold(b, base) && (!exact || m == n) {
			return sid
		}
	}
	if sid := l.titleFromStateDB(title); sid != "" {
		return sid
	}
	return title
}

// nextTitle is the title a /new or /title gets: the one asked for, or when
// this lane's sessions (but except) already carry it, the next number in
// its lineage ("Project #2", "Project #3"...).
func (l *lane) nextTitle(title, except string) string {
	if title == "" {
		return ""
	}
	base, n := titleBase(title)
	highest, taken := 0, false
	for _, sid := range append([]string{l.entry.SessionID}, l.entry.RecentSessions...) {
		if sid == except {
			continue
		}
		rec, err := l.w.store.LookupIndex(context.WithoutCancel(l.ctx), sid)
		if err != nil || rec.Lane != l.lane || rec.Title == "" {
			continue
		}
		if b, m := titleBase(rec.Title); strings.EqualFold(b, base) {
			highest = max(highest, m)
			taken = taken || m == n
		}
	}
	if !taken {
		return title
	}
	return fmt.Sprintf("%s #%d", base, highest+1)
}

// titleBase splits a title into its lineage name and number: "Project #3"
// is ("Project", 3), "Project" and "Project #1" are ("Project", 1).
func titleBase(title string) (string, int) {
	t := strings.TrimSpace(title)
	if i := strings.LastIndex(t, " #"); i > 0 {
		if n, err := strconv.Atoi(t[i+2:]); err == nil && n >= 1 {
			return strings.TrimSpace(t[:i]), n
		}
	}
	return t, 1
}
