package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
)

// adminCommands publish commands into a lane's inbox, so that the lane's
// owner applies them in order with the messages around them — exactly as if
// the user had typed them.
func adminCommands() []*cli.Command {
	mk := func(name, command, usage string, argName string) *cli.Command {
		args := "KEY_OR_SESSION_ID"
		if argName != "" {
			args += " " + argName
		}
		return &cli.Command{
			Name: name, Usage: usage, ArgsUsage: args, Flags: []cli.Flag{jsonFlag()},
			Action: func(c *cli.Context) error {
				want := 1
				if argName != "" {
					want = 2
				}
				if c.NArg() != want {
					return fmt.Errorf("usage: fleetctl session %s %s", name, args)
				}
				arg := ""
				if argName != "" {
					arg = c.Args().Get(1)
				}
				if command == "busy" && arg != "interrupt" && arg != "queue" && arg != "steer" {
					return fmt.Errorf("busy mode %q: want interrupt, queue or steer", arg)
				}
				cl, ctx, done, err := dial(c)
				if err != nil {
					return err
				}
				defer done()
				lane, err := resolveLane(ctx, cl, c.Args().First())
				if err != nil {
					return err
				}
				seq, err := publishCommand(ctx, cl, lane, command, arg)
				if err != nil {
					return err
				}
				if c.Bool("json") {
					return printJSON(c.App.Writer, map[string]any{"lane": lane, "command": command, "args": arg, "seq": seq})
				}
				fmt.Fprintf(c.App.Writer, "queued /%s for %s at inbox seq %d\n", command, lane, seq)
				return nil
			},
		}
	}
	return []*cli.Command{
		mk("stop", session.CmdStop, "interrupt the running turn and suspend the session (like /stop)", ""),
		mk("reset", session.CmdReset, "start a new session (like /reset)", ""),
		mk("suspend", session.CmdSuspend, "suspend the session: the next message starts a fresh one", ""),
		mk("resume-pending", session.CmdResumePending, "mark the session resume_pending (restart_interrupted)", ""),
		mk("busy", session.CmdBusy, "set the lane's busy mode (like /busy)", "MODE"),
		{
			Name:  "suspend-recent",
			Usage: "mark sessions updated within --max-age resume_pending (after an unclean stop of the whole fleet without markers)",
			Flags: []cli.Flag{jsonFlag(), &cli.DurationFlag{Name: "max-age", Value: 120 * time.Second}},
			Action: func(c *cli.Context) error {
				cl, ctx, done, err := dial(c)
				if err != nil {
					return err
				}
				defer done()
				marked, err := cl.store.SuspendRecentlyActive(ctx, c.Duration("max-age"))
				if err != nil {
					return err
				}
				if c.Bool("json") {
					if marked == nil {
						marked = []string{}
					}
					return printJSON(c.App.Writer, map[string]any{"marked": marked})
				}
				fmt.Fprintf(c.App.Writer, "marked %d session(s) resume_pending\n", len(marked))
				return nil
			},
		},
	}
}

