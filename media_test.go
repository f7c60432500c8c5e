package agentfleet_test

// The busy-input rules for media, through the public HTTP API: a real
// embedded nats-server, a worker (with a recording agent) and the HTTP
// adapter. The messages are posted before the worker starts, so the
// inbox holds the whole burst when the lane is first read and the turn
// boundaries do not depend on timing.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet"
	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/transcript"
)

const mediaWait = 60 * time.Second

// recorder is an agent backend that keeps every turn it runs.
type recorder struct {
	mu    sync.Mutex
	turns map[string][]agent.Turn // by session key
}

func (r *recorder) NewAgent(context.Context, string, string) (agent.Agent, error) {
	return agent.AgentFunc(func(ctx context.Context, t *agent.Turn, emit agent.Emitter) (*agent.Result, error) {
		r.mu.Lock()
		if r.turns == nil {
			r.turns = map[string][]agent.Turn{}
		}
		r.turns[t.SessionKey] = append(r.turns[t.SessionKey], *t)
		n := len(r.turns[t.SessionKey])
		r.mu.Unlock()
		return &agent.Result{Text: fmt.Sprintf("turn %d", n)}, nil
	}), nil
}

func (r *recorder) Close() error { return nil }

func (r *recorder) of(key string) []agent.Turn {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.turns[key])
}

type mediaFleet struct {
	t       *testing.T
	api     *httptest.Server
	rec     *recorder
	tx      *transcript.Log
	startFn func()
}

