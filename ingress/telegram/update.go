package telegram

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
)

// MaxTextLength is the longest text (or caption) accepted, in UTF-16 units:
// Telegram's own message limit. A longer one cannot come from Telegram.
const MaxTextLength = 4096

// Update is the part of a Bot API Update the adapter reads.
type Update struct {
	UpdateID          int64    `json:"update_id"`
	Message           *Message `json:"message,omitempty"`
	EditedMessage     *Message `json:"edited_message,omitempty"`
	ChannelPost       *Message `json:"channel_post,omitempty"`
	EditedChannelPost *Message `json:"edited_channel_post,omitempty"`
}

// Message is the part of a Bot API Message the adapter reads.
type Message struct {
	MessageID       int64    `json:"message_id"`
	MessageThreadID int64    `json:"message_thread_id,omitempty"`
	From            *User    `json:"from,omitempty"`
	SenderChat      *Chat    `json:"sender_chat,omitempty"`
	Chat            *Chat    `json:"chat"`
	Date            int64    `json:"date"`
	Text            string   `json:"text,omitempty"`
	Caption         string   `json:"caption,omitempty"`
	IsTopicMessage  bool     `json:"is_topic_message,omitempty"`
	ReplyToMessage  *Message `json:"reply_to_message,omitempty"`
	ViaBot          *User    `json:"via_bot,omitempty"`
	// Quote is the part of the replied-to message the user quoted.
	Quote *struct {
		Text string `json:"text"`
	} `json:"quote,omitempty"`
	// MediaGroupID is set on each message of an album.
	MediaGroupID string      `json:"media_group_id,omitempty"`
	Photo        []PhotoSize `json:"photo,omitempty"`
	Voice        *File       `json:"voice,omitempty"`
	Audio        *File       `json:"audio,omitempty"`
	Video        *File       `json:"video,omitempty"`
	VideoNote    *File       `json:"video_note,omitempty"`
	Animation    *File       `json:"animation,omitempty"`
	Document     *File       `json:"document,omitempty"`
	Sticker      *Sticker    `json:"sticker,omitempty"`
	// ForumTopicCreated is set on the service message that opened a topic;
	// a topic message replies to it, which is how the topic's name arrives.
	ForumTopicCreated *struct {
		Name string `json:"name"`
	} `json:"forum_topic_created,omitempty"`
}

// PhotoSize is one size of a photo; a message's photo lists them from the
// smallest to the largest.
type PhotoSize struct {
	FileID   string `json:"file_id"`
	FileSize int64  `json:"file_size,omitempty"`
	Width    int    `json:"width"`
	Height   int    `json:"height"`
}

// File is the part of a Voice, Audio, Video, VideoNote, Animation or
// Document the adapter reads.
type File struct {
	FileID   string `json:"file_id"`
	FileName string `json:"file_name,omitempty"`
	MimeType string `json:"mime_type,omitempty"`
	FileSize int64  `json:"file_size,omitempty"`
}

// Sticker is the part of a Sticker the adapter reads.
type Sticker struct {
	FileID     string `json:"file_id"`
	FileSize   int64  `json:"file_size,omitempty"`
	IsAnimated bool   `json:"is_animated"`
	IsVideo    bool   `json:"is_video"`
	Emoji      string `json:"emoji,omitempty"`
}

// User is a Telegram user or bot.
type User struct {
	ID        int64  `json:"id"`
	IsBot     bool   `json:"is_bot"`
	FirstName string `json:"first_name"`
	LastName  string `json:"last_name,omitempty"`
	Username  string `json:"username,omitempty"`
}

// Chat is a Telegram chat.
type Chat struct {
	ID        int64  `json:"id"`
	Type      string `json:"type"`
	Title     string `json:"title,omitempty"`
	Username  string `json:"username,omitempty"`
	FirstName string `json:"first_name,omitempty"`
	LastName  string `json:"last_name,omitempty"`
	IsForum   bool   `json:"is_forum,omitempty"`
}

// ErrMalformed wraps an update that is not valid JSON of the Update shape.
var ErrMalformed = errors.New("malformed telegram update")

// Skip says why an update is not a message for the agent; it is answered
// 200 (webhook) or confirmed (polling) and publishes nothing.
type Skip struct{ Reason string }

func (s *Skip) Error() string { return "ignored: " + s.Reason }

