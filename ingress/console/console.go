// Package console is the operations console: web pages that show a live
// fleet (lanes, sessions and their transcripts, workers, dead letters,
// turn charts, events) and act on it through the lane protocol, as
// fleetctl's admin commands do (package admin holds what both do).
//
// The console holds no state of its own: every page is read from the
// fleet's streams and buckets, the state database's fleet.api service and
// the events stream when it is asked for. Pages are rendered on the server
// (html/template, embedded); the live parts (the lanes table, the events
// tail) are server-sent events applied by a small script of the console's
// own, and every page works without it. Nothing is loaded from elsewhere:
// the console works offline.
package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/admin"
	"github.com/agentfleet/agentfleet/broker"
)

// Prefix is the path the console is served under.
const Prefix = "/console"

// CookieName is the cookie that carries the admin token after the login
// form.
const CookieName = "agentfleet_console"

//go:embed assets templates
var files embed.FS

// Config configures the console.
type Config struct {
	// JS is the fleet's JetStream context.
	JS jetstream.JetStream
	// Names are the fleet's names.
	Names broker.Names
	// Authorize says whether token is an admin token. It is the console's
	// one access check: every page and action goes through it. Nil refuses
	// every token (the console is then closed).
	Authorize func(token string) bool
	// Logger receives structured logs. Defaults to a discard logger.
	Logger *slog.Logger
	// Timeout bounds the fleet reads of one page. Defaults to 10s.
	Timeout time.Duration
	// Heartbeat is the interval of the comment lines that keep an idle
	// event stream open. Defaults to 15s.
	Heartbeat time.Duration
	// Refresh is how often the lanes stream re-reads every lane shown, for
	// what no bucket watch reports (inbox backlogs). Defaults to 5s.
	Refresh time.Duration
	// Closed ends every event stream when it is done (server shutdown).
	Closed context.Context
}

// Console serves the console's pages.
type Console struct {
	cfg  Config
	log  *slog.Logger
	tmpl map[string]*template.Template
	mux  *http.ServeMux

	fleetMu sync.Mutex
	fleet   *admin.Fleet

	histMu sync.Mutex
	hist   *admin.History
	histAt time.Time
}

// New returns the console.
func New(cfg Config) (*Console, error) {
	if cfg.JS == nil {
		return nil, errors.New("console: JetStream is nil")
	}
	if cfg.Names.Prefix() == "" {
		cfg.Names = broker.MustNames(broker.DefaultPrefix)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 15 * time.Second
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = 5 * time.Second
	}
	if cfg.Closed == nil {
		cfg.Closed = context.Background()
	}
	c := &Console{cfg: cfg, log: cfg.Logger}
	if err := c.parseTemplates(); err != nil {
		return nil, err
	}
	c.routes()
	return c, nil
}

func (c *Console) routes() {
	mux := http.NewServeMux()
	assets, _ := fs.Sub(files, "assets")
	static := http.StripPrefix(Prefix+"/static/", http.FileServer(http.FS(assets)))
	mux.Handle("GET "+Prefix+"/static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=300")
		static.ServeHTTP(w, r)
	}))
	mux.HandleFunc("GET "+Prefix+"/login", c.handleLoginForm)
	mux.HandleFunc("POST "+Prefix+"/login", c.handleLogin)
	mux.Handle("POST "+Prefix+"/logout", c.authed(c.handleLogout))
	mux.Handle("GET "+Prefix+"/{$}", http.RedirectHandler(Prefix+"/fleet", http.StatusSeeOther))
	mux.Handle("GET "+Prefix, http.RedirectHandler(Prefix+"/fleet", http.StatusSeeOther))
	mux.Handle("GET "+Prefix+"/fleet", c.authed(c.handleFleet))
	mux.Handle("GET "+Prefix+"/lanes", c.authed(c.handleLanes))
	mux.Handle("GET "+Prefix+"/lanes/stream", c.authed(c.handleLanesStream))
	mux.Handle("GET "+Prefix+"/session/{id}", c.authed(c.handleSession))
	mux.Handle("GET "+Prefix+"/search", c.authed(c.handleSearch))
	mux.Handle("GET "+Prefix+"/deadletters", c.authed(c.handleDeadLetters))
	mux.Handle("GET "+Prefix+"/events", c.authed(c.handleEvents))
	mux.Handle("GET "+Prefix+"/events/stream", c.authed(c.handleEventsStream))
	mux.Handle("GET "+Prefix+"/confirm", c.authed(c.handleConfirm))
	mux.Handle("POST "+Prefix+"/action", c.authed(c.handleAction))
	mux.Handle(Prefix+"/", c.authed(func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, http.StatusNotFound, fmt.Errorf("no console page %s %s", r.Method, r.URL.Path))
	}))
	c.mux = mux
}

