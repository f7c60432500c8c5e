package ingress_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

const waitTimeout = 10 * time.Second

type testBundle struct {
	ns     *natstest.Server
	nc     *nats.Conn
	js     jetstream.JetStream
	res    *broker.Resources
	names  broker.Names
	server *ingress.Server
	http   *httptest.Server
	client *http.Client
	token  string
}

type setupOpts struct {
	token    string
	maxBody  int64
	delivery bool
	// heartbeat of event streams; 0 keeps the default.
	heartbeat time.Duration
	// logs records the logs; nil makes a fresh one.
	logs *logRecorder
	// maxReaders is Config.MaxReadersPerClient; 0 keeps the default.
	maxReaders int
	// serverOpts changes the NATS server's options.
	serverOpts func(*server.Options)
	// scoped is Config.ScopedTokens.
	scoped []ingress.ScopedToken
	// duplicates is the inbox stream's Msg-Id window; 0 keeps the default.
	duplicates time.Duration
}

func setup(t *testing.T, o setupOpts) *testBundle {
	t.Helper()
	if o.logs == nil {
		o.logs = &logRecorder{}
	}
	var nopts []natstest.Option
	if o.serverOpts != nil {
		nopts = append(nopts, natstest.WithServerOptions(o.serverOpts))
	}
	ns := natstest.RunServer(t, nopts...)
	nc := ns.Connect(t)
	js := natstest.JetStream(t, nc)
	names := broker.MustNames("fleet")
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	res, err := broker.Provision(ctx, js, broker.ProvisionConfig{Names: names, Duplicates: o.duplicates})
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	srv, err := ingress.New(js, res, ingress.Config{
		Names:           names,
		KeyOptions:      session.DefaultKeyOptions(),
		Token:           o.token,
		ScopedTokens:    o.scoped,
		MaxBodyBytes:    o.maxBody,
		EventsHeartbeat: o.heartbeat,
		Logger:          o.logs.logger(t),

		MaxReadersPerClient: o.maxReaders,
	})
	if err != nil {
		t.Fatalf("ingress.New: %v", err)
	}
	if o.delivery {
		d := ingress.NewDelivery(js, res, names, o.logs.logger(t))
		if err := d.Start(context.Background()); err != nil {
			t.Fatalf("delivery start: %v", err)
		}
		t.Cleanup(d.Stop)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	t.Cleanup(srv.Close) // runs first: ends event streams so hs.Close does not wait
	return &testBundle{ns: ns, nc: nc, js: js, res: res, names: names, server: srv, http: hs, client: hs.Client(), token: o.token}
}

// response is a decoded JSON answer.
type response struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func (b *testBundle) do(t *testing.T, method, path, body string, hdr map[string]string) response {
	t.Helper()
	req, err := http.NewRequest(method, b.http.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if b.token != "" {
		req.Header.Set("Authorization", "Bearer "+b.token)
	}
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := b.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	r := response{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s %s: content type %q, body %s", method, path, ct, raw)
	}
	if err := json.Unmarshal(raw, &r.body); err != nil {
		t.Fatalf("%s %s: body %q is not a JSON object: %v", method, path, raw, err)
	}
	return r
}

func (b *testBundle) post(t *testing.T, body string) response {
	t.Helper()
	return b.do(t, http.MethodPost, "/v1/messages", body, nil)
}

func (b *testBundle) inboxCount(t *testing.T) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	info, err := b.res.Inbox.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func (b *testBundle) inboxMsg(t *testing.T, seq uint64) *jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	m, err := b.res.Inbox.GetMsg(ctx, seq)
	if err != nil {
		t.Fatalf("inbox seq %d: %v", seq, err)
	}
	return m
}

func wantStatus(t *testing.T, r response, status int) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.raw)
	}
}

func wantError(t *testing.T, r response, status int, contains string) {
	t.Helper()
	wantStatus(t, r, status)
	msg, ok := r.body["error"].(string)
	if !ok || msg == "" || len(r.body) != 1 {
		t.Fatalf(`body %s is not {"error": "..."}`, r.raw)
	}
	if !strings.Contains(msg, contains) {
		t.Fatalf("error %q does not mention %q", msg, contains)
	}
}

