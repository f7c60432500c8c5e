package config

import (
	"maps"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
)

// Config is the whole configuration of a fleet process. The zero value is not
// useful: start from Default or Load. Every field documents its default; the
// YAML key of each field is given in its struct tag, and Keys lists every key
// with its environment variable.
type Config struct {
	// GroupSessionsPerUser isolates group and channel sessions per user (the
	// participant id is appended to the session key).
	//
	// Defaults to true.
	GroupSessionsPerUser bool `yaml:"group_sessions_per_user" json:"group_sessions_per_user"`

	// ThreadSessionsPerUser isolates thread sessions per user; by default every
	// participant of a thread shares one session.
	//
	// Defaults to false.
	ThreadSessionsPerUser bool `yaml:"thread_sessions_per_user" json:"thread_sessions_per_user"`

	// SessionStoreMaxAgeDays prunes sessions (entry and inbox) not updated for
	// this many days. 0 disables pruning.
	//
	// Defaults to 0.
	SessionStoreMaxAgeDays int `yaml:"session_store_max_age_days" json:"session_store_max_age_days"`

	// SessionReset is the automatic reset policy of every lane that no
	// override below matches.
	//
	// Defaults to mode both, at_hour 4, idle_minutes 1440, notify true.
	SessionReset ResetPolicy `yaml:"session_reset" json:"session_reset"`

	// SessionResetByChatType overrides SessionReset per chat type (dm, group,
	// channel, thread). Only the fields given override; the rest come from
	// SessionReset.
	//
	// Defaults to no overrides.
	SessionResetByChatType map[string]ResetOverride `yaml:"session_reset_by_chat_type,omitempty" json:"session_reset_by_chat_type,omitempty"`

	// Platforms holds per-platform settings, keyed by platform name
	// (telegram, slack, ...).
	//
	// Defaults to none.
	Platforms map[session.Platform]PlatformConfig `yaml:"platforms,omitempty" json:"platforms,omitempty"`

	// Timezone is the IANA time zone name (e.g. "Europe/Paris") in which
	// session_reset.at_hour is read. "Local" (or empty) is the process's local
	// zone (TZ or /etc/localtime); "UTC" is UTC.
	//
	// Defaults to "Local".
	Timezone string `yaml:"timezone" json:"timezone"`

	// Agent configures the agent backend and turn timing.
	Agent AgentConfig `yaml:"agent" json:"agent"`

	// WhatsApp configures WhatsApp identifier canonicalization.
	WhatsApp WhatsAppConfig `yaml:"whatsapp" json:"whatsapp"`

	// Privacy configures what the agent's prompt reveals.
	Privacy PrivacyConfig `yaml:"privacy" json:"privacy"`

	// NATS configures the connection to NATS and the names of the fleet's
	// streams, buckets and subjects.
	NATS NATSConfig `yaml:"nats" json:"nats"`

	// Embedded configures the in-process nats-server of `agentfleet up`.
	Embedded EmbeddedConfig `yaml:"embedded" json:"embedded"`

	// Lease configures the per-lane ownership lease.
	Lease LeaseConfig `yaml:"lease" json:"lease"`

	// Worker configures a worker process.
	Worker WorkerConfig `yaml:"worker" json:"worker"`

	// HTTP configures the HTTP ingress adapter.
	HTTP HTTPConfig `yaml:"http" json:"http"`

	// Delivery configures outbound reply delivery.
	Delivery DeliveryConfig `yaml:"delivery" json:"delivery"`

	// Telemetry configures logs.
	Telemetry TelemetryConfig `yaml:"telemetry" json:"telemetry"`

	// Indexer configures the state database indexer.
	Indexer IndexerConfig `yaml:"indexer" json:"indexer"`
}

// IndexerConfig configures the indexer that writes the state database.
type IndexerConfig struct {
	// DB is the SQLite file. Empty: <embedded.data_dir>/state.db under
	// `agentfleet up`; `agentfleet indexer` then needs --db.
	//
	// Defaults to "".
	DB string `yaml:"db" json:"db"`
	// Name names this indexer's durable consumers. Empty: derived from the
	// host name and the database path.
	//
	// Defaults to "".
	Name string `yaml:"name" json:"name"`
	// BatchSize is the most stream messages applied in one transaction.
	//
	// Defaults to 500.
	BatchSize int `yaml:"batch_size" json:"batch_size"`
}

// ResetPolicy is a complete automatic reset policy (seeds/session-lifecycle.md §6).
type ResetPolicy struct {
	// Mode is none (never reset automatically), idle (reset after IdleMinutes
	// without activity), daily (reset at AtHour each day) or both (whichever
	// comes first).
	//
	// Defaults to both.
	Mode session.ResetMode `yaml:"mode" json:"mode"`

	// AtHour is the hour of the daily reset, 0..23, in Config.Timezone.
	//
	// Defaults to 4.
	AtHour int `yaml:"at_hour" json:"at_hour"`

	// IdleMinutes is the inactivity after which a session resets, at least 1.
	//
	// Defaults to 1440 (24h).
	IdleMinutes int `yaml:"idle_minutes" json:"idle_minutes"`

	// Notify tells the user, on the first message after an automatic reset,
	// that the session was reset.
	//
	// Defaults to true.
	Notify bool `yaml:"notify" json:"notify"`

	// NotifyExcludePlatforms are platforms that never get an automatic
	// reset notice, whatever Notify says (only at this top level).
	//
	// Defaults to [api_server, webhook], the seed gateway's programmatic
	// endpoints; no adapter of this fleet uses those names, so nothing is
	// excluded until a platform is listed (add `http` to keep notices out
	// of the HTTP API's mailboxes).
	NotifyExcludePlatforms []string `yaml:"notify_exclude_platforms" json:"notify_exclude_platforms"`
}

