// Command fleetctl inspects and administers an agentfleet deployment, the
// way natsctl-style tools do: it reads the fleet's KV buckets and streams
// directly. Every command takes --json and then prints one JSON document.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/admin"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/cmd/internal/cliutil"
	"github.com/agentfleet/agentfleet/config"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
)

var version = "0.1.0-dev"

func main() {
	if err := run(os.Stdout, os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "fleetctl:", err)
		os.Exit(1)
	}
}

// run runs fleetctl with args (args[0] is the program), every flag in any
// position.
func run(out io.Writer, args []string) error {
	app := newApp(out)
	return app.Run(cliutil.Reorder(app, args))
}

// jsonFlag is a fresh --json flag (urfave/cli writes into a flag when it
// parses, so apps running at once must not share one).
func jsonFlag() cli.Flag { return &cli.BoolFlag{Name: "json", Usage: "print one JSON document"} }

func newApp(out io.Writer) *cli.App {
	app := &cli.App{
		Name:                 "fleetctl",
		Usage:                "inspect and administer an agentfleet deployment",
		Version:              version,
		Writer:               out,
		EnableBashCompletion: true,
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "config", Aliases: []string{"c"}, Usage: "YAML configuration `FILE`", EnvVars: []string{"AGENTFLEET_CONFIG"}},
			&cli.DurationFlag{Name: "timeout", Value: 10 * time.Second, Usage: "overall timeout"},
		}, connectionFlags()...),
		Commands: []*cli.Command{keyCommand(), sessionCommand(), laneCommand(), transcriptCommand(), workerCommand(), deadLetterCommand(),
			eventsCommand(), streamCommand(), inboxCommand(), topCommand(), configCommand(), deliveryCommand(), searchCommand(), historyCommand(), exportCommand(), statsCommand(),
			cliutil.CompletionCommand()},
	}
	cliutil.RefuseUnknownCommands(app)
	return app
}

func loadConfig(c *cli.Context) (config.Config, error) {
	s, err := loadSettings(c)
	return s.cfg, err
}

// client is a connection with the fleet's handles.
type client struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	names broker.Names
	res   *broker.Resources
	store *kv.Store
	tx    *transcript.Log
	cfg   config.Config
	// fl is the same connection for what fleetctl shares with the console.
	fl *admin.Fleet
}

func dial(c *cli.Context) (*client, context.Context, context.CancelFunc, error) {
	return dialFor(c, false)
}

// dialLane is the start of every command that takes one session key, lane
// or session id: it checks the argument count (usage is the error for a
// wrong one), connects, and resolves the argument to a lane.
func dialLane(c *cli.Context, usage string) (*client, context.Context, context.CancelFunc, string, error) {
	if c.NArg() != 1 {
		return nil, nil, nil, "", errors.New(usage)
	}
	cl, ctx, done, err := dial(c)
	if err != nil {
		return nil, nil, nil, "", err
	}
	lane, err := resolveLane(ctx, cl, c.Args().First())
	if err != nil {
		done()
		return nil, nil, nil, "", err
	}
	return cl, ctx, done, lane, nil
}

// getEntry reads the session entry of lane; arg is how the user named it
// (a key, a lane or a session id), and a missing entry is told in those
// words rather than as the store's "session <lane>: not found".
func getEntry(ctx context.Context, cl *client, lane, arg string) (*session.SessionEntry, uint64, error) {
	e, rev, err := cl.store.Get(ctx, lane)
	if errors.Is(err, kv.ErrNotFound) {
		return nil, 0, fmt.Errorf("no session %s in this fleet (fleetctl session ls lists them)", arg)
	}
	return e, rev, err
}

