package whatsapp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/ingress/platformtest"
	"github.com/agentfleet/agentfleet/ingress/whatsapp"
	"github.com/agentfleet/agentfleet/ingress/whatsapp/whatsapptest"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

func TestMain(m *testing.M) { natstest.VerifyNoLeaks(m, 10*time.Second) }

const (
	waitTimeout = 30 * time.Second
	appSecret   = "0123456789abcdef0123456789abcdef"
	verifyToken = "fleet-verify-42"
	sheena      = "16505551234"
	sheenaKey   = "agent:main:whatsapp:dm:16505551234"
)

type bundle struct {
	*platformtest.Env
	t       *testing.T
	api     *whatsapptest.Server
	adapter *whatsapp.Adapter
	hook    *httptest.Server
	skew    atomic.Int64 // added to the adapter's clock
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{Env: platformtest.New(t), t: t, api: whatsapptest.New(t)}
	a, err := whatsapp.New(b.Pub, b.JS, b.Res, whatsapp.Config{AppSecret: appSecret, VerifyToken: verifyToken,
		AccessToken: whatsapptest.Token, PhoneNumberID: whatsapptest.PhoneNumberID, APIBase: b.api.URL + "/v23.0",
		Now: func() time.Time { return time.Now().Add(time.Duration(b.skew.Load())) }})
	if err != nil {
		t.Fatal(err)
	}
	h, err := a.Handler()
	if err != nil {
		t.Fatal(err)
	}
	b.adapter = a
	b.hook = httptest.NewServer(h)
	t.Cleanup(b.hook.Close)
	return b
}

