package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/ingress"
)

// DeliveryFailureView is one reply a platform delivery gave up on, as
// fleetctl delivery failures shows it.
type DeliveryFailureView struct {
	// Seq is the event's sequence in the events stream.
	Seq uint64 `json:"seq"`
	ingress.DeliveryFailure
}

func deliveryCommand() *cli.Command {
	return &cli.Command{
		Name:  "delivery",
		Usage: "outbound delivery to chat platforms",
		Subcommands: []*cli.Command{{
			Name:  "failures",
			Usage: "replies given up after their retry budget (attempts or age), or refused by the platform",
			Flags: []cli.Flag{jsonFlag(),
				&cli.StringFlag{Name: "platform", Usage: "only this `PLATFORM`'s failures"},
				&cli.DurationFlag{Name: "since", Usage: "only failures of the last `DURATION`"},
			},
			Action: func(c *cli.Context) error {
				cl, ctx, done, err := dial(c)
				if err != nil {
					return err
				}
				defer done()
				var since time.Time
				if d := c.Duration("since"); d > 0 {
					since = time.Now().Add(-d)
				}
				fails, err := readDeliveryFailures(ctx, cl, c.String("platform"), since)
				if err != nil {
					return err
				}
				if c.Bool("json") {
					if fails == nil {
						fails = []DeliveryFailureView{}
					}
					return printJSON(c.App.Writer, map[string]any{"failures": fails})
				}
				w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "SEQ\tFAILED AT\tPLATFORM\tSESSION KEY\tREPLY\tSENT\tATTEMPTS\tERROR")
				for _, f := range fails {
					fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%d/%d\t%d\t%s\n", f.Seq, f.FailedAt.Format(time.RFC3339), f.Platform,
						f.SessionKey, f.ReplyID, f.SentChunks, f.Chunks, f.Attempts, f.Error)
				}
				return w.Flush()
			},
		}},
	}
}

// readDeliveryFailures reads the delivery_failed events, oldest first.
func readDeliveryFailures(ctx context.Context, cl *client, platform string, since time.Time) ([]DeliveryFailureView, error) {
	ev, err := cl.js.Stream(ctx, cl.names.EventStream())
	if err != nil {
		return nil, fmt.Errorf("events stream: %w", err)
	}
	var out []DeliveryFailureView
	seq := uint64(1)
	if !since.IsZero() {
		// Start at the first event stored since then.
		cons, err := ev.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{cl.names.DeliveryFailedWildcard()},
			DeliverPolicy:  jetstream.DeliverByStartTimePolicy, OptStartTime: &since,
		})
		if err != nil {
			return nil, err
		}
		m, err := cons.Next(jetstream.FetchMaxWait(time.Second))
		if errors.Is(err, jetstream.ErrNoMessages) || errors.Is(err, nats.ErrTimeout) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		md, err := m.Metadata()
		if err != nil {
			return nil, err
		}
		seq = md.Sequence.Stream
	}
	for {
		raw, err := ev.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(cl.names.DeliveryFailedWildcard()))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		seq = raw.Sequence + 1
		var f ingress.DeliveryFailure
		if json.Unmarshal(raw.Data, &f) != nil {
			continue
		}
		if platform != "" && string(f.Platform) != platform {
			continue
		}
		out = append(out, DeliveryFailureView{Seq: raw.Sequence, DeliveryFailure: f})
	}
}
