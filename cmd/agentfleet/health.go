package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/config"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/statedb"
	"github.com/agentfleet/agentfleet/worker"
)

// healthCommand checks one role from inside its host or container, for
// container health checks that have no shell or curl to run: it exits 0
// when healthy, 1 with the reason on stderr otherwise.
func healthCommand() *cli.Command {
	return &cli.Command{
		Name:  "healthcheck",
		Usage: "exit 0 if a role is healthy (for container health checks); one of --url, --nats, --worker or --indexer",
		Description: "--url GETs an HTTP address and wants a 2xx answer (the ingress's /readyz).\n" +
			"--nats connects to one NATS server (with the nats.* credentials of the configuration) and wants\n" +
			"its JetStream to answer an account information request, which in a cluster needs a meta leader.\n" +
			"--worker reads this process's worker (worker.id) from the worker registry and wants it running;\n" +
			"a worker that stopped heartbeating drops out of the registry by itself.\n" +
			"--indexer wants the state database's API (served by the indexers) to answer a stats request\n" +
			"without an error: a database that can be read, behind a NATS connection that works.\n" +
			"AGENTFLEET_HEALTHCHECK_NATS_USER, _PASSWORD and _INBOX_PREFIX, when set, replace nats.user,\n" +
			"nats.password and nats.inbox_prefix: a role's container keeps its own NATS user for the role and\n" +
			"gives its health check the healthcheck user (docs/security.md).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "url", Usage: "HTTP `URL` that must answer 2xx"},
			&cli.StringFlag{Name: "nats", Usage: "NATS server `URL` whose JetStream must answer"},
			&cli.BoolFlag{Name: "worker", Usage: "the worker worker.id must be registered and running (over NATS_URL)"},
			&cli.BoolFlag{Name: "indexer", Usage: "the state database's API must answer (over NATS_URL)"},
			&cli.DurationFlag{Name: "timeout", Value: 5 * time.Second, Usage: "give up after `DUR`"},
		},
		Action: func(c *cli.Context) error {
			n := 0
			for _, f := range []string{"url", "nats", "worker", "indexer"} {
				if c.IsSet(f) {
					n++
				}
			}
			if n != 1 {
				return errors.New("healthcheck: give exactly one of --url, --nats, --worker or --indexer")
			}
			if c.Duration("timeout") <= 0 {
				return fmt.Errorf("healthcheck: --timeout %v: want a positive duration", c.Duration("timeout"))
			}
			ctx, cancel := context.WithTimeout(context.Background(), c.Duration("timeout"))
			defer cancel()
			if u := c.String("url"); u != "" {
				return checkHTTP(ctx, u)
			}
			cfg, err := loadConfig(c, nil)
			if err != nil {
				return err
			}
			healthcheckUser(&cfg, os.LookupEnv)
			url := cfg.NATS.URL
			if c.IsSet("nats") {
				url = c.String("nats")
			}
			nc, err := broker.Connect(broker.ConnectConfig{URL: url, Name: "agentfleet-healthcheck",
				User: cfg.NATS.User, Password: cfg.NATS.Password, Token: cfg.NATS.Token, Creds: cfg.NATS.Creds, NKey: cfg.NATS.NKey,
				TLSCA: cfg.NATS.TLS.CA, TLSCert: cfg.NATS.TLS.Cert, TLSKey: cfg.NATS.TLS.Key, TLSInsecure: cfg.NATS.TLS.InsecureSkipVerify,
				InboxPrefix: cfg.NATS.InboxPrefix, Timeout: c.Duration("timeout")})
			if err != nil {
				return fmt.Errorf("healthcheck: %w", err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			if c.IsSet("nats") {
				if _, err := js.AccountInfo(ctx); err != nil {
					return fmt.Errorf("healthcheck: jetstream at %s: %w", nc.ConnectedUrlRedacted(), err)
				}
				return nil
			}
			names, err := broker.NewNames(cfg.NATS.Prefix)
			if err != nil {
				return err
			}
			if c.Bool("indexer") {
				return checkIndexer(ctx, nc, names)
			}
			return checkWorker(ctx, js, names, cfg.Worker.ID)
		},
	}
}

// healthcheckUser replaces the NATS user, password and inbox prefix of cfg
// with AGENTFLEET_HEALTHCHECK_NATS_USER, _PASSWORD and _INBOX_PREFIX, each
// when set and not empty.
func healthcheckUser(cfg *config.Config, lookup func(string) (string, bool)) {
	for name, dst := range map[string]*string{
		"AGENTFLEET_HEALTHCHECK_NATS_USER":         &cfg.NATS.User,
		"AGENTFLEET_HEALTHCHECK_NATS_PASSWORD":     &cfg.NATS.Password,
		"AGENTFLEET_HEALTHCHECK_NATS_INBOX_PREFIX": &cfg.NATS.InboxPrefix,
	} {
		if v, ok := lookup(name); ok && v != "" {
			*dst = v
		}
	}
}

func checkHTTP(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("healthcheck: %s answered %s: %s", url, resp.Status, body)
	}
	return nil
}

func checkWorker(ctx context.Context, js jetstream.JetStream, names broker.Names, id string) error {
	bucket, err := js.KeyValue(ctx, names.WorkersBucket())
	if err != nil {
		return fmt.Errorf("healthcheck: worker registry: %w", err)
	}
	e, err := bucket.Get(ctx, session.LaneToken(id))
	if err != nil {
		return fmt.Errorf("healthcheck: worker %s: not in the registry: %w", id, err)
	}
	var r worker.WorkerRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return fmt.Errorf("healthcheck: worker %s: bad registry record: %w", id, err)
	}
	if r.State != worker.StateRunning {
		return fmt.Errorf("healthcheck: worker %s is %s", id, r.State)
	}
	return nil
}

// checkIndexer asks the state database's API for its statistics and wants
// an answer that is not an error.
func checkIndexer(ctx context.Context, nc *nats.Conn, names broker.Names) error {
	subject := names.APIPrefix() + "." + statedb.EndpointStats
	m, err := nc.RequestWithContext(ctx, subject, []byte("{}"))
	if err != nil {
		return fmt.Errorf("healthcheck: state database api (%s): %w", subject, err)
	}
	if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
		return fmt.Errorf("healthcheck: state database api answered %s %s", code, m.Header.Get(micro.ErrorHeader))
	}
	return nil
}
