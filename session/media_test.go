package session

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestAttachmentValidate(t *testing.T) {
	ok := Attachment{Kind: AttachPhoto, FileID: "AgACAgIAAxkBAAIB", URL: "https://files.example/a.jpg", MimeType: "image/jpeg", Size: 1234, Caption: "look"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid attachment refused: %v", err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*Attachment)
		want string
	}{
		{"unknown kind", func(a *Attachment) { a.Kind = "gif" }, "kind"},
		{"empty kind", func(a *Attachment) { a.Kind = "" }, "kind"},
		{"no reference", func(a *Attachment) { a.FileID, a.URL = "", "" }, "file_id or a url"},
		{"file id with slash", func(a *Attachment) { a.FileID = "a/b" }, "file_id"},
		{"file id too long", func(a *Attachment) { a.FileID = strings.Repeat("x", MaxFileIDLength+1) }, "file_id"},
		{"relative url", func(a *Attachment) { a.URL = "/a.jpg" }, "url"},
		{"ftp url", func(a *Attachment) { a.URL = "ftp://h/a" }, "url"},
		{"url with credentials", func(a *Attachment) { a.URL = "https://bot:secret@h/a" }, "user info"},
		{"url with space", func(a *Attachment) { a.URL = "https://h/a b" }, "url"},
		{"url too long", func(a *Attachment) { a.URL = "https://h/" + strings.Repeat("a", MaxURLLength) }, "url"},
		{"bad mime", func(a *Attachment) { a.MimeType = "jpeg" }, "mime_type"},
		{"negative size", func(a *Attachment) { a.Size = -1 }, "size"},
		{"caption too long", func(a *Attachment) { a.Caption = strings.Repeat("x", MaxCaptionLength+1) }, "caption"},
		{"name not utf8", func(a *Attachment) { a.Name = "\xff" }, "name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := ok
			tc.mod(&a)
			err := a.Validate()
			if err == nil || !errors.Is(err, ErrInvalidAttachment) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an ErrInvalidAttachment naming %q", err, tc.want)
			}
		})
	}
}

func TestQuoteValidateAndTrim(t *testing.T) {
	if err := (Quote{MessageID: "42", Text: "hi", SenderID: "7", SenderName: "Ada"}).Validate(); err != nil {
		t.Fatal(err)
	}
	for _, q := range []Quote{{}, {MessageID: "a/b"}, {MessageID: "1", Text: strings.Repeat("x", MaxQuoteTextLength+1)}, {MessageID: "1", SenderName: "\xff"}} {
		if err := q.Validate(); !errors.Is(err, ErrInvalidQuote) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalidQuote", q, err)
		}
	}
	q := Quote{MessageID: "1", Text: strings.Repeat("é", MaxQuoteTextLength)}
	q.Trim()
	if len(q.Text) > MaxQuoteTextLength || q.Validate() != nil {
		t.Fatalf("Trim left %d bytes (valid: %v)", len(q.Text), q.Validate())
	}
}

func TestValidateMediaBounds(t *testing.T) {
	atts := make([]Attachment, MaxAttachments+1)
	for i := range atts {
		atts[i] = Attachment{Kind: AttachPhoto, FileID: "f"}
	}
	if err := ValidateMedia(atts, nil); err == nil {
		t.Fatal("too many attachments accepted")
	}
	if err := ValidateMedia(atts[:MaxAttachments], nil); err != nil {
		t.Fatal(err)
	}
	err := ValidateMedia([]Attachment{{Kind: AttachPhoto, FileID: "f"}, {Kind: "x", FileID: "g"}}, &Quote{})
	if err == nil || !strings.Contains(err.Error(), "attachments[1]") || !strings.Contains(err.Error(), "reply_to") {
		t.Fatalf("error does not name the attachment and the quote: %v", err)
	}
}

func TestClassifyMessage(t *testing.T) {
	for _, tc := range []struct {
		text string
		atts []Attachment
		kind string
	}{
		{"/new", nil, KindCommand},
		{"/new", []Attachment{{Kind: AttachPhoto}}, KindMessage},
		{"", []Attachment{{Kind: AttachPhoto}, {Kind: AttachSticker}}, KindMessage},
		{"", []Attachment{{Kind: AttachVoice}}, KindQueue},
		{"see", []Attachment{{Kind: AttachPhoto}, {Kind: AttachDocument}}, KindQueue},
		{"", []Attachment{{Kind: AttachVideo}}, KindQueue},
		{"", []Attachment{{Kind: AttachAudio}}, KindQueue},
	} {
		kind, cmd, _ := ClassifyMessage(tc.text, tc.atts)
		if kind != tc.kind || (len(tc.atts) > 0 && cmd != "") {
			t.Errorf("ClassifyMessage(%q, %v) = %s %q, want %s", tc.text, tc.atts, kind, cmd, tc.kind)
		}
	}
}

func TestIsImage(t *testing.T) {
	for _, tc := range []struct {
		a    Attachment
		want bool
	}{
		{Attachment{Kind: AttachPhoto}, true},
		{Attachment{Kind: AttachSticker, MimeType: "image/webp"}, true},
		{Attachment{Kind: AttachSticker, MimeType: "application/x-tgsticker"}, false},
		{Attachment{Kind: AttachSticker, MimeType: "video/webm"}, false},
		{Attachment{Kind: AttachDocument, MimeType: "image/png"}, false},
	} {
		if got := tc.a.IsImage(); got != tc.want {
			t.Errorf("%+v.IsImage() = %v", tc.a, got)
		}
	}
}

func TestLatestQuote(t *testing.T) {
	a, b := &Quote{MessageID: "1"}, &Quote{MessageID: "2"}
	if LatestQuote(a, b, nil) != b || LatestQuote(nil, nil) != nil || LatestQuote(a) != a {
		t.Fatal("LatestQuote does not pick the newest non-nil quote")
	}
}

func TestInboundMediaRoundTrip(t *testing.T) {
	in := Inbound{Kind: KindQueue, Text: "cap", ReplyTo: "9",
		Quote:       &Quote{MessageID: "9", Text: "earlier", SenderName: "Bob"},
		Attachments: []Attachment{{Kind: AttachVoice, FileID: "v1", URL: "https://h/v1", MimeType: "audio/ogg", Size: 10}}}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out Inbound
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out.Quote == nil || *out.Quote != *in.Quote || len(out.Attachments) != 1 || out.Attachments[0] != in.Attachments[0] {
		t.Fatalf("round trip lost media: %s", b)
	}
}
