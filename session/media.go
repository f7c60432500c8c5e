package session

import (
	"errors"
	"fmt"
	"mime"
	"net/url"
	"strings"
	"unicode/utf8"
)

// Kinds of Attachment.
const (
	// AttachPhoto is an image sent as a picture (Telegram photo, a Slack or
	// Discord image file, a WhatsApp image). Photos of a burst merge into one turn.
	AttachPhoto = "photo"
	// AttachSticker is a sticker; it merges like a photo.
	AttachSticker = "sticker"
	// AttachVoice is a recorded voice note.
	AttachVoice = "voice"
	// AttachAudio is an audio file (music, a recording sent as a file).
	AttachAudio = "audio"
	// AttachVideo is a video (a video note included).
	AttachVideo = "video"
	// AttachDocument is any other file.
	AttachDocument = "document"
)

// attachKinds lists the kinds in the order the documentation gives them.
var attachKinds = []string{AttachPhoto, AttachVoice, AttachAudio, AttachVideo, AttachDocument, AttachSticker}

// Bounds of attachments and quotes, in bytes unless said otherwise. They are
// above what any supported platform sends (Telegram captions are at most
// 1024 characters, its file ids under 200 bytes; an album holds at most 10
// items, a Discord message 10 attachments) and small enough that an inbox
// message with every field at its bound stays far below NATS's 1 MiB.
const (
	// MaxAttachments is the most attachments one message carries.
	MaxAttachments = 20
	// MaxFileIDLength bounds Attachment.FileID.
	MaxFileIDLength = 512
	// MaxURLLength bounds Attachment.URL.
	MaxURLLength = 2048
	// MaxMimeTypeLength bounds Attachment.MimeType (RFC 6838 allows 127+1+127).
	MaxMimeTypeLength = 255
	// MaxFileNameLength bounds Attachment.Name.
	MaxFileNameLength = 1024
	// MaxCaptionLength bounds Attachment.Caption.
	MaxCaptionLength = 16384
	// MaxQuoteTextLength bounds Quote.Text: a quote is context, so a longer
	// quoted text is cut (see Quote.Trim), never refused.
	MaxQuoteTextLength = 4096
	// MaxAttachmentSize bounds Attachment.Size (1 TiB): larger is not a file
	// size any platform reports.
	MaxAttachmentSize = 1 << 40
)

// ErrInvalidAttachment wraps every problem Attachment.Validate reports.
var ErrInvalidAttachment = errors.New("invalid attachment")

// ErrInvalidQuote wraps every problem Quote.Validate reports.
var ErrInvalidQuote = errors.New("invalid quote")

// Attachment is one file a user message carries. The fleet never copies the
// file's bytes into NATS: an attachment is a reference — the platform's file
// id and a URL from which the agent can fetch the bytes. For platforms whose
// file URLs need the bot's credentials (Telegram, Slack), URL points at the
// ingress's media endpoint, which fetches the file with the credential on
// the agent's behalf, so no token is ever written into an inbox message, a
// transcript or a model prompt.
type Attachment struct {
	// Kind is AttachPhoto, AttachVoice, AttachAudio, AttachVideo,
	// AttachDocument or AttachSticker.
	Kind string `json:"kind"`
	// FileID is the platform's id of the file (Telegram file_id, Slack file
	// id, WhatsApp media id, Discord attachment id); empty for HTTP.
	FileID string `json:"file_id,omitempty"`
	// URL is an http or https URL the agent can fetch the bytes from.
	URL string `json:"url,omitempty"`
	// MimeType is the file's media type ("image/jpeg"), when known.
	MimeType string `json:"mime_type,omitempty"`
	// Size is the file's size in bytes, 0 when unknown.
	Size int64 `json:"size,omitempty"`
	// Name is the file's name, when the platform gives one.
	Name string `json:"name,omitempty"`
	// Caption is the text the platform attached to this file, if any (the
	// message's text also holds it, so a text-only agent sees it).
	Caption string `json:"caption,omitempty"`
}

