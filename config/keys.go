package config

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentfleet/agentfleet/session"
)

// KeyInfo describes one configuration key. Keys returns them all; the table
// in docs/configuration.md is generated from them.
type KeyInfo struct {
	// Path is the YAML path, e.g. "lease.ttl". A segment <platform> or
	// <chat_type> stands for any platform name or chat type.
	Path string
	// Env is the environment variable that sets the key, or "" for keys under
	// a <platform> or <chat_type> placeholder (set those in the file or with
	// Set).
	Env string
	// EnvFallback is a second variable read when Env is unset or empty
	// (NATS_URL for nats.url, the variable the nats tools read), or "".
	EnvFallback string
	// Type is string, bool, int, duration or list.
	Type string
	// Default is the built-in default as text ("inherited" for overrides).
	Default string
	// Description says what the key does and which values it takes.
	Description string
}

// Placeholder segments of key paths.
const (
	placeholderPlatform = "<platform>"
	placeholderChatType = "<chat_type>"
)

// Value kinds of keys.
const (
	kindString   = "string"
	kindBool     = "bool"
	kindInt      = "int"
	kindDuration = "duration"
	// kindList is a list of names: a YAML sequence in the file, comma
	// separated in the environment and in Set.
	kindList = "list"
)

// wholeSeconds accepts a duration of whole seconds, at least 1s (the
// server's per-message TTL is in seconds).
func wholeSeconds(v any) string {
	d := v.(Duration)
	if d.Duration() < time.Second || d.Duration()%time.Second != 0 {
		return fmt.Sprintf("%q must be whole seconds, at least 1s", d.String())
	}
	return ""
}

// minLeaseTTL is the shortest lease.ttl accepted.
const minLeaseTTL = 3 * time.Second

// envPrefix prefixes the environment variable of every key but nats.url.
const envPrefix = "AGENTFLEET_"

// key is one scalar configuration key: the single source of the key list, the
// environment variables, Set, the per-field checks of Validate and the docs.
type key struct {
	path string // YAML path, possibly with placeholders
	kind string
	env  string // overrides the derived variable name
	// envFallback is read when the variable is unset or empty.
	envFallback string
	def         string // overrides the default derived from Default()
	desc        string
	// get returns the value (string, bool, int or Duration) for the
	// placeholder arguments a; ok is false when an override is unset.
	get func(c *Config, a []string) (v any, ok bool)
	// set stores v (of the key's kind) for the placeholder arguments a.
	set func(c *Config, a []string, v any)
	// check returns why v is refused, quoting it, or "".
	check func(v any) string
	// each lists the placeholder arguments present in c (nil for plain keys).
	each func(c *Config) [][]string
}

// envVar returns the environment variable of k, "" when k has placeholders.
func (k key) envVar() string {
	if k.env != "" {
		return k.env
	}
	if strings.Contains(k.path, "<") {
		return ""
	}
	return envPrefix + strings.ToUpper(strings.ReplaceAll(k.path, ".", "_"))
}

// concrete returns k's path with its placeholders replaced by a.
func (k key) concrete(a []string) string {
	segs := strings.Split(k.path, ".")
	i := 0
	for j, s := range segs {
		if isPlaceholder(s) && i < len(a) {
			segs[j] = a[i]
			i++
		}
	}
	return strings.Join(segs, ".")
}

// instances lists the placeholder arguments for which k exists in c.
func (k key) instances(c *Config) [][]string {
	if k.each == nil {
		return [][]string{nil}
	}
	return k.each(c)
}

func isPlaceholder(s string) bool { return strings.HasPrefix(s, "<") && strings.HasSuffix(s, ">") }

// scalar is the set of Go types a plain key may have.
type scalar interface {
	~string | ~bool | ~int | ~int64
}

// field builds a key for a plain (placeholder-free) field of Config.
func field[T scalar](path, desc string, p func(*Config) *T, check func(any) string) key {
	var kind string
	switch any(*new(T)).(type) {
	case string, session.ResetMode:
		kind = kindString
	case bool:
		kind = kindBool
	case int:
		kind = kindInt
	case Duration:
		kind = kindDuration
	default:
		panic(fmt.Sprintf("config: key %s: unsupported type %T", path, *new(T)))
	}
	return key{
		path:  path,
		kind:  kind,
		desc:  desc,
		check: check,
		get:   func(c *Config, _ []string) (any, bool) { return toKind(*p(c)), true },
		set:   func(c *Config, _ []string, v any) { *p(c) = fromKind[T](v) },
	}
}

// toKind converts a field value to the representation of its kind.
func toKind(v any) any {
	if m, ok := v.(session.ResetMode); ok {
		return string(m)
	}
	return v
}

// fromKind converts a value of a kind back to the field type T.
func fromKind[T scalar](v any) T {
	var out T
	switch p := any(&out).(type) {
	case *session.ResetMode:
		*p = session.ResetMode(v.(string))
	default:
		out = v.(T)
	}
	return out
}

// keys is the list of every configuration key, in documentation order.
var keys = buildKeys()