func publishCommand(ctx context.Context, cl *client, lane, command, args string) (uint64, error) {
	e, _, err := cl.store.Get(ctx, lane)
	if err != nil {
		return 0, err
	}
	in := session.Inbound{SessionKey: e.SessionKey, Kind: session.KindCommand, Command: command, Args: args, ReceivedAt: time.Now()}
	if o, ok := e.OriginSource(); ok {
		in.Source = o
	}
	data, err := json.Marshal(in)
	if err != nil {
		return 0, err
	}
	msg := nats.NewMsg(cl.names.InboxSubject(session.Partition(cl.names.Prefix(), lane), lane))
	msg.Data = data
	msg.Header.Set(broker.HdrSessionKey, e.SessionKey)
	msg.Header.Set(broker.HdrKind, session.KindCommand)
	var b [8]byte
	_, _ = rand.Read(b[:])
	ack, err := cl.js.PublishMsg(ctx, msg, jetstream.WithMsgID("admin:"+hex.EncodeToString(b[:])))
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// DeadLetter is one dead-lettered inbox message.
type DeadLetter struct {
	Seq        uint64          `json:"seq"`
	Lane       string          `json:"lane"`
	InboxSeq   uint64          `json:"inbox_seq"`
	SessionID  string          `json:"session_id"`
	TurnID     string          `json:"turn_id"`
	Reason     string          `json:"reason"`
	At         time.Time       `json:"at"`
	Message    session.Inbound `json:"message"`
	SessionKey string          `json:"session_key"`
}

func deadLetterCommand() *cli.Command {
	return &cli.Command{
		Name:    "dlq",
		Aliases: []string{"deadletter"},
		Usage:   "messages dead-lettered after repeated interrupted turns",
		Subcommands: []*cli.Command{
			{
				Name: "ls", Usage: "list dead letters (optionally of one lane)", ArgsUsage: "[KEY_OR_SESSION_ID]",
				Flags: []cli.Flag{jsonFlag()},
				Action: func(c *cli.Context) error {
					cl, ctx, done, err := dial(c)
					if err != nil {
						return err
					}
					defer done()
					filter := cl.names.DeadLetterWildcard()
					if c.NArg() > 0 {
						lane, err := resolveLane(ctx, cl, c.Args().First())
						if err != nil {
							return err
						}
						filter = cl.names.DeadLetterSubject(lane)
					}
					dls, err := readDeadLetters(ctx, cl, filter)
					if err != nil {
						return err
					}
					if c.Bool("json") {
						if dls == nil {
							dls = []DeadLetter{}
						}
						return printJSON(c.App.Writer, map[string]any{"dead_letters": dls})
					}
					return renderDeadLetters(c.App.Writer, dls)
				},
			},
			{
				Name: "show", Usage: "one dead letter: the message, why and where it was dead-lettered", ArgsUsage: "SEQ",
				Flags: []cli.Flag{jsonFlag()},
				Action: func(c *cli.Context) error {
					seq, err := strconv.ParseUint(c.Args().First(), 10, 64)
					if c.NArg() != 1 || err != nil {
						return errors.New("usage: fleetctl dlq show SEQ (from dlq ls)")
					}
					cl, ctx, done, err := dial(c)
					if err != nil {
						return err
					}
					defer done()
					d, _, err := getDeadLetter(ctx, cl, seq)
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c.App.Writer, d)
					}
					f := newFields()
					f.add("seq", d.Seq)
					f.add("at", d.At.UTC().Format(time.RFC3339))
					f.add("session_key", d.SessionKey)
					f.add("lane", d.Lane)
					f.add("session_id", d.SessionID)
					f.add("turn_id", d.TurnID)
					f.add("inbox_seq", d.InboxSeq)
					f.add("reason", d.Reason)
					f.add("kind", d.Message.Kind)
					f.add("text", fmt.Sprintf("%q", d.Message.Text))
					return f.print(c.App.Writer)
				},
			},
			{
				Name: "purge", Usage: "delete dead letters: one (--seq), a lane's (KEY_OR_SESSION_ID) or all (--all)", ArgsUsage: "[KEY_OR_SESSION_ID]",
				Flags: []cli.Flag{jsonFlag(), &cli.Uint64Flag{Name: "seq", Usage: "the dead letter `SEQ` to delete"}, &cli.BoolFlag{Name: "all", Usage: "every dead letter"}},
				Action: func(c *cli.Context) error {
					modes := 0
					for _, set := range []bool{c.NArg() == 1, c.IsSet("seq"), c.Bool("all")} {
						if set {
							modes++
						}
					}
					if modes != 1 || c.NArg() > 1 {
						return errors.New("usage: fleetctl dlq purge KEY_OR_SESSION_ID | --seq SEQ | --all")
					}
					cl, ctx, done, err := dial(c)
					if err != nil {
						return err
					}
					defer done()
					ev, err := cl.js.Stream(ctx, cl.names.EventStream())
					if err != nil {
						return err
					}
					var purged uint64
					switch {
					case c.IsSet("seq"):
						if _, _, err := getDeadLetter(ctx, cl, c.Uint64("seq")); err != nil {
							return err
						}
						if err := ev.DeleteMsg(ctx, c.Uint64("seq")); err != nil {
							return fmt.Errorf("delete dead letter %d: %w", c.Uint64("seq"), err)
						}
						purged = 1
					default:
						filter := cl.names.DeadLetterWildcard()
						if c.NArg() == 1 {
							lane, err := resolveLane(ctx, cl, c.Args().First())
							if err != nil {
								return err
							}
							filter = cl.names.DeadLetterSubject(lane)
						}
						dls, err := readDeadLetters(ctx, cl, filter)
						if err != nil {
							return err
						}
						if len(dls) > 0 {
							if err := ev.Purge(ctx, jetstream.WithPurgeSubject(filter)); err != nil {
								return err
							}
						}
						purged = uint64(len(dls))
					}
					if c.Bool("json") {
						return printJSON(c.App.Writer, map[string]any{"purged": purged})
					}
					fmt.Fprintf(c.App.Writer, "purged %d dead letter(s)\n", purged)
					return nil
				},
			},
			{
				Name: "replay", Usage: "publish a dead-lettered message into its lane's inbox again", ArgsUsage: "SEQ",
				Flags: []cli.Flag{jsonFlag()},
				Action: func(c *cli.Context) error {
					seq, err := strconv.ParseUint(c.Args().First(), 10, 64)
					if c.NArg() != 1 || err != nil {
						return errors.New("usage: fleetctl dlq replay SEQ (from dlq ls)")
					}
					cl, ctx, done, err := dial(c)
					if err != nil {
						return err
					}
					defer done()
					d, raw, err := getDeadLetter(ctx, cl, seq)
					if err != nil {
						return err
					}
					// The replay is a new message: its platform id already
					// belongs to the dead-lettered one, so it is dropped (the
					// replay:<seq> Msg-Id keeps a replay from running twice).
					d.Message.PlatformMsgID = ""
					body, err := json.Marshal(d.Message)
					if err != nil {
						return err
					}
					msg := nats.NewMsg(cl.names.InboxSubject(session.Partition(cl.names.Prefix(), d.Lane), d.Lane))
					msg.Data = body
					msg.Header.Set(broker.HdrSessionKey, d.SessionKey)
					msg.Header.Set(broker.HdrKind, nonEmpty(raw.Header.Get(broker.HdrKind), session.KindMessage))
					ack, err := cl.js.PublishMsg(ctx, msg, jetstream.WithMsgID(fmt.Sprintf("replay:%d", seq)))
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c.App.Writer, map[string]any{"replayed": seq, "inbox_seq": ack.Sequence, "duplicate": ack.Duplicate, "lane": d.Lane})
					}
					fmt.Fprintf(c.App.Writer, "replayed dead letter %d into %s at inbox seq %d\n", seq, d.Lane, ack.Sequence)
					return nil
				},
			},
		},
	}
}