// IsImage reports whether the attachment is a picture an image-capable
// model can be shown: a photo, or a sticker in a still image format.
func (a Attachment) IsImage() bool {
	switch a.Kind {
	case AttachPhoto:
		return true
	case AttachSticker:
		// Animated (TGS) and video (WEBM) stickers are no images.
		return a.MimeType == "" || strings.HasPrefix(a.MimeType, "image/") && a.MimeType != "image/gif"
	}
	return false
}

// OwnTurn reports whether a message with this attachment is a turn of its
// own: voice notes, audio, videos and documents each get their own FIFO
// turn (as a /queue item does), where photos and stickers merge with the
// plain messages around them.
func (a Attachment) OwnTurn() bool {
	switch a.Kind {
	case AttachVoice, AttachAudio, AttachVideo, AttachDocument:
		return true
	}
	return false
}

// Validate reports every problem of a, joined, each wrapping
// ErrInvalidAttachment and naming the field: an unknown kind; neither a
// file id nor a URL; a file id that is not a valid identifier (see
// ValidateID) or longer than MaxFileIDLength; a URL that is not absolute
// http or https, holds user info, or is longer than MaxURLLength; a mime
// type that does not parse; a negative or absurd size; a name or caption
// of invalid UTF-8 or over its bound.
func (a Attachment) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", ErrInvalidAttachment, fmt.Sprintf(format, args...)))
	}
	if !validAttachKind(a.Kind) {
		bad("kind %s: must be one of %s", quoteForError(a.Kind), strings.Join(attachKinds, ", "))
	}
	if a.FileID == "" && a.URL == "" {
		bad("needs a file_id or a url")
	}
	if len(a.FileID) > MaxFileIDLength {
		bad("file_id: %d bytes is longer than the limit of %d", len(a.FileID), MaxFileIDLength)
	} else if a.FileID != "" {
		// The rules of every other id, with a bound of its own.
		if p := idCharProblem(a.FileID); p != "" {
			bad("file_id %s: %s", quoteForError(a.FileID), p)
		}
	}
	if a.URL != "" {
		if p := urlProblem(a.URL); p != "" {
			bad("url %s: %s", quoteForError(a.URL), p)
		}
	}
	if a.MimeType != "" {
		if len(a.MimeType) > MaxMimeTypeLength {
			bad("mime_type: %d bytes is longer than the limit of %d", len(a.MimeType), MaxMimeTypeLength)
		} else if mt, _, err := mime.ParseMediaType(a.MimeType); err != nil || !strings.Contains(mt, "/") {
			bad("mime_type %s: not a media type (want type/subtype, as in image/jpeg)", quoteForError(a.MimeType))
		}
	}
	if a.Size < 0 || a.Size > MaxAttachmentSize {
		bad("size %d: must be 0 (unknown) to %d", a.Size, int64(MaxAttachmentSize))
	}
	for _, f := range []struct {
		name, value string
		max         int
	}{{"name", a.Name, MaxFileNameLength}, {"caption", a.Caption, MaxCaptionLength}} {
		if len(f.value) > f.max {
			bad("%s: %d bytes is longer than the limit of %d", f.name, len(f.value), f.max)
		} else if !utf8.ValidString(f.value) {
			bad("%s: invalid UTF-8", f.name)
		}
	}
	return errors.Join(errs...)
}

func validAttachKind(k string) bool {
	for _, v := range attachKinds {
		if k == v {
			return true
		}
	}
	return false
}

// urlProblem says what is wrong with an attachment URL, "" if nothing.
func urlProblem(s string) string {
	if len(s) > MaxURLLength {
		return fmt.Sprintf("%d bytes is longer than the limit of %d", len(s), MaxURLLength)
	}
	if !utf8.ValidString(s) {
		return "invalid UTF-8"
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f {
			return "contains white space or a control character"
		}
	}
	u, err := url.Parse(s)
	if err != nil {
		return "not a URL"
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return "must be an absolute http or https URL"
	case u.Host == "":
		return "has no host"
	case u.User != nil:
		// Credentials in a URL would be written into every transcript.
		return "must not carry user info (credentials)"
	}
	return ""
}

