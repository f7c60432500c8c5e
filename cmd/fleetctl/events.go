package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v2"
)

// eventDoc is one message of the events stream.
type eventDoc struct {
	Seq     uint64          `json:"seq"`
	Subject string          `json:"subject"`
	Kind    string          `json:"kind"`
	Lane    string          `json:"lane"`
	At      time.Time       `json:"at"`
	Event   json.RawMessage `json:"event"`
}

func eventsCommand() *cli.Command {
	return &cli.Command{
		Name:  "events",
		Usage: "the fleet's lifecycle events (turn, resume, deadletter, duplicate, discarded, finalize, pruned, undeliverable)",
		Subcommands: []*cli.Command{{
			Name: "tail",
			Usage: "follow events until interrupted (new ones; --all or --since for stored ones). " +
				"With --json, one JSON document per event, one per line",
			Flags: []cli.Flag{jsonFlag(),
				&cli.StringFlag{Name: "kind", Usage: "only events of `KIND`"},
				&cli.StringFlag{Name: "lane", Usage: "only events of one lane (`KEY`, lane or session id)"},
				&cli.BoolFlag{Name: "all", Usage: "start with every stored event"},
				&cli.DurationFlag{Name: "since", Usage: "start with the events of the last `DUR`"},
				&cli.IntFlag{Name: "count", Usage: "stop after `N` events"},
			},
			Action: func(c *cli.Context) error {
				if c.NArg() > 0 {
					return errors.New("usage: fleetctl events tail [--kind K] [--lane KEY] [--all | --since DUR] [--count N]")
				}
				kind := c.String("kind")
				if strings.ContainsAny(kind, ".*> ") {
					return fmt.Errorf("--kind %q: want one event kind such as turn", kind)
				}
				cl, ctx, done, err := dialFor(c, true)
				if err != nil {
					return err
				}
				defer done()
				lane := ">"
				if c.IsSet("lane") {
					if lane, err = resolveLane(ctx, cl, c.String("lane")); err != nil {
						return err
					}
				}
				if kind == "" {
					kind = "*"
				}
				cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{cl.names.EventSubject(kind, lane)}, DeliverPolicy: jetstream.DeliverNewPolicy}
				switch {
				case c.Bool("all"):
					cfg.DeliverPolicy = jetstream.DeliverAllPolicy
				case c.Duration("since") > 0:
					start := time.Now().Add(-c.Duration("since"))
					cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &start
				}
				cons, err := cl.js.OrderedConsumer(ctx, cl.names.EventStream(), cfg)
				if err != nil {
					return err
				}
				it, err := cons.Messages()
				if err != nil {
					return err
				}
				stop := context.AfterFunc(ctx, it.Stop)
				defer stop()
				defer it.Stop()
				prefix := cl.names.Prefix() + ".ev."
				header := !c.Bool("json")
				for n := 0; c.Int("count") == 0 || n < c.Int("count"); n++ {
					m, err := it.Next()
					if err != nil {
						if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
							return nil
						}
						return err
					}
					meta, _ := m.Metadata()
					d := eventDoc{Subject: m.Subject(), Event: json.RawMessage(m.Data())}
					if meta != nil {
						d.Seq, d.At = meta.Sequence.Stream, meta.Timestamp
					}
					if k, l, ok := strings.Cut(strings.TrimPrefix(m.Subject(), prefix), "."); ok {
						d.Kind, d.Lane = k, l
					}
					if !json.Valid(d.Event) {
						d.Event, _ = json.Marshal(string(m.Data()))
					}
					if c.Bool("json") {
						b, _ := json.Marshal(d)
						fmt.Fprintln(c.App.Writer, string(b))
						continue
					}
					if header {
						fmt.Fprintln(c.App.Writer, "SEQ  AT  KIND  LANE  EVENT")
						header = false
					}
					fmt.Fprintf(c.App.Writer, "%d  %s  %s  %s  %s\n", d.Seq, d.At.UTC().Format(time.RFC3339), safe(d.Kind), safe(d.Lane), safe(fmt.Sprint(d.Event)))
				}
				return nil
			},
		}},
	}
}
