package ingress

import (
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"net/http"
	"strings"

	"github.com/agentfleet/agentfleet/ingress/console"
)

// isAdminToken is the one check of an admin token: the operations console
// admits exactly the tokens it accepts. Today that is the HTTP API's token
// (Config.Token); without one the console is closed.
func (s *Server) isAdminToken(token string) bool {
	if s.cfg.Token == "" {
		return false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
	return subtle.ConstantTimeCompare(sum[:], s.tokenSum[:]) == 1
}

// mountConsole serves the operations console under /console.
func (s *Server) mountConsole(mux *http.ServeMux) {
	h := s.consoleHandler()
	mux.Handle(console.Prefix, h)
	mux.Handle(console.Prefix+"/", h)
}

// consoleHandler is the operations console, served under /console.
func (s *Server) consoleHandler() http.Handler {
	c, err := console.New(console.Config{JS: s.js, Names: s.names, Authorize: s.isAdminToken, Logger: s.log,
		Timeout: 2 * s.cfg.PublishTimeout, Heartbeat: s.cfg.EventsHeartbeat, Closed: s.closed})
	if err != nil {
		// The console's templates are embedded and parsed by its tests:
		// this is a build defect, reported on every console request.
		s.log.Error("console unavailable", slog.Any("error", err))
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.writeError(w, r, errorf(http.StatusInternalServerError, "the console is unavailable: %v", err))
		})
	}
	return c
}
