package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/agentfleet/agentfleet/config"
	"github.com/agentfleet/agentfleet/session"
)

// envOf returns an env lookup over m.
func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

// writeFile writes content to a new file in a temp dir and returns its path.
func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// requireErrorContains fails unless err is non-nil and holds every want.
func requireErrorContains(t *testing.T, err error, wants ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one containing %q", wants)
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not contain %q:\n%v", w, err)
		}
	}
}

func TestDefaultIsValid(t *testing.T) {
	t.Parallel()
	c := config.Default()
	if err := c.Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
	loaded, err := config.Load("", nil)
	if err != nil {
		t.Fatalf("Load(\"\", nil) = %v", err)
	}
	if loaded.Worker.ID == "" {
		t.Error("Load left worker.id empty, want <hostname>-<pid>")
	}
	if !strings.HasSuffix(loaded.Worker.ID, "-"+strconv.Itoa(os.Getpid())) {
		t.Errorf("worker.id = %q, want a -<pid> suffix", loaded.Worker.ID)
	}
	loaded.Worker.ID = ""
	if !reflect.DeepEqual(loaded, c) {
		t.Errorf("Load(\"\", nil) differs from Default():\n got %+v\nwant %+v", loaded, c)
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	c := config.Default()
	for _, tc := range []struct {
		name string
		got  any
		want any
	}{
		{"group_sessions_per_user", c.GroupSessionsPerUser, true},
		{"thread_sessions_per_user", c.ThreadSessionsPerUser, false},
		{"session_store_max_age_days", c.SessionStoreMaxAgeDays, 0},
		{"session_reset.mode", c.SessionReset.Mode, session.ResetBoth},
		{"session_reset.at_hour", c.SessionReset.AtHour, 4},
		{"session_reset.idle_minutes", c.SessionReset.IdleMinutes, 1440},
		{"session_reset.notify", c.SessionReset.Notify, true},
		{"timezone", c.Timezone, "Local"},
		{"agent.backend", c.Agent.Backend, "echo"},
		{"agent.gateway_timeout", c.Agent.GatewayTimeout.Duration(), 1800 * time.Second},
		{"agent.gateway_auto_continue_freshness", c.Agent.GatewayAutoContinueFreshness.Duration(), 3600 * time.Second},
		{"agent.restart_drain_timeout", c.Agent.RestartDrainTimeout.Duration(), 60 * time.Second},
		{"agent.allow_crash", c.Agent.AllowCrash, false},
		{"nats.url", c.NATS.URL, "nats://127.0.0.1:4222"},
		{"nats.prefix", c.NATS.Prefix, "fleet"},
		{"nats.replicas", c.NATS.Replicas, 1},
		{"nats.connect_timeout", c.NATS.ConnectTimeout.Duration(), 5 * time.Second},
		{"embedded.data_dir", c.Embedded.DataDir, "./data"},
		{"embedded.listen", c.Embedded.Listen, ""},
		{"embedded.sync", c.Embedded.Sync, "default"},
		{"lease.ttl", c.Lease.TTL.Duration(), 15 * time.Second},
		{"lease.margin", c.Lease.Margin.Duration(), 2 * time.Second},
		{"worker.lanes", c.Worker.Lanes, 64},
		{"worker.turns", c.Worker.Turns, 16},
		{"worker.linger", c.Worker.Linger.Duration(), 30 * time.Second},
		{"worker.busy_mode", c.Worker.BusyMode, "interrupt"},
		{"worker.max_turn_messages", c.Worker.MaxTurnMessages, 50},
		{"worker.max_turn_bytes", c.Worker.MaxTurnBytes, 262144},
		{"worker.cache_size", c.Worker.CacheSize, 128},
		{"worker.cache_idle_ttl", c.Worker.CacheIdleTTL.Duration(), time.Hour},
		{"http.addr", c.HTTP.Addr, "127.0.0.1:8080"},
		{"http.token", c.HTTP.Token, ""},
		{"http.max_body_bytes", c.HTTP.MaxBodyBytes, 1048576},
		{"delivery.backoff", c.Delivery.Backoff.Duration(), 100 * time.Millisecond},
		{"telemetry.log_level", c.Telemetry.LogLevel, "info"},
		{"telemetry.log_format", c.Telemetry.LogFormat, "text"},
	} {
		if tc.got != tc.want {
			t.Errorf("default %s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	interval, always := c.Embedded.SyncOptions()
	if interval != 0 || always {
		t.Errorf("default SyncOptions() = %v, %v; want 0, false", interval, always)
	}
}

// TestPrecedence proves flag > env > file > default for one key of each kind.
func TestPrecedence(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		kind                   string
		path                   string
		env                    string
		yaml                   string // file content setting path to fileVal
		get                    func(config.Config) string
		def, file, envVal, flg string
	}{
		{
			kind: "string", path: "http.addr", env: "AGENTFLEET_HTTP_ADDR",
			yaml: "http:\n  addr: \":7070\"\n",
			get:  func(c config.Config) string { return c.HTTP.Addr },
			def:  "127.0.0.1:8080", file: ":7070", envVal: ":8081", flg: ":9090",
		},
		{
			kind: "string (AGENTFLEET_NATS_URL)", path: "nats.url", env: "AGENTFLEET_NATS_URL",
			yaml: "nats:\n  url: nats://file:4222\n",
			get:  func(c config.Config) string { return c.NATS.URL },
			def:  "nats://127.0.0.1:4222", file: "nats://file:4222", envVal: "nats://env:4222", flg: "nats://flag:4222",
		},
		{
			kind: "string (NATS_URL)", path: "nats.url", env: "NATS_URL",
			yaml: "nats:\n  url: nats://file:4222\n",
			get:  func(c config.Config) string { return c.NATS.URL },
			def:  "nats://127.0.0.1:4222", file: "nats://file:4222", envVal: "nats://env:4222", flg: "nats://flag:4222",
		},
		{
			kind: "bool", path: "session_reset.notify", env: "AGENTFLEET_SESSION_RESET_NOTIFY",
			yaml: "session_reset:\n  notify: false\n",
			get: func(c config.Config) string {
				return map[bool]string{true: "true", false: "false"}[c.SessionReset.Notify]
			},
			def: "true", file: "false", envVal: "true", flg: "false",
		},
		{
			kind: "int", path: "worker.lanes", env: "AGENTFLEET_WORKER_LANES",
			yaml: "worker:\n  lanes: 8\n",
			get:  func(c config.Config) string { return strconv.Itoa(c.Worker.Lanes) },
			def:  "64", file: "8", envVal: "16", flg: "32",
		},
		{
			kind: "duration", path: "lease.ttl", env: "AGENTFLEET_LEASE_TTL",
			yaml: "lease:\n  ttl: 20s\n",
			get:  func(c config.Config) string { return c.Lease.TTL.String() },
			def:  "15s", file: "20s", envVal: "25s", flg: "30s",
		},
		{
			kind: "reset mode", path: "session_reset.mode", env: "AGENTFLEET_SESSION_RESET_MODE",
			yaml: "session_reset:\n  mode: idle\n",
			get:  func(c config.Config) string { return string(c.SessionReset.Mode) },
			def:  "both", file: "idle", envVal: "daily", flg: "none",
		},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			t.Parallel()
			file := writeFile(t, tc.yaml)
			env := envOf(map[string]string{tc.env: tc.envVal})

			c, err := config.Load("", nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := tc.get(c); got != tc.def {
				t.Errorf("default: %s = %q, want %q", tc.path, got, tc.def)
			}
			c, err = config.Load(file, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := tc.get(c); got != tc.file {
				t.Errorf("file over default: %s = %q, want %q", tc.path, got, tc.file)
			}
			c, err = config.Load(file, env)
			if err != nil {
				t.Fatal(err)
			}
			if got := tc.get(c); got != tc.envVal {
				t.Errorf("env over file: %s = %q, want %q", tc.path, got, tc.envVal)
			}
			if err := c.Set(tc.path, tc.flg); err != nil {
				t.Fatal(err)
			}
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			if got := tc.get(c); got != tc.flg {
				t.Errorf("flag over env: %s = %q, want %q", tc.path, got, tc.flg)
			}
		})
	}
}

func TestEmptyEnvIsUnset(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "lease:\n  ttl: 20s\nhttp:\n  token: secret\n")
	c, err := config.Load(file, envOf(map[string]string{"AGENTFLEET_LEASE_TTL": "", "AGENTFLEET_HTTP_TOKEN": ""}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Lease.TTL.String() != "20s" || c.HTTP.Token != "secret" {
		t.Errorf("empty env changed values: lease.ttl=%s http.token=%q", c.Lease.TTL, c.HTTP.Token)
	}
}

func TestFileOverridesDefaults(t *testing.T) {
	t.Parallel()
	file := writeFile(t, `
group_sessions_per_user: false
thread_sessions_per_user: true
session_store_max_age_days: 30
session_reset:
  mode: idle
  idle_minutes: 60
timezone: UTC
agent:
  backend: openai
  gateway_timeout: 10m
  allow_crash: true
nats:
  prefix: fleet2
  replicas: 3
embedded:
  sync: always
  listen: 127.0.0.1:4333
worker:
  id: w1
  busy_mode: steer
http:
  token: s3cret
telemetry:
  log_format: json
`)
	c, err := config.Load(file, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"group_sessions_per_user", c.GroupSessionsPerUser, false},
		{"thread_sessions_per_user", c.ThreadSessionsPerUser, true},
		{"session_store_max_age_days", c.SessionStoreMaxAgeDays, 30},
		{"session_reset.mode", c.SessionReset.Mode, session.ResetIdle},
		{"session_reset.idle_minutes", c.SessionReset.IdleMinutes, 60},
		{"session_reset.at_hour (kept)", c.SessionReset.AtHour, 4},
		{"session_reset.notify (kept)", c.SessionReset.Notify, true},
		{"timezone", c.Timezone, "UTC"},
		{"agent.backend", c.Agent.Backend, "openai"},
		{"agent.gateway_timeout", c.Agent.GatewayTimeout.Duration(), 10 * time.Minute},
		{"agent.gateway_auto_continue_freshness (kept)", c.Agent.GatewayAutoContinueFreshness.Duration(), time.Hour},
		{"agent.allow_crash", c.Agent.AllowCrash, true},
		{"nats.prefix", c.NATS.Prefix, "fleet2"},
		{"nats.replicas", c.NATS.Replicas, 3},
		{"nats.url (kept)", c.NATS.URL, "nats://127.0.0.1:4222"},
		{"embedded.sync", c.Embedded.Sync, "always"},
		{"embedded.listen", c.Embedded.Listen, "127.0.0.1:4333"},
		{"worker.id", c.Worker.ID, "w1"},
		{"worker.busy_mode", c.Worker.BusyMode, "steer"},
		{"worker.lanes (kept)", c.Worker.Lanes, 64},
		{"http.token", c.HTTP.Token, "s3cret"},
		{"telemetry.log_format", c.Telemetry.LogFormat, "json"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	if c.Location() != time.UTC {
		t.Errorf("Location() = %v, want UTC", c.Location())
	}
	if _, always := c.Embedded.SyncOptions(); !always {
		t.Error("SyncOptions() always = false, want true for sync: always")
	}
	if ko := c.KeyOptions(); ko.GroupSessionsPerUser || !ko.ThreadSessionsPerUser || ko.WhatsApp != nil {
		t.Errorf("KeyOptions() = %+v", ko)
	}
}

func TestIntegerSecondsDurations(t *testing.T) {
	t.Parallel()
	file := writeFile(t, `
agent:
  gateway_timeout: 1800
  gateway_auto_continue_freshness: "7200"
  restart_drain_timeout: 0
lease:
  ttl: 20
embedded:
  sync: 10
`)
	c, err := config.Load(file, envOf(map[string]string{"AGENTFLEET_WORKER_LINGER": "45"}))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Set("delivery.backoff", "3"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		got, want time.Duration
	}{
		{"agent.gateway_timeout", c.Agent.GatewayTimeout.Duration(), 1800 * time.Second},
		{"agent.gateway_auto_continue_freshness", c.Agent.GatewayAutoContinueFreshness.Duration(), 7200 * time.Second},
		{"agent.restart_drain_timeout", c.Agent.RestartDrainTimeout.Duration(), 0},
		{"lease.ttl", c.Lease.TTL.Duration(), 20 * time.Second},
		{"worker.linger (env)", c.Worker.Linger.Duration(), 45 * time.Second},
		{"delivery.backoff (Set)", c.Delivery.Backoff.Duration(), 3 * time.Second},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	if interval, always := c.Embedded.SyncOptions(); interval != 10*time.Second || always {
		t.Errorf("SyncOptions() = %v, %v; want 10s, false", interval, always)
	}
}

func TestDurationString(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"},
		{30 * time.Second, "30s"},
		{30 * time.Minute, "30m"},
		{time.Hour, "1h"},
		{90 * time.Second, "1m30s"},
		{time.Hour + 30*time.Minute, "1h30m"},
		{250 * time.Millisecond, "250ms"},
	} {
		if got := config.Duration(tc.d).String(); got != tc.want {
			t.Errorf("Duration(%v).String() = %q, want %q", tc.d, got, tc.want)
		}
	}
}

// TestInvalidValues checks that each wrong value is refused with its key and
// value named, whether it comes from the file, the environment or Set.
func TestInvalidValues(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile := filepath.Join(dir, "cert.pem")
	if err := os.WriteFile(certFile, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		yaml  string            // file content, if any
		env   map[string]string // environment, if any
		set   [2]string         // Set(path, value) after Load, if set[0] != ""
		wants []string
	}{
		{name: "mode sometimes", yaml: "session_reset:\n  mode: sometimes\n",
			wants: []string{`session_reset.mode: "sometimes" is not one of none, idle, daily, both`, "fleet.yaml:2"}},
		{name: "at_hour 24", yaml: "session_reset:\n  at_hour: 24\n",
			wants: []string{`session_reset.at_hour: "24" is not an hour (0..23)`}},
		{name: "idle_minutes 0", yaml: "session_reset:\n  idle_minutes: 0\n",
			wants: []string{`session_reset.idle_minutes: "0" is below the minimum of 1`}},
		{name: "lease.ttl 1s", yaml: "lease:\n  ttl: 1s\n",
			wants: []string{`config: lease.ttl: "1s" is below the minimum of 3s`}},
		{name: "lease.ttl 1s env", env: map[string]string{"AGENTFLEET_LEASE_TTL": "1s"},
			wants: []string{`config: lease.ttl: "1s" is below the minimum of 3s (from AGENTFLEET_LEASE_TTL)`}},
		{name: "lease.margin half of ttl", yaml: "lease:\n  ttl: 4s\n  margin: 2s\n",
			wants: []string{`lease.margin: "2s" must be less than half of lease.ttl (4s)`}},
		{name: "replicas 2", yaml: "nats:\n  replicas: 2\n",
			wants: []string{`nats.replicas: "2" is not a replica count (1, 3 or 5)`}},
		{name: "unknown yaml key", yaml: "lease:\n  ttl: 15s\n  tll: 3s\n",
			wants: []string{`lease.tll: unknown key "tll"`, "fleet.yaml:3"}},
		{name: "unknown top-level key", yaml: "workers:\n  lanes: 3\n",
			wants: []string{`workers: unknown key "workers"`}},
		{name: "bad duration file", yaml: "worker:\n  linger: soon\n",
			wants: []string{`worker.linger: "soon" is not a duration`, "fleet.yaml:2"}},
		{name: "bad duration flow style", yaml: "worker: {lanes: 2, linger: soon}\n",
			wants: []string{`worker.linger: "soon" is not a duration`}},
		{name: "bad duration env", env: map[string]string{"AGENTFLEET_AGENT_GATEWAY_TIMEOUT": "forever"},
			wants: []string{`agent.gateway_timeout: "forever" is not a duration`, "AGENTFLEET_AGENT_GATEWAY_TIMEOUT"}},
		{name: "bad duration Set", set: [2]string{"worker.linger", "1 minute"},
			wants: []string{`worker.linger: "1 minute" is not a duration`}},
		{name: "negative duration", yaml: "worker:\n  linger: -1s\n",
			wants: []string{`worker.linger: "-1s" must not be negative`}},
		{name: "bad busy_mode", yaml: "worker:\n  busy_mode: later\n",
			wants: []string{`worker.busy_mode: "later" is not one of interrupt, queue, steer`}},
		{name: "bad busy_mode env", env: map[string]string{"AGENTFLEET_WORKER_BUSY_MODE": "later"},
			wants: []string{`worker.busy_mode: "later" is not one of interrupt, queue, steer (from AGENTFLEET_WORKER_BUSY_MODE)`}},
		{name: "bad timezone", yaml: "timezone: Mars/Olympus\n",
			wants: []string{`timezone: "Mars/Olympus" is not a known time zone`}},
		{name: "bad int file", yaml: "worker:\n  lanes: many\n",
			wants: []string{`worker.lanes: "many" is not an integer`, "fleet.yaml:2"}},
		{name: "bad int env", env: map[string]string{"AGENTFLEET_WORKER_LANES": "many"},
			wants: []string{`worker.lanes: "many" is not an integer (from AGENTFLEET_WORKER_LANES)`}},
		{name: "bad bool file", yaml: "session_reset:\n  notify: sometimes\n",
			wants: []string{`session_reset.notify: "sometimes" is not a boolean`}},
		{name: "bad bool env", env: map[string]string{"AGENTFLEET_SESSION_RESET_NOTIFY": "maybe"},
			wants: []string{`session_reset.notify: "maybe" is not a boolean (true or false) (from AGENTFLEET_SESSION_RESET_NOTIFY)`}},
		{name: "scalar for a section", yaml: "lease: 5\n",
			wants: []string{`lease: "5" is not a mapping`}},
		{name: "sequence for a scalar", yaml: "http:\n  addr: [a, b]\n",
			wants: []string{`http.addr: expected a string, got a sequence`}},
		{name: "duplicate key", yaml: "lease:\n  ttl: 5s\n  ttl: 6s\n",
			wants: []string{`lease.ttl: key "ttl" is given twice`}},
		{name: "lanes 0", yaml: "worker:\n  lanes: 0\n",
			wants: []string{`worker.lanes: "0" is below the minimum of 1`}},
		{name: "bad http addr", yaml: "http:\n  addr: localhost\n",
			wants: []string{`http.addr: "localhost" is not host:port`}},
		{name: "bad port", set: [2]string{"embedded.listen", "127.0.0.1:99999"},
			wants: []string{`embedded.listen: "127.0.0.1:99999" has an invalid port "99999"`}},
		{name: "bad sync", yaml: "embedded:\n  sync: sometimes\n",
			wants: []string{`embedded.sync: "sometimes" is not a sync policy`}},
		{name: "bad prefix", yaml: "nats:\n  prefix: my.fleet\n",
			wants: []string{`nats.prefix: "my.fleet" must be lower-case letters, digits`}},
		{name: "bad nats url", env: map[string]string{"NATS_URL": "http://example.com:4222"},
			wants: []string{`nats.url: "http://example.com:4222" has scheme "http"`, "(from NATS_URL)"}},
		{name: "bad log level", yaml: "telemetry:\n  log_level: verbose\n",
			wants: []string{`telemetry.log_level: "verbose" is not one of debug, info, warn, error`}},
		{name: "missing creds file", yaml: "nats:\n  creds: " + filepath.Join(dir, "nope.creds") + "\n",
			wants: []string{`nats.creds: "` + filepath.Join(dir, "nope.creds") + `" cannot be read: no such file or directory`}},
		{name: "cert without key", yaml: "nats:\n  tls:\n    cert: " + certFile + "\n",
			wants: []string{`nats.tls.key: is empty but nats.tls.cert is "` + certFile + `"`}},
		{name: "two auth methods", yaml: "nats:\n  user: u\n  password: p\n  token: t\n",
			wants: []string{`nats: more than one authentication method is set (nats.user, nats.token)`}},
		{name: "password without user", yaml: "nats:\n  password: hunter2\n",
			wants: []string{`nats.password: is set but nats.user is empty`}},
		{name: "unknown platform", yaml: "platforms:\n  telegarm:\n    session_reset:\n      mode: idle\n",
			wants: []string{`platforms.telegarm: "telegarm" is not a known platform`}},
		{name: "unknown chat type", yaml: "session_reset_by_chat_type:\n  private:\n    mode: idle\n",
			wants: []string{`session_reset_by_chat_type.private: "private" is not a chat type (dm, group, channel, thread)`}},
		{name: "bad platform override", yaml: "platforms:\n  slack:\n    session_reset_by_chat_type:\n      group:\n        at_hour: 25\n",
			wants: []string{`platforms.slack.session_reset_by_chat_type.group.at_hour: "25" is not an hour (0..23)`, "fleet.yaml:5"}},
		{name: "unknown key in override", yaml: "platforms:\n  slack:\n    session_reset:\n      moed: idle\n",
			wants: []string{`platforms.slack.session_reset.moed: unknown key "moed"`}},
		{name: "Set unknown key", set: [2]string{"lease.tll", "3s"},
			wants: []string{`config: lease.tll: unknown key`}},
		{name: "Set unknown platform", set: [2]string{"platforms.icq.session_reset.mode", "idle"},
			wants: []string{`platforms.icq: "icq" is not a known platform`}},
		{name: "Set bad mode override", set: [2]string{"platforms.telegram.session_reset.mode", "sometimes"},
			wants: []string{`platforms.telegram.session_reset.mode: "sometimes" is not one of none, idle, daily, both`}},
		{name: "empty agent name", set: [2]string{"agent.backend", ""},
			wants: []string{`agent.backend: "" must not be empty`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := ""
			if tc.yaml != "" {
				path = writeFile(t, tc.yaml)
			}
			var env func(string) (string, bool)
			if tc.env != nil {
				env = envOf(tc.env)
			}
			c, err := config.Load(path, env)
			if tc.set[0] != "" {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				err = c.Set(tc.set[0], tc.set[1])
			}
			requireErrorContains(t, err, tc.wants...)
			var fe *config.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v is not a *config.FieldError", err)
			}
			if fe.Field == "" {
				t.Errorf("FieldError.Field is empty: %#v", fe)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error leaks a secret: %v", err)
			}
		})
	}
}

// TestAllProblemsAtOnce checks that one Load reports every problem together.
func TestAllProblemsAtOnce(t *testing.T) {
	t.Parallel()
	file := writeFile(t, `
session_reset:
  mode: sometimes
  at_hour: 24
lease:
  ttl: 1s
  tll: 2s
nats:
  replicas: 2
worker:
  linger: soon
  busy_mode: later
timezone: Nowhere/Land
`)
	_, err := config.Load(file, envOf(map[string]string{"AGENTFLEET_WORKER_LANES": "many"}))
	wants := []string{
		`session_reset.mode: "sometimes"`,
		`session_reset.at_hour: "24"`,
		`lease.ttl: "1s" is below the minimum of 3s`,
		`lease.tll: unknown key`,
		`nats.replicas: "2"`,
		`worker.linger: "soon" is not a duration`,
		`worker.busy_mode: "later"`,
		`timezone: "Nowhere/Land"`,
		`worker.lanes: "many" is not an integer (from AGENTFLEET_WORKER_LANES)`,
	}
	requireErrorContains(t, err, wants...)
	if n := strings.Count(err.Error(), "config: "); n != len(wants) {
		t.Errorf("got %d problems, want %d:\n%v", n, len(wants), err)
	}
	// Validate alone also collects everything.
	c := config.Default()
	c.Lease.TTL = config.Duration(time.Second)
	c.Worker.Turns = 0
	c.HTTP.MaxBodyBytes = -1
	err = c.Validate()
	requireErrorContains(t, err, "lease.ttl", "worker.turns", "http.max_body_bytes")
}

func TestFileErrors(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	_, err := config.Load(missing, nil)
	requireErrorContains(t, err, missing, "no such file")

	_, err = config.Load(writeFile(t, "lease: [\n"), nil)
	requireErrorContains(t, err, "fleet.yaml", "yaml")

	_, err = config.Load(writeFile(t, "lease:\n  ttl: 5s\n---\nlease:\n  ttl: 6s\n"), nil)
	requireErrorContains(t, err, "more than one YAML document")

	c, err := config.Load(writeFile(t, "# nothing here\n"), nil)
	if err != nil {
		t.Fatalf("empty file: %v", err)
	}
	if c.Lease.TTL.String() != "15s" {
		t.Errorf("empty file changed lease.ttl to %s", c.Lease.TTL)
	}
}

func TestResetConfigOverrides(t *testing.T) {
	t.Parallel()
	file := writeFile(t, `
session_reset:
  mode: both
  at_hour: 4
  idle_minutes: 1440
  notify: true
session_reset_by_chat_type:
  group:
    mode: none
platforms:
  telegram:
    session_reset:
      idle_minutes: 60
  slack:
    session_reset_by_chat_type:
      channel:
        notify: false
  discord:
    session_reset: {}
`)
	c, err := config.Load(file, nil)
	if err != nil {
		t.Fatal(err)
	}
	rc := c.ResetConfig()
	def := session.ResetPolicy{Mode: session.ResetBoth, AtHour: 4, IdleMinutes: 1440, Notify: true}
	if rc.Default != def {
		t.Errorf("Default = %+v, want %+v", rc.Default, def)
	}
	// A partial platform override keeps the other fields from the default.
	want := def
	want.IdleMinutes = 60
	if got := rc.ByPlatform[session.PlatformTelegram]; got != want {
		t.Errorf("ByPlatform[telegram] = %+v, want %+v", got, want)
	}
	want = def
	want.Mode = session.ResetNone
	if got := rc.ByChatType["group"]; got != want {
		t.Errorf("ByChatType[group] = %+v, want %+v", got, want)
	}
	// Where a platform override meets a chat-type override, both apply.
	want = def
	want.Mode = session.ResetNone
	want.IdleMinutes = 60
	if got := rc.ByPlatformChatType[session.PlatformTelegram]["group"]; got != want {
		t.Errorf("ByPlatformChatType[telegram][group] = %+v, want %+v", got, want)
	}
	want = def
	want.Notify = false
	if got := rc.ByPlatformChatType[session.PlatformSlack]["channel"]; got != want {
		t.Errorf("ByPlatformChatType[slack][channel] = %+v, want %+v", got, want)
	}
	if _, ok := rc.ByPlatform[session.PlatformSlack]; ok {
		t.Error("slack has no session_reset, yet ByPlatform[slack] is set (it would shadow ByChatType)")
	}
	if _, ok := rc.ByPlatform[session.PlatformDiscord]; ok {
		t.Error("an empty override created ByPlatform[discord]")
	}
	if len(rc.ByPlatformChatType) != 2 {
		t.Errorf("ByPlatformChatType = %+v, want entries for telegram and slack only", rc.ByPlatformChatType)
	}

	// Set reaches the same overrides, and they are independent copies.
	c2 := c.Redacted()
	if err := c2.Set("platforms.telegram.session_reset.notify", "false"); err != nil {
		t.Fatal(err)
	}
	if err := c2.Set("session_reset_by_chat_type.dm.at_hour", "6"); err != nil {
		t.Fatal(err)
	}
	if err := c2.Validate(); err != nil {
		t.Fatal(err)
	}
	rc2 := c2.ResetConfig()
	if got := rc2.ByPlatform[session.PlatformTelegram]; got.Notify || got.IdleMinutes != 60 {
		t.Errorf("after Set, ByPlatform[telegram] = %+v, want notify false, idle_minutes 60", got)
	}
	if got := rc2.ByChatType["dm"].AtHour; got != 6 {
		t.Errorf("after Set, ByChatType[dm].AtHour = %d, want 6", got)
	}
	if got := c.ResetConfig().ByPlatform[session.PlatformTelegram]; !got.Notify {
		t.Error("Set on a copy changed the original's override")
	}
}

func TestRedacted(t *testing.T) {
	t.Parallel()
	c := config.Default()
	c.NATS.User = "u"
	c.NATS.Password = "pw"
	c.HTTP.Token = "tok"
	r := c.Redacted()
	if r.NATS.Password == "pw" || r.HTTP.Token == "tok" || r.NATS.Password == "" || r.HTTP.Token == "" {
		t.Errorf("Redacted() = password %q, http token %q; want both replaced", r.NATS.Password, r.HTTP.Token)
	}
	if r.NATS.Token != "" {
		t.Errorf("Redacted() set an unset nats.token to %q", r.NATS.Token)
	}
	if r.NATS.User != "u" {
		t.Errorf("Redacted() changed nats.user to %q", r.NATS.User)
	}
	if c.NATS.Password != "pw" || c.HTTP.Token != "tok" {
		t.Error("Redacted() changed the original")
	}
	out, err := yaml.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "pw") || strings.Contains(string(out), "tok\n") {
		t.Errorf("redacted YAML leaks a secret:\n%s", out)
	}
}

// TestRoundTrip checks that a printed configuration loads back unchanged.
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	c := config.Default()
	c.Worker.ID = "w1"
	if err := c.Set("platforms.whatsapp.session_reset_by_chat_type.group.mode", "idle"); err != nil {
		t.Fatal(err)
	}
	if err := c.Set("agent.gateway_timeout", "90"); err != nil {
		t.Fatal(err)
	}
	out, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	got, err := config.Load(writeFile(t, string(out)), nil)
	if err != nil {
		t.Fatalf("Load(printed config): %v\n%s", err, out)
	}
	if !reflect.DeepEqual(got, c) {
		t.Errorf("round trip differs:\n got %+v\nwant %+v\nyaml:\n%s", got, c, out)
	}
}

func TestLocation(t *testing.T) {
	t.Parallel()
	c := config.Default()
	if c.Location() != time.Local {
		t.Errorf("default Location() = %v, want time.Local", c.Location())
	}
	if err := c.Set("timezone", "Asia/Tokyo"); err != nil {
		t.Fatal(err)
	}
	if got := c.Location().String(); got != "Asia/Tokyo" {
		t.Errorf("Location() = %q, want Asia/Tokyo", got)
	}
}

func TestKeys(t *testing.T) {
	t.Parallel()
	seenPath := map[string]bool{}
	seenEnv := map[string]string{}
	for _, k := range config.Keys() {
		if seenPath[k.Path] {
			t.Errorf("key %s listed twice", k.Path)
		}
		seenPath[k.Path] = true
		if k.Description == "" || k.Type == "" {
			t.Errorf("key %s lacks a description or type: %+v", k.Path, k)
		}
		if k.Default == "" && k.Type != "string" {
			t.Errorf("key %s has no default", k.Path)
		}
		placeholder := strings.Contains(k.Path, "<")
		switch {
		case k.Path == "nats.url":
			if k.Env != "AGENTFLEET_NATS_URL" || k.EnvFallback != "NATS_URL" {
				t.Errorf("nats.url env = %q, fallback %q; want AGENTFLEET_NATS_URL, then NATS_URL", k.Env, k.EnvFallback)
			}
		case k.Path == "agent.openai.base_url" || k.Path == "agent.openai.api_key":
			// The conventional variables of OpenAI clients.
			want := "OPENAI_" + strings.ToUpper(strings.TrimPrefix(k.Path, "agent.openai."))
			if k.Env != "AGENTFLEET_"+strings.ToUpper(strings.ReplaceAll(k.Path, ".", "_")) || k.EnvFallback != want {
				t.Errorf("key %s env = %q, fallback %q; want the AGENTFLEET_ variable, then %s", k.Path, k.Env, k.EnvFallback, want)
			}
		case placeholder:
			if k.Env != "" {
				t.Errorf("key %s under a placeholder has env %q", k.Path, k.Env)
			}
		default:
			want := "AGENTFLEET_" + strings.ToUpper(strings.ReplaceAll(k.Path, ".", "_"))
			if k.Env != want {
				t.Errorf("key %s env = %q, want %q", k.Path, k.Env, want)
			}
		}
		if k.Env != "" {
			if other, dup := seenEnv[k.Env]; dup {
				t.Errorf("env %s names both %s and %s", k.Env, other, k.Path)
			}
			seenEnv[k.Env] = k.Path
		}
	}
	for _, p := range []string{"lease.ttl", "worker.linger", "nats.prefix", "http.token", "session_reset.mode", "agent.gateway_timeout"} {
		if !seenPath[p] {
			t.Errorf("Keys() lacks %s", p)
		}
	}

	// Every YAML leaf of Config has a key, and every key a YAML leaf. The
	// adapter settings of one platform (platforms.telegram.token) are keys
	// of that platform only: they cover the leaf platforms.<platform>.token.
	leaves := map[string]bool{}
	yamlLeaves(reflect.TypeFor[config.Config](), "", leaves)
	generic := map[string]bool{}
	for p := range seenPath {
		generic[p] = true
		if segs := strings.Split(p, "."); len(segs) == 3 && segs[0] == "platforms" && !strings.HasPrefix(segs[1], "<") {
			generic["platforms.<platform>."+segs[2]] = true
		}
	}
	for p := range leaves {
		// Lists and tables set in the file only (docs/configuration.md
		// describes them beside the table).
		if strings.HasPrefix(p, "agent.openai.mcp_servers") || strings.HasPrefix(p, "agent.openai.prices.") {
			continue
		}
		if !generic[p] {
			t.Errorf("YAML key %s has no entry in Keys()", p)
		}
	}
	for p := range seenPath {
		gp := p
		if segs := strings.Split(p, "."); len(segs) == 3 && segs[0] == "platforms" {
			gp = "platforms.<platform>." + segs[2]
		}
		if !leaves[gp] {
			t.Errorf("Keys() entry %s is not a YAML key of Config", p)
		}
	}
}

// yamlLeaves collects the YAML paths of the scalar fields of t; the keys of
// maps become a placeholder named after the map.
func yamlLeaves(t reflect.Type, prefix string, out map[string]bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == reflect.TypeFor[config.Duration]() {
		out[prefix] = true
		return
	}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		p := name
		if prefix != "" {
			p = prefix + "." + name
		}
		ft := f.Type
		if ft.Kind() == reflect.Map {
			ph := "<chat_type>"
			if name == "platforms" {
				ph = "<platform>"
			}
			yamlLeaves(ft.Elem(), p+"."+ph, out)
			continue
		}
		yamlLeaves(ft, p, out)
	}
}

func TestSetEveryKey(t *testing.T) {
	t.Parallel()
	// Setting every key to its documented default keeps a valid Default.
	c := config.Default()
	for _, k := range config.Keys() {
		if strings.Contains(k.Path, "<") || k.Path == "worker.id" {
			continue
		}
		if err := c.Set(k.Path, k.Default); err != nil {
			t.Errorf("Set(%q, %q) = %v", k.Path, k.Default, err)
		}
	}
	if !reflect.DeepEqual(c, config.Default()) {
		t.Errorf("setting every default changed the config:\n got %+v\nwant %+v", c, config.Default())
	}
}

// TestLoadWithFlagsOverInvalidEnv: a flag wins over the environment also
// when the environment's value is invalid (it is not refused), and a bad
// flag value is refused naming the flag.
func TestLoadWithFlagsOverInvalidEnv(t *testing.T) {
	env := func(k string) (string, bool) {
		if k == "AGENTFLEET_HTTP_ADDR" {
			return "bogus", true
		}
		return "", false
	}
	if _, err := config.Load("", env); err == nil || !strings.Contains(err.Error(), "AGENTFLEET_HTTP_ADDR") {
		t.Fatalf("without the flag: %v, want the bad variable refused", err)
	}
	c, err := config.LoadWith("", env, []config.Override{{Path: "http.addr", Value: "127.0.0.1:18083", Source: "flag --http"}})
	if err != nil {
		t.Fatalf("the flag did not win over the bad variable: %v", err)
	}
	if c.HTTP.Addr != "127.0.0.1:18083" {
		t.Fatalf("http.addr %q", c.HTTP.Addr)
	}
	_, err = config.LoadWith("", nil, []config.Override{{Path: "http.addr", Value: "nope", Source: "flag --http"}})
	if err == nil || !strings.Contains(err.Error(), "http.addr") || !strings.Contains(err.Error(), "flag --http") {
		t.Fatalf("bad flag value: %v", err)
	}
}

// TestNotifyExcludePlatforms: session_reset.notify_exclude_platforms is a
// key (it was refused as unknown): the seed's default list, a YAML list in
// the file, a comma-separated list in the environment, carried into the
// reset configuration; an unknown platform is refused, naming the key.
func TestNotifyExcludePlatforms(t *testing.T) {
	t.Parallel()
	def := config.Default()
	if got, want := def.SessionReset.NotifyExcludePlatforms, []string{"api_server", "webhook"}; !slices.Equal(got, want) {
		t.Errorf("default %q, want %q", got, want)
	}
	c, err := config.Load(writeFile(t, "session_reset:\n  notify_exclude_platforms: [http, telegram]\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.ResetConfig().NotifyExcludePlatforms, []session.Platform{session.PlatformHTTP, session.PlatformTelegram}; !slices.Equal(got, want) {
		t.Errorf("from the file: %q, want %q", got, want)
	}
	c, err = config.Load(writeFile(t, "session_reset:\n  notify_exclude_platforms: []\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.ResetConfig().NotifyExcludePlatforms; len(got) != 0 {
		t.Errorf("an empty list excludes %q", got)
	}
	env := func(k string) (string, bool) {
		if k == "AGENTFLEET_SESSION_RESET_NOTIFY_EXCLUDE_PLATFORMS" {
			return " slack , webhook", true
		}
		return "", false
	}
	if c, err = config.Load("", env); err != nil {
		t.Fatal(err)
	}
	if got, want := c.SessionReset.NotifyExcludePlatforms, []string{"slack", "webhook"}; !slices.Equal(got, want) {
		t.Errorf("from the environment: %q, want %q", got, want)
	}
	_, err = config.Load(writeFile(t, "session_reset:\n  notify_exclude_platforms: [http, nosuch]\n"), nil)
	if err == nil || !strings.Contains(err.Error(), "session_reset.notify_exclude_platforms") || !strings.Contains(err.Error(), `"nosuch" is not a known platform`) {
		t.Errorf("unknown platform: %v", err)
	}
}

// TestNATSURLSecretsNeverShown: a password or token inside nats.url is
// neither quoted in a validation error nor printed.
func TestNATSURLSecretsNeverShown(t *testing.T) {
	t.Parallel()
	c := config.Default()
	err := c.Set("nats.url", "http://alice:s3cret@127.0.0.1:4222")
	if err == nil || !strings.Contains(err.Error(), "[redacted]@") || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("Set() = %v; want the scheme refused with the password redacted", err)
	}
	c = config.Default()
	c.NATS.URL = "nats://t0ken@127.0.0.1:4222"
	out, err := yaml.Marshal(c.Redacted())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "t0ken") || !strings.Contains(string(out), "nats://[redacted]@127.0.0.1:4222") {
		t.Errorf("redacted YAML:\n%s", out)
	}
}

// TestPlatformSettings: a Telegram webhook without a valid secret is refused
// (the secret never appears in the error), poll mode needs none, Slack
// needs both of its secrets, and no platform takes another's settings.
func TestPlatformSettings(t *testing.T) {
	t.Parallel()
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		file string
		want string // substring of the error; "" = valid
	}{
		{"webhook without secret", map[string]string{"AGENTFLEET_PLATFORMS_TELEGRAM_TOKEN": "1:abc"}, "", "platforms.telegram.webhook_secret: is empty"},
		{"webhook with bad secret", map[string]string{"AGENTFLEET_PLATFORMS_TELEGRAM_TOKEN": "1:abc", "AGENTFLEET_PLATFORMS_TELEGRAM_WEBHOOK_SECRET": "sëcret!"}, "", "holds a character"},
		{"webhook with secret", map[string]string{"AGENTFLEET_PLATFORMS_TELEGRAM_TOKEN": "1:abc", "AGENTFLEET_PLATFORMS_TELEGRAM_WEBHOOK_SECRET": "s3cret_-X"}, "", ""},
		{"poll without secret", map[string]string{"AGENTFLEET_PLATFORMS_TELEGRAM_TOKEN": "1:abc", "AGENTFLEET_PLATFORMS_TELEGRAM_MODE": "poll"}, "", ""},
		{"bad mode", map[string]string{"AGENTFLEET_PLATFORMS_TELEGRAM_MODE": "push"}, "", `"push" is not one of webhook, poll`},
		{"bad api base", map[string]string{"AGENTFLEET_PLATFORMS_TELEGRAM_API_BASE": "ftp://x"}, "", "is not an http or https URL"},
		{"slack without bot token", map[string]string{"AGENTFLEET_PLATFORMS_SLACK_SIGNING_SECRET": "abc"}, "", "platforms.slack.bot_token: is empty"},
		{"slack complete", map[string]string{"AGENTFLEET_PLATFORMS_SLACK_SIGNING_SECRET": "abc", "AGENTFLEET_PLATFORMS_SLACK_BOT_TOKEN": "xoxb-1"}, "", ""},
		{"socket mode complete", map[string]string{"AGENTFLEET_PLATFORMS_SLACK_MODE": "socket", "AGENTFLEET_PLATFORMS_SLACK_APP_TOKEN": "xapp-1", "AGENTFLEET_PLATFORMS_SLACK_BOT_TOKEN": "xoxb-1"}, "", ""},
		{"socket mode without app token", map[string]string{"AGENTFLEET_PLATFORMS_SLACK_MODE": "socket", "AGENTFLEET_PLATFORMS_SLACK_BOT_TOKEN": "xoxb-1"}, "", "platforms.slack.app_token: is empty"},
		{"slack mode of telegram", map[string]string{"AGENTFLEET_PLATFORMS_SLACK_MODE": "poll"}, "", `"poll" is not one of events, socket`},
		{"whatsapp complete", map[string]string{"AGENTFLEET_PLATFORMS_WHATSAPP_APP_SECRET": "s", "AGENTFLEET_PLATFORMS_WHATSAPP_VERIFY_TOKEN": "v",
			"AGENTFLEET_PLATFORMS_WHATSAPP_ACCESS_TOKEN": "a", "AGENTFLEET_PLATFORMS_WHATSAPP_PHONE_NUMBER_ID": "1"}, "", ""},
		{"whatsapp without verify token", map[string]string{"AGENTFLEET_PLATFORMS_WHATSAPP_APP_SECRET": "s", "AGENTFLEET_PLATFORMS_WHATSAPP_ACCESS_TOKEN": "a",
			"AGENTFLEET_PLATFORMS_WHATSAPP_PHONE_NUMBER_ID": "1"}, "", "platforms.whatsapp.verify_token: is empty"},
		{"discord bad public key", map[string]string{"AGENTFLEET_PLATFORMS_DISCORD_TOKEN": "t", "AGENTFLEET_PLATFORMS_DISCORD_PUBLIC_KEY": "abc"}, "", "platforms.discord.public_key"},
		{"discord gateway not ws", map[string]string{"AGENTFLEET_PLATFORMS_DISCORD_GATEWAY_URL": "http://x"}, "", "is not a ws or wss URL"},
		{"foreign setting", nil, "platforms:\n  whatsapp:\n    token: x\n  telegram:\n    signing_secret: y\n", "platforms.whatsapp.token: is not a setting of platform whatsapp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := ""
			if tc.file != "" {
				path = filepath.Join(t.TempDir(), "c.yaml")
				if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			c, err := config.Load(path, env(tc.env))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				if c.Telegram().Token != "" && c.Telegram().APIBase != config.DefaultTelegramAPIBase {
					t.Errorf("api_base default = %q", c.Telegram().APIBase)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load error = %v, want it to contain %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "sëcret") {
				t.Errorf("the error quotes the secret: %v", err)
			}
		})
	}
	c := config.Default()
	for k, v := range map[string]string{"platforms.telegram.token": "1:tok", "platforms.slack.bot_token": "xoxb-t", "platforms.slack.signing_secret": "sig"} {
		if err := c.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	r := c.Redacted()
	if r.Platforms["telegram"].Token != "[redacted]" || r.Platforms["slack"].BotToken != "[redacted]" || r.Platforms["slack"].SigningSecret != "[redacted]" {
		t.Errorf("Redacted() left a platform secret: %+v", r.Platforms)
	}
	if c.Platforms["telegram"].Token != "1:tok" {
		t.Error("Redacted() changed the original")
	}
	if got := c.ConnectedPlatforms(); len(got) != 3 {
		t.Errorf("ConnectedPlatforms() = %v, want http, telegram, slack", got)
	}
	if !c.Slack().RequireMention {
		t.Error("require_mention defaults to true")
	}
	for k, v := range map[string]string{"platforms.whatsapp.app_secret": "as", "platforms.whatsapp.verify_token": "vt",
		"platforms.whatsapp.access_token": "EAAt", "platforms.discord.token": "dtok", "platforms.discord.require_mention": "false"} {
		if err := c.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	r = c.Redacted()
	if wa := r.Platforms["whatsapp"]; wa.AppSecret != "[redacted]" || wa.VerifyToken != "[redacted]" || wa.AccessToken != "[redacted]" ||
		r.Platforms["discord"].Token != "[redacted]" {
		t.Errorf("Redacted() left a platform secret: %+v", r.Platforms)
	}
	if got := c.ConnectedPlatforms(); len(got) != 5 {
		t.Errorf("ConnectedPlatforms() = %v, want http, telegram, slack, whatsapp, discord", got)
	}
	if d := c.Discord(); d.RequireMention || d.GatewayURL != config.DefaultDiscordGateway || d.APIBase != config.DefaultDiscordAPIBase {
		t.Errorf("Discord() = %+v", d)
	}
	if c.WhatsAppCloud().APIBase != config.DefaultWhatsAppAPIBase {
		t.Errorf("WhatsAppCloud() = %+v", c.WhatsAppCloud())
	}
}
