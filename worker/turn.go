package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/telemetry"
	"github.com/agentfleet/agentfleet/transcript"
)

// Turn statuses recorded in turn_end entries.
const (
	StatusCompleted   = transcript.StatusCompleted
	StatusFailed      = transcript.StatusFailed
	StatusInterrupted = transcript.StatusInterrupted
	StatusStopped     = transcript.StatusStopped
	StatusDeadLetter  = transcript.StatusDeadLettered
	StatusCommand     = transcript.StatusCommand
	StatusDuplicate   = transcript.StatusDuplicate
)

// TurnEvent is published on the events stream when a turn starts and ends.
type TurnEvent struct {
	Type      string    `json:"type"` // start or end
	Lane      string    `json:"lane"`
	TurnID    string    `json:"turn_id"`
	SessionID string    `json:"session_id"`
	Owner     string    `json:"owner"`
	Epoch     uint64    `json:"epoch"`
	FirstSeq  uint64    `json:"first_seq"`
	LastSeq   uint64    `json:"last_seq"`
	Attempt   int       `json:"attempt"`
	Status    string    `json:"status,omitempty"`
	At        time.Time `json:"at"`
	// InputTokens and OutputTokens are the usage of an ended turn that ran
	// the agent (the state database adds them to its session).
	InputTokens  int64 `json:"input_tokens,omitempty"`
	OutputTokens int64 `json:"output_tokens,omitempty"`
}

func (l *lane) turnEvent(typ string, t *session.TurnIntent, status string) {
	if typ == "start" {
		l.turnStarted = time.Now()
		l.w.cfg.Metrics.TurnStarted(context.Background())
	} else {
		l.w.cfg.Metrics.TurnEnded(context.Background(), status, l.turnStarted)
	}
	l.w.event("turn", l.lane, TurnEvent{Type: typ, Lane: l.lane, TurnID: t.ID, SessionID: t.SessionID,
		Owner: l.w.owner, Epoch: l.lease.Epoch, FirstSeq: t.FirstSeq, LastSeq: t.LastSeq, Attempt: t.Attempt,
		Status: status, At: time.Now()})
}

// runStep runs one step. It returns false when the lane was lost or the
// worker is stopping without a commit (the turn record stays for the next
// owner).
func (l *lane) runStep(st *step) bool {
	switch st.kind {
	case kindDiscard:
		return l.discard(st.msgs[0])
	case session.KindCommand:
		return l.runCommand(st.msgs[0])
	case session.KindInternal:
		return l.runInternal(st.msgs[0])
	default:
		// The platform message ids are looked up while the intent is
		// recorded: both are reads or writes of their own buckets, and the
		// turn needs both before its first append.
		if l.startTurnTrace(st.msgs, "") {
			defer l.endTurnTrace()
		}
		l.msgids = l.prefetchMsgIDs(st.msgs)
		defer func() {
			l.msgids.wait()
			l.msgids = nil
		}()
		intent, err := l.recordIntent(st)
		if err != nil {
			l.log.Warn("record intent", "err", err)
			return false
		}
		return l.execute(intent, st.msgs, false)
	}
}

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

// recordIntent takes the session decision for a turn and records it, with
// the turn's inbox range, in the entry before any side effect.
func (l *lane) recordIntent(st *step) (*session.TurnIntent, error) {
	w := l.w
	now := w.cfg.Now()
	src := st.msgs[0].body.Source
	if st.kind == session.KindInternal && l.entry != nil && l.entry.Origin != nil {
		// An automatic resume has no sender: it answers where the session
		// came from.
		src = *l.entry.Origin
	}
	policy := w.cfg.Reset.PolicyFor(src.Platform, src.ChatType)
	dec := session.Decide(l.entry, policy, now, w.cfg.Location, w.cfg.Freshness, nil)
	intent := &session.TurnIntent{
		ID:                newID(),
		FirstSeq:          st.msgs[0].seq,
		LastSeq:           st.msgs[len(st.msgs)-1].seq,
		Kind:              st.kind,
		Attempt:           1,
		SessionID:         dec.SessionID,
		PreviousSessionID: dec.PreviousSessionID,
		ResetReason:       dec.Reason,
		Owner:             w.owner,
		Epoch:             l.lease.Epoch,
		StartedAt:         now,
		TraceParent:       l.turnTraceParent(),
	}
	intent.Notes, intent.Notices = l.decisionNotes(dec, policy, src.Platform)
	// A /queue turn counts the items behind it (the inbox scan is paid by
	// /queue turns only); each discard by a /new or /reset takes one off.
	queueDepth := -1
	if st.kind == session.KindQueue {
		queueDepth = l.queueDepth(intent.LastSeq)
	}
	if dec.Reset {
		if err := w.store.Index(context.WithoutCancel(l.ctx), dec.SessionID, indexRecord(l.lane, l.entry.SessionKey, now, dec.PreviousSessionID)); err != nil {
			return nil, err
		}
	}
	record := func(src session.SessionSource) error {
		return l.mutate(func(e *session.SessionEntry) (*session.SessionEntry, error) {
			if e.CommittedSeq >= intent.FirstSeq {
				return nil, fmt.Errorf("turn starts at %d but %d is committed", intent.FirstSeq, e.CommittedSeq)
			}
			e.Turn = intent
			if st.kind == session.KindInternal && e.LastResumeMarkedAt != nil {
				// This marker has had its automatic resume (see autoResumeDue).
				at := *e.LastResumeMarkedAt
				e.AutoResumedAt = &at
			}
			if queueDepth >= 0 {
				e.QueueDepth = queueDepth
			}
			if dec.Reset {
				e.StartSession(dec.SessionID, dec.Reason, now)
			}
			e.SetOrigin(src)
			e.Platform = src.Platform
			e.ChatType = src.ChatType
			if e.SessionKey == "" {
				e.SessionKey = st.msgs[0].body.SessionKey
			}
			e.UpdatedAt = now
			return e, nil
		}, true)
	}
	err := record(src)
	if tooLarge(err) {
		// Names the ingress did not bound (an older ingress, another
		// adapter) can make the entry larger than the store takes: record
		// the turn with the origin's names left out.
		l.log.Warn("turn intent too large with the source's names; recording it without them", "err", err)
		slim := src
		slim.ChatName, slim.UserName, slim.ChatTopic = "", "", ""
		err = record(slim)
	}
	if err != nil {
		return nil, err
	}
	l.turnEvent("start", intent, "")
	return intent, nil
}

