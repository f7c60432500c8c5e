package whatsapp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/ingress"
)

// APIError is an error answer of the Graph API.
type APIError struct {
	Status     int
	Code       int
	Subcode    int
	Message    string
	Details    string
	RetryAfter time.Duration
}

func (e *APIError) Error() string {
	s := fmt.Sprintf("whatsapp: HTTP %d", e.Status)
	if e.Code != 0 {
		s += fmt.Sprintf(", error %d", e.Code)
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.Details != "" {
		s += " (" + e.Details + ")"
	}
	return s
}

// Codes of the Graph API's errors the sender tells apart.
const (
	codeReengagement = 131047 // more than 24 hours since the user last wrote
	codeThroughput   = 130429 // cloud API throughput reached
	codePairRate     = 131056 // too many messages to this user
	codeSpamRate     = 131048
	codeAppRate      = 4
	codeAccountRate  = 80007
)

// Sender returns the ingress.Sender that posts text replies with
// POST /{phone_number_id}/messages, after checking the lane's
// customer-service window.
func (a *Adapter) Sender() ingress.Sender { return sender{a} }

type sender struct{ a *Adapter }

func (s sender) Send(ctx context.Context, t ingress.Target, text string) error {
	a := s.a
	if a.cfg.AccessToken == "" || a.cfg.PhoneNumberID == "" {
		return &ingress.SendError{Permanent: true, Err: errors.New("whatsapp: access_token and phone_number_id must be set to send")}
	}
	last, err := a.lastInbound(ctx, WindowKey(t.SessionKey))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return &ingress.SendError{Permanent: true, Err: fmt.Errorf("%w: the user has not written to this number; only a template message can reach them", ErrOutsideWindow)}
	case err != nil:
		return &ingress.SendError{Err: fmt.Errorf("whatsapp: reading the customer-service window: %w", err)}
	}
	if age := a.cfg.Now().Sub(last); age >= Window {
		return &ingress.SendError{Permanent: true, Err: fmt.Errorf("%w: the user last wrote at %s (%s ago); only a template message can reach them",
			ErrOutsideWindow, last.Format(time.RFC3339), age.Truncate(time.Minute))}
	}
	if _, err := a.sendText(ctx, t.ChatID, text); err != nil {
		return sendError(err)
	}
	return nil
}

// sendText posts a text message and returns its wamid.
func (a *Adapter) sendText(ctx context.Context, to, text string) (string, error) {
	body, _ := json.Marshal(map[string]any{
		"messaging_product": "whatsapp",
		"recipient_type":    "individual",
		"to":                to,
		"type":              "text",
		"text":              map[string]any{"preview_url": false, "body": text},
	})
	u := a.cfg.APIBase + "/" + url.PathEscape(a.cfg.PhoneNumberID) + "/messages"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+a.cfg.AccessToken)
	resp, err := a.cfg.HTTPClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", &APIError{Status: resp.StatusCode, Message: "reading the answer: " + err.Error()}
	}
	if resp.StatusCode/100 == 2 {
		var ok struct {
			Messages []struct {
				ID string `json:"id"`
			} `json:"messages"`
		}
		if json.Unmarshal(data, &ok) == nil && len(ok.Messages) > 0 {
			return ok.Messages[0].ID, nil
		}
		return "", nil
	}
	var e struct {
		Error struct {
			Message   string `json:"message"`
			Code      int    `json:"code"`
			Subcode   int    `json:"error_subcode"`
			ErrorData struct {
				Details string `json:"details"`
			} `json:"error_data"`
		} `json:"error"`
	}
	_ = json.Unmarshal(data, &e)
	ae := &APIError{Status: resp.StatusCode, Code: e.Error.Code, Subcode: e.Error.Subcode, Message: e.Error.Message, Details: e.Error.ErrorData.Details}
	if ae.Message == "" {
		ae.Message = http.StatusText(resp.StatusCode)
	}
	if sec, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && sec > 0 {
		ae.RetryAfter = time.Duration(sec) * time.Second
	}
	return "", ae
}

// sendError classifies a failed send.
func sendError(err error) error {
	var ae *APIError
	if errors.As(err, &ae) {
		switch {
		case ae.Code == codeReengagement:
			return &ingress.SendError{Permanent: true, Err: fmt.Errorf("%w: %w", ErrOutsideWindow, err)}
		case ae.Status == http.StatusTooManyRequests, ae.Code == codeThroughput, ae.Code == codePairRate,
			ae.Code == codeSpamRate, ae.Code == codeAppRate, ae.Code == codeAccountRate:
			return &ingress.SendError{RetryAfter: max(ae.RetryAfter, time.Second), Err: err}
		case ae.Status >= 500:
			return &ingress.SendError{Ambiguous: true, Err: err}
		}
		// 400 invalid recipient, 401 bad token, 403, 404 unknown number id.
		return &ingress.SendError{Permanent: true, Err: err}
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return &ingress.SendError{Err: err}
	}
	return &ingress.SendError{Ambiguous: true, Err: err}
}
