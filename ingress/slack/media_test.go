package slack_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/ingress/platformtest"
	"github.com/agentfleet/agentfleet/ingress/slack"
	"github.com/agentfleet/agentfleet/ingress/slack/slackfake"
	"github.com/agentfleet/agentfleet/session"
)

// TestToMessageMedia maps recorded Slack events with files and shared
// messages: an image is a photo, a recorded clip a voice note, a PDF a
// document (a deleted file is left out), a shared message is the quote
// (text and author), a thread reply quotes its parent's ts.
func TestToMessageMedia(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		file  string
		text  string
		atts  []session.Attachment
		quote *session.Quote
		kind  string
	}{
		{file: "file_share_im.json", text: "what is on this whiteboard?", kind: session.KindMessage,
			atts: []session.Attachment{{Kind: "photo", FileID: "F0A1B2C3D4E", MimeType: "image/jpeg", Size: 204817, Name: "IMG_0412.jpg"}}},
		{file: "voice_clip_im.json", kind: session.KindQueue,
			atts: []session.Attachment{{Kind: "voice", FileID: "F0VOICE0001", MimeType: "audio/webm", Size: 38211, Name: "audio_message.webm"}}},
		{file: "shared_message_im.json", text: "is this still true?", kind: session.KindMessage,
			quote: &session.Quote{MessageID: "1763800000.000100", Text: "Deploys are frozen until Monday.", SenderID: "U0G9QF9C6", SenderName: "Grace Hopper"}},
		{file: "app_mention_thread_file.json", text: "what changed in this version?", kind: session.KindQueue,
			atts:  []session.Attachment{{Kind: "document", FileID: "F0DOC000002", MimeType: "application/pdf", Size: 482113, Name: "runbook-v2.pdf"}},
			quote: &session.Quote{MessageID: "1763900020.000400"}},
		{file: "message_im.json", text: "hello agent", kind: session.KindMessage},
	} {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			ev, err := slack.ParseEvent(readFile(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			m, err := slack.ToMessage(ev, "", true)
			if err != nil {
				t.Fatal(err)
			}
			if m.Text != tc.text || len(m.Attachments) != len(tc.atts) {
				t.Fatalf("ToMessage = %+v", m)
			}
			for i, a := range m.Attachments {
				if a != tc.atts[i] {
					t.Errorf("attachment %d = %+v, want %+v", i, a, tc.atts[i])
				}
			}
			if (tc.quote == nil) != (m.Quote == nil) || tc.quote != nil && *tc.quote != *m.Quote {
				t.Errorf("quote = %+v, want %+v", m.Quote, tc.quote)
			}
			if kind, _, _ := session.ClassifyMessage(m.Text, m.Attachments); kind != tc.kind {
				t.Errorf("kind %s, want %s", kind, tc.kind)
			}
		})
	}
}

// TestEventMediaLinks: a file arrives with a link to the ingress's media
// endpoint, never Slack's url_private (which needs the bot token); the
// link serves the bytes through files.info and the authenticated
// download; a forged link gets 403 without a call to Slack, a file Slack
// does not know 404.
func TestEventMediaLinks(t *testing.T) {
	t.Parallel()
	env := platformtest.New(t)
	api := slackfake.New(t)
	media := httptest.NewUnstartedServer(nil)
	a, err := slack.New(env.Pub, slack.Config{SigningSecret: secret, BotToken: slackfake.BotToken, APIBase: api.APIBase(),
		MediaBaseURL: "http://" + media.Listener.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	mh, err := a.MediaHandler(0)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(ingress.MediaPathPrefix+"slack/", mh)
	media.Config.Handler = mux
	media.Start()
	t.Cleanup(media.Close)
	h, err := a.Handler()
	if err != nil {
		t.Fatal(err)
	}
	jpeg := []byte("\xff\xd8\xff\xe0 whiteboard")
	api.AddFile("F0A1B2C3D4E", "IMG_0412.jpg", "image/jpeg", jpeg)

	body := readFile(t, "file_share_im.json")
	req := httptest.NewRequest(http.MethodPost, "/webhooks/slack", strings.NewReader(string(body)))
	req.Header = slackfake.Sign(secret, time.Now(), body)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusOK {
		t.Fatalf("event: %d %s", w.Code, w.Body)
	}
	in := env.Inbox()
	if len(in) != 1 || len(in[0].Attachments) != 1 {
		t.Fatalf("inbox %+v", in)
	}
	link := in[0].Attachments[0].URL
	if !strings.HasPrefix(link, media.URL+"/v1/media/slack/F0A1B2C3D4E?sig=") || strings.Contains(link, "xoxb") || strings.Contains(link, "files.slack.com") {
		t.Fatalf("attachment URL %q", link)
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
	if code, b := get(link); code != http.StatusOK || string(b) != string(jpeg) {
		t.Fatalf("GET link: %d %q", code, b)
	}
	calls := api.FileInfos()
	if code, _ := get(strings.Replace(link, "F0A1B2C3D4E", "F0A1B2C3D4F", 1)); code != http.StatusForbidden {
		t.Fatalf("forged link: %d", code)
	}
	if api.FileInfos() != calls {
		t.Fatal("a forged link reached Slack")
	}
	other, _ := ingress.NewMediaLinker(media.URL, session.PlatformSlack, ingress.MediaKey(slackfake.BotToken))
	if code, _ := get(other.Link("F0NOSUCH")); code != http.StatusNotFound {
		t.Fatalf("unknown file: %d, want 404", code)
	}
}