// ParseUpdate decodes one update. It never panics, whatever data holds.
func ParseUpdate(data []byte) (*Update, error) {
	var u Update
	if err := json.Unmarshal(data, &u); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if u.UpdateID == 0 && u.Message == nil && u.ChannelPost == nil && u.EditedMessage == nil && u.EditedChannelPost == nil {
		return nil, fmt.Errorf("%w: no update_id", ErrMalformed)
	}
	return &u, nil
}

// Bot is what the adapter knows of its own bot: its user id (the number
// before the ':' of its token) and username (from getMe; empty when not
// known yet).
type Bot struct {
	ID       int64
	Username string
}

// BotIDFromToken returns the bot's user id, the number before ':' in a token.
func BotIDFromToken(token string) int64 {
	head, _, ok := strings.Cut(token, ":")
	if !ok {
		return 0
	}
	id, _ := strconv.ParseInt(head, 10, 64)
	return id
}

// ToMessage turns an update into the message to publish: its SessionSource
// (chat type from the chat: private is dm, group and supergroup are group,
// channel is channel; a forum topic is the thread), text, reply-to and
// de-duplication id "telegram:<chat_id>:<message_id>". Edited messages,
// updates without text, messages from bots (the bot's own echoes
// included) and commands addressed to another bot come back as *Skip; an
// update whose fields are unusable as ids, or whose text is longer than
// Telegram allows, as an error wrapping ingress.ErrRejected.
func ToMessage(u *Update, bot Bot) (ingress.Message, error) {
	switch {
	case u.EditedMessage != nil || u.EditedChannelPost != nil:
		return ingress.Message{}, &Skip{"edited message"}
	}
	m := u.Message
	if m == nil {
		m = u.ChannelPost
	}
	if m == nil {
		return ingress.Message{}, &Skip{"not a message"}
	}
	if m.Chat == nil || m.Chat.ID == 0 || m.MessageID == 0 {
		return ingress.Message{}, fmt.Errorf("%w: message without chat or message_id", ingress.ErrRejected)
	}
	if m.From != nil && (m.From.IsBot || (bot.ID != 0 && m.From.ID == bot.ID)) {
		return ingress.Message{}, &Skip{"sent by a bot"}
	}
	if m.ViaBot != nil && bot.ID != 0 && m.ViaBot.ID == bot.ID {
		return ingress.Message{}, &Skip{"sent through this bot"}
	}
	text := m.Text
	if text == "" {
		text = m.Caption
	}
	atts := attachments(m)
	if strings.TrimSpace(text) == "" && len(atts) == 0 {
		return ingress.Message{}, &Skip{"no text"}
	}
	if !utf8.ValidString(text) {
		return ingress.Message{}, fmt.Errorf("%w: text is not valid UTF-8", ingress.ErrRejected)
	}
	if n := ingress.UTF16Len(text); n > MaxTextLength {
		return ingress.Message{}, fmt.Errorf("%w: %w: text of %d characters is longer than Telegram's %d", ingress.ErrRejected, ingress.ErrTooLarge, n, MaxTextLength)
	}
	if other := commandFor(text); len(atts) == 0 && other != "" && bot.Username != "" && !strings.EqualFold(other, bot.Username) {
		return ingress.Message{}, &Skip{"command for @" + other}
	}

	chat := m.Chat
	src := session.SessionSource{
		Platform:  session.PlatformTelegram,
		ChatID:    strconv.FormatInt(chat.ID, 10),
		ChatName:  chatName(chat),
		MessageID: strconv.FormatInt(m.MessageID, 10),
	}
	switch chat.Type {
	case "private":
		src.ChatType = session.ChatDM
	case "group", "supergroup":
		src.ChatType = session.ChatGroup
	case "channel":
		src.ChatType = session.ChatChannel
	default:
		return ingress.Message{}, &Skip{fmt.Sprintf("chat type %q", chat.Type)}
	}
	// Only forum topics are threads: a reply chain in an ordinary
	// supergroup also carries a message_thread_id, and must not split the
	// group's session.
	if m.IsTopicMessage && m.MessageThreadID != 0 {
		src.ThreadID = strconv.FormatInt(m.MessageThreadID, 10)
		if r := m.ReplyToMessage; r != nil && r.ForumTopicCreated != nil {
			src.ChatTopic = r.ForumTopicCreated.Name
		}
	}
	switch {
	case m.From != nil:
		src.UserID = strconv.FormatInt(m.From.ID, 10)
		src.UserName = userName(m.From)
		src.IsBot = m.From.IsBot
	case m.SenderChat != nil:
		// A channel post, or an anonymous group admin: the chat speaks.
		src.UserID = strconv.FormatInt(m.SenderChat.ID, 10)
		src.UserName = chatName(m.SenderChat)
	}
	out := ingress.Message{
		Source:      src,
		Text:        text,
		DedupID:     ingress.PlatformMsgID(session.PlatformTelegram, src.ChatID, src.MessageID),
		Attachments: atts,
		MediaGroup:  m.MediaGroupID,
	}
	// In a topic every message replies to the topic's opening message:
	// that is not a reply the user made.
	if r := m.ReplyToMessage; r != nil && r.MessageID != 0 && r.ForumTopicCreated == nil && !(m.IsTopicMessage && r.MessageID == m.MessageThreadID) {
		out.ReplyTo = strconv.FormatInt(r.MessageID, 10)
		out.Quote = quoteOf(m, r)
	}
	return out, nil
}

