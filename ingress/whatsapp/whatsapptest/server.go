// Package whatsapptest is a local stand-in for the WhatsApp Cloud API's
// send endpoint, for tests: POST /{phone_number_id}/messages with a bearer
// token, answering as the Graph API does (a wamid on success; the Graph
// error envelope with scripted failures: 429, 5xx, error codes such as
// 131047 or 130429), recording what was sent; and media downloads (GET
// /{media id} for the download URL, then the bytes, both with the token).
package whatsapptest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Token and PhoneNumberID are what the server accepts.
const (
	Token         = "EAAtest-access-token"
	PhoneNumberID = "106540352242922"
)

// Sent is one message the server accepted (or, in Attempts, was asked for).
type Sent struct {
	To   string
	Text string
	ID   string
	At   time.Time
}

// Failure is a scripted answer to the next send.
type Failure struct {
	// Status is the HTTP status.
	Status int
	// Code is the Graph error code (131047, 130429, ...).
	Code int
	// Message is the error message.
	Message string
	// RetryAfter is the Retry-After header in seconds.
	RetryAfter int
}

// Server is the fake Graph API.
type Server struct {
	*httptest.Server

	mu       sync.Mutex
	n        int
	sent     []Sent
	attempts []Sent
	failures []Failure
	media    map[string]media
}

type media struct {
	mime string
	data []byte
}

// AddMedia makes a media id known: GET /{media id} answers its download
// URL, and the download (with the token) its bytes.
func (s *Server) AddMedia(id, mime string, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.media == nil {
		s.media = map[string]media{}
	}
	s.media[id] = media{mime: mime, data: data}
}

// serveMedia answers GET /{version}/{media id} and GET /download/{media id}.
func (s *Server) serveMedia(w http.ResponseWriter, r *http.Request, parts []string) {
	if r.Header.Get("Authorization") != "Bearer "+Token {
		graphError(w, http.StatusUnauthorized, 190, "Invalid OAuth access token")
		return
	}
	id := parts[len(parts)-1]
	s.mu.Lock()
	m, ok := s.media[id]
	s.mu.Unlock()
	if !ok {
		graphError(w, http.StatusBadRequest, 100, "Unsupported get request. Object with ID '"+id+"' does not exist")
		return
	}
	if parts[0] == "download" {
		w.Header().Set("Content-Type", m.mime)
		_, _ = w.Write(m.data)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"messaging_product": "whatsapp", "url": s.URL + "/download/" + id,
		"mime_type": m.mime, "sha256": "x", "file_size": len(m.data), "id": id})
}

// New starts a server; it is closed when the test ends.
func New(t interface{ Cleanup(func()) }) *Server {
	s := &Server{}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

// FailNext scripts the answers to the next sends, in order.
func (s *Server) FailNext(f ...Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures = append(s.failures, f...)
}

// Sent returns the messages accepted, in order.
func (s *Server) Sent() []Sent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Sent(nil), s.sent...)
}

// Attempts returns every send asked for, failed ones included.
func (s *Server) Attempts() []Sent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Sent(nil), s.attempts...)
}

func graphError(w http.ResponseWriter, status, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"message": msg, "type": "OAuthException", "code": code,
		"error_data": map[string]any{"messaging_product": "whatsapp", "details": msg},
		"fbtrace_id": "AbCdEfGhIjKlMnOp",
	}})
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	path := strings.Trim(r.URL.Path, "/")
	parts := strings.Split(path, "/")
	if r.Method == http.MethodGet && len(parts) == 2 {
		s.serveMedia(w, r, parts)
		return
	}
	if r.Method != http.MethodPost || len(parts) < 2 || parts[len(parts)-1] != "messages" {
		graphError(w, http.StatusNotFound, 100, "Unsupported request")
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+Token {
		graphError(w, http.StatusUnauthorized, 190, "Invalid OAuth access token - Cannot parse access token")
		return
	}
	if parts[len(parts)-2] != PhoneNumberID {
		graphError(w, http.StatusBadRequest, 100, "Unsupported post request. Object with ID '"+parts[len(parts)-2]+"' does not exist")
		return
	}
	data, _ := io.ReadAll(r.Body)
	var req struct {
		Product string `json:"messaging_product"`
		To      string `json:"to"`
		Type    string `json:"type"`
		Text    struct {
			Body string `json:"body"`
		} `json:"text"`
	}
	if err := json.Unmarshal(data, &req); err != nil || req.Product != "whatsapp" || req.To == "" || req.Type != "text" {
		graphError(w, http.StatusBadRequest, 100, "(#100) Invalid parameter")
		return
	}
	if n := len([]rune(req.Text.Body)); n == 0 || n > 4096 {
		graphError(w, http.StatusBadRequest, 100, fmt.Sprintf("(#100) Param text['body'] must be at most 4096 characters long, got %d", n))
		return
	}
	s.mu.Lock()
	s.attempts = append(s.attempts, Sent{To: req.To, Text: req.Text.Body, At: time.Now()})
	if len(s.failures) > 0 {
		f := s.failures[0]
		s.failures = s.failures[1:]
		s.mu.Unlock()
		if f.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(f.RetryAfter))
		}
		if f.Message == "" {
			f.Message = http.StatusText(f.Status)
		}
		graphError(w, f.Status, f.Code, f.Message)
		return
	}
	s.n++
	id := fmt.Sprintf("wamid.TEST%08d", s.n)
	s.sent = append(s.sent, Sent{To: req.To, Text: req.Text.Body, ID: id, At: time.Now()})
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"messaging_product": "whatsapp",
		"contacts":          []map[string]string{{"input": req.To, "wa_id": req.To}},
		"messages":          []map[string]string{{"id": id}},
	})
}
