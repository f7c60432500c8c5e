package telegram

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agentfleet/agentfleet/ingress"
)

// DefaultAPIBase is the Bot API's public URL.
const DefaultAPIBase = "https://api.telegram.org"

// maxResponseBytes caps a Bot API answer (a getUpdates batch of 100 updates
// stays far below).
const maxResponseBytes = 16 << 20

// Client calls the Bot API methods the adapter needs, at a configurable base
// URL (tests point it at a local server that speaks the same API).
//
// The Bot API is JSON over HTTPS with a uniform envelope
// {"ok", "result", "error_code", "description", "parameters"}; the
// adapter needs four methods and exact control of how each failure is
// classified (flood control, ambiguous outcomes), so it uses net/http
// directly rather than a client library.
type Client struct {
	base  string
	token string
	hc    *http.Client
}

// NewClient returns a client for the bot token at base (DefaultAPIBase when
// empty). hc nil means a client without an overall timeout: every call is
// bounded by its context.
func NewClient(base, token string, hc *http.Client) *Client {
	if base == "" {
		base = DefaultAPIBase
	}
	if hc == nil {
		hc = &http.Client{}
	}
	return &Client{base: strings.TrimRight(base, "/"), token: token, hc: hc}
}

// APIError is an answer with "ok": false.
type APIError struct {
	Code        int
	Description string
	// RetryAfter is parameters.retry_after (flood control), 0 if absent.
	RetryAfter time.Duration
	// MigrateTo is parameters.migrate_to_chat_id: the group became a
	// supergroup with this id.
	MigrateTo int64
}

func (e *APIError) Error() string {
	return fmt.Sprintf("telegram: %d %s", e.Code, e.Description)
}

// TransportError is a failed request. Sent reports whether the request may
// have reached Telegram (anything after the connection was made).
type TransportError struct {
	Method string
	Sent   bool
	Err    error
}

func (e *TransportError) Error() string { return "telegram " + e.Method + ": " + e.Err.Error() }
func (e *TransportError) Unwrap() error { return e.Err }

type envelope struct {
	OK          bool            `json:"ok"`
	Result      json.RawMessage `json:"result"`
	ErrorCode   int             `json:"error_code"`
	Description string          `json:"description"`
	Parameters  *struct {
		RetryAfter      int   `json:"retry_after"`
		MigrateToChatID int64 `json:"migrate_to_chat_id"`
	} `json:"parameters"`
}

// call POSTs params as JSON to method and decodes the result into out.
func (c *Client) call(ctx context.Context, method string, params, out any) error {
	body, err := json.Marshal(params)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/bot"+c.token+"/"+method, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("telegram %s: %w", method, redact(err, c.token))
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return &TransportError{Method: method, Sent: !isDialError(err), Err: redact(err, c.token)}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return &TransportError{Method: method, Sent: true, Err: err}
	}
	var env envelope
	if err := json.Unmarshal(data, &env); err != nil {
		// Not the Bot API's envelope (a proxy's error page).
		ae := &APIError{Code: resp.StatusCode, Description: http.StatusText(resp.StatusCode)}
		if resp.StatusCode < 300 {
			return &TransportError{Method: method, Sent: true, Err: fmt.Errorf("unreadable answer: %w", err)}
		}
		ae.RetryAfter = retryAfterHeader(resp.Header)
		return ae
	}
	if !env.OK {
		ae := &APIError{Code: env.ErrorCode, Description: env.Description}
		if ae.Code == 0 {
			ae.Code = resp.StatusCode
		}
		if env.Parameters != nil {
			ae.RetryAfter = time.Duration(env.Parameters.RetryAfter) * time.Second
			ae.MigrateTo = env.Parameters.MigrateToChatID
		}
		if ae.Code == http.StatusTooManyRequests && ae.RetryAfter == 0 {
			ae.RetryAfter = max(retryAfterHeader(resp.Header), time.Second)
		}
		return ae
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(env.Result, out); err != nil {
		return &TransportError{Method: method, Sent: true, Err: fmt.Errorf("unreadable result: %w", err)}
	}
	return nil
}

