package worker

import (
	"context"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/session"
)

// turnEndEvent publishes a turn's end event with the usage of its agent
// run, when it has one.
func (l *lane) turnEndEvent(t *session.TurnIntent, status string, u *agent.Usage) {
	l.w.cfg.Metrics.TurnEnded(context.Background(), status, l.turnStarted)
	l.traceTurnEnd(status)
	ev := TurnEvent{Type: "end", Lane: l.lane, TurnID: t.ID, SessionID: t.SessionID,
		Owner: l.w.owner, Epoch: l.lease.Epoch, FirstSeq: t.FirstSeq, LastSeq: t.LastSeq, Attempt: t.Attempt,
		Status: status, At: time.Now()}
	if u != nil {
		ev.InputTokens, ev.OutputTokens = u.InputTokens, u.OutputTokens
	}
	l.w.event("turn", l.lane, ev)
}

// titleEvent publishes a session's new title (empty: removed), so the state
// database follows /title.
func (l *lane) titleEvent(sessionID, title string) {
	l.w.event("title", l.lane, map[string]any{"session_id": sessionID, "title": title, "at": time.Now()})
}
