package slackfake

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/gorilla/websocket"
)

// AppToken is the app-level token apps.connections.open accepts.
const AppToken = "xapp-test-token"

// envelope is one events_api delivery of Socket Mode.
type envelope struct {
	id       string
	payload  json.RawMessage
	acked    bool
	attempts int
	on       *socketConn // the connection it is in flight on, nil when pending
}

type socketConn struct {
	ws     *websocket.Conn
	closed bool
	wake   chan struct{}
}

// AddSocketEvent queues an Events API payload (an event_callback) for
// delivery over Socket Mode and returns its envelope id. It is delivered to
// the newest open connection, and delivered again (retry_attempt + 1) on
// the next connection if the one it went to closes before acknowledging it.
func (s *Server) AddSocketEvent(payload []byte) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := fmt.Sprintf("env-%d", len(s.envelopes)+1)
	s.envelopes = append(s.envelopes, &envelope{id: id, payload: json.RawMessage(payload)})
	s.wakeSockets()
	return id
}

// SocketAcks returns how many envelopes were acknowledged, and how many
// acknowledgements came in total (more than once for one envelope means it
// was handled twice).
func (s *Server) SocketAcks() (acked, acks int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.envelopes {
		if e.acked {
			acked++
		}
	}
	return acked, s.acks
}

// SocketConnections returns how many Socket Mode connections were opened.
func (s *Server) SocketConnections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns
}

func (s *Server) wakeSockets() {
	for _, c := range s.sockets {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

func (s *Server) connectionsOpen(w http.ResponseWriter, r *http.Request) {
	if strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ") != AppToken {
		reply(w, http.StatusOK, map[string]any{"ok": false, "error": "invalid_auth"})
		return
	}
	reply(w, http.StatusOK, map[string]any{"ok": true, "url": "ws" + strings.TrimPrefix(s.URL, "http") + "/socket"})
}

var upgrader = websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}

func (s *Server) socket(w http.ResponseWriter, r *http.Request) {
	ws, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	c := &socketConn{ws: ws, wake: make(chan struct{}, 1)}
	s.mu.Lock()
	s.conns++
	s.sockets = append(s.sockets, c)
	s.mu.Unlock()
	defer s.dropSocket(c)

	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			var ack struct {
				EnvelopeID string `json:"envelope_id"`
			}
			if err := ws.ReadJSON(&ack); err != nil {
				return
			}
			s.mu.Lock()
			for _, e := range s.envelopes {
				if e.id == ack.EnvelopeID {
					e.acked = true
					e.on = nil
					s.acks++
				}
			}
			s.mu.Unlock()
		}
	}()
	_ = ws.WriteJSON(map[string]any{"type": "hello", "num_connections": 1,
		"connection_info": map[string]any{"app_id": "A0PNCHHK2"}, "debug_info": map[string]any{"host": "fake", "approximate_connection_time": 3600}})
	ping := time.NewTicker(500 * time.Millisecond)
	defer ping.Stop()
	for {
		for _, msg := range s.take(c) {
			if err := ws.WriteJSON(msg); err != nil {
				return
			}
		}
		select {
		case <-done:
			return
		case <-c.wake:
		case <-ping.C:
			if err := ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(time.Second)); err != nil {
				return
			}
		}
	}
}

// take hands the pending envelopes to c when it is the newest connection.
func (s *Server) take(c *socketConn) []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.sockets) == 0 || s.sockets[len(s.sockets)-1] != c {
		return nil
	}
	var out []map[string]any
	for _, e := range s.envelopes {
		if e.acked || e.on != nil {
			continue
		}
		e.on = c
		retry := ""
		if e.attempts > 0 {
			retry = "timeout"
		}
		out = append(out, map[string]any{"envelope_id": e.id, "type": "events_api", "payload": e.payload,
			"accepts_response_payload": false, "retry_attempt": e.attempts, "retry_reason": retry})
		e.attempts++
	}
	return out
}

// dropSocket forgets c; what was in flight on it becomes pending again.
func (s *Server) dropSocket(c *socketConn) {
	_ = c.ws.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, x := range s.sockets {
		if x == c {
			s.sockets = append(s.sockets[:i], s.sockets[i+1:]...)
			break
		}
	}
	for _, e := range s.envelopes {
		if e.on == c && !e.acked {
			e.on = nil
		}
	}
	s.wakeSockets()
}
