package session

import "strings"

// keyNamespace is the fixed head of every session key.
const keyNamespace = "agent:main"

// DefaultKeyOptions returns the default key options: group and channel
// sessions isolated per user, threads shared, WhatsApp ids normalized only.
func DefaultKeyOptions() KeyOptions {
	return KeyOptions{GroupSessionsPerUser: true, ThreadSessionsPerUser: false}
}

// BuildSessionKey derives the deterministic session key of src:
//
//	agent:main:{platform}:{chat_type}[:{chat_id}][:{thread_id}][:{participant_id}]
//
// An empty chat type is "dm". Identifiers are inserted raw, never redacted.
//
// DMs: the chat id when present (for WhatsApp, canonicalized through
// opts.WhatsApp, or only normalized when it is nil); without one, the
// participant id (user_id_alt, else user_id) takes its place; then the
// thread id when set. A DM with neither chat id nor participant collapses to
// agent:main:{platform}:dm.
//
// Groups, channels and threads: the chat id, then the thread id, then the
// participant id when per-user isolation applies (see
// IsSharedMultiUserSession): GroupSessionsPerUser when no thread id is set,
// ThreadSessionsPerUser when one is. For WhatsApp the participant is
// canonicalized (or normalized); the group chat id is not.
func BuildSessionKey(src SessionSource, opts KeyOptions) string {
	chatType := chatTypeOrDM(src.ChatType)
	parts := make([]string, 0, 7)
	parts = append(parts, keyNamespace, string(src.Platform), chatType)

	if chatType == ChatDM {
		chatID := src.ChatID
		if src.Platform == PlatformWhatsApp {
			chatID = opts.whatsAppID(chatID)
		}
		switch {
		case chatID != "":
			parts = append(parts, chatID)
		default:
			// No chat id: fall back to the sender, else every chat-id-less DM
			// of the platform would share one session.
			if p := participantID(src, opts); p != "" {
				parts = append(parts, p)
			}
		}
		if src.ThreadID != "" {
			parts = append(parts, src.ThreadID)
		}
		return strings.Join(parts, ":")
	}

	if src.ChatID != "" {
		parts = append(parts, src.ChatID)
	}
	if src.ThreadID != "" {
		parts = append(parts, src.ThreadID)
	}
	if !IsSharedMultiUserSession(src, opts) {
		if p := participantID(src, opts); p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, ":")
}

// IsSharedMultiUserSession reports whether src belongs to a session shared
// by several participants (seeds/session-lifecycle.md §5): never for a DM
// (an empty chat type is a DM); inside a thread (thread id set) unless
// ThreadSessionsPerUser; otherwise unless GroupSessionsPerUser.
func IsSharedMultiUserSession(src SessionSource, opts KeyOptions) bool {
	if chatTypeOrDM(src.ChatType) == ChatDM {
		return false
	}
	if src.ThreadID != "" {
		return !opts.ThreadSessionsPerUser
	}
	return !opts.GroupSessionsPerUser
}

// participantID is the sender id used for isolation; WhatsApp aliases are
// canonicalized so one member never splits into two sessions.
func participantID(src SessionSource, opts KeyOptions) string {
	p := src.ParticipantID()
	if p != "" && src.Platform == PlatformWhatsApp {
		if c := opts.whatsAppID(p); c != "" {
			p = c
		}
	}
	return p
}

// whatsAppID canonicalizes a WhatsApp id through the resolver, or only
// normalizes it when there is none.
func (o KeyOptions) whatsAppID(id string) string {
	if o.WhatsApp != nil {
		return o.WhatsApp.Canonical(id)
	}
	return NormalizeWhatsAppID(id)
}