func retryAfterHeader(h http.Header) time.Duration {
	if s, err := strconv.Atoi(h.Get("Retry-After")); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return 0
}

// isDialError reports a failure before the request could reach the server.
func isDialError(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}

// redact removes the token from an error (url.Error quotes the URL, which
// holds it).
func redact(err error, token string) error {
	if token == "" || !strings.Contains(err.Error(), token) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), token, "<token>"))
}

// BotUser is the answer of getMe.
type BotUser struct {
	ID       int64  `json:"id"`
	IsBot    bool   `json:"is_bot"`
	Username string `json:"username"`
}

// GetMe returns the bot's own user.
func (c *Client) GetMe(ctx context.Context) (*BotUser, error) {
	var u BotUser
	if err := c.call(ctx, "getMe", struct{}{}, &u); err != nil {
		return nil, err
	}
	return &u, nil
}

// GetUpdates long-polls for updates from offset on; timeout is the long
// poll's duration on Telegram's side.
func (c *Client) GetUpdates(ctx context.Context, offset int64, timeout time.Duration, allowed []string) ([]json.RawMessage, error) {
	params := map[string]any{"offset": offset, "timeout": int(timeout / time.Second), "limit": 100, "allowed_updates": allowed}
	var ups []json.RawMessage
	if err := c.call(ctx, "getUpdates", params, &ups); err != nil {
		return nil, err
	}
	return ups, nil
}

// DeleteWebhook removes a webhook, so getUpdates works; pending updates are
// kept.
func (c *Client) DeleteWebhook(ctx context.Context) error {
	return c.call(ctx, "deleteWebhook", map[string]any{"drop_pending_updates": false}, nil)
}

// SendMessage posts plain text (no parse mode: the agent's Markdown is
// shown as written, never refused as malformed entities) to chat, in the
// forum topic thread when not 0.
func (c *Client) SendMessage(ctx context.Context, chat string, thread int64, text string) error {
	_, err := c.PostMessage(ctx, chat, thread, text)
	return err
}

// PostMessage is SendMessage that returns the new message's message_id.
func (c *Client) PostMessage(ctx context.Context, chat string, thread int64, text string) (int64, error) {
	params := map[string]any{"chat_id": chat, "text": text}
	if thread != 0 {
		params["message_thread_id"] = thread
	}
	var msg struct {
		MessageID int64 `json:"message_id"`
	}
	if err := c.call(ctx, "sendMessage", params, &msg); err != nil {
		return 0, err
	}
	return msg.MessageID, nil
}

// EditMessageText replaces the text of message id in chat (plain text, as
// SendMessage). Telegram refuses an edit to the same text with 400 "message
// is not modified"; that answer is a success here.
func (c *Client) EditMessageText(ctx context.Context, chat string, id int64, text string) error {
	err := c.call(ctx, "editMessageText", map[string]any{"chat_id": chat, "message_id": id, "text": text}, nil)
	var ae *APIError
	if errors.As(err, &ae) && ae.Code == http.StatusBadRequest && strings.Contains(ae.Description, "message is not modified") {
		return nil
	}
	return err
}

// sendError classifies a SendMessage failure for the delivery.
func sendError(err error) error {
	var ae *APIError
	var te *TransportError
	switch {
	case errors.As(err, &ae):
		switch {
		case ae.Code == http.StatusTooManyRequests:
			return &ingress.SendError{RetryAfter: max(ae.RetryAfter, time.Second), Err: err}
		case ae.Code >= 500:
			return &ingress.SendError{Ambiguous: true, Err: err}
		case ae.Code == http.StatusUnauthorized:
			// A revoked or mistyped token: retried within the budget, so
			// fixing the configuration in time delivers the reply.
			return &ingress.SendError{Err: err}
		default:
			return &ingress.SendError{Permanent: true, Err: err}
		}
	case errors.As(err, &te):
		return &ingress.SendError{Ambiguous: te.Sent, Err: err}
	}
	return &ingress.SendError{Ambiguous: true, Err: err}
}
