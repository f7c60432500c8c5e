// Package telegramtest is a local stand-in for the Telegram Bot API, for
// tests: it serves getMe, getUpdates (with Telegram's confirmation by
// offset, long polling and 409 Conflict for a second concurrent poller),
// deleteWebhook, sendMessage and editMessageText (recording what was sent
// and edited, and answering with scripted failures: 429 with retry_after,
// 5xx, 400), in the Bot API's JSON envelope; and getFile with the file
// download at /file/bot<token>/<file_path> for the files given to AddFile.
package telegramtest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"
)

// Token is a bot token the server accepts; its bot id is 777.
const Token = "777:test-token_ABC"

// BotUsername is the username getMe answers.
const BotUsername = "fleetbot"

// Sent is one sendMessage call the server accepted.
type Sent struct {
	// MessageID is the id the server gave the message (0 for a failed
	// attempt); Text is the text it was sent with, whatever edits followed.
	MessageID int64
	ChatID    string
	ThreadID  int64
	Text      string
	At        time.Time
}

// Failure is a scripted answer to the next sendMessage call.
type Failure struct {
	// Status is the HTTP status (429, 500, 400...).
	Status int
	// RetryAfter is parameters.retry_after in seconds (for 429).
	RetryAfter int
	// Description is the Bot API's description.
	Description string
	// Hang makes the server keep the request open (until the client gives
	// up) and then post the message anyway: an ambiguous outcome.
	Hang time.Duration
}

// Edit is one editMessageText call the server accepted.
type Edit struct {
	ChatID    string
	MessageID int64
	Text      string
	At        time.Time
}

// Server is the fake Bot API.
type Server struct {
	*httptest.Server

	mu       sync.Mutex
	updates  []json.RawMessage // unconfirmed, in update_id order
	ids      []int64
	nextID   int64
	polling  int // getUpdates calls in flight
	polls    int
	conflict int
	sent     []Sent
	attempts []Sent // every sendMessage call, failed ones too
	failures []Failure
	edits    []Edit
	editFail []Failure
	texts    map[int64]string // message id -> current text
	changed  chan struct{}
	webhook  bool
	files    map[string]file // by file id
	getFiles int
}

type file struct {
	path, contentType string
	data              []byte
}

// AddFile makes a file downloadable by its file id.
func (s *Server) AddFile(fileID, contentType string, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.files == nil {
		s.files = map[string]file{}
	}
	s.files[fileID] = file{path: fmt.Sprintf("photos/file_%d.bin", len(s.files)), contentType: contentType, data: data}
}

// GetFiles returns how many getFile calls were answered.
func (s *Server) GetFiles() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.getFiles
}

// New starts a server; it is closed when the test ends.
func New(t interface{ Cleanup(func()) }) *Server {
	s := &Server{nextID: 100, changed: make(chan struct{}), texts: map[int64]string{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

// AddUpdate queues an update (a JSON object without update_id, or with
// one: it is overwritten) and returns its update_id.
func (s *Server) AddUpdate(update string) int64 {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(update), &m); err != nil {
		panic(fmt.Sprintf("telegramtest: update is not a JSON object: %v", err))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.nextID
	s.nextID++
	m["update_id"] = json.RawMessage(fmt.Sprint(id))
	raw, _ := json.Marshal(m)
	s.updates = append(s.updates, raw)
	s.ids = append(s.ids, id)
	s.notify()
	return id
}

// Pending returns how many updates are not confirmed yet.
func (s *Server) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.updates)
}

// Polls returns how many getUpdates calls were answered, and how many got
// 409 Conflict.
func (s *Server) Polls() (polls, conflicts int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.polls, s.conflict
}

// FailNext scripts the answers to the next sendMessage calls, in order.
func (s *Server) FailNext(f ...Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures = append(s.failures, f...)
}

// FailEditNext scripts the answers to the next editMessageText calls, in
// order (Hang is not supported for edits).
func (s *Server) FailEditNext(f ...Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.editFail = append(s.editFail, f...)
}

// Edits returns the accepted editMessageText calls, in order.
func (s *Server) Edits() []Edit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Edit(nil), s.edits...)
}

// Text returns the current text of message id (after its edits).
func (s *Server) Text(id int64) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.texts[id]
}

// Sent returns the messages posted so far.
func (s *Server) Sent() []Sent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Sent(nil), s.sent...)
}

