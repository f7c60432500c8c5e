package session_test

import (
	"fmt"
	"time"

	"github.com/agentfleet/agentfleet/session"
)

func ExampleBuildSessionKey() {
	src := session.SessionSource{
		Platform: session.PlatformTelegram, ChatType: session.ChatGroup,
		ChatID: "-10012345", UserID: "user_abc", UserName: "Alice",
	}
	fmt.Println(session.BuildSessionKey(src, session.DefaultKeyOptions()))

	src.ThreadID = "thread_678" // threads are shared by default
	fmt.Println(session.BuildSessionKey(src, session.DefaultKeyOptions()))
	// Output:
	// agent:main:telegram:group:-10012345:user_abc
	// agent:main:telegram:group:-10012345:thread_678
}

func ExampleLaneToken() {
	lane := session.LaneToken("agent:main:whatsapp:group:120363@g.us:15551234567")
	fmt.Println(lane)
	key, _ := session.ParseLaneToken(lane)
	fmt.Println(key)
	fmt.Println(session.Partition("fleet", lane))
	// Output:
	// agent.main.whatsapp.group.120363=40g=2Eus.15551234567
	// agent:main:whatsapp:group:120363@g.us:15551234567
	// 54
}

func ExampleDecide() {
	now := time.Date(2026, 6, 16, 12, 0, 0, 0, time.UTC)
	entry := &session.SessionEntry{
		SessionKey: "agent:main:telegram:dm:12345", SessionID: "20260614_080000_0a1b2c3d",
		UpdatedAt: now.Add(-25 * time.Hour),
	}
	policy := session.ResetConfig{}.PolicyFor(session.PlatformTelegram, session.ChatDM) // the default policy
	d := session.Decide(entry, policy, now, time.UTC, 0, func() string { return "20260616_120000_9f86d081" })
	fmt.Printf("%s reset=%v reason=%s previous=%s\n", d.SessionID, d.Reset, d.Reason, d.PreviousSessionID)
	// Output:
	// 20260616_120000_9f86d081 reset=true reason=idle previous=20260614_080000_0a1b2c3d
}