func seqOf(t *testing.T, r response) uint64 {
	t.Helper()
	f, ok := r.body["seq"].(float64)
	if !ok {
		t.Fatalf("no seq in %s", r.raw)
	}
	return uint64(f)
}

func TestPostMessageAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	r := b.post(t, `{"chat_id":"-100123","chat_type":"group","user_id":"u42","user_name":"Alice",
		"chat_name":"Team","message_id":"m1","text":"hello fleet"}`)
	wantStatus(t, r, http.StatusAccepted)

	src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: "-100123", ChatType: "group", UserID: "u42"}
	wantKey := session.BuildSessionKey(src, session.DefaultKeyOptions())
	if wantKey != "agent:main:http:group:-100123:u42" {
		t.Fatalf("unexpected key derivation %q", wantKey)
	}
	if r.body["session_key"] != wantKey || r.body["duplicate"] != false || seqOf(t, r) != 1 {
		t.Fatalf("answer %s", r.raw)
	}

	m := b.inboxMsg(t, 1)
	lane := session.LaneToken(wantKey)
	if want := b.names.InboxSubject(session.Partition("fleet", lane), lane); m.Subject != want {
		t.Fatalf("subject %q, want %q", m.Subject, want)
	}
	for hdr, want := range map[string]string{
		broker.HdrSessionKey:    wantKey,
		broker.HdrKind:          broker.KindMessage,
		broker.HdrPlatformMsgID: "http:-100123:m1",
		broker.HdrMsgID:         "http:-100123:m1",
	} {
		if got := m.Header.Get(hdr); got != want {
			t.Errorf("header %s = %q, want %q", hdr, got, want)
		}
	}
	var in session.Inbound
	if err := json.Unmarshal(m.Data, &in); err != nil {
		t.Fatal(err)
	}
	if in.SessionKey != wantKey || in.Kind != session.KindMessage || in.Text != "hello fleet" ||
		in.PlatformMsgID != "http:-100123:m1" || in.ReceivedAt.IsZero() {
		t.Fatalf("inbound %+v", in)
	}
	if in.Source.Platform != session.PlatformHTTP || in.Source.ChatID != "-100123" || in.Source.UserID != "u42" ||
		in.Source.UserName != "Alice" || in.Source.ChatName != "Team" || in.Source.MessageID != "m1" {
		t.Fatalf("source %+v", in.Source)
	}

	// The id is recorded by the worker that incorporates the message (its
	// claim), not by the ingress: the answer waited for no second write.
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if e, err := b.res.MsgIDs.Get(ctx, session.LaneToken("http:-100123:m1")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the ingress wrote a msgids record: %v %v", e, err)
	}
}

func TestPostMessageKinds(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for i, tc := range []struct {
		text, kind, command, args, stored string
	}{
		{"just text", session.KindMessage, "", "", "just text"},
		{"/queue do this later", session.KindQueue, "queue", "do this later", "do this later"},
		{"/busy queue", session.KindCommand, "busy", "queue", "/busy queue"},
		{"/new", session.KindCommand, "new", "", "/new"},
		{"/unknown thing", session.KindMessage, "", "", "/unknown thing"},
	} {
		body, _ := json.Marshal(map[string]string{"chat_id": "c1", "text": tc.text})
		r := b.post(t, string(body))
		wantStatus(t, r, http.StatusAccepted)
		if r.body["session_key"] != "agent:main:http:dm:c1" {
			t.Fatalf("key %v", r.body["session_key"])
		}
		m := b.inboxMsg(t, uint64(i+1))
		if got := m.Header.Get(broker.HdrKind); got != tc.kind {
			t.Errorf("%q: kind header %q, want %q", tc.text, got, tc.kind)
		}
		if m.Header.Get(broker.HdrPlatformMsgID) != "" {
			t.Errorf("%q: platform msg id header without a message_id", tc.text)
		}
		if id := m.Header.Get(broker.HdrMsgID); !strings.HasPrefix(id, "rand:") {
			t.Errorf("%q: Nats-Msg-Id %q is not random", tc.text, id)
		}
		var in session.Inbound
		if err := json.Unmarshal(m.Data, &in); err != nil {
			t.Fatal(err)
		}
		if in.Kind != tc.kind || in.Command != tc.command || in.Args != tc.args || in.Text != tc.stored {
			t.Errorf("%q: inbound kind=%q command=%q args=%q text=%q", tc.text, in.Kind, in.Command, in.Args, in.Text)
		}
	}
}

func TestPostMessageDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const body = `{"chat_id":"c1","message_id":"m1","text":"hi"}`

	first := b.post(t, body)
	wantStatus(t, first, http.StatusAccepted)
	second := b.post(t, body)
	wantStatus(t, second, http.StatusAccepted)
	if second.body["duplicate"] != true || seqOf(t, second) != seqOf(t, first) {
		t.Fatalf("second answer %s, first %s", second.raw, first.raw)
	}
	// Other platforms or chats with the same message id are other messages.
	third := b.post(t, `{"chat_id":"c2","message_id":"m1","text":"hi"}`)
	wantStatus(t, third, http.StatusAccepted)
	if third.body["duplicate"] != false {
		t.Fatalf("other chat treated as a duplicate: %s", third.raw)
	}
	if n := b.inboxCount(t); n != 2 {
		t.Fatalf("inbox holds %d messages, want 2", n)
	}
	// A retry that reuses the id with another thread derives another key,
	// but is the same message: the answer names the lane that holds it.
	fourth := b.post(t, `{"chat_id":"c1","thread_id":"t9","message_id":"m1","text":"hi"}`)
	wantStatus(t, fourth, http.StatusAccepted)
	if fourth.body["duplicate"] != true || fourth.body["session_key"] != first.body["session_key"] {
		t.Fatalf("retry with another thread: %s, want the first message's lane %v", fourth.raw, first.body["session_key"])
	}
}

// A retry days later, beyond the stream's de-duplication window, is caught
// by the msgids bucket: simulate an id accepted long ago (its Msg-Id has
// left the window) and retry it. The record is read while the retry is
// published, so the retry leaves a second copy in the inbox, which the
// worker's msgids claim skips (TestLateRetryRunsOnce, worker: TestDuplicateCopiesNotRunTwice).
func TestPostMessageDuplicateBeyondStreamWindow(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := b.res.MsgIDs.Put(ctx, session.LaneToken("http:c1:old-1"), []byte("42")); err != nil {
		t.Fatal(err)
	}
	r := b.post(t, `{"chat_id":"c1","message_id":"old-1","text":"hi again"}`)
	wantStatus(t, r, http.StatusAccepted)
	if r.body["duplicate"] != true || seqOf(t, r) != 42 {
		t.Fatalf("answer %s", r.raw)
	}
	if n := b.inboxCount(t); n != 1 {
		t.Fatalf("inbox holds %d, want the retry's copy", n)
	}
	if got := b.inboxMsg(t, 1).Header.Get(broker.HdrPlatformMsgID); got != "http:c1:old-1" {
		t.Fatalf("the copy carries platform message id %q", got)
	}
}

// A retry inside the stream's window, of a message the worker has not
// incorporated yet (no msgids record): the stream reports the duplicate and
// the answer names the original's seq.
func TestPostMessageDuplicateInStreamWindow(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	lane := session.LaneToken("agent:main:http:dm:c1")
	subj := b.names.InboxSubject(session.Partition("fleet", lane), lane)
	ack, err := b.js.Publish(ctx, subj, []byte(`{}`), jetstream.WithMsgID("http:c1:m7"))
	if err != nil {
		t.Fatal(err)
	}
	r := b.post(t, `{"chat_id":"c1","message_id":"m7","text":"hi"}`)
	wantStatus(t, r, http.StatusAccepted)
	if r.body["duplicate"] != true || seqOf(t, r) != ack.Sequence {
		t.Fatalf("answer %s, stored seq %d", r.raw, ack.Sequence)
	}
	if n := b.inboxCount(t); n != 1 {
		t.Fatalf("inbox holds %d, want 1", n)
	}
}