// execute runs an intent to its commit. resumed is true on recovery.
func (l *lane) execute(intent *session.TurnIntent, msgs []inboxMsg, resumed bool) bool {
	w := l.w
	prev := ""
	if resumed {
		prev = intent.TraceParent
	}
	if l.startTurnTrace(msgs, prev) {
		defer l.endTurnTrace()
	}
	l.traceIntent(intent, resumed)
	st, err := l.txFor(intent.SessionID)
	if err != nil {
		l.log.Warn("load transcript", "err", err)
		return false
	}
	if intent.PreviousSessionID != "" {
		if err := l.closeOld(intent); err != nil {
			l.log.Warn("close previous session", "err", err)
			return false
		}
	}
	src := sourceOf(l.entry, msgs)
	for i, text := range intent.Notices {
		if err := l.emitNotice(st, intent, fmt.Sprintf("%s:notice:%d", intent.ID, i), text, src); err != nil {
			return false
		}
	}
	crashPoint("after_notice")

	// Judged before this turn's user entries are appended: does the
	// transcript end in a tool result the agent never answered?
	toolTail := ""
	if !resumed {
		toolTail = toolTailNote(st)
	}

	// The user entries, each once (a recovered turn may have some already).
	var users []agent.UserMessage
	for _, m := range msgs {
		text := m.body.Text
		if m.kind == session.KindInternal {
			// An automatic resume is an event with empty text and no user
			// entry; the fleet's wake-ups carry nothing.
			if m.body.Command == internalResume {
				users = append(users, agent.UserMessage{InboxSeq: m.seq})
			}
			continue
		}
		if st.userSeqs[m.seq] {
			users = append(users, agent.UserMessage{InboxSeq: m.seq, Text: text, SenderName: m.body.Source.UserName})
			continue
		}
		if dup, err := l.duplicate(m); err != nil {
			return false
		} else if dup {
			continue
		}
		e := transcript.Entry{ID: fmt.Sprintf("%s:user:%d", intent.ID, m.seq), Kind: transcript.KindMessage, Role: "user",
			Content: text, InboxSeq: m.seq, TurnID: intent.ID, SenderName: m.body.Source.UserName, Timestamp: w.cfg.Now()}
		if err := l.appendOwned(st, &e); err != nil {
			if tooLarge(err) {
				// No retry can store it: tell the user, commit past it,
				// rather than retrying (uncounted) for ever.
				return l.failTurn(st, intent, src, fmt.Errorf("user message %d is too large for the transcript: %w", m.seq, err))
			}
			l.log.Warn("append user entry", "err", err)
			return false
		}
		users = append(users, agent.UserMessage{InboxSeq: m.seq, Text: text, SenderName: m.body.Source.UserName})
	}
	crashPoint("after_append")
	if len(users) == 0 {
		return l.finish(st, intent, StatusDuplicate, nil, nil)
	}

	// A final reply already in the transcript means the turn completed.
	if done, ok := findEntry(st, intent.ID+":reply"); ok {
		if err := l.publishReply(st, intent, *done, session.ReplyKindReply, src); err != nil {
			return false
		}
		return l.finish(st, intent, StatusCompleted, nil, nil)
	}

	a, err := l.agentFor(intent.SessionID)
	if err != nil {
		return l.failTurn(st, intent, src, err)
	}
	notes := append([]string(nil), intent.Notes...)
	// The restart-resume note subsumes the tool-tail note.
	if toolTail != "" && !slices.ContainsFunc(notes, isResumeNote) {
		notes = append(notes, toolTail)
	}
	turn := &agent.Turn{
		SessionKey:    l.entry.SessionKey,
		SessionID:     intent.SessionID,
		TurnID:        intent.ID,
		Source:        src,
		ContextPrompt: session.BuildContextPrompt(src, l.entry, w.cfg.Context),
		Notes:         notes,
		FreshReset:    l.entry.IsFreshReset,
		Attempt:       intent.Attempt,
		History:       historyOf(retryHistory(st.history(), intent)),
		Messages:      users,
	}
	var steerErr error // set by the agent goroutine, read after it is done
	// Only a turn of plain messages takes steered input: a /queue item is
	// exactly one turn, and a narrowed retry (a poison suspect) runs alone.
	if l.busyMode() == BusySteer && intent.Kind == session.KindMessage && intent.RetryFrom <= intent.LastSeq {
		turn.Steer = func(ctx context.Context) ([]agent.UserMessage, error) {
			msgs, err := l.steer(ctx, st, intent)
			if err != nil && steerErr == nil && !errors.Is(err, errNothingSteered) {
				steerErr = err
			}
			return msgs, err
		}
	}

	// A bounded number of agent runs at once per worker.
	// A turn recovered for its last attempt already holds the gate.
	release := func() {}
	if !l.holdsGate {
		var ok bool
		if release, ok = w.turns.acquire(l.ctx); !ok {
			return false
		}
	}
	if resumed && intent.AgentStarted < intent.Attempt {
		// Recorded before the agent runs: only an attempt interrupted
		// from here on counts as interrupted (see recoverTurn). The
		// attempt's span is the one a later resume links to.
		tp := l.turnTraceParent()
		if err := l.mutate(func(e *session.SessionEntry) (*session.SessionEntry, error) {
			if e.Turn == nil || e.Turn.ID != intent.ID {
				return nil, errLeaseLost
			}
			e.Turn.AgentStarted = intent.Attempt
			if tp != "" {
				e.Turn.TraceParent = tp
			}
			return e, nil
		}, true); err != nil {
			release()
			l.log.Warn("record agent start", "turn", intent.ID, "err", err)
			return false
		}
		intent.AgentStarted = intent.Attempt
		if tp != "" {
			intent.TraceParent = tp
		}
	}
	em := &emitter{l: l, st: st, intent: intent, src: src, sessionKey: turn.SessionKey}
	res, runErr, stopCause := l.runAgent(a, em, turn)
	release()
	if stopCause == nil && steerErr != nil {
		// Recording steered input failed (store trouble or a lost lease):
		// abandon the turn rather than report an agent failure, and never
		// commit it, even if the agent carried on without that input: the
		// recorded range already covers messages the transcript may lack.
		stopCause = steerErr
	}

	switch {
	case stopCause == nil && runErr == nil:
		if res != nil && res.Text != "" {
			e := transcript.Entry{ID: intent.ID + ":reply", Kind: transcript.KindMessage, Role: "assistant", Content: res.Text,
				Reasoning: res.Reasoning, FinishReason: nonEmpty(res.FinishReason, "stop"), TokenCount: int(em.usage.OutputTokens),
				TurnID: intent.ID, Timestamp: w.cfg.Now()}
			if err := l.appendOwned(st, &e); err != nil {
				if tooLarge(err) {
					return l.failTurn(st, intent, src, fmt.Errorf("the agent's reply is too large for the transcript: %w", err))
				}
				l.log.Warn("append reply", "err", err)
				return false
			}
			// The reply goes out while the turn's end is appended. The
			// commit waits for both; after a crash before it, recovery
			// republishes the reply (same Msg-Id) from the transcript.
			published := make(chan error, 1)
			go func() { published <- l.publishReply(st, intent, e, session.ReplyKindReply, src) }()
			w.stats.Turns.Add(1)
			return l.finishThen(st, intent, StatusCompleted, &em.usage, nil, func() error {
				if err := <-published; err != nil {
					return err
				}
				crashPoint("after_reply")
				return nil
			})
		}
		crashPoint("after_reply")
		w.stats.Turns.Add(1)
		return l.finish(st, intent, StatusCompleted, &em.usage, nil)
	case errors.Is(stopCause, agent.ErrTurnInterrupted):
		if !l.keepPartial(em, res) {
			return false
		}
		return l.finish(st, intent, StatusInterrupted, &em.usage, nil)
	case errors.Is(stopCause, errStopped):
		if !l.keepPartial(em, res) {
			return false
		}
		return l.finish(st, intent, StatusStopped, &em.usage, nil)
	case stopCause != nil:
		// Lease lost, drain timeout or hard stop: no commit; the intent
		// stays for whoever owns the lane next.
		l.log.Info("turn abandoned", "turn", intent.ID, "cause", stopCause)
		return false
	default:
		if !l.keepPartial(em, res) {
			return false
		}
		return l.failTurnUsage(st, intent, src, runErr, &em.usage)
	}
}

