package ingress

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/telemetry"
)

// Defaults of Config.
const (
	DefaultMaxBodyBytes    int64 = 1 << 20
	DefaultPublishTimeout        = 5 * time.Second
	DefaultEventsHeartbeat       = 15 * time.Second
	// DefaultMaxReadersPerClient bounds the long polls and event streams
	// one client holds open at once.
	DefaultMaxReadersPerClient = 256
)

// BodyReadTimeout bounds the reading of a request body.
const BodyReadTimeout = 30 * time.Second

// MaxWait caps the wait of a long poll on /replies.
const MaxWait = 60 * time.Second

// Config configures the HTTP adapter.
type Config struct {
	// Names are the fleet's subject, stream and bucket names. Defaults to the
	// names of broker.DefaultPrefix.
	Names broker.Names
	// KeyOptions derive session keys from sources. They must be the ones the
	// rest of the fleet uses (fleetctl key, the other adapters). The zero
	// value isolates no group session per user: pass
	// session.DefaultKeyOptions() for the defaults.
	KeyOptions session.KeyOptions
	// Token is the bearer token every /v1 request must carry in
	// "Authorization: Bearer <token>". Empty means no authentication.
	Token string
	// ScopedTokens are further bearer tokens, each limited to the session
	// keys that start with one of its KeyPrefixes (a tenant's front end): POST
	// /v1/messages of a message whose key falls outside, and every
	// /v1/sessions/{key} path outside, are answered 403. Token keeps full
	// access. Scoped tokens without Token still require authentication.
	ScopedTokens []ScopedToken
	// MaxBodyBytes caps the body of POST /v1/messages; a larger body is
	// answered 413. Defaults to 1 MiB.
	MaxBodyBytes int64
	// Logger receives structured logs. Defaults to a discard logger.
	Logger *slog.Logger
	// PublishTimeout bounds each NATS operation of a request: the msgids
	// lookup, the inbox publish and its PubAck, the msgids record, a
	// session read. Defaults to 5s.
	PublishTimeout time.Duration
	// EventsHeartbeat is the interval of the comment lines that keep an idle
	// event stream open through proxies. Defaults to 15s.
	EventsHeartbeat time.Duration
	// MaxReadersPerClient bounds the reply readers (long polls of
	// /replies with a wait, /events streams) one client holds open at
	// once; one more is answered 429. A client is its bearer token when
	// it sends one, else its IP address. Defaults to 256.
	MaxReadersPerClient int
	// TracerProvider traces the requests and the inbox publishes, and
	// puts the trace context in the inbox messages' headers. Nil: no
	// spans (a client's traceparent is not passed on either).
	TracerProvider trace.TracerProvider
}

// ScopedToken is a bearer token limited to the session keys that start with
// one of KeyPrefixes. A key is agent:main:<platform>:<chat_type>:<ids>, so a
// tenant whose chat ids start with "acme-" on the HTTP platform has the
// prefixes "agent:main:http:dm:acme-" and "agent:main:http:group:acme-".
type ScopedToken struct {
	Token       string
	KeyPrefixes []string
}

