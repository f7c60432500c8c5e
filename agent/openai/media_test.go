package openai_test

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/agent/agenttest"
	"github.com/agentfleet/agentfleet/agent/openai"
	"github.com/agentfleet/agentfleet/agent/openai/openaitest"
	"github.com/agentfleet/agentfleet/session"
)

// png is a 1x1 PNG.
var png, _ = base64.StdEncoding.DecodeString("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=")

// mediaTurn is a turn whose message carries two photos (one of them not
// fetchable), a voice note and a quote, after an earlier turn with a
// photo of its own.
func mediaTurn(files *httptest.Server) *agent.Turn {
	t := agenttest.NewTurn("agent:main:http:dm:c1", "compare these")
	earlier := session.Attachment{Kind: session.AttachPhoto, URL: files.URL + "/old.png", MimeType: "image/png"}
	t.History[0].Attachments = []session.Attachment{earlier}
	atts := []session.Attachment{
		{Kind: session.AttachPhoto, URL: files.URL + "/a.png", MimeType: "image/png", Size: int64(len(png))},
		{Kind: session.AttachPhoto, URL: files.URL + "/gone.png", MimeType: "image/png"},
		{Kind: session.AttachVoice, URL: files.URL + "/v.ogg", MimeType: "audio/ogg", Size: 11392},
	}
	q := &session.Quote{MessageID: "41", Text: "the old chart", SenderName: "Fleet"}
	t.Messages[0].Attachments, t.Messages[0].Quote = atts, q
	t.History[2].Attachments, t.History[2].Quote = atts, q
	return t
}

func fileServer(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/a.png", "/old.png":
			w.Header().Set("Content-Type", "image/png")
			_, _ = w.Write(png)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestImagesInline: the turn's photos reach the model as image parts with
// the bytes inlined as data URLs; one that cannot be fetched is said so in
// the text; every attachment and the quote are described in the text;
// the earlier turn's photo is not sent again.
func TestImagesInline(t *testing.T) {
	t.Parallel()
	srv := openaitest.New(t)
	files := fileServer(t)
	b, err := openai.New(openai.Config{Model: "vision-model", BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a, _ := b.NewAgent(t.Context(), "k", "s")
	if _, err := a.Run(t.Context(), mediaTurn(files), &agenttest.Recorder{}); err != nil {
		t.Fatal(err)
	}
	msgs := srv.Requests()[0].Messages
	last := msgs[len(msgs)-1]
	imgs := last.ImageURLs()
	if len(imgs) != 1 || imgs[0] != "data:image/png;base64,"+base64.StdEncoding.EncodeToString(png) {
		t.Fatalf("image parts %q, want the one fetchable photo inlined", imgs)
	}
	text := last.Text()
	for _, want := range []string{`[replying to Fleet: "the old chart"]`, "compare these", "[photo attached: image/png", "[voice note attached: audio/ogg, 11392 bytes, " + files.URL + "/v.ogg]",
		"could not be loaded"} {
		if !strings.Contains(text, want) {
			t.Errorf("user text %q lacks %q", text, want)
		}
	}
	for _, m := range msgs[:len(msgs)-1] {
		if len(m.ImageURLs()) != 0 {
			t.Errorf("an earlier message carries image parts: %+v", m)
		}
	}
	if !strings.Contains(msgs[1].Text(), "[photo attached: image/png, "+files.URL+"/old.png]") {
		t.Errorf("the earlier photo is not described: %q", msgs[1].Text())
	}
}

// TestImagesURLAndNone: in url mode the attachment URLs are the image
// parts (nothing is fetched); in none mode there are no image parts.
func TestImagesURLAndNone(t *testing.T) {
	t.Parallel()
	srv := openaitest.New(t)
	files := fileServer(t)
	for _, tc := range []struct {
		mode string
		want []string
	}{{openai.ImagesURL, []string{files.URL + "/a.png", files.URL + "/gone.png"}}, {openai.ImagesNone, nil}} {
		b, err := openai.New(openai.Config{Model: "m-" + tc.mode, BaseURL: srv.URL, Images: tc.mode})
		if err != nil {
			t.Fatal(err)
		}
		a, _ := b.NewAgent(t.Context(), "k", "s")
		if _, err := a.Run(t.Context(), mediaTurn(files), &agenttest.Recorder{}); err != nil {
			t.Fatal(err)
		}
		_ = b.Close()
		var req *openaitest.Request
		for _, r := range srv.Requests() {
			if r.Model == "m-"+tc.mode {
				req = &r
			}
		}
		last := req.Messages[len(req.Messages)-1]
		if got := last.ImageURLs(); strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("%s: image parts %q, want %q", tc.mode, got, tc.want)
		}
		if !strings.Contains(last.Text(), "[voice note attached") {
			t.Errorf("%s: text %q", tc.mode, last.Text())
		}
	}
	if _, err := openai.New(openai.Config{Model: "m", Images: "base64"}); err == nil {
		t.Error("an unknown images mode was accepted")
	}
}