// keepPartial records the reply text an agent returned with its error or
// its cancellation (a user interrupt, the turn's deadline) as an assistant
// entry of the turn: the transcript keeps what the user may already have
// seen streamed. It is not delivered as a reply.
func (l *lane) keepPartial(em *emitter, res *agent.Result) bool {
	if res == nil || res.Text == "" {
		return true
	}
	id := fmt.Sprintf("%s:a%d:partial", em.intent.ID, em.intent.Attempt)
	if em.st.ids[id] {
		return true
	}
	e := transcript.Entry{ID: id, Kind: transcript.KindMessage, Role: transcript.RoleAssistant, Content: res.Text,
		Reasoning: res.Reasoning, FinishReason: "interrupted", TurnID: em.intent.ID, Timestamp: l.w.cfg.Now()}
	if err := l.appendOwned(em.st, &e); err != nil && !tooLarge(err) {
		l.log.Warn("append partial reply", "turn", em.intent.ID, "err", err)
		return false
	}
	return true
}

// retryHistory is the history a turn's agent sees. A retry narrowed to the
// first message of its range must not see the rest of that range (their
// user entries were written by the interrupted attempt): they are the next
// turns' to answer, and one of them may be the poison the narrowing
// isolates.
func retryHistory(h []transcript.Entry, intent *session.TurnIntent) []transcript.Entry {
	if intent.RetryFrom <= intent.LastSeq {
		return h
	}
	out := make([]transcript.Entry, 0, len(h))
	for _, e := range h {
		if e.Role == transcript.RoleUser && e.InboxSeq > intent.LastSeq && e.InboxSeq <= intent.RetryFrom {
			continue
		}
		out = append(out, e)
	}
	return out[:len(out):len(out)]
}

