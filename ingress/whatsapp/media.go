package whatsapp

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
)

// FetchMedia implements ingress.MediaFetcher: GET /{media id} for the
// media's short-lived download URL, then the download, both with the
// access token (which never leaves the ingress). A media id the Graph API
// does not know wraps ingress.ErrMediaNotFound.
func (a *Adapter) FetchMedia(ctx context.Context, mediaID string) (*ingress.MediaFile, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.cfg.APIBase+"/"+url.PathEscape(mediaID), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+a.cfg.AccessToken)
	resp, err := a.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("whatsapp media lookup: %w", err)
	}
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusBadRequest:
		return nil, fmt.Errorf("%w: whatsapp media %s: %s", ingress.ErrMediaNotFound, mediaID, resp.Status)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("whatsapp media lookup: %s", resp.Status)
	}
	var info struct {
		URL      string `json:"url"`
		MimeType string `json:"mime_type"`
		FileSize int64  `json:"file_size"`
	}
	if json.Unmarshal(data, &info) != nil || info.URL == "" {
		return nil, fmt.Errorf("whatsapp media lookup: no download url in the answer")
	}
	dl, err := http.NewRequestWithContext(ctx, http.MethodGet, info.URL, nil)
	if err != nil {
		return nil, fmt.Errorf("whatsapp media download: %w", err)
	}
	dl.Header.Set("Authorization", "Bearer "+a.cfg.AccessToken)
	resp, err = a.cfg.HTTPClient.Do(dl)
	if err != nil {
		return nil, fmt.Errorf("whatsapp media download: %w", err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		resp.Body.Close()
		return nil, fmt.Errorf("%w: whatsapp media download: 404", ingress.ErrMediaNotFound)
	case resp.StatusCode != http.StatusOK:
		resp.Body.Close()
		return nil, fmt.Errorf("whatsapp media download: %s", resp.Status)
	}
	ct := resp.Header.Get("Content-Type")
	if ct == "" {
		ct = info.MimeType
	}
	return &ingress.MediaFile{Body: resp.Body, ContentType: ct, Size: resp.ContentLength}, nil
}

// MediaHandler returns the handler of GET /v1/media/whatsapp/<media id>,
// which serves the files the adapter's links point at (see
// ingress.MediaHandler). maxBytes 0 means the default bound.
func (a *Adapter) MediaHandler(maxBytes int64) (http.Handler, error) {
	return ingress.MediaHandler(ingress.MediaHandlerConfig{Platform: session.PlatformWhatsApp, Key: ingress.MediaKey(a.cfg.AccessToken),
		Fetcher: ingress.MediaFetcherFunc(a.FetchMedia), MaxBytes: maxBytes, Logger: a.log})
}

// link gives m's attachments their media endpoint URLs.
func (a *Adapter) link(m *ingress.Message) {
	if a.linker == nil {
		return
	}
	for i := range m.Attachments {
		m.Attachments[i].URL = a.linker.Link(m.Attachments[i].FileID)
	}
}
