package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/internal/filelock"
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
	// One indexer per file: a second one would take the same durable
	// consumers from the first, over and over, and --rebuild would delete
	// the file under it.
	lock, err := lockStateDB(path)
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			lock.Close()
		}
	}()
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
	ok = true
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := ix.Run(ctx)
		_ = api.Stop()
		if cerr := db.Close(); err == nil {
			err = cerr
		}
		lock.Close()
		if err != nil {
			errs <- fmt.Errorf("indexer: %w", err)
		}
	}()
	return nil
}

// lockStateDB takes the lock <path>.lock of the state database at path,
// refusing when another indexer holds it.
func lockStateDB(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("indexer: %w", err)
	}
	lp := path + ".lock"
	f, err := filelock.Lock(lp, 2*time.Second)
	if errors.Is(err, filelock.ErrLocked) {
		return nil, fmt.Errorf("indexer: the state database %s is in use by another indexer (%s holds %s): "+
			"stop it first, or give this one its own file (indexer.db, AGENTFLEET_INDEXER_DB; --db of agentfleet indexer)", path, filelock.Holder(lp), lp)
	}
	if err != nil {
		return nil, fmt.Errorf("indexer: %w", err)
	}
	return f, nil
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