// errNothingSteered marks a steer that failed before it recorded anything.
var errNothingSteered = errors.New("no input steered")

// tooLarge reports whether a write failed because the entry is larger than
// the server takes: retrying cannot help.
func tooLarge(err error) bool {
	var ae *jetstream.APIError
	return errors.Is(err, nats.ErrMaxPayload) ||
		errors.As(err, &ae) && ae.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum
}

// failTurn commits a turn whose agent failed, telling the user. It is not
// retried and not counted as interrupted.
func (l *lane) failTurn(st *txState, intent *session.TurnIntent, src session.SessionSource, runErr error) bool {
	return l.failTurnUsage(st, intent, src, runErr, nil)
}

// failTurnUsage is failTurn for a turn whose agent reported usage u.
func (l *lane) failTurnUsage(st *txState, intent *session.TurnIntent, src session.SessionSource, runErr error, u *agent.Usage) bool {
	l.w.stats.TurnsFailed.Add(1)
	l.log.Warn("agent failed", "turn", intent.ID, "err", runErr)
	var pe *agent.PanicError
	if errors.As(runErr, &pe) {
		l.log.Error("agent panicked", "turn", intent.ID, "panic", pe.Value, "stack", string(pe.Stack))
	}
	text := "⚠️ Sorry, something went wrong while answering that message. Send it again, or /retry."
	if err := l.emitNotice(st, intent, intent.ID+":error", text, src); err != nil {
		return false
	}
	return l.finish(st, intent, StatusFailed, u, nil)
}