func buildKeys() []key {
	ks := []key{
		field("group_sessions_per_user",
			"Isolate group and channel sessions per user: the participant id is appended to the session key.",
			func(c *Config) *bool { return &c.GroupSessionsPerUser }, nil),
		field("thread_sessions_per_user",
			"Isolate thread sessions per user; by default all participants of a thread share one session.",
			func(c *Config) *bool { return &c.ThreadSessionsPerUser }, nil),
		field("session_store_max_age_days",
			"Prune sessions not updated for this many days (hourly, by the expiry leader). 0 disables pruning.",
			func(c *Config) *int { return &c.SessionStoreMaxAgeDays }, minInt(0)),
		field("session_reset.mode",
			"Automatic reset policy: none, idle (after idle_minutes without activity), daily (at at_hour) or both (whichever comes first).",
			func(c *Config) *session.ResetMode { return &c.SessionReset.Mode }, checkMode),
		field("session_reset.at_hour",
			"Hour of the daily reset, 0..23, in `timezone`.",
			func(c *Config) *int { return &c.SessionReset.AtHour }, checkAtHour),
		field("session_reset.idle_minutes",
			"Minutes of inactivity after which a session resets, 1 to 52704000 (100 years).",
			func(c *Config) *int { return &c.SessionReset.IdleMinutes }, checkIdleMinutes),
		field("session_reset.notify",
			"Tell the user, on the first message after an idle or daily reset of a session that had activity, that the session was reset. A reset after `/stop` or repeated interruptions is always told.",
			func(c *Config) *bool { return &c.SessionReset.Notify }, nil),
		{
			path: "session_reset.notify_exclude_platforms", kind: kindList, def: "api_server,webhook",
			desc:  "Platforms that never get an automatic reset notice (a YAML list, or comma separated): known platform names, or the seed's `api_server` and `webhook`. Empty: none.",
			get:   func(c *Config, _ []string) (any, bool) { return c.SessionReset.NotifyExcludePlatforms, true },
			set:   func(c *Config, _ []string, v any) { c.SessionReset.NotifyExcludePlatforms = v.([]string) },
			check: checkNotifyExclude,
		},
	}
	ks = append(ks, overrideKeys()...)
	ks = append(ks,
		key{
			path: "timezone", kind: kindString, def: "Local",
			desc:  "IANA time zone (e.g. `Europe/Paris`, `UTC`) in which `at_hour` is read. `Local` is the process's zone (TZ or /etc/localtime).",
			get:   func(c *Config, _ []string) (any, bool) { return c.Timezone, true },
			set:   func(c *Config, _ []string, v any) { c.Timezone = v.(string) },
			check: checkTimezone,
		},
		field("agent.backend",
			"Agent backend: `echo` (deterministic, no network), `openai` (a chat-completions API, with tools from MCP servers) or `bridge` (an agent in any language behind HTTP). See docs/agents.md.",
			func(c *Config) *string { return &c.Agent.Backend }, checkNonEmpty),
		field("agent.gateway_timeout",
			"Longest agent run of one turn; an owner whose agent hangs stops renewing its lease after this plus a grace.",
			func(c *Config) *Duration { return &c.Agent.GatewayTimeout }, minDuration(time.Second)),
		field("agent.gateway_auto_continue_freshness",
			"How long after an interruption a turn is resumed automatically and a resume_pending session is kept against the reset policy. An older interruption waits for the user's next message, which continues the session with the resume note (unless the reset policy resets it).",
			func(c *Config) *Duration { return &c.Agent.GatewayAutoContinueFreshness }, minDuration(time.Second)),
		field("agent.restart_drain_timeout",
			"On SIGTERM, how long running turns may finish before they are cancelled and handed over. 0 cancels at once.",
			func(c *Config) *Duration { return &c.Agent.RestartDrainTimeout }, minDuration(0)),
		field("agent.allow_crash",
			"Let the echo agent's `!crash` directive exit the worker process (tests only).",
			func(c *Config) *bool { return &c.Agent.AllowCrash }, nil),
		field("agent.bridge.url",
			"Bridge backend: the agent's URL, where each turn is POSTed as JSON; events come back as newline-delimited JSON (docs/agents.md).",
			func(c *Config) *string { return &c.Agent.Bridge.URL }, checkHTTPURL),
		field("agent.bridge.token",
			"Bridge backend: bearer token sent with every turn (secret: redacted when printed).",
			func(c *Config) *string { return &c.Agent.Bridge.Token }, nil),
		field("agent.openai.model",
			"OpenAI backend: the model name (required by that backend).",
			func(c *Config) *string { return &c.Agent.OpenAI.Model }, nil),
		field("agent.openai.base_url",
			"OpenAI backend: base URL of a chat-completions API (OpenAI, vLLM, llama.cpp server, Ollama, OpenRouter). Empty: the OpenAI API.",
			func(c *Config) *string { return &c.Agent.OpenAI.BaseURL }, checkHTTPURL),
		field("agent.openai.api_key",
			"OpenAI backend: API key (secret: redacted when printed, never logged).",
			func(c *Config) *string { return &c.Agent.OpenAI.APIKey }, nil),
		field("agent.openai.system_prompt",
			"OpenAI backend: text that opens every turn's system prompt, before the session context and the turn's notes.",
			func(c *Config) *string { return &c.Agent.OpenAI.SystemPrompt }, nil),
		field("agent.openai.max_tool_steps",
			"OpenAI backend: model calls per turn that may end in tool calls; then the model must answer without tools.",
			func(c *Config) *int { return &c.Agent.OpenAI.MaxToolSteps }, minInt(0)),
		field("agent.openai.max_retries",
			"OpenAI backend: retries of a model call after a 429, a 5xx or a connection error (exponential backoff within the turn's deadline).",
			func(c *Config) *int { return &c.Agent.OpenAI.MaxRetries }, minInt(0)),
		field("agent.openai.tool_timeout",
			"OpenAI backend: longest MCP tool call; a call that takes longer fails that step (the model is told), not the turn.",
			func(c *Config) *Duration { return &c.Agent.OpenAI.ToolTimeout }, minDuration(time.Second)),
		field("agent.openai.images",
			"OpenAI backend: how the photos and stickers of a turn reach the model as image parts: `inline` (the worker fetches each from its attachment URL, at most 20 MiB, and sends it as a base64 data URL), `url` (the attachment URL itself; the model provider must be able to reach it) or `none` (a text-only model). Every attachment is also described in the message text.",
			func(c *Config) *string { return &c.Agent.OpenAI.Images }, oneOf("inline", "url", "none")),
		field("privacy.redact_pii",
			"Replace user ids and chat ids in the agent's session context prompt with stable hashes (user_<12hex>, <platform>:<12hex>), except on platforms that need raw ids for mentions (Discord). Routing, session keys and delivery always use the real ids.",
			func(c *Config) *bool { return &c.Privacy.RedactPII }, nil),
		field("whatsapp.mapping_dir",
			"Directory of WhatsApp JID/LID alias mappings used to canonicalize identifiers. Empty: normalization only. Must exist when set.",
			func(c *Config) *string { return &c.WhatsApp.MappingDir }, checkDir),
		field("nats.url",
			"NATS server URL, or several separated by commas (`nats://`, `tls://`, `ws://`, `wss://`). From `AGENTFLEET_NATS_URL`, else `NATS_URL` (the variable the `nats` CLI reads). Not used by `agentfleet up`, which connects in-process.",
			func(c *Config) *string { return &c.NATS.URL }, checkNATSURL),
		field("nats.user",
			"User for user/password authentication.",
			func(c *Config) *string { return &c.NATS.User }, nil),
		field("nats.password",
			"Password for user/password authentication (secret: redacted when printed).",
			func(c *Config) *string { return &c.NATS.Password }, nil),
		field("nats.creds",
			"Path of a NATS credentials file (JWT and nkey seed). Must exist when set.",
			func(c *Config) *string { return &c.NATS.Creds }, checkFile),
		field("nats.nkey",
			"Path of an nkey user seed file (`SU...`) for nkey authentication; the seed never leaves the process, only a signature of the server's nonce does. Must exist when set.",
			func(c *Config) *string { return &c.NATS.NKey }, checkFile),
		field("nats.token",
			"Token for token authentication (secret: redacted when printed).",
			func(c *Config) *string { return &c.NATS.Token }, nil),
		field("nats.tls.ca",
			"PEM file of CAs to trust for the server certificate. Empty: the system pool. Must exist when set.",
			func(c *Config) *string { return &c.NATS.TLS.CA }, checkFile),
		field("nats.tls.cert",
			"PEM client certificate for mutual TLS (needs `nats.tls.key`). Must exist when set.",
			func(c *Config) *string { return &c.NATS.TLS.Cert }, checkFile),
		field("nats.tls.key",
			"PEM client key for mutual TLS (needs `nats.tls.cert`). Must exist when set.",
			func(c *Config) *string { return &c.NATS.TLS.Key }, checkFile),
		field("nats.tls.insecure_skip_verify",
			"Skip verification of the server certificate (tests only).",
			func(c *Config) *bool { return &c.NATS.TLS.InsecureSkipVerify }, nil),
		field("nats.prefix",
			"First token of every subject and base of every stream, bucket and consumer name, so several fleets can share one account. Lower-case letters, digits and `_` (stream names are its upper case).",
			func(c *Config) *string { return &c.NATS.Prefix }, checkPrefix),
		field("nats.replicas",
			"Replicas of every stream and bucket: 1, 3 or 5 (3 for a 3-node cluster).",
			func(c *Config) *int { return &c.NATS.Replicas }, checkReplicas),
		field("nats.inbox_streams",
			"Inbox streams the 64 partitions are spread over (partition p in stream p mod N), 1 to 16. A new fleet is created with it; 0 takes the fleet's current count. A different non-zero count is refused at start: change it on a running fleet with `fleetctl inbox streams N` (docs/scaling.md).",
			func(c *Config) *int { return &c.NATS.InboxStreams }, checkInboxStreams),
		field("nats.connect_timeout",
			"Timeout of the initial connection to NATS.",
			func(c *Config) *Duration { return &c.NATS.ConnectTimeout }, minDuration(time.Millisecond)),
		field("nats.connect_wait",
			"How long a process (`worker`, `ingress`, `fleetctl` within its `--timeout`) waits at start for NATS to be reachable, retrying with backoff and logging `waiting for NATS at <url>`, before it exits with an error. 0: give up at the first failure.",
			func(c *Config) *Duration { return &c.NATS.ConnectWait }, minDuration(0)),
		field("nats.inbox_prefix",
			"Prefix of this process's reply subjects (default `_INBOX`). Give each role its own (`_INBOX_worker` ...) and the same `inbox_prefix` in its NATS user's permissions: a role then cannot read the replies to another role's requests.",
			func(c *Config) *string { return &c.NATS.InboxPrefix }, checkInboxPrefix),
		field("nats.provision",
			"Create or update the fleet's streams, buckets and workers consumer at start. `false`: only bind to them, failing with a message naming what is missing; for NATS users without the right to create them (the least-privilege roles of docs/security.md), after `agentfleet provision` ran as an admin user.",
			func(c *Config) *bool { return &c.NATS.Provision }, nil),
		field("embedded.data_dir",
			"JetStream file store of the embedded server (`agentfleet up`).",
			func(c *Config) *string { return &c.Embedded.DataDir }, checkNonEmpty),
		field("embedded.listen",
			"host:port on which the embedded server also accepts clients (other processes, the `nats` CLI). Empty: in-process only. Without `embedded.users` the port has no authentication, and without `embedded.tls.*` no TLS: then bind it to a loopback or otherwise private address.",
			func(c *Config) *string { return &c.Embedded.Listen }, checkHostPort(true)),
		field("embedded.users",
			"Users file (YAML) of the embedded server (`agentfleet nats`, `agentfleet up`): every client of its listen port must log in as one of them and gets the permissions of the user's role (docs/security.md). Empty: no authentication. Must exist when set.",
			func(c *Config) *string { return &c.Embedded.Users }, checkFile),
		field("embedded.monitor",
			"host:port of the embedded server's HTTP monitoring endpoints (`/varz`, `/jsz`, `/healthz`; no authentication: bind it privately). Empty: none.",
			func(c *Config) *string { return &c.Embedded.Monitor }, checkHostPort(true)),
		field("embedded.tls.cert",
			"PEM server certificate of the embedded server's listen port (needs `embedded.tls.key`): the port then takes TLS connections only. Must exist when set.",
			func(c *Config) *string { return &c.Embedded.TLS.Cert }, checkFile),
		field("embedded.tls.key",
			"PEM key of `embedded.tls.cert`. Must exist when set.",
			func(c *Config) *string { return &c.Embedded.TLS.Key }, checkFile),
		field("embedded.tls.ca",
			"PEM file of CAs: when set, every client of the embedded server's listen port must present a certificate signed by one of them. Must exist when set.",
			func(c *Config) *string { return &c.Embedded.TLS.CA }, checkFile),
		field("embedded.sync",
			"JetStream fsync policy of the embedded server: `default` (nats-server's, every 2m), `always` (fsync before every acknowledgement), or an interval like `10s`. Only `always` survives an OS crash or power loss without losing acknowledged writes.",
			func(c *Config) *string { return &c.Embedded.Sync }, checkSync),
		field("lease.ttl",
			"Server-side lifetime of a lane lease; the owner renews every ttl/3. At least 3s.",
			func(c *Config) *Duration { return &c.Lease.TTL }, minDuration(minLeaseTTL)),
		field("lease.margin",
			"The owner stops making durable changes this long before its lease could expire. Positive, below ttl/2.",
			func(c *Config) *Duration { return &c.Lease.Margin }, minDuration(time.Millisecond)),
		field("lease.liveness_ttl",
			"Server-side lifetime of a worker's liveness lease, renewed every liveness_ttl/4. A lane lease is good only while its owner's liveness lease lives, so a dead worker's lanes are taken over about this long after it died. Whole seconds, at least 1s.",
			func(c *Config) *Duration { return &c.Lease.LivenessTTL }, wholeSeconds),
		key{
			path: "worker.id", kind: kindString, def: "<hostname>-<pid>",
			desc:  "Name of this worker in leases and logs. Empty: `<hostname>-<pid>`, computed at start. No spaces.",
			get:   func(c *Config, _ []string) (any, bool) { return c.Worker.ID, true },
			set:   func(c *Config, _ []string, v any) { c.Worker.ID = v.(string) },
			check: checkWorkerID,
		},
		field("worker.lanes",
			"Most lanes this worker owns at once; at capacity it stops pulling. At least 1.",
			func(c *Config) *int { return &c.Worker.Lanes }, minInt(1)),
		field("worker.turns",
			"Most turns this worker runs at once. At least 1.",
			func(c *Config) *int { return &c.Worker.Turns }, minInt(1)),
		field("worker.linger",
			"How long an idle lane stays owned so that follow-ups meet the warm agent cache. 0 releases at once.",
			func(c *Config) *Duration { return &c.Worker.Linger }, minDuration(0)),
		field("worker.busy_mode",
			"What a message arriving during a running turn does, unless the lane chose with `/busy`: interrupt, queue or steer.",
			func(c *Config) *string { return &c.Worker.BusyMode }, oneOf(BusyInterrupt, BusyQueue, BusySteer)),
		field("worker.max_turn_messages",
			"Most inbox messages one turn takes. At least 1.",
			func(c *Config) *int { return &c.Worker.MaxTurnMessages }, minInt(1)),
		field("worker.max_turn_bytes",
			"Most bytes of message text one turn takes (a turn always takes at least one message). At least 1.",
			func(c *Config) *int { return &c.Worker.MaxTurnBytes }, minInt(1)),
		field("worker.cache_size",
			"Most agents kept warm in the worker's LRU cache. At least 1.",
			func(c *Config) *int { return &c.Worker.CacheSize }, minInt(1)),
		field("worker.cache_idle_ttl",
			"A cached agent unused for this long is evicted. Positive.",
			func(c *Config) *Duration { return &c.Worker.CacheIdleTTL }, minDuration(time.Millisecond)),
		field("http.addr",
			"host:port of the HTTP ingress. The default serves this machine only; a non-loopback address (`:8080`, `0.0.0.0:8080`, a LAN address) needs `http.token`, or `http.allow_unauthenticated: true`.",
			func(c *Config) *string { return &c.HTTP.Addr }, checkHostPort(false)),
		field("http.token",
			"Bearer token every HTTP request but /healthz and /readyz must carry. Empty: no authentication (secret: redacted when printed).",
			func(c *Config) *string { return &c.HTTP.Token }, nil),
		field("http.allow_unauthenticated",
			"Allow `http.addr` on a non-loopback address with no `http.token` (behind an authenticating proxy, or on a private network). Without it such a start is refused.",
			func(c *Config) *bool { return &c.HTTP.AllowUnauthenticated }, nil),
		field("http.scoped_tokens_file",
			"Path of a JSON file of bearer tokens each limited to session-key prefixes, for one tenant's front end: `[{\"token\": \"...\", \"key_prefixes\": [\"agent:main:http:dm:acme-\"]}]`. A scoped token gets 403 outside its prefixes (docs/http-api.md). Must exist when set.",
			func(c *Config) *string { return &c.HTTP.ScopedTokensFile }, checkFile),
		field("http.max_body_bytes",
			"Largest accepted request body, in bytes. At least 1.",
			func(c *Config) *int { return &c.HTTP.MaxBodyBytes }, minInt(1)),
		field("http.max_readers_per_client",
			"Most reply readers (long polls of /replies, /events streams) one client (its bearer token, else its IP address) may hold open at once; past it the server answers 429. At least 1.",
			func(c *Config) *int { return &c.HTTP.MaxReadersPerClient }, minInt(1)),
		field("http.public_url",
			"URL at which agents reach this ingress (`https://fleet.example.com`): attachments of Telegram, Slack and WhatsApp link to its media endpoint `/v1/media/<platform>/<file id>`, which fetches the file with the platform token so no token is written into messages or transcripts. Empty: `http://` + `http.addr` (a loopback host when the address names none), right for `agentfleet up`.",
			func(c *Config) *string { return &c.HTTP.PublicURL }, checkHTTPURL),
		field("delivery.backoff",
			"Delay before the first retry of a failed reply delivery; it doubles per attempt up to 5s (or the backoff itself, if longer). Delivery retries until it succeeds: a reply is never dropped because its store was briefly unavailable. Positive.",
			func(c *Config) *Duration { return &c.Delivery.Backoff }, minDuration(time.Millisecond)),
		field("delivery.max_attempts",
			"Failed sends of one reply after which a chat-platform delivery (Telegram, Slack) gives it up and records a `delivery_failed` event (`fleetctl delivery failures`). Rate-limit answers do not count. At least 1.",
			func(c *Config) *int { return &c.Delivery.MaxAttempts }, minInt(1)),
		field("delivery.max_age",
			"Age of a reply after which a chat-platform delivery gives it up at its next failed send. Positive.",
			func(c *Config) *Duration { return &c.Delivery.MaxAge }, minDuration(time.Millisecond)),
	)
	ks = append(ks, platformKeys()...)
	ks = append(ks,
		field("indexer.db",
			"SQLite file of the state database the indexer writes (`agentfleet indexer`, and `agentfleet up` when set). Empty: `<embedded.data_dir>/state.db` under `agentfleet up`; `agentfleet indexer` then needs `--db`.",
			func(c *Config) *string { return &c.Indexer.DB }, nil),
		field("indexer.name",
			"Name of this indexer's durable consumers (`indexer_<stream>_<name>`), so that several indexers, each with its own file, never share one. Letters, digits, `-` and `_`. Empty: derived from the host name and the database path.",
			func(c *Config) *string { return &c.Indexer.Name }, checkIndexerName),
		field("indexer.batch_size",
			"Most stream messages the indexer applies in one SQLite transaction. At least 1.",
			func(c *Config) *int { return &c.Indexer.BatchSize }, minInt(1)),
		field("telemetry.log_level",
			"Minimum level logged: debug, info, warn or error.",
			func(c *Config) *string { return &c.Telemetry.LogLevel }, oneOf("debug", "info", "warn", "error")),
		field("telemetry.log_format",
			"Log format: text or json.",
			func(c *Config) *string { return &c.Telemetry.LogFormat }, oneOf("text", "json")),
		field("telemetry.metrics_addr",
			"host:port on which `agentfleet worker`, `agentfleet indexer` and `agentfleet up` serve Prometheus metrics at /metrics (flag `--metrics`). Empty: no separate endpoint (the ingress always serves /metrics on `http.addr`). The endpoint has no authentication: bind it to a private address.",
			func(c *Config) *string { return &c.Telemetry.MetricsAddr }, checkHostPort(true)),
	)
	for i := range ks {
		switch ks[i].path {
		case "nats.url":
			ks[i].envFallback = "NATS_URL"
		case "agent.openai.base_url":
			ks[i].envFallback = "OPENAI_BASE_URL" // the conventional variables of OpenAI clients
		case "agent.openai.api_key":
			ks[i].envFallback = "OPENAI_API_KEY"
		}
	}
	return ks
}