// The msgids record is read while the message is published, so it may
// already name this very publish (the worker incorporated the message
// first): that is not an earlier delivery. Simulated by a record of the
// seq the publish is about to get.
func TestPostMessageRecordOfItsOwnPublish(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := b.res.MsgIDs.Put(ctx, session.LaneToken("http:c1:own-1"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	r := b.post(t, `{"chat_id":"c1","message_id":"own-1","text":"hi"}`)
	wantStatus(t, r, http.StatusAccepted)
	if r.body["duplicate"] != false || seqOf(t, r) != 1 {
		t.Fatalf("answer %s, want seq 1, not a duplicate", r.raw)
	}
}

// A record of the same seq in another inbox stream (written before a
// migration moved the partition, or before the stream was recreated) is not
// this publish's: the message is a duplicate of it. A record naming this
// publish's stream is its own.
func TestPostMessageRecordOfAnotherStream(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := b.res.MsgIDs.Put(ctx, session.LaneToken("http:c1:other-1"), []byte("1 other-id")); err != nil {
		t.Fatal(err)
	}
	r := b.post(t, `{"chat_id":"c1","message_id":"other-1","text":"hi"}`)
	wantStatus(t, r, http.StatusAccepted)
	if r.body["duplicate"] != true || seqOf(t, r) != 1 {
		t.Fatalf("answer %s, want a duplicate of seq 1 (of the other stream)", r.raw)
	}

	if _, err := b.res.MsgIDs.Put(ctx, session.LaneToken("http:c1:own-2"), []byte("2 "+b.res.InboxID)); err != nil {
		t.Fatal(err)
	}
	r = b.post(t, `{"chat_id":"c1","message_id":"own-2","text":"hi"}`)
	wantStatus(t, r, http.StatusAccepted)
	if r.body["duplicate"] != false || seqOf(t, r) != 2 {
		t.Fatalf("answer %s, want seq 2, not a duplicate", r.raw)
	}
}

// A duplicate is answered with the session key of the message its record
// names only when that message carries the same platform message id and
// lies in the stream the record names: after a migration or a recreated
// stream the seq may hold another chat's message, whose key must not be
// told. Otherwise the answer has the request's own key.
func TestPostMessageDuplicateKeyOfAnotherMessage(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	first := b.post(t, `{"chat_id":"c1","message_id":"m1","text":"hi"}`)
	wantStatus(t, first, http.StatusAccepted)
	if seqOf(t, first) != 1 || first.body["session_key"] != "agent:main:http:dm:c1" {
		t.Fatalf("first answer %s", first.raw)
	}
	threaded := b.post(t, `{"chat_id":"c1","thread_id":"t9","text":"hi"}`)
	wantStatus(t, threaded, http.StatusAccepted)
	threadKey, _ := threaded.body["session_key"].(string)
	if threadKey == "" || threadKey == first.body["session_key"] {
		t.Fatalf("threaded answer %s", threaded.raw)
	}

	// A record of chat c2's message that names seq 1 of this stream, which
	// holds chat c1's message.
	if _, err := b.res.MsgIDs.Put(ctx, session.LaneToken("http:c2:m1"), []byte("1 "+b.res.InboxID)); err != nil {
		t.Fatal(err)
	}
	r := b.post(t, `{"chat_id":"c2","message_id":"m1","text":"hi"}`)
	wantStatus(t, r, http.StatusAccepted)
	if r.body["duplicate"] != true || seqOf(t, r) != 1 || r.body["session_key"] != "agent:main:http:dm:c2" {
		t.Fatalf("answer %s, want a duplicate of seq 1 with its own key agent:main:http:dm:c2", r.raw)
	}

	// A record of chat c1's message that names seq 1 of another stream:
	// this stream's seq 1, although it carries the same id, is not the
	// message the record names.
	if _, err := b.res.MsgIDs.Put(ctx, session.LaneToken("http:c1:m1"), []byte("1 other-id")); err != nil {
		t.Fatal(err)
	}
	r = b.post(t, `{"chat_id":"c1","thread_id":"t9","message_id":"m1","text":"hi"}`)
	wantStatus(t, r, http.StatusAccepted)
	if r.body["duplicate"] != true || seqOf(t, r) != 1 || r.body["session_key"] != threadKey {
		t.Fatalf("answer %s, want a duplicate of seq 1 with its own key %s", r.raw, threadKey)
	}
}

// An unreadable msgids record does not block the message: it is published
// and the record is replaced.
func TestPostMessageCorruptMsgIDRecord(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	k := session.LaneToken("http:c1:m9")
	if _, err := b.res.MsgIDs.Put(ctx, k, []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	r := b.post(t, `{"chat_id":"c1","message_id":"m9","text":"hi"}`)
	wantStatus(t, r, http.StatusAccepted)
	if r.body["duplicate"] != false || seqOf(t, r) != 1 {
		t.Fatalf("answer %s", r.raw)
	}
	if e, err := b.res.MsgIDs.Get(ctx, k); err != nil || string(e.Value()) != "1 "+b.res.InboxID {
		t.Fatalf("record not replaced by the seq and stream of the message: %v %v", e, err)
	}
	r = b.post(t, `{"chat_id":"c1","message_id":"m9","text":"hi"}`)
	if r.body["duplicate"] != true || seqOf(t, r) != 1 {
		t.Fatalf("retry %s", r.raw)
	}
}

func TestPostMessageRejected(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{maxBody: 4096})
	for _, tc := range []struct {
		name     string
		method   string
		body     string
		status   int
		contains string
	}{
		{"malformed JSON", "", `{"chat_id": "c1", "text": `, 400, "malformed JSON"},
		{"syntax error", "", `{"chat_id" "c1"}`, 400, "malformed JSON"},
		{"empty body", "", ``, 400, "empty"},
		{"not an object", "", `["c1", "hi"]`, 400, "JSON object"},
		{"two objects", "", `{"chat_id":"c1","text":"a"} {"chat_id":"c1","text":"b"}`, 400, "exactly one JSON object"},
		{"unknown field", "", `{"chat_id":"c1","text":"hi","mood":"happy"}`, 400, `unknown field "mood"`},
		{"wrong type", "", `{"chat_id":123,"text":"hi"}`, 400, "chat_id"},
		{"missing text", "", `{"chat_id":"c1"}`, 400, "text is required"},
		{"blank text", "", `{"chat_id":"c1","text":" \n\t "}`, 400, "text is required"},
		{"missing chat_id", "", `{"text":"hi"}`, 400, "chat_id is required"},
		{"blank chat_id", "", `{"chat_id":"  ","text":"hi"}`, 400, "chat_id is required"},
		{"unknown platform", "", `{"platform":"myspace","chat_id":"c1","text":"hi"}`, 400, `unknown platform "myspace"`},
		{"another adapter's platform", "", `{"platform":"telegram","chat_id":"-100123","message_id":"7","text":"hi"}`, 400, `platform "telegram"`},
		{"queue without text", "", `{"chat_id":"c1","text":"/queue"}`, 400, "/queue needs the text"},
		{"q without text", "", `{"chat_id":"c1","text":"  /q   "}`, 400, "/queue needs the text"},
		{"bad chat type", "", `{"chat_id":"c1","chat_type":"room","text":"hi"}`, 400, `"room"`},
		{"bad chat type with a message id", "", `{"chat_id":"c1","chat_type":"room","message_id":"m7","text":"hi"}`, 400, `"room"`},
		{"queue without text, with a message id", "", `{"chat_id":"c1","message_id":"m8","text":"/queue "}`, 400, "/queue needs the text"},
		{"path traversal in chat_id", "", `{"chat_id":"../../etc/passwd","text":"hi"}`, 400, "chat_id"},
		{"separator in user_id", "", `{"chat_id":"c1","user_id":"a/b","text":"hi"}`, 400, "user_id"},
		{"control char in message_id", "", `{"chat_id":"c1","message_id":"m\u0000","text":"hi"}`, 400, "message_id"},
		{"body too big", "", `{"chat_id":"c1","text":"` + strings.Repeat("x", 5000) + `"}`, 413, "larger than 4096 bytes"},
		{"wrong method", http.MethodGet, ``, 405, "method GET is not allowed"},
		{"wrong method put", http.MethodPut, `{"chat_id":"c1","text":"hi"}`, 405, "not allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			r := b.do(t, method, "/v1/messages", tc.body, nil)
			wantError(t, r, tc.status, tc.contains)
			if tc.status == 405 && r.header.Get("Allow") != "POST" {
				t.Errorf("Allow %q", r.header.Get("Allow"))
			}
		})
	}
	// A body too big without a Content-Length (chunked) is cut while read.
	pr, pw := io.Pipe()
	go func() {
		_, _ = io.WriteString(pw, `{"chat_id":"c1","text":"`+strings.Repeat("y", 8000)+`"}`)
		_ = pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPost, b.http.URL+"/v1/messages", pr)
	resp, err := b.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(raw), `"error"`) {
		t.Fatalf("chunked big body: %d %s", resp.StatusCode, raw)
	}

	if n := b.inboxCount(t); n != 0 {
		t.Fatalf("rejected requests published %d messages", n)
	}
	// Nor did they claim a message id: the same ids are accepted afterwards.
	if keys, err := b.res.MsgIDs.ListKeys(t.Context()); err == nil {
		for k := range keys.Keys() {
			t.Errorf("a rejected request left the msgids record %s", k)
		}
	}
	for _, id := range []string{"m7", "m8"} {
		r := b.post(t, `{"chat_id":"c1","message_id":"`+id+`","text":"hi"}`)
		if wantStatus(t, r, http.StatusAccepted); r.body["duplicate"] != false {
			t.Fatalf("message id %s after its rejection: %s", id, r.raw)
		}
	}
}

