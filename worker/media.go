package worker

// Media and reply context of user messages (attachments by reference, the
// quoted message), and the busy-input rules for media:
//   - photos and stickers are plain messages: a burst of them merges with
//     the texts around it into one turn (in busy mode queue, where each
//     plain message is otherwise its own turn, the photos of one album —
//     one media group — still make one turn);
//   - a voice note, audio, a video or a document is an own-turn item: the
//     ingress stores it with kind queue, so it gets its own FIFO turn, is
//     counted in the queue depth and is discarded (recorded) by a /new or
//     /reset behind it, exactly as a /queue item;
//   - the reply anchor of a turn is its newest message (sourceOf), and its
//     quote the latest one among its messages (turnQuote).

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
)

// userMessage is the agent's view of one user message of a turn.
func userMessage(m inboxMsg) agent.UserMessage {
	b := m.body
	return agent.UserMessage{InboxSeq: m.seq, Text: b.Text, SenderName: b.Source.UserName, MessageID: b.Source.MessageID,
		Attachments: b.Attachments, Quote: b.Quote}
}

// userEntry is the transcript entry of one user message of turn turnID,
// with its attachments (references) and quote.
func userEntry(turnID string, m inboxMsg, now time.Time) transcript.Entry {
	return transcript.Entry{ID: fmt.Sprintf("%s:user:%d", turnID, m.seq), Kind: transcript.KindMessage, Role: "user",
		Content: m.body.Text, InboxSeq: m.seq, InboxID: m.inboxID, TurnID: turnID, SenderName: m.body.Source.UserName, Timestamp: now,
		Attachments: m.body.Attachments, Quote: m.body.Quote}
}

// turnQuote is the reply context of a turn: the latest quote among its
// messages (a merged turn takes the newest quote fields).
func turnQuote(users []agent.UserMessage) *session.Quote {
	qs := make([]*session.Quote, len(users))
	for i, u := range users {
		qs[i] = u.Quote
	}
	return session.LatestQuote(qs...)
}

// sameAlbum reports whether next continues the album first started: both
// plain messages of the same media group.
func sameAlbum(first, next *inboxMsg) bool {
	return next != nil && next.kind == session.KindMessage && first.kind == session.KindMessage &&
		first.body.MediaGroup != "" && next.body.MediaGroup == first.body.MediaGroup
}

// describeInbound is a message's text for notes about it (a discarded
// queue item): its text, and a word per attachment.
func describeInbound(b session.Inbound) string {
	parts := []string{}
	if strings.TrimSpace(b.Text) != "" {
		parts = append(parts, b.Text)
	}
	for _, a := range b.Attachments {
		parts = append(parts, "["+a.Kind+"]")
	}
	return strings.Join(parts, " ")
}

// albumStep extends a queue-mode step that starts with a photo of an album
// by the album's next photos, when they follow it directly in the inbox.
func (l *lane) albumStep(ctx context.Context, st *step, blind bool) (*step, error) {
	first := &st.msgs[0]
	if first.body.MediaGroup == "" {
		return st, nil
	}
	last := first.seq
	for len(st.msgs) < l.w.cfg.MaxTurnMessages {
		if !blind && !l.mayHaveAfter(last) {
			break
		}
		next, err := l.peek(ctx, last+1)
		if err != nil {
			return nil, err
		}
		if !sameAlbum(first, next) {
			break
		}
		st.msgs = append(st.msgs, *next)
		last = next.seq
	}
	return st, nil
}