// Attempts returns every sendMessage call, failed ones included.
func (s *Server) Attempts() []Sent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Sent(nil), s.attempts...)
}

// WebhookDeleted reports whether deleteWebhook was called.
func (s *Server) WebhookDeleted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.webhook
}

func (s *Server) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if path, ok := strings.CutPrefix(r.URL.Path, "/file/bot"+Token+"/"); ok {
		s.download(w, path)
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/bot"+Token+"/")
	if !ok {
		reply(w, http.StatusUnauthorized, map[string]any{"ok": false, "error_code": 401, "description": "Unauthorized"})
		return
	}
	var params map[string]any
	body, _ := io.ReadAll(r.Body)
	if len(body) > 0 {
		if err := json.Unmarshal(body, &params); err != nil {
			reply(w, http.StatusBadRequest, map[string]any{"ok": false, "error_code": 400, "description": "Bad Request: invalid JSON"})
			return
		}
	}
	switch rest {
	case "getMe":
		reply(w, http.StatusOK, map[string]any{"ok": true, "result": map[string]any{"id": 777, "is_bot": true, "first_name": "Fleet", "username": BotUsername}})
	case "deleteWebhook":
		s.mu.Lock()
		s.webhook = true
		s.mu.Unlock()
		reply(w, http.StatusOK, map[string]any{"ok": true, "result": true})
	case "getUpdates":
		s.getUpdates(w, r, params)
	case "sendMessage":
		s.sendMessage(w, r, params)
	case "editMessageText":
		s.editMessageText(w, params)
	case "getFile":
		s.getFile(w, params)
	default:
		reply(w, http.StatusNotFound, map[string]any{"ok": false, "error_code": 404, "description": "Not Found: method not found"})
	}
}

func (s *Server) getUpdates(w http.ResponseWriter, r *http.Request, params map[string]any) {
	offset := int64(num(params["offset"]))
	timeout := time.Duration(num(params["timeout"])) * time.Second
	// Keep the fake's long polls short: a test never waits on them.
	timeout = min(timeout, 500*time.Millisecond)
	s.mu.Lock()
	if s.polling > 0 {
		s.polling++
		s.conflict++
		s.mu.Unlock()
		// Telegram ends the older request; here the newer one is refused,
		// which a poller handles the same way (retry after a pause).
		defer func() { s.mu.Lock(); s.polling--; s.mu.Unlock() }()
		reply(w, http.StatusConflict, map[string]any{"ok": false, "error_code": 409,
			"description": "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"})
		return
	}
	s.polling++
	s.polls++
	// Confirm everything below offset.
	if offset > 0 {
		for len(s.ids) > 0 && s.ids[0] < offset {
			s.ids, s.updates = s.ids[1:], s.updates[1:]
		}
	}
	deadline := time.Now().Add(timeout)
	for len(s.updates) == 0 {
		ch := s.changed
		s.mu.Unlock()
		wait := time.Until(deadline)
		if wait <= 0 {
			s.mu.Lock()
			break
		}
		t := time.NewTimer(wait)
		select {
		case <-ch:
		case <-t.C:
		case <-r.Context().Done():
		}
		t.Stop()
		s.mu.Lock()
		if r.Context().Err() != nil {
			break
		}
	}
	out := append([]json.RawMessage{}, s.updates[:min(len(s.updates), 100)]...)
	s.polling--
	s.mu.Unlock()
	reply(w, http.StatusOK, map[string]any{"ok": true, "result": out})
}