func (c Config) withDefaults() (Config, error) {
	if c.Names.Prefix() == "" {
		c.Names = broker.MustNames(broker.DefaultPrefix)
	}
	// A token read from a file or a YAML block often ends in a newline; the
	// request's token is trimmed too, so trim both alike.
	token := strings.TrimSpace(c.Token)
	if token == "" && c.Token != "" {
		return c, fmt.Errorf("%w: Token is only white space", ErrInvalidConfig)
	}
	c.Token = token
	scoped := make([]ScopedToken, 0, len(c.ScopedTokens))
	seen := map[string]bool{token: token != ""}
	for i, st := range c.ScopedTokens {
		st.Token = strings.TrimSpace(st.Token)
		if st.Token == "" {
			return c, fmt.Errorf("%w: ScopedTokens[%d] has an empty token", ErrInvalidConfig, i)
		}
		if seen[st.Token] {
			return c, fmt.Errorf("%w: ScopedTokens[%d] repeats a token", ErrInvalidConfig, i)
		}
		seen[st.Token] = true
		if len(st.KeyPrefixes) == 0 {
			return c, fmt.Errorf("%w: ScopedTokens[%d] has no key prefix", ErrInvalidConfig, i)
		}
		for _, p := range st.KeyPrefixes {
			if !strings.HasPrefix(p, "agent:") || !utf8.ValidString(p) {
				return c, fmt.Errorf("%w: ScopedTokens[%d] key prefix %q does not start with \"agent:\"", ErrInvalidConfig, i, p)
			}
		}
		st.KeyPrefixes = append([]string(nil), st.KeyPrefixes...)
		scoped = append(scoped, st)
	}
	c.ScopedTokens = scoped
	if c.MaxBodyBytes < 0 {
		return c, fmt.Errorf("%w: MaxBodyBytes %d is negative", ErrInvalidConfig, c.MaxBodyBytes)
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.PublishTimeout < 0 {
		return c, fmt.Errorf("%w: PublishTimeout %s is negative", ErrInvalidConfig, c.PublishTimeout)
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.EventsHeartbeat < 0 {
		return c, fmt.Errorf("%w: EventsHeartbeat %s is negative", ErrInvalidConfig, c.EventsHeartbeat)
	}
	if c.EventsHeartbeat == 0 {
		c.EventsHeartbeat = DefaultEventsHeartbeat
	}
	if c.MaxReadersPerClient < 0 {
		return c, fmt.Errorf("%w: MaxReadersPerClient %d is negative", ErrInvalidConfig, c.MaxReadersPerClient)
	}
	if c.MaxReadersPerClient == 0 {
		c.MaxReadersPerClient = DefaultMaxReadersPerClient
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// Server is the HTTP adapter. Its methods are safe for concurrent use.
type Server struct {
	js     jetstream.JetStream
	res    *broker.Resources
	cfg    Config
	names  broker.Names
	log    *slog.Logger
	msgIDs *kv.MsgIDs
	tracer trace.Tracer
	// inboxOpts are broker.InboxPublishOptions, made once.
	inboxOpts []jetstream.PublishOpt

	// tokenSum is the SHA-256 of Config.Token, compared in constant time.
	tokenSum [sha256.Size]byte
	// scopedSums are the SHA-256 of each Config.ScopedTokens token.
	scopedSums [][sha256.Size]byte

	ready   atomic.Pointer[func() error]
	handler http.Handler

	// probeMu guards the last readiness probe of the store.
	probeMu  sync.Mutex
	probeAt  time.Time
	probeErr error

	// hub wakes reply readers; readers counts them per client.
	hub       *mailboxHub
	readersMu sync.Mutex
	readers   map[string]int

	// closed ends long polls and event streams (Close).
	closed    context.Context
	closeFunc context.CancelFunc
}

// New returns the HTTP adapter publishing into res (see broker.Provision).
func New(js jetstream.JetStream, res *broker.Resources, cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if js == nil {
		return nil, fmt.Errorf("%w: JetStream is nil", ErrInvalidConfig)
	}
	if err := checkResources(res, cfg.Names); err != nil {
		return nil, err
	}
	s := &Server{
		js:     js,
		res:    res,
		cfg:    cfg,
		names:  cfg.Names,
		log:    cfg.Logger,
		msgIDs: kv.NewMsgIDs(res),
		tracer: telemetry.Tracer(cfg.TracerProvider),

		inboxOpts: broker.InboxPublishOptions(),
	}
	s.tokenSum = sha256.Sum256([]byte(cfg.Token))
	for _, st := range cfg.ScopedTokens {
		s.scopedSums = append(s.scopedSums, sha256.Sum256([]byte(st.Token)))
	}
	nc := js.Conn()
	if nc == nil {
		return nil, fmt.Errorf("%w: JetStream has no connection", ErrInvalidConfig)
	}
	if s.hub, err = newMailboxHub(nc, cfg.Names); err != nil {
		return nil, err
	}
	s.readers = map[string]int{}
	s.closed, s.closeFunc = context.WithCancel(context.Background())
	s.handler = s.routes()
	return s, nil
}

// checkResources makes sure res holds what the adapter uses, provisioned for
// the same names.
func checkResources(res *broker.Resources, names broker.Names) error {
	if res == nil {
		return fmt.Errorf("%w: Resources is nil", ErrInvalidConfig)
	}
	for _, r := range []struct {
		name string
		ok   bool
	}{
		{"Inbox", res.Inbox != nil},
		{"Outbox", res.Outbox != nil},
		{"Sessions", res.Sessions != nil},
		{"MsgIDs", res.MsgIDs != nil},
		{"Delivered", res.Delivered != nil},
	} {
		if !r.ok {
			return fmt.Errorf("%w: Resources.%s is nil (run broker.Provision)", ErrInvalidConfig, r.name)
		}
	}
	for _, st := range []struct {
		s    jetstream.Stream
		want string
	}{
		{res.Inbox, names.InboxStream()},
		{res.Outbox, names.OutboxStream()},
	} {
		if info := st.s.CachedInfo(); info != nil && info.Config.Name != st.want {
			return fmt.Errorf("%w: stream %s was provisioned for other names than prefix %q (want %s)",
				ErrInvalidConfig, info.Config.Name, names.Prefix(), st.want)
		}
	}
	return nil
}

// Handler returns the HTTP handler of every route.
func (s *Server) Handler() http.Handler { return s.handler }

// SetReady sets the readiness check of GET /readyz: the server is ready when
// its NATS connection is up and ready returns nil (nil ready: always).
func (s *Server) SetReady(ready func() error) {
	if ready == nil {
		s.ready.Store(nil)
		return
	}
	s.ready.Store(&ready)
}

// Close ends every long poll (with an empty answer) and event stream in
// progress, so that http.Server.Shutdown does not wait for them, and drops
// the subscription that wakes them. New ones end at once. Close is
// idempotent; the handler keeps serving other routes.
func (s *Server) Close() {
	s.closeFunc()
	s.hub.close()
}

// admitReader counts a reply reader against its client's bound: a 429
// past it. release must be called when the reader is done.
func (s *Server) admitReader(r *http.Request) (release func(), e *apiError) {
	client := clientOf(r)
	s.readersMu.Lock()
	defer s.readersMu.Unlock()
	if s.readers[client] >= s.cfg.MaxReadersPerClient {
		e := errorf(http.StatusTooManyRequests, "too many open reply readers for this client (at most %d long polls and event streams at once)", s.cfg.MaxReadersPerClient)
		e.header = http.Header{"Retry-After": {"1"}}
		return nil, e
	}
	s.readers[client]++
	return func() {
		s.readersMu.Lock()
		defer s.readersMu.Unlock()
		if s.readers[client]--; s.readers[client] <= 0 {
			delete(s.readers, client)
		}
	}, nil
}

// Readers returns the number of reply readers (long polls with a wait,
// event streams) open now.
func (s *Server) Readers() int {
	s.readersMu.Lock()
	defer s.readersMu.Unlock()
	n := 0
	for _, c := range s.readers {
		n += c
	}
	return n
}

// clientOf names the client of a request for the reader bound: its bearer
// token (hashed) when it sends one, else its IP address.
func clientOf(r *http.Request) string {
	if auth := r.Header.Get("Authorization"); auth != "" {
		sum := sha256.Sum256([]byte(strings.TrimSpace(auth)))
		return "token:" + hex.EncodeToString(sum[:8])
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return "ip:" + host
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.handleHealthz)
	mux.HandleFunc("GET /readyz", s.handleReadyz)
	mux.Handle("POST /v1/messages", s.authed(s.handlePostMessage))
	mux.Handle("GET /v1/sessions/{session_key}", s.authed(s.handleGetSession))
	mux.Handle("GET /v1/sessions/{session_key}/replies", s.authed(s.handleReplies))
	mux.Handle("GET /v1/sessions/{session_key}/events", s.authed(s.handleEvents))
	s.mountConsole(mux) // the operations console, /console (checks its admin token itself)

	// The same paths with any other method: 405 with a JSON body (the mux's
	// own 405 is plain text).
	for path, allow := range map[string]string{
		"/healthz":                           "GET, HEAD",
		"/readyz":                            "GET, HEAD",
		"/v1/messages":                       "POST",
		"/v1/sessions/{session_key}":         "GET, HEAD",
		"/v1/sessions/{session_key}/replies": "GET, HEAD",
		"/v1/sessions/{session_key}/events":  "GET, HEAD",
	} {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			e := errorf(http.StatusMethodNotAllowed, "method %s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, allow)
			e.header = http.Header{"Allow": {allow}}
			s.writeError(w, r, e)
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, errorf(http.StatusNotFound, "no route for %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// authed wraps h with the bearer-token check when a token is configured.
// A scoped token's key prefix travels in the request's context; keyed
// routes check it with allowKey.
func (s *Server) authed(h http.HandlerFunc) http.Handler {
	if s.cfg.Token == "" && len(s.cfg.ScopedTokens) == 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scope, e := s.checkToken(r)
		if e != nil {
			s.writeError(w, r, e)
			return
		}
		if scope != nil {
			r = r.WithContext(context.WithValue(r.Context(), scopeKey{}, scope))
		}
		h(w, r)
	})
}

// scopeKey is the context key of a request's *ScopedToken.
type scopeKey struct{}

// allowKey answers 403 when the request's token is scoped to key prefixes
// none of which key starts with.
func allowKey(r *http.Request, key string) *apiError {
	st, _ := r.Context().Value(scopeKey{}).(*ScopedToken)
	if st == nil {
		return nil
	}
	for _, p := range st.KeyPrefixes {
		if strings.HasPrefix(key, p) {
			return nil
		}
	}
	return errorf(http.StatusForbidden, "this token is limited to session keys starting with %q", st.KeyPrefixes)
}

// checkToken returns the scope of the request's token: nil for Token (full
// access), else the matching scoped token.
func (s *Server) checkToken(r *http.Request) (*ScopedToken, *apiError) {
	const realm = `Bearer realm="agentfleet"`
	auth := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(auth, " ")
	if auth == "" || !ok || !strings.EqualFold(scheme, "Bearer") {
		e := errorf(http.StatusUnauthorized, "missing bearer token: send Authorization: Bearer <token>")
		e.header = http.Header{"Www-Authenticate": {realm}}
		return nil, e
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
	if s.cfg.Token != "" && subtle.ConstantTimeCompare(sum[:], s.tokenSum[:]) == 1 {
		return nil, nil
	}
	for i := range s.scopedSums {
		if subtle.ConstantTimeCompare(sum[:], s.scopedSums[i][:]) == 1 {
			return &s.cfg.ScopedTokens[i], nil
		}
	}
	e := errorf(http.StatusUnauthorized, "invalid bearer token")
	e.header = http.Header{"Www-Authenticate": {realm + `, error="invalid_token"`}}
	return nil, e
}

func (s *Server) handleHealthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) {
	if nc := s.js.Conn(); nc == nil || nc.Status() != nats.CONNECTED {
		status := "no connection"
		if nc != nil {
			status = nc.Status().String()
		}
		s.writeError(w, r, errorf(http.StatusServiceUnavailable, "nats connection is %s", strings.ToLower(status)))
		return
	}
	if ready := s.ready.Load(); ready != nil {
		if err := (*ready)(); err != nil {
			s.writeError(w, r, errorf(http.StatusServiceUnavailable, "not ready: %v", err))
			return
		}
	}
	if err := s.probeStore(r); err != nil {
		s.writeError(w, r, &apiError{status: http.StatusServiceUnavailable,
			msg: "not ready: the store does not take writes (full?), so messages cannot be accepted", err: err})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// probeEvery is how long a readiness probe's outcome is reused.
const probeEvery = time.Second

// probeStore writes one message to the probe stream (which keeps only the
// last), at most once per probeEvery: when the store is full every POST
// fails, and readiness must say so. Without a probe stream it says nothing.
func (s *Server) probeStore(r *http.Request) error {
	if s.res.Probe == nil {
		return nil
	}
	s.probeMu.Lock()
	defer s.probeMu.Unlock()
	if time.Since(s.probeAt) < probeEvery {
		return s.probeErr
	}
	ctx, cancel := s.opContext(r)
	defer cancel()
	_, err := s.js.Publish(ctx, s.names.ProbeSubject(), nil, jetstream.WithExpectStream(s.names.ProbeStream()))
	s.probeAt, s.probeErr = time.Now(), err
	return err
}

// opContext bounds one NATS operation of a request by PublishTimeout. It is
// not cancelled when the client goes away: a publish the server has started
// completes (and is recorded) so a retry finds it.
func (s *Server) opContext(r *http.Request) (context.Context, context.CancelFunc) {
	return s.opCtx(r.Context())
}

// opCtx is opContext for a context that is not a request's. A deadline of
// ctx that comes before PublishTimeout bounds the operation instead (a
// platform that wants its answer within 3 s), but its cancellation does not.
func (s *Server) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	timeout := s.cfg.PublishTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(min(timeout, time.Until(dl)), time.Millisecond)
	}
	return context.WithTimeout(context.WithoutCancel(ctx), timeout)
}

// streamContext is the context of a long poll or an event stream: it ends
// when the client goes away or Close is called.
func (s *Server) streamContext(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.Context())
	stop := context.AfterFunc(s.closed, cancel)
	return ctx, func() { stop(); cancel() }
}

type errorBody struct {
	Error string `json:"error"`
}

// writeError answers e, logging server-side failures with their cause.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, e *apiError) {
	for k, v := range e.header {
		w.Header()[k] = v
	}
	level := slog.LevelDebug
	if e.status >= 500 {
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.Int("status", e.status),
		slog.String("error", e.msg),
	}
	if e.err != nil {
		attrs = append(attrs, slog.Any("cause", e.err))
	}
	s.log.LogAttrs(r.Context(), level, "request failed", attrs...)
	writeJSON(w, e.status, errorBody{Error: e.msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		body = []byte(`{"error":"cannot encode the response"}`)
	}
	setJSONHeaders(w.Header())
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// The header values of every JSON answer. net/http only reads a header's
// values, so the answers share these slices.
var (
	hdrJSON    = []string{"application/json"}
	hdrNoStore = []string{"no-store"}
	hdrNoSniff = []string{"nosniff"}
)

// setJSONHeaders sets the headers of a JSON answer (canonical keys, so no
// canonicalization per request).
func setJSONHeaders(h http.Header) {
	h["Content-Type"] = hdrJSON
	h["Cache-Control"] = hdrNoStore
	h["X-Content-Type-Options"] = hdrNoSniff
}
