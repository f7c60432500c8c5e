package config

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
)

// knownPlatforms are the platform names accepted under platforms.<name>.
var knownPlatforms = []session.Platform{
	session.PlatformTelegram, session.PlatformDiscord, session.PlatformSlack, session.PlatformWhatsApp,
	session.PlatformSignal, session.PlatformMatrix, session.PlatformMattermost, session.PlatformEmail,
	session.PlatformSMS, session.PlatformHomeAssistant, session.PlatformFeishu, session.PlatformDingTalk,
	session.PlatformWeCom, session.PlatformLocal, session.PlatformHTTP, session.PlatformCLI,
}

// knownChatTypes are the chat types accepted under session_reset_by_chat_type.<type>.
var knownChatTypes = []string{session.ChatDM, session.ChatGroup, session.ChatChannel, session.ChatThread}

// Validate checks every value and returns all the problems at once, joined
// with errors.Join; each is a *FieldError naming the key's YAML path and the
// refused value, e.g.
//
//	config: lease.ttl: "1s" is below the minimum of 3s
func (c *Config) Validate() error {
	var errs []error
	add := func(field, value, reason string) {
		errs = append(errs, &FieldError{Field: field, Value: value, Reason: reason})
	}

	// Map keys: platform names and chat types.
	for _, t := range sortedKeys(c.SessionResetByChatType) {
		if r := checkPlaceholder(placeholderChatType, t); r != "" {
			add("session_reset_by_chat_type."+t, t, r)
		}
	}
	for _, p := range sortedKeys(c.Platforms) {
		if r := checkPlaceholder(placeholderPlatform, string(p)); r != "" {
			add("platforms."+string(p), string(p), r)
		}
		for _, t := range sortedKeys(c.Platforms[p].SessionResetByChatType) {
			if r := checkPlaceholder(placeholderChatType, t); r != "" {
				add("platforms."+string(p)+".session_reset_by_chat_type."+t, t, r)
			}
		}
	}

	// Every key on its own.
	for _, k := range keys {
		if k.check == nil {
			continue
		}
		for _, a := range k.instances(c) {
			v, ok := k.get(c, a)
			if !ok {
				continue
			}
			if r := k.check(v); r != "" {
				add(k.concrete(a), formatValue(v), r)
			}
		}
	}

	// The agent backends' lists and tables (file only).
	names := map[string]bool{}
	for i, m := range c.Agent.OpenAI.MCPServers {
		at := fmt.Sprintf("agent.openai.mcp_servers[%d]", i)
		switch {
		case !mcpNameRE.MatchString(m.Name):
			add(at+".name", m.Name, fmt.Sprintf("%q: want 1 to 32 letters, digits, '_' or '-'", m.Name))
		case names[m.Name]:
			add(at+".name", m.Name, fmt.Sprintf("%q names two servers", m.Name))
		}
		names[m.Name] = true
		switch {
		case len(m.Command) == 0 && m.URL == "":
			add(at, m.Name, "give the server a command (stdio) or a url (streamable HTTP)")
		case len(m.Command) > 0 && m.URL != "":
			add(at, m.Name, "give the server a command or a url, not both")
		case m.URL != "":
			if r := checkHTTPURL(m.URL); r != "" {
				add(at+".url", m.URL, r)
			}
		}
	}
	for _, model := range sortedKeys(c.Agent.OpenAI.Prices) {
		p := c.Agent.OpenAI.Prices[model]
		if p.Input < 0 || p.Output < 0 || p.CacheRead < 0 || p.CacheWrite < 0 {
			add("agent.openai.prices."+model, model, "prices must not be negative")
		}
	}

	// Keys that depend on each other.
	// (A ttl below its minimum is reported above; the margin is judged against a valid one.)
	if ttl, m := c.Lease.TTL, c.Lease.Margin; m > 0 && ttl.Duration() >= minLeaseTTL && 2*m >= ttl {
		add("lease.margin", m.String(), fmt.Sprintf("%q must be less than half of lease.ttl (%s)", m.String(), ttl))
	}
	if c.NATS.Password != "" && c.NATS.User == "" {
		add("nats.password", redactedValue, "is set but nats.user is empty")
	}
	var auth []string
	if c.NATS.User != "" {
		auth = append(auth, "nats.user")
	}
	if c.NATS.Creds != "" {
		auth = append(auth, "nats.creds")
	}
	if c.NATS.Token != "" {
		auth = append(auth, "nats.token")
	}
	if c.NATS.NKey != "" {
		auth = append(auth, "nats.nkey")
	}
	if len(auth) > 1 {
		add("nats", strings.Join(auth, ", "), fmt.Sprintf("more than one authentication method is set (%s); set only one", strings.Join(auth, ", ")))
	}
	if (c.NATS.TLS.Cert == "") != (c.NATS.TLS.Key == "") {
		if c.NATS.TLS.Cert != "" {
			add("nats.tls.key", "", fmt.Sprintf("is empty but nats.tls.cert is %q; set both or neither", c.NATS.TLS.Cert))
		} else {
			add("nats.tls.cert", "", fmt.Sprintf("is empty but nats.tls.key is %q; set both or neither", c.NATS.TLS.Key))
		}
	}
	errs = append(errs, c.validatePlatforms()...)
	return errors.Join(errs...)
}

