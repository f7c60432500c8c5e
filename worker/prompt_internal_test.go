package worker

import (
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
)

// TestContextPromptMemo: the lane's memoized context prompt is always the
// one session.BuildContextPrompt builds from the same source and entry: kept
// across turns that change only the message id, built again when the
// source, the session or the entry's absence changes.
func TestContextPromptMemo(t *testing.T) {
	opts := session.ContextOptions{KeyOptions: session.DefaultKeyOptions(), HomeChannels: map[session.Platform]string{"telegram": "-100"}}
	l := &lane{owner: &owner{w: &Worker{cfg: Config{Context: opts}}}}
	created := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	src := session.SessionSource{Platform: "telegram", ChatID: "-100123", ChatType: "group", UserID: "42", UserName: "Ann", MessageID: "1"}
	entry := &session.SessionEntry{SessionKey: "agent:main:telegram:group:-100123", SessionID: "20261127_120000_00000001", CreatedAt: created}
	check := func(step string) {
		t.Helper()
		want := session.BuildContextPrompt(src, l.entry, opts)
		if got := l.contextPrompt(src); got != want {
			t.Fatalf("%s: prompt\n%s\nwant\n%s", step, got, want)
		}
	}
	check("no entry")
	l.entry = entry
	check("entry")
	src.MessageID = "2"
	check("next message")
	src.UserName = "Bob"
	check("another sender name")
	src.ChatTopic = "topic"
	check("a topic")
	l.entry = &session.SessionEntry{SessionKey: entry.SessionKey, SessionID: "20261127_130000_00000002", CreatedAt: created}
	check("another session id")
	l.entry = &session.SessionEntry{SessionKey: entry.SessionKey, SessionID: "20261127_130000_00000002", CreatedAt: created.Add(time.Hour)}
	check("another creation time")
	l.entry = &session.SessionEntry{SessionKey: entry.SessionKey + ":x", SessionID: "20261127_130000_00000002", CreatedAt: created.Add(time.Hour)}
	check("another session key")
	l.entry = &session.SessionEntry{SessionID: "20261127_130000_00000002", CreatedAt: created.Add(time.Hour)}
	check("no session key")
	l.entry = nil
	check("entry gone")
}