// TestPostMessageTooLargeForServer: a body within the adapter's limit whose
// inbox message (envelope and headers included) the server would not take
// is refused with 413, not a 503 that invites retrying for ever, and
// nothing is published. HTML characters count as the transcript will store
// them (six bytes each).
func TestPostMessageTooLargeForServer(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{maxBody: 4 << 20})
	limit := b.nc.MaxPayload()
	text := strings.Repeat("x", int(limit)-100)
	body, _ := json.Marshal(map[string]string{"chat_id": "c1", "message_id": "big", "text": text})
	wantError(t, b.post(t, string(body)), http.StatusRequestEntityTooLarge, "too large for the inbox")
	if n := b.inboxCount(t); n != 0 {
		t.Fatalf("a refused message was published (%d in the inbox)", n)
	}
	if _, err := b.res.MsgIDs.Get(t.Context(), session.LaneToken("http:c1:big")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("a refused message left a msgids record: %v", err)
	}

	// Angle brackets and ampersands count six bytes each, as the
	// transcript will store them: a text of them a third of the limit long
	// is refused, one a seventh long is accepted and stored verbatim.
	big3 := strings.Repeat("<&>", int(limit)/9)
	wantError(t, b.post(t, `{"chat_id":"c1","text":"`+big3+`"}`), http.StatusRequestEntityTooLarge, "too large for the inbox")
	text = strings.Repeat("<&>", int(limit)/21)
	wantStatus(t, b.post(t, `{"chat_id":"c1","text":"`+text+`"}`), http.StatusAccepted)
	var in session.Inbound
	if err := json.Unmarshal(b.inboxMsg(t, 1).Data, &in); err != nil || in.Text != text {
		t.Fatalf("stored text differs (%v)", err)
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{token: "s3cret"})
	const body = `{"chat_id":"c1","text":"hi"}`

	r := b.do(t, http.MethodPost, "/v1/messages", body, map[string]string{"Authorization": ""})
	wantError(t, r, http.StatusUnauthorized, "missing bearer token")
	if h := r.header.Get("WWW-Authenticate"); !strings.HasPrefix(h, "Bearer") {
		t.Fatalf("WWW-Authenticate %q", h)
	}
	r = b.do(t, http.MethodPost, "/v1/messages", body, map[string]string{"Authorization": "Bearer nope"})
	wantError(t, r, http.StatusUnauthorized, "invalid bearer token")
	if h := r.header.Get("WWW-Authenticate"); !strings.Contains(h, `error="invalid_token"`) {
		t.Fatalf("WWW-Authenticate %q", h)
	}
	r = b.do(t, http.MethodPost, "/v1/messages", body, map[string]string{"Authorization": "Basic czNjcmV0"})
	wantError(t, r, http.StatusUnauthorized, "missing bearer token")
	r = b.do(t, http.MethodGet, "/v1/sessions/agent:main:http:dm:c1", "", map[string]string{"Authorization": ""})
	wantError(t, r, http.StatusUnauthorized, "bearer token")
	if n := b.inboxCount(t); n != 0 {
		t.Fatalf("unauthorized requests published %d messages", n)
	}

	wantStatus(t, b.post(t, body), http.StatusAccepted)
	wantStatus(t, b.do(t, http.MethodPost, "/v1/messages", body, map[string]string{"Authorization": "bearer s3cret"}), http.StatusAccepted)
	// Probes need no token.
	wantStatus(t, b.do(t, http.MethodGet, "/healthz", "", map[string]string{"Authorization": ""}), http.StatusOK)

	// A token configured with a trailing newline (a file, a YAML block) is
	// the token without it.
	nl := setup(t, setupOpts{token: "s3cret\n"})
	wantStatus(t, nl.do(t, http.MethodPost, "/v1/messages", body, map[string]string{"Authorization": "Bearer s3cret"}), http.StatusAccepted)
}