func readFile(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// post sends body with the given signature header ("" = none).
func (b *bundle) post(body []byte, sig string) (int, string) {
	b.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, b.hook.URL+"/webhooks/whatsapp", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if sig != "" {
		req.Header.Set(whatsapp.HeaderSignature, sig)
	}
	resp, err := b.hook.Client().Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

func (b *bundle) postSigned(body []byte) (int, string) {
	return b.post(body, whatsapp.Sign(appSecret, body))
}

// TestToMessageRecorded converts recorded Cloud API notifications: text,
// a reply quoting the business's message, a captioned image, a button
// reply; a voice note without caption and a reaction are ignored.
func TestToMessageRecorded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		file, skip, text, replyTo string
		att                       *session.Attachment
	}{
		{file: "text.json", text: "Does it come in another color?"},
		{file: "reply_context.json", text: "yes, the blue one", replyTo: "wamid.HBgLMTY1MDM4Nzk0MzkVAgARGBI0QjUzMjMwNjY3NjdCMjhGNUQA"},
		{file: "image_caption.json", text: "what is this plant?",
			att: &session.Attachment{Kind: session.AttachPhoto, FileID: "1003383421387256", MimeType: "image/jpeg", Caption: "what is this plant?"}},
		{file: "button_reply.json", text: "Change it", replyTo: "wamid.HBgLMTY1MDM4Nzk0MzkVAgARGBJBMDg3NjlCQjJFMTQ0RkUwMkMA"},
		{file: "voice.json", att: &session.Attachment{Kind: session.AttachVoice, FileID: "1446218129866312", MimeType: "audio/ogg; codecs=opus"}},
		{file: "reaction.json", skip: `message type "reaction"`},
	} {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			p, err := whatsapp.ParsePayload(readFile(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			v := &p.Entry[0].Changes[0].Value
			m, err := whatsapp.ToMessage(v, &v.Messages[0])
			var skip *whatsapp.Skip
			if tc.skip != "" {
				if !errors.As(err, &skip) || skip.Reason != tc.skip {
					t.Fatalf("ToMessage = %+v, %v; want skipped (%s)", m, err, tc.skip)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			src := m.Source
			if src.Platform != session.PlatformWhatsApp || src.ChatType != session.ChatDM || src.ChatID != sheena ||
				src.UserID != sheena || src.UserName != "Sheena Nelson" || m.Text != tc.text || m.ReplyTo != tc.replyTo {
				t.Errorf("ToMessage = %+v", m)
			}
			if tc.att == nil && len(m.Attachments) != 0 || tc.att != nil && (len(m.Attachments) != 1 || m.Attachments[0] != *tc.att) {
				t.Errorf("attachments = %+v, want %+v", m.Attachments, tc.att)
			}
			if tc.replyTo != "" && (m.Quote == nil || m.Quote.MessageID != tc.replyTo || m.Quote.SenderID != "15550783881") {
				t.Errorf("quote = %+v", m.Quote)
			}
			if want := "whatsapp:" + sheena + ":" + v.Messages[0].ID; m.DedupID != want {
				t.Errorf("DedupID = %q, want %q", m.DedupID, want)
			}
			if key := session.BuildSessionKey(src, session.DefaultKeyOptions()); key != sheenaKey {
				t.Errorf("session key = %q", key)
			}
		})
	}
}

// TestVerifyHandshake: Meta's GET with the right verify token gets the
// challenge back; a wrong token or mode gets 403.
func TestVerifyHandshake(t *testing.T) {
	t.Parallel()
	b := setup(t)
	get := func(mode, token string) (int, string) {
		q := url.Values{"hub.mode": {mode}, "hub.verify_token": {token}, "hub.challenge": {"1158201444"}}
		resp, err := b.hook.Client().Get(b.hook.URL + "/webhooks/whatsapp?" + q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	if status, body := get("subscribe", verifyToken); status != http.StatusOK || body != "1158201444" {
		t.Fatalf("good token: %d %q", status, body)
	}
	for _, tc := range [][2]string{{"subscribe", "wrong"}, {"subscribe", ""}, {"unsubscribe", verifyToken}} {
		if status, body := get(tc[0], tc[1]); status != http.StatusForbidden || strings.Contains(body, "1158201444") {
			t.Errorf("%v: %d %q, want 403", tc, status, body)
		}
	}
	if _, err := whatsapp.New(b.Pub, b.JS, b.Res, whatsapp.Config{VerifyToken: verifyToken}); err != nil {
		t.Fatal(err)
	}
	a, _ := whatsapp.New(b.Pub, b.JS, b.Res, whatsapp.Config{VerifyToken: verifyToken})
	if _, err := a.Handler(); !errors.Is(err, ingress.ErrInvalidConfig) {
		t.Fatalf("Handler without app secret: %v", err)
	}
}

// TestSignature: the signature over the raw bytes is accepted (a body
// with non-ASCII text, which re-serialized JSON would change, included);
// a missing, wrong or re-serialized-body signature gets 401 and publishes
// nothing.
func TestSignature(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := bytes.Replace(readFile(t, "text.json"), []byte("another color?"), []byte(`another colour? \u00e9t\u00e9 🌿`), 1)
	var v any
	_ = json.Unmarshal(body, &v)
	reser, _ := json.Marshal(v)
	for _, sig := range []string{"", "sha256=", "sha256=zz", whatsapp.Sign("other-secret", body), whatsapp.Sign(appSecret, reser),
		strings.TrimPrefix(whatsapp.Sign(appSecret, body), "sha256="), strings.Replace(whatsapp.Sign(appSecret, body), "sha256=", "sha1=", 1)} {
		if status, resp := b.post(body, sig); status != http.StatusUnauthorized {
			t.Errorf("signature %q: %d %s, want 401", sig, status, resp)
		}
	}
	if n := len(b.Inbox()); n != 0 {
		t.Fatalf("refused requests published %d messages", n)
	}
	if status, resp := b.postSigned(body); status != http.StatusOK || !strings.Contains(resp, `"accepted":1`) {
		t.Fatalf("good signature: %d %s", status, resp)
	}
	in := b.Inbox()
	if len(in) != 1 || in[0].Text != "Does it come in another colour? été 🌿" || in[0].SessionKey != sheenaKey {
		t.Fatalf("inbox = %+v", in)
	}
}

// TestDedupAndStatuses: Meta redelivering a notification gives one inbox
// message; status callbacks publish no turn but delivery_status events,
// and a failed one (131047) a delivery_failed event; bad input is 4xx.
func TestDedupAndStatuses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 3 {
		status, resp := b.postSigned(readFile(t, "reply_context.json"))
		if status != http.StatusOK || (i > 0) != strings.Contains(resp, `"duplicates":1`) {
			t.Fatalf("post %d: %d %s", i, status, resp)
		}
	}
	for _, f := range []string{"status_delivered.json", "status_failed.json", "status_failed.json", "reaction.json"} {
		if status, resp := b.postSigned(readFile(t, f)); status != http.StatusOK {
			t.Fatalf("%s: %d %s", f, status, resp)
		}
	}
	in := b.Inbox()
	if len(in) != 1 || in[0].ReplyTo != "wamid.HBgLMTY1MDM4Nzk0MzkVAgARGBI0QjUzMjMwNjY3NjdCMjhGNUQA" {
		t.Fatalf("inbox = %+v, want the one reply", in)
	}
	fails := b.Failures()
	if len(fails) != 1 || fails[0].Platform != session.PlatformWhatsApp || fails[0].SessionKey != sheenaKey ||
		!strings.Contains(fails[0].Error, "131047") || !strings.Contains(fails[0].Error, "24 hours") {
		t.Fatalf("failures = %+v", fails)
	}
	statuses := b.events(whatsapp.StatusKind)
	if len(statuses) != 2 || statuses[0].Status != "delivered" || statuses[1].Status != "failed" || statuses[0].SessionKey != sheenaKey {
		t.Fatalf("status events = %+v", statuses)
	}
	for _, tc := range []struct {
		body   string
		status int
	}{
		{`{"object":`, http.StatusBadRequest},
		{`{"object":"page","entry":[]}`, http.StatusBadRequest},
		{`[1]`, http.StatusBadRequest},
		{strings.Repeat(" ", 2<<20), http.StatusRequestEntityTooLarge},
	} {
		if status, resp := b.postSigned([]byte(tc.body)); status != tc.status {
			t.Errorf("body %.30q: %d %s, want %d", tc.body, status, resp, tc.status)
		}
	}
	if n := len(b.Inbox()); n != 1 {
		t.Fatalf("bad input published: %d messages", n)
	}
}

func (b *bundle) events(kind string) []whatsapp.StatusEvent {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	var out []whatsapp.StatusEvent
	for seq := uint64(1); ; {
		raw, err := b.Res.Events.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(b.Names.Prefix()+".ev."+kind+".>"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out
		}
		if err != nil {
			b.t.Fatal(err)
		}
		var e whatsapp.StatusEvent
		if err := json.Unmarshal(raw.Data, &e); err != nil {
			b.t.Fatal(err)
		}
		out = append(out, e)
		seq = raw.Sequence + 1
	}
}

// TestLIDAliasSharesLane: with the bridge's alias mapping, a message from
// the user's LID and one from their phone number go to one lane.
func TestLIDAliasSharesLane(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, val := range map[string]string{"lid-mapping-16505551234.json": `"98765432109876"`, "lid-mapping-98765432109876_reverse.json": `"16505551234"`} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(val), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	env := platformtest.New(t)
	opts := session.DefaultKeyOptions()
	opts.WhatsApp = session.NewWhatsAppResolver(dir)
	pub, err := ingress.NewPublisher(env.JS, env.Res, ingress.Config{Names: env.Names, KeyOptions: opts})
	if err != nil {
		t.Fatal(err)
	}
	a, err := whatsapp.New(pub, env.JS, env.Res, whatsapp.Config{AppSecret: appSecret, VerifyToken: verifyToken})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"text.json", "lid_alias.json"} {
		if _, err := a.Handle(context.Background(), readFile(t, f)); err != nil {
			t.Fatal(err)
		}
	}
	in := env.Inbox()
	if len(in) != 2 || in[0].SessionKey != in[1].SessionKey {
		t.Fatalf("inbox = %+v, want two messages in one lane", in)
	}
}

func (b *bundle) waitSent(n int) []whatsapptest.Sent {
	b.t.Helper()
	var sent []whatsapptest.Sent
	natstest.WaitFor(b.t, waitTimeout, fmt.Sprintf("%d messages sent", n), func() error {
		sent = b.api.Sent()
		if len(sent) < n {
			return fmt.Errorf("%d sent", len(sent))
		}
		return nil
	})
	return sent
}

func (b *bundle) waitFailures(n int) []ingress.DeliveryFailure {
	b.t.Helper()
	var fails []ingress.DeliveryFailure
	natstest.WaitFor(b.t, waitTimeout, fmt.Sprintf("%d failure events", n), func() error {
		fails = b.Failures()
		if len(fails) < n {
			return fmt.Errorf("%d events", len(fails))
		}
		return nil
	})
	return fails
}

// open makes the user write now, which opens their customer-service
// window (the recorded message's timestamp is moved to now).
func (b *bundle) open() {
	b.t.Helper()
	body := bytes.Replace(readFile(b.t, "text.json"), []byte(`"timestamp":"1749416383"`), []byte(fmt.Sprintf(`"timestamp":"%d"`, time.Now().Unix())), 1)
	if status, resp := b.postSigned(body); status != http.StatusOK {
		b.t.Fatalf("%d %s", status, resp)
	}
}

// TestDeliverySplitsInOrder: a reply longer than 4096 characters is sent as
// several messages in order, each within the limit; the next reply
// follows.
func TestDeliverySplitsInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.open()
	b.StartDelivery(whatsapp.DeliveryConfig(b.adapter.Sender()), nil)
	var long strings.Builder
	for i := range 600 {
		fmt.Fprintf(&long, "line %d of the answer 🌿\n", i)
	}
	b.PublishReply(session.PlatformWhatsApp, "w1:1", sheena, "", long.String())
	b.PublishReply(session.PlatformWhatsApp, "w1:2", sheena, "", "second reply")
	var sent []whatsapptest.Sent
	natstest.WaitFor(t, waitTimeout, "the second reply", func() error {
		sent = b.api.Sent()
		if len(sent) == 0 || sent[len(sent)-1].Text != "second reply" {
			return fmt.Errorf("%d sent", len(sent))
		}
		return nil
	})
	parts := sent[:len(sent)-1]
	if len(parts) < 2 {
		t.Fatalf("the long reply was sent as %d message(s)", len(parts))
	}
	var joined strings.Builder
	for i, p := range parts {
		if n := len([]rune(p.Text)); n > whatsapp.MaxMessageLength {
			t.Errorf("chunk %d is %d characters", i, n)
		}
		if p.To != sheena {
			t.Errorf("chunk %d to %q", i, p.To)
		}
		joined.WriteString(p.Text + "\n")
	}
	last := -1
	for i := range 600 {
		at := strings.Index(joined.String(), fmt.Sprintf("line %d of", i))
		if at < last {
			t.Fatalf("line %d missing or out of order", i)
		}
		last = at
	}
}

// TestDelivery429And5xx: a 429 (and error 130429) waits Retry-After and
// sends once; a 5xx is retried with the duplicate label.
func TestDelivery429And5xx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.open()
	b.api.FailNext(whatsapptest.Failure{Status: http.StatusTooManyRequests, Code: 130429, Message: "Rate limit hit", RetryAfter: 1},
		whatsapptest.Failure{Status: http.StatusInternalServerError, Code: 131000, Message: "Something went wrong"})
	b.StartDelivery(whatsapp.DeliveryConfig(b.adapter.Sender()), nil)
	b.PublishReply(session.PlatformWhatsApp, "w2:1", sheena, "", "hello after the flood")
	sent := b.waitSent(1)
	att := b.api.Attempts()
	if len(att) != 3 || len(sent) != 1 || sent[0].Text != ingress.DuplicateLabel+"hello after the flood" || att[0].Text != "hello after the flood" {
		t.Fatalf("attempts %+v, sent %+v", att, sent)
	}
	if gap := att[1].At.Sub(att[0].At); gap < time.Second {
		t.Errorf("retried %s after a 429 with Retry-After 1", gap)
	}
}

