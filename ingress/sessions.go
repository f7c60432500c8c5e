package ingress

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/session"
)

// maxSessionKeyLength bounds a session key in a path: the namespace, the
// platform and chat type, and three identifiers of session.MaxIDLength.
const maxSessionKeyLength = 64 + 3*(session.MaxIDLength+1)

// sessionKeyFromPath returns the validated {session_key} of the request and
// its lane token.
func sessionKeyFromPath(r *http.Request) (key, lane string, e *apiError) {
	key = r.PathValue("session_key")
	if err := validateSessionKey(key); err != nil {
		return "", "", badRequest("invalid session key: %v", err)
	}
	if e := allowKey(r, key); e != nil {
		return "", "", e
	}
	return key, session.LaneToken(key), nil
}

// validateSessionKey accepts the keys session.BuildSessionKey derives from a
// valid source: agent:<namespace>:<platform>:<chat_type>[:<id>...].
func validateSessionKey(key string) error {
	if key == "" {
		return errors.New("empty")
	}
	if len(key) > maxSessionKeyLength {
		return fmt.Errorf("%d bytes is longer than the limit of %d", len(key), maxSessionKeyLength)
	}
	if !utf8.ValidString(key) {
		return errors.New("not valid UTF-8")
	}
	segs := strings.Split(key, ":")
	if len(segs) < 4 || segs[0] != "agent" || segs[1] == "" {
		return fmt.Errorf("%q does not look like agent:main:<platform>:<chat_type>[:<ids>]", key)
	}
	if p := session.Platform(segs[2]); !p.Known() {
		return fmt.Errorf("unknown platform %q", segs[2])
	}
	if !session.ValidChatType(segs[3]) {
		return fmt.Errorf("invalid chat type %q", segs[3])
	}
	for _, seg := range segs {
		if err := session.ValidateID("segment", seg); err != nil {
			return err
		}
	}
	// Ids inside a key are escaped (':' as %3A, '%' as %25).
	if _, _, _, err := session.SplitSessionKey(key); err != nil {
		return err
	}
	return nil
}

func (s *Server) handleGetSession(w http.ResponseWriter, r *http.Request) {
	key, lane, e := sessionKeyFromPath(r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	ctx, cancel := s.opContext(r)
	defer cancel()
	kve, err := s.res.Sessions.Get(ctx, lane)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		s.writeError(w, r, errorf(http.StatusNotFound, "no session %q", key))
		return
	}
	if err != nil {
		s.writeError(w, r, unavailable("cannot read the session; retry", fmt.Errorf("get session %s: %w", lane, err)))
		return
	}
	var entry session.SessionEntry
	if err := json.Unmarshal(kve.Value(), &entry); err != nil {
		s.log.LogAttrs(r.Context(), slog.LevelError, "unreadable session entry",
			slog.String("session_key", key), slog.Uint64("revision", kve.Revision()), slog.Any("error", err))
		s.writeError(w, r, &apiError{status: http.StatusInternalServerError, msg: "the stored session entry is unreadable", err: err})
		return
	}
	writeJSON(w, http.StatusOK, &entry)
}
