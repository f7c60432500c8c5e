package statedb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/agentfleet/agentfleet/broker"
)

// The endpoints of the fleet.api micro service, each at <prefix>.api.<name>.
const (
	EndpointSearch     = "search"
	EndpointSessions   = "sessions"
	EndpointSession    = "session"
	EndpointTranscript = "transcript"
	EndpointStats      = "stats"
	EndpointExport     = "export"
)

// APIVersion is the version the service announces.
const APIVersion = "1.0.0"

// SearchRequest is the body of a search request.
type SearchRequest struct {
	Query          string   `json:"query"`
	Sources        []string `json:"sources,omitempty"`
	ExcludeSources []string `json:"exclude_sources,omitempty"`
	Roles          []string `json:"roles,omitempty"`
	SessionID      string   `json:"session_id,omitempty"`
	Limit          int      `json:"limit,omitempty"`
	Offset         int      `json:"offset,omitempty"`
}

// SearchResponse answers a search.
type SearchResponse struct {
	Results []SearchResult `json:"results"`
}

// SessionsRequest lists sessions, newest first (ended ones included unless
// ActiveOnly), optionally only one lane's (Lane) and only titled ones
// (Titled): the list /resume shows.
type SessionsRequest struct {
	Source     string `json:"source,omitempty"`
	Limit      int    `json:"limit,omitempty"`
	Offset     int    `json:"offset,omitempty"`
	ActiveOnly bool   `json:"active_only,omitempty"`
	Lane       string `json:"lane,omitempty"`
	Titled     bool   `json:"titled,omitempty"`
}

// SessionsResponse answers a sessions request.
type SessionsResponse struct {
	Sessions []Session `json:"sessions"`
}

// SessionRequest names one session by id or by title (a bare title names
// the newest session of its lineage).
type SessionRequest struct {
	ID    string `json:"id,omitempty"`
	Title string `json:"title,omitempty"`
}

// SessionResponse is a session with its ancestors (itself first) and its
// descendants (itself first).
type SessionResponse struct {
	Session     *Session       `json:"session"`
	Ancestors   []LineageEntry `json:"ancestors"`
	Descendants []LineageEntry `json:"descendants"`
}

// TranscriptResponse is a session's live messages in order.
type TranscriptResponse struct {
	SessionID string    `json:"session_id"`
	Messages  []Message `json:"messages"`
}

// ExportRequest exports one session (ID) or a page of all of them (All,
// optionally of one Source, from Offset on, oldest first).
type ExportRequest struct {
	ID     string `json:"id,omitempty"`
	All    bool   `json:"all,omitempty"`
	Source string `json:"source,omitempty"`
	Offset int    `json:"offset,omitempty"`
	Limit  int    `json:"limit,omitempty"`
}

// ExportResponse is a page of exported sessions. Next is the offset of the
// next page, or 0 when this page is the last.
type ExportResponse struct {
	Sessions []ExportedSession `json:"sessions"`
	Next     int               `json:"next,omitempty"`
}

// API serves a DB as the NATS micro service <prefix>_api, endpoints under
// <prefix>.api (discoverable with `nats micro ls`). Every indexer runs one
// instance; requests go to any of them (a queue group).
type API struct {
	svc     micro.Service
	db      *DB
	log     *slog.Logger
	maxSize int
}

// StartAPI registers the service on nc.
func StartAPI(nc *nats.Conn, db *DB, names broker.Names, log *slog.Logger) (*API, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &API{db: db, log: log, maxSize: int(nc.MaxPayload())}
	svc, err := micro.AddService(nc, micro.Config{
		Name:        names.APIService(),
		Version:     APIVersion,
		Description: "agentfleet state database: search, sessions, transcripts, statistics and export",
		Metadata:    map[string]string{"db": db.Path()},
	})
	if err != nil {
		return nil, fmt.Errorf("statedb: api service: %w", err)
	}
	g := svc.AddGroup(names.APIPrefix())
	for name, h := range map[string]func(context.Context, []byte) (any, error){
		EndpointSearch: a.search, EndpointSessions: a.sessions, EndpointSession: a.session,
		EndpointTranscript: a.transcript, EndpointStats: a.stats, EndpointExport: a.export,
	} {
		if err := g.AddEndpoint(name, a.handler(name, h)); err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("statedb: api endpoint %s: %w", name, err)
		}
	}
	a.svc = svc
	// The endpoints answer once the server has the subscriptions: a
	// request sent on another connection right after StartAPI finds them.
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("statedb: api service: %w", err)
	}
	return a, nil
}

// Stop unregisters the service. It is idempotent.
func (a *API) Stop() error {
	if a.svc.Stopped() {
		return nil
	}
	return a.svc.Stop()
}

// apiError is an error with the status code the reply carries.
type apiError struct {
	code string
	err  error
}

func (e *apiError) Error() string { return e.err.Error() }

func badRequest(format string, args ...any) error {
	return &apiError{"400", fmt.Errorf(format, args...)}
}

