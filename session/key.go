package session

import (
	"fmt"
	"strings"
)

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
// An empty chat type is "dm". Identifiers are never redacted. Each one is
// written through EscapeKeySegment: a ':' inside an id becomes "%3A" and a
// '%' becomes "%25", so an id can never pass for two segments (chat "a:b"
// and chat "a" with thread "b" get different keys) while every id without
// those two bytes reads exactly as the seed writes it.
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
			parts = append(parts, EscapeKeySegment(chatID))
		default:
			// No chat id: fall back to the sender, else every chat-id-less DM
			// of the platform would share one session.
			if p := participantID(src, opts); p != "" {
				parts = append(parts, EscapeKeySegment(p))
			}
		}
		if src.ThreadID != "" {
			parts = append(parts, EscapeKeySegment(src.ThreadID))
		}
		return strings.Join(parts, ":")
	}

	if src.ChatID != "" {
		parts = append(parts, EscapeKeySegment(src.ChatID))
	}
	if src.ThreadID != "" {
		parts = append(parts, EscapeKeySegment(src.ThreadID))
	}
	if !IsSharedMultiUserSession(src, opts) {
		if p := participantID(src, opts); p != "" {
			parts = append(parts, EscapeKeySegment(p))
		}
	}
	return strings.Join(parts, ":")
}

// keySegmentEscaper percent-escapes the two bytes that would make a key
// segment ambiguous: '%' (the escape itself) and ':' (the separator).
var keySegmentEscaper = strings.NewReplacer("%", "%25", ":", "%3A")

// EscapeKeySegment writes one identifier as a session-key segment: '%'
// becomes "%25" and ':' becomes "%3A"; every other byte stands for itself,
// so ids without those two bytes are unchanged. Distinct ids always give
// distinct segments, and no segment contains ':'.
func EscapeKeySegment(id string) string {
	if !strings.ContainsAny(id, "%:") {
		return id
	}
	return keySegmentEscaper.Replace(id)
}

// UnescapeKeySegment reverses EscapeKeySegment. It fails on a segment that
// EscapeKeySegment cannot have produced: one holding ':', or a '%' not
// followed by "25" or "3A".
func UnescapeKeySegment(seg string) (string, error) {
	if strings.Contains(seg, ":") {
		return "", fmt.Errorf("%w: segment %q holds ':'", ErrInvalidKeySegment, seg)
	}
	if !strings.Contains(seg, "%") {
		return seg, nil
	}
	var b strings.Builder
	b.Grow(len(seg))
	for i := 0; i < len(seg); i++ {
		if seg[i] != '%' {
			b.WriteByte(seg[i])
			continue
		}
		switch {
		case strings.HasPrefix(seg[i:], "%25"):
			b.WriteByte('%')
		case strings.HasPrefix(seg[i:], "%3A"):
			b.WriteByte(':')
		default:
			return "", fmt.Errorf("%w: segment %q: '%%' at byte %d is not %%25 or %%3A", ErrInvalidKeySegment, seg, i)
		}
		i += 2
	}
	return b.String(), nil
}

// SplitSessionKey returns the identifier segments of a session key, after
// the namespace, the platform and the chat type, unescaped: for
// "agent:main:telegram:group:a%3Ab:u1" it returns "telegram", "group" and
// ["a:b", "u1"]. It fails on a key BuildSessionKey cannot have produced.
func SplitSessionKey(key string) (platform Platform, chatType string, ids []string, err error) {
	rest, ok := strings.CutPrefix(key, keyNamespace+":")
	if !ok {
		return "", "", nil, fmt.Errorf("%w: %q does not start with %q", ErrInvalidKeySegment, key, keyNamespace+":")
	}
	segs := strings.Split(rest, ":")
	if len(segs) < 2 {
		return "", "", nil, fmt.Errorf("%w: %q has no chat type", ErrInvalidKeySegment, key)
	}
	for _, seg := range segs[2:] {
		id, err := UnescapeKeySegment(seg)
		if err != nil {
			return "", "", nil, err
		}
		ids = append(ids, id)
	}
	return Platform(segs[0]), segs[1], ids, nil
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
