package discord

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/disgoorg/disgo/discord"
	"github.com/disgoorg/snowflake/v2"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
)

// MaxTextLength is the longest message text accepted, in characters
// (Discord's limit for Nitro users; bots and others have 2000).
const MaxTextLength = 4000

// ErrMalformed wraps a payload that is not a Discord message or
// interaction.
var ErrMalformed = errors.New("malformed discord payload")

// Skip says why a message is not one for the agent.
type Skip struct{ Reason string }

func (s *Skip) Error() string { return "ignored: " + s.Reason }

// ParseMessage decodes a MESSAGE_CREATE payload (the Message object). It
// never panics, whatever data holds.
func ParseMessage(data []byte) (*discord.Message, error) {
	var m discord.Message
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if m.ID == 0 || m.ChannelID == 0 {
		return nil, fmt.Errorf("%w: message without id or channel_id", ErrMalformed)
	}
	return &m, nil
}

// Channel is what the adapter knows of a guild channel: a thread's parent
// (0 for a channel that is no thread) and its name.
type Channel struct {
	ParentID snowflake.ID
	Name     string
}

// ToMessage turns a gateway message into the message to publish. A DM
// (no guild) is dm with the channel as chat; a guild channel is channel;
// a thread (ch.ParentID set) is the thread of its parent channel, its own
// lane. Ids stay raw. Messages of bots and webhooks (the bot's own
// included), system messages, and guild messages without a mention of
// the bot (when requireMention; the mention is removed from the text) are
// *Skip. The de-duplication id is "discord:<channel>:<message id>".
func ToMessage(m *discord.Message, ch Channel, botID snowflake.ID, requireMention bool) (ingress.Message, error) {
	if m.Author.Bot || m.Author.System || m.WebhookID != nil || (botID != 0 && m.Author.ID == botID) {
		return ingress.Message{}, &Skip{"sent by a bot"}
	}
	if m.Type != discord.MessageTypeDefault && m.Type != discord.MessageTypeReply {
		return ingress.Message{}, &Skip{fmt.Sprintf("message type %d", m.Type)}
	}
	if m.ID == 0 || m.ChannelID == 0 || m.Author.ID == 0 {
		return ingress.Message{}, fmt.Errorf("%w: message without id, channel or author", ingress.ErrRejected)
	}
	text := m.Content
	src := session.SessionSource{
		Platform:  session.PlatformDiscord,
		ChatID:    m.ChannelID.String(),
		UserID:    m.Author.ID.String(),
		UserName:  userName(m.Author),
		MessageID: m.ID.String(),
	}
	if m.GuildID == nil {
		src.ChatType = session.ChatDM
	} else {
		src.ChatType = session.ChatChannel
		src.GuildID = m.GuildID.String()
		src.ChatName = ch.Name
		if ch.ParentID != 0 {
			src.ChatID = ch.ParentID.String()
			src.ThreadID = m.ChannelID.String()
			src.ChatTopic = ch.Name
			src.ChatName = ""
		}
		mentioned := false
		for _, u := range m.Mentions {
			if botID != 0 && u.ID == botID {
				mentioned = true
			}
		}
		if botID != 0 {
			for _, form := range []string{"<@" + botID.String() + ">", "<@!" + botID.String() + ">"} {
				if strings.Contains(text, form) {
					mentioned = true
					text = strings.ReplaceAll(text, form, "")
				}
			}
			text = strings.TrimSpace(text)
		}
		if requireMention && !mentioned {
			return ingress.Message{}, &Skip{"guild message without a mention of the bot"}
		}
	}
	atts, err := attachments(m)
	if err != nil {
		return ingress.Message{}, err
	}
	if strings.TrimSpace(text) == "" && len(atts) == 0 {
		return ingress.Message{}, &Skip{"no text"}
	}
	if !utf8.ValidString(text) {
		return ingress.Message{}, fmt.Errorf("%w: text is not valid UTF-8", ingress.ErrRejected)
	}
	if n := utf8.RuneCountInString(text); n > MaxTextLength {
		return ingress.Message{}, fmt.Errorf("%w: %w: text of %d characters is longer than Discord's %d", ingress.ErrRejected, ingress.ErrTooLarge, n, MaxTextLength)
	}
	out := ingress.Message{
		Source:      src,
		Text:        text,
		Attachments: atts,
		DedupID:     ingress.PlatformMsgID(session.PlatformDiscord, m.ChannelID.String(), m.ID.String()),
	}
	if r := m.MessageReference; r != nil && r.MessageID != nil && m.Type == discord.MessageTypeReply {
		out.ReplyTo = r.MessageID.String()
		q := &session.Quote{MessageID: out.ReplyTo}
		if rm := m.ReferencedMessage; rm != nil && rm.ID == *r.MessageID {
			q.Text = rm.Content
			q.SenderID = rm.Author.ID.String()
			q.SenderName = userName(rm.Author)
			q.Trim()
		}
		out.Quote = q
	}
	return out, nil
}

// attachments maps a message's files onto attachments: images are photos,
// a voice message's audio a voice note, other audio, videos, and anything
// else documents. Their URLs are Discord's CDN links, which need no bot
// credential (they are signed and expire after about a day).
func attachments(m *discord.Message) ([]session.Attachment, error) {
	if len(m.Attachments) > session.MaxAttachments {
		return nil, fmt.Errorf("%w: %d attachments", ingress.ErrRejected, len(m.Attachments))
	}
	var out []session.Attachment
	for _, a := range m.Attachments {
		mime := ""
		if a.ContentType != nil {
			mime = *a.ContentType
		}
		kind := session.AttachDocument
		switch {
		case strings.HasPrefix(mime, "image/"):
			kind = session.AttachPhoto
		case strings.HasPrefix(mime, "audio/") && m.Flags.Has(discord.MessageFlagIsVoiceMessage):
			kind = session.AttachVoice
		case strings.HasPrefix(mime, "audio/"):
			kind = session.AttachAudio
		case strings.HasPrefix(mime, "video/"):
			kind = session.AttachVideo
		}
		at := session.Attachment{Kind: kind, FileID: a.ID.String(), URL: a.URL, MimeType: mime, Size: int64(a.Size), Name: a.Filename}
		if at.URL == "" {
			at.URL = a.ProxyURL
		}
		out = append(out, at)
	}
	return out, nil
}

func userName(u discord.User) string {
	if u.GlobalName != nil && *u.GlobalName != "" {
		return *u.GlobalName
	}
	return u.Username
}