// Policy returns p as the session package's policy type.
func (p ResetPolicy) Policy() session.ResetPolicy {
	return session.ResetPolicy{Mode: p.Mode, AtHour: p.AtHour, IdleMinutes: p.IdleMinutes, Notify: p.Notify}
}

// ResetOverride is a partial reset policy: a nil field inherits its value
// from the less specific level (see Config.ResetConfig).
type ResetOverride struct {
	// Mode overrides ResetPolicy.Mode when set. Defaults to inherited.
	Mode *session.ResetMode `yaml:"mode,omitempty" json:"mode,omitempty"`
	// AtHour overrides ResetPolicy.AtHour when set. Defaults to inherited.
	AtHour *int `yaml:"at_hour,omitempty" json:"at_hour,omitempty"`
	// IdleMinutes overrides ResetPolicy.IdleMinutes when set. Defaults to inherited.
	IdleMinutes *int `yaml:"idle_minutes,omitempty" json:"idle_minutes,omitempty"`
	// Notify overrides ResetPolicy.Notify when set. Defaults to inherited.
	Notify *bool `yaml:"notify,omitempty" json:"notify,omitempty"`
}

// IsZero reports whether o overrides nothing.
func (o ResetOverride) IsZero() bool {
	return o.Mode == nil && o.AtHour == nil && o.IdleMinutes == nil && o.Notify == nil
}

// Apply returns p with the fields o sets replaced.
func (o ResetOverride) Apply(p session.ResetPolicy) session.ResetPolicy {
	if o.Mode != nil {
		p.Mode = *o.Mode
	}
	if o.AtHour != nil {
		p.AtHour = *o.AtHour
	}
	if o.IdleMinutes != nil {
		p.IdleMinutes = *o.IdleMinutes
	}
	if o.Notify != nil {
		p.Notify = *o.Notify
	}
	return p
}

// PlatformConfig holds the settings of one platform.
type PlatformConfig struct {
	// SessionReset overrides the reset policy for every chat of this
	// platform. Only the fields given override.
	//
	// Defaults to no override.
	SessionReset ResetOverride `yaml:"session_reset,omitempty" json:"session_reset,omitzero"`

	// SessionResetByChatType overrides the reset policy for one chat type of
	// this platform. Only the fields given override.
	//
	// Defaults to no overrides.
	SessionResetByChatType map[string]ResetOverride `yaml:"session_reset_by_chat_type,omitempty" json:"session_reset_by_chat_type,omitempty"`

	// Token is the bot token (telegram, discord). Secret. Setting it turns
	// the platform's adapter on.
	//
	// Defaults to "".
	Token string `yaml:"token,omitempty" json:"token,omitempty"`

	// WebhookSecret is the secret_token Telegram sends with every webhook
	// request (telegram only). Secret. Required in webhook mode.
	//
	// Defaults to "".
	WebhookSecret string `yaml:"webhook_secret,omitempty" json:"webhook_secret,omitempty"`

	// Mode is how updates arrive: for telegram webhook or poll (default
	// webhook), for slack events (the Events API) or socket (Socket Mode;
	// default events).
	//
	// Defaults to the platform's webhook.
	Mode string `yaml:"mode,omitempty" json:"mode,omitempty"`

	// APIBase is the base URL of the platform's API (telegram, slack,
	// whatsapp, discord).
	//
	// Defaults to the platform's public API.
	APIBase string `yaml:"api_base,omitempty" json:"api_base,omitempty"`

	// SigningSecret verifies Slack's request signatures (slack only). Secret.
	//
	// Defaults to "".
	SigningSecret string `yaml:"signing_secret,omitempty" json:"signing_secret,omitempty"`

	// BotToken is the Slack bot token, xoxb-... (slack only). Secret.
	//
	// Defaults to "".
	BotToken string `yaml:"bot_token,omitempty" json:"bot_token,omitempty"`

	// AppToken is the Slack app-level token, xapp-... (slack only), for
	// Socket Mode. Secret.
	//
	// Defaults to "".
	AppToken string `yaml:"app_token,omitempty" json:"app_token,omitempty"`

	// RequireMention makes channel messages (threads included) reach the
	// agent only when they mention the app (slack, discord); DMs never need
	// one.
	//
	// Defaults to true.
	RequireMention *bool `yaml:"require_mention,omitempty" json:"require_mention,omitempty"`

	// LiveEdits shows a streaming agent's reply as one message edited in
	// place while it is written (telegram, slack).
	//
	// Defaults to true.
	LiveEdits *bool `yaml:"live_edits,omitempty" json:"live_edits,omitempty"`

	// AppSecret is the Meta app secret that signs WhatsApp webhooks
	// (whatsapp only). Secret.
	//
	// Defaults to "".
	AppSecret string `yaml:"app_secret,omitempty" json:"app_secret,omitempty"`

	// VerifyToken is the token of Meta's webhook verification handshake
	// (whatsapp only). Secret.
	//
	// Defaults to "".
	VerifyToken string `yaml:"verify_token,omitempty" json:"verify_token,omitempty"`

	// AccessToken is the Graph API token that sends WhatsApp messages
	// (whatsapp only). Secret.
	//
	// Defaults to "".
	AccessToken string `yaml:"access_token,omitempty" json:"access_token,omitempty"`

	// PhoneNumberID is the WhatsApp business phone number id replies are
	// sent from (whatsapp only).
	//
	// Defaults to "".
	PhoneNumberID string `yaml:"phone_number_id,omitempty" json:"phone_number_id,omitempty"`

	// PublicKey is the Discord application's Ed25519 public key, hex
	// (discord only).
	//
	// Defaults to "".
	PublicKey string `yaml:"public_key,omitempty" json:"public_key,omitempty"`

	// ApplicationID is the Discord application id (discord only).
	//
	// Defaults to "".
	ApplicationID string `yaml:"application_id,omitempty" json:"application_id,omitempty"`

	// GatewayURL is the Discord Gateway URL (discord only).
	//
	// Defaults to Discord's Gateway.
	GatewayURL string `yaml:"gateway_url,omitempty" json:"gateway_url,omitempty"`
}

