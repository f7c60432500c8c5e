package whatsapp

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
)

// MaxTextLength is the longest text accepted, in characters: the Cloud
// API's own limit of a text message body.
const MaxTextLength = 4096

// Payload is the part of a Cloud API webhook notification the adapter
// reads: object "whatsapp_business_account", entries of changes whose
// value holds messages and/or statuses.
type Payload struct {
	Object string  `json:"object"`
	Entry  []Entry `json:"entry"`
}

// Entry is one WhatsApp Business Account's changes.
type Entry struct {
	ID      string   `json:"id"`
	Changes []Change `json:"changes"`
}

// Change is one change; Field "messages" carries messages and statuses.
type Change struct {
	Field string `json:"field"`
	Value Value  `json:"value"`
}

// Value is the content of a "messages" change.
type Value struct {
	MessagingProduct string    `json:"messaging_product"`
	Metadata         Metadata  `json:"metadata"`
	Contacts         []Contact `json:"contacts,omitempty"`
	Messages         []Message `json:"messages,omitempty"`
	Statuses         []Status  `json:"statuses,omitempty"`
}

// Metadata names the business phone number that received the change.
type Metadata struct {
	DisplayPhoneNumber string `json:"display_phone_number"`
	PhoneNumberID      string `json:"phone_number_id"`
}

// Contact is the sender's profile.
type Contact struct {
	WaID    string `json:"wa_id"`
	Profile struct {
		Name string `json:"name"`
	} `json:"profile"`
}

// Message is one inbound message.
type Message struct {
	From      string `json:"from"`
	ID        string `json:"id"`
	Timestamp string `json:"timestamp"`
	Type      string `json:"type"`
	Text      *struct {
		Body string `json:"body"`
	} `json:"text,omitempty"`
	Context *struct {
		From string `json:"from"`
		ID   string `json:"id"`
	} `json:"context,omitempty"`
	Button *struct {
		Text    string `json:"text"`
		Payload string `json:"payload"`
	} `json:"button,omitempty"`
	Interactive *struct {
		Type        string `json:"type"`
		ButtonReply *struct {
			ID    string `json:"id"`
			Title string `json:"title"`
		} `json:"button_reply,omitempty"`
		ListReply *struct {
			ID          string `json:"id"`
			Title       string `json:"title"`
			Description string `json:"description"`
		} `json:"list_reply,omitempty"`
	} `json:"interactive,omitempty"`
	Image    *Media `json:"image,omitempty"`
	Audio    *Media `json:"audio,omitempty"`
	Video    *Media `json:"video,omitempty"`
	Document *Media `json:"document,omitempty"`
	Sticker  *Media `json:"sticker,omitempty"`
}

// Media is the media object of an image, audio (voice notes included),
// video, document or sticker message: the media id to download it with,
// its type, hash and the caption.
type Media struct {
	ID       string `json:"id"`
	MimeType string `json:"mime_type,omitempty"`
	SHA256   string `json:"sha256,omitempty"`
	Caption  string `json:"caption,omitempty"`
	Filename string `json:"filename,omitempty"`
	Voice    bool   `json:"voice,omitempty"`
}

// Status is a status callback of a message the business sent: sent,
// delivered, read or failed (with errors).
type Status struct {
	ID          string        `json:"id"`
	Status      string        `json:"status"`
	Timestamp   string        `json:"timestamp"`
	RecipientID string        `json:"recipient_id"`
	Errors      []StatusError `json:"errors,omitempty"`
}

// StatusError is an error of a failed status (131047: outside the
// customer-service window).
type StatusError struct {
	Code    int    `json:"code"`
	Title   string `json:"title"`
	Message string `json:"message,omitempty"`
	Data    *struct {
		Details string `json:"details"`
	} `json:"error_data,omitempty"`
}

func (e StatusError) String() string {
	s := fmt.Sprintf("%d %s", e.Code, e.Title)
	if e.Data != nil && e.Data.Details != "" {
		s += ": " + e.Data.Details
	}
	return s
}

// ErrMalformed wraps a body that is not a Cloud API webhook payload.
var ErrMalformed = errors.New("malformed whatsapp payload")

// Skip says why a message is not one for the agent.
type Skip struct{ Reason string }

func (s *Skip) Error() string { return "ignored: " + s.Reason }

// ParsePayload decodes one webhook body. It never panics, whatever data
// holds.
func ParsePayload(data []byte) (*Payload, error) {
	var p Payload
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if p.Object != "whatsapp_business_account" {
		return nil, fmt.Errorf("%w: object is %q, not whatsapp_business_account", ErrMalformed, p.Object)
	}
	return &p, nil
}

