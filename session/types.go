package session

// Platform names a messaging platform.
type Platform string

// Known platforms.
const (
	PlatformTelegram      Platform = "telegram"
	PlatformDiscord       Platform = "discord"
	PlatformSlack         Platform = "slack"
	PlatformWhatsApp      Platform = "whatsapp"
	PlatformSignal        Platform = "signal"
	PlatformMatrix        Platform = "matrix"
	PlatformMattermost    Platform = "mattermost"
	PlatformEmail         Platform = "email"
	PlatformSMS           Platform = "sms"
	PlatformHomeAssistant Platform = "homeassistant"
	PlatformFeishu        Platform = "feishu"
	PlatformDingTalk      Platform = "dingtalk"
	PlatformWeCom         Platform = "wecom"
	PlatformLocal         Platform = "local"
	PlatformHTTP          Platform = "http"
	PlatformCLI           Platform = "cli"
)

// Chat types.
const (
	ChatDM      = "dm"
	ChatGroup   = "group"
	ChatChannel = "channel"
	ChatThread  = "thread"
)

// SessionSource is a frozen record of where a message came from.
type SessionSource struct {
	Platform       Platform `json:"platform"`
	ChatID         string   `json:"chat_id"`
	ChatName       string   `json:"chat_name,omitempty"`
	ChatType       string   `json:"chat_type"`
	UserID         string   `json:"user_id,omitempty"`
	UserName       string   `json:"user_name,omitempty"`
	ThreadID       string   `json:"thread_id,omitempty"`
	ChatTopic      string   `json:"chat_topic,omitempty"`
	UserIDAlt      string   `json:"user_id_alt,omitempty"`
	ChatIDAlt      string   `json:"chat_id_alt,omitempty"`
	IsBot          bool     `json:"is_bot,omitempty"`
	GuildID        string   `json:"guild_id,omitempty"`
	ParentChatID   string   `json:"parent_chat_id,omitempty"`
	MessageID      string   `json:"message_id,omitempty"`
	RoleAuthorized bool     `json:"role_authorized,omitempty"`
}

// ResetMode is the automatic reset policy mode.
type ResetMode string

// Reset modes.
const (
	ResetNone  ResetMode = "none"
	ResetIdle  ResetMode = "idle"
	ResetDaily ResetMode = "daily"
	ResetBoth  ResetMode = "both"
)

// Reset reasons returned by policy evaluation and recorded on entries.
const (
	ReasonIdle      = "idle"
	ReasonDaily     = "daily"
	ReasonSuspended = "suspended"
)

// ResetPolicy is one fully resolved reset policy.
type ResetPolicy struct {
	Mode        ResetMode `json:"mode" yaml:"mode"`
	AtHour      int       `json:"at_hour" yaml:"at_hour"`
	IdleMinutes int       `json:"idle_minutes" yaml:"idle_minutes"`
	Notify      bool      `json:"notify" yaml:"notify"`
}

// ResetConfig resolves the policy for a platform and chat type. The most
// specific match wins: ByPlatformChatType, then ByPlatform, then ByChatType,
// then Default.
type ResetConfig struct {
	Default            ResetPolicy
	ByPlatform         map[Platform]ResetPolicy
	ByChatType         map[string]ResetPolicy
	ByPlatformChatType map[Platform]map[string]ResetPolicy
	// NotifyExcludePlatforms get no automatic reset notice whatever their
	// policy says (session_reset.notify_exclude_platforms). Nil: none.
	NotifyExcludePlatforms []Platform
}

// KeyOptions are the configuration switches of session-key derivation.
type KeyOptions struct {
	// GroupSessionsPerUser isolates group and channel sessions per user. Default true.
	GroupSessionsPerUser bool
	// ThreadSessionsPerUser isolates thread sessions per user. Default false.
	ThreadSessionsPerUser bool
	// WhatsApp canonicalizes WhatsApp identifiers; nil means normalization only.
	WhatsApp *WhatsAppResolver
}