func newMediaFleet(t *testing.T) *mediaFleet {
	ns := natstest.RunServer(t)
	nc := ns.Connect(t)
	ctx, cancel := context.WithCancel(context.Background())
	h, err := agentfleet.NewHTTP(ctx, nc, agentfleet.HTTPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(h.Handler())
	tx, err := transcript.New(natstest.JetStream(t, nc), broker.MustNames(broker.DefaultPrefix), nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &mediaFleet{t: t, api: api, rec: &recorder{}, tx: tx}
	done := make(chan error, 1)
	started := false
	f.startFn = func() {
		w, err := agentfleet.NewWorker(ctx, nc, agentfleet.Options{Backend: f.rec, ID: "media-w"})
		if err != nil {
			t.Fatal(err)
		}
		started = true
		go func() { done <- w.Run(ctx) }()
	}
	t.Cleanup(func() {
		api.Close()
		h.Close()
		cancel()
		if started {
			<-done
		}
	})
	return f
}

// post sends one message body; it must be accepted.
func (f *mediaFleet) post(body string) (key string, seq uint64) {
	f.t.Helper()
	resp, err := http.Post(f.api.URL+"/v1/messages", "application/json", strings.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusAccepted {
		f.t.Fatalf("POST %s: %d %s", body, resp.StatusCode, raw)
	}
	var a struct {
		SessionKey string `json:"session_key"`
		Seq        uint64 `json:"seq"`
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		f.t.Fatal(err)
	}
	return a.SessionKey, a.Seq
}

type reply struct {
	Text    string `json:"text"`
	Kind    string `json:"kind"`
	ReplyTo string `json:"reply_to"`
	TurnID  string `json:"turn_id"`
}

// replies waits until the lane has at least n replies and returns them.
func (f *mediaFleet) replies(key string, n int) []reply {
	f.t.Helper()
	var got []reply
	natstest.WaitFor(f.t, mediaWait, fmt.Sprintf("%d replies on %s", n, key), func() error {
		resp, err := http.Get(f.api.URL + "/v1/sessions/" + url.PathEscape(key) + "/replies?after=0&wait=5s")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var body struct {
			Replies []reply `json:"replies"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			return err
		}
		got = body.Replies
		if len(got) < n {
			return fmt.Errorf("%d replies: %+v", len(got), got)
		}
		return nil
	})
	return got
}

func (f *mediaFleet) entry(key string) map[string]any {
	f.t.Helper()
	resp, err := http.Get(f.api.URL + "/v1/sessions/" + url.PathEscape(key))
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	var e map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		f.t.Fatal(err)
	}
	return e
}

// texts and kinds of a turn's messages, for failure messages and checks.
func summary(t agent.Turn) string {
	var parts []string
	for _, m := range t.Messages {
		var kinds []string
		for _, a := range m.Attachments {
			kinds = append(kinds, a.Kind)
		}
		parts = append(parts, fmt.Sprintf("%s%q%v", m.MessageID, m.Text, kinds))
	}
	return strings.Join(parts, " ")
}

// TestMediaBurstRules: a burst of photos and texts is one turn with every
// image and text, anchored on its newest message with the latest quote;
// a voice note, a video and a document behind it each get their own turn,
// in order; a photo and a sticker after them merge again.
func TestMediaBurstRules(t *testing.T) {
	t.Parallel()
	f := newMediaFleet(t)
	const chat = `"chat_id":"burst","user_id":"ada","user_name":"Ada"`
	img := func(n int) string {
		return fmt.Sprintf(`{"kind":"photo","url":"https://files.example/p%d.jpg","mime_type":"image/jpeg","size":%d}`, n, 1000+n)
	}
	key, _ := f.post(`{` + chat + `,"message_id":"m1","text":"first look","attachments":[` + img(1) + `],
		"reply_to":{"message_id":"q1","text":"the old chart","sender_name":"Fleet"}}`)
	f.post(`{` + chat + `,"message_id":"m2","attachments":[` + img(2) + `,` + img(3) + `],
		"reply_to":{"message_id":"q2","text":"the newer chart","sender_id":"bot","sender_name":"Fleet"}}`)
	f.post(`{` + chat + `,"message_id":"m3","text":"which is sharper?"}`)
	f.post(`{` + chat + `,"message_id":"m4","attachments":[{"kind":"voice","url":"https://files.example/v.ogg","mime_type":"audio/ogg"}]}`)
	f.post(`{` + chat + `,"message_id":"m5","text":"watch","attachments":[{"kind":"video","url":"https://files.example/v.mp4"}]}`)
	f.post(`{` + chat + `,"message_id":"m6","attachments":[{"kind":"document","url":"https://files.example/r.pdf","name":"r.pdf"}]}`)
	f.post(`{` + chat + `,"message_id":"m7","text":"and this","attachments":[` + img(4) + `]}`)
	f.post(`{` + chat + `,"message_id":"m8","attachments":[{"kind":"sticker","url":"https://files.example/s.webp","mime_type":"image/webp"}]}`)
	f.startFn()

	reps := f.replies(key, 5)
	turns := f.rec.of(key)
	var got []string
	for _, tr := range turns {
		got = append(got, summary(tr))
	}
	want := []string{
		`m1"first look"[photo] m2""[photo photo] m3"which is sharper?"[]`,
		`m4""[voice]`,
		`m5"watch"[video]`,
		`m6""[document]`,
		`m7"and this"[photo] m8""[sticker]`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("turns:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	burst := turns[0]
	var urls []string
	for _, m := range burst.Messages {
		for _, a := range m.Attachments {
			urls = append(urls, a.URL)
		}
	}
	if strings.Join(urls, " ") != "https://files.example/p1.jpg https://files.example/p2.jpg https://files.example/p3.jpg" {
		t.Errorf("burst images %v", urls)
	}
	if q := burst.Quote; q == nil || q.MessageID != "q2" || q.Text != "the newer chart" || q.SenderID != "bot" {
		t.Errorf("burst quote %+v, want the latest (q2)", q)
	}
	if burst.Source.MessageID != "m3" {
		t.Errorf("burst anchor %q, want the newest message m3", burst.Source.MessageID)
	}
	// The history keeps the media for later turns.
	last := turns[len(turns)-1]
	var histAtts int
	for _, m := range last.History {
		histAtts += len(m.Attachments)
	}
	if histAtts != 8 {
		t.Errorf("the last turn's history holds %d attachments, want 8", histAtts)
	}
	var anchors []string
	for _, r := range reps {
		anchors = append(anchors, r.ReplyTo)
	}
	if strings.Join(anchors, " ") != "m3 m4 m5 m6 m8" {
		t.Errorf("replies anchored on %v, want m3 m4 m5 m6 m8", anchors)
	}
}

// TestMediaQueueDepthAndNew: own-turn media waiting behind are counted in
// the queue depth (photos merge with the next plain turn and are not), and
// a /new behind them discards them, recorded, before the agent sees them.
func TestMediaQueueDepthAndNew(t *testing.T) {
	t.Parallel()
	f := newMediaFleet(t)
	const chat = `"chat_id":"depth","user_id":"ada"`
	key, _ := f.post(`{` + chat + `,"message_id":"d1","text":"hello"}`)
	f.post(`{` + chat + `,"message_id":"d2","text":"/status"}`)
	f.post(`{` + chat + `,"message_id":"d3","attachments":[{"kind":"voice","url":"https://files.example/v1.ogg"}]}`)
	f.post(`{` + chat + `,"message_id":"d4","text":"the report","attachments":[{"kind":"document","url":"https://files.example/r.pdf"}]}`)
	f.post(`{` + chat + `,"message_id":"d5","attachments":[{"kind":"audio","url":"https://files.example/a.mp3"}]}`)
	_, newSeq := f.post(`{` + chat + `,"message_id":"d6","text":"/new"}`)
	f.post(`{` + chat + `,"message_id":"d7","text":"fresh start","attachments":[{"kind":"photo","url":"https://files.example/p.jpg"}]}`)
	f.startFn()

	reps := f.replies(key, 4) // hello, /status, the /new notice, fresh start
	var status string
	for _, r := range reps {
		if strings.Contains(r.Text, "Queue depth") {
			status = r.Text
		}
	}
	if !strings.Contains(status, "Queue depth: 3") {
		t.Errorf("/status said %q, want a queue depth of 3 (voice, document, audio)", status)
	}
	natstest.WaitFor(t, mediaWait, "the lane to commit past /new", func() error {
		e := f.entry(key)
		if seq, _ := e["committed_seq"].(float64); uint64(seq) <= newSeq || e["turn"] != nil {
			return fmt.Errorf("entry %v", e)
		}
		return nil
	})
	var notice string
	for _, r := range f.replies(key, 4) {
		if strings.Contains(r.Text, "Discarded") {
			notice = r.Text
		}
	}
	if !strings.Contains(notice, "Discarded 3 queued message(s)") {
		t.Errorf("the /new notice %q does not count the 3 discarded media items", notice)
	}
	turns := f.rec.of(key)
	var got []string
	for _, tr := range turns {
		got = append(got, summary(tr))
	}
	if strings.Join(got, "\n") != "d1\"hello\"[]\nd7\"fresh start\"[photo]" {
		t.Errorf("the agent ran:\n%s\nwant only hello and the message after /new", strings.Join(got, "\n"))
	}
	if len(turns) != 2 || turns[0].SessionID == turns[1].SessionID {
		t.Fatal("/new did not start a new session")
	}
	// Recorded: the old session's transcript names each discarded item by
	// its media; the new one keeps the photo's attachment.
	entries, _, err := f.tx.Load(t.Context(), turns[0].SessionID)
	if err != nil {
		t.Fatal(err)
	}
	var notes []string
	for _, e := range entries {
		if strings.HasPrefix(e.Content, "Discarded queued message") {
			notes = append(notes, e.Content)
		}
	}
	if strings.Join(notes, "|") != "Discarded queued message: [voice]|Discarded queued message: the report [document]|Discarded queued message: [audio]" {
		t.Errorf("discard notes %q", notes)
	}
	entries, _, err = f.tx.Load(t.Context(), turns[1].SessionID)
	if err != nil {
		t.Fatal(err)
	}
	var photos int
	for _, e := range entries {
		if e.Role == "user" && len(e.Attachments) == 1 && e.Attachments[0].URL == "https://files.example/p.jpg" {
			photos++
		}
	}
	if photos != 1 {
		t.Errorf("the new session's transcript has %d user entries with the photo, want 1", photos)
	}
}

// TestMediaAlbumInQueueMode: in busy mode queue each plain message is its
// own turn, but the photos of one album (media group) still make one.
func TestMediaAlbumInQueueMode(t *testing.T) {
	t.Parallel()
	f := newMediaFleet(t)
	const chat = `"chat_id":"album","user_id":"ada"`
	photo := func(id, group string) string {
		return `{` + chat + `,"message_id":"` + id + `","media_group":"` + group + `","attachments":[{"kind":"photo","url":"https://files.example/` + id + `.jpg"}]}`
	}
	key, _ := f.post(`{` + chat + `,"message_id":"a0","text":"/busy queue"}`)
	f.post(photo("a1", "g1"))
	f.post(photo("a2", "g1"))
	f.post(photo("a3", "g1"))
	f.post(`{` + chat + `,"message_id":"a4","text":"nice?"}`)
	f.post(photo("a5", "g2"))
	f.post(`{` + chat + `,"message_id":"a6","text":"bye"}`)
	f.startFn()
	f.replies(key, 5)
	var got []string
	for _, tr := range f.rec.of(key) {
		got = append(got, summary(tr))
	}
	want := []string{`a1""[photo] a2""[photo] a3""[photo]`, `a4"nice?"[]`, `a5""[photo]`, `a6"bye"[]`}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("turns:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
