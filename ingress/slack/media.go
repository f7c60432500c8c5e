package slack

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	slackapi "github.com/slack-go/slack"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
)

// FetchMedia implements ingress.MediaFetcher: files.info for the file's
// url_private_download, then the download with the bot token as a bearer
// token (the Slack client sends it only to Slack's own https hosts or the
// configured API host). A file Slack does not know (or deleted) wraps
// ingress.ErrMediaNotFound.
func (a *Adapter) FetchMedia(ctx context.Context, fileID string) (*ingress.MediaFile, error) {
	f, _, _, err := a.api.GetFileInfoContext(ctx, fileID, 0, 0)
	var se slackapi.SlackErrorResponse
	if errors.As(err, &se) && (se.Err == "file_not_found" || se.Err == "file_deleted") {
		return nil, fmt.Errorf("%w: files.info: %s", ingress.ErrMediaNotFound, se.Err)
	}
	if err != nil {
		return nil, fmt.Errorf("slack files.info: %w", err)
	}
	u := f.URLPrivateDownload
	if u == "" {
		u = f.URLPrivate
	}
	if u == "" || f.Mode == "tombstone" {
		return nil, fmt.Errorf("%w: slack file %s has nothing to download", ingress.ErrMediaNotFound, fileID)
	}
	// The client downloads into a writer: pipe it into the body the
	// endpoint streams. Closing the body ends the download.
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(a.api.GetFileContext(ctx, u, pw))
	}()
	// Wait for the first byte, so a refused download is an error here and
	// not a truncated answer.
	br := bufio.NewReader(pr)
	if _, err := br.Peek(1); err != nil && !errors.Is(err, io.EOF) {
		pr.Close()
		var sc slackapi.StatusCodeError
		if errors.As(err, &sc) && sc.Code == http.StatusNotFound {
			return nil, fmt.Errorf("%w: slack file download: %v", ingress.ErrMediaNotFound, err)
		}
		return nil, fmt.Errorf("slack file download: %w", err)
	}
	return &ingress.MediaFile{Body: readCloser{br, pr}, ContentType: f.Mimetype, Size: -1}, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// MediaHandler returns the handler of GET /v1/media/slack/<file id>,
// which serves the files the adapter's links point at (see
// ingress.MediaHandler); maxBytes 0 takes ingress.DefaultMaxMediaBytes.
func (a *Adapter) MediaHandler(maxBytes int64) (http.Handler, error) {
	if a.cfg.BotToken == "" {
		return nil, fmt.Errorf("%w: slack: the media endpoint needs the bot token", ingress.ErrInvalidConfig)
	}
	return ingress.MediaHandler(ingress.MediaHandlerConfig{Platform: session.PlatformSlack, Key: ingress.MediaKey(a.cfg.BotToken),
		Fetcher: a, MaxBytes: maxBytes, Logger: a.log})
}

// linkMedia gives each attachment of m its URL on the media endpoint, when
// the adapter knows the endpoint's public base URL.
func (a *Adapter) linkMedia(m *ingress.Message) {
	if a.linker == nil {
		return
	}
	for i := range m.Attachments {
		if strings.TrimSpace(m.Attachments[i].FileID) != "" {
			m.Attachments[i].URL = a.linker.Link(m.Attachments[i].FileID)
		}
	}
}
