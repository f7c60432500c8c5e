package transcript_test

import (
	"reflect"
	"testing"

	"github.com/agentfleet/agentfleet/transcript"
)

func m(seq uint64, role, content string) transcript.Entry {
	return transcript.Entry{Seq: seq, Kind: transcript.KindMessage, Role: role, Content: content}
}

func rewind(seq uint64, seqs ...uint64) transcript.Entry {
	return transcript.Entry{Seq: seq, Kind: transcript.KindRewind, Rewound: seqs}
}

func contents(entries []transcript.Entry) []string {
	out := []string{}
	for _, e := range entries {
		out = append(out, e.Content)
	}
	return out
}

func TestEffective(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		entries []transcript.Entry
		want    []string
	}{
		{"empty", nil, []string{}},
		{"messages only", []transcript.Entry{
			{Seq: 1, Kind: transcript.KindFence, Epoch: 1, Owner: "a"},
			m(2, "user", "u"), m(3, "assistant", "a"), m(4, "tool", "t"), m(5, "system", "s"),
			{Seq: 6, Kind: transcript.KindNotice, Content: "notice"},
			{Seq: 7, Kind: transcript.KindTurnEnd, TurnID: "x", Status: "completed"},
			{Seq: 8, Kind: "future_kind", Content: "?"},
			m(9, "robot", "unknown role"),
		}, []string{"u", "a", "t", "s"}},
		{"rewind applied without Load", []transcript.Entry{
			m(1, "user", "u1"), m(2, "assistant", "a1"), m(3, "user", "u2"), rewind(4, 3),
		}, []string{"u1", "a1"}},
		{"Deleted flag honoured", []transcript.Entry{
			m(1, "user", "u1"), {Seq: 2, Kind: transcript.KindMessage, Role: "user", Content: "gone", Deleted: true},
		}, []string{"u1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]transcript.Entry(nil), tc.entries...)
			got := contents(transcript.Effective(in))
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Effective = %q, want %q", got, tc.want)
			}
			if !reflect.DeepEqual(in, tc.entries) {
				t.Fatal("Effective modified its input")
			}
		})
	}
}

