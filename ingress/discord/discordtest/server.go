// Package discordtest is a local stand-in for Discord, for tests: a Gateway
// speaking the documented websocket protocol (HELLO, IDENTIFY → READY with
// session_id and resume_gateway_url, heartbeats and their ACKs, dispatches
// with sequence numbers, RESUME replaying what the session missed, then
// RESUMED; INVALID_SESSION for a session it does not know) and the REST
// endpoints the adapter uses (GET /channels/{id}, POST
// /channels/{id}/messages, POST /webhooks/{application}/{token}
// follow-ups), with scripted failures (429 with retry_after, 5xx, 403).
package discordtest

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// BotID is the bot's user id; Token carries it as a real token does.
const BotID = "1100000000000000001"

// Token is the bot token the server accepts.
var Token = base64.RawStdEncoding.EncodeToString([]byte(BotID)) + ".GxYzAb.test-token-signature"

// HeartbeatInterval is what HELLO announces, in milliseconds.
const HeartbeatInterval = 1000

// MessageContentIntent is the privileged intent the adapter must ask for.
const MessageContentIntent = 1 << 15

// Sent is one message the REST API accepted (or, in Attempts, was asked
// for).
type Sent struct {
	ChannelID string
	// FollowupToken is the interaction token of a follow-up, "" for a
	// channel message.
	FollowupToken string
	Content       string
	At            time.Time
}

// Failure is a scripted answer to the next message post.
type Failure struct {
	Status     int
	RetryAfter float64
	Code       int
	Message    string
}

// Server is the fake Discord.
type Server struct {
	*httptest.Server

	mu        sync.Mutex
	channels  map[string]json.RawMessage
	sessions  map[string]*gwSession
	current   *gwSession
	n         int
	conns     []*gwConn
	identifys int
	resumes   []Resume
	sent      []Sent
	attempts  []Sent
	failures  []Failure
	noACK     bool
}

// SetHeartbeatACK makes the gateway answer heartbeats (true, the default)
// or leave them unanswered, as a zombie connection does.
func (s *Server) SetHeartbeatACK(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noACK = !on
}

// Resume is a RESUME the gateway received.
type Resume struct {
	SessionID string
	Seq       int
	Known     bool
}

type gwSession struct {
	id     string
	seq    int
	events []json.RawMessage // events[i] has seq i+1
	conn   *gwConn
}

type gwConn struct {
	ws *websocket.Conn
	mu sync.Mutex
}

func (c *gwConn) send(v any) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.ws.SetWriteDeadline(time.Now().Add(10 * time.Second))
	return c.ws.WriteJSON(v)
}

// New starts a server; it is closed when the test ends.
func New(t interface{ Cleanup(func()) }) *Server {
	s := &Server{channels: map[string]json.RawMessage{}, sessions: map[string]*gwSession{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		s.mu.Lock()
		for _, c := range s.conns {
			_ = c.ws.Close()
		}
		s.mu.Unlock()
		s.Close()
	})
	return s
}

// GatewayURL is the gateway's websocket URL.
func (s *Server) GatewayURL() string { return "ws" + strings.TrimPrefix(s.URL, "http") + "/gateway" }

// APIBase is the REST base URL.
func (s *Server) APIBase() string { return s.URL + "/api/v10" }

// AddChannel makes GET /channels/{id} answer with the channel object.
func (s *Server) AddChannel(id string, channel string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.channels[id] = json.RawMessage(channel)
}

// Dispatch sends an event to the session last identified: at once when it
// is connected, else on its RESUME. It returns the event's sequence number.
func (s *Server) Dispatch(eventType string, data string) int {
	s.mu.Lock()
	sess := s.current
	if sess == nil {
		s.mu.Unlock()
		panic("discordtest: no session to dispatch to")
	}
	sess.seq++
	ev, _ := json.Marshal(map[string]any{"op": 0, "s": sess.seq, "t": eventType, "d": json.RawMessage(data)})
	sess.events = append(sess.events, ev)
	conn, seq := sess.conn, sess.seq
	s.mu.Unlock()
	if conn != nil {
		_ = conn.send(json.RawMessage(ev))
	}
	return seq
}