// Platform API defaults.
const (
	DefaultTelegramAPIBase = "https://api.telegram.org"
	DefaultSlackAPIBase    = "https://slack.com/api/"
	DefaultWhatsAppAPIBase = "https://graph.facebook.com/v23.0"
	DefaultDiscordAPIBase  = "https://discord.com/api/v10"
	DefaultDiscordGateway  = "wss://gateway.discord.gg"
	TelegramModeWebhook    = "webhook"
	TelegramModePoll       = "poll"
	SlackModeEvents        = "events"
	SlackModeSocket        = "socket"
)

// TelegramSettings are the effective Telegram settings (defaults applied).
type TelegramSettings struct {
	Token, WebhookSecret, Mode, APIBase string
	LiveEdits                           bool
}

// Telegram returns the Telegram settings; Token empty means the adapter is off.
func (c Config) Telegram() TelegramSettings {
	pc := c.Platforms[session.PlatformTelegram]
	s := TelegramSettings{Token: pc.Token, WebhookSecret: pc.WebhookSecret, Mode: pc.Mode, APIBase: pc.APIBase,
		LiveEdits: pc.LiveEdits == nil || *pc.LiveEdits}
	if s.Mode == "" {
		s.Mode = TelegramModeWebhook
	}
	if s.APIBase == "" {
		s.APIBase = DefaultTelegramAPIBase
	}
	return s
}

// SlackSettings are the effective Slack settings (defaults applied).
type SlackSettings struct {
	SigningSecret, BotToken, AppToken, APIBase, Mode string
	RequireMention, LiveEdits                        bool
}

// Enabled reports whether the Slack adapter is configured: a signing secret
// for the Events API, an app-level token for Socket Mode.
func (s SlackSettings) Enabled() bool {
	if s.Mode == SlackModeSocket {
		return s.AppToken != ""
	}
	return s.SigningSecret != ""
}

// Slack returns the Slack settings.
func (c Config) Slack() SlackSettings {
	pc := c.Platforms[session.PlatformSlack]
	s := SlackSettings{SigningSecret: pc.SigningSecret, BotToken: pc.BotToken, AppToken: pc.AppToken, APIBase: pc.APIBase,
		Mode: pc.Mode, RequireMention: true, LiveEdits: pc.LiveEdits == nil || *pc.LiveEdits}
	if s.Mode == "" {
		s.Mode = SlackModeEvents
	}
	if pc.RequireMention != nil {
		s.RequireMention = *pc.RequireMention
	}
	if s.APIBase == "" {
		s.APIBase = DefaultSlackAPIBase
	}
	return s
}

// WhatsAppSettings are the effective WhatsApp Cloud API settings.
type WhatsAppSettings struct {
	AppSecret, VerifyToken, AccessToken, PhoneNumberID, APIBase string
}

// Enabled reports whether the WhatsApp adapter is configured (its app
// secret is set).
func (s WhatsAppSettings) Enabled() bool { return s.AppSecret != "" }

// WhatsAppCloud returns the WhatsApp Cloud API settings.
func (c Config) WhatsAppCloud() WhatsAppSettings {
	pc := c.Platforms[session.PlatformWhatsApp]
	s := WhatsAppSettings{AppSecret: pc.AppSecret, VerifyToken: pc.VerifyToken, AccessToken: pc.AccessToken,
		PhoneNumberID: pc.PhoneNumberID, APIBase: pc.APIBase}
	if s.APIBase == "" {
		s.APIBase = DefaultWhatsAppAPIBase
	}
	return s
}

// DiscordSettings are the effective Discord settings.
type DiscordSettings struct {
	Token, PublicKey, ApplicationID, APIBase, GatewayURL string
	RequireMention                                       bool
}

// Discord returns the Discord settings; Token empty means the adapter is
// off.
func (c Config) Discord() DiscordSettings {
	pc := c.Platforms[session.PlatformDiscord]
	s := DiscordSettings{Token: pc.Token, PublicKey: pc.PublicKey, ApplicationID: pc.ApplicationID, APIBase: pc.APIBase,
		GatewayURL: pc.GatewayURL, RequireMention: true}
	if pc.RequireMention != nil {
		s.RequireMention = *pc.RequireMention
	}
	if s.APIBase == "" {
		s.APIBase = DefaultDiscordAPIBase
	}
	if s.GatewayURL == "" {
		s.GatewayURL = DefaultDiscordGateway
	}
	return s
}

// ConnectedPlatforms lists the platforms this configuration delivers to:
// http always, telegram, slack, whatsapp and discord when configured.
func (c Config) ConnectedPlatforms() []session.Platform {
	out := []session.Platform{session.PlatformHTTP}
	if c.Telegram().Token != "" {
		out = append(out, session.PlatformTelegram)
	}
	if c.Slack().Enabled() {
		out = append(out, session.PlatformSlack)
	}
	if c.WhatsAppCloud().Enabled() {
		out = append(out, session.PlatformWhatsApp)
	}
	if c.Discord().Token != "" {
		out = append(out, session.PlatformDiscord)
	}
	return out
}