// seedOnlyPlatforms are platform names of the seed gateway that have no
// adapter here, accepted in session_reset.notify_exclude_platforms (its
// default lists them).
var seedOnlyPlatforms = []string{"api_server", "webhook"}

// checkNotifyExclude validates session_reset.notify_exclude_platforms.
func checkNotifyExclude(v any) string {
	for _, name := range v.([]string) {
		if slices.Contains(seedOnlyPlatforms, name) || checkPlaceholder(placeholderPlatform, name) == "" {
			continue
		}
		return fmt.Sprintf("%q is not a known platform (%s, or %s)", name, platformNames(), strings.Join(seedOnlyPlatforms, ", "))
	}
	return ""
}

// validatePlatforms checks the adapter settings: a Telegram webhook needs a
// valid secret, Slack needs both its secrets, and no platform carries
// another's settings. Secrets are never quoted.
func (c *Config) validatePlatforms() []error {
	var errs []error
	add := func(field, value, reason string) {
		errs = append(errs, &FieldError{Field: field, Value: value, Reason: reason})
	}
	tg := c.Telegram()
	if tg.Token != "" && tg.Mode == TelegramModeWebhook {
		if r := webhookSecretProblem(tg.WebhookSecret); r != "" {
			add("platforms.telegram.webhook_secret", redactedValue, r)
		}
	}
	sl := c.Slack()
	switch {
	case sl.Mode == SlackModeSocket:
		if sl.AppToken == "" {
			add("platforms.slack.app_token", "", "is empty but platforms.slack.mode is socket; Socket Mode needs an app-level token")
		}
		if sl.BotToken == "" {
			add("platforms.slack.bot_token", "", "is empty but platforms.slack.mode is socket; replies need it")
		}
	case (sl.SigningSecret == "") != (sl.BotToken == ""):
		if sl.SigningSecret == "" {
			add("platforms.slack.signing_secret", "", "is empty but platforms.slack.bot_token is set; the Events API needs both")
		} else {
			add("platforms.slack.bot_token", "", "is empty but platforms.slack.signing_secret is set; replies need both")
		}
	}
	if wa := c.WhatsAppCloud(); wa.Enabled() {
		if wa.VerifyToken == "" {
			add("platforms.whatsapp.verify_token", "", "is empty but platforms.whatsapp.app_secret is set; Meta's webhook verification needs it")
		}
		if wa.AccessToken == "" || wa.PhoneNumberID == "" {
			add("platforms.whatsapp.access_token", "", "and platforms.whatsapp.phone_number_id must both be set with platforms.whatsapp.app_secret; replies need them")
		}
	}
	if dc := c.Discord(); dc.PublicKey != "" {
		if k, err := hex.DecodeString(dc.PublicKey); err != nil || len(k) != 32 {
			add("platforms.discord.public_key", dc.PublicKey, "is not 64 hex digits (the application's Ed25519 public key)")
		}
		if dc.Token == "" {
			add("platforms.discord.token", "", "is empty but platforms.discord.public_key is set; replies need the bot token")
		}
	}
	for _, p := range sortedKeys(c.Platforms) {
		pc := c.Platforms[p]
		var foreign []string
		only := func(owners []session.Platform, fields map[string]bool) {
			if slices.Contains(owners, p) {
				return
			}
			for name, set := range fields {
				if set {
					foreign = append(foreign, name)
				}
			}
		}
		tg, sl, wa, dc := session.PlatformTelegram, session.PlatformSlack, session.PlatformWhatsApp, session.PlatformDiscord
		only([]session.Platform{tg, dc}, map[string]bool{"token": pc.Token != ""})
		only([]session.Platform{tg}, map[string]bool{"webhook_secret": pc.WebhookSecret != ""})
		only([]session.Platform{sl}, map[string]bool{"signing_secret": pc.SigningSecret != "", "bot_token": pc.BotToken != "", "app_token": pc.AppToken != ""})
		only([]session.Platform{sl, dc}, map[string]bool{"require_mention": pc.RequireMention != nil})
		only([]session.Platform{tg, sl}, map[string]bool{"mode": pc.Mode != ""})
		only([]session.Platform{tg, sl, wa, dc}, map[string]bool{"api_base": pc.APIBase != ""})
		only([]session.Platform{wa}, map[string]bool{"app_secret": pc.AppSecret != "", "verify_token": pc.VerifyToken != "",
			"access_token": pc.AccessToken != "", "phone_number_id": pc.PhoneNumberID != ""})
		only([]session.Platform{dc}, map[string]bool{"public_key": pc.PublicKey != "", "application_id": pc.ApplicationID != "", "gateway_url": pc.GatewayURL != ""})
		slices.Sort(foreign)
		for _, name := range foreign {
			add("platforms."+string(p)+"."+name, "", fmt.Sprintf("is not a setting of platform %s", p))
		}
	}
	return errs
}

