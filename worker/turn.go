package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
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
		InboxID:           l.inbox().ID,
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
		l.log.Warn("turn intent too large with the source's names; recording it without them", slog.Any("error", err))
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
func (l *lane) execute(intent *session.TurnIntent, msgs []inboxMsg, resumed bool) error {
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
		l.log.Warn("load transcript", slog.Any("error", err))
		return l.failed(err)
	}
	if intent.PreviousSessionID != "" {
		if err := l.closeOld(intent); err != nil {
			l.log.Warn("close previous session", slog.Any("error", err))
			return l.failed(err)
		}
	}
	src := sourceOf(l.entry, msgs)
	for i, text := range intent.Notices {
		if err := l.emitNotice(st, intent, fmt.Sprintf("%s:notice:%d", intent.ID, i), text, src); err != nil {
			return l.failed(err)
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
		if m.kind == session.KindInternal {
			// An automatic resume is an event with empty text and no user
			// entry; the fleet's wake-ups carry nothing.
			if m.body.Command == session.CmdAutoResume {
				users = append(users, agent.UserMessage{InboxSeq: m.seq})
			}
			continue
		}
		if st.hasUser(l.inbox(), m.seq) {
			users = append(users, userMessage(m))
			continue
		}
		if dup, err := l.duplicate(m); err != nil {
			return l.failed(err)
		} else if dup {
			continue
		}
		e := userEntry(intent.ID, m, w.cfg.Now())
		if err := l.append(st, &e); err != nil {
			if tooLarge(err) {
				// No retry can store it: tell the user, commit past it,
				// rather than retrying (uncounted) for ever.
				return l.failTurn(st, intent, src, fmt.Errorf("user message %d is too large for the transcript: %w", m.seq, err))
			}
			l.log.Warn("append user entry", slog.Any("error", err))
			return l.failed(err)
		}
		users = append(users, userMessage(m))
	}
	crashPoint("after_append")
	if len(users) == 0 {
		return l.finish(st, intent, StatusDuplicate, nil, nil)
	}

	// A final reply already in the transcript means the turn completed.
	if done, ok := findEntry(st, intent.ID+":reply"); ok {
		if err := l.publishReply(st, intent, *done, session.ReplyKindReply, src); err != nil {
			return l.failed(err)
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
		ContextPrompt: l.contextPrompt(src),
		Notes:         notes,
		FreshReset:    l.entry.IsFreshReset,
		Attempt:       intent.Attempt,
		History:       turnHistory(st, intent),
		Messages:      users,
		Quote:         turnQuote(users),
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
			return l.failed(nil)
		}
	}
	if resumed && intent.AgentStarted < intent.Attempt {
		// Recorded before the agent runs: only an attempt interrupted
		// from here on counts as interrupted (see recoverTurn). The
		// attempt's span is the one a later resume links to.
		tp := l.turnTraceParent()
		if err := l.mutate(func(e *session.SessionEntry) (*session.SessionEntry, error) {
			if e.Turn == nil || e.Turn.ID != intent.ID {
				return nil, kv.ErrLeaseLost
			}
			e.Turn.AgentStarted = intent.Attempt
			if tp != "" {
				e.Turn.TraceParent = tp
			}
			return e, nil
		}, true); err != nil {
			release()
			l.log.Warn("record agent start", slog.String("turn", intent.ID), slog.Any("error", err))
			return l.failed(err)
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
			if err := l.append(st, &e); err != nil {
				if tooLarge(err) {
					return l.failTurn(st, intent, src, fmt.Errorf("the agent's reply is too large for the transcript: %w", err))
				}
				l.log.Warn("append reply", slog.Any("error", err))
				return l.failed(err)
			}
			// The reply goes out while the turn's end is appended (its
			// PubAck is read after the append). The commit waits for both;
			// after a crash before it, recovery republishes the reply (same
			// Msg-Id) from the transcript.
			published := l.publishReplyAsync(st, intent, e, session.ReplyKindReply, src)
			w.stats.Turns.Add(1)
			return l.finishThen(st, intent, StatusCompleted, &em.usage, nil, func() error {
				if err := published(); err != nil {
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
		if err := l.keepPartial(em, res); err != nil {
			return err
		}
		return l.finish(st, intent, StatusInterrupted, &em.usage, nil)
	case errors.Is(stopCause, errStopped):
		if err := l.keepPartial(em, res); err != nil {
			return err
		}
		return l.finish(st, intent, StatusStopped, &em.usage, nil)
	case stopCause != nil:
		// Lease lost, drain timeout or hard stop: no commit; the intent
		// stays for whoever owns the lane next.
		l.log.Info("turn abandoned", slog.String("turn", intent.ID), slog.Any("cause", stopCause))
		return l.failed(stopCause)
	default:
		if err := l.keepPartial(em, res); err != nil {
			return err
		}
		return l.failTurnUsage(st, intent, src, runErr, &em.usage)
	}
}

// promptMemo is the last context prompt a lane built and what it was built
// from.
type promptMemo struct {
	src              session.SessionSource
	key, sessionID   string
	created          time.Time
	prompt           string
	valid, withEntry bool
}

// contextPrompt is session.BuildContextPrompt(src, l.entry, the worker's
// options), built again only when what it depends on changed: the prompt is
// stable across a session's turns by design (it carries no per-turn value;
// the source's message id, which changes every turn, is not in it).
func (l *lane) contextPrompt(src session.SessionSource) string {
	m := &l.prompt
	k := src
	k.MessageID = ""
	e := l.entry
	if m.valid && m.src == k && m.withEntry == (e != nil) &&
		(e == nil || m.key == e.SessionKey && m.sessionID == e.SessionID && m.created.Equal(e.CreatedAt)) {
		return m.prompt
	}
	*m = promptMemo{src: k, prompt: session.BuildContextPrompt(src, e, l.w.cfg.Context), valid: true, withEntry: e != nil}
	if e != nil {
		m.key, m.sessionID, m.created = e.SessionKey, e.SessionID, e.CreatedAt
	}
	return m.prompt
}

// keepPartial records the reply text an agent returned with its error or
// its cancellation (a user interrupt, the turn's deadline) as an assistant
// entry of the turn: the transcript keeps what the user may already have
// seen streamed. It is not delivered as a reply.
func (l *lane) keepPartial(em *emitter, res *agent.Result) error {
	if res == nil || res.Text == "" {
		return nil
	}
	id := fmt.Sprintf("%s:a%d:partial", em.intent.ID, em.intent.Attempt)
	if em.st.ids[id] {
		return nil
	}
	e := transcript.Entry{ID: id, Kind: transcript.KindMessage, Role: transcript.RoleAssistant, Content: res.Text,
		Reasoning: res.Reasoning, FinishReason: "interrupted", TurnID: em.intent.ID, Timestamp: l.w.cfg.Now()}
	if err := l.append(em.st, &e); err != nil && !tooLarge(err) {
		l.log.Warn("append partial reply", slog.String("turn", em.intent.ID), slog.Any("error", err))
		return l.failed(err)
	}
	return nil
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

// tooLarge reports whether a write failed because the entry is larger than
// the server takes: retrying cannot help.
func tooLarge(err error) bool {
	var ae *jetstream.APIError
	return errors.Is(err, nats.ErrMaxPayload) ||
		errors.As(err, &ae) && ae.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum
}

// failTurn commits a turn whose agent failed, telling the user. It is not
// retried and not counted as interrupted.
func (l *lane) failTurn(st *txState, intent *session.TurnIntent, src session.SessionSource, runErr error) error {
	return l.failTurnUsage(st, intent, src, runErr, nil)
}

// failTurnUsage is failTurn for a turn whose agent reported usage u.
func (l *lane) failTurnUsage(st *txState, intent *session.TurnIntent, src session.SessionSource, runErr error, u *agent.Usage) error {
	l.w.stats.TurnsFailed.Add(1)
	l.log.Warn("agent failed", slog.String("turn", intent.ID), slog.Any("error", runErr))
	var pe *agent.PanicError
	if errors.As(runErr, &pe) {
		l.log.Error("agent panicked", slog.String("turn", intent.ID), slog.Any("panic", pe.Value), slog.String("stack", string(pe.Stack)))
	}
	text := "⚠️ Sorry, something went wrong while answering that message. Send it again, or /retry."
	if err := l.emitNotice(st, intent, intent.ID+":error", text, src); err != nil {
		return l.failed(err)
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
						return nil, kv.ErrNoChange
					}
					return e, nil
				}, true); err != nil && !errors.Is(err, kv.ErrNoChange) {
					l.log.Warn("mark resume pending at drain", slog.Any("error", err))
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
					l.log.Warn("drain banner", slog.Any("error", err))
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
				l.log.Error("agent ignored cancellation; abandoning it", slog.String("turn", intent.ID))
			}
			return nil, nil, stopCause
		}
	}
}

// finish appends the turn_end entry and commits the turn.
func (l *lane) finish(st *txState, intent *session.TurnIntent, status string, u *agent.Usage, apply func(*session.SessionEntry)) error {
	return l.finishThen(st, intent, status, u, apply, nil)
}

// finishThen is finish with before, when set, run after the turn_end append
// and before the commit, always (also when the append failed); an error
// from it stops the commit.
func (l *lane) finishThen(st *txState, intent *session.TurnIntent, status string, u *agent.Usage, apply func(*session.SessionEntry), before func() error) error {
	return l.finishEnd(st, intent, status, u, apply, before, nil)
}

// finishEnd is finishThen whose turn_end entry is completed by end, when
// set, before it is appended.
func (l *lane) finishEnd(st *txState, intent *session.TurnIntent, status string, u *agent.Usage, apply func(*session.SessionEntry), before func() error,
	end func(*transcript.Entry)) error {
	endID := intent.ID + ":end"
	var appendErr error
	if !st.ids[endID] {
		e := transcript.Entry{ID: endID, Kind: transcript.KindTurnEnd, TurnID: intent.ID, Status: status, Timestamp: l.w.cfg.Now()}
		if end != nil {
			end(&e)
		}
		if appendErr = l.append(st, &e); appendErr != nil {
			l.log.Warn("append turn end", slog.Any("error", appendErr))
		}
	}
	if before != nil {
		if err := before(); err != nil {
			return l.failed(err)
		}
	}
	if appendErr != nil {
		return l.failed(appendErr)
	}
	if err := l.commitTurn(intent, status, u, apply); err != nil {
		return err
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
	return nil
}

// commitTurn moves committed_seq past the turn in one CAS, then acks every held
// delivery at or below it. Only a turn that ran the agent to completion
// clears resume_pending and the interrupted-turn count: a failed,
// interrupted or stopped turn, a duplicate or a command leaves them, so the
// next turn still gets the resume note and the count still decides the
// escalation. u, when set, is the usage the turn's agent reported.
func (l *lane) commitTurn(intent *session.TurnIntent, status string, u *agent.Usage, apply func(*session.SessionEntry)) error {
	w := l.w
	l.pauseTag = "commit"
	defer func() { l.pauseTag = "" }()
	err := l.mutate(func(e *session.SessionEntry) (*session.SessionEntry, error) {
		if e.LastTurnID == intent.ID || e.Turn == nil || e.Turn.ID != intent.ID {
			return nil, kv.ErrNoChange
		}
		// The turn's seqs move committed_seq only in the stream they
		// count in: a turn recorded in an incarnation of the inbox
		// stream that the lane no longer reads (it was deleted and made
		// again, see begin) ends without settling any seq of the new one.
		if intent.LastSeq > e.CommittedSeq && e.TurnInboxID() == e.InboxID {
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
	if err != nil && !errors.Is(err, kv.ErrNoChange) {
		l.log.Warn("commit", slog.String("turn", intent.ID), slog.Any("error", err))
		return l.failed(err)
	}
	crashPoint("after_commit")
	l.ackUpTo(l.entry.CommittedSeq)
	return nil
}

// emitNotice appends a notice entry (once) and publishes it.
func (l *lane) emitNotice(st *txState, intent *session.TurnIntent, id, text string, src session.SessionSource) error {
	e, ok := findEntry(st, id)
	if !ok {
		ne := transcript.Entry{ID: id, Kind: transcript.KindNotice, Role: "system", Content: text, TurnID: intent.ID, Timestamp: l.w.cfg.Now()}
		if err := l.append(st, &ne); err != nil {
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
	msg, id, err := l.replyMsg(key, st, intent, e, kind, src)
	if err != nil {
		return err
	}
	end := l.traceReply(msg.Header, id, kind)
	err = l.publish(msg)
	end(err)
	if err != nil {
		l.log.Warn("publish reply", slog.String("id", id), slog.Any("error", err))
		return err
	}
	return nil
}

// publishReplyAsync is publishReply that returns once the reply is sent:
// the function it returns waits for the PubAck and gives publishReply's
// error.
func (l *lane) publishReplyAsync(st *txState, intent *session.TurnIntent, e transcript.Entry, kind string, src session.SessionSource) func() error {
	msg, id, err := l.replyMsg(l.entry.SessionKey, st, intent, e, kind, src)
	if err != nil {
		return func() error { return err }
	}
	end := l.traceReply(msg.Header, id, kind)
	wait := l.publishAsync(msg)
	return func() error {
		err := wait()
		end(err)
		if err != nil {
			l.log.Warn("publish reply", slog.String("id", id), slog.Any("error", err))
		}
		return err
	}
}

// replyMsg is the outbox message of a reply or notice derived from a stored
// transcript entry, with its Msg-Id (also returned) in its header.
func (l *lane) replyMsg(key string, st *txState, intent *session.TurnIntent, e transcript.Entry, kind string, src session.SessionSource) (*nats.Msg, string, error) {
	r := session.Reply{
		ID: st.sessionID + ":" + seqString(e.Seq), SessionKey: key, SessionID: st.sessionID,
		TurnID: intent.ID, TxSeq: e.Seq, Kind: kind, Text: e.Content, Platform: src.Platform,
		ChatID: src.ChatID, ThreadID: src.ThreadID, ReplyTo: src.MessageID, CreatedAt: e.Timestamp,
	}
	data, err := jsonMarshal(r)
	if err != nil {
		return nil, "", err
	}
	platform := string(src.Platform)
	if platform == "" {
		platform = string(session.PlatformHTTP)
	}
	msg := broker.NewMsg(l.w.names.OutboxSubject(platform, l.lane), data,
		broker.HdrSessionKey, key, broker.HdrTurnID, intent.ID, jetstream.MsgIDHeader, r.ID)
	return msg, r.ID, nil
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
	return l.append(old, &e)
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
	// The newest message is the turn's reply anchor (its MessageID).
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].body.Source.Platform != "" {
			return msgs[i].body.Source
		}
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