// attachments maps the files of a message onto the fleet's attachments:
// the largest size of a photo, a voice note, audio, a video (video notes
// and animations, which Telegram sends as MP4, included), a document, a
// sticker. Only file ids: the adapter adds the URLs (Adapter.linkMedia),
// since Telegram's own file URLs hold the bot token.
func attachments(m *Message) []session.Attachment {
	var out []session.Attachment
	file := func(kind string, f *File, mimeDefault string) {
		if f == nil || f.FileID == "" {
			return
		}
		out = append(out, session.Attachment{Kind: kind, FileID: f.FileID, MimeType: nonEmpty(f.MimeType, mimeDefault),
			Size: max(f.FileSize, 0), Name: f.FileName, Caption: m.Caption})
	}
	if n := len(m.Photo); n > 0 && m.Photo[n-1].FileID != "" {
		p := m.Photo[n-1]
		// Telegram re-encodes every photo as JPEG.
		out = append(out, session.Attachment{Kind: session.AttachPhoto, FileID: p.FileID, MimeType: "image/jpeg",
			Size: max(p.FileSize, 0), Caption: m.Caption})
	}
	file(session.AttachVoice, m.Voice, "audio/ogg")
	file(session.AttachAudio, m.Audio, "")
	file(session.AttachVideo, m.Video, "")
	file(session.AttachVideo, m.VideoNote, "video/mp4")
	file(session.AttachVideo, m.Animation, "video/mp4")
	file(session.AttachDocument, m.Document, "")
	if s := m.Sticker; s != nil && s.FileID != "" {
		mt := "image/webp"
		switch {
		case s.IsAnimated:
			mt = "application/x-tgsticker"
		case s.IsVideo:
			mt = "video/webm"
		}
		out = append(out, session.Attachment{Kind: session.AttachSticker, FileID: s.FileID, MimeType: mt, Size: max(s.FileSize, 0), Caption: s.Emoji})
	}
	return out
}

// quoteOf is the reply context of m, which replies to r: r's id and
// sender, and the part the user quoted, else r's text or caption.
func quoteOf(m, r *Message) *session.Quote {
	q := &session.Quote{MessageID: strconv.FormatInt(r.MessageID, 10), Text: nonEmpty(r.Text, r.Caption)}
	if m.Quote != nil && m.Quote.Text != "" {
		q.Text = m.Quote.Text
	}
	switch {
	case r.From != nil:
		q.SenderID = strconv.FormatInt(r.From.ID, 10)
		q.SenderName = userName(r.From)
	case r.SenderChat != nil:
		q.SenderID = strconv.FormatInt(r.SenderChat.ID, 10)
		q.SenderName = chatName(r.SenderChat)
	}
	if !utf8.ValidString(q.Text) {
		q.Text = strings.ToValidUTF8(q.Text, "")
	}
	return q
}

func nonEmpty(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// commandFor returns the bot a "/cmd@bot ..." text addresses, "" when the
// text is no command or names no bot.
func commandFor(text string) string {
	t := strings.TrimLeftFunc(text, unicode.IsSpace)
	if !strings.HasPrefix(t, "/") {
		return ""
	}
	word := t[1:]
	if i := strings.IndexFunc(word, unicode.IsSpace); i >= 0 {
		word = word[:i]
	}
	_, bot, ok := strings.Cut(word, "@")
	if !ok {
		return ""
	}
	return bot
}

func chatName(c *Chat) string {
	if c.Title != "" {
		return c.Title
	}
	if name := strings.TrimSpace(c.FirstName + " " + c.LastName); name != "" {
		return name
	}
	return c.Username
}

func userName(u *User) string {
	if u.Username != "" {
		return u.Username
	}
	return strings.TrimSpace(u.FirstName + " " + u.LastName)
}
