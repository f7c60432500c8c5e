package session_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/session"
)

func TestParsePlatform(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    session.Platform
		wantErr bool
	}{
		{in: "telegram", want: session.PlatformTelegram},
		{in: "WhatsApp", want: session.PlatformWhatsApp},
		{in: "  slack ", want: session.PlatformSlack},
		{in: "homeassistant", want: session.PlatformHomeAssistant},
		{in: "http", want: session.PlatformHTTP},
		{in: "cli", want: session.PlatformCLI},
		{in: "", wantErr: true},
		{in: "myspace", wantErr: true},
		{in: "tele gram", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := session.ParsePlatform(tt.in)
			if tt.wantErr {
				if !errors.Is(err, session.ErrUnknownPlatform) {
					t.Fatalf("ParsePlatform(%q) error = %v, want ErrUnknownPlatform", tt.in, err)
				}
				if !strings.Contains(err.Error(), "\""+tt.in+"\"") {
					t.Errorf("error %q does not name %q", err, tt.in)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParsePlatform(%q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Errorf("ParsePlatform(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestKnownPlatforms(t *testing.T) {
	t.Parallel()
	ps := session.KnownPlatforms()
	if got, want := len(ps), 16; got != want {
		t.Fatalf("len(KnownPlatforms()) = %d, want %d", got, want)
	}
	seen := map[session.Platform]bool{}
	for _, p := range ps {
		if seen[p] {
			t.Errorf("duplicate platform %q", p)
		}
		seen[p] = true
		if !p.Known() {
			t.Errorf("%q.Known() = false", p)
		}
		got, err := session.ParsePlatform(string(p))
		if err != nil || got != p {
			t.Errorf("ParsePlatform(%q) = %q, %v", p, got, err)
		}
		if p.DisplayName() == "" {
			t.Errorf("%q has no display name", p)
		}
	}
	// The caller owns the returned slice.
	ps[0] = "mutated"
	if got := session.KnownPlatforms()[0]; got != session.PlatformTelegram {
		t.Errorf("KnownPlatforms()[0] = %q after mutating a copy", got)
	}
	if got, want := session.PlatformWhatsApp.DisplayName(), "WhatsApp"; got != want {
		t.Errorf("DisplayName() = %q, want %q", got, want)
	}
	if got, want := session.Platform("zork").DisplayName(), "zork"; got != want {
		t.Errorf("DisplayName() = %q, want %q", got, want)
	}
}

func TestSessionSourceNormalize(t *testing.T) {
	t.Parallel()
	s := session.SessionSource{Platform: session.PlatformTelegram, ChatID: " 1 "}
	s.Normalize()
	if got, want := s.ChatType, session.ChatDM; got != want {
		t.Errorf("ChatType = %q, want %q", got, want)
	}
	if got, want := s.ChatID, " 1 "; got != want {
		t.Errorf("ChatID = %q, want %q (ids are never altered)", got, want)
	}
	s = session.SessionSource{Platform: session.PlatformTelegram, ChatType: session.ChatGroup}
	s.Normalize()
	if got, want := s.ChatType, session.ChatGroup; got != want {
		t.Errorf("ChatType = %q, want %q", got, want)
	}
}

func TestSessionSourceValidate(t *testing.T) {
	t.Parallel()
	valid := func() session.SessionSource {
		return session.SessionSource{
			Platform: session.PlatformTelegram, ChatType: session.ChatGroup, ChatID: "-100123",
			UserID: "42", UserIDAlt: "uuid-1", ThreadID: "7", ChatIDAlt: "alt", GuildID: "g",
			ParentChatID: "p", MessageID: "m1", UserName: "Alice / Bob", ChatName: "a/b..c",
		}
	}
	tests := []struct {
		name    string
		mutate  func(*session.SessionSource)
		wantErr error
		wantMsg []string // substrings of the error
	}{
		{name: "valid", mutate: func(*session.SessionSource) {}},
		{name: "empty chat type means dm", mutate: func(s *session.SessionSource) { s.ChatType = "" }},
		{name: "dm", mutate: func(s *session.SessionSource) { s.ChatType = "dm" }},
		{name: "channel", mutate: func(s *session.SessionSource) { s.ChatType = "channel" }},
		{name: "thread", mutate: func(s *session.SessionSource) { s.ChatType = "thread" }},
		{name: "matrix style ids", mutate: func(s *session.SessionSource) {
			s.Platform, s.ChatID, s.UserID = session.PlatformMatrix, "!room:example.org", "@alice:example.org"
		}},
		{name: "id of 256 bytes", mutate: func(s *session.SessionSource) { s.ChatID = strings.Repeat("a", 256) }},
		{name: "unicode id", mutate: func(s *session.SessionSource) { s.UserID = "ünïcødé-用户" }},
		{
			name: "unknown platform", mutate: func(s *session.SessionSource) { s.Platform = "myspace" },
			wantErr: session.ErrUnknownPlatform, wantMsg: []string{`"myspace"`},
		},
		{
			name: "empty platform", mutate: func(s *session.SessionSource) { s.Platform = "" },
			wantErr: session.ErrUnknownPlatform, wantMsg: []string{`""`},
		},
		{
			name: "bad chat type", mutate: func(s *session.SessionSource) { s.ChatType = "forum" },
			wantErr: session.ErrInvalidChatType, wantMsg: []string{`"forum"`},
		},
		{
			name: "slash in chat id", mutate: func(s *session.SessionSource) { s.ChatID = "a/b" },
			wantErr: session.ErrInvalidID, wantMsg: []string{"chat_id", `"a/b"`},
		},
		{
			name: "backslash in user id", mutate: func(s *session.SessionSource) { s.UserID = `a\b` },
			wantErr: session.ErrInvalidID, wantMsg: []string{"user_id", `"a\\b"`},
		},
		{
			name: "dot dot in user_id_alt", mutate: func(s *session.SessionSource) { s.UserIDAlt = "x..y" },
			wantErr: session.ErrInvalidID, wantMsg: []string{"user_id_alt", `".."`},
		},
		{
			name: "traversal in thread id", mutate: func(s *session.SessionSource) { s.ThreadID = "../../etc/passwd" },
			wantErr: session.ErrInvalidID, wantMsg: []string{"thread_id"},
		},
		{
			name: "NUL in chat_id_alt", mutate: func(s *session.SessionSource) { s.ChatIDAlt = "a\x00b" },
			wantErr: session.ErrInvalidID, wantMsg: []string{"chat_id_alt", "U+0000"},
		},
		{
			name: "newline in guild id", mutate: func(s *session.SessionSource) { s.GuildID = "g\n1" },
			wantErr: session.ErrInvalidID, wantMsg: []string{"guild_id", "U+000A"},
		},
		{
			name: "DEL in parent chat id", mutate: func(s *session.SessionSource) { s.ParentChatID = "p\x7f" },
			wantErr: session.ErrInvalidID, wantMsg: []string{"parent_chat_id", "U+007F"},
		},
		{
			name: "C1 control in message id", mutate: func(s *session.SessionSource) { s.MessageID = "m\u0085" },
			wantErr: session.ErrInvalidID, wantMsg: []string{"message_id", "U+0085"},
		},
		{
			name: "invalid utf-8", mutate: func(s *session.SessionSource) { s.UserID = "a\xffb" },
			wantErr: session.ErrInvalidID, wantMsg: []string{"user_id", "UTF-8"},
		},
		{
			name: "replacement character (what a decoder leaves of invalid UTF-8)", mutate: func(s *session.SessionSource) { s.ChatID = "a\uFFFDb" },
			wantErr: session.ErrInvalidID, wantMsg: []string{"chat_id", "U+FFFD"},
		},
		{
			name: "overlong chat name", mutate: func(s *session.SessionSource) { s.ChatName = strings.Repeat("n", session.MaxNameLength+1) },
			wantErr: session.ErrInvalidName, wantMsg: []string{"chat_name", "1025 bytes", "1024"},
		},
		{
			name: "overlong user name", mutate: func(s *session.SessionSource) { s.UserName = strings.Repeat("n", session.MaxNameLength+1) },
			wantErr: session.ErrInvalidName, wantMsg: []string{"user_name"},
		},
		{
			name: "invalid utf-8 in chat topic", mutate: func(s *session.SessionSource) { s.ChatTopic = "t\xff" },
			wantErr: session.ErrInvalidName, wantMsg: []string{"chat_topic", "UTF-8"},
		},
		{
			name: "overlong id", mutate: func(s *session.SessionSource) { s.MessageID = strings.Repeat("m", 257) },
			wantErr: session.ErrInvalidID, wantMsg: []string{"message_id", "257 bytes", "256"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := valid()
			tt.mutate(&s)
			err := s.Validate()
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Validate() = %v, want %v", err, tt.wantErr)
			}
			for _, sub := range tt.wantMsg {
				if !strings.Contains(err.Error(), sub) {
					t.Errorf("Validate() = %q, want it to mention %q", err, sub)
				}
			}
		})
	}
}

func TestSessionSourceValidateReportsEveryProblem(t *testing.T) {
	t.Parallel()
	s := session.SessionSource{Platform: "nope", ChatType: "forum", ChatID: "a/b", UserID: "..", MessageID: strings.Repeat("x", 1000)}
	err := s.Validate()
	for _, want := range []error{session.ErrUnknownPlatform, session.ErrInvalidChatType, session.ErrInvalidID} {
		if !errors.Is(err, want) {
			t.Errorf("Validate() = %v, want it to wrap %v", err, want)
		}
	}
	for _, field := range []string{"chat_id", "user_id", "message_id"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("Validate() = %q, want it to name %s", err, field)
		}
	}
	// The overlong value is cut in the message.
	if strings.Contains(err.Error(), strings.Repeat("x", 100)) {
		t.Errorf("Validate() message holds the whole 1000-byte value")
	}
}

func TestValidateID(t *testing.T) {
	t.Parallel()
	if err := session.ValidateID("chat_id", ""); err != nil {
		t.Errorf("ValidateID(empty) = %v", err)
	}
	if err := session.ValidateID("chat_id", "1.2"); err != nil {
		t.Errorf("ValidateID(1.2) = %v", err)
	}
	err := session.ValidateID("chat_id", "a/b")
	if got, want := err.Error(), `invalid identifier: chat_id "a/b": contains path separator '/'`; got != want {
		t.Errorf("ValidateID() = %q, want %q", got, want)
	}
}

func TestSessionSourceDescription(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		src  session.SessionSource
		want string
	}{
		{
			name: "dm with user name",
			src:  session.SessionSource{Platform: session.PlatformTelegram, ChatType: "dm", ChatID: "1", UserID: "42", UserName: "Alice"},
			want: "DM with Alice",
		},
		{
			name: "dm with user id",
			src:  session.SessionSource{Platform: session.PlatformTelegram, ChatType: "dm", ChatID: "1", UserID: "42"},
			want: "DM with 42",
		},
		{
			name: "dm with nobody",
			src:  session.SessionSource{Platform: session.PlatformTelegram, ChatType: "dm"},
			want: "DM with user",
		},
		{
			name: "empty chat type is a dm",
			src:  session.SessionSource{Platform: session.PlatformSignal, UserName: "Bob"},
			want: "DM with Bob",
		},
		{
			name: "dm thread",
			src:  session.SessionSource{Platform: session.PlatformTelegram, ChatType: "dm", UserName: "Alice", ThreadID: "9"},
			want: "DM with Alice, thread: 9",
		},
		{
			name: "group with name and thread",
			src:  session.SessionSource{Platform: session.PlatformTelegram, ChatType: "group", ChatID: "-100", ChatName: "My Group", ThreadID: "12345"},
			want: "group: My Group, thread: 12345",
		},
		{
			name: "group without name",
			src:  session.SessionSource{Platform: session.PlatformTelegram, ChatType: "group", ChatID: "-100", UserName: "Alice"},
			want: "group: -100",
		},
		{
			name: "channel",
			src:  session.SessionSource{Platform: session.PlatformSlack, ChatType: "channel", ChatID: "C1", ChatName: "general"},
			want: "channel: general",
		},
		{
			name: "thread chat type has no prefix",
			src:  session.SessionSource{Platform: session.PlatformDiscord, ChatType: "thread", ChatID: "555", ChatName: "help", ThreadID: "555"},
			want: "help, thread: 555",
		},
		{
			name: "local",
			src:  session.SessionSource{Platform: session.PlatformLocal, ChatType: "dm", UserName: "me"},
			want: "CLI terminal",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.src.Description(); got != tt.want {
				t.Errorf("Description() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestSessionSourceParticipantID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		src  session.SessionSource
		want string
	}{
		{session.SessionSource{UserID: "u", UserIDAlt: "alt"}, "alt"},
		{session.SessionSource{UserID: "u"}, "u"},
		{session.SessionSource{}, ""},
	}
	for _, tt := range tests {
		if got := tt.src.ParticipantID(); got != tt.want {
			t.Errorf("%+v.ParticipantID() = %q, want %q", tt.src, got, tt.want)
		}
	}
}

func TestSessionSourceJSONRoundTrip(t *testing.T) {
	t.Parallel()
	full := session.SessionSource{
		Platform: session.PlatformDiscord, ChatID: "c1", ChatName: "general", ChatType: "thread",
		UserID: "u1", UserName: "Alice", ThreadID: "t1", ChatTopic: "topic", UserIDAlt: "ua",
		ChatIDAlt: "ca", IsBot: true, GuildID: "g1", ParentChatID: "p1", MessageID: "m1", RoleAuthorized: true,
	}
	data, err := json.Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{
		"platform", "chat_id", "chat_name", "chat_type", "user_id", "user_name", "thread_id", "chat_topic",
		"user_id_alt", "chat_id_alt", "is_bot", "guild_id", "parent_chat_id", "message_id", "role_authorized",
	} {
		if _, ok := raw[k]; !ok {
			t.Errorf("JSON lacks %q: %s", k, data)
		}
	}
	var back session.SessionSource
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if back != full {
		t.Errorf("round trip = %+v, want %+v", back, full)
	}

	// A minimal source omits the optional fields and still round-trips.
	minimal := session.SessionSource{Platform: session.PlatformTelegram, ChatID: "1", ChatType: "dm"}
	data, err = json.Marshal(minimal)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(data), `{"platform":"telegram","chat_id":"1","chat_type":"dm"}`; got != want {
		t.Errorf("Marshal = %s, want %s", got, want)
	}
	back = session.SessionSource{}
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, minimal) {
		t.Errorf("round trip = %+v, want %+v", back, minimal)
	}
}