// Connected reports whether the current session has a live connection.
func (s *Server) Connected() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current != nil && s.current.conn != nil
}

// DropConnections closes every gateway connection without a close frame,
// as a dead network does.
func (s *Server) DropConnections() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		_ = c.ws.UnderlyingConn().Close()
	}
}

// Identifies counts IDENTIFYs; Resumes lists the RESUMEs.
func (s *Server) Identifies() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.identifys
}

// Resumes returns the RESUMEs received.
func (s *Server) Resumes() []Resume {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Resume(nil), s.resumes...)
}

// FailNext scripts the answers to the next message posts.
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

// Attempts returns every post asked for.
func (s *Server) Attempts() []Sent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Sent(nil), s.attempts...)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/gateway" {
		s.gateway(w, r)
		return
	}
	path, ok := strings.CutPrefix(r.URL.Path, "/api/v10/")
	if !ok {
		apiError(w, http.StatusNotFound, 0, "404: Not Found")
		return
	}
	parts := strings.Split(path, "/")
	switch {
	case len(parts) == 2 && parts[0] == "channels" && r.Method == http.MethodGet:
		if !s.authorized(w, r) {
			return
		}
		s.mu.Lock()
		ch, ok := s.channels[parts[1]]
		s.mu.Unlock()
		if !ok {
			apiError(w, http.StatusNotFound, 10003, "Unknown Channel")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(ch)
	case len(parts) == 3 && parts[0] == "channels" && parts[2] == "messages" && r.Method == http.MethodPost:
		if !s.authorized(w, r) {
			return
		}
		s.post(w, r, Sent{ChannelID: parts[1]})
	case len(parts) == 3 && parts[0] == "webhooks" && r.Method == http.MethodPost:
		s.post(w, r, Sent{FollowupToken: parts[2]})
	default:
		apiError(w, http.StatusNotFound, 0, "404: Not Found")
	}
}

func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	if r.Header.Get("Authorization") != "Bot "+Token {
		apiError(w, http.StatusUnauthorized, 0, "401: Unauthorized")
		return false
	}
	return true
}

func apiError(w http.ResponseWriter, status, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"message": msg, "code": code})
}

func (s *Server) post(w http.ResponseWriter, r *http.Request, sent Sent) {
	data, _ := io.ReadAll(r.Body)
	var body struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(data, &body) != nil || body.Content == "" {
		apiError(w, http.StatusBadRequest, 50006, "Cannot send an empty message")
		return
	}
	if n := len([]rune(body.Content)); n > 2000 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = fmt.Fprintf(w, `{"message":"Invalid Form Body","code":50035,"errors":{"content":{"_errors":[{"code":"BASE_TYPE_MAX_LENGTH","message":"Must be 2000 or fewer in length."}]}}}`)
		return
	}
	sent.Content, sent.At = body.Content, time.Now()
	s.mu.Lock()
	s.attempts = append(s.attempts, sent)
	if len(s.failures) > 0 {
		f := s.failures[0]
		s.failures = s.failures[1:]
		s.mu.Unlock()
		if f.Status == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", strconv.Itoa(int(f.RetryAfter+0.999)))
			w.Header().Set("X-RateLimit-Scope", "user")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			_ = json.NewEncoder(w).Encode(map[string]any{"message": "You are being rate limited.", "retry_after": f.RetryAfter, "global": false})
			return
		}
		if f.Message == "" {
			f.Message = http.StatusText(f.Status)
		}
		apiError(w, f.Status, f.Code, f.Message)
		return
	}
	s.n++
	s.sent = append(s.sent, sent)
	id := fmt.Sprintf("13000000000000%05d", s.n)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"id": id, "channel_id": sent.ChannelID, "content": sent.Content, "type": 0,
		"author": map[string]any{"id": BotID, "username": "fleetbot", "bot": true}, "timestamp": time.Now().UTC().Format(time.RFC3339)})
}