// platformString is a string setting of one platform, stored in
// Config.Platforms[p]; an unset value reads as def.
func platformString(p session.Platform, name, def, desc string, f func(*PlatformConfig) *string, check func(any) string) key {
	return key{
		path: "platforms." + string(p) + "." + name, kind: kindString, desc: desc, check: check, def: def,
		get: func(c *Config, _ []string) (any, bool) {
			pc := c.Platforms[p]
			if v := *f(&pc); v != "" {
				return v, true
			}
			return def, true
		},
		set: func(c *Config, _ []string, v any) {
			val := v.(string)
			if val == def {
				val = "" // the default is stored as unset
			}
			pc := c.Platforms[p]
			*f(&pc) = val
			storePlatform(c, p, pc)
		},
	}
}

// storePlatform stores pc as the settings of p; settings with nothing set
// leave no entry behind.
func storePlatform(c *Config, p session.Platform, pc PlatformConfig) {
	if reflect.ValueOf(pc).IsZero() {
		if _, ok := c.Platforms[p]; !ok {
			return
		}
	}
	if c.Platforms == nil {
		c.Platforms = map[session.Platform]PlatformConfig{}
	}
	c.Platforms[p] = pc
}

// platformKeys are the adapter settings of the chat platforms.
func platformKeys() []key {
	tg, sl := session.PlatformTelegram, session.PlatformSlack
	wa, dc := session.PlatformWhatsApp, session.PlatformDiscord
	return []key{
		platformString(tg, "token", "",
			"Telegram bot token from @BotFather. Setting it turns the Telegram adapter on (secret: redacted when printed).",
			func(pc *PlatformConfig) *string { return &pc.Token }, nil),
		platformString(tg, "webhook_secret", "",
			"Secret Telegram sends in `X-Telegram-Bot-Api-Secret-Token` with every webhook request (the `secret_token` of setWebhook): 1 to 256 of `A-Z a-z 0-9 _ -`. Required in webhook mode (secret: redacted when printed).",
			func(pc *PlatformConfig) *string { return &pc.WebhookSecret }, nil),
		platformString(tg, "mode", TelegramModeWebhook,
			"How Telegram updates arrive: `webhook` (POST /webhooks/telegram) or `poll` (getUpdates long polling, one poller per bot across the fleet).",
			func(pc *PlatformConfig) *string { return &pc.Mode }, oneOf(TelegramModeWebhook, TelegramModePoll)),
		platformString(tg, "api_base", DefaultTelegramAPIBase,
			"Base URL of the Telegram Bot API (tests point it at a local server).",
			func(pc *PlatformConfig) *string { return &pc.APIBase }, checkHTTPURL),
		platformString(sl, "signing_secret", "",
			"Slack app signing secret, to verify the `v0` signature of every Events API request. Setting it turns the Slack adapter on (secret: redacted when printed).",
			func(pc *PlatformConfig) *string { return &pc.SigningSecret }, nil),
		platformString(sl, "bot_token", "",
			"Slack bot token (`xoxb-...`) for chat.postMessage. Required with `signing_secret` (secret: redacted when printed).",
			func(pc *PlatformConfig) *string { return &pc.BotToken }, nil),
		platformString(sl, "app_token", "",
			"Slack app-level token (`xapp-...`, scope `connections:write`) for Socket Mode. Required with `mode: socket` (secret: redacted when printed).",
			func(pc *PlatformConfig) *string { return &pc.AppToken }, nil),
		platformString(sl, "mode", SlackModeEvents,
			"How Slack events arrive: `events` (Events API, POST /webhooks/slack) or `socket` (Socket Mode, one connection per app across the fleet; no public URL needed).",
			func(pc *PlatformConfig) *string { return &pc.Mode }, oneOf(SlackModeEvents, SlackModeSocket)),
		platformString(sl, "api_base", DefaultSlackAPIBase,
			"Base URL of the Slack Web API (tests point it at a local server).",
			func(pc *PlatformConfig) *string { return &pc.APIBase }, checkHTTPURL),
		requireMentionKey(sl, "Channel messages (threads included) reach the agent only when they mention the app; DMs always do. false: every channel message the app receives."),
		platformString(wa, "app_secret", "",
			"Meta app secret: the key of the `X-Hub-Signature-256` HMAC on every WhatsApp webhook request. Setting it turns the WhatsApp adapter on (secret: redacted when printed).",
			func(pc *PlatformConfig) *string { return &pc.AppSecret }, nil),
		platformString(wa, "verify_token", "",
			"Token Meta sends in `hub.verify_token` when verifying the webhook URL (you choose it in the app dashboard). Required with `app_secret` (secret: redacted when printed).",
			func(pc *PlatformConfig) *string { return &pc.VerifyToken }, nil),
		platformString(wa, "access_token", "",
			"Graph API access token (a system user token) that sends replies. Required with `app_secret` (secret: redacted when printed).",
			func(pc *PlatformConfig) *string { return &pc.AccessToken }, nil),
		platformString(wa, "phone_number_id", "",
			"Id of the WhatsApp business phone number replies are sent from (`POST /{phone_number_id}/messages`). Required with `app_secret`.",
			func(pc *PlatformConfig) *string { return &pc.PhoneNumberID }, nil),
		platformString(wa, "api_base", DefaultWhatsAppAPIBase,
			"Base URL of the Graph API, with its version (tests point it at a local server).",
			func(pc *PlatformConfig) *string { return &pc.APIBase }, checkHTTPURL),
		platformString(dc, "token", "",
			"Discord bot token. Setting it turns the Discord adapter on: the Gateway connection (one per bot across the fleet) and replies (secret: redacted when printed).",
			func(pc *PlatformConfig) *string { return &pc.Token }, nil),
		platformString(dc, "public_key", "",
			"Discord application public key (64 hex digits), to verify the Ed25519 signature of interactions at POST /webhooks/discord. Empty: no interactions endpoint.",
			func(pc *PlatformConfig) *string { return &pc.PublicKey }, nil),
		platformString(dc, "application_id", "",
			"Discord application id; when set, interactions of another application are refused.",
			func(pc *PlatformConfig) *string { return &pc.ApplicationID }, nil),
		platformString(dc, "api_base", DefaultDiscordAPIBase,
			"Base URL of the Discord REST API, with its version (tests point it at a local server).",
			func(pc *PlatformConfig) *string { return &pc.APIBase }, checkHTTPURL),
		platformString(dc, "gateway_url", DefaultDiscordGateway,
			"URL of the Discord Gateway websocket (tests point it at a local server).",
			func(pc *PlatformConfig) *string { return &pc.GatewayURL }, checkWSURL),
		requireMentionKey(dc, "Guild messages (threads included) reach the agent only when they mention the bot; DMs always do. false: every guild message the bot can read."),
		liveEditsKey(tg, "Telegram", "editMessageText"),
		liveEditsKey(sl, "Slack", "chat.update"),
	}
}

