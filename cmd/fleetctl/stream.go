package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/broker"
)

type consumerReport struct {
	Name          string `json:"name"`
	Pending       uint64 `json:"pending"`
	AckPending    int    `json:"ack_pending"`
	Redelivered   int    `json:"redelivered"`
	Waiting       int    `json:"waiting"`
	MaxDeliver    int    `json:"max_deliver"`
	AckWait       string `json:"ack_wait"`
	MaxAckPending int    `json:"max_ack_pending"`
}

type streamReport struct {
	Name          string           `json:"name"`
	Bucket        string           `json:"bucket,omitempty"`
	Messages      uint64           `json:"messages"`
	Bytes         uint64           `json:"bytes"`
	Replicas      int              `json:"replicas"`
	Retention     string           `json:"retention"`
	Storage       string           `json:"storage"`
	MaxConsumers  int              `json:"max_consumers"`
	MaxMsgsPerSub int64            `json:"max_msgs_per_subject"`
	Consumers     []consumerReport `json:"consumers"`
}

type fleetReport struct {
	Streams  []streamReport `json:"streams"`
	Warnings []string       `json:"warnings"`
}

// buildReport reads every stream and bucket of the fleet, their consumers,
// and checks what the lane protocol relies on.
func buildReport(ctx context.Context, cl *client) (fleetReport, error) {
	rep := fleetReport{Streams: []streamReport{}, Warnings: []string{}}
	n := cl.names
	warn := func(format string, a ...any) { rep.Warnings = append(rep.Warnings, fmt.Sprintf(format, a...)) }
	type target struct{ stream, bucket string }
	var targets []target
	for _, in := range cl.res.Inboxes.All() {
		targets = append(targets, target{stream: in.Name})
	}
	targets = append(targets, target{stream: n.TranscriptStream()}, target{stream: n.OutboxStream()}, target{stream: n.EventStream()})
	for _, b := range []string{n.SessionsBucket(), n.SessionIDsBucket(), n.LeasesBucket(), n.MsgIDsBucket(), n.DeliveredBucket(), n.WorkersBucket()} {
		targets = append(targets, target{stream: "KV_" + b, bucket: b})
	}
	want := cl.cfg.NATS.Replicas
	leaseTTL := cl.cfg.Lease.TTL.Duration()
	for _, tg := range targets {
		s, err := cl.js.Stream(ctx, tg.stream)
		if err != nil {
			warn("%s: %v (not provisioned?)", tg.stream, err)
			continue
		}
		info, err := s.Info(ctx)
		if err != nil {
			return rep, err
		}
		cfg := info.Config
		sr := streamReport{Name: cfg.Name, Bucket: tg.bucket, Messages: info.State.Msgs, Bytes: info.State.Bytes, Replicas: cfg.Replicas,
			Retention: cfg.Retention.String(), Storage: cfg.Storage.String(), MaxConsumers: cfg.MaxConsumers, MaxMsgsPerSub: cfg.MaxMsgsPerSubject,
			Consumers: []consumerReport{}}
		if cfg.Retention != jetstream.LimitsPolicy {
			warn("%s: retention %s, want limits (the fleet reads messages after they are acknowledged)", cfg.Name, cfg.Retention)
		}
		if want > 0 && cfg.Replicas < want {
			warn("%s: %d replica(s), the configuration asks for %d (nats.replicas)", cfg.Name, cfg.Replicas, want)
		}
		if cfg.Storage != jetstream.FileStorage {
			warn("%s: %s storage: it does not survive a server restart", cfg.Name, cfg.Storage)
		}
		if cfg.MaxConsumers > 0 && cfg.MaxConsumers < 8 {
			warn("%s: max consumers %d leaves no room for the fleet's consumers and watches", cfg.Name, cfg.MaxConsumers)
		}
		if tg.stream == n.TranscriptStream() && (cfg.MaxMsgsPerSubject > 0 || cfg.MaxAge > 0 || cfg.MaxMsgs > 0) {
			warn("%s: limits (max msgs per subject %d, max age %s, max msgs %d) drop transcript entries", cfg.Name, cfg.MaxMsgsPerSubject, cfg.MaxAge, cfg.MaxMsgs)
		}
		lister := s.ListConsumers(ctx)
		for ci := range lister.Info() {
			cr := consumerReport{Name: ci.Name, Pending: ci.NumPending, AckPending: ci.NumAckPending, Redelivered: ci.NumRedelivered,
				Waiting: ci.NumWaiting, MaxDeliver: ci.Config.MaxDeliver, AckWait: ci.Config.AckWait.String(), MaxAckPending: ci.Config.MaxAckPending}
			sr.Consumers = append(sr.Consumers, cr)
			if _, inbox := n.InboxStreamIndex(tg.stream); inbox && ci.Name == n.WorkersConsumer() {
				if ci.Config.MaxDeliver != -1 {
					warn("consumer %s: max deliver %d, want -1 (unlimited): the server would drop a lane's message after %d deliveries",
						ci.Name, ci.Config.MaxDeliver, ci.Config.MaxDeliver)
				}
				if leaseTTL > 0 && ci.Config.AckWait < broker.WorkersAckWait(leaseTTL) {
					warn("consumer %s: ack wait %s below the lease ttl %s: a message comes back while its lane is still held", ci.Name, ci.Config.AckWait, leaseTTL)
				}
				if len(ci.Config.BackOff) > 0 {
					warn("consumer %s: backoff %v, want none", ci.Name, ci.Config.BackOff)
				}
				if ci.Config.AckPolicy != jetstream.AckExplicitPolicy {
					warn("consumer %s: ack policy %s, want explicit", ci.Name, ci.Config.AckPolicy)
				}
			}
		}
		if err := lister.Err(); err != nil {
			return rep, err
		}
		rep.Streams = append(rep.Streams, sr)
	}
	return rep, nil
}