func TestGetSession(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const key = "agent:main:http:group:g1:u1"

	wantError(t, b.do(t, http.MethodGet, "/v1/sessions/"+key, "", nil), http.StatusNotFound, "no session")
	for _, bad := range []string{"nonsense", "agent:main:http:dm:..", "agent:main:myspace:dm:c1", "agent:main:http:room:c1",
		url.PathEscape("agent:main:http:dm:a/b")} {
		wantError(t, b.do(t, http.MethodGet, "/v1/sessions/"+bad, "", nil), http.StatusBadRequest, "invalid session key")
	}
	wantError(t, b.do(t, http.MethodDelete, "/v1/sessions/"+key, "", nil), http.StatusMethodNotAllowed, "not allowed")

	entry := session.SessionEntry{
		SessionKey:   key,
		SessionID:    "20250101_120000_abcdef01",
		CreatedAt:    time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC),
		UpdatedAt:    time.Date(2025, 1, 1, 12, 5, 0, 0, time.UTC),
		Platform:     session.PlatformHTTP,
		ChatType:     "group",
		TotalTokens:  99,
		CommittedSeq: 7,
	}
	data, _ := json.Marshal(entry)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := b.res.Sessions.Put(ctx, session.LaneToken(key), data); err != nil {
		t.Fatal(err)
	}
	r := b.do(t, http.MethodGet, "/v1/sessions/"+key, "", nil)
	wantStatus(t, r, http.StatusOK)
	var got session.SessionEntry
	if err := json.Unmarshal([]byte(r.raw), &got); err != nil {
		t.Fatal(err)
	}
	if got.SessionKey != key || got.SessionID != entry.SessionID || got.TotalTokens != 99 || got.CommittedSeq != 7 ||
		!got.UpdatedAt.Equal(entry.UpdatedAt) {
		t.Fatalf("entry %+v", got)
	}
}