// dialFor connects within --timeout; a command that follows the fleet
// (follow) then runs until it is done or interrupted, without the timeout.
func dialFor(c *cli.Context, follow bool) (*client, context.Context, context.CancelFunc, error) {
	s, err := loadSettings(c)
	if err != nil {
		return nil, nil, nil, err
	}
	cfg := s.cfg
	names, err := broker.NewNames(cfg.NATS.Prefix)
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	// NATS not up yet is waited for, like every role does, but never past
	// the command's own --timeout.
	wait := min(cfg.NATS.ConnectWait.Duration(), c.Duration("timeout"))
	nc, err := broker.ConnectWait(ctx, broker.ConnectConfig{URL: cfg.NATS.URL, Name: "fleetctl", User: cfg.NATS.User, Password: cfg.NATS.Password,
		Token: cfg.NATS.Token, Creds: cfg.NATS.Creds, NKey: cfg.NATS.NKey, TLSCA: cfg.NATS.TLS.CA, TLSCert: cfg.NATS.TLS.Cert, TLSKey: cfg.NATS.TLS.Key,
		TLSInsecure: cfg.NATS.TLS.InsecureSkipVerify, Timeout: cfg.NATS.ConnectTimeout.Duration(),
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}, wait)
	if err != nil {
		cancel()
		if errors.Is(err, broker.ErrNATSUnreachable) && c.Duration("timeout") <= cfg.NATS.ConnectWait.Duration() {
			err = fmt.Errorf("%w (fleetctl waits for NATS at most --timeout, %s: raise it to wait longer)", err, c.Duration("timeout"))
		}
		return nil, nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		cancel()
		nc.Close()
		return nil, nil, nil, err
	}
	res, err := admin.OpenResources(ctx, js, names)
	if err != nil {
		cancel()
		nc.Close()
		return nil, nil, nil, err
	}
	tx, err := transcript.New(js, names, nil)
	if err != nil {
		cancel()
		nc.Close()
		return nil, nil, nil, err
	}
	cl := &client{nc: nc, js: js, names: names, res: res, store: kv.NewStore(res, nil), tx: tx, cfg: cfg}
	cl.fl = &admin.Fleet{NC: nc, JS: js, Names: names, Res: res, Store: cl.store, TX: tx}
	if follow {
		cancel()
		ctx, cancel = context.WithCancel(c.Context)
	}
	return cl, ctx, func() { cancel(); nc.Close() }, nil
}

// inboxBacklog counts what waits in a lane's inbox after seq: the /queue
// items and all messages (queue items, plain messages, commands).
func inboxBacklog(ctx context.Context, cl *client, lane string, after uint64) (queued, pending int, err error) {
	return cl.fl.InboxBacklog(ctx, lane, after)
}

func keyCommand() *cli.Command {
	return &cli.Command{
		Name:  "key",
		Usage: "print the session key the ingress would derive for a source",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "platform", Required: true},
			&cli.StringFlag{Name: "chat-type", Value: "dm"},
			&cli.StringFlag{Name: "chat-id"},
			&cli.StringFlag{Name: "user-id"},
			&cli.StringFlag{Name: "user-id-alt"},
			&cli.StringFlag{Name: "thread-id"},
			jsonFlag(),
		},
		Action: func(c *cli.Context) error {
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			p, err := session.ParsePlatform(c.String("platform"))
			if err != nil {
				return err
			}
			src := session.SessionSource{Platform: p, ChatType: c.String("chat-type"), ChatID: c.String("chat-id"),
				UserID: c.String("user-id"), UserIDAlt: c.String("user-id-alt"), ThreadID: c.String("thread-id")}
			src.Normalize()
			if err := src.Validate(); err != nil {
				return err
			}
			opts := cfg.KeyOptions()
			if cfg.WhatsApp.MappingDir != "" {
				opts.WhatsApp = session.NewWhatsAppResolver(cfg.WhatsApp.MappingDir)
			}
			key := session.BuildSessionKey(src, opts)
			lane := session.LaneToken(key)
			names, err := broker.NewNames(cfg.NATS.Prefix)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, map[string]any{"session_key": key, "lane": lane, "partition": session.Partition(names.Prefix(), lane),
					"shared_multi_user": session.IsSharedMultiUserSession(src, opts)})
			}
			fmt.Fprintln(c.App.Writer, key)
			return nil
		},
	}
}

// resolveLane accepts a session key, a lane token or a session id.
func resolveLane(ctx context.Context, cl *client, arg string) (string, error) {
	return cl.fl.ResolveLane(ctx, arg)
}