// Quote is the message a user message replies to or quotes: the anchor
// of the reply on the platform, with what the user saw of it.
type Quote struct {
	// MessageID is the platform id of the quoted message (required).
	MessageID string `json:"message_id"`
	// Text is the quoted message's text (or caption), cut to
	// MaxQuoteTextLength bytes.
	Text string `json:"text,omitempty"`
	// SenderID and SenderName identify who wrote the quoted message (the
	// bot itself, when the user replies to one of its answers).
	SenderID   string `json:"sender_id,omitempty"`
	SenderName string `json:"sender_name,omitempty"`
}

// Trim cuts q.Text to MaxQuoteTextLength bytes at a character boundary, so
// a long quoted message never makes a message too large.
func (q *Quote) Trim() {
	if len(q.Text) <= MaxQuoteTextLength {
		return
	}
	cut := MaxQuoteTextLength
	for cut > 0 && !utf8.RuneStart(q.Text[cut]) {
		cut--
	}
	q.Text = q.Text[:cut]
}

// Validate reports every problem of q, joined, each wrapping ErrInvalidQuote:
// a missing or invalid message id or sender id (see ValidateID), a text
// longer than MaxQuoteTextLength or a sender name longer than
// MaxNameLength, or either of invalid UTF-8.
func (q Quote) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", ErrInvalidQuote, fmt.Sprintf(format, args...)))
	}
	if q.MessageID == "" {
		bad("message_id is required")
	}
	for _, f := range []struct{ name, value string }{{"message_id", q.MessageID}, {"sender_id", q.SenderID}} {
		if p := idProblem(f.value); p != "" {
			bad("%s %s: %s", f.name, quoteForError(f.value), p)
		}
	}
	for _, f := range []struct {
		name, value string
		max         int
	}{{"text", q.Text, MaxQuoteTextLength}, {"sender_name", q.SenderName, MaxNameLength}} {
		if len(f.value) > f.max {
			bad("%s: %d bytes is longer than the limit of %d", f.name, len(f.value), f.max)
		} else if !utf8.ValidString(f.value) {
			bad("%s: invalid UTF-8", f.name)
		}
	}
	return errors.Join(errs...)
}

// ValidateMedia checks the attachments and quote of one message: at most
// MaxAttachments attachments, each valid, and a valid quote when there is
// one. Problems name the attachment's index ("attachments[2]: ...").
func ValidateMedia(atts []Attachment, q *Quote) error {
	var errs []error
	if len(atts) > MaxAttachments {
		errs = append(errs, fmt.Errorf("%w: %d attachments, at most %d per message", ErrInvalidAttachment, len(atts), MaxAttachments))
	} else {
		for i, a := range atts {
			if err := a.Validate(); err != nil {
				errs = append(errs, fmt.Errorf("attachments[%d]: %w", i, err))
			}
		}
	}
	if q != nil {
		if err := q.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("reply_to: %w", err))
		}
	}
	return errors.Join(errs...)
}

// OwnTurn reports whether a message carrying atts is a turn of its own (see
// Attachment.OwnTurn): true as soon as one attachment is.
func OwnTurn(atts []Attachment) bool {
	for _, a := range atts {
		if a.OwnTurn() {
			return true
		}
	}
	return false
}

// ClassifyMessage is Classify for a message that may carry attachments.
// Without attachments it is Classify(text). With them, the text is a
// caption, never a command: the kind is KindQueue when an attachment is a
// turn of its own (a voice note, audio, a video or a document: its own FIFO
// turn, counted in the queue depth, discarded by a /new behind it as a
// /queue item is), else KindMessage (photos and stickers merge with the
// plain messages around them).
func ClassifyMessage(text string, atts []Attachment) (kind, command, args string) {
	if len(atts) == 0 {
		return Classify(text)
	}
	if OwnTurn(atts) {
		return KindQueue, "", ""
	}
	return KindMessage, "", ""
}

// LatestQuote is the quote of a merged turn: the newest non-nil quote of
// quotes (given oldest first), or nil.
func LatestQuote(quotes ...*Quote) *Quote {
	for i := len(quotes) - 1; i >= 0; i-- {
		if quotes[i] != nil {
			return quotes[i]
		}
	}
	return nil
}