// AgentConfig configures the agent backend and turn timing.
type AgentConfig struct {
	// Backend selects the agent backend (echo is deterministic and needs no
	// network).
	//
	// Defaults to "echo".
	Backend string `yaml:"backend" json:"backend"`

	// GatewayTimeout is the longest a turn's agent run may take; an owner whose
	// agent hangs stops renewing its lease after this plus a grace.
	//
	// Defaults to 30m (1800 seconds).
	GatewayTimeout Duration `yaml:"gateway_timeout" json:"gateway_timeout"`

	// GatewayAutoContinueFreshness is how long after an interruption a
	// resume_pending session is resumed rather than reset by policy.
	//
	// Defaults to 1h (3600 seconds).
	GatewayAutoContinueFreshness Duration `yaml:"gateway_auto_continue_freshness" json:"gateway_auto_continue_freshness"`

	// RestartDrainTimeout is how long a stopping worker waits for running turns
	// before cancelling them. 0 cancels at once.
	//
	// Defaults to 1m (60 seconds).
	RestartDrainTimeout Duration `yaml:"restart_drain_timeout" json:"restart_drain_timeout"`

	// AllowCrash lets the echo agent's !crash directive exit the worker
	// process (for tests only).
	//
	// Defaults to false.
	AllowCrash bool `yaml:"allow_crash" json:"allow_crash"`

	// Bridge configures the bridge backend (agent.backend: bridge).
	Bridge BridgeConfig `yaml:"bridge" json:"bridge"`

	// OpenAI configures the openai backend (agent.backend: openai).
	OpenAI OpenAIConfig `yaml:"openai" json:"openai"`
}

// BridgeConfig configures the bridge backend: an agent in any language
// behind an HTTP endpoint (docs/agents.md is the protocol).
type BridgeConfig struct {
	// URL is where each turn is POSTed. Required by the bridge backend.
	//
	// Defaults to "".
	URL string `yaml:"url" json:"url"`

	// Token, when set, is sent as a bearer token with every turn. Secret.
	//
	// Defaults to "".
	Token string `yaml:"token" json:"token"`
}

// OpenAIConfig configures the openai backend: any server speaking the
// OpenAI chat-completions API.
type OpenAIConfig struct {
	// Model is the model name sent with every request. Required by the
	// openai backend.
	//
	// Defaults to "".
	Model string `yaml:"model" json:"model"`

	// BaseURL is the API's base URL (e.g. http://127.0.0.1:11434/v1 for
	// Ollama); OPENAI_BASE_URL sets it too.
	//
	// Defaults to "" (the OpenAI API).
	BaseURL string `yaml:"base_url" json:"base_url"`

	// APIKey is the API key; OPENAI_API_KEY sets it too. Secret.
	//
	// Defaults to "".
	APIKey string `yaml:"api_key" json:"api_key"`

	// SystemPrompt opens the system prompt of every turn, before the session
	// context and the turn's notes.
	//
	// Defaults to "".
	SystemPrompt string `yaml:"system_prompt" json:"system_prompt"`

	// MaxToolSteps bounds the model calls of one turn that end in tool
	// calls; the next call is made without tools, so the model answers.
	//
	// Defaults to 8.
	MaxToolSteps int `yaml:"max_tool_steps" json:"max_tool_steps"`

	// MaxRetries bounds the retries of one model call that failed with a
	// 429, a 5xx or a connection error (exponential backoff, within the
	// turn's deadline).
	//
	// Defaults to 4.
	MaxRetries int `yaml:"max_retries" json:"max_retries"`

	// ToolTimeout bounds one MCP tool call; a call that takes longer fails
	// (the model is told), not the turn.
	//
	// Defaults to 2m (120 seconds).
	ToolTimeout Duration `yaml:"tool_timeout" json:"tool_timeout"`

	// Images is how the photos of a turn reach the model: inline (the
	// worker fetches each from its attachment URL and sends it as a data
	// URL), url (the URL itself; the provider must reach it) or none (a
	// text-only model; attachments are described in the text).
	//
	// Defaults to "inline".
	Images string `yaml:"images" json:"images"`

	// MCPServers are the MCP servers whose tools the model may call (file
	// only).
	//
	// Defaults to none.
	MCPServers []MCPServerConfig `yaml:"mcp_servers,omitempty" json:"mcp_servers,omitempty"`

	// Prices maps model names to their prices, for the estimated cost of
	// each turn (file only). A model without a price has cost_status
	// unknown.
	//
	// Defaults to none.
	Prices map[string]PriceConfig `yaml:"prices,omitempty" json:"prices,omitempty"`
}

// MCPServerConfig is one MCP server: a command run with its standard input
// and output as the transport, or the URL of a streamable HTTP server.
type MCPServerConfig struct {
	// Name prefixes the server's tool names ("<name>__<tool>"). Required,
	// unique, letters, digits, '_' or '-'.
	Name string `yaml:"name" json:"name"`
	// Command is the program and its arguments (stdio transport).
	Command []string `yaml:"command" json:"command"`
	// Env adds variables to the command's environment.
	Env map[string]string `yaml:"env" json:"env"`
	// URL is the endpoint of a streamable HTTP server.
	URL string `yaml:"url" json:"url"`
	// Headers are sent with every HTTP request (e.g. Authorization).
	// Secret values.
	Headers map[string]string `yaml:"headers" json:"headers"`
}

// PriceConfig is a model's price in US dollars per million tokens.
type PriceConfig struct {
	Input      float64 `yaml:"input" json:"input"`
	Output     float64 `yaml:"output" json:"output"`
	CacheRead  float64 `yaml:"cache_read" json:"cache_read"`
	CacheWrite float64 `yaml:"cache_write" json:"cache_write"`
}

// PrivacyConfig configures what the agent's prompt reveals.
type PrivacyConfig struct {
	// RedactPII replaces user ids and chat ids in the session context
	// prompt with stable hashes (user_<12hex>, <platform>:<12hex>), except
	// on platforms that need raw ids for mentions (Discord). Routing,
	// session keys and delivery always use the real ids.
	//
	// Defaults to false.
	RedactPII bool `yaml:"redact_pii" json:"redact_pii"`
}

