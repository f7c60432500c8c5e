package session

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxIDLength is the longest identifier, in bytes, that Validate accepts.
const MaxIDLength = 256

// MaxNameLength is the longest display name (chat_name, user_name,
// chat_topic), in bytes, that Validate accepts: above every platform's own
// limit (Telegram titles are at most 128 characters, Slack topics 250),
// and small enough that a session entry, which keeps the chat name, always
// fits in a NATS message.
const MaxNameLength = 1024

// knownPlatforms lists every Platform constant, in declaration order.
var knownPlatforms = []Platform{
	PlatformTelegram,
	PlatformDiscord,
	PlatformSlack,
	PlatformWhatsApp,
	PlatformSignal,
	PlatformMatrix,
	PlatformMattermost,
	PlatformEmail,
	PlatformSMS,
	PlatformHomeAssistant,
	PlatformFeishu,
	PlatformDingTalk,
	PlatformWeCom,
	PlatformLocal,
	PlatformHTTP,
	PlatformCLI,
}

// platformDisplayNames are the human names of the platforms, used in the
// context prompt.
var platformDisplayNames = map[Platform]string{
	PlatformTelegram:      "Telegram",
	PlatformDiscord:       "Discord",
	PlatformSlack:         "Slack",
	PlatformWhatsApp:      "WhatsApp",
	PlatformSignal:        "Signal",
	PlatformMatrix:        "Matrix",
	PlatformMattermost:    "Mattermost",
	PlatformEmail:         "Email",
	PlatformSMS:           "SMS",
	PlatformHomeAssistant: "Home Assistant",
	PlatformFeishu:        "Feishu",
	PlatformDingTalk:      "DingTalk",
	PlatformWeCom:         "WeCom",
	PlatformLocal:         "Local",
	PlatformHTTP:          "HTTP",
	PlatformCLI:           "CLI",
}

// KnownPlatforms returns every platform the package knows, in a fixed order.
// The caller may modify the returned slice.
func KnownPlatforms() []Platform {
	return slices.Clone(knownPlatforms)
}

// Known reports whether p is one of KnownPlatforms.
func (p Platform) Known() bool {
	return slices.Contains(knownPlatforms, p)
}

// DisplayName returns the human name of p ("WhatsApp", "Home Assistant"), or
// the raw value for an unknown platform.
func (p Platform) DisplayName() string {
	if name, ok := platformDisplayNames[p]; ok {
		return name
	}
	return string(p)
}

// ParsePlatform returns the platform named s. Surrounding spaces and case are
// ignored. An unknown name is an error wrapping ErrUnknownPlatform that names it.
func ParsePlatform(s string) (Platform, error) {
	p := Platform(strings.ToLower(strings.TrimSpace(s)))
	if p.Known() {
		return p, nil
	}
	return "", fmt.Errorf("%w %q (known: %s)", ErrUnknownPlatform, s, knownPlatformList())
}

func knownPlatformList() string {
	names := make([]string, len(knownPlatforms))
	for i, p := range knownPlatforms {
		names[i] = string(p)
	}
	return strings.Join(names, ", ")
}

// ValidChatType reports whether t is dm, group, channel or thread.
func ValidChatType(t string) bool {
	switch t {
	case ChatDM, ChatGroup, ChatChannel, ChatThread:
		return true
	}
	return false
}

// chatTypeOrDM returns t, or ChatDM when t is empty: an empty chat type means
// a DM everywhere in this package, as it does in the seed's from_dict.
func chatTypeOrDM(t string) string {
	if t == "" {
		return ChatDM
	}
	return t
}

// Normalize fills in defaults: an empty ChatType becomes "dm". Identifiers
// are never altered.
func (s *SessionSource) Normalize() {
	if s.ChatType == "" {
		s.ChatType = ChatDM
	}
}

