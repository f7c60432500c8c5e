package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/worker"
)

// incarnation is the part of a worker's owner id after its id.
func incarnation(r worker.WorkerRecord) string {
	if i := strings.LastIndexByte(r.Owner, '/'); i >= 0 {
		return r.Owner[i+1:]
	}
	return ""
}

// workerDoc is a registry record with what fleetctl derives from it.
type workerDoc struct {
	worker.WorkerRecord
	Incarnation string `json:"incarnation"`
	// HeartbeatAge is how long ago the last heartbeat was written, by this
	// machine's clock.
	HeartbeatAge string `json:"heartbeat_age"`
}

func toWorkerDoc(r worker.WorkerRecord, now time.Time) workerDoc {
	return workerDoc{WorkerRecord: r, Incarnation: incarnation(r), HeartbeatAge: now.Sub(r.HeartbeatAt).Round(time.Second).String()}
}

func renderWorkers(w io.Writer, docs []workerDoc) error {
	// A worker is shown as it appears in logs, leases and entries: its
	// owner id, <worker id>/<incarnation>.
	t := newTable("WORKER", "STATE", "VERSION", "LANES", "TURNS RUNNING", "TURNS", "TAKEOVERS", "CACHE", "HEARTBEAT", "HOST/PID", "WATCHER")
	for _, d := range docs {
		owner := d.Owner
		if owner == "" {
			owner = d.ID
		}
		t.row(owner, d.State, d.Version, d.LanesOwned, d.TurnsRunning, d.Turns, d.Takeovers, d.CacheSize,
			d.HeartbeatAge+" ago", fmt.Sprintf("%s/%d", d.Host, d.PID), d.Watcher)
	}
	return t.print(w)
}

func renderWorker(w io.Writer, d workerDoc) error {
	f := newFields()
	f.add("id", d.ID)
	f.add("incarnation", d.Incarnation)
	f.add("owner", d.Owner)
	f.add("state", d.State)
	f.add("version", d.Version)
	f.add("host/pid", fmt.Sprintf("%s/%d", d.Host, d.PID))
	f.add("started_at", d.StartedAt.UTC().Format(time.RFC3339))
	f.add("heartbeat_at", d.HeartbeatAt.UTC().Format(time.RFC3339)+" ("+d.HeartbeatAge+" ago)")
	f.add("lanes_owned", d.LanesOwned)
	f.add("turns_running", d.TurnsRunning)
	f.add("cache_size", d.CacheSize)
	f.add("turns", d.Turns)
	f.add("takeovers", d.Takeovers)
	f.add("recoveries", d.Recoveries)
	f.add("dead_letters", d.DeadLetters)
	f.add("watcher", d.Watcher)
	return f.print(w)
}

func workerCommand() *cli.Command {
	list := func(c *cli.Context) ([]workerDoc, error) {
		cl, ctx, done, err := dial(c)
		if err != nil {
			return nil, err
		}
		defer done()
		recs, err := worker.ListWorkers(ctx, cl.res.Workers)
		if err != nil {
			return nil, err
		}
		now := time.Now()
		docs := make([]workerDoc, 0, len(recs))
		for _, r := range recs {
			docs = append(docs, toWorkerDoc(r, now))
		}
		return docs, nil
	}
	return &cli.Command{
		Name:  "worker",
		Usage: "the worker registry",
		Subcommands: []*cli.Command{
			{
				Name:  "ls",
				Usage: "list workers: state, version, lanes owned, turns running, cache size, last heartbeat (stopped workers stay listed for an hour)",
				Flags: []cli.Flag{jsonFlag()},
				Action: func(c *cli.Context) error {
					docs, err := list(c)
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c.App.Writer, map[string]any{"workers": docs})
					}
					return renderWorkers(c.App.Writer, docs)
				},
			},
			{
				Name:      "info",
				Usage:     "one worker's registry record",
				ArgsUsage: "WORKER_ID_OR_OWNER",
				Flags:     []cli.Flag{jsonFlag()},
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return errors.New("usage: fleetctl worker info WORKER_ID_OR_OWNER")
					}
					docs, err := list(c)
					if err != nil {
						return err
					}
					arg := c.Args().First()
					for _, d := range docs {
						if d.ID == arg || d.Owner == arg {
							if c.Bool("json") {
								return printJSON(c.App.Writer, d)
							}
							return renderWorker(c.App.Writer, d)
						}
					}
					return fmt.Errorf("no worker %q in the registry", arg)
				},
			},
		},
	}
}