// ServeHTTP serves every path under Prefix.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// Everything the pages use is the console's own.
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; form-action 'self'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	c.mux.ServeHTTP(w, r)
}

// token is the admin token of a request: a bearer token, else the login
// cookie's.
func token(r *http.Request) string {
	if auth := r.Header.Get("Authorization"); auth != "" {
		if scheme, tok, ok := strings.Cut(auth, " "); ok && strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(tok)
		}
		return ""
	}
	if ck, err := r.Cookie(CookieName); err == nil {
		if v, err := url.QueryUnescape(ck.Value); err == nil {
			return v
		}
	}
	return ""
}

func (c *Console) admitted(tok string) bool {
	return tok != "" && c.cfg.Authorize != nil && c.cfg.Authorize(tok)
}

// sameOrigin says whether a state-changing request comes from the
// console's own pages: a browser sends Origin (or at least Referer) with
// every POST; a request with neither is not a browser's (curl with a
// bearer token), which a cross-site page cannot forge.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		o = r.Header.Get("Referer")
	}
	if o == "" || o == "null" {
		return o == "" && r.Header.Get("Authorization") != ""
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

// authed admits requests with an admin token; a page asked for without one
// goes to the login form.
func (c *Console) authed(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !c.admitted(token(r)) {
			if r.Method == http.MethodGet && r.Header.Get("Accept") != "text/event-stream" && r.Header.Get("Authorization") == "" {
				http.Redirect(w, r, Prefix+"/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			w.Header().Set("Www-Authenticate", `Bearer realm="agentfleet console"`)
			c.fail(w, r, http.StatusUnauthorized, errors.New("an admin token is required"))
			return
		}
		if r.Method == http.MethodPost && !sameOrigin(r) {
			c.fail(w, r, http.StatusForbidden, errors.New("the request does not come from the console's own pages"))
			return
		}
		h(w, r)
	})
}

// closedMsg says why a console without an admin token admits nobody.
const closedMsg = "The console is closed: this ingress has no admin token. Set http.token (AGENTFLEET_HTTP_TOKEN) and restart it."

func (c *Console) handleLoginForm(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Authorize == nil {
		c.render(w, r, http.StatusForbidden, "login", page{Title: "Sign in", Error: closedMsg, Data: "closed"})
		return
	}
	c.render(w, r, http.StatusOK, "login", page{Title: "Sign in", Next: safeNext(r.URL.Query().Get("next"))})
}

// safeNext keeps a redirect target inside the console.
func safeNext(next string) string {
	if !strings.HasPrefix(next, Prefix+"/") || strings.HasPrefix(next, "//") || strings.Contains(next, "\\") {
		return Prefix + "/fleet"
	}
	return next
}

func (c *Console) handleLogin(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		c.fail(w, r, http.StatusForbidden, errors.New("the request does not come from the console's own pages"))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	tok := strings.TrimSpace(r.PostFormValue("token"))
	next := safeNext(r.PostFormValue("next"))
	if c.cfg.Authorize == nil {
		c.render(w, r, http.StatusForbidden, "login", page{Title: "Sign in", Error: closedMsg, Data: "closed"})
		return
	}
	if !c.admitted(tok) {
		c.render(w, r, http.StatusUnauthorized, "login", page{Title: "Sign in", Next: next, Error: "That is not an admin token."})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: url.QueryEscape(tok), Path: Prefix, HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode, MaxAge: 12 * 3600})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *Console) handleLogout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: Prefix, HttpOnly: true, MaxAge: -1, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, Prefix+"/login", http.StatusSeeOther)
}

// fleetFor binds to the fleet once it is provisioned (an ingress may start
// before the first worker provisions what the console reads).
func (c *Console) fleetFor(ctx context.Context) (*admin.Fleet, error) {
	c.fleetMu.Lock()
	defer c.fleetMu.Unlock()
	if c.fleet != nil {
		return c.fleet, nil
	}
	f, err := admin.Open(ctx, c.cfg.JS, c.cfg.Names)
	if err != nil {
		return nil, err
	}
	c.fleet = f
	return f, nil
}

func (c *Console) opCtx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), c.cfg.Timeout)
}

// streamCtx is the context of an event stream: it ends with the request
// or with the server (Config.Closed).
func (c *Console) streamCtx(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.Context())
	stop := context.AfterFunc(c.cfg.Closed, cancel)
	return ctx, func() { stop(); cancel() }
}

// fail answers an error page.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	level := slog.LevelDebug
	if status >= 500 {
		level = slog.LevelWarn
	}
	c.log.LogAttrs(r.Context(), level, "console request failed", slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Int("status", status), slog.Any("error", err))
	c.render(w, r, status, "error", page{Title: http.StatusText(status), Error: err.Error(), Authed: c.admitted(token(r))})
}
