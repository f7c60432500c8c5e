// Command agentfleet runs the roles of an agentfleet deployment: everything
// in one process on an embedded NATS server (up), a plain NATS node (nats),
// workers, the HTTP ingress, the state-database indexer, the benchmark (bench), and a health check for
// containers (healthcheck).
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/cmd/internal/cliutil"
	"github.com/agentfleet/agentfleet/config"
	"github.com/agentfleet/agentfleet/telemetry"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

func main() {
	app := newApp()
	if err := app.Run(cliutil.Reorder(app, os.Args)); err != nil {
		fmt.Fprintln(os.Stderr, "agentfleet:", err)
		os.Exit(1)
	}
}

func newApp() *cli.App {
	app := &cli.App{
		Name:    "agentfleet",
		Usage:   "the session runtime between chat platforms and LLM agents, on NATS JetStream",
		Version: version,
		// Flags go anywhere (main reorders them) and the shell completes
		// commands and flags (agentfleet completion bash|zsh|fish).
		EnableBashCompletion: true,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Aliases: []string{"c"}, Usage: "YAML configuration `FILE`", EnvVars: []string{"AGENTFLEET_CONFIG"}},
			&cli.StringFlag{Name: "log-level", Usage: "debug, info, warn or error (telemetry.log_level)"},
			&cli.StringFlag{Name: "log-format", Usage: "text or json (telemetry.log_format)"},
		},
		Commands: []*cli.Command{upCommand(), natsCommand(), provisionCommand(), natsPermissionsCommand(), workerCommand(), ingressCommand(), chatCommand(), indexerCommand(), benchCommand(), configCommand(), healthCommand(), cliutil.CompletionCommand()},
	}
	cliutil.RefuseUnknownCommands(app)
	return app
}

// loadConfig reads the configuration with the precedence flag > env > file >
// default. flagKeys maps command flags to configuration paths; the flags of
// natsFlags and allowUnauthenticatedFlag are mapped wherever a command has
// them.
func loadConfig(c *cli.Context, flagKeys map[string]string) (config.Config, error) {
	cfg, _, err := loadConfigSourced(c, flagKeys)
	return cfg, err
}

// natsFlags are the connection flags of the roles that connect to NATS.
func natsFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "nats-url", Usage: "NATS server `URL`s, comma-separated (nats.url; env AGENTFLEET_NATS_URL, else NATS_URL)"},
		&cli.StringFlag{Name: "nats-wait", Usage: "wait up to `DUR` at start for NATS to be reachable, e.g. 2m; 0 gives up at once (nats.connect_wait)", DefaultText: "1m"},
	}
}

// allowUnauthenticatedFlag is for the roles that serve HTTP.
var allowUnauthenticatedFlag = &cli.BoolFlag{Name: "allow-unauthenticated",
	Usage: "serve a non-loopback --http address without http.token (http.allow_unauthenticated)"}

// loadConfigSourced is loadConfig that also says where each value came from.
func loadConfigSourced(c *cli.Context, flagKeys map[string]string) (config.Config, config.Sources, error) {
	var overrides []config.Override
	add := func(flag, path string) {
		if c.IsSet(flag) {
			overrides = append(overrides, config.Override{Path: path, Value: c.String(flag), Source: "flag --" + flag})
		}
	}
	add("log-level", "telemetry.log_level")
	add("log-format", "telemetry.log_format")
	add("nats-url", "nats.url")
	add("nats-wait", "nats.connect_wait")
	add("allow-unauthenticated", "http.allow_unauthenticated")
	for flag, path := range flagKeys {
		add(flag, path)
	}
	return config.LoadSourced(c.String("config"), os.LookupEnv, overrides)
}

func newLogger(cfg config.Config, role string) *slog.Logger {
	level := slog.LevelInfo
	switch strings.ToLower(cfg.Telemetry.LogLevel) {
	case "debug":
		level = slog.LevelDebug
	case "warn":
		level = slog.LevelWarn
	case "error":
		level = slog.LevelError
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, opts)
	if cfg.Telemetry.LogFormat == "json" {
		h = slog.NewJSONHandler(os.Stderr, opts)
	}
	// A line logged with a traced context carries its trace id. The
	// process's default logger is this one, so that a component left
	// without a logger (and the standard log package) logs the same way.
	log := slog.New(telemetry.LogHandler(h)).With(slog.String("role", role))
	slog.SetDefault(log)
	return log
}

// signalContext is cancelled by the first SIGINT or SIGTERM; a second one
// exits the process at once.
func signalContext(log *slog.Logger) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		sig := <-ch
		log.Info("stopping; a second signal exits at once", slog.String("signal", sig.String()))
		cancel()
		sig = <-ch
		log.Warn("second signal: exiting now", slog.String("signal", sig.String()))
		os.Exit(130)
	}()
	return ctx, func() { signal.Stop(ch); cancel() }
}