func sessionCommand() *cli.Command {
	return &cli.Command{
		Name:  "session",
		Usage: "session entries",
		Subcommands: append([]*cli.Command{
			{
				Name:      "info",
				Usage:     "show the SessionEntry of a session key or session id",
				ArgsUsage: "KEY_OR_SESSION_ID",
				Flags:     []cli.Flag{jsonFlag()},
				Action: func(c *cli.Context) error {
					cl, ctx, done, lane, err := dialLane(c, "usage: fleetctl session info KEY_OR_SESSION_ID")
					if err != nil {
						return err
					}
					defer done()
					e, rev, err := getEntry(ctx, cl, lane, c.Args().First())
					if err != nil {
						return err
					}
					holder, _, herr := kv.NewLeases(cl.js, cl.res, cl.names, time.Second).Holder(ctx, lane)
					if herr != nil {
						holder = ""
					}
					// The entry's queue_depth is as of its last turn: count
					// what waits in the inbox now.
					after := uint64(0)
					if e.InboxID == cl.res.Inboxes.ForLane(lane).ID {
						after = e.CommittedSeq
					}
					queued, pending, berr := inboxBacklog(ctx, cl, lane, after)
					if berr != nil {
						return fmt.Errorf("read the lane's inbox: %w", berr)
					}
					busy := e.BusyMode
					if busy == "" {
						cfg, err := loadConfig(c)
						if err != nil {
							return err
						}
						busy = cfg.Worker.BusyMode + " (default)"
					}
					if c.Bool("json") {
						return printJSON(c.App.Writer, map[string]any{"lane": lane, "revision": rev, "lease_holder": holder,
							"queue_depth": queued, "pending": pending, "entry": e})
					}
					f := newFields()
					row := f.add
					row("session_key", e.SessionKey)
					row("lane", lane)
					row("session_id", e.SessionID)
					row("created_at", e.CreatedAt.Format(time.RFC3339))
					row("updated_at", e.UpdatedAt.Format(time.RFC3339))
					row("platform", e.Platform)
					row("chat_type", e.ChatType)
					row("tokens", fmt.Sprintf("%d (in %d, out %d)", e.TotalTokens, e.InputTokens, e.OutputTokens))
					row("owner", e.Owner)
					row("lease_holder", holder)
					row("lease_epoch", e.LeaseEpoch)
					row("committed_seq", e.CommittedSeq)
					row("turn_in_flight", e.Turn != nil)
					row("busy_mode", busy)
					row("queue_depth", queued)
					row("pending_messages", pending)
					row("suspended", e.Suspended)
					row("resume_pending", fmt.Sprintf("%v %s", e.ResumePending, e.ResumeReason))
					row("interrupted_turns", e.InterruptedTurns)
					row("parent_session_id", e.ParentSessionID)
					row("revision", rev)
					return f.print(c.App.Writer)
				},
			},
			sessionLsCommand(), sessionWatchCommand(), sessionHistoryCommand(),
		}, adminCommands()...),
	}
}

func transcriptCommand() *cli.Command {
	return &cli.Command{
		Name:      "transcript",
		Usage:     "print the transcript entries of a session in order",
		ArgsUsage: "KEY_OR_LANE_OR_SESSION_ID",
		Flags:     []cli.Flag{jsonFlag(), &cli.BoolFlag{Name: "all", Usage: "include control entries (fences, turn ends, rewinds) and rewound entries"}},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return errors.New("usage: fleetctl transcript KEY_OR_LANE_OR_SESSION_ID")
			}
			arg := c.Args().First()
			if !session.ValidSessionID(arg) && !strings.Contains(arg, ":") {
				if _, err := session.ParseLaneToken(arg); err != nil {
					return fmt.Errorf("%q is not a session key, lane or SESSION_ID (YYYYMMDD_HHMMSS_<8hex>)", arg)
				}
			}
			cl, ctx, done, err := dial(c)
			if err != nil {
				return err
			}
			defer done()
			sid := arg
			if !session.ValidSessionID(arg) {
				// A key or lane: its current session.
				lane := arg
				if strings.Contains(arg, ":") {
					lane = session.LaneToken(arg)
				}
				e, _, err := getEntry(ctx, cl, lane, arg)
				if err != nil {
					return err
				}
				sid = e.SessionID
			}
			entries, _, err := cl.tx.Load(ctx, sid)
			if err != nil {
				return err
			}
			if len(entries) == 0 {
				// An empty transcript subject: the session id names no
				// session this fleet ever wrote to.
				if _, lerr := cl.store.LookupIndex(ctx, sid); lerr != nil {
					return fmt.Errorf("no session %s in this fleet", sid)
				}
			}
			if !c.Bool("all") {
				var kept []transcript.Entry
				for _, e := range entries {
					if !e.Deleted && (e.Kind == transcript.KindMessage || e.Kind == transcript.KindNotice) {
						kept = append(kept, e)
					}
				}
				entries = kept
			}
			if c.Bool("json") {
				type row struct {
					Seq uint64 `json:"seq"`
					transcript.Entry
					Deleted bool `json:"deleted,omitempty"`
				}
				rows := make([]row, 0, len(entries))
				for _, e := range entries {
					rows = append(rows, row{Seq: e.Seq, Entry: e, Deleted: e.Deleted})
				}
				return printJSON(c.App.Writer, map[string]any{"session_id": sid, "entries": rows})
			}
			for _, e := range entries {
				who := e.Role
				if who == "" {
					who = e.Kind
				}
				text := e.Content
				if len(e.ToolCalls) > 0 {
					text = fmt.Sprintf("tool call %s(%s)", e.ToolCalls[0].Name, e.ToolCalls[0].Arguments)
				}
				if e.Kind == transcript.KindTurnEnd {
					text = "turn " + e.TurnID + " " + e.Status
				}
				del := ""
				if e.Deleted {
					del = " (rewound)"
				}
				fmt.Fprintf(c.App.Writer, "%6d  %s  %-9s %s%s\n", e.Seq, e.Timestamp.Format("15:04:05"), safe(who), safe(text), del)
			}
			return nil
		},
	}
}