// ToMessage turns an inbound message into the message to publish: a DM
// (the Cloud API has no group chats for businesses) whose chat and user are
// the sender's wa_id, canonicalized later by the session key's WhatsApp
// rules; the text of a text, button or interactive reply, or a media
// caption; an image, voice note (audio with voice set), audio, video,
// document or sticker as an attachment carrying its media id (the URL is
// the caller's: media downloads need the access token); the quoted message
// (context) as Quote; the de-duplication id "whatsapp:<from>:<wamid>".
// Reactions and other kinds come back as *Skip; a message without sender
// or id, or whose text is longer than the Cloud API allows, as an error
// wrapping ingress.ErrRejected.
func ToMessage(v *Value, m *Message) (ingress.Message, error) {
	if m.From == "" || m.ID == "" {
		return ingress.Message{}, fmt.Errorf("%w: message without from or id", ingress.ErrRejected)
	}
	if strings.ContainsAny(m.From, " \t\r\n") || len(m.From) > 64 || len(m.ID) > 256 {
		return ingress.Message{}, fmt.Errorf("%w: unusable from or id", ingress.ErrRejected)
	}
	var text string
	var atts []session.Attachment
	switch m.Type {
	case "text":
		if m.Text != nil {
			text = m.Text.Body
		}
	case "button":
		if m.Button != nil {
			text = m.Button.Text
		}
	case "interactive":
		if i := m.Interactive; i != nil {
			switch {
			case i.ButtonReply != nil:
				text = i.ButtonReply.Title
			case i.ListReply != nil:
				text = i.ListReply.Title
			}
		}
	case "image", "video", "document", "audio", "sticker":
		md := m.media()
		if md == nil || md.ID == "" {
			return ingress.Message{}, fmt.Errorf("%w: %s message without a media id", ingress.ErrRejected, m.Type)
		}
		text = md.Caption
		atts = append(atts, session.Attachment{Kind: attachKind(m.Type, md), FileID: md.ID, MimeType: md.MimeType,
			Name: md.Filename, Caption: md.Caption})
	default:
		return ingress.Message{}, &Skip{"message type " + strconv.Quote(m.Type)}
	}
	if strings.TrimSpace(text) == "" && len(atts) == 0 {
		return ingress.Message{}, &Skip{"no text"}
	}
	if !utf8.ValidString(text) {
		return ingress.Message{}, fmt.Errorf("%w: text is not valid UTF-8", ingress.ErrRejected)
	}
	if n := utf8.RuneCountInString(text); n > MaxTextLength {
		return ingress.Message{}, fmt.Errorf("%w: %w: text of %d characters is longer than WhatsApp's %d", ingress.ErrRejected, ingress.ErrTooLarge, n, MaxTextLength)
	}
	src := session.SessionSource{
		Platform:  session.PlatformWhatsApp,
		ChatType:  session.ChatDM,
		ChatID:    m.From,
		UserID:    m.From,
		MessageID: m.ID,
	}
	for _, c := range v.Contacts {
		if c.WaID == m.From {
			src.UserName = c.Profile.Name
			src.ChatName = c.Profile.Name
		}
	}
	out := ingress.Message{
		Source:      src,
		Text:        text,
		Attachments: atts,
		DedupID:     ingress.PlatformMsgID(session.PlatformWhatsApp, m.From, m.ID),
	}
	if m.Context != nil && m.Context.ID != "" {
		out.ReplyTo = m.Context.ID
		// The Cloud API names the quoted message and its sender, not its text.
		out.Quote = &session.Quote{MessageID: m.Context.ID, SenderID: m.Context.From}
	}
	return out, nil
}

// attachKind maps a media message type onto an attachment kind: an audio
// recorded in the app (voice set) is a voice note.
func attachKind(typ string, md *Media) string {
	switch typ {
	case "image":
		return session.AttachPhoto
	case "audio":
		if md.Voice {
			return session.AttachVoice
		}
		return session.AttachAudio
	case "video":
		return session.AttachVideo
	case "sticker":
		return session.AttachSticker
	}
	return session.AttachDocument
}

func (m *Message) media() *Media {
	switch m.Type {
	case "image":
		return m.Image
	case "audio":
		return m.Audio
	case "video":
		return m.Video
	case "document":
		return m.Document
	case "sticker":
		return m.Sticker
	}
	return nil
}

// sentAt is the message's timestamp (Unix seconds), or zero.
func (m *Message) sentAt() time.Time {
	sec, err := strconv.ParseInt(m.Timestamp, 10, 64)
	if err != nil || sec <= 0 {
		return time.Time{}
	}
	return time.Unix(sec, 0).UTC()
}