// webhookSecretProblem says what is wrong with a Telegram webhook secret
// (setWebhook's rule: 1 to 256 of A-Z a-z 0-9 _ -), without quoting it.
func webhookSecretProblem(s string) string {
	if s == "" {
		return "is empty: a Telegram webhook without a secret would take updates from anyone; set it (and pass it as secret_token to setWebhook) or use mode poll"
	}
	if len(s) > 256 {
		return fmt.Sprintf("is %d characters long; Telegram allows 1 to 256", len(s))
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return "holds a character other than A-Z, a-z, 0-9, _ and -"
		}
	}
	return ""
}

func platformNames() string {
	names := make([]string, len(knownPlatforms))
	for i, p := range knownPlatforms {
		names[i] = string(p)
	}
	return strings.Join(names, ", ")
}

// checkPlaceholder validates the value of a <platform> or <chat_type> segment.
func checkPlaceholder(placeholder, v string) string {
	switch placeholder {
	case placeholderPlatform:
		for _, p := range knownPlatforms {
			if string(p) == v {
				return ""
			}
		}
		names := make([]string, len(knownPlatforms))
		for i, p := range knownPlatforms {
			names[i] = string(p)
		}
		return fmt.Sprintf("%q is not a known platform (%s)", v, strings.Join(names, ", "))
	case placeholderChatType:
		for _, t := range knownChatTypes {
			if t == v {
				return ""
			}
		}
		return fmt.Sprintf("%q is not a chat type (%s)", v, strings.Join(knownChatTypes, ", "))
	}
	return ""
}

func minInt(min int) func(any) string {
	return func(v any) string {
		if n := v.(int); n < min {
			return fmt.Sprintf("%q is below the minimum of %d", strconv.Itoa(n), min)
		}
		return ""
	}
}

func minDuration(min time.Duration) func(any) string {
	return func(v any) string {
		d := v.(Duration)
		if d.Duration() >= min {
			return ""
		}
		switch {
		case min == 0:
			return fmt.Sprintf("%q must not be negative", d.String())
		case min <= time.Millisecond:
			return fmt.Sprintf("%q must be positive", d.String())
		}
		return fmt.Sprintf("%q is below the minimum of %s", d.String(), Duration(min))
	}
}

func oneOf(values ...string) func(any) string {
	return func(v any) string {
		s := v.(string)
		for _, ok := range values {
			if s == ok {
				return ""
			}
		}
		return fmt.Sprintf("%q is not one of %s", s, strings.Join(values, ", "))
	}
}

var checkMode = oneOf(string(session.ResetNone), string(session.ResetIdle), string(session.ResetDaily), string(session.ResetBoth))

func checkAtHour(v any) string {
	if n := v.(int); n < 0 || n > 23 {
		return fmt.Sprintf("%q is not an hour (0..23)", strconv.Itoa(n))
	}
	return ""
}

func checkIdleMinutes(v any) string {
	n := v.(int)
	if n < 1 {
		return fmt.Sprintf("%q is below the minimum of 1", strconv.Itoa(n))
	}
	if n > session.MaxIdleMinutes {
		return fmt.Sprintf("%q is above the maximum of %d (100 years; mode daily or none has no idle reset)", strconv.Itoa(n), session.MaxIdleMinutes)
	}
	return ""
}