func (a *API) handler(name string, h func(context.Context, []byte) (any, error)) micro.Handler {
	return micro.HandlerFunc(func(req micro.Request) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		v, err := h(ctx, req.Data())
		var data []byte
		if err == nil {
			data, err = json.Marshal(v)
			if err == nil && len(data) > a.maxSize {
				err = &apiError{"413", fmt.Errorf("the answer is %d bytes, above the server's %d-byte limit: ask for less (limit, one session)", len(data), a.maxSize)}
			}
		}
		if err != nil {
			code := "500"
			var ae *apiError
			switch {
			case errors.As(err, &ae):
				code = ae.code
			case errors.Is(err, ErrNotFound):
				code = "404"
			case errors.Is(err, ErrInvalid):
				code = "400"
			}
			if code == "500" {
				a.log.Warn("api request failed", slog.String("endpoint", name), slog.Any("error", err))
			}
			_ = req.Error(code, err.Error(), nil)
			return
		}
		_ = req.Respond(data)
	})
}

func decode(data []byte, v any) error {
	if len(data) == 0 {
		return nil
	}
	if err := json.Unmarshal(data, v); err != nil {
		return badRequest("request body: %v", err)
	}
	return nil
}

func (a *API) search(ctx context.Context, data []byte) (any, error) {
	var r SearchRequest
	if err := decode(data, &r); err != nil {
		return nil, err
	}
	if r.Query == "" {
		return nil, badRequest("query is empty")
	}
	res, err := a.db.SearchMessages(ctx, r.Query, SearchOptions{Sources: r.Sources, ExcludeSources: r.ExcludeSources,
		Roles: r.Roles, SessionID: r.SessionID, Limit: r.Limit, Offset: r.Offset})
	if err != nil {
		return nil, err
	}
	return SearchResponse{Results: res}, nil
}

func (a *API) sessions(ctx context.Context, data []byte) (any, error) {
	var r SessionsRequest
	if err := decode(data, &r); err != nil {
		return nil, err
	}
	list, err := a.db.ListSessions(ctx, ListOptions{Source: r.Source, Limit: r.Limit, Offset: r.Offset, ActiveOnly: r.ActiveOnly,
		Lane: r.Lane, Titled: r.Titled})
	if err != nil {
		return nil, err
	}
	if list == nil {
		list = []Session{}
	}
	return SessionsResponse{Sessions: list}, nil
}

func (a *API) resolve(ctx context.Context, r SessionRequest) (string, error) {
	switch {
	case r.ID != "":
		return r.ID, nil
	case r.Title != "":
		return a.db.ResolveSessionByTitle(ctx, r.Title)
	}
	return "", badRequest("give a session id or a title")
}

func (a *API) session(ctx context.Context, data []byte) (any, error) {
	var r SessionRequest
	if err := decode(data, &r); err != nil {
		return nil, err
	}
	id, err := a.resolve(ctx, r)
	if err != nil {
		return nil, err
	}
	s, err := a.db.GetSession(ctx, id)
	if err != nil {
		return nil, err
	}
	anc, err := a.db.Ancestors(ctx, id)
	if err != nil {
		return nil, err
	}
	desc, err := a.db.Descendants(ctx, id)
	if err != nil {
		return nil, err
	}
	return SessionResponse{Session: s, Ancestors: anc, Descendants: desc}, nil
}

func (a *API) transcript(ctx context.Context, data []byte) (any, error) {
	var r SessionRequest
	if err := decode(data, &r); err != nil {
		return nil, err
	}
	id, err := a.resolve(ctx, r)
	if err != nil {
		return nil, err
	}
	if _, err := a.db.GetSession(ctx, id); err != nil {
		return nil, err
	}
	msgs, err := a.db.GetMessages(ctx, id)
	if err != nil {
		return nil, err
	}
	return TranscriptResponse{SessionID: id, Messages: msgs}, nil
}

func (a *API) stats(ctx context.Context, _ []byte) (any, error) {
	return a.db.GetStats(ctx)
}

func (a *API) export(ctx context.Context, data []byte) (any, error) {
	var r ExportRequest
	if err := decode(data, &r); err != nil {
		return nil, err
	}
	if r.ID != "" {
		e, err := a.db.ExportSession(ctx, r.ID)
		if err != nil {
			return nil, err
		}
		return ExportResponse{Sessions: []ExportedSession{*e}}, nil
	}
	if !r.All {
		return nil, badRequest("give a session id, or all")
	}
	if r.Limit <= 0 {
		r.Limit = 100
	}
	// A page holds whole sessions up to a budget below the payload limit.
	budget := a.maxSize * 3 / 4
	out := ExportResponse{Sessions: []ExportedSession{}}
	size := 0
	n := 0
	errFull := errors.New("page full")
	err := a.db.ExportAll(ctx, ListOptions{Source: r.Source, Limit: r.Limit + 1, Offset: r.Offset}, func(e *ExportedSession) error {
		if n == r.Limit {
			out.Next = r.Offset + n
			return errFull
		}
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if size+len(b) > budget && n > 0 {
			out.Next = r.Offset + n
			return errFull
		}
		size += len(b)
		n++
		out.Sessions = append(out.Sessions, *e)
		return nil
	})
	if err != nil && !errors.Is(err, errFull) {
		return nil, err
	}
	return out, nil
}