// WhatsAppConfig configures WhatsApp identifier canonicalization.
type WhatsAppConfig struct {
	// MappingDir is a directory of JID/LID alias mapping files used to
	// canonicalize WhatsApp identifiers. Empty means normalization only.
	//
	// Defaults to "".
	MappingDir string `yaml:"mapping_dir" json:"mapping_dir"`
}

// NATSConfig configures the connection to NATS.
type NATSConfig struct {
	// URL is the NATS server URL, or several separated by commas. Read from
	// AGENTFLEET_NATS_URL in the environment or, when that is unset, from
	// NATS_URL. Not used by `agentfleet up`, which connects in-process to its
	// embedded server.
	//
	// Defaults to "nats://127.0.0.1:4222".
	URL string `yaml:"url" json:"url"`

	// User is the user name for user/password authentication.
	//
	// Defaults to "".
	User string `yaml:"user" json:"user"`

	// Password is the password for user/password authentication. Secret.
	//
	// Defaults to "".
	Password string `yaml:"password" json:"password"`

	// Creds is the path of a NATS credentials file (JWT + nkey seed).
	//
	// Defaults to "".
	Creds string `yaml:"creds" json:"creds"`

	// NKey is the path of an nkey seed file (a user seed, "SU...") to
	// authenticate with.
	//
	// Defaults to "".
	NKey string `yaml:"nkey" json:"nkey"`

	// Token is the token for token authentication. Secret.
	//
	// Defaults to "".
	Token string `yaml:"token" json:"token"`

	// TLS configures TLS to the server.
	TLS TLSConfig `yaml:"tls" json:"tls"`

	// Prefix is the first token of every subject and the base of every stream,
	// bucket and consumer name, so that several fleets can share one account.
	// Letters, digits, '_' and '-' only.
	//
	// Defaults to "fleet".
	Prefix string `yaml:"prefix" json:"prefix"`

	// Replicas is the replica count of streams and buckets: 1, 3 or 5.
	//
	// Defaults to 1.
	Replicas int `yaml:"replicas" json:"replicas"`

	// InboxStreams is how many inbox streams the 64 partitions are spread
	// over (partition p in stream p mod N), 1 to 16. A new fleet is provisioned with
	// it; 0 takes the fleet's current count (1 for a new fleet). A non-zero
	// value that differs from the fleet's is refused at start: change the
	// count of a running fleet with `fleetctl inbox streams N`.
	//
	// Defaults to 0.
	InboxStreams int `yaml:"inbox_streams" json:"inbox_streams"`

	// ConnectTimeout bounds the initial connection.
	//
	// Defaults to 5s.
	ConnectTimeout Duration `yaml:"connect_timeout" json:"connect_timeout"`

	// ConnectWait is how long a process waits at start for NATS to be
	// reachable, retrying with backoff and logging "waiting for NATS at
	// <url>", before it exits with an error. 0 gives up at the first failure.
	//
	// Defaults to 1m.
	ConnectWait Duration `yaml:"connect_wait" json:"connect_wait"`

	// InboxPrefix is the prefix of this process's reply subjects. A NATS
	// user whose permissions allow only its own prefix cannot read the
	// replies to other users' requests. Empty: "_INBOX".
	//
	// Defaults to "".
	InboxPrefix string `yaml:"inbox_prefix" json:"inbox_prefix"`

	// Provision makes the process create or update the fleet's streams,
	// buckets and workers consumer at start. False: it only binds to them
	// and fails, naming what is missing, when the fleet is not provisioned
	// (for NATS users without the right to create them; provision with
	// `agentfleet provision` as an admin user).
	//
	// Defaults to true.
	Provision bool `yaml:"provision" json:"provision"`
}

// TLSConfig configures TLS to the NATS server.
type TLSConfig struct {
	// CA is the path of a PEM file of CAs to trust. Empty uses the system pool.
	//
	// Defaults to "".
	CA string `yaml:"ca" json:"ca"`
	// Cert is the path of the PEM client certificate (needs Key).
	//
	// Defaults to "".
	Cert string `yaml:"cert" json:"cert"`
	// Key is the path of the PEM client key (needs Cert).
	//
	// Defaults to "".
	Key string `yaml:"key" json:"key"`
	// InsecureSkipVerify disables server certificate verification (tests only).
	//
	// Defaults to false.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify" json:"insecure_skip_verify"`
}

// EmbeddedConfig configures the in-process nats-server of `agentfleet up`.
type EmbeddedConfig struct {
	// DataDir is the JetStream file store directory.
	//
	// Defaults to "./data".
	DataDir string `yaml:"data_dir" json:"data_dir"`

	// Listen is a host:port on which the embedded server also accepts client
	// connections (other processes, the nats CLI). Empty means in-process
	// only.
	//
	// Defaults to "".
	Listen string `yaml:"listen" json:"listen"`

	// Sync is the JetStream fsync policy: "default" (nats-server's periodic
	// fsync, every 2m), "always" (fsync every write before acknowledging it),
	// or an interval like "10s". Without "always" an OS crash or power loss
	// can lose acknowledged writes; a process crash alone loses nothing.
	//
	// Defaults to "default".
	Sync string `yaml:"sync" json:"sync"`

	// Users is the path of a users file (YAML, see docs/security.md): with
	// it every client of the listen port needs one of its users, and gets
	// the permissions of the user's role. Empty: no authentication.
	//
	// Defaults to "".
	Users string `yaml:"users" json:"users"`

	// Monitor is a host:port for the server's HTTP monitoring endpoints
	// (/varz, /jsz, /healthz). Empty: none.
	//
	// Defaults to "".
	Monitor string `yaml:"monitor" json:"monitor"`

	// TLS makes the listen port take TLS connections only.
	TLS ServerTLSConfig `yaml:"tls" json:"tls"`
}