func (s *Server) sendMessage(w http.ResponseWriter, r *http.Request, params map[string]any) {
	msg := Sent{ChatID: fmt.Sprint(params["chat_id"]), ThreadID: int64(num(params["message_thread_id"])), At: time.Now()}
	msg.Text, _ = params["text"].(string)
	s.mu.Lock()
	s.attempts = append(s.attempts, msg)
	var f *Failure
	if len(s.failures) > 0 {
		f = &s.failures[0]
		s.failures = s.failures[1:]
	}
	if msg.Text == "" {
		s.mu.Unlock()
		reply(w, http.StatusBadRequest, map[string]any{"ok": false, "error_code": 400, "description": "Bad Request: message text is empty"})
		return
	}
	if f != nil && f.Hang == 0 {
		s.mu.Unlock()
		desc := f.Description
		if desc == "" {
			desc = http.StatusText(f.Status)
		}
		body := map[string]any{"ok": false, "error_code": f.Status, "description": desc}
		if f.RetryAfter > 0 {
			body["parameters"] = map[string]any{"retry_after": f.RetryAfter}
			desc = fmt.Sprintf("Too Many Requests: retry after %d", f.RetryAfter)
			body["description"] = desc
		}
		reply(w, f.Status, body)
		return
	}
	id := len(s.sent) + 1
	msg.MessageID = int64(id)
	s.sent = append(s.sent, msg)
	s.texts[int64(id)] = msg.Text
	s.notify()
	s.mu.Unlock()
	if f != nil {
		// Posted, but the answer comes too late for the client.
		t := time.NewTimer(f.Hang)
		select {
		case <-t.C:
		case <-r.Context().Done():
		}
		t.Stop()
	}
	reply(w, http.StatusOK, map[string]any{"ok": true, "result": map[string]any{"message_id": id, "date": time.Now().Unix(),
		"chat": map[string]any{"id": params["chat_id"], "type": "private"}, "text": msg.Text}})
}

func (s *Server) editMessageText(w http.ResponseWriter, params map[string]any) {
	e := Edit{ChatID: fmt.Sprint(params["chat_id"]), MessageID: int64(num(params["message_id"])), At: time.Now()}
	e.Text, _ = params["text"].(string)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.editFail) > 0 {
		f := s.editFail[0]
		s.editFail = s.editFail[1:]
		body := map[string]any{"ok": false, "error_code": f.Status, "description": f.Description}
		if f.RetryAfter > 0 {
			body["parameters"] = map[string]any{"retry_after": f.RetryAfter}
			body["description"] = fmt.Sprintf("Too Many Requests: retry after %d", f.RetryAfter)
		}
		reply(w, f.Status, body)
		return
	}
	old, ok := s.texts[e.MessageID]
	switch {
	case !ok || int(e.MessageID) > len(s.sent) || s.sent[e.MessageID-1].ChatID != e.ChatID:
		reply(w, http.StatusBadRequest, map[string]any{"ok": false, "error_code": 400, "description": "Bad Request: message to edit not found"})
		return
	case e.Text == "":
		reply(w, http.StatusBadRequest, map[string]any{"ok": false, "error_code": 400, "description": "Bad Request: message text is empty"})
		return
	case e.Text == old:
		reply(w, http.StatusBadRequest, map[string]any{"ok": false, "error_code": 400,
			"description": "Bad Request: message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message"})
		return
	}
	s.texts[e.MessageID] = e.Text
	s.edits = append(s.edits, e)
	s.notify()
	reply(w, http.StatusOK, map[string]any{"ok": true, "result": map[string]any{"message_id": e.MessageID, "date": time.Now().Unix(),
		"edit_date": time.Now().Unix(), "chat": map[string]any{"id": params["chat_id"], "type": "private"}, "text": e.Text}})
}

func (s *Server) getFile(w http.ResponseWriter, params map[string]any) {
	id, _ := params["file_id"].(string)
	s.mu.Lock()
	f, ok := s.files[id]
	s.getFiles++
	s.mu.Unlock()
	if !ok {
		reply(w, http.StatusBadRequest, map[string]any{"ok": false, "error_code": 400, "description": "Bad Request: invalid file_id"})
		return
	}
	reply(w, http.StatusOK, map[string]any{"ok": true, "result": map[string]any{"file_id": id, "file_unique_id": "u" + id,
		"file_size": len(f.data), "file_path": f.path}})
}

func (s *Server) download(w http.ResponseWriter, path string) {
	s.mu.Lock()
	var found *file
	for _, f := range s.files {
		if f.path == path {
			found = &f
			break
		}
	}
	s.mu.Unlock()
	if found == nil {
		http.NotFound(w, nil)
		return
	}
	w.Header().Set("Content-Type", found.contentType)
	w.Header().Set("Content-Length", fmt.Sprint(len(found.data)))
	_, _ = w.Write(found.data)
}

func num(v any) float64 {
	switch n := v.(type) {
	case float64:
		return n
	case string:
		var f float64
		_, _ = fmt.Sscan(n, &f)
		return f
	}
	return 0
}

func reply(w http.ResponseWriter, status int, body any) {
	data, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(data)
}
