package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/session"
)

// entryFlags are the state flags of an entry, for tables.
func entryFlags(e *session.SessionEntry) string {
	var flags []string
	if e.Turn != nil {
		flags = append(flags, "busy")
	}
	if e.Suspended {
		flags = append(flags, "suspended")
	}
	if e.ResumePending {
		flags = append(flags, "resume_pending")
	}
	return strings.Join(flags, ",")
}

func renderSessions(w io.Writer, entries []*session.SessionEntry) error {
	t := newTable("SESSION KEY", "SESSION ID", "PLATFORM", "UPDATED", "OWNER", "COMMITTED", "TOKENS", "STATE")
	for _, e := range entries {
		t.row(e.SessionKey, e.SessionID, e.Platform, e.UpdatedAt.UTC().Format(time.RFC3339), e.Owner, e.CommittedSeq, e.TotalTokens, entryFlags(e))
	}
	return t.print(w)
}

func sessionLsCommand() *cli.Command {
	return &cli.Command{
		Name:  "ls",
		Usage: "list session entries, most recently updated first",
		Flags: []cli.Flag{jsonFlag(),
			&cli.StringFlag{Name: "platform", Usage: "only sessions of `PLATFORM` (telegram, slack, whatsapp, discord, http)"},
			&cli.DurationFlag{Name: "active", Usage: "only entries updated within `DUR` (e.g. 30m)"},
			&cli.StringFlag{Name: "state", Usage: "only entries in `STATE`: suspended, resume_pending or busy (a turn in flight)"},
		},
		Action: func(c *cli.Context) error {
			state := c.String("state")
			if state != "" && state != "suspended" && state != "resume_pending" && state != "busy" {
				return fmt.Errorf("--state %q: want suspended, resume_pending or busy", state)
			}
			platform := c.String("platform")
			if platform != "" {
				if _, err := session.ParsePlatform(platform); err != nil {
					return err
				}
			}
			if c.Duration("active") < 0 {
				return fmt.Errorf("--active %s: want a positive duration", c.Duration("active"))
			}
			cl, ctx, done, err := dial(c)
			if err != nil {
				return err
			}
			defer done()
			all, err := cl.store.ListSessions(ctx, 0)
			if err != nil {
				return err
			}
			entries := []*session.SessionEntry{}
			cutoff := time.Now().Add(-c.Duration("active"))
			for _, e := range all {
				switch {
				case platform != "" && string(e.Platform) != platform:
				case c.Duration("active") > 0 && e.UpdatedAt.Before(cutoff):
				case state == "suspended" && !e.Suspended:
				case state == "resume_pending" && !e.ResumePending:
				case state == "busy" && e.Turn == nil:
				default:
					entries = append(entries, e)
				}
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, map[string]any{"sessions": entries})
			}
			return renderSessions(c.App.Writer, entries)
		},
	}
}

// watchFilter turns a session key, lane or lane pattern into a KV key
// pattern: "agent:main:telegram:dm:42" and "agent.main.telegram.>" both work.
func watchFilter(arg string) string {
	if arg == "" {
		return ">"
	}
	if strings.Contains(arg, ":") {
		return session.LaneToken(arg)
	}
	return arg
}

// entryChange is one change of a session entry, as `session watch` and
// `session history` print it.
type entryChange struct {
	Lane      string                `json:"lane"`
	Revision  uint64                `json:"revision"`
	Operation string                `json:"operation"`
	At        time.Time             `json:"at"`
	Entry     *session.SessionEntry `json:"entry,omitempty"`
}

func toChange(u jetstream.KeyValueEntry) entryChange {
	ch := entryChange{Lane: u.Key(), Revision: u.Revision(), Operation: "put", At: u.Created()}
	switch u.Operation() {
	case jetstream.KeyValueDelete:
		ch.Operation = "delete"
	case jetstream.KeyValuePurge:
		ch.Operation = "purge"
	}
	if u.Operation() == jetstream.KeyValuePut {
		var e session.SessionEntry
		if json.Unmarshal(u.Value(), &e) == nil {
			ch.Entry = &e
		}
	}
	return ch
}