// ServerTLSConfig is the TLS of the embedded server's client port.
type ServerTLSConfig struct {
	// Cert is the PEM server certificate (needs Key).
	//
	// Defaults to "".
	Cert string `yaml:"cert" json:"cert"`
	// Key is the PEM key of Cert.
	//
	// Defaults to "".
	Key string `yaml:"key" json:"key"`
	// CA is a PEM file of CAs: when set, every client must present a
	// certificate signed by one of them.
	//
	// Defaults to "".
	CA string `yaml:"ca" json:"ca"`
}

// SyncOptions returns the nats-server settings for Sync: always is true for
// "always"; interval is the fsync interval, 0 for the server's default.
// Sync must be valid (see Validate).
func (e EmbeddedConfig) SyncOptions() (interval time.Duration, always bool) {
	switch e.Sync {
	case "", SyncDefault:
		return 0, false
	case SyncAlways:
		return 0, true
	}
	d, err := ParseDuration(e.Sync)
	if err != nil {
		return 0, false
	}
	return d.Duration(), false
}

// DefaultHTTPAddr is the default http.addr: loopback only.
const DefaultHTTPAddr = "127.0.0.1:8080"

// Values of EmbeddedConfig.Sync besides an interval.
const (
	SyncDefault = "default"
	SyncAlways  = "always"
)

// LeaseConfig configures the per-lane ownership lease.
type LeaseConfig struct {
	// TTL is the server-side lifetime of a lane lease; the owner renews it
	// every TTL/3. At least 3s.
	//
	// Defaults to 15s.
	TTL Duration `yaml:"ttl" json:"ttl"`

	// Margin is how long before its lease could expire (last confirmed
	// renewal + TTL) an owner stops making durable changes. Positive and less
	// than TTL/2.
	//
	// Defaults to 2s.
	Margin Duration `yaml:"margin" json:"margin"`

	// LivenessTTL is the server-side lifetime of a worker's liveness
	// lease, renewed every LivenessTTL/4. Lane leases are bound to it: once
	// it is gone, the worker's lanes may be taken over. Whole seconds, at
	// least 1s.
	//
	// Defaults to 2s.
	LivenessTTL Duration `yaml:"liveness_ttl" json:"liveness_ttl"`
}

// Busy modes (WorkerConfig.BusyMode).
const (
	BusyInterrupt = "interrupt"
	BusyQueue     = "queue"
	BusySteer     = "steer"
)

// WorkerConfig configures a worker process.
type WorkerConfig struct {
	// ID names the worker in leases and logs. Empty means Load sets it to
	// "<hostname>-<pid>".
	//
	// Defaults to "<hostname>-<pid>" (computed by Load).
	ID string `yaml:"id" json:"id"`

	// Lanes is the most lanes this worker owns at once; at capacity it stops
	// pulling. At least 1.
	//
	// Defaults to 64.
	Lanes int `yaml:"lanes" json:"lanes"`

	// Turns is the most turns this worker runs at once. At least 1.
	//
	// Defaults to 16.
	Turns int `yaml:"turns" json:"turns"`

	// Linger is how long an idle lane stays owned so that follow-ups meet the
	// warm agent cache. 0 releases at once.
	//
	// Defaults to 30s.
	Linger Duration `yaml:"linger" json:"linger"`

	// BusyMode is what a message arriving during a running turn does, for
	// lanes that did not choose with /busy: interrupt, queue or steer.
	//
	// Defaults to "interrupt".
	BusyMode string `yaml:"busy_mode" json:"busy_mode"`

	// MaxTurnMessages caps the inbox messages one turn takes. At least 1.
	//
	// Defaults to 50.
	MaxTurnMessages int `yaml:"max_turn_messages" json:"max_turn_messages"`

	// MaxTurnBytes caps the bytes of message text one turn takes (a turn always
	// takes at least one message). At least 1.
	//
	// Defaults to 262144 (256 KiB).
	MaxTurnBytes int `yaml:"max_turn_bytes" json:"max_turn_bytes"`

	// CacheSize is the most agents kept warm in the worker's LRU cache. At
	// least 1.
	//
	// Defaults to 128.
	CacheSize int `yaml:"cache_size" json:"cache_size"`

	// CacheIdleTTL evicts a cached agent unused for this long. Positive.
	//
	// Defaults to 1h.
	CacheIdleTTL Duration `yaml:"cache_idle_ttl" json:"cache_idle_ttl"`
}

// HTTPConfig configures the HTTP ingress adapter.
type HTTPConfig struct {
	// Addr is the host:port the HTTP server listens on. A non-loopback
	// address needs Token or AllowUnauthenticated (see CheckHTTP).
	//
	// Defaults to "127.0.0.1:8080" (this machine only).
	Addr string `yaml:"addr" json:"addr"`

	// Token, when set, is the bearer token every request but /healthz and
	// /readyz must carry. Secret.
	//
	// Defaults to "" (no authentication).
	Token string `yaml:"token" json:"token"`

	// AllowUnauthenticated lets the HTTP server listen on a non-loopback
	// address with no Token (for a server behind an authenticating proxy or
	// on a private network).
	//
	// Defaults to false.
	AllowUnauthenticated bool `yaml:"allow_unauthenticated" json:"allow_unauthenticated"`

	// ScopedTokensFile is the path of a JSON file of bearer tokens each
	// limited to session-key prefixes (one tenant's front end):
	// [{"token": "...", "key_prefixes": ["agent:main:http:dm:acme-"]}].
	// Must exist when set. Its tokens are secrets and never printed.
	//
	// Defaults to "" (no scoped tokens).
	ScopedTokensFile string `yaml:"scoped_tokens_file" json:"scoped_tokens_file"`

	// MaxBodyBytes caps a request body. At least 1.
	//
	// Defaults to 1048576 (1 MiB).
	MaxBodyBytes int `yaml:"max_body_bytes" json:"max_body_bytes"`

	// MaxReadersPerClient bounds the reply readers (long polls of /replies,
	// /events streams) one client (bearer token, else IP address) holds
	// open at once; past it the server answers 429. At least 1.
	//
	// Defaults to 256.
	MaxReadersPerClient int `yaml:"max_readers_per_client" json:"max_readers_per_client"`

	// PublicURL is the URL at which agents (workers, and a model provider
	// given image URLs) reach this ingress: the base of the media links of
	// platforms whose file URLs need the bot's credentials (Telegram,
	// Slack). See PublicBaseURL.
	//
	// Defaults to "" (http://<http.addr>, with a loopback host when the
	// address names none).
	PublicURL string `yaml:"public_url" json:"public_url"`
}