// requireMentionKey is the require_mention switch of platform p.
func requireMentionKey(p session.Platform, desc string) key {
	return key{
		path: "platforms." + string(p) + ".require_mention", kind: kindBool, def: "true",
		desc: desc,
		get: func(c *Config, _ []string) (any, bool) {
			if m := c.Platforms[p].RequireMention; m != nil {
				return *m, true
			}
			return true, true
		},
		set: func(c *Config, _ []string, v any) {
			pc := c.Platforms[p]
			pc.RequireMention = nil // true is the default
			if b := v.(bool); !b {
				pc.RequireMention = &b
			}
			storePlatform(c, p, pc)
		},
	}
}

// liveEditsKey is platforms.<p>.live_edits (default true).
func liveEditsKey(p session.Platform, name, method string) key {
	return key{
		path: "platforms." + string(p) + ".live_edits", kind: kindBool, def: "true",
		desc: "A streaming agent's reply shows on " + name + " as one message edited in place (`" + method +
			"`, at most once a second per chat) until the final reply replaces its text. false: only the final reply is posted. Set it alike on every ingress.",
		get: func(c *Config, _ []string) (any, bool) {
			if m := c.Platforms[p].LiveEdits; m != nil {
				return *m, true
			}
			return true, true
		},
		set: func(c *Config, _ []string, v any) {
			pc := c.Platforms[p]
			pc.LiveEdits = nil // true is the default
			if b := v.(bool); !b {
				pc.LiveEdits = &b
			}
			storePlatform(c, p, pc)
		},
	}
}