// runAgent runs the agent in its own goroutine, watching the lane for busy
// input, a drain and the lease. It returns the agent's result and error, and
// the cause when the turn was stopped from outside.
func (l *lane) runAgent(a agent.Agent, em *emitter, turn *agent.Turn) (*agent.Result, error, error) {
	w := l.w
	st, intent := em.st, em.intent
	ctx, cancel := context.WithCancelCause(l.ctx)
	defer cancel(nil)
	ctx, cancelTimeout := context.WithTimeout(ctx, w.cfg.GatewayTimeout)
	defer cancelTimeout()

	type outcome struct {
		res *agent.Result
		err error
	}
	done := make(chan outcome, 1)
	l.turnStart.Store(mono())
	defer l.turnStart.Store(0)
	go func() {
		var o outcome
		defer func() {
			if p := recover(); p != nil {
				o = outcome{err: &agent.PanicError{Value: p, Stack: debug.Stack()}}
			}
			done <- o
		}()
		actx, end := ctx, nopEnd
		if w.tracer != nil {
			actx, end = l.childSpan(ctx, "agent run", telemetry.AttrTurnAttempt.Int(turn.Attempt))
		}
		defer func() { end(o.err) }()
		o.res, o.err = a.Run(actx, turn, em)
	}()

	mode := l.busyMode()
	var drainTimer <-chan time.Time
	drainMarked := false
	var stopCause error
	// A /stop that arrived while the previous turn wound down (its signal
	// spent there) would otherwise wait for this turn to end: look once now.
	// Only for /stop: plain messages beyond a turn that hit its size cap
	// must not interrupt it before it runs.
	l.checkBusy(ctx, cancel, intent, "", &stopCause)
	l.answerReadOnly(ctx, st, intent, stopCause)
	for {
		select {
		case o := <-done:
			if stopCause == nil && l.ctx.Err() != nil {
				stopCause = context.Cause(l.ctx)
			}
			if stopCause == nil && em.err != nil {
				// A durable write of the turn failed (store trouble or a lost
				// lease): the turn is abandoned, not failed; its record stays
				// for whoever owns the lane next.
				stopCause = em.err
			}
			if stopCause == nil && o.err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return o.res, fmt.Errorf("agent exceeded the gateway timeout of %s", w.cfg.GatewayTimeout), nil
			}
			if stopCause != nil {
				return o.res, nil, stopCause
			}
			return o.res, o.err, nil
		case <-l.hints:
			l.checkBusy(ctx, cancel, intent, mode, &stopCause)
			l.answerReadOnly(ctx, st, intent, stopCause)
		case <-l.signal:
			l.checkBusy(ctx, cancel, intent, mode, &stopCause)
			l.answerReadOnly(ctx, st, intent, stopCause)
		case <-w.drainCh:
			if !drainMarked {
				drainMarked = true
				reason := "shutdown_timeout"
				if w.cfg.Restart {
					reason = "restart_timeout"
				}
				if err := l.mutate(func(e *session.SessionEntry) (*session.SessionEntry, error) {
					if !e.MarkResumePending(reason, w.cfg.Now()) {
						return nil, errNoChange
					}
					return e, nil
				}, true); err != nil && !errors.Is(err, errNoChange) {
					l.log.Warn("mark resume pending at drain", "err", err)
				}
				drainTimer = time.After(w.cfg.DrainTimeout)
			}
		case <-drainTimer:
			if !w.othersAlive() {
				// The turn is cut and nobody can take it over now: tell the
				// user, honestly (before the cancel: the lease is still ours).
				text := bannerShutdown
				if w.cfg.Restart {
					text = bannerRestart
				}
				if err := l.emitNotice(st, intent, intent.ID+":banner", text, turn.Source); err != nil {
					l.log.Warn("drain banner", "err", err)
				}
			}
			stopCause = errDrain
			cancel(errDrain)
			drainTimer = nil
		case <-l.ctx.Done():
			stopCause = context.Cause(l.ctx)
			cancel(stopCause)
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				l.log.Error("agent ignored cancellation; abandoning it", "turn", intent.ID)
			}
			return nil, nil, stopCause
		}
	}
}