func TestRewindUserTurns(t *testing.T) {
	t.Parallel()
	in := func(e transcript.Entry, turn string) transcript.Entry { e.TurnID = turn; return e }
	burst := []transcript.Entry{
		in(m(1, "user", "u1"), "t1"), in(m(2, "assistant", "a1"), "t1"),
		{Seq: 3, Kind: transcript.KindTurnEnd, TurnID: "t1", Status: "completed"},
		in(m(4, "user", "b1"), "t2"), in(m(5, "user", "b2"), "t2"), in(m(6, "user", "b3"), "t2"),
		in(m(7, "assistant", "call"), "t2"), in(m(8, "assistant", "a2"), "t2"),
	}
	steered := []transcript.Entry{
		in(m(1, "user", "u1"), "t1"), in(m(2, "assistant", "a1"), "t1"),
		in(m(3, "user", "s1"), "t2"), in(m(4, "tool", "result"), "t2"), in(m(5, "user", "s2"), "t2"), in(m(6, "assistant", "a2"), "t2"),
	}
	conv := []transcript.Entry{
		m(1, "system", "sys"),
		m(2, "user", "u1"), m(3, "assistant", "a1"),
		{Seq: 4, Kind: transcript.KindTurnEnd, TurnID: "t1", Status: "completed"},
		m(5, "user", "u2"), m(6, "assistant", "call"), m(7, "tool", "result"), m(8, "assistant", "a2"),
		{Seq: 9, Kind: transcript.KindNotice, Content: "n"},
		m(10, "user", "u3"), m(11, "assistant", "a3"),
	}
	for _, tc := range []struct {
		name     string
		entries  []transcript.Entry
		n        int
		want     []uint64 // nil: no entry
		turns    int
		wantText string
	}{
		{"undo last", conv, 1, []uint64{10, 11}, 1, "u3"},
		{"two turns, control entries skipped", conv, 2, []uint64{5, 6, 7, 8, 10, 11}, 2, "u2"},
		{"more than there are", conv, 9, []uint64{2, 3, 5, 6, 7, 8, 10, 11}, 3, "u1"},
		{"zero", conv, 0, nil, 0, ""},
		{"negative", conv, -1, nil, 0, ""},
		{"no user message", []transcript.Entry{m(1, "system", "s"), m(2, "assistant", "a")}, 1, nil, 0, ""},
		{"empty", nil, 1, nil, 0, ""},
		{"skips rewound turns", append(append([]transcript.Entry(nil), conv...), rewind(12, 10, 11)), 1, []uint64{5, 6, 7, 8}, 1, "u2"},
		{"user message at the end only", []transcript.Entry{m(1, "assistant", "a"), m(2, "user", "u")}, 1, []uint64{2}, 1, "u"},
		{"a burst is one turn", burst, 1, []uint64{4, 5, 6, 7, 8}, 1, "b1\nb2\nb3"},
		{"two turns, one a burst", burst, 2, []uint64{1, 2, 4, 5, 6, 7, 8}, 2, "u1"},
		{"steered message joins its turn", steered, 1, []uint64{3, 4, 5, 6}, 1, "s1\ns2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctl, turns, text := transcript.RewindUserTurns(tc.entries, tc.n)
			if tc.want == nil {
				if ctl != nil || turns != 0 || text != "" {
					t.Fatalf("got %+v, %d, %q; want nothing", ctl, turns, text)
				}
				return
			}
			if ctl == nil {
				t.Fatal("no control entry")
			}
			if ctl.Kind != transcript.KindRewind || !reflect.DeepEqual(ctl.Rewound, tc.want) {
				t.Fatalf("ctl = %s %v, want rewind %v", ctl.Kind, ctl.Rewound, tc.want)
			}
			if turns != tc.turns || text != tc.wantText {
				t.Fatalf("turns, text = %d, %q; want %d, %q", turns, text, tc.turns, tc.wantText)
			}
		})
	}
}

func TestTurnEnded(t *testing.T) {
	t.Parallel()
	entries := []transcript.Entry{
		m(1, "user", "u"),
		{Seq: 2, Kind: transcript.KindTurnEnd, TurnID: "t1", Status: transcript.StatusInterrupted},
		{Seq: 3, Kind: transcript.KindTurnEnd, TurnID: "t2", Status: transcript.StatusFailed},
		{Seq: 4, Kind: transcript.KindTurnEnd, TurnID: "t1", Status: transcript.StatusCompleted},
		{Seq: 5, Kind: transcript.KindMessage, Role: "assistant", TurnID: "t3"},
	}
	for _, tc := range []struct {
		turn, status string
		ok           bool
	}{
		{"t1", transcript.StatusCompleted, true}, // the last one wins
		{"t2", transcript.StatusFailed, true},
		{"t3", "", false}, // entries but no end
		{"nope", "", false},
		{"", "", false},
	} {
		if st, ok := transcript.TurnEnded(entries, tc.turn); st != tc.status || ok != tc.ok {
			t.Errorf("TurnEnded(%q) = %q, %v; want %q, %v", tc.turn, st, ok, tc.status, tc.ok)
		}
	}
}

func TestFenceEpoch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		entries []transcript.Entry
		want    uint64
	}{
		{"none", []transcript.Entry{m(1, "user", "u")}, 0},
		{"empty", nil, 0},
		{"last wins", []transcript.Entry{
			{Seq: 1, Kind: transcript.KindFence, Epoch: 3, Owner: "a"},
			m(2, "user", "u"),
			{Seq: 3, Kind: transcript.KindFence, Epoch: 8, Owner: "b"},
			m(4, "assistant", "a"),
		}, 8},
	} {
		if got := transcript.FenceEpoch(tc.entries); got != tc.want {
			t.Errorf("%s: FenceEpoch = %d, want %d", tc.name, got, tc.want)
		}
	}
}