// overridePlace is a location of a partial reset policy.
type overridePlace struct {
	path  string
	what  string
	load  func(c *Config, a []string) ResetOverride
	store func(c *Config, a []string, o ResetOverride)
	each  func(c *Config) [][]string
}

// overrideKeys returns the keys of every field of every reset override.
func overrideKeys() []key {
	places := []overridePlace{
		{
			path: "session_reset_by_chat_type." + placeholderChatType,
			what: "for one chat type (dm, group, channel, thread)",
			load: func(c *Config, a []string) ResetOverride { return c.SessionResetByChatType[a[0]] },
			store: func(c *Config, a []string, o ResetOverride) {
				if c.SessionResetByChatType == nil {
					c.SessionResetByChatType = map[string]ResetOverride{}
				}
				c.SessionResetByChatType[a[0]] = o
			},
			each: func(c *Config) [][]string {
				var out [][]string
				for _, t := range sortedKeys(c.SessionResetByChatType) {
					out = append(out, []string{t})
				}
				return out
			},
		},
		{
			path: "platforms." + placeholderPlatform + ".session_reset",
			what: "for every chat of one platform",
			load: func(c *Config, a []string) ResetOverride { return c.Platforms[session.Platform(a[0])].SessionReset },
			store: func(c *Config, a []string, o ResetOverride) {
				if c.Platforms == nil {
					c.Platforms = map[session.Platform]PlatformConfig{}
				}
				pc := c.Platforms[session.Platform(a[0])]
				pc.SessionReset = o
				c.Platforms[session.Platform(a[0])] = pc
			},
			each: func(c *Config) [][]string {
				var out [][]string
				for _, p := range sortedKeys(c.Platforms) {
					out = append(out, []string{string(p)})
				}
				return out
			},
		},
		{
			path: "platforms." + placeholderPlatform + ".session_reset_by_chat_type." + placeholderChatType,
			what: "for one chat type of one platform",
			load: func(c *Config, a []string) ResetOverride {
				return c.Platforms[session.Platform(a[0])].SessionResetByChatType[a[1]]
			},
			store: func(c *Config, a []string, o ResetOverride) {
				if c.Platforms == nil {
					c.Platforms = map[session.Platform]PlatformConfig{}
				}
				pc := c.Platforms[session.Platform(a[0])]
				if pc.SessionResetByChatType == nil {
					pc.SessionResetByChatType = map[string]ResetOverride{}
				}
				pc.SessionResetByChatType[a[1]] = o
				c.Platforms[session.Platform(a[0])] = pc
			},
			each: func(c *Config) [][]string {
				var out [][]string
				for _, p := range sortedKeys(c.Platforms) {
					for _, t := range sortedKeys(c.Platforms[p].SessionResetByChatType) {
						out = append(out, []string{string(p), t})
					}
				}
				return out
			},
		},
	}
	type overrideField struct {
		name, kind, desc string
		check            func(any) string
		get              func(o ResetOverride) (any, bool)
		set              func(o *ResetOverride, v any)
	}
	fields := []overrideField{
		{"mode", kindString, "`session_reset.mode`", checkMode,
			func(o ResetOverride) (any, bool) {
				if o.Mode == nil {
					return nil, false
				}
				return string(*o.Mode), true
			},
			func(o *ResetOverride, v any) { m := session.ResetMode(v.(string)); o.Mode = &m }},
		{"at_hour", kindInt, "`session_reset.at_hour`", checkAtHour,
			func(o ResetOverride) (any, bool) {
				if o.AtHour == nil {
					return nil, false
				}
				return *o.AtHour, true
			},
			func(o *ResetOverride, v any) { n := v.(int); o.AtHour = &n }},
		{"idle_minutes", kindInt, "`session_reset.idle_minutes`", checkIdleMinutes,
			func(o ResetOverride) (any, bool) {
				if o.IdleMinutes == nil {
					return nil, false
				}
				return *o.IdleMinutes, true
			},
			func(o *ResetOverride, v any) { n := v.(int); o.IdleMinutes = &n }},
		{"notify", kindBool, "`session_reset.notify`", nil,
			func(o ResetOverride) (any, bool) {
				if o.Notify == nil {
					return nil, false
				}
				return *o.Notify, true
			},
			func(o *ResetOverride, v any) { b := v.(bool); o.Notify = &b }},
	}
	var ks []key
	for _, pl := range places {
		for _, f := range fields {
			ks = append(ks, key{
				path:  pl.path + "." + f.name,
				kind:  f.kind,
				def:   "inherited",
				desc:  "Overrides " + f.desc + " " + pl.what + ". Unset: inherited (see \"Reset policy and its overrides\").",
				check: f.check,
				get:   func(c *Config, a []string) (any, bool) { return f.get(pl.load(c, a)) },
				set: func(c *Config, a []string, v any) {
					o := pl.load(c, a).clone()
					f.set(&o, v)
					pl.store(c, a, o)
				},
				each: pl.each,
			})
		}
	}
	return ks
}