func changeRow(t *tbl, ch entryChange) {
	if ch.Entry == nil {
		t.row(ch.At.UTC().Format(time.RFC3339), ch.Operation, ch.Lane, ch.Revision, "", "", "", "")
		return
	}
	e := ch.Entry
	t.row(ch.At.UTC().Format(time.RFC3339), ch.Operation, ch.Lane, ch.Revision, e.SessionID, e.Owner, e.CommittedSeq, entryFlags(e))
}

var changeHeader = []any{"AT", "OP", "LANE", "REVISION", "SESSION ID", "OWNER", "COMMITTED", "STATE"}

func sessionWatchCommand() *cli.Command {
	return &cli.Command{
		Name: "watch",
		Usage: "follow session entry changes (a KV watch) until interrupted; FILTER is a session key, a lane or a lane pattern " +
			"(agent.main.telegram.>). With --json, one JSON document per change, one per line",
		ArgsUsage: "[FILTER]",
		Flags: []cli.Flag{jsonFlag(),
			&cli.BoolFlag{Name: "current", Usage: "print the current entries first"},
			&cli.IntFlag{Name: "count", Usage: "stop after `N` changes"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return errors.New("usage: fleetctl session watch [FILTER]")
			}
			cl, ctx, done, err := dialFor(c, true)
			if err != nil {
				return err
			}
			defer done()
			var opts []jetstream.WatchOpt
			if !c.Bool("current") {
				opts = append(opts, jetstream.UpdatesOnly())
			}
			kw, err := cl.res.Sessions.Watch(ctx, watchFilter(c.Args().First()), opts...)
			if err != nil {
				return err
			}
			defer func() { _ = kw.Stop() }()
			n := 0
			header := !c.Bool("json")
			for {
				select {
				case <-ctx.Done():
					return nil
				case u, ok := <-kw.Updates():
					if !ok {
						return nil
					}
					if u == nil {
						continue // the end of the current values
					}
					ch := toChange(u)
					if c.Bool("json") {
						b, _ := json.Marshal(ch)
						fmt.Fprintln(c.App.Writer, string(b))
					} else {
						if header {
							// A live feed cannot be aligned in advance: fields
							// are separated by two spaces.
							fmt.Fprintln(c.App.Writer, "AT  OP  LANE  REVISION  SESSION ID  OWNER  COMMITTED  STATE")
							header = false
						}
						e := ch.Entry
						if e == nil {
							e = &session.SessionEntry{}
						}
						fmt.Fprintf(c.App.Writer, "%s  %s  %s  %d  %s  %s  %d  %s\n", ch.At.UTC().Format(time.RFC3339), ch.Operation, ch.Lane, ch.Revision,
							e.SessionID, e.Owner, e.CommittedSeq, entryFlags(e))
					}
					n++
					if c.Int("count") > 0 && n >= c.Int("count") {
						return nil
					}
				}
			}
		},
	}
}

func sessionHistoryCommand() *cli.Command {
	return &cli.Command{
		Name:      "history",
		Usage:     "the stored revisions of a session entry, oldest first (as many as the sessions bucket keeps)",
		ArgsUsage: "KEY_OR_LANE_OR_SESSION_ID",
		Flags:     []cli.Flag{jsonFlag()},
		Action: func(c *cli.Context) error {
			cl, ctx, done, lane, err := dialLane(c, "usage: fleetctl session history KEY_OR_LANE_OR_SESSION_ID")
			if err != nil {
				return err
			}
			defer done()
			hist, err := cl.res.Sessions.History(ctx, lane)
			if err != nil {
				if errors.Is(err, jetstream.ErrKeyNotFound) {
					return fmt.Errorf("no session entry for %s", lane)
				}
				return err
			}
			changes := make([]entryChange, 0, len(hist))
			for _, h := range hist {
				changes = append(changes, toChange(h))
			}
			st, err := cl.res.Sessions.Status(ctx)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, map[string]any{"lane": lane, "bucket_history": st.History(), "revisions": changes})
			}
			t := newTable(changeHeader...)
			for _, ch := range changes {
				changeRow(t, ch)
			}
			if err := t.print(c.App.Writer); err != nil {
				return err
			}
			_, err = fmt.Fprintf(c.App.Writer, "(the sessions bucket keeps %d revision(s) per entry)\n", st.History())
			return err
		},
	}
}