func checkReplicas(v any) string {
	switch v.(int) {
	case 1, 3, 5:
		return ""
	}
	return fmt.Sprintf("%q is not a replica count (1, 3 or 5)", strconv.Itoa(v.(int)))
}

func checkInboxStreams(v any) string {
	if n := v.(int); n < 0 || n > 16 {
		return fmt.Sprintf("%q is not an inbox stream count (0 to 16; 0 keeps the fleet's)", strconv.Itoa(n))
	}
	return ""
}

// mcpNameRE is what an MCP server's name may be: it prefixes tool names,
// which models take as [A-Za-z0-9_-]{1,64}.
var mcpNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

// checkHTTPURL accepts "" or an absolute http or https URL.
func checkHTTPURL(v any) string {
	s := v.(string)
	if s == "" {
		return ""
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Sprintf("%q is not an http or https URL", s)
	}
	return ""
}

func checkWSURL(v any) string {
	s := v.(string)
	if s == "" {
		return ""
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		return fmt.Sprintf("%q is not a ws or wss URL", s)
	}
	return ""
}

func checkNonEmpty(v any) string {
	if strings.TrimSpace(v.(string)) == "" {
		return fmt.Sprintf("%q must not be empty", v.(string))
	}
	return ""
}

func checkTimezone(v any) string {
	if _, err := loadLocation(v.(string)); err != nil {
		return fmt.Sprintf("%q is not a known time zone (use an IANA name like \"Europe/Paris\", \"UTC\" or \"Local\")", v.(string))
	}
	return ""
}

var prefixRE = regexp.MustCompile(`^[a-z0-9_]+$`)

func checkPrefix(v any) string {
	if !prefixRE.MatchString(v.(string)) {
		return fmt.Sprintf("%q must be lower-case letters, digits or '_' only (stream names are its upper case, so they must not collide), and not empty", v.(string))
	}
	return ""
}

func checkWorkerID(v any) string {
	s := v.(string)
	for _, r := range s {
		if unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return fmt.Sprintf("%q must not contain spaces or control characters", s)
		}
	}
	return ""
}

func checkHostPort(allowEmpty bool) func(any) string {
	return func(v any) string {
		s := v.(string)
		if s == "" && allowEmpty {
			return ""
		}
		_, port, err := net.SplitHostPort(s)
		if err != nil {
			return fmt.Sprintf("%q is not host:port (like \":8080\" or \"127.0.0.1:8080\")", s)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			return fmt.Sprintf("%q has an invalid port %q (0..65535)", s, port)
		}
		return ""
	}
}

func checkNATSURL(v any) string {
	// The URL may carry a password or a token: errors quote it redacted.
	raw := v.(string)
	s := broker.RedactURL(raw)
	if strings.TrimSpace(raw) == "" {
		return fmt.Sprintf("%q must not be empty", s)
	}
	for part := range strings.SplitSeq(raw, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			return fmt.Sprintf("%q has an empty URL in its list", s)
		}
		raw := part
		if !strings.Contains(part, "://") {
			raw = "nats://" + part
		}
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return fmt.Sprintf("%q is not a NATS URL (like \"nats://127.0.0.1:4222\")", s)
		}
		switch u.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return fmt.Sprintf("%q has scheme %q; want nats, tls, ws or wss", s, u.Scheme)
		}
	}
	return ""
}

func checkFile(v any) string {
	s := v.(string)
	if s == "" {
		return ""
	}
	fi, err := os.Stat(s)
	switch {
	case err != nil:
		return fmt.Sprintf("%q cannot be read: %v", s, statReason(err))
	case fi.IsDir():
		return fmt.Sprintf("%q is a directory, not a file", s)
	}
	return ""
}

func checkDir(v any) string {
	s := v.(string)
	if s == "" {
		return ""
	}
	fi, err := os.Stat(s)
	switch {
	case err != nil:
		return fmt.Sprintf("%q cannot be read: %v", s, statReason(err))
	case !fi.IsDir():
		return fmt.Sprintf("%q is not a directory", s)
	}
	return ""
}

func checkSync(v any) string {
	s := v.(string)
	switch s {
	case SyncDefault, SyncAlways:
		return ""
	}
	d, err := ParseDuration(s)
	if err != nil || d <= 0 {
		return fmt.Sprintf("%q is not a sync policy (\"default\", \"always\", or a positive interval like \"10s\")", s)
	}
	return ""
}

// statReason drops the path from a stat error: the message already quotes it.
func statReason(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func asFieldError(err error, target **FieldError) bool { return errors.As(err, target) }
