package session_test

import (
	"testing"

	"github.com/agentfleet/agentfleet/session"
)

func TestDefaultKeyOptions(t *testing.T) {
	t.Parallel()
	o := session.DefaultKeyOptions()
	if !o.GroupSessionsPerUser || o.ThreadSessionsPerUser || o.WhatsApp != nil {
		t.Errorf("DefaultKeyOptions() = %+v, want group per user, threads shared, no resolver", o)
	}
}

// TestBuildSessionKeySeedExamples holds every example of
// seeds/session-lifecycle.md §4 (the WhatsApp ones are in whatsapp_test.go).
func TestBuildSessionKeySeedExamples(t *testing.T) {
	t.Parallel()
	perUser := session.DefaultKeyOptions()
	shared := session.KeyOptions{GroupSessionsPerUser: false, ThreadSessionsPerUser: false}
	threadPerUser := session.KeyOptions{GroupSessionsPerUser: true, ThreadSessionsPerUser: true}
	tests := []struct {
		name string
		src  session.SessionSource
		opts session.KeyOptions
		want string
	}{
		// DM rules.
		{
			name: "DM with chat_id",
			src:  session.SessionSource{Platform: "telegram", ChatType: "dm", ChatID: "12345", UserID: "user_abc"},
			opts: perUser, want: "agent:main:telegram:dm:12345",
		},
		{
			name: "DM with chat_id + thread",
			src:  session.SessionSource{Platform: "telegram", ChatType: "dm", ChatID: "12345", ThreadID: "thread_678", UserID: "user_abc"},
			opts: perUser, want: "agent:main:telegram:dm:12345:thread_678",
		},
		{
			name: "DM without chat_id, with participant_id",
			src:  session.SessionSource{Platform: "signal", ChatType: "dm", UserID: "user_abc"},
			opts: perUser, want: "agent:main:signal:dm:user_abc",
		},
		{
			name: "DM without chat_id or participant_id",
			src:  session.SessionSource{Platform: "telegram", ChatType: "dm"},
			opts: perUser, want: "agent:main:telegram:dm",
		},
		// Group/channel rules.
		{
			name: "Group chat",
			src:  session.SessionSource{Platform: "telegram", ChatType: "group", ChatID: "-10012345", UserID: "user_abc"},
			opts: shared, want: "agent:main:telegram:group:-10012345",
		},
		{
			name: "Group chat, per-user isolation",
			src:  session.SessionSource{Platform: "telegram", ChatType: "group", ChatID: "-10012345", UserID: "user_abc"},
			opts: perUser, want: "agent:main:telegram:group:-10012345:user_abc",
		},
		{
			name: "Thread in group, shared",
			src:  session.SessionSource{Platform: "discord", ChatType: "group", ChatID: "12345", ThreadID: "thread_678", UserID: "user_abc"},
			opts: perUser, want: "agent:main:discord:group:12345:thread_678",
		},
		{
			name: "Thread in group, per-user",
			src:  session.SessionSource{Platform: "discord", ChatType: "group", ChatID: "12345", ThreadID: "thread_678", UserID: "user_abc"},
			opts: threadPerUser, want: "agent:main:discord:group:12345:thread_678:user_abc",
		},
		{
			name: "Channel",
			src:  session.SessionSource{Platform: "slack", ChatType: "channel", ChatID: "C12345"},
			opts: perUser, want: "agent:main:slack:channel:C12345",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := session.BuildSessionKey(tt.src, tt.opts); got != tt.want {
				t.Errorf("BuildSessionKey() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestBuildSessionKeyRules(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		src  session.SessionSource
		opts session.KeyOptions
		want string
	}{
		{
			name: "empty chat type is a DM",
			src:  session.SessionSource{Platform: "telegram", ChatID: "12345"},
			opts: session.DefaultKeyOptions(), want: "agent:main:telegram:dm:12345",
		},
		{
			name: "DM participant prefers user_id_alt",
			src:  session.SessionSource{Platform: "signal", ChatType: "dm", UserID: "+15551234567", UserIDAlt: "uuid-abc"},
			opts: session.DefaultKeyOptions(), want: "agent:main:signal:dm:uuid-abc",
		},
		{
			name: "DM with chat_id ignores the participant",
			src:  session.SessionSource{Platform: "signal", ChatType: "dm", ChatID: "c1", UserID: "u1", UserIDAlt: "a1"},
			opts: session.DefaultKeyOptions(), want: "agent:main:signal:dm:c1",
		},
		{
			name: "DM without chat_id: participant stands in for it, then the thread",
			src:  session.SessionSource{Platform: "signal", ChatType: "dm", UserID: "u1", ThreadID: "t1"},
			opts: session.DefaultKeyOptions(), want: "agent:main:signal:dm:u1:t1",
		},
		{
			name: "DM with only a thread",
			src:  session.SessionSource{Platform: "telegram", ChatType: "dm", ThreadID: "t1"},
			opts: session.DefaultKeyOptions(), want: "agent:main:telegram:dm:t1",
		},
		{
			name: "DM per-user options change nothing",
			src:  session.SessionSource{Platform: "telegram", ChatType: "dm", ChatID: "1", UserID: "u"},
			opts: session.KeyOptions{GroupSessionsPerUser: true, ThreadSessionsPerUser: true}, want: "agent:main:telegram:dm:1",
		},
		{
			name: "group participant prefers user_id_alt",
			src:  session.SessionSource{Platform: "feishu", ChatType: "group", ChatID: "oc_1", UserID: "ou_1", UserIDAlt: "on_1"},
			opts: session.DefaultKeyOptions(), want: "agent:main:feishu:group:oc_1:on_1",
		},
		{
			name: "group per user without any user id",
			src:  session.SessionSource{Platform: "telegram", ChatType: "group", ChatID: "-1"},
			opts: session.DefaultKeyOptions(), want: "agent:main:telegram:group:-1",
		},
		{
			name: "channel per user",
			src:  session.SessionSource{Platform: "slack", ChatType: "channel", ChatID: "C1", UserID: "U1"},
			opts: session.DefaultKeyOptions(), want: "agent:main:slack:channel:C1:U1",
		},
		{
			name: "channel shared",
			src:  session.SessionSource{Platform: "slack", ChatType: "channel", ChatID: "C1", UserID: "U1"},
			opts: session.KeyOptions{}, want: "agent:main:slack:channel:C1",
		},
		{
			name: "thread per user even when groups are shared",
			src:  session.SessionSource{Platform: "slack", ChatType: "channel", ChatID: "C1", ThreadID: "1700000000.1234", UserID: "U1"},
			opts: session.KeyOptions{GroupSessionsPerUser: false, ThreadSessionsPerUser: true},
			want: "agent:main:slack:channel:C1:1700000000.1234:U1",
		},
		{
			name: "thread chat type without thread id follows the group rule",
			src:  session.SessionSource{Platform: "discord", ChatType: "thread", ChatID: "555", UserID: "U1"},
			opts: session.DefaultKeyOptions(), want: "agent:main:discord:thread:555:U1",
		},
		{
			name: "thread chat type with thread id is shared by default",
			src:  session.SessionSource{Platform: "discord", ChatType: "thread", ChatID: "555", ThreadID: "555", UserID: "U1"},
			opts: session.DefaultKeyOptions(), want: "agent:main:discord:thread:555:555",
		},
		{
			name: "group without chat id",
			src:  session.SessionSource{Platform: "telegram", ChatType: "group", UserID: "u"},
			opts: session.DefaultKeyOptions(), want: "agent:main:telegram:group:u",
		},
		{
			name: "ids are inserted raw but for ':' and '%', which are escaped",
			src:  session.SessionSource{Platform: "matrix", ChatType: "group", ChatID: "!room:example.org", UserID: "@alice:example.org"},
			opts: session.DefaultKeyOptions(), want: "agent:main:matrix:group:!room%3Aexample.org:@alice%3Aexample.org",
		},
		{
			name: "a percent sign is escaped too",
			src:  session.SessionSource{Platform: "http", ChatType: "dm", ChatID: "50%3A"},
			opts: session.DefaultKeyOptions(), want: "agent:main:http:dm:50%253A",
		},
		{
			name: "non-WhatsApp ids are not normalized",
			src:  session.SessionSource{Platform: "signal", ChatType: "dm", ChatID: "+15551234567"},
			opts: session.DefaultKeyOptions(), want: "agent:main:signal:dm:+15551234567",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := session.BuildSessionKey(tt.src, tt.opts); got != tt.want {
				t.Errorf("BuildSessionKey() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestIsSharedMultiUserSession(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		chatType     string
		threadID     string
		group, tread bool
		want         bool
	}{
		{"dm never shared", "dm", "", false, false, false},
		{"dm thread never shared", "dm", "t", false, false, false},
		{"empty chat type is dm", "", "", false, false, false},
		{"group per user", "group", "", true, false, false},
		{"group shared", "group", "", false, false, true},
		{"channel per user", "channel", "", true, true, false},
		{"channel shared", "channel", "", false, true, true},
		{"thread shared by default", "group", "t", true, false, true},
		{"thread per user", "group", "t", true, true, false},
		{"thread per user, groups shared", "group", "t", false, true, false},
		{"thread shared, groups shared", "channel", "t", false, false, true},
		{"thread chat type without thread id uses the group rule", "thread", "", true, false, false},
		{"thread chat type with thread id", "thread", "t", true, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			src := session.SessionSource{Platform: "slack", ChatType: tt.chatType, ChatID: "C1", ThreadID: tt.threadID, UserID: "U1"}
			opts := session.KeyOptions{GroupSessionsPerUser: tt.group, ThreadSessionsPerUser: tt.tread}
			if got := session.IsSharedMultiUserSession(src, opts); got != tt.want {
				t.Errorf("IsSharedMultiUserSession() = %v, want %v", got, tt.want)
			}
			// The key carries the participant exactly when the session is not shared
			// (for non-DMs).
			if src.ChatType != "" && src.ChatType != "dm" {
				key := session.BuildSessionKey(src, opts)
				hasUser := len(key) > 3 && key[len(key)-3:] == ":U1"
				if hasUser == tt.want {
					t.Errorf("key %q: participant present = %v, shared = %v", key, hasUser, tt.want)
				}
			}
		})
	}
}
