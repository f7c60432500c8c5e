package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/config"
)

// natsContext is the part of a `nats` CLI context file fleetctl uses: the
// JSON document the nats CLI keeps in
// $XDG_CONFIG_HOME/nats/context/NAME.json (~/.config by default), the
// selected one named in nats/context.txt.
type natsContext struct {
	URL      string `json:"url"`
	User     string `json:"user"`
	Password string `json:"password"`
	Token    string `json:"token"`
	Creds    string `json:"creds"`
	NKey     string `json:"nkey"`
	Cert     string `json:"cert"`
	Key      string `json:"key"`
	CA       string `json:"ca"`
}

var contextNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

func natsConfigDir() (string, error) {
	if d := os.Getenv("XDG_CONFIG_HOME"); d != "" {
		return filepath.Join(d, "nats"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(home, ".config", "nats"), nil
}

// selectedContext is the context `nats context select` chose, or "".
func selectedContext() string {
	dir, err := natsConfigDir()
	if err != nil {
		return ""
	}
	b, err := os.ReadFile(filepath.Join(dir, "context.txt"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// loadContext reads context name: a name in the nats CLI's context
// directory, or the path of a context file.
func loadContext(name string) (natsContext, error) {
	var ctx natsContext
	path := name
	if !filepath.IsAbs(name) && !strings.HasSuffix(name, ".json") {
		if !contextNameRE.MatchString(name) {
			return ctx, fmt.Errorf("context %q: not a valid context name", name)
		}
		dir, err := natsConfigDir()
		if err != nil {
			return ctx, err
		}
		path = filepath.Join(dir, "context", name+".json")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return ctx, fmt.Errorf("nats context %q: %w", name, err)
	}
	if err := json.Unmarshal(b, &ctx); err != nil {
		return ctx, fmt.Errorf("nats context %q (%s): %w", name, path, err)
	}
	for _, p := range []*string{&ctx.Creds, &ctx.NKey, &ctx.Cert, &ctx.Key, &ctx.CA} {
		*p = expandHome(os.ExpandEnv(*p))
	}
	return ctx, nil
}

func expandHome(p string) string {
	if strings.HasPrefix(p, "~") {
		if home, err := os.UserHomeDir(); err == nil {
			return home + p[1:]
		}
	}
	return p
}

// connectionFlags are the nats CLI's connection flags.
func connectionFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "server", Aliases: []string{"s"}, Usage: "NATS server `URL`s, comma-separated (nats.url; env NATS_URL)"},
		&cli.StringFlag{Name: "user", Usage: "NATS user name (nats.user)"},
		&cli.StringFlag{Name: "password", Usage: "NATS password (nats.password)"},
		&cli.StringFlag{Name: "creds", Usage: "NATS credentials `FILE` (nats.creds)", EnvVars: []string{"NATS_CREDS"}},
		&cli.StringFlag{Name: "nkey", Usage: "NATS nkey seed `FILE`", EnvVars: []string{"NATS_NKEY"}},
		&cli.StringFlag{Name: "tlscert", Usage: "client certificate `FILE` (nats.tls.cert)", EnvVars: []string{"NATS_CERT"}},
		&cli.StringFlag{Name: "tlskey", Usage: "client key `FILE` (nats.tls.key)", EnvVars: []string{"NATS_KEY"}},
		&cli.StringFlag{Name: "tlsca", Usage: "CA `FILE` to verify the server (nats.tls.ca)", EnvVars: []string{"NATS_CA"}},
		&cli.StringFlag{Name: "context", Usage: "nats CLI context `NAME` (or a context file); without it the selected context is used when no NATS URL is configured", EnvVars: []string{"NATS_CONTEXT"}},
	}
}

// settings is the effective configuration, where each value came from, and
// the nats context used.
type settings struct {
	cfg     config.Config
	sources config.Sources
	context string // the nats context used, if any
}

// loadSettings reads the configuration with the precedence
// flag > --context > env > file > default. Without --context, the nats
// CLI's selected context fills in the connection when neither the file nor
// the environment names a NATS server.
func loadSettings(c *cli.Context) (settings, error) {
	var s settings
	var overrides []config.Override
	ctxName := c.String("context")
	explicit := ctxName != ""
	if !explicit {
		// Only when nothing else names a server.
		base, src, err := config.LoadSourced(c.String("config"), os.LookupEnv, nil)
		if err == nil && src.Of("nats.url") == "" && !c.IsSet("server") && base.NATS.Creds == "" && base.NATS.NKey == "" && base.NATS.User == "" {
			ctxName = selectedContext()
		}
	}
	if ctxName != "" {
		nc, err := loadContext(ctxName)
		if err != nil {
			if explicit {
				return s, err
			}
		} else {
			s.context = ctxName
			from := "nats context " + ctxName
			for path, v := range map[string]string{"nats.url": nc.URL, "nats.user": nc.User, "nats.password": nc.Password, "nats.token": nc.Token,
				"nats.creds": nc.Creds, "nats.tls.cert": nc.Cert, "nats.tls.key": nc.Key, "nats.tls.ca": nc.CA, "nats.nkey": nc.NKey} {
				if v != "" {
					overrides = append(overrides, config.Override{Path: path, Value: v, Source: from})
				}
			}
		}
	}
	// A method given by flag replaces the one the file, the environment or
	// the context gave: only one may be set.
	var replaced []string
	switch {
	case c.IsSet("nkey"):
		replaced = []string{"user", "password", "creds", "token"}
	case c.IsSet("creds"):
		replaced = []string{"user", "password", "token", "nkey"}
	case c.IsSet("user"):
		replaced = []string{"creds", "token", "nkey"}
	}
	for _, k := range replaced {
		if !c.IsSet(k) {
			overrides = append(overrides, config.Override{Path: "nats." + k, Value: "", Source: "replaced by a connection flag"})
		}
	}
	for flag, path := range map[string]string{"server": "nats.url", "user": "nats.user", "password": "nats.password", "creds": "nats.creds", "nkey": "nats.nkey",
		"tlscert": "nats.tls.cert", "tlskey": "nats.tls.key", "tlsca": "nats.tls.ca"} {
		if c.IsSet(flag) {
			overrides = append(overrides, config.Override{Path: path, Value: c.String(flag), Source: "flag --" + flag})
		}
	}
	cfg, src, err := config.LoadSourced(c.String("config"), os.LookupEnv, overrides)
	if err != nil {
		return s, err
	}
	s.cfg, s.sources = cfg, src
	return s, nil
}
