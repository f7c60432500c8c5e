package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"

	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/statedb"
	"github.com/agentfleet/agentfleet/telemetry"
)

// startIndexer runs the indexer that writes the state database at path, and
// serves it as the fleet.api micro service. rebuild deletes the file first,
// so it is built again from the streams.
func (rt *runtime) startIndexer(ctx context.Context, path string, rebuild bool, wg *sync.WaitGroup, errs chan<- error) error {
	nc, js, err := rt.connect("agentfleet-indexer")
	if err != nil {
		return err
	}
	res, err := rt.provision(ctx, js)
	if err != nil {
		return err
	}
	if rebuild {
		if err := statedb.RemoveFiles(path); err != nil {
			return fmt.Errorf("rebuild: %w", err)
		}
		rt.log.Info("state database removed for a rebuild from the streams", slog.String("db", path))
	}
	db, err := statedb.Open(ctx, path, &statedb.Options{Logger: rt.log})
	if err != nil {
		return err
	}
	ix, err := statedb.NewIndexer(res, db, statedb.IndexerConfig{Names: rt.names, Name: rt.cfg.Indexer.Name,
		BatchSize: rt.cfg.Indexer.BatchSize, Logger: rt.log})
	if err != nil {
		db.Close()
		return err
	}
	api, err := statedb.StartAPI(nc, db, rt.names, rt.log)
	if err != nil {
		db.Close()
		return err
	}
	// The indexer's lag is its consumers' pending count.
	if _, err := rt.instruments().ObserveConsumers(telemetry.ConsumerStates(js, rt.names.TranscriptStream(), rt.names.EventStream())); err != nil {
		_ = api.Stop()
		db.Close()
		return err
	}
	rt.log.Info("indexer started", slog.String("db", db.Path()))
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := ix.Run(ctx)
		_ = api.Stop()
		if cerr := db.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			errs <- fmt.Errorf("indexer: %w", err)
		}
	}()
	return nil
}

func indexerCommand() *cli.Command {
	return &cli.Command{
		Name:  "indexer",
		Usage: "write the state database (SQLite) from the transcript and event streams against NATS (nats.url), and serve it as the fleet.api micro service",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "db", Usage: "SQLite database `FILE` (indexer.db)"},
			&cli.StringFlag{Name: "name", Usage: "durable consumer name suffix of this indexer (indexer.name)"},
			&cli.BoolFlag{Name: "rebuild", Usage: "delete the database file and build it again from the streams"},
			metricsFlag,
		}, natsFlags()...),
		Action: func(c *cli.Context) error {
			cfg, err := loadConfig(c, map[string]string{"db": "indexer.db", "name": "indexer.name", "metrics": "telemetry.metrics_addr"})
			if err != nil {
				return err
			}
			if cfg.Indexer.DB == "" {
				return errors.New("indexer: no database file: give --db FILE (or indexer.db)")
			}
			log := newLogger(cfg, "indexer")
			rt, err := newRuntime(cfg, log)
			if err != nil {
				return err
			}
			defer rt.close()
			ctx, stop := signalContext(log)
			defer stop()
			rt.ctx = ctx
			var wg sync.WaitGroup
			errs := make(chan error, 16)
			if err := rt.startMetrics(ctx, "indexer", false, &wg, errs); err != nil {
				return abortStart(ctx, stop, &wg, err)
			}
			if err := rt.startIndexer(ctx, cfg.Indexer.DB, c.Bool("rebuild"), &wg, errs); err != nil {
				return abortStart(ctx, stop, &wg, err)
			}
			return waitRoles(ctx, stop, &wg, errs)
		},
	}
}

// upIndexerPath is the state database of `agentfleet up`: indexer.db, or
// state.db in the data directory.
func upIndexerPath(dbPath, dataDir string) string {
	if dbPath != "" {
		return dbPath
	}
	return filepath.Join(dataDir, "state.db")
}
