package ingress

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/agentfleet/agentfleet/session"
)

// The media endpoint.
//
// Attachments travel through the fleet as references (session.Attachment):
// the platform's file id and a URL the agent can fetch, never the bytes.
// Some platforms serve files only with the bot's credential — Telegram's
// file URLs embed the bot token, Slack's url_private needs the bot token as
// a bearer token. Such a URL must never be written into an inbox message,
// a transcript or a model prompt. So the adapters of those platforms give
// attachments a link to the ingress's own media endpoint instead:
//
//	GET /v1/media/<platform>/<file id>?sig=<signature>
//
// The ingress checks the signature, fetches the file from the platform with
// the credential (MediaFetcher) and streams it to the caller. The signature
// is an HMAC-SHA256 of the platform and the file id under a key derived from
// the platform credential (MediaKey), so every ingress of a fleet verifies
// the links any of them made, no extra secret needs configuring, and a link
// stops working when the credential is rotated. A link is a capability: who
// holds it (the agent, and whoever reads the transcript) can fetch that one
// file, and no other; it does not expire, so a session's history stays
// resolvable as long as the platform keeps the file.

// MediaPathPrefix is the path under which the media endpoint is served.
const MediaPathPrefix = "/v1/media/"

// DefaultMaxMediaBytes bounds a file the media endpoint streams (Telegram's
// bots can download at most 20 MB; Slack files are larger, agents rarely
// need them whole).
const DefaultMaxMediaBytes int64 = 100 << 20

// ErrMediaNotFound is returned by a MediaFetcher for a file the platform
// does not know (or no longer keeps): the endpoint answers 404.
var ErrMediaNotFound = errors.New("media not found")

// MediaFile is a file being fetched from a platform. The caller closes Body.
type MediaFile struct {
	Body io.ReadCloser
	// ContentType is the file's media type, "" when unknown.
	ContentType string
	// Size is the file's length in bytes, -1 when unknown.
	Size int64
}

// MediaFetcher fetches a platform file by its file id, with the adapter's
// credentials. An error wrapping ErrMediaNotFound means the file is gone.
type MediaFetcher interface {
	FetchMedia(ctx context.Context, fileID string) (*MediaFile, error)
}

// MediaFetcherFunc adapts a function to MediaFetcher.
type MediaFetcherFunc func(ctx context.Context, fileID string) (*MediaFile, error)

// FetchMedia calls f.
func (f MediaFetcherFunc) FetchMedia(ctx context.Context, fileID string) (*MediaFile, error) {
	return f(ctx, fileID)
}

// MediaKey derives the signing key of a platform's media links from its
// credential (a bot token, a signing secret). Empty credential, nil key.
func MediaKey(credential string) []byte {
	if credential == "" {
		return nil
	}
	m := hmac.New(sha256.New, []byte(credential))
	m.Write([]byte("agentfleet media link v1"))
	return m.Sum(nil)
}

// MediaLinker makes the media links of one platform.
type MediaLinker struct {
	base     string
	platform session.Platform
	key      []byte
}

// NewMediaLinker returns the linker of platform p: links start with base,
// the URL at which agents reach the ingress (e.g. "http://ingress:8080"),
// and are signed with key (MediaKey of the platform's credential).
func NewMediaLinker(base string, p session.Platform, key []byte) (*MediaLinker, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("%w: media base URL %q must be an absolute http or https URL without user info, query or fragment", ErrInvalidConfig, base)
	}
	if !p.Known() {
		return nil, fmt.Errorf("%w: media links of unknown platform %q", ErrInvalidConfig, p)
	}
	if len(key) == 0 {
		return nil, fmt.Errorf("%w: media links of %s need a signing key", ErrInvalidConfig, p)
	}
	return &MediaLinker{base: strings.TrimRight(base, "/"), platform: p, key: key}, nil
}

// Link returns the media endpoint's URL of a file.
func (l *MediaLinker) Link(fileID string) string {
	return l.base + MediaPathPrefix + string(l.platform) + "/" + url.PathEscape(fileID) + "?sig=" + mediaSig(l.key, l.platform, fileID)
}