func nonEmpty(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func decodeDeadLetter(cl *client, raw *jetstream.RawStreamMsg) (DeadLetter, bool) {
	prefix := cl.names.Prefix() + ".dlq."
	if len(raw.Subject) <= len(prefix) || raw.Subject[:len(prefix)] != prefix {
		return DeadLetter{}, false
	}
	d := DeadLetter{Seq: raw.Sequence, Lane: raw.Subject[len(prefix):], At: raw.Time,
		SessionID: raw.Header.Get(broker.HdrSessionID), TurnID: raw.Header.Get(broker.HdrTurnID), Reason: raw.Header.Get(broker.HdrReason),
		SessionKey: raw.Header.Get(broker.HdrSessionKey)}
	d.InboxSeq, _ = strconv.ParseUint(raw.Header.Get(broker.HdrInboxSeq), 10, 64)
	_ = json.Unmarshal(raw.Data, &d.Message)
	return d, true
}

func readDeadLetters(ctx context.Context, cl *client, filter string) ([]DeadLetter, error) {
	ev, err := cl.js.Stream(ctx, cl.names.EventStream())
	if err != nil {
		return nil, err
	}
	var out []DeadLetter
	seq := uint64(1)
	for {
		raw, err := ev.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		if d, ok := decodeDeadLetter(cl, raw); ok {
			out = append(out, d)
		}
		seq = raw.Sequence + 1
	}
}

func getDeadLetter(ctx context.Context, cl *client, seq uint64) (DeadLetter, *jetstream.RawStreamMsg, error) {
	ev, err := cl.js.Stream(ctx, cl.names.EventStream())
	if err != nil {
		return DeadLetter{}, nil, err
	}
	raw, err := ev.GetMsg(ctx, seq)
	if err != nil {
		return DeadLetter{}, nil, fmt.Errorf("dead letter %d: %w", seq, err)
	}
	d, ok := decodeDeadLetter(cl, raw)
	if !ok {
		return DeadLetter{}, nil, fmt.Errorf("message %d is not a dead letter", seq)
	}
	return d, raw, nil
}

func renderDeadLetters(w io.Writer, dls []DeadLetter) error {
	t := newTable("SEQ", "SESSION KEY", "INBOX SEQ", "AT", "REASON", "TEXT")
	for _, d := range dls {
		t.row(d.Seq, d.SessionKey, d.InboxSeq, d.At.UTC().Format(time.RFC3339), d.Reason, fmt.Sprintf("%q", d.Message.Text))
	}
	return t.print(w)
}
