package worker

import (
	"reflect"
	"testing"

	"github.com/agentfleet/agentfleet/transcript"
)

// TestTxStateKeepsAgentHistory: the converted history a loaded transcript
// keeps is exactly historyOf(transcript.Effective(entries)) after every
// append, a rewind (which deletes earlier entries) included.
func TestTxStateKeepsAgentHistory(t *testing.T) {
	entries := []transcript.Entry{
		{Seq: 1, Kind: transcript.KindFence, Epoch: 1},
		{Seq: 2, ID: "t1:u:1", Kind: transcript.KindMessage, Role: transcript.RoleUser, Content: "one", InboxSeq: 1},
		{Seq: 3, ID: "t1:call", Kind: transcript.KindMessage, Role: transcript.RoleAssistant,
			ToolCalls: []transcript.ToolCall{{ID: "c1", Name: "search", Arguments: `{"q":"x"}`}}},
		{Seq: 4, ID: "t1:result", Kind: transcript.KindMessage, Role: transcript.RoleTool, ToolCallID: "c1", Content: "found"},
		{Seq: 5, ID: "t1:reply", Kind: transcript.KindMessage, Role: transcript.RoleAssistant, Content: "echo: one"},
		{Seq: 6, ID: "t1:end", Kind: transcript.KindTurnEnd, TurnID: "t1"},
		{Seq: 7, ID: "t2:u:2", Kind: transcript.KindMessage, Role: transcript.RoleUser, Content: "two", InboxSeq: 2},
		{Seq: 8, ID: "t2:reply", Kind: transcript.KindMessage, Role: transcript.RoleAssistant, Content: "echo: two"},
		{Seq: 9, ID: "undo", Kind: transcript.KindRewind, Rewound: []uint64{7, 8}},
		{Seq: 10, ID: "t3:u:3", Kind: transcript.KindMessage, Role: transcript.RoleUser, Content: "three", InboxSeq: 3},
	}
	st := newTxState("s1", nil, 0)
	for i, e := range entries {
		st.add(&e)
		want := historyOf(transcript.Effective(entries[:i+1]))
		if got := st.agentHistory(); !reflect.DeepEqual(got, want) {
			t.Fatalf("after entry %d: history\n%+v\nwant\n%+v", e.Seq, got, want)
		}
	}
	if n := len(st.agentHistory()); n != 5 {
		t.Fatalf("%d messages in the history, want 5 (the undone turn left out)", n)
	}
	// Loaded at once, the same.
	if got, want := newTxState("s1", entries, 0).agentHistory(), historyOf(transcript.Effective(entries)); !reflect.DeepEqual(got, want) {
		t.Fatalf("loaded: history %+v, want %+v", got, want)
	}
}