// checkBusy looks at what arrived after the running turn: a /stop stops it;
// in interrupt mode a plain message that directly follows the turn's range
// interrupts a turn of plain messages (it joins the next turn). A /queue item
// or command in between means the next step is not a turn that message could
// join, so nothing is interrupted; /queue turns are never interrupted. With
// mode "" it only looks for a /stop.
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
		case m.kind == session.KindCommand && m.body.Command == "stop":
			*stopCause = errStopped
			cancel(errStopped)
			return
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
		case m.kind == session.KindInternal && m.body.Command == internalWake:
		case m.kind == session.KindCommand && session.ReadOnlyCommand(m.body.Command):
			if err := l.answerEarly(st, m); err != nil {
				l.log.Warn("answer read-only command", "seq", m.seq, "err", err)
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
	if err := l.appendOwned(st, &en); err != nil {
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

// finish appends the turn_end entry and commits the turn.
func (l *lane) finish(st *txState, intent *session.TurnIntent, status string, u *agent.Usage, apply func(*session.SessionEntry)) bool {
	return l.finishThen(st, intent, status, u, apply, nil)
}

// finishThen is finish with before, when set, run after the turn_end append
// and before the commit, always (also when the append failed); an error
// from it stops the commit.
func (l *lane) finishThen(st *txState, intent *session.TurnIntent, status string, u *agent.Usage, apply func(*session.SessionEntry), before func() error) bool {
	endID := intent.ID + ":end"
	var appendErr error
	if !st.ids[endID] {
		e := transcript.Entry{ID: endID, Kind: transcript.KindTurnEnd, TurnID: intent.ID, Status: status, Timestamp: l.w.cfg.Now()}
		if appendErr = l.appendOwned(st, &e); appendErr != nil {
			l.log.Warn("append turn end", "err", appendErr)
		}
	}
	if before != nil {
		if err := before(); err != nil {
			return false
		}
	}
	if appendErr != nil {
		return false
	}
	if !l.commit(intent, status, u, apply) {
		return false
	}
	l.turnEndEvent(intent, status, u)
	if u != nil {
		l.w.cfg.Metrics.AgentTokens(context.Background(), u.InputTokens, u.OutputTokens)
		l.w.cfg.Metrics.AgentCost(context.Background(), u.EstimatedCostUSD)
	}
	if status == StatusInterrupted {
		// Keep a burst of follow-ups together: the next turn starts only
		// after the collect window, whatever arrives meanwhile.
		t := time.NewTimer(l.w.cfg.CollectWindow)
		select {
		case <-t.C:
		case <-l.ctx.Done():
		case <-l.w.drainCh:
		}
		t.Stop()
	}
	return true
}

// commit moves committed_seq past the turn in one CAS, then acks every held
// delivery at or below it. Only a turn that ran the agent to completion
// clears resume_pending and the interrupted-turn count: a failed,
// interrupted or stopped turn, a duplicate or a command leaves them, so the
// next turn still gets the resume note and the count still decides the
// escalation. u, when set, is the usage the turn's agent reported.
func (l *lane) commit(intent *session.TurnIntent, status string, u *agent.Usage, apply func(*session.SessionEntry)) bool {
	w := l.w
	l.pauseTag = "commit"
	defer func() { l.pauseTag = "" }()
	err := l.mutate(func(e *session.SessionEntry) (*session.SessionEntry, error) {
		if e.LastTurnID == intent.ID || e.Turn == nil || e.Turn.ID != intent.ID {
			return nil, errNoChange
		}
		if intent.LastSeq > e.CommittedSeq {
			e.CommittedSeq = intent.LastSeq
		}
		e.LastTurnID = intent.ID
		e.Turn = nil
		if status == StatusCompleted && intent.Kind != session.KindCommand {
			e.ClearResumePending()
			e.InterruptedTurns = 0
		}
		e.WasAutoReset = false
		e.AutoResetReason = ""
		if intent.Kind != session.KindCommand {
			// Consumed by the first turn that ran the agent.
			e.IsFreshReset = false
		}
		e.ResetHadActivity = false
		if u != nil {
			addUsage(e, *u)
		}
		e.UpdatedAt = w.cfg.Now()
		if apply != nil {
			apply(e)
		}
		return e, nil
	}, true)
	if err != nil && !errors.Is(err, errNoChange) {
		l.log.Warn("commit", "turn", intent.ID, "err", err)
		return false
	}
	crashPoint("after_commit")
	l.ackUpTo(l.entry.CommittedSeq)
	return true
}

// commitSimple moves committed_seq past one message with no turn.
func (l *lane) commitSimple(seq uint64) bool {
	err := l.mutate(func(e *session.SessionEntry) (*session.SessionEntry, error) {
		if e.CommittedSeq >= seq {
			return nil, errNoChange
		}
		e.CommittedSeq = seq
		return e, nil
	}, true)
	if err != nil && !errors.Is(err, errNoChange) {
		return false
	}
	l.ackUpTo(l.entry.CommittedSeq)
	return true
}

// emitNotice appends a notice entry (once) and publishes it.
func (l *lane) emitNotice(st *txState, intent *session.TurnIntent, id, text string, src session.SessionSource) error {
	e, ok := findEntry(st, id)
	if !ok {
		ne := transcript.Entry{ID: id, Kind: transcript.KindNotice, Role: "system", Content: text, TurnID: intent.ID, Timestamp: l.w.cfg.Now()}
		if err := l.appendOwned(st, &ne); err != nil {
			return err
		}
		e = &ne
	}
	return l.publishReply(st, intent, *e, session.ReplyKindNotice, src)
}

// publishReply publishes a reply or notice derived from a stored transcript
// entry, with the deterministic Msg-Id <session_id>:<tx seq>.
func (l *lane) publishReply(st *txState, intent *session.TurnIntent, e transcript.Entry, kind string, src session.SessionSource) error {
	return l.publishReplyAs(l.entry.SessionKey, st, intent, e, kind, src)
}

// publishReplyAs is publishReply with the lane's session key given, for the
// agent goroutine (which must not read l.entry: the runner may replace it).
func (l *lane) publishReplyAs(key string, st *txState, intent *session.TurnIntent, e transcript.Entry, kind string, src session.SessionSource) error {
	if err := l.checkAlive(); err != nil {
		return err
	}
	pausePoint("reply")
	r := session.Reply{
		ID: st.sessionID + ":" + seqString(e.Seq), SessionKey: key, SessionID: st.sessionID,
		TurnID: intent.ID, TxSeq: e.Seq, Kind: kind, Text: e.Content, Platform: src.Platform,
		ChatID: src.ChatID, ThreadID: src.ThreadID, CreatedAt: e.Timestamp,
	}
	data, err := jsonMarshal(r)
	if err != nil {
		return err
	}
	platform := string(src.Platform)
	if platform == "" {
		platform = string(session.PlatformHTTP)
	}
	msg := nats.NewMsg(l.w.names.OutboxSubject(platform, l.lane))
	msg.Data = data
	msg.Header.Set(broker.HdrSessionKey, key)
	msg.Header.Set(broker.HdrTurnID, intent.ID)
	end := l.traceReply(msg.Header, r.ID, kind)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(l.ctx), 5*time.Second)
	defer cancel()
	_, err = l.w.js.PublishMsg(ctx, msg, jetstream.WithMsgID(r.ID))
	end(err)
	if err != nil {
		l.log.Warn("publish reply", "id", r.ID, "err", err)
		return err
	}
	return nil
}

// closeOld appends the closed entry to the session a turn switched away from.
func (l *lane) closeOld(intent *session.TurnIntent) error {
	old, err := l.txFor(intent.PreviousSessionID)
	if err != nil {
		return err
	}
	id := intent.ID + ":closed"
	if old.ids[id] {
		return nil
	}
	e := transcript.Entry{ID: id, Kind: transcript.KindClosed, NextSessionID: intent.SessionID, Reason: nonEmpty(intent.ResetReason, "switch"),
		TurnID: intent.ID, Timestamp: l.w.cfg.Now()}
	return l.appendOwned(old, &e)
}

// agentFor returns the cached agent of a session, or a new one.
func (l *lane) agentFor(sid string) (agent.Agent, error) {
	if a := l.agents[sid]; a != nil {
		return a, nil
	}
	a, err := l.w.cfg.Backend.NewAgent(l.ctx, l.entry.SessionKey, sid)
	if err != nil {
		return nil, err
	}
	l.agents[sid] = a
	return a, nil
}

// emitter persists what the agent produces during a turn.
type emitter struct {
	l      *lane
	st     *txState
	intent *session.TurnIntent
	src    session.SessionSource
	// sessionKey is the lane's, read once by the runner (the agent
	// goroutine must not read l.entry).
	sessionKey string
	n          int
	deltas     int
	usage      agent.Usage
	err        error // the first durable-write failure, set by the agent goroutine
}

func (e *emitter) fail(err error) error {
	if err != nil && e.err == nil {
		e.err = err
	}
	return err
}

func (e *emitter) nextID(kind string) string {
	e.n++
	return fmt.Sprintf("%s:a%d:%s%d", e.intent.ID, e.intent.Attempt, kind, e.n)
}

func (e *emitter) Delta(ctx context.Context, text string) error {
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	if text == "" || !e.l.alive() {
		return nil
	}
	e.deltas++
	data, err := jsonMarshal(session.Delta{SessionKey: e.sessionKey, SessionID: e.st.sessionID, TurnID: e.intent.ID,
		Attempt: e.intent.Attempt, N: e.deltas, Text: text})
	if err != nil {
		return nil
	}
	// Ephemeral: a failed publish costs a listener some typing, nothing else.
	_ = e.l.w.nc.Publish(e.l.w.names.DeltaSubject(e.l.lane), data)
	return nil
}

func (e *emitter) Message(ctx context.Context, text string) error {
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	if text == "" {
		return nil
	}
	en := transcript.Entry{ID: e.nextID(interimTag), Kind: transcript.KindMessage, Role: transcript.RoleAssistant, Content: text,
		FinishReason: "interim", TurnID: e.intent.ID, Timestamp: e.l.w.cfg.Now()}
	if err := e.l.appendOwned(e.st, &en); err != nil {
		return e.fail(err)
	}
	return e.fail(e.l.publishReplyAs(e.sessionKey, e.st, e.intent, en, session.ReplyKindReply, e.src))
}

func (e *emitter) ToolCall(ctx context.Context, call agent.ToolCall) error {
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	en := transcript.Entry{ID: e.nextID("e"), Kind: transcript.KindMessage, Role: "assistant", ToolCalls: []transcript.ToolCall{{ID: call.ID, Name: call.Name, Arguments: call.Arguments}},
		TurnID: e.intent.ID, Timestamp: e.l.w.cfg.Now()}
	return e.fail(e.l.appendOwned(e.st, &en))
}

func (e *emitter) ToolResult(ctx context.Context, callID, name, content string) error {
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	en := transcript.Entry{ID: e.nextID("e"), Kind: transcript.KindMessage, Role: "tool", ToolCallID: callID, ToolName: name,
		Content: content, TurnID: e.intent.ID, Timestamp: e.l.w.cfg.Now()}
	return e.fail(e.l.appendOwned(e.st, &en))
}

func (e *emitter) Usage(_ context.Context, u agent.Usage) error {
	e.usage.Add(u)
	return nil
}

// interimTag marks the entry ids of interim messages (<turn>:a<attempt>:m<n>):
// a recovering owner republishes them (see republishInterim).
const interimTag = "m"

// isInterim reports whether e is an interim message of turn turnID.
func isInterim(e transcript.Entry, turnID string) bool {
	rest, ok := strings.CutPrefix(e.ID, turnID+":a")
	if !ok || e.Role != transcript.RoleAssistant {
		return false
	}
	_, n, ok := strings.Cut(rest, ":"+interimTag)
	return ok && n != "" && strings.Trim(n, "0123456789") == ""
}

// republishInterim publishes again the interim messages an interrupted
// attempt of turn t stored (their Msg-Ids make it idempotent): one stored
// just before a crash may never have gone out.
func (l *lane) republishInterim(st *txState, t *session.TurnIntent, src session.SessionSource) error {
	for _, e := range st.entries {
		if e.TurnID == t.ID && !e.Deleted && isInterim(e, t.ID) {
			if err := l.publishReply(st, t, e, session.ReplyKindReply, src); err != nil {
				return err
			}
		}
	}
	return nil
}

// addUsage adds a turn's usage to the entry's counters.
func addUsage(e *session.SessionEntry, u agent.Usage) {
	if u.CostStatus != "" {
		if e.TotalTokens == 0 && e.EstimatedCostUSD == 0 {
			e.CostStatus = u.CostStatus // the first cost known replaces the default
		} else {
			e.CostStatus = agent.MergeCostStatus(e.CostStatus, u.CostStatus)
		}
	}
	e.InputTokens += u.InputTokens
	e.OutputTokens += u.OutputTokens
	e.CacheReadTokens += u.CacheReadTokens
	e.CacheWriteTokens += u.CacheWriteTokens
	e.TotalTokens += u.InputTokens + u.OutputTokens
	e.EstimatedCostUSD += u.EstimatedCostUSD
	if u.PromptTokens > 0 {
		e.LastPromptTokens = u.PromptTokens
	} else if u.InputTokens > 0 {
		e.LastPromptTokens = u.InputTokens
	}
}

func findEntry(st *txState, id string) (*transcript.Entry, bool) {
	if !st.ids[id] {
		return nil, false
	}
	for i := len(st.entries) - 1; i >= 0; i-- {
		if st.entries[i].ID == id {
			e := st.entries[i]
			return &e, true
		}
	}
	return nil, false
}

func sourceOf(e *session.SessionEntry, msgs []inboxMsg) session.SessionSource {
	if len(msgs) > 0 && msgs[0].body.Source.Platform != "" {
		return msgs[0].body.Source
	}
	if o, ok := e.OriginSource(); ok {
		return o
	}
	return session.SessionSource{Platform: session.PlatformHTTP}
}

func nonEmpty(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// crashPoint exits the process at a named point when AGENTFLEET_CRASH_AT
// names it: the fault injection the crash-point tests use on real
// processes. It is inert unless that variable is set.
func crashPoint(name string) {
	if crashAt != "" && crashAt == name {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}

var crashAt = os.Getenv("AGENTFLEET_CRASH_AT")

// pausePoint stops the whole process (SIGSTOP to itself) the first time it
// reaches the point named by AGENTFLEET_PAUSE_AT — right after a write's own
// lease check passed, just before the write goes to the server — so that
// tests can show that the server-side fence, not the worker's self-check,
// refuses the write of a worker that was paused there while another took
// its lane over. Points: "append:<role>" (a transcript append of that role,
// e.g. append:tool), "reply" (a reply publish), "commit" (the commit CAS).
func pausePoint(name string) {
	if pauseAt != "" && pauseAt == name {
		pauseOnce.Do(func() {
			// The stop reaches the other threads of the process a moment
			// later: this goroutine must not go on meanwhile, so it waits
			// for the SIGCONT that resumes the process.
			cont := make(chan os.Signal, 1)
			signal.Notify(cont, syscall.SIGCONT)
			defer signal.Stop(cont)
			_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			<-cont
		})
	}
}

var (
	pauseAt   = os.Getenv("AGENTFLEET_PAUSE_AT")
	pauseOnce sync.Once
)

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
			return nil, errLeaseLost
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
			e := transcript.Entry{ID: fmt.Sprintf("%s:user:%d", intent.ID, m.seq), Kind: transcript.KindMessage, Role: "user",
				Content: m.body.Text, InboxSeq: m.seq, TurnID: intent.ID, SenderName: m.body.Source.UserName, Timestamp: l.w.cfg.Now()}
			if err := l.appendOwned(st, &e); err != nil {
				return nil, err
			}
		}
		out = append(out, agent.UserMessage{InboxSeq: m.seq, Text: m.body.Text, SenderName: m.body.Source.UserName})
	}
	return out, nil
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
		l.log.Warn("record message id", "err", err)
		return false, err
	}
	if owner == m.seq {
		return false, nil
	}
	l.log.Info("duplicate platform message not run", "platform_msg_id", id, "seq", m.seq, "first_seq", owner)
	w.event("duplicate", l.lane, map[string]any{"seq": m.seq, "first_seq": owner, "platform_msg_id": id})
	return true, nil
}

