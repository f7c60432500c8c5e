// Package config is the configuration of an agentfleet process: one YAML
// file, environment variables and command-line flags, applied in the order
// flag > env > file > default.
//
// Every key has a documented default (see Default, the "Defaults to" line of
// each field, and docs/configuration.md), a YAML path such as "lease.ttl",
// and, unless it sits under a <platform> or <chat_type> map, an environment
// variable AGENTFLEET_<PATH> (AGENTFLEET_LEASE_TTL); nats.url also falls
// back to NATS_URL when AGENTFLEET_NATS_URL is unset. Keys lists them all;
// the docs are generated from it.
//
// A wrong value is refused at start, naming the key and the value, and all
// the problems are reported together:
//
//	config: lease.ttl: "1s" is below the minimum of 3s (from fleet.yaml:7)
//	config: worker.busy_mode: "later" is not one of interrupt, queue, steer (from AGENTFLEET_WORKER_BUSY_MODE)
//
// A command loads, applies the flags the user passed, then validates again:
//
//	cfg, err := config.Load(cCtx.String("config"), os.LookupEnv)
//	if err != nil {
//		return err
//	}
//	if cCtx.IsSet("http") {
//		if err := cfg.Set("http.addr", cCtx.String("http")); err != nil {
//			return err
//		}
//	}
//	if err := cfg.Validate(); err != nil {
//		return err
//	}
//
// Durations are written as Go durations ("30s", "5m") or as whole seconds
// (1800), the form the seed configuration uses.
package config
