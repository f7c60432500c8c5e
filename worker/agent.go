package worker

import (
	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
)

// historyOf converts the effective transcript into the agent's history.
func historyOf(entries []transcript.Entry) []agent.Message {
	out := make([]agent.Message, len(entries))
	for i, e := range entries {
		out[i] = messageOf(e)
	}
	return out
}

// messageOf converts one effective transcript entry into a history message.
func messageOf(e transcript.Entry) agent.Message {
	m := agent.Message{Role: e.Role, Content: e.Content, ToolCallID: e.ToolCallID, ToolName: e.ToolName,
		Reasoning: e.Reasoning, SenderName: e.SenderName, Attachments: e.Attachments, Quote: e.Quote,
		InboxSeq: e.InboxSeq, TurnID: e.TurnID, Seq: e.Seq, Timestamp: e.Timestamp}
	if len(e.ToolCalls) > 0 {
		m.ToolCalls = make([]agent.ToolCall, len(e.ToolCalls))
		for j, c := range e.ToolCalls {
			m.ToolCalls[j] = agent.ToolCall{ID: c.ID, Name: c.Name, Arguments: c.Arguments}
		}
	}
	return m
}

// turnHistory is the history a turn's agent sees: the session's effective
// transcript as kept converted by the loaded transcript (no per-turn copy of
// the whole conversation), or, for a retry narrowed to the first message of
// its range, that history without the rest of the range (see retryHistory).
func turnHistory(st *txState, intent *session.TurnIntent) []agent.Message {
	if intent.RetryFrom <= intent.LastSeq {
		return st.agentHistory()
	}
	return historyOf(retryHistory(st.history(), intent))
}