// TestDeliveryBudgetAndWindow: a reply that keeps failing is given up
// after the budget with a delivery_failed event; a reply to a user who
// never wrote, or last wrote more than 24 hours ago, fails at once with a
// clear error and is never posted; a 131047 answer is the same failure;
// later replies still go out.
func TestDeliveryBudgetAndWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.open()
	b.api.FailNext(whatsapptest.Failure{Status: 500}, whatsapptest.Failure{Status: 500}, whatsapptest.Failure{Status: 500},
		whatsapptest.Failure{Status: 400, Code: 131047, Message: "Re-engagement message"})
	b.StartDelivery(whatsapp.DeliveryConfig(b.adapter.Sender()), func(c *ingress.PlatformDeliveryConfig) { c.MaxAttempts = 3 })
	b.PublishReply(session.PlatformWhatsApp, "w3:1", sheena, "", "doomed")
	b.PublishReply(session.PlatformWhatsApp, "w3:2", sheena, "", "refused by meta")
	b.PublishReply(session.PlatformWhatsApp, "w3:3", "15550001111", "", "to a stranger")
	b.PublishReply(session.PlatformWhatsApp, "w3:4", sheena, "", "this one arrives")
	if sent := b.waitSent(1); sent[0].Text != "this one arrives" {
		t.Fatalf("sent %+v", sent)
	}
	fails := b.waitFailures(3)
	if fails[0].ReplyID != "w3:1" || fails[0].Attempts != 3 || !strings.Contains(fails[0].Error, "500") ||
		fails[1].ReplyID != "w3:2" || !strings.Contains(fails[1].Error, "24-hour") ||
		fails[2].ReplyID != "w3:3" || !strings.Contains(fails[2].Error, "has not written") || fails[2].Attempts != 1 {
		t.Fatalf("failures %+v", fails)
	}
	// A day later the window is closed: the reply is not posted.
	b.skew.Store(int64(25 * time.Hour))
	b.PublishReply(session.PlatformWhatsApp, "w3:5", sheena, "", "too late")
	fails = b.waitFailures(4)
	if fails[3].ReplyID != "w3:5" || !strings.Contains(fails[3].Error, "24-hour customer-service window") || !strings.Contains(fails[3].Error, "last wrote at") {
		t.Fatalf("failure %+v", fails[3])
	}
	for _, a := range b.api.Attempts() {
		if a.Text == "to a stranger" || a.Text == "too late" {
			t.Errorf("a reply outside the window was posted: %+v", a)
		}
	}
}

