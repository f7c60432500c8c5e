package ingress_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
)

func TestMediaEndpoint(t *testing.T) {
	files := map[string]string{"AgAC-photo_1": "\xff\xd8jpeg bytes", "big": strings.Repeat("x", 64)}
	var fetched atomic.Int32
	fetch := ingress.MediaFetcherFunc(func(ctx context.Context, id string) (*ingress.MediaFile, error) {
		fetched.Add(1)
		switch id {
		case "broken":
			return nil, fmt.Errorf("platform said 500")
		}
		b, ok := files[id]
		if !ok {
			return nil, fmt.Errorf("getFile: %w", ingress.ErrMediaNotFound)
		}
		return &ingress.MediaFile{Body: io.NopCloser(strings.NewReader(b)), ContentType: "image/jpeg", Size: int64(len(b))}, nil
	})
	key := ingress.MediaKey("123:bot-token")
	h, err := ingress.MediaHandler(ingress.MediaHandlerConfig{Platform: session.PlatformTelegram, Key: key, Fetcher: fetch, MaxBytes: 32})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(ingress.MediaPathPrefix+"telegram/", h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	linker, err := ingress.NewMediaLinker(srv.URL, session.PlatformTelegram, key)
	if err != nil {
		t.Fatal(err)
	}
	get := func(u string) (int, string, string) {
		t.Helper()
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}

	link := linker.Link("AgAC-photo_1")
	if strings.Contains(link, "bot-token") {
		t.Fatalf("link leaks the credential: %s", link)
	}
	if code, ct, body := get(link); code != 200 || ct != "image/jpeg" || body != files["AgAC-photo_1"] {
		t.Fatalf("valid link: %d %s %q", code, ct, body)
	}
	if fetched.Load() != 1 {
		t.Fatalf("fetched %d times", fetched.Load())
	}

	// Refusals fetch nothing.
	for _, u := range []string{
		strings.Replace(link, "sig=", "sig=0", 1),
		strings.Split(link, "?")[0],
		strings.Replace(link, "AgAC-photo_1", "big", 1), // another file, same signature
	} {
		if code, _, _ := get(u); code != http.StatusForbidden {
			t.Errorf("GET %s = %d, want 403", u, code)
		}
	}
	other, _ := ingress.NewMediaLinker(srv.URL, session.PlatformTelegram, ingress.MediaKey("another-token"))
	if code, _, _ := get(other.Link("AgAC-photo_1")); code != http.StatusForbidden {
		t.Errorf("link signed with another key = %d, want 403", code)
	}
	if fetched.Load() != 1 {
		t.Fatalf("a refused request fetched: %d", fetched.Load())
	}

	for id, want := range map[string]int{"gone": 404, "broken": 502, "big": 413} {
		if code, _, _ := get(linker.Link(id)); code != want {
			t.Errorf("file %s: %d, want %d", id, code, want)
		}
	}
	if _, err := ingress.NewMediaLinker("ftp://x", session.PlatformTelegram, key); err == nil {
		t.Error("ftp base accepted")
	}
	if _, err := ingress.NewMediaLinker(srv.URL, session.PlatformTelegram, nil); err == nil {
		t.Error("empty key accepted")
	}
}

// TestPostMessageWithMedia: attachments and the reply context reach the
// inbox as references; a voice note is its own (queue) turn, a photo a
// plain message, a caption is never a command; bad media changes nothing.
func TestPostMessageWithMedia(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	r := b.post(t, `{"chat_id":"c1","message_id":"m1","text":"/new look",
		"attachments":[{"kind":"photo","url":"https://files.example/p1.jpg","mime_type":"image/jpeg","size":2048,"caption":"/new look"},
		               {"kind":"photo","url":"https://files.example/p2.jpg"}],
		"reply_to":{"message_id":"m0","text":"what do you see?","sender_id":"bot","sender_name":"Fleet"}}`)
	wantStatus(t, r, http.StatusAccepted)
	m := b.inboxMsg(t, seqOf(t, r))
	if k := m.Header.Get(broker.HdrKind); k != session.KindMessage {
		t.Fatalf("photo message kind %q", k)
	}
	var in session.Inbound
	if err := json.Unmarshal(m.Data, &in); err != nil {
		t.Fatal(err)
	}
	if in.Command != "" || in.Text != "/new look" || len(in.Attachments) != 2 || in.Attachments[0].Size != 2048 ||
		in.Attachments[1].URL != "https://files.example/p2.jpg" || in.Quote == nil || in.Quote.Text != "what do you see?" || in.ReplyTo != "m0" {
		t.Fatalf("inbox body %s", m.Data)
	}

	r = b.post(t, `{"chat_id":"c1","message_id":"m2","attachments":[{"kind":"voice","url":"https://files.example/v.ogg","mime_type":"audio/ogg"}]}`)
	wantStatus(t, r, http.StatusAccepted)
	if k := b.inboxMsg(t, seqOf(t, r)).Header.Get(broker.HdrKind); k != session.KindQueue {
		t.Fatalf("voice note kind %q, want its own turn (%s)", k, session.KindQueue)
	}

	before := b.inboxCount(t)
	for body, want := range map[string]string{
		`{"chat_id":"c1"}`: "text is required",
		`{"chat_id":"c1","attachments":[{"kind":"photo","file_id":"x"}]}`:                                                              "url is required",
		`{"chat_id":"c1","attachments":[{"kind":"gif","url":"https://h/a"}]}`:                                                          "attachments[0]: invalid attachment: kind",
		`{"chat_id":"c1","attachments":[{"kind":"photo","url":"https://u:p@h/a"}]}`:                                                    "user info",
		`{"chat_id":"c1","attachments":[{"kind":"photo","url":"file:///etc/passwd"}]}`:                                                 "http or https",
		`{"chat_id":"c1","text":"x","reply_to":{"text":"no id"}}`:                                                                      "message_id is required",
		`{"chat_id":"c1","text":"x","reply_to":{"message_id":"1","text":"` + strings.Repeat("q", session.MaxQuoteTextLength+1) + `"}}`: "longer than the limit",
	} {
		wantError(t, b.post(t, body), http.StatusBadRequest, want)
	}
	if after := b.inboxCount(t); after != before {
		t.Fatalf("refused messages were stored: %d -> %d", before, after)
	}
}

// FuzzMediaLink: whatever the file id and the signature, the endpoint
// never panics, fetches nothing without the right signature, and serves
// every link the linker makes (the file id comes back unchanged).
func FuzzMediaLink(f *testing.F) {
	for _, s := range [][2]string{{"AgACAgQAAxkBAAIB", ""}, {"a/b", "00"}, {"..", "x"}, {"%2F", "zz"}, {"é ?#", ""}, {"", ""}} {
		f.Add(s[0], s[1])
	}
	key := ingress.MediaKey("123:token")
	f.Fuzz(func(t *testing.T, fileID, sig string) {
		var asked []string
		fetch := ingress.MediaFetcherFunc(func(_ context.Context, id string) (*ingress.MediaFile, error) {
			asked = append(asked, id)
			return &ingress.MediaFile{Body: io.NopCloser(strings.NewReader("x")), Size: 1}, nil
		})
		h, _ := ingress.MediaHandler(ingress.MediaHandlerConfig{Platform: session.PlatformTelegram, Key: key, Fetcher: fetch})
		l, _ := ingress.NewMediaLinker("http://ingress.test", session.PlatformTelegram, key)

		// A forged request.
		target := "/v1/media/telegram/" + url.PathEscape(fileID) + "?sig=" + url.QueryEscape(sig)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, target, nil))
		if w.Code == http.StatusOK && (len(asked) != 1 || asked[0] != fileID || !strings.Contains(l.Link(fileID), "sig="+sig)) {
			t.Fatalf("served %q with sig %q (fetched %q)", fileID, sig, asked)
		}
		if w.Code != http.StatusOK && len(asked) != 0 {
			t.Fatalf("refused %d but fetched %q", w.Code, asked)
		}

		// The real link.
		if fileID == "" {
			return
		}
		asked = nil
		u, err := url.Parse(l.Link(fileID))
		if err != nil {
			t.Fatalf("link %q: %v", l.Link(fileID), err)
		}
		w = httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, u.RequestURI(), nil))
		if w.Code != http.StatusOK || len(asked) != 1 || asked[0] != fileID {
			t.Fatalf("link for %q: %d, fetched %q", fileID, w.Code, asked)
		}
	})
}
