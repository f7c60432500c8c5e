// Package slackfake is a local stand-in for the Slack Web API, for tests:
// chat.postMessage and chat.update (recording what was posted and updated,
// and answering with scripted
// failures as Slack does: 429 with Retry-After, 5xx, {"ok": false, "error"}),
// auth.test, and Socket Mode (apps.connections.open and the WebSocket, with
// hello, events_api envelopes, acknowledgements and redelivery of what a
// closed connection left unacknowledged), files.info and the download of
// url_private_download (bearer token required) for the files given to
// AddFile. It also signs Events API requests the way Slack does.
package slackfake

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"
)

// BotToken is the token the server accepts.
const BotToken = "xoxb-test-token"

// BotUserID is the app's bot user, as auth.test answers.
const BotUserID = "U0BOT00001"

// Posted is one chat.postMessage call.
type Posted struct {
	// TS is the message's ts (empty for a failed attempt); Text is the text
	// it was posted with, whatever updates followed.
	Channel, Text, ThreadTS, TS string
	At                          time.Time
}

// Update is one accepted chat.update call.
type Update struct {
	Channel, TS, Text string
	At                time.Time
}

// Failure is a scripted answer to the next chat.postMessage call.
type Failure struct {
	// Status is the HTTP status (429, 500...); 200 with Error set answers
	// {"ok": false, "error": Error}.
	Status int
	// RetryAfter is the Retry-After header in seconds (429).
	RetryAfter int
	Error      string
}

// Server is the fake Web API.
type Server struct {
	*httptest.Server

	mu       sync.Mutex
	posted   []Posted
	attempts []Posted
	failures []Failure
	ts       int
	updates  []Update
	updFail  []Failure
	texts    map[string]string // channel/ts -> current text

	// Files by id, and the files.info calls answered.
	files     map[string]fakeFile
	fileInfos int

	// Socket Mode.
	envelopes []*envelope
	sockets   []*socketConn
	conns     int
	acks      int
}

// New starts a server, closed when the test ends.
func New(t interface{ Cleanup(func()) }) *Server {
	s := &Server{texts: map[string]string{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

type fakeFile struct {
	name, mimetype string
	data           []byte
}

// AddFile makes a file known to files.info and downloadable.
func (s *Server) AddFile(id, name, mimetype string, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.files == nil {
		s.files = map[string]fakeFile{}
	}
	s.files[id] = fakeFile{name: name, mimetype: mimetype, data: data}
}

// FileInfos returns how many files.info calls were answered.
func (s *Server) FileInfos() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fileInfos
}

// APIBase is the URL to configure as platforms.slack.api_base.
func (s *Server) APIBase() string { return s.URL + "/api/" }

// FailNext scripts the answers to the next chat.postMessage calls.
func (s *Server) FailNext(f ...Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures = append(s.failures, f...)
}

// FailUpdateNext scripts the answers to the next chat.update calls.
func (s *Server) FailUpdateNext(f ...Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.updFail = append(s.updFail, f...)
}

// Updates returns the accepted chat.update calls, in order.
func (s *Server) Updates() []Update {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Update(nil), s.updates...)
}

// Text returns the current text of message ts in channel.
func (s *Server) Text(channel, ts string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.texts[channel+"/"+ts]
}

// Posted returns the messages posted so far.
func (s *Server) Posted() []Posted {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Posted(nil), s.posted...)
}

// Attempts returns every chat.postMessage call, failed ones included.
func (s *Server) Attempts() []Posted {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Posted(nil), s.attempts...)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/api/apps.connections.open":
		s.connectionsOpen(w, r)
		return
	case "/socket":
		s.socket(w, r)
		return
	}
	if err := r.ParseForm(); err != nil {
		reply(w, http.StatusOK, map[string]any{"ok": false, "error": "invalid_form_data"})
		return
	}
	token := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	if token == "" {
		token = r.Form.Get("token")
	}
	if token != BotToken {
		reply(w, http.StatusOK, map[string]any{"ok": false, "error": "invalid_auth"})
		return
	}
	if id, ok := strings.CutPrefix(r.URL.Path, "/files-pri/T061EG9R6-"); ok {
		s.download(w, strings.SplitN(id, "/", 2)[0])
		return
	}
	switch strings.TrimPrefix(r.URL.Path, "/api/") {
	case "files.info":
		s.fileInfo(w, r.Form.Get("file"))
	case "auth.test":
		reply(w, http.StatusOK, map[string]any{"ok": true, "url": "https://fleet.slack.com/", "team": "Fleet", "user": "fleet",
			"team_id": "T061EG9R6", "user_id": BotUserID, "bot_id": "B0BOT00001"})
	case "chat.postMessage":
		s.postMessage(w, r)
	case "chat.update":
		s.update(w, r)
	default:
		reply(w, http.StatusOK, map[string]any{"ok": false, "error": "unknown_method"})
	}
}

