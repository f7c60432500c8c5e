package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/admin"
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
	return cl.fl.PublishCommand(ctx, lane, command, args)
}

// DeadLetter is one dead-lettered inbox message.
type DeadLetter = admin.DeadLetter

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
					var purged uint64
					switch {
					case c.IsSet("seq"):
						if err := cl.fl.PurgeDeadLetter(ctx, c.Uint64("seq")); err != nil {
							return err
						}
						purged = 1
					default:
						lane := ""
						if c.NArg() == 1 {
							if lane, err = resolveLane(ctx, cl, c.Args().First()); err != nil {
								return err
							}
						}
						if purged, err = cl.fl.PurgeDeadLetters(ctx, lane); err != nil {
							return err
						}
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
					r, err := cl.fl.ReplayDeadLetter(ctx, seq)
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c.App.Writer, map[string]any{"replayed": seq, "inbox_seq": r.InboxSeq, "duplicate": r.Duplicate, "lane": r.Lane})
					}
					fmt.Fprintf(c.App.Writer, "replayed dead letter %d into %s at inbox seq %d\n", seq, r.Lane, r.InboxSeq)
					return nil
				},
			},
		},
	}
}

func readDeadLetters(ctx context.Context, cl *client, filter string) ([]DeadLetter, error) {
	return cl.fl.DeadLetters(ctx, filter)
}

func getDeadLetter(ctx context.Context, cl *client, seq uint64) (DeadLetter, *jetstream.RawStreamMsg, error) {
	return cl.fl.DeadLetter(ctx, seq)
}

func renderDeadLetters(w io.Writer, dls []DeadLetter) error {
	t := newTable("SEQ", "SESSION KEY", "INBOX SEQ", "AT", "REASON", "TEXT")
	for _, d := range dls {
		t.row(d.Seq, d.SessionKey, d.InboxSeq, d.At.UTC().Format(time.RFC3339), d.Reason, fmt.Sprintf("%q", d.Message.Text))
	}
	return t.print(w)
}
