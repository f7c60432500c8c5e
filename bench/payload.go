package bench

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
)

// laneID is one benchmark lane as the HTTP adapter derives it.
type laneID struct {
	chatID, userID, userName string
	src                      session.SessionSource
	key                      string // session key
	lane                     string // lane token
	inbox                    string // inbox subject
	outbox                   string // reply subject
	mailbox                  string // mailbox subject
}

// newLaneID is lane i of a run: chat "bench-<i>", or "bench-<run id>-<i>".
func newLaneID(names broker.Names, runID string, i int) laneID {
	chat := fmt.Sprintf("bench-%d", i)
	if runID != "" {
		chat = fmt.Sprintf("bench-%s-%d", runID, i)
	}
	return namedLaneID(names, chat, i)
}

// namedLaneID is the HTTP DM lane of chat id chat, with user i.
func namedLaneID(names broker.Names, chat string, i int) laneID {
	l := laneID{
		chatID:   chat,
		userID:   fmt.Sprintf("u%d", i),
		userName: fmt.Sprintf("Bench User %d", i),
	}
	l.src = session.SessionSource{Platform: session.PlatformHTTP, ChatID: l.chatID, ChatType: session.ChatDM, UserID: l.userID, UserName: l.userName}
	l.src.Normalize()
	l.key = session.BuildSessionKey(l.src, session.DefaultKeyOptions())
	l.lane = session.LaneToken(l.key)
	l.inbox = names.InboxSubject(session.Partition(names.Prefix(), l.lane), l.lane)
	l.outbox = names.OutboxSubject(string(session.PlatformHTTP), l.lane)
	l.mailbox = names.BoxSubject(string(session.PlatformHTTP), l.lane)
	return l
}

// token identifies message n of lane i inside its text and its echo.
func token(i, n int) string { return "~" + strconv.Itoa(i) + "#" + strconv.Itoa(n) + "~" }

// text is the user text of message n of lane i: its token padded to size.
func text(i, n, size int) string {
	t := "bench " + token(i, n)
	if len(t) < size {
		t += " " + strings.Repeat("x", size-len(t)-1)
	}
	return t
}

// messageID is the platform message id the HTTP adapter derives.
func messageID(l laneID, n int) string {
	return string(session.PlatformHTTP) + ":" + l.chatID + ":" + strconv.Itoa(n)
}

// floorPayloads are the bodies one floor turn writes, encoded once from the
// same types and with values of the same sizes as the fleet's.
type floorPayloads struct {
	sessionID string
	inbound   []byte // inbox message
	intent    []byte // SessionEntry with the turn intent
	commit    []byte // SessionEntry after the commit
	user      []byte // transcript user entry
	assistant []byte // transcript assistant entry
	turnEnd   []byte // transcript turn_end entry
	reply     []byte // outbox reply
}

func newFloorPayloads(l laneID, i, textSize int) floorPayloads {
	now := time.Now().UTC()
	sid := session.NewSessionID(now)
	turnID := "0123456789abcdef"
	msg := text(i, 0, textSize)
	src := l.src
	src.MessageID = "0"
	in := session.Inbound{Source: src, SessionKey: l.key, Kind: session.KindMessage, Text: msg,
		PlatformMsgID: messageID(l, 0), ReceivedAt: now}
	entry := session.SessionEntry{
		SessionKey: l.key, SessionID: sid, CreatedAt: now, UpdatedAt: now, Origin: &src,
		Platform: src.Platform, ChatType: src.ChatType, CostStatus: "unknown",
		InputTokens: 1000, OutputTokens: 1000, TotalTokens: 2000, LastPromptTokens: 1,
		Owner: "bench-1/0123abcd", LeaseEpoch: 1000, InboxID: "0123456789abcdef0123456789abcdef",
		CommittedSeq: 100000, LastTurnID: turnID,
	}
	commit := entry
	intent := entry
	intent.Turn = &session.TurnIntent{ID: turnID, FirstSeq: 100001, LastSeq: 100001, Kind: session.KindMessage,
		Attempt: 1, SessionID: sid, Owner: entry.Owner, Epoch: entry.LeaseEpoch, StartedAt: now}
	user := transcript.Entry{ID: turnID + ":user:100001", Kind: transcript.KindMessage, Role: transcript.RoleUser,
		Content: msg, InboxSeq: 100001, TurnID: turnID, SenderName: l.userName, Timestamp: now}
	asst := transcript.Entry{ID: turnID + ":reply", Kind: transcript.KindMessage, Role: transcript.RoleAssistant,
		Content: "echo: " + msg, FinishReason: "stop", TokenCount: 1, TurnID: turnID, Timestamp: now}
	end := transcript.Entry{ID: turnID + ":end", Kind: transcript.KindTurnEnd, TurnID: turnID,
		Status: transcript.StatusCompleted, Timestamp: now}
	reply := session.Reply{ID: sid + ":100002", SessionKey: l.key, SessionID: sid, TurnID: turnID, TxSeq: 100002,
		Kind: session.ReplyKindReply, Text: "echo: " + msg, Platform: src.Platform, ChatID: src.ChatID, CreatedAt: now}
	return floorPayloads{
		sessionID: sid,
		inbound:   mustJSON(in),
		intent:    mustJSON(intent),
		commit:    mustJSON(commit),
		user:      mustJSON(user),
		assistant: mustJSON(asst),
		turnEnd:   mustJSON(end),
		reply:     mustJSON(reply),
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