func TestHealthAndReadiness(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	r := b.do(t, http.MethodGet, "/healthz", "", nil)
	wantStatus(t, r, http.StatusOK)
	if r.body["status"] != "ok" {
		t.Fatalf("healthz %s", r.raw)
	}
	wantStatus(t, b.do(t, http.MethodGet, "/readyz", "", nil), http.StatusOK)

	b.server.SetReady(func() error { return errors.New("draining") })
	wantError(t, b.do(t, http.MethodGet, "/readyz", "", nil), http.StatusServiceUnavailable, "draining")
	b.server.SetReady(func() error { return nil })
	wantStatus(t, b.do(t, http.MethodGet, "/readyz", "", nil), http.StatusOK)

	wantError(t, b.do(t, http.MethodGet, "/nowhere", "", nil), http.StatusNotFound, "no route")
	wantError(t, b.do(t, http.MethodPost, "/healthz", "", nil), http.StatusMethodNotAllowed, "not allowed")

	b.nc.Close()
	wantError(t, b.do(t, http.MethodGet, "/readyz", "", nil), http.StatusServiceUnavailable, "nats connection is closed")
	// With NATS gone, a message is not accepted: 503, so the client retries.
	r = b.post(t, `{"chat_id":"c1","text":"hi"}`)
	wantError(t, r, http.StatusServiceUnavailable, "retry")
	if r.header.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	ns := natstest.RunServer(t)
	js := natstest.JetStream(t, ns.Connect(t))
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	res, err := broker.Provision(ctx, js, broker.ProvisionConfig{Names: broker.MustNames("fleet")})
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		res *broker.Resources
		cfg ingress.Config
	}{
		"nil resources":  {nil, ingress.Config{}},
		"other prefix":   {res, ingress.Config{Names: broker.MustNames("other")}},
		"negative body":  {res, ingress.Config{MaxBodyBytes: -1}},
		"negative delay": {res, ingress.Config{PublishTimeout: -time.Second}},
		"blank token":    {res, ingress.Config{Token: " \n"}},
	} {
		if _, err := ingress.New(js, tc.res, tc.cfg); !errors.Is(err, ingress.ErrInvalidConfig) {
			t.Errorf("%s: err %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := ingress.New(js, res, ingress.Config{}); err != nil {
		t.Fatalf("defaults: %v", err)
	}
}

// waitFor is natstest.WaitFor with this package's timeout.
func waitFor(t *testing.T, what string, cond func() error) {
	t.Helper()
	natstest.WaitFor(t, waitTimeout, what, cond)
}

// An inbox stream deleted and made again while the ingress runs (a new
// identity, seqs from 1): the record the ingress writes for a message names
// the new stream, not the one it read at start. A record naming the old one
// would make the worker's msgids claim take the message for a duplicate of
// the old stream's message at the same seq, and never run it.
func TestPostMessageCorruptMsgIDRecordAfterInboxRecreated(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	// The ingress has read the stream's identity.
	wantStatus(t, b.post(t, `{"chat_id":"c1","message_id":"m1","text":"hi"}`), http.StatusAccepted)
	if err := b.js.DeleteStream(ctx, b.names.InboxStream()); err != nil {
		t.Fatal(err)
	}
	res, err := broker.Provision(ctx, natstest.JetStream(t, b.ns.Connect(t)), broker.ProvisionConfig{Names: b.names})
	if err != nil {
		t.Fatal(err)
	}
	if res.InboxID == b.res.InboxID {
		t.Fatalf("recreated stream kept its identity %s", res.InboxID)
	}
	k := session.LaneToken("http:c1:m9")
	if _, err := b.res.MsgIDs.Put(ctx, k, []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	r := b.post(t, `{"chat_id":"c1","message_id":"m9","text":"again"}`)
	wantStatus(t, r, http.StatusAccepted)
	if r.body["duplicate"] != false || seqOf(t, r) != 1 {
		t.Fatalf("answer %s", r.raw)
	}
	if e, err := b.res.MsgIDs.Get(ctx, k); err != nil || string(e.Value()) != "1 "+res.InboxID {
		t.Fatalf("record %q (%v), want the seq and the new stream's identity %s", e.Value(), err, res.InboxID)
	}
}