// DeliveryConfig configures outbound reply delivery.
type DeliveryConfig struct {
	// Backoff is the delay before the first retry of a failed delivery; it
	// doubles per attempt up to 5s (or Backoff, if longer). Positive.
	//
	// Defaults to 100ms.
	Backoff Duration `yaml:"backoff" json:"backoff"`

	// MaxAttempts is how many failed sends of one reply a chat-platform
	// delivery makes before it gives the reply up and records a
	// delivery_failed event (rate-limit answers do not count). At least 1.
	//
	// Defaults to 8.
	MaxAttempts int `yaml:"max_attempts" json:"max_attempts"`

	// MaxAge is the age of a reply after which a chat-platform delivery
	// gives it up at its next failed send. Positive.
	//
	// Defaults to 1h.
	MaxAge Duration `yaml:"max_age" json:"max_age"`
}

// TelemetryConfig configures logs and metrics.
type TelemetryConfig struct {
	// LogLevel is the minimum level logged: debug, info, warn or error.
	//
	// Defaults to "info".
	LogLevel string `yaml:"log_level" json:"log_level"`

	// LogFormat is text or json.
	//
	// Defaults to "text".
	LogFormat string `yaml:"log_format" json:"log_format"`

	// MetricsAddr is the host:port on which workers (and up) serve the
	// Prometheus /metrics endpoint; the ingress also serves it on its HTTP
	// address.
	//
	// Defaults to "" (no separate metrics endpoint).
	MetricsAddr string `yaml:"metrics_addr" json:"metrics_addr"`
}

// Default returns the built-in defaults. It does no I/O: Worker.ID is left
// empty (Load computes it) and Timezone is "Local".
func Default() Config {
	return Config{
		GroupSessionsPerUser:   true,
		ThreadSessionsPerUser:  false,
		SessionStoreMaxAgeDays: 0,
		SessionReset: ResetPolicy{
			Mode:                   session.ResetBoth,
			AtHour:                 4,
			IdleMinutes:            1440,
			Notify:                 true,
			NotifyExcludePlatforms: []string{"api_server", "webhook"},
		},
		Timezone: "Local",
		Agent: AgentConfig{
			Backend:                      "echo",
			GatewayTimeout:               Duration(1800 * time.Second),
			GatewayAutoContinueFreshness: Duration(3600 * time.Second),
			RestartDrainTimeout:          Duration(60 * time.Second),
			OpenAI:                       OpenAIConfig{MaxToolSteps: 8, MaxRetries: 4, ToolTimeout: Duration(120 * time.Second), Images: "inline"},
		},
		NATS: NATSConfig{
			URL:            "nats://127.0.0.1:4222",
			Prefix:         "fleet",
			Replicas:       1,
			ConnectTimeout: Duration(5 * time.Second),
			ConnectWait:    Duration(time.Minute),
			Provision:      true,
		},
		Embedded: EmbeddedConfig{
			DataDir: "./data",
			Sync:    SyncDefault,
		},
		Lease: LeaseConfig{
			TTL:         Duration(broker.DefaultLeaseTTL),
			Margin:      Duration(broker.DefaultLeaseMargin),
			LivenessTTL: Duration(broker.DefaultLivenessTTL),
		},
		Worker: WorkerConfig{
			Lanes:           64,
			Turns:           16,
			Linger:          Duration(30 * time.Second),
			BusyMode:        BusyInterrupt,
			MaxTurnMessages: 50,
			MaxTurnBytes:    256 << 10,
			CacheSize:       128,
			CacheIdleTTL:    Duration(time.Hour),
		},
		HTTP: HTTPConfig{
			Addr:         DefaultHTTPAddr,
			MaxBodyBytes: 1 << 20,

			MaxReadersPerClient: 256,
		},
		Indexer: IndexerConfig{BatchSize: 500},
		Delivery: DeliveryConfig{
			Backoff:     Duration(100 * time.Millisecond),
			MaxAttempts: 8,
			MaxAge:      Duration(time.Hour),
		},
		Telemetry: TelemetryConfig{
			LogLevel:  "info",
			LogFormat: "text",
		},
	}
}

