package session

import "errors"

// Sentinel errors. They are always wrapped with context (the field, the
// value); match them with errors.Is.
var (
	// ErrUnknownPlatform reports a platform name that is not one of KnownPlatforms.
	ErrUnknownPlatform = errors.New("unknown platform")
	// ErrInvalidChatType reports a chat type other than dm, group, channel or thread.
	ErrInvalidChatType = errors.New("invalid chat type")
	// ErrInvalidID reports an identifier of a SessionSource that could escape a
	// path or a subject: a path separator, "..", a control character, invalid
	// UTF-8, or more than MaxIDLength bytes.
	ErrInvalidID = errors.New("invalid identifier")
	// ErrInvalidName reports a display name of a SessionSource (chat_name,
	// user_name, chat_topic) longer than MaxNameLength or not UTF-8.
	ErrInvalidName = errors.New("invalid name")
	// ErrInvalidKeySegment reports a session key, or one of its segments,
	// that BuildSessionKey cannot have produced.
	ErrInvalidKeySegment = errors.New("invalid session key")
	// ErrInvalidLaneToken reports a string that LaneToken cannot have produced.
	ErrInvalidLaneToken = errors.New("invalid lane token")
	// ErrInvalidResetPolicy reports a reset policy that cannot be evaluated.
	ErrInvalidResetPolicy = errors.New("invalid reset policy")
)