func (s *Server) postMessage(w http.ResponseWriter, r *http.Request) {
	p := Posted{Channel: r.Form.Get("channel"), Text: r.Form.Get("text"), ThreadTS: r.Form.Get("thread_ts"), At: time.Now()}
	s.mu.Lock()
	s.attempts = append(s.attempts, p)
	var f *Failure
	if len(s.failures) > 0 {
		f = &s.failures[0]
		s.failures = s.failures[1:]
	}
	switch {
	case p.Channel == "":
		s.mu.Unlock()
		reply(w, http.StatusOK, map[string]any{"ok": false, "error": "channel_not_found"})
		return
	case p.Text == "":
		s.mu.Unlock()
		reply(w, http.StatusOK, map[string]any{"ok": false, "error": "no_text"})
		return
	case f != nil:
		s.mu.Unlock()
		if f.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(f.RetryAfter))
		}
		status := f.Status
		if status == 0 {
			status = http.StatusOK
		}
		if status != http.StatusOK {
			// Slack sends HTML with 5xx; the client does not parse it.
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(status)
			_, _ = fmt.Fprintf(w, "<html><body>%d</body></html>", status)
			return
		}
		reply(w, http.StatusOK, map[string]any{"ok": false, "error": f.Error})
		return
	}
	s.ts++
	ts := fmt.Sprintf("%d.%06d", time.Now().Unix(), s.ts)
	p.TS = ts
	s.posted = append(s.posted, p)
	s.texts[p.Channel+"/"+ts] = p.Text
	s.mu.Unlock()
	reply(w, http.StatusOK, map[string]any{"ok": true, "channel": p.Channel, "ts": ts,
		"message": map[string]any{"type": "message", "text": p.Text, "user": BotUserID, "bot_id": "B0BOT00001", "ts": ts}})
}

func (s *Server) update(w http.ResponseWriter, r *http.Request) {
	u := Update{Channel: r.Form.Get("channel"), TS: r.Form.Get("ts"), Text: r.Form.Get("text"), At: time.Now()}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.updFail) > 0 {
		f := s.updFail[0]
		s.updFail = s.updFail[1:]
		if f.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(f.RetryAfter))
		}
		if f.Status != 0 && f.Status != http.StatusOK {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(f.Status)
			_, _ = fmt.Fprintf(w, "<html><body>%d</body></html>", f.Status)
			return
		}
		reply(w, http.StatusOK, map[string]any{"ok": false, "error": f.Error})
		return
	}
	key := u.Channel + "/" + u.TS
	if _, ok := s.texts[key]; !ok {
		reply(w, http.StatusOK, map[string]any{"ok": false, "error": "message_not_found"})
		return
	}
	if u.Text == "" {
		reply(w, http.StatusOK, map[string]any{"ok": false, "error": "no_text"})
		return
	}
	s.texts[key] = u.Text
	s.updates = append(s.updates, u)
	reply(w, http.StatusOK, map[string]any{"ok": true, "channel": u.Channel, "ts": u.TS, "text": u.Text})
}

func (s *Server) fileInfo(w http.ResponseWriter, id string) {
	s.mu.Lock()
	f, ok := s.files[id]
	s.fileInfos++
	s.mu.Unlock()
	if !ok {
		reply(w, http.StatusOK, map[string]any{"ok": false, "error": "file_not_found"})
		return
	}
	dl := fmt.Sprintf("%s/files-pri/T061EG9R6-%s/download/%s", s.URL, id, f.name)
	reply(w, http.StatusOK, map[string]any{"ok": true, "file": map[string]any{"id": id, "name": f.name, "title": f.name,
		"mimetype": f.mimetype, "size": len(f.data), "mode": "hosted",
		"url_private": fmt.Sprintf("%s/files-pri/T061EG9R6-%s/%s", s.URL, id, f.name), "url_private_download": dl}})
}

func (s *Server) download(w http.ResponseWriter, id string) {
	s.mu.Lock()
	f, ok := s.files[id]
	s.mu.Unlock()
	if !ok {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", f.mimetype)
	_, _ = w.Write(f.data)
}

// Sign returns the headers Slack sends with body at time at, signed with
// secret: X-Slack-Request-Timestamp and X-Slack-Signature (v0).
func Sign(secret string, at time.Time, body []byte) http.Header {
	ts := strconv.FormatInt(at.Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	_, _ = fmt.Fprintf(mac, "v0:%s:", ts)
	_, _ = mac.Write(body)
	h := http.Header{}
	h.Set("X-Slack-Request-Timestamp", ts)
	h.Set("X-Slack-Signature", "v0="+hex.EncodeToString(mac.Sum(nil)))
	h.Set("Content-Type", "application/json")
	return h
}

func reply(w http.ResponseWriter, status int, body any) {
	data, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(data)
}
