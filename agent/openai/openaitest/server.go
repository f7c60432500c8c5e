// Package openaitest is a local server that speaks the OpenAI
// chat-completions API, streaming included, for tests of the openai backend
// and of the fleet with it. Its "model" follows the last user message the
// way the echo agent does:
//
//	text         streamed back as "echo: <text>", in pieces, with usage
//	!sleep       streams "first words", then waits until the client leaves
//	!fail        answers 400 with an API error
//	!tool ARGS   calls the server's Tool with ARGS (JSON); once the tool's
//	             result is in the conversation, answers "tool said: <result>"
//
// FailFirst makes the first requests fail with 503, to test retries.
package openaitest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"
)

// Server is the fake chat-completions API.
type Server struct {
	// URL is the base URL to give the client (…/v1).
	URL string
	// Tool is the name of the tool "!tool" calls. Defaults to "lookup".
	Tool string

	srv       *httptest.Server
	mu        sync.Mutex
	requests  []Request
	failFirst int
}

// Request is a chat-completions request as the server received it.
type Request struct {
	Model    string    `json:"model"`
	Messages []Message `json:"messages"`
	Tools    []struct {
		Function struct {
			Name       string         `json:"name"`
			Parameters map[string]any `json:"parameters"`
		} `json:"function"`
	} `json:"tools"`
	Stream        bool `json:"stream"`
	Authorization string
}

// Message is one message of a request.
type Message struct {
	Role       string `json:"role"`
	Content    any    `json:"content"`
	ToolCallID string `json:"tool_call_id"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// Text is the message's content as text.
func (m Message) Text() string {
	switch c := m.Content.(type) {
	case string:
		return c
	case []any:
		var b strings.Builder
		for _, p := range c {
			if part, ok := p.(map[string]any); ok {
				if s, ok := part["text"].(string); ok {
					b.WriteString(s)
				}
			}
		}
		return b.String()
	}
	return ""
}

// ImageURLs are the URLs of the message's image parts (data URLs
// included), in order.
func (m Message) ImageURLs() []string {
	parts, _ := m.Content.([]any)
	var out []string
	for _, p := range parts {
		part, _ := p.(map[string]any)
		if part["type"] != "image_url" {
			continue
		}
		if img, ok := part["image_url"].(map[string]any); ok {
			if u, ok := img["url"].(string); ok {
				out = append(out, u)
			}
		}
	}
	return out
}

// New starts a server; it stops when the test ends.
func New(tb interface {
	Cleanup(func())
}) *Server {
	s := &Server{Tool: "lookup"}
	s.srv = httptest.NewServer(http.HandlerFunc(s.handle))
	s.URL = s.srv.URL + "/v1"
	tb.Cleanup(s.srv.Close)
	return s
}

// FailFirst makes the next n requests answer 503.
func (s *Server) FailFirst(n int) {
	s.mu.Lock()
	s.failFirst = n
	s.mu.Unlock()
}

// Requests returns the requests received so far (503s included).
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.Error(w, `{"error":{"message":"not found"}}`, http.StatusNotFound)
		return
	}
	var req Request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, `{"error":{"message":"bad json"}}`, http.StatusBadRequest)
		return
	}
	req.Authorization = r.Header.Get("Authorization")
	s.mu.Lock()
	s.requests = append(s.requests, req)
	fail := s.failFirst > 0
	if fail {
		s.failFirst--
	}
	s.mu.Unlock()
	if fail {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `{"error":{"message":"overloaded","type":"server_error"}}`)
		return
	}
	last := Message{}
	lastUser := ""
	for _, m := range req.Messages {
		last = m
		if m.Role == "user" {
			lastUser = m.Text()
		}
	}
	if strings.Contains(lastUser, "!fail") {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"error":{"message":"the model refuses (!fail)","type":"invalid_request_error"}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(v any) {
		data, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", data)
		_ = rc.Flush()
	}
	chunk := func(delta map[string]any, finish any) map[string]any {
		return map[string]any{"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": time.Now().Unix(), "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}
	}
	usage := func(completion int) {
		prompt := 10 * len(req.Messages)
		send(map[string]any{"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": time.Now().Unix(), "model": req.Model,
			"choices": []any{}, "usage": map[string]any{"prompt_tokens": prompt, "completion_tokens": completion,
				"total_tokens": prompt + completion, "prompt_tokens_details": map[string]any{"cached_tokens": prompt / 2}}})
	}
	text := func(t string) {
		words := strings.SplitAfter(t, " ")
		for i, piece := range words {
			d := map[string]any{"content": piece}
			if i == 0 {
				d["role"] = "assistant"
			}
			send(chunk(d, nil))
		}
		send(chunk(map[string]any{}, "stop"))
		usage(len(words))
		fmt.Fprint(w, "data: [DONE]\n\n")
		_ = rc.Flush()
	}
	switch {
	case last.Role == "tool":
		text("tool said: " + last.Text())
	case strings.Contains(lastUser, "!tool"):
		_, args, _ := strings.Cut(lastUser, "!tool")
		args = strings.TrimSpace(args)
		if args == "" {
			args = "{}"
		}
		id := fmt.Sprintf("call_%d", len(req.Messages))
		send(chunk(map[string]any{"role": "assistant", "content": "Looking it up. "}, nil))
		send(chunk(map[string]any{"tool_calls": []any{map[string]any{"index": 0, "id": id, "type": "function",
			"function": map[string]any{"name": s.Tool, "arguments": ""}}}}, nil))
		half := len(args) / 2
		for _, part := range []string{args[:half], args[half:]} {
			send(chunk(map[string]any{"tool_calls": []any{map[string]any{"index": 0, "function": map[string]any{"arguments": part}}}}, nil))
		}
		send(chunk(map[string]any{}, "tool_calls"))
		usage(5)
		fmt.Fprint(w, "data: [DONE]\n\n")
		_ = rc.Flush()
	case strings.Contains(lastUser, "!sleep"):
		send(chunk(map[string]any{"role": "assistant", "content": "first "}, nil))
		send(chunk(map[string]any{"content": "words"}, nil))
		select {
		case <-r.Context().Done():
		case <-time.After(2 * time.Minute):
		}
	default:
		text("echo: " + lastUser)
	}
}
