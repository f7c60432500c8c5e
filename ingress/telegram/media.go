package telegram

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
)

// TelegramFile is the answer of getFile.
type TelegramFile struct {
	FileID   string `json:"file_id"`
	FileSize int64  `json:"file_size,omitempty"`
	// FilePath is the file's path under <base>/file/bot<token>/; the link
	// is valid for at least an hour, and needs the token.
	FilePath string `json:"file_path,omitempty"`
}

// GetFile asks where a file can be downloaded.
func (c *Client) GetFile(ctx context.Context, fileID string) (*TelegramFile, error) {
	var f TelegramFile
	if err := c.call(ctx, "getFile", map[string]any{"file_id": fileID}, &f); err != nil {
		return nil, err
	}
	return &f, nil
}

// FetchMedia implements ingress.MediaFetcher: getFile, then the download
// from <base>/file/bot<token>/<file_path>. The token stays inside this
// client: errors are redacted, and the caller only ever sees the bytes. A
// file id Telegram does not know wraps ingress.ErrMediaNotFound.
func (c *Client) FetchMedia(ctx context.Context, fileID string) (*ingress.MediaFile, error) {
	f, err := c.GetFile(ctx, fileID)
	var ae *APIError
	if errors.As(err, &ae) && (ae.Code == http.StatusBadRequest && strings.Contains(strings.ToLower(ae.Description), "file_id") || ae.Code == http.StatusNotFound) {
		return nil, fmt.Errorf("%w: %v", ingress.ErrMediaNotFound, err)
	}
	if err != nil {
		return nil, err
	}
	if f.FilePath == "" {
		return nil, fmt.Errorf("telegram getFile: no file_path for this file (too large for bots to download?)")
	}
	u := c.base + "/file/bot" + c.token + "/" + (&url.URL{Path: f.FilePath}).EscapedPath()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("telegram file download: %w", redact(err, c.token))
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("telegram file download: %w", redact(err, c.token))
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		resp.Body.Close()
		return nil, fmt.Errorf("%w: telegram file download: 404", ingress.ErrMediaNotFound)
	case resp.StatusCode != http.StatusOK:
		resp.Body.Close()
		return nil, fmt.Errorf("telegram file download: %s", resp.Status)
	}
	return &ingress.MediaFile{Body: resp.Body, ContentType: resp.Header.Get("Content-Type"), Size: resp.ContentLength}, nil
}

// MediaHandler returns the handler of GET /v1/media/telegram/<file id>,
// which serves the files the adapter's links point at (see
// ingress.MediaHandler); maxBytes 0 takes ingress.DefaultMaxMediaBytes.
func (a *Adapter) MediaHandler(maxBytes int64) (http.Handler, error) {
	return ingress.MediaHandler(ingress.MediaHandlerConfig{Platform: session.PlatformTelegram, Key: ingress.MediaKey(a.cfg.Token),
		Fetcher: a.client, MaxBytes: maxBytes, Logger: a.log})
}

// linkMedia gives each attachment of m its URL on the media endpoint, when
// the adapter knows the endpoint's public base URL.
func (a *Adapter) linkMedia(m *ingress.Message) {
	if a.linker == nil {
		return
	}
	for i := range m.Attachments {
		m.Attachments[i].URL = a.linker.Link(m.Attachments[i].FileID)
	}
}