func renderReport(w io.Writer, rep fleetReport) error {
	t := newTable("STREAM", "BUCKET", "MESSAGES", "BYTES", "REPLICAS", "RETENTION", "STORAGE", "CONSUMERS")
	for _, s := range rep.Streams {
		t.row(s.Name, s.Bucket, s.Messages, s.Bytes, s.Replicas, s.Retention, s.Storage, len(s.Consumers))
	}
	if err := t.print(w); err != nil {
		return err
	}
	ct := newTable("STREAM", "CONSUMER", "PENDING", "ACK PENDING", "REDELIVERED", "WAITING", "MAX DELIVER", "ACK WAIT")
	any := false
	for _, s := range rep.Streams {
		for _, c := range s.Consumers {
			any = true
			ct.row(s.Name, c.Name, c.Pending, c.AckPending, c.Redelivered, c.Waiting, c.MaxDeliver, c.AckWait)
		}
	}
	if any {
		fmt.Fprintln(w)
		if err := ct.print(w); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	if len(rep.Warnings) == 0 {
		_, err := fmt.Fprintln(w, "no warnings")
		return err
	}
	_, err := fmt.Fprintln(w, "WARNINGS\n  "+strings.Join(rep.Warnings, "\n  "))
	return err
}

func streamCommand() *cli.Command {
	return &cli.Command{
		Name:  "stream",
		Usage: "the fleet's JetStream streams and buckets",
		Subcommands: []*cli.Command{{
			Name: "report",
			Usage: "streams and buckets (messages, replicas, retention), consumers (pending, ack pending, redelivered), and warnings " +
				"for settings the lane protocol cannot work with (max deliver, ack wait, retention, replicas, storage, max consumers)",
			Flags: []cli.Flag{jsonFlag()},
			Action: func(c *cli.Context) error {
				cl, ctx, done, err := dial(c)
				if err != nil {
					return err
				}
				defer done()
				rep, err := buildReport(ctx, cl)
				if err != nil {
					return err
				}
				if c.Bool("json") {
					return printJSON(c.App.Writer, rep)
				}
				return renderReport(c.App.Writer, rep)
			},
		}},
	}
}
