package openai

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/session"
)

// Values of Config.Images: how the photos of a turn reach the model.
const (
	// ImagesInline fetches each image of the turn's messages from its
	// attachment URL and sends it as a base64 data URL image part: the
	// model provider never needs to reach the fleet's media endpoint.
	ImagesInline = "inline"
	// ImagesURL sends the attachment URL itself as the image part: the
	// provider fetches it, so the URL must be reachable from it.
	ImagesURL = "url"
	// ImagesNone sends no image parts (a text-only model): images are
	// described in the text like any other attachment.
	ImagesNone = "none"
)

// DefaultMaxImageBytes bounds one inlined image (OpenAI takes images up to
// 20 MB).
const DefaultMaxImageBytes = 20 << 20

// imageTypes are the image formats vision models take.
var imageTypes = map[string]bool{"image/jpeg": true, "image/png": true, "image/gif": true, "image/webp": true}

// userContent is the content of one user message for the model: its text,
// preceded by its reply context and followed by a line per attachment and
// the notes; then one image part per image in images (URLs, data URLs
// included).
func userContent(text string, q *session.Quote, atts []session.Attachment, images, notes []string) openai.ChatCompletionMessageParamUnion {
	var b strings.Builder
	if q != nil {
		who := q.SenderName
		if who == "" {
			who = q.SenderID
		}
		switch {
		case q.Text != "" && who != "":
			fmt.Fprintf(&b, "[replying to %s: %q]\n", who, q.Text)
		case q.Text != "":
			fmt.Fprintf(&b, "[replying to: %q]\n", q.Text)
		default:
			fmt.Fprintf(&b, "[replying to message %s]\n", q.MessageID)
		}
	}
	b.WriteString(text)
	for _, a := range atts {
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(describe(a))
	}
	for _, n := range notes {
		b.WriteByte('\n')
		b.WriteString(n)
	}
	if len(images) == 0 {
		return openai.UserMessage(b.String())
	}
	parts := []openai.ChatCompletionContentPartUnionParam{openai.TextContentPart(b.String())}
	for _, u := range images {
		parts = append(parts, openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: u}))
	}
	return openai.UserMessage(parts)
}

// describe is the text line of an attachment: kind, name, type, size and
// the URL a tool could fetch it from.
func describe(a session.Attachment) string {
	kind := a.Kind
	if kind == session.AttachVoice {
		kind = "voice note"
	}
	var facts []string
	if a.Name != "" {
		facts = append(facts, fmt.Sprintf("%q", a.Name))
	}
	if a.MimeType != "" {
		facts = append(facts, a.MimeType)
	}
	if a.Size > 0 {
		facts = append(facts, fmt.Sprintf("%d bytes", a.Size))
	}
	if a.URL != "" {
		facts = append(facts, a.URL)
	}
	if a.Kind == session.AttachSticker && a.Caption != "" {
		facts = append(facts, a.Caption)
	}
	if len(facts) == 0 {
		return "[" + kind + " attached]"
	}
	return "[" + kind + " attached: " + strings.Join(facts, ", ") + "]"
}

// turnImages returns, by inbox seq, the image parts of the turn's user
// messages: per Config.Images, the attachment URLs or the fetched images
// as data URLs. An image that cannot be fetched is left out, and said so
// in its message's text (failed).
func (a *Agent) turnImages(ctx context.Context, t *agent.Turn) (images map[uint64][]string, failed map[uint64][]string) {
	mode := a.b.cfg.Images
	if mode == ImagesNone {
		return nil, nil
	}
	images, failed = map[uint64][]string{}, map[uint64][]string{}
	for _, m := range t.Messages {
		for _, att := range m.Attachments {
			if !att.IsImage() || att.URL == "" {
				continue
			}
			if mode == ImagesURL {
				images[m.InboxSeq] = append(images[m.InboxSeq], att.URL)
				continue
			}
			data, err := a.fetchImage(ctx, att)
			if err != nil {
				a.b.cfg.Logger.Warn("image not loaded", slog.String("url", att.URL), slog.Any("error", err))
				failed[m.InboxSeq] = append(failed[m.InboxSeq], fmt.Sprintf("[the %s above could not be loaded: %v]", att.Kind, err))
				continue
			}
			images[m.InboxSeq] = append(images[m.InboxSeq], data)
		}
	}
	return images, failed
}

// fetchImage downloads an image and returns it as a data URL, at most
// Config.MaxImageBytes, of a type vision models take.
func (a *Agent) fetchImage(ctx context.Context, att session.Attachment) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, att.URL, nil)
	if err != nil {
		return "", err
	}
	resp, err := a.b.media.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET answered %s", resp.Status)
	}
	limit := a.b.cfg.MaxImageBytes
	if resp.ContentLength > limit {
		return "", fmt.Errorf("%d bytes, more than the %d inlined", resp.ContentLength, limit)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return "", err
	}
	if int64(len(data)) > limit {
		return "", fmt.Errorf("more than the %d bytes inlined", limit)
	}
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if !imageTypes[ct] {
		ct, _, _ = mime.ParseMediaType(att.MimeType)
	}
	if !imageTypes[ct] {
		ct = http.DetectContentType(data)
	}
	if !imageTypes[ct] {
		return "", fmt.Errorf("type %q is not an image format the model takes", ct)
	}
	return "data:" + ct + ";base64," + base64.StdEncoding.EncodeToString(data), nil
}