// ResetConfig resolves the reset policy and its overrides into complete
// policies. Each field of a lane's policy comes from the most specific level
// that sets it:
//
//	platforms.<p>.session_reset_by_chat_type.<t>
//	platforms.<p>.session_reset
//	session_reset_by_chat_type.<t>
//	session_reset
//
// The result's lookup order (ByPlatformChatType, ByPlatform, ByChatType,
// Default) then gives every (platform, chat type) exactly that layering: a
// ByPlatformChatType entry is materialized wherever a platform override and a
// chat-type override meet. Overrides that set no field are ignored.
func (c Config) ResetConfig() session.ResetConfig {
	base := c.SessionReset.Policy()
	rc := session.ResetConfig{
		Default:            base,
		ByPlatform:         map[session.Platform]session.ResetPolicy{},
		ByChatType:         map[string]session.ResetPolicy{},
		ByPlatformChatType: map[session.Platform]map[string]session.ResetPolicy{},
	}
	for _, p := range c.SessionReset.NotifyExcludePlatforms {
		rc.NotifyExcludePlatforms = append(rc.NotifyExcludePlatforms, session.Platform(p))
	}
	for t, o := range c.SessionResetByChatType {
		if !o.IsZero() {
			rc.ByChatType[t] = o.Apply(base)
		}
	}
	for p, pc := range c.Platforms {
		types := map[string]bool{}
		if !pc.SessionReset.IsZero() {
			rc.ByPlatform[p] = pc.SessionReset.Apply(base)
			for t := range rc.ByChatType {
				types[t] = true
			}
		}
		for t, o := range pc.SessionResetByChatType {
			if !o.IsZero() {
				types[t] = true
			}
		}
		if len(types) == 0 {
			continue
		}
		byType := map[string]session.ResetPolicy{}
		for t := range types {
			pol := c.SessionResetByChatType[t].Apply(base)
			pol = pc.SessionReset.Apply(pol)
			pol = pc.SessionResetByChatType[t].Apply(pol)
			byType[t] = pol
		}
		rc.ByPlatformChatType[p] = byType
	}
	return rc
}

// KeyOptions returns the session-key switches. The WhatsApp resolver is left
// nil: the caller attaches one built from WhatsApp.MappingDir.
func (c Config) KeyOptions() session.KeyOptions {
	return session.KeyOptions{
		GroupSessionsPerUser:  c.GroupSessionsPerUser,
		ThreadSessionsPerUser: c.ThreadSessionsPerUser,
	}
}

// Location returns the time zone named by Timezone. Validate refuses a name
// that does not load; for such a name Location returns time.Local.
func (c Config) Location() *time.Location {
	loc, err := loadLocation(c.Timezone)
	if err != nil {
		return time.Local
	}
	return loc
}

func loadLocation(name string) (*time.Location, error) {
	if name == "" || name == "Local" {
		return time.Local, nil
	}
	return time.LoadLocation(name)
}

// redactedValue replaces a secret in Redacted.
const redactedValue = "[redacted]"

// Redacted returns a copy of c for printing: nats.password, nats.token,
// http.token, the agent keys and the platform tokens and secrets, when set,
// are replaced by "[redacted]" (an unset secret stays empty, so the output
// still tells whether one is configured), and a user information inside
// nats.url by "[redacted]".
func (c Config) Redacted() Config {
	r := c.clone()
	r.NATS.URL = broker.RedactURL(r.NATS.URL)
	for _, s := range []*string{&r.NATS.Password, &r.NATS.Token, &r.HTTP.Token, &r.Agent.Bridge.Token, &r.Agent.OpenAI.APIKey} {
		if *s != "" {
			*s = redactedValue
		}
	}
	for i := range r.Agent.OpenAI.MCPServers {
		h := map[string]string{}
		for k := range r.Agent.OpenAI.MCPServers[i].Headers {
			h[k] = redactedValue
		}
		if len(h) > 0 {
			r.Agent.OpenAI.MCPServers[i].Headers = h
		}
	}
	for p, pc := range r.Platforms {
		for _, s := range []*string{&pc.Token, &pc.WebhookSecret, &pc.SigningSecret, &pc.BotToken, &pc.AppToken, &pc.AppSecret, &pc.VerifyToken, &pc.AccessToken} {
			if *s != "" {
				*s = redactedValue
			}
		}
		r.Platforms[p] = pc
	}
	return r
}

// clone returns a deep copy of c: its maps and override pointers are not
// shared with c.
func (c Config) clone() Config {
	r := c
	r.SessionReset.NotifyExcludePlatforms = slices.Clone(c.SessionReset.NotifyExcludePlatforms)
	r.SessionResetByChatType = cloneOverrides(c.SessionResetByChatType)
	if c.Platforms != nil {
		r.Platforms = make(map[session.Platform]PlatformConfig, len(c.Platforms))
		for p, pc := range c.Platforms {
			pc.SessionReset = pc.SessionReset.clone()
			pc.SessionResetByChatType = cloneOverrides(pc.SessionResetByChatType)
			pc.RequireMention = clonePtr(pc.RequireMention)
			pc.LiveEdits = clonePtr(pc.LiveEdits)
			r.Platforms[p] = pc
		}
	}
	if c.Agent.OpenAI.MCPServers != nil {
		r.Agent.OpenAI.MCPServers = make([]MCPServerConfig, len(c.Agent.OpenAI.MCPServers))
		for i, m := range c.Agent.OpenAI.MCPServers {
			m.Command = slices.Clone(m.Command)
			m.Env = maps.Clone(m.Env)
			m.Headers = maps.Clone(m.Headers)
			r.Agent.OpenAI.MCPServers[i] = m
		}
	}
	r.Agent.OpenAI.Prices = maps.Clone(c.Agent.OpenAI.Prices)
	return r
}

func cloneOverrides(m map[string]ResetOverride) map[string]ResetOverride {
	if m == nil {
		return nil
	}
	r := make(map[string]ResetOverride, len(m))
	for k, o := range m {
		r[k] = o.clone()
	}
	return r
}

func (o ResetOverride) clone() ResetOverride {
	return ResetOverride{Mode: clonePtr(o.Mode), AtHour: clonePtr(o.AtHour), IdleMinutes: clonePtr(o.IdleMinutes), Notify: clonePtr(o.Notify)}
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// PublicBaseURL is the base of the ingress's media links: PublicURL
// without a trailing slash, else http:// and http.addr, its host made
// 127.0.0.1 when the address has none or is a wildcard.
func (h HTTPConfig) PublicBaseURL() string {
	if h.PublicURL != "" {
		return strings.TrimRight(h.PublicURL, "/")
	}
	host, port, err := net.SplitHostPort(h.Addr)
	if err != nil {
		return "http://" + h.Addr
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port)
}
