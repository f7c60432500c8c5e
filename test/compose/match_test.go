package compose

import (
	"testing"

	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
)

// sent is one message the chaos client got a 202 for: its platform message
// id (what the ingress de-duplicates on, built from the client's chat and
// message_id) and the inbox seq the 202 named.
type sent struct {
	idx  int
	id   string
	seq  uint64
	text string
}

// httpMsgID is the platform message id the HTTP adapter gives a message
// posted with chatID and messageID (Fleet-Msg-Id / Nats-Msg-Id).
func httpMsgID(chatID, messageID string) string {
	return string(session.PlatformHTTP) + ":" + session.EscapeKeySegment(chatID) + ":" + session.EscapeKeySegment(messageID)
}

// matched is what matchMessages found for the sent messages of one lane.
type matched struct {
	// at is, per sent message (same index), the inbox seq of the user
	// entry that holds it; 0 when none does.
	at []uint64
	// count is, per sent message, how many effective user entries hold it.
	count []int
	// stray are user entries that hold no sent message of the lane.
	stray []transcript.Entry
	// order is the sent messages' indexes in transcript order.
	order []int
}

// matchMessages matches a lane's sent messages with the user entries of its
// transcript by platform message id: idOf gives the id of the inbox message
// at a seq (false when the inbox does not have it; then the entry matches a
// sent message by seq). Matching by id, not by the seq a 202 named, is what
// tells a lost message from one whose first publish was stored although the
// ingress answered 503: the retry is stored again under another seq, the
// worker runs the first and ends the retry's turn as duplicate, and the
// message is in the transcript under the first seq.
func matchMessages(msgs []sent, users []transcript.Entry, idOf func(seq uint64) (string, bool)) matched {
	r := matched{at: make([]uint64, len(msgs)), count: make([]int, len(msgs))}
	byID := map[string]int{}
	bySeq := map[uint64]int{}
	for i, m := range msgs {
		byID[m.id] = i
		bySeq[m.seq] = i
	}
	for _, u := range users {
		i, ok := -1, false
		if id, known := idOf(u.InboxSeq); known {
			i, ok = byID[id]
		} else {
			i, ok = bySeq[u.InboxSeq]
		}
		if !ok {
			r.stray = append(r.stray, u)
			continue
		}
		r.count[i]++
		if r.at[i] == 0 {
			r.at[i] = u.InboxSeq
		}
		r.order = append(r.order, i)
	}
	return r
}

// TestMatchMessages: a message whose 202 named the seq of a retry the
// worker ended as duplicate is found under its first seq; a message in no
// user entry is lost; one in two entries is duplicated; out of order shows.
func TestMatchMessages(t *testing.T) {
	msgs := []sent{
		{idx: 0, id: httpMsgID("c", "m0"), seq: 10, text: "a"},
		{idx: 1, id: httpMsgID("c", "m1"), seq: 14, text: "b"}, // first stored at 12, 202 from the retry at 14
		{idx: 2, id: httpMsgID("c", "m2"), seq: 15, text: "c"}, // lost
		{idx: 3, id: httpMsgID("c", "m3"), seq: 16, text: "d"}, // twice
	}
	inbox := map[uint64]string{10: msgs[0].id, 12: msgs[1].id, 14: msgs[1].id, 15: msgs[2].id, 16: msgs[3].id, 17: msgs[3].id}
	idOf := func(seq uint64) (string, bool) { id, ok := inbox[seq]; return id, ok }
	users := []transcript.Entry{{InboxSeq: 10}, {InboxSeq: 12}, {InboxSeq: 16}, {InboxSeq: 17}}
	r := matchMessages(msgs, users, idOf)
	if r.count[0] != 1 || r.count[1] != 1 || r.at[1] != 12 {
		t.Errorf("found %v at %v: message 1 is at seq 12", r.count, r.at)
	}
	if r.count[2] != 0 || r.at[2] != 0 {
		t.Errorf("the lost message counted %d at %d", r.count[2], r.at[2])
	}
	if r.count[3] != 2 {
		t.Errorf("the duplicated message counted %d", r.count[3])
	}
	// The seq-only match (what the checker did) calls message 1 lost.
	bySeq := matchMessages(msgs, users, func(uint64) (string, bool) { return "", false })
	if bySeq.count[1] != 0 || len(bySeq.stray) != 2 {
		t.Errorf("by seq: %v, stray %v", bySeq.count, bySeq.stray)
	}
	// A stray entry and the order.
	r = matchMessages(msgs, []transcript.Entry{{InboxSeq: 12}, {InboxSeq: 10}, {InboxSeq: 99}}, idOf)
	if len(r.stray) != 1 || r.stray[0].InboxSeq != 99 || len(r.order) != 2 || r.order[0] != 1 || r.order[1] != 0 {
		t.Errorf("stray %v, order %v", r.stray, r.order)
	}
}