var upgrader = websocket.Upgrader{}

// gateway serves one websocket connection of the Gateway protocol.
func (s *Server) gateway(w http.ResponseWriter, r *http.Request) {
	ws, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	c := &gwConn{ws: ws}
	s.mu.Lock()
	s.conns = append(s.conns, c)
	s.mu.Unlock()
	var sess *gwSession
	defer func() {
		_ = ws.Close()
		s.mu.Lock()
		if sess != nil && sess.conn == c {
			sess.conn = nil
		}
		s.mu.Unlock()
	}()
	if c.send(map[string]any{"op": 10, "s": nil, "t": nil, "d": map[string]any{"heartbeat_interval": HeartbeatInterval}}) != nil {
		return
	}
	for {
		_ = ws.SetReadDeadline(time.Now().Add(3 * HeartbeatInterval * time.Millisecond))
		var msg struct {
			Op int             `json:"op"`
			D  json.RawMessage `json:"d"`
		}
		if err := ws.ReadJSON(&msg); err != nil {
			return
		}
		switch msg.Op {
		case 1: // heartbeat
			s.mu.Lock()
			zombie := s.noACK
			s.mu.Unlock()
			if !zombie && c.send(map[string]any{"op": 11}) != nil {
				return
			}
		case 2: // identify
			var id struct {
				Token   string `json:"token"`
				Intents int    `json:"intents"`
			}
			_ = json.Unmarshal(msg.D, &id)
			if id.Token != Token {
				_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(4004, "Authentication failed."), time.Now().Add(time.Second))
				return
			}
			if id.Intents&MessageContentIntent == 0 {
				_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(4014, "Disallowed intent(s)."), time.Now().Add(time.Second))
				return
			}
			s.mu.Lock()
			s.identifys++
			sess = &gwSession{id: fmt.Sprintf("session%04d", s.identifys), conn: c}
			s.sessions[sess.id] = sess
			s.current = sess
			s.mu.Unlock()
			ready := fmt.Sprintf(`{"v":10,"user":{"id":%q,"username":"fleetbot","discriminator":"0","bot":true},"guilds":[],"session_id":%q,"resume_gateway_url":%q,"application":{"id":"1100000000000000099","flags":0}}`,
				BotID, sess.id, s.GatewayURL())
			s.Dispatch("READY", ready)
		case 6: // resume
			var rs struct {
				Token     string `json:"token"`
				SessionID string `json:"session_id"`
				Seq       int    `json:"seq"`
			}
			_ = json.Unmarshal(msg.D, &rs)
			s.mu.Lock()
			known, ok := s.sessions[rs.SessionID]
			ok = ok && rs.Token == Token
			s.resumes = append(s.resumes, Resume{SessionID: rs.SessionID, Seq: rs.Seq, Known: ok})
			if !ok {
				s.mu.Unlock()
				_ = c.send(map[string]any{"op": 9, "d": false})
				continue
			}
			sess = known
			if old := sess.conn; old != nil && old != c {
				_ = old.ws.Close()
			}
			sess.conn = c
			s.current = sess
			missed := append([]json.RawMessage(nil), sess.events[min(max(rs.Seq, 0), len(sess.events)):]...)
			sess.seq++
			resumed, _ := json.Marshal(map[string]any{"op": 0, "s": sess.seq, "t": "RESUMED", "d": map[string]any{}})
			sess.events = append(sess.events, resumed)
			// Replay under the lock, so no new dispatch overtakes it.
			for _, ev := range missed {
				_ = c.send(json.RawMessage(ev))
			}
			_ = c.send(json.RawMessage(resumed))
			s.mu.Unlock()
		}
	}
}