// mediaSig is the signature of a link: 128 bits of HMAC-SHA256 over the
// platform and the file id, in hex.
func mediaSig(key []byte, p session.Platform, fileID string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(p))
	m.Write([]byte{0})
	m.Write([]byte(fileID))
	return hex.EncodeToString(m.Sum(nil)[:16])
}

// MediaHandlerConfig configures a MediaHandler.
type MediaHandlerConfig struct {
	Platform session.Platform
	// Key is the signing key of the platform's links (MediaKey).
	Key     []byte
	Fetcher MediaFetcher
	// MaxBytes bounds a streamed file; a larger one is answered 413.
	// Defaults to DefaultMaxMediaBytes.
	MaxBytes int64
	// Logger defaults to a discard logger.
	Logger *slog.Logger
}

// MediaHandler serves GET /v1/media/<platform>/{file_id}?sig=... for one
// platform: 403 without a valid signature (nothing is fetched), 404 for a
// file the platform does not have, 413 for one above MaxBytes, 502 when the
// platform fails; else the file's bytes with its Content-Type.
func MediaHandler(cfg MediaHandlerConfig) (http.Handler, error) {
	if !cfg.Platform.Known() || len(cfg.Key) == 0 || cfg.Fetcher == nil {
		return nil, fmt.Errorf("%w: a media handler needs a known platform, a key and a fetcher", ErrInvalidConfig)
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxMediaBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	prefix := MediaPathPrefix + string(cfg.Platform) + "/"
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeJSON(w, http.StatusMethodNotAllowed, errorBody{Error: "use GET"})
			return
		}
		raw := strings.TrimPrefix(r.URL.EscapedPath(), prefix)
		if raw == r.URL.EscapedPath() || raw == "" || strings.Contains(raw, "/") {
			writeJSON(w, http.StatusNotFound, errorBody{Error: "no such media path; want " + prefix + "<file id>?sig=<signature>"})
			return
		}
		fileID, err := url.PathUnescape(raw)
		if err != nil {
			writeJSON(w, http.StatusNotFound, errorBody{Error: "malformed file id in the path"})
			return
		}
		want := mediaSig(cfg.Key, cfg.Platform, fileID)
		if !hmac.Equal([]byte(r.URL.Query().Get("sig")), []byte(want)) {
			writeJSON(w, http.StatusForbidden, errorBody{Error: "missing or invalid media link signature"})
			return
		}
		f, err := cfg.Fetcher.FetchMedia(r.Context(), fileID)
		if errors.Is(err, ErrMediaNotFound) {
			writeJSON(w, http.StatusNotFound, errorBody{Error: "the platform has no such file (any more)"})
			return
		}
		if err != nil {
			cfg.Logger.Warn("media fetch failed", slog.String("platform", string(cfg.Platform)), slog.Any("error", err))
			writeJSON(w, http.StatusBadGateway, errorBody{Error: "the file could not be fetched from " + string(cfg.Platform) + "; retry"})
			return
		}
		defer f.Body.Close()
		if f.Size > cfg.MaxBytes {
			writeJSON(w, http.StatusRequestEntityTooLarge, errorBody{Error: fmt.Sprintf("the file is %d bytes, more than the %d this endpoint streams", f.Size, cfg.MaxBytes)})
			return
		}
		ct := f.ContentType
		if ct == "" {
			ct = "application/octet-stream"
		}
		h := w.Header()
		h.Set("Content-Type", ct)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Cache-Control", "private, max-age=3600")
		if f.Size >= 0 {
			h.Set("Content-Length", strconv.FormatInt(f.Size, 10))
		}
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodHead {
			return
		}
		// A platform that sends more than it announced, or than the bound,
		// is cut: the client sees a short body (or a reset connection).
		limit := cfg.MaxBytes
		if f.Size >= 0 {
			limit = f.Size
		}
		_, _ = io.Copy(w, io.LimitReader(f.Body, limit))
	}), nil
}
