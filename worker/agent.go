package worker

import (
	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/transcript"
)

// historyOf converts the effective transcript into the agent's history.
func historyOf(entries []transcript.Entry) []agent.Message {
	out := make([]agent.Message, len(entries))
	for i, e := range entries {
		m := agent.Message{Role: e.Role, Content: e.Content, ToolCallID: e.ToolCallID, ToolName: e.ToolName,
			Reasoning: e.Reasoning, SenderName: e.SenderName, Attachments: e.Attachments, Quote: e.Quote,
			InboxSeq: e.InboxSeq, TurnID: e.TurnID, Seq: e.Seq, Timestamp: e.Timestamp}
		if len(e.ToolCalls) > 0 {
			m.ToolCalls = make([]agent.ToolCall, len(e.ToolCalls))
			for j, c := range e.ToolCalls {
				m.ToolCalls[j] = agent.ToolCall{ID: c.ID, Name: c.Name, Arguments: c.Arguments}
			}
		}
		out[i] = m
	}
	return out
}