// Validate reports every problem of s, joined: an unknown platform, a chat
// type other than dm, group, channel or thread (empty is accepted and means
// dm, see Normalize), and identifiers (chat_id, user_id, user_id_alt,
// thread_id, chat_id_alt, guild_id, parent_chat_id, message_id) holding '/',
// '\\', "..", a control character (NUL included), invalid UTF-8, U+FFFD
// (what a decoder leaves of invalid UTF-8, so two ids could merge), or more than
// MaxIDLength bytes; and names (chat_name, user_name, chat_topic) of more
// than MaxNameLength bytes or of invalid UTF-8. Each problem wraps
// ErrUnknownPlatform, ErrInvalidChatType, ErrInvalidID or ErrInvalidName and
// names the field.
func (s SessionSource) Validate() error {
	var errs []error
	if !s.Platform.Known() {
		errs = append(errs, fmt.Errorf("%w %q (known: %s)", ErrUnknownPlatform, string(s.Platform), knownPlatformList()))
	}
	if s.ChatType != "" && !ValidChatType(s.ChatType) {
		errs = append(errs, fmt.Errorf("%w %q: must be dm, group, channel or thread", ErrInvalidChatType, s.ChatType))
	}
	for _, f := range []struct{ name, value string }{
		{"chat_id", s.ChatID},
		{"user_id", s.UserID},
		{"user_id_alt", s.UserIDAlt},
		{"thread_id", s.ThreadID},
		{"chat_id_alt", s.ChatIDAlt},
		{"guild_id", s.GuildID},
		{"parent_chat_id", s.ParentChatID},
		{"message_id", s.MessageID},
	} {
		if err := ValidateID(f.name, f.value); err != nil {
			errs = append(errs, err)
		}
	}
	for _, f := range []struct{ name, value string }{
		{"chat_name", s.ChatName},
		{"user_name", s.UserName},
		{"chat_topic", s.ChatTopic},
	} {
		if len(f.value) > MaxNameLength {
			errs = append(errs, fmt.Errorf("%w: %s: %d bytes is longer than the limit of %d", ErrInvalidName, f.name, len(f.value), MaxNameLength))
		} else if !utf8.ValidString(f.value) {
			errs = append(errs, fmt.Errorf("%w: %s %s: invalid UTF-8", ErrInvalidName, f.name, quoteForError(f.value)))
		}
	}
	return errors.Join(errs...)
}

// ValidateID checks one identifier as Validate does and returns an error
// wrapping ErrInvalidID that names field and value, or nil. An empty value
// is valid.
func ValidateID(field, value string) error {
	reason := idProblem(value)
	if reason == "" {
		return nil
	}
	return fmt.Errorf("%w: %s %s: %s", ErrInvalidID, field, quoteForError(value), reason)
}

func idProblem(v string) string {
	if len(v) > MaxIDLength {
		return fmt.Sprintf("%d bytes is longer than the limit of %d", len(v), MaxIDLength)
	}
	return idCharProblem(v)
}

// idCharProblem is idProblem without the length bound.
func idCharProblem(v string) string {
	if strings.Contains(v, "..") {
		return `contains ".."`
	}
	for i := 0; i < len(v); {
		r, size := utf8.DecodeRuneInString(v[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			return fmt.Sprintf("invalid UTF-8 at byte %d", i)
		case r == utf8.RuneError:
			// A decoder that met invalid UTF-8 or an unpaired surrogate
			// escape ("\ud800") writes U+FFFD in its place: two different
			// ids would then read the same.
			return fmt.Sprintf("contains U+FFFD at byte %d (the replacement character stands for invalid UTF-8 or an unpaired surrogate)", i)
		case r == '/' || r == '\\':
			return fmt.Sprintf("contains path separator %q", r)
		case unicode.IsControl(r):
			return fmt.Sprintf("contains control character %U at byte %d", r, i)
		}
		i += size
	}
	return ""
}

// quoteForError quotes v for an error message, cutting very long values so
// the message stays readable.
func quoteForError(v string) string {
	const keep = 64
	if len(v) <= keep {
		return fmt.Sprintf("%q", v)
	}
	return fmt.Sprintf("%q...", v[:keep])
}

// ParticipantID returns the identifier used for per-user isolation:
// UserIDAlt (a stable alternative id such as a Signal UUID) when set, else
// UserID. It is not canonicalized; BuildSessionKey does that for WhatsApp.
func (s SessionSource) ParticipantID() string {
	if s.UserIDAlt != "" {
		return s.UserIDAlt
	}
	return s.UserID
}

// Description is a human-readable summary of where the message came from:
// "DM with Alice" (user name, else user id, else "user"), "group: My Group"
// and "channel: C123" (chat name, else chat id), the bare chat name or id for
// other chat types, with ", thread: <thread_id>" appended when a thread is
// set. The local platform is always "CLI terminal".
func (s SessionSource) Description() string {
	if s.Platform == PlatformLocal {
		return "CLI terminal"
	}
	desc := describe(s.ChatType, firstNonEmpty(s.UserName, s.UserID, "user"), firstNonEmpty(s.ChatName, s.ChatID))
	if s.ThreadID != "" {
		desc += ", thread: " + s.ThreadID
	}
	return desc
}

func describe(chatType, userLabel, chatLabel string) string {
	switch chatTypeOrDM(chatType) {
	case ChatDM:
		return "DM with " + userLabel
	case ChatGroup, ChatChannel:
		return chatType + ": " + chatLabel
	default:
		return chatLabel
	}
}

func firstNonEmpty(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}