// discard records a /queue item discarded by a following /new or /reset: a
// transcript note and an event, then the commit past it. The /new notice
// tells the user how many.
func (l *lane) discard(m inboxMsg) bool {
	if l.entry.SessionID != "" {
		st, err := l.txFor(l.entry.SessionID)
		if err != nil {
			return false
		}
		id := fmt.Sprintf("discard:%d", m.seq)
		if !st.ids[id] {
			e := transcript.Entry{ID: id, Kind: transcript.KindNotice, Role: "system", Content: "Discarded queued message: " + m.body.Text,
				InboxSeq: m.seq, TurnID: id, Timestamp: l.w.cfg.Now()}
			if err := l.appendOwned(st, &e); err != nil {
				return false
			}
		}
	}
	l.w.event("discarded", l.lane, map[string]any{"seq": m.seq, "reason": "reset"})
	err := l.mutate(func(e *session.SessionEntry) (*session.SessionEntry, error) {
		if e.CommittedSeq >= m.seq {
			return nil, errNoChange
		}
		e.CommittedSeq = m.seq
		e.DiscardedQueue++
		if e.QueueDepth > 0 {
			e.QueueDepth--
		}
		return e, nil
	}, true)
	if err != nil && !errors.Is(err, errNoChange) {
		return false
	}
	l.ackUpTo(l.entry.CommittedSeq)
	return true
}
