package telegram_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/ingress/platformtest"
	"github.com/agentfleet/agentfleet/ingress/telegram"
	"github.com/agentfleet/agentfleet/ingress/telegram/telegramtest"
	"github.com/agentfleet/agentfleet/session"
)

// TestToMessageMedia maps recorded updates with files and replies onto the
// fleet's attachments and quotes: the largest size of a photo, voice
// notes, documents, video notes, audio, stickers, albums (media group),
// the quoted part of a reply (else the replied-to text or caption) and its
// sender; a caption with attachments is never a command.
func TestToMessageMedia(t *testing.T) {
	t.Parallel()
	bot := telegram.Bot{ID: 777, Username: telegramtest.BotUsername}
	for _, tc := range []struct {
		file  string
		text  string
		atts  []session.Attachment
		group string
		quote *session.Quote
		kind  string
	}{
		{file: "photo_caption.json", text: "what is in this picture?", kind: session.KindMessage,
			atts: []session.Attachment{{Kind: "photo", FileID: "AgACAgQAAxkBAAIB", MimeType: "image/jpeg", Size: 1280, Caption: "what is in this picture?"}}},
		{file: "voice.json", kind: session.KindQueue,
			atts: []session.Attachment{{Kind: "voice", FileID: "AwACAgQAAxkBAAIEBmkjVoice", MimeType: "audio/ogg", Size: 11392}}},
		{file: "document.json", text: "summarize this", kind: session.KindQueue,
			atts: []session.Attachment{{Kind: "document", FileID: "BQACAgQAAxkBAAIEB2kjDoc", MimeType: "application/pdf", Size: 482113, Name: "q3-report.pdf", Caption: "summarize this"}}},
		{file: "album_1.json", text: "which one is sharper?", group: "13960715461862394", kind: session.KindMessage,
			atts: []session.Attachment{{Kind: "photo", FileID: "AgACAgQAAxkBAAIECGkjLarge1", MimeType: "image/jpeg", Size: 84211, Caption: "which one is sharper?"}}},
		{file: "album_2.json", group: "13960715461862394", kind: session.KindMessage,
			atts: []session.Attachment{{Kind: "photo", FileID: "AgACAgQAAxkBAAIECWkjLarge2", MimeType: "image/jpeg", Size: 80952}}},
		{file: "video_note.json", kind: session.KindQueue,
			atts: []session.Attachment{{Kind: "video", FileID: "DQACAgQAAxkBAAIEDGkjVNote", MimeType: "video/mp4", Size: 203311}}},
		{file: "sticker.json", kind: session.KindMessage,
			atts: []session.Attachment{{Kind: "sticker", FileID: "CAACAgIAAxkBAAIC", MimeType: "image/webp"}}},
		{file: "reply_quote.json", text: "why did they fail?", kind: session.KindMessage,
			quote: &session.Quote{MessageID: "1029", Text: "Two canaries failed their health check", SenderID: "777", SenderName: "fleetbot"}},
		{file: "supergroup_reply.json", text: "agreed", kind: session.KindMessage,
			quote: &session.Quote{MessageID: "900", Text: "earlier", SenderID: "123456789", SenderName: "Ada"}},
		{file: "audio_reply.json", text: "/new notes from the standup", kind: session.KindQueue,
			atts: []session.Attachment{{Kind: "audio", FileID: "CQACAgQAAxkBAAIEDWkjAudio", MimeType: "audio/mp4", Size: 912004, Name: "standup.m4a",
				Caption: "/new notes from the standup"}},
			quote: &session.Quote{MessageID: "1020", Text: "the dashboard at noon", SenderID: "123456789", SenderName: "ada_l"}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			u, err := telegram.ParseUpdate(readFile(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			m, err := telegram.ToMessage(u, bot)
			if err != nil {
				t.Fatal(err)
			}
			if m.Text != tc.text || m.MediaGroup != tc.group || len(m.Attachments) != len(tc.atts) {
				t.Fatalf("ToMessage = %+v", m)
			}
			for i, a := range m.Attachments {
				if a != tc.atts[i] {
					t.Errorf("attachment %d = %+v, want %+v", i, a, tc.atts[i])
				}
			}
			switch {
			case tc.quote == nil && m.Quote != nil, tc.quote != nil && (m.Quote == nil || *m.Quote != *tc.quote):
				t.Errorf("quote = %+v, want %+v", m.Quote, tc.quote)
			}
			if tc.quote != nil && m.ReplyTo != tc.quote.MessageID {
				t.Errorf("reply_to = %q", m.ReplyTo)
			}
			if kind, _, _ := session.ClassifyMessage(m.Text, m.Attachments); kind != tc.kind {
				t.Errorf("kind %s, want %s", kind, tc.kind)
			}
			if err := session.ValidateMedia(m.Attachments, m.Quote); err != nil {
				t.Errorf("mapped media is invalid: %v", err)
			}
		})
	}
}

// TestWebhookMediaLinks: a photo arrives with a link to the ingress's media
// endpoint, never Telegram's file URL (which holds the bot token); the
// link serves the bytes through getFile and the download, and a forged
// link gets 403 without a call to Telegram.
func TestWebhookMediaLinks(t *testing.T) {
	t.Parallel()
	env := platformtest.New(t)
	api := telegramtest.New(t)
	media := httptest.NewUnstartedServer(nil)
	a, err := telegram.New(env.Pub, telegram.Config{Token: telegramtest.Token, WebhookSecret: secret, APIBase: api.URL,
		MediaBaseURL: "http://" + media.Listener.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	mh, err := a.MediaHandler(0)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(ingress.MediaPathPrefix+"telegram/", mh)
	media.Config.Handler = mux
	media.Start()
	t.Cleanup(media.Close)
	hook, err := a.WebhookHandler()
	if err != nil {
		t.Fatal(err)
	}
	jpeg := []byte("\xff\xd8\xff\xe0 a small jpeg")
	api.AddFile("AgACAgQAAxkBAAIB", "image/jpeg", jpeg)

	req := httptest.NewRequest(http.MethodPost, "/webhooks/telegram", strings.NewReader(string(readFile(t, "photo_caption.json"))))
	req.Header.Set(telegram.HeaderSecret, secret)
	w := httptest.NewRecorder()
	hook.ServeHTTP(w, req)
	if w.Code != http.StatusOK {
		t.Fatalf("webhook: %d %s", w.Code, w.Body)
	}
	in := env.Inbox()
	if len(in) != 1 || len(in[0].Attachments) != 1 {
		t.Fatalf("inbox %+v", in)
	}
	link := in[0].Attachments[0].URL
	if !strings.HasPrefix(link, media.URL+"/v1/media/telegram/AgACAgQAAxkBAAIB?sig=") {
		t.Fatalf("attachment URL %q is not a media endpoint link", link)
	}
	if strings.Contains(link, telegramtest.Token) || strings.Contains(link, "test-token") {
		t.Fatalf("attachment URL %q holds the bot token", link)
	}
	get := func(u string) (int, []byte) {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if code, body := get(link); code != http.StatusOK || string(body) != string(jpeg) {
		t.Fatalf("GET link: %d %q", code, body)
	}
	calls := api.GetFiles()
	if code, _ := get(strings.Replace(link, "AgACAgQAAxkBAAIB", "AgACAgQAAxkBAAIC", 1)); code != http.StatusForbidden {
		t.Fatalf("forged link: %d, want 403", code)
	}
	if api.GetFiles() != calls {
		t.Fatal("a forged link reached Telegram")
	}
	// A file Telegram does not know: 404.
	other, _ := ingress.NewMediaLinker(media.URL, session.PlatformTelegram, ingress.MediaKey(telegramtest.Token))
	if code, _ := get(other.Link("no-such-file")); code != http.StatusNotFound {
		t.Fatalf("unknown file: %d, want 404", code)
	}
}
