package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/admin"
	"github.com/agentfleet/agentfleet/broker"
)

type inboxStreamReport struct {
	Name       string `json:"name"`
	Partitions []int  `json:"partitions"`
	Messages   uint64 `json:"messages"`
	Leader     string `json:"leader,omitempty"`
}

type inboxReport struct {
	Streams int           `json:"streams"`
	Target  int           `json:"target,omitempty"`
	Moving  []broker.Move `json:"moving,omitempty"`
	// ClosedSince is when the earliest of the moving partitions closed:
	// publishes to them wait (the ingress answers 503 past its publish
	// timeout) until the migration ends.
	ClosedSince time.Time           `json:"closed_since,omitzero"`
	Revision    uint64              `json:"revision"`
	PerStream   []inboxStreamReport `json:"per_stream"`
}

func inboxCommand() *cli.Command {
	return &cli.Command{
		Name:  "inbox",
		Usage: "the inbox streams: which partitions each holds, and changing their number on a running fleet",
		Subcommands: []*cli.Command{{
			Name:  "show",
			Usage: "the inbox map: each inbox stream, its partitions, messages and leader, and any migration under way",
			Flags: []cli.Flag{jsonFlag()},
			Action: func(c *cli.Context) error {
				cl, ctx, done, err := dial(c)
				if err != nil {
					return err
				}
				defer done()
				m, rev := cl.res.Inboxes.Map()
				rep := inboxReport{Streams: m.Streams, Target: m.Target, Moving: m.Moving, Revision: rev, PerStream: []inboxStreamReport{}}
				for _, mv := range m.Moving {
					if !mv.Closed.IsZero() && (rep.ClosedSince.IsZero() || mv.Closed.Before(rep.ClosedSince)) {
						rep.ClosedSince = mv.Closed
					}
				}
				for _, in := range cl.res.Inboxes.All() {
					sr := inboxStreamReport{Name: in.Name, Partitions: m.PartitionsOf(in.Index)}
					if info, err := in.Stream.Info(ctx); err == nil {
						sr.Messages = info.State.Msgs
						if info.Cluster != nil {
							sr.Leader = info.Cluster.Leader
						}
					}
					rep.PerStream = append(rep.PerStream, sr)
				}
				if c.Bool("json") {
					return printJSON(c.App.Writer, rep)
				}
				fmt.Fprintf(c.App.Writer, "inbox streams: %d (map revision %d)\n", rep.Streams, rep.Revision)
				if m.Migrating() {
					fmt.Fprintf(c.App.Writer, "migration under way to %d streams, %d partitions moving: run `fleetctl inbox streams %d` to finish it\n", m.Target, len(m.Moving), m.Count())
				}
				if len(m.Moving) > 0 {
					since := "an unknown time (a migration of an older version)"
					if !rep.ClosedSince.IsZero() {
						since = fmt.Sprintf("%s (%s ago)", rep.ClosedSince.UTC().Format(time.RFC3339), time.Since(rep.ClosedSince).Round(time.Second))
					}
					fmt.Fprintf(c.App.Writer, "CLOSED: %d partitions take no publishes since %s (the ingress answers 503 for their lanes); if no migration is running, run `fleetctl inbox streams %d` to finish it (or, when it cannot, to be told which messages keep a partition closed and what to do)\n",
						len(m.Moving), since, m.Count())
					for _, mv := range m.Moving {
						state := "draining its old stream"
						if m.Flipped(mv) {
							state = "flipped, old stream to purge"
						}
						fmt.Fprintf(c.App.Writer, "  partition %d: %s -> %s, %s\n", mv.P, cl.names.InboxStreamAt(mv.From), cl.names.InboxStreamAt(mv.To), state)
					}
				}
				tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "STREAM\tPARTITIONS\tMESSAGES\tLEADER")
				for _, sr := range rep.PerStream {
					fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", sr.Name, len(sr.Partitions), sr.Messages, sr.Leader)
				}
				return tw.Flush()
			},
		}, {
			Name:      "streams",
			Usage:     "change the number of inbox streams of the running fleet to N, losing nothing (see docs/operations.md)",
			ArgsUsage: "N",
			Description: `Moves partitions (partition p goes to stream p mod N) a batch at a time: a moving partition's
publishes wait (the ingress holds them up to its publish timeout, then answers 503 and the client
retries), its old stream drains (every lane commits what it holds there), then the new stream takes it.
Safe to run against a live fleet and to run again after an interruption (it finishes the migration).
Run with the fleet's current count, it moves nothing to change it and only looks for messages left
in a stream their partition is no longer assigned to (answering them, or failing with what to do).
Set nats.inbox_streams to N (or 0) in the configuration of processes started afterwards.`,
			Flags: []cli.Flag{
				jsonFlag(),
				&cli.IntFlag{Name: "batch", Value: 8, Usage: "partitions moved at once"},
				&cli.DurationFlag{Name: "drain-timeout", Value: 0, Usage: "longest wait for one batch's old stream to drain (then the batch reopens where it was)", DefaultText: "2m"},
			},
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 {
					return fmt.Errorf("usage: fleetctl inbox streams N (1 to %d)", broker.MaxInboxStreams)
				}
				n, err := strconv.Atoi(c.Args().First())
				if err != nil || n < 1 || n > broker.MaxInboxStreams {
					return fmt.Errorf("inbox streams %q: want a number from 1 to %d", c.Args().First(), broker.MaxInboxStreams)
				}
				cl, ctx, done, err := dialFor(c, true)
				if err != nil {
					return err
				}
				defer done()
				log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
				rep, err := cl.fl.MigrateInbox(ctx, n, admin.MigrateOptions{Batch: c.Int("batch"), DrainTimeout: c.Duration("drain-timeout"), Log: log})
				if err != nil {
					return err
				}
				if c.Bool("json") {
					return printJSON(c.App.Writer, rep)
				}
				renderMigrateReport(c.App.Writer, rep)
				return nil
			},
		}},
	}
}

// renderMigrateReport is the summary of `inbox streams`: the moves that
// changed the count, and the messages left in a stream their partition is
// not assigned to (strays) that the command found and answered. A run at
// the fleet's count only looks for those.
func renderMigrateReport(w io.Writer, rep admin.MigrateReport) {
	took := fmt.Sprintf("in %s", rep.Took.Round(time.Millisecond))
	if rep.Moved > 0 {
		took += fmt.Sprintf(" (longest drain %s)", rep.Drain.Round(time.Millisecond))
	}
	strays := "no stray messages found"
	if rep.Strays > 0 {
		strays = fmt.Sprintf("stray messages found in %s and answered", count(rep.Strays, "partition"))
	}
	if rep.From == rep.To {
		moved := "no partition moved"
		if rep.Moved > 0 {
			moved = count(rep.Moved, "partition move")
		}
		fmt.Fprintf(w, "inbox streams: %d, unchanged; %s; %s %s\n", rep.To, strays, moved, took)
		return
	}
	fmt.Fprintf(w, "inbox streams: %d -> %d, %s %s; %s\n", rep.From, rep.To, count(rep.Moved, "partition move"), took, strays)
}

// count is "n thing", with an s when n is not 1.
func count(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