// FuzzParsePayload: no input makes the parser or the conversion panic,
// and whatever ToMessage accepts has a text, a dedup id and a DM source.
func FuzzParsePayload(f *testing.F) {
	entries, _ := os.ReadDir("testdata")
	for _, e := range entries {
		f.Add(readFile(f, e.Name()))
	}
	f.Add([]byte(`{"object":"whatsapp_business_account","entry":[{"changes":[{"field":"messages","value":{"messages":[{"from":"1","id":"x","type":"interactive","interactive":{}}]}}]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := whatsapp.ParsePayload(data)
		if err != nil {
			return
		}
		for _, e := range p.Entry {
			for _, c := range e.Changes {
				for i := range c.Value.Messages {
					m, err := whatsapp.ToMessage(&c.Value, &c.Value.Messages[i])
					if err != nil {
						continue
					}
					if strings.TrimSpace(m.Text) == "" && len(m.Attachments) == 0 || m.DedupID == "" || m.Source.ChatType != session.ChatDM || m.Source.ChatID == "" {
						t.Fatalf("accepted an unusable message: %+v", m)
					}
				}
			}
		}
	})
}

// TestMediaLinks: with a media base URL, a voice note and a captioned
// image reach the inbox as attachments whose URLs point at the ingress's
// media endpoint (no token in them); the endpoint fetches the bytes from
// the Graph API with the access token; a voice note is its own turn.
func TestMediaLinks(t *testing.T) {
	t.Parallel()
	env := platformtest.New(t)
	api := whatsapptest.New(t)
	api.AddMedia("1446218129866312", "audio/ogg", []byte("OggS voice bytes"))
	a, err := whatsapp.New(env.Pub, env.JS, env.Res, whatsapp.Config{AppSecret: appSecret, VerifyToken: verifyToken,
		AccessToken: whatsapptest.Token, PhoneNumberID: whatsapptest.PhoneNumberID, APIBase: api.URL + "/v23.0",
		MediaBaseURL: "http://ingress.example:8080"})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"image_caption.json", "voice.json"} {
		if _, err := a.Handle(context.Background(), readFile(t, f)); err != nil {
			t.Fatal(err)
		}
	}
	in := env.Inbox()
	if len(in) != 2 || len(in[0].Attachments) != 1 || len(in[1].Attachments) != 1 || in[1].Kind != session.KindQueue {
		t.Fatalf("inbox = %+v", in)
	}
	voice := in[1].Attachments[0]
	if voice.Kind != session.AttachVoice || !strings.HasPrefix(voice.URL, "http://ingress.example:8080/v1/media/whatsapp/1446218129866312?sig=") ||
		strings.Contains(voice.URL, whatsapptest.Token) {
		t.Fatalf("voice attachment %+v", voice)
	}
	h, err := a.MediaHandler(0)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	get := func(u string) (int, string) {
		resp, err := srv.Client().Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	path := strings.TrimPrefix(voice.URL, "http://ingress.example:8080")
	if status, body := get(srv.URL + path); status != http.StatusOK || body != "OggS voice bytes" {
		t.Fatalf("media: %d %q", status, body)
	}
	if status, _ := get(srv.URL + strings.Replace(path, "sig=", "sig=0", 1)); status != http.StatusForbidden {
		t.Errorf("bad signature: %d", status)
	}
	image := in[0].Attachments[0]
	if status, _ := get(srv.URL + strings.TrimPrefix(image.URL, "http://ingress.example:8080")); status != http.StatusNotFound {
		t.Errorf("unknown media: %d, want 404", status)
	}
}