func sortedKeys[K ~string, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Keys returns every configuration key in documentation order.
func Keys() []KeyInfo {
	def := Default()
	out := make([]KeyInfo, 0, len(keys))
	for _, k := range keys {
		d := k.def
		if d == "" {
			v, _ := k.get(&def, nil)
			d = formatValue(v)
		}
		out = append(out, KeyInfo{Path: k.path, Env: k.envVar(), EnvFallback: k.envFallback, Type: k.kind, Default: d, Description: k.desc})
	}
	return out
}

// formatValue renders a key value as text.
func formatValue(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case bool:
		return strconv.FormatBool(v)
	case int:
		return strconv.Itoa(v)
	case Duration:
		return v.String()
	case []string:
		return strings.Join(v, ",")
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

// parseValue parses text as a value of kind; problem quotes s when it fails.
func parseValue(kind, s string) (v any, problem string) {
	switch kind {
	case kindString:
		return s, ""
	case kindBool:
		b, err := strconv.ParseBool(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Sprintf("%q is not a boolean (true or false)", s)
		}
		return b, ""
	case kindInt:
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Sprintf("%q is not an integer", s)
		}
		return n, ""
	case kindList:
		out := []string{}
		for _, f := range strings.Split(s, ",") {
			if f = strings.TrimSpace(f); f != "" {
				out = append(out, f)
			}
		}
		return out, ""
	case kindDuration:
		d, err := ParseDuration(s)
		if err != nil {
			return nil, durationProblem(s)
		}
		return d, ""
	}
	return nil, fmt.Sprintf("%q: unsupported kind %s", s, kind)
}

// lookupKey finds the key of a concrete path and its placeholder arguments.
func lookupKey(path string) (key, []string, error) {
	segs := strings.Split(path, ".")
	for _, k := range keys {
		pat := strings.Split(k.path, ".")
		if len(pat) != len(segs) {
			continue
		}
		var args []string
		match := true
		for i, p := range pat {
			if isPlaceholder(p) {
				if segs[i] == "" {
					match = false
					break
				}
				args = append(args, segs[i])
				continue
			}
			if p != segs[i] {
				match = false
				break
			}
		}
		if !match {
			continue
		}
		// Refuse an unknown platform or chat type at the segment that names it.
		j := 0
		for i, p := range pat {
			if !isPlaceholder(p) {
				continue
			}
			if r := checkPlaceholder(p, args[j]); r != "" {
				return key{}, nil, &FieldError{Field: strings.Join(segs[:i+1], "."), Value: args[j], Reason: r}
			}
			j++
		}
		return k, args, nil
	}
	return key{}, nil, &FieldError{Field: path, Value: path, Reason: "unknown key"}
}

// Set parses value for the scalar key at path (a YAML path such as
// "http.addr" or "platforms.telegram.session_reset.mode") and stores it, with
// the same parsing and per-field checks as environment variables. Checks that
// involve several fields (lease.margin against lease.ttl, ...) are left to
// Validate: call it after the last Set.
func (c *Config) Set(path, value string) error {
	return c.set(path, value, "")
}

func (c *Config) set(path, value, source string) error {
	k, args, err := lookupKey(path)
	if err != nil {
		var fe *FieldError
		if asFieldError(err, &fe) {
			fe.Source = source
		}
		return err
	}
	v, problem := parseValue(k.kind, value)
	if problem == "" && k.check != nil {
		problem = k.check(v)
	}
	if problem != "" {
		return &FieldError{Field: path, Value: value, Reason: problem, Source: source}
	}
	k.set(c, args, v)
	return nil
}

// applyEnv sets every key whose environment variable is set and not empty,
// recording the variable in origin. It returns one error per refused value.
func (c *Config) applyEnv(env func(string) (string, bool), origin map[string]string) []error {
	var errs []error
	for _, k := range keys {
		name := k.envVar()
		if name == "" {
			continue
		}
		v, ok := env(name)
		if (!ok || v == "") && k.envFallback != "" {
			name = k.envFallback
			v, ok = env(name)
		}
		if !ok || v == "" {
			continue
		}
		if err := c.set(k.path, v, name); err != nil {
			errs = append(errs, err)
			continue
		}
		origin[k.path] = name
	}
	return errs
}

// checkIndexerName accepts an empty name or one of letters, digits, '-' and '_'.
func checkInboxPrefix(v any) string {
	s, _ := v.(string)
	if s == "" {
		return ""
	}
	if strings.ContainsAny(s, " \t\r\n*>") || strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".") || strings.Contains(s, "..") {
		return "want subject tokens without wildcards, such as _INBOX_worker"
	}
	return ""
}

func checkIndexerName(v any) string {
	s, _ := v.(string)
	for _, r := range s {
		if !(r == '_' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return fmt.Sprintf("%q: only letters, digits, '-' and '_'", s)
		}
	}
	return ""
}
