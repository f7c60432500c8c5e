package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/statedb"
)

// apiCall sends one request to the state database's micro service
// (fleet.api) and decodes the answer into resp.
func apiCall(ctx context.Context, cl *client, endpoint string, req, resp any) error {
	return cl.fl.Call(ctx, endpoint, req, resp)
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func searchCommand() *cli.Command {
	return &cli.Command{
		Name:      "search",
		Usage:     "full-text search of every session's messages (from the state database)",
		ArgsUsage: "QUERY",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "source", Usage: "only sessions of this platform (repeatable)"},
			&cli.StringSliceFlag{Name: "role", Usage: "only messages of this role: user, assistant, tool, system (repeatable)"},
			&cli.IntFlag{Name: "limit", Value: 20, Usage: "most results"},
			jsonFlag(),
		},
		Action: func(c *cli.Context) error {
			query := strings.TrimSpace(strings.Join(c.Args().Slice(), " "))
			if query == "" {
				return errors.New("usage: fleetctl search QUERY [--source P] [--role R] [--limit N]")
			}
			if c.Int("limit") < 1 {
				return fmt.Errorf("--limit %d: want at least 1", c.Int("limit"))
			}
			for _, r := range c.StringSlice("role") {
				switch r {
				case "user", "assistant", "tool", "system":
				default:
					return fmt.Errorf("--role %q: want user, assistant, tool or system", r)
				}
			}
			cl, ctx, done, err := dial(c)
			if err != nil {
				return err
			}
			defer done()
			var resp statedb.SearchResponse
			if err := apiCall(ctx, cl, statedb.EndpointSearch, statedb.SearchRequest{Query: query, Sources: c.StringSlice("source"),
				Roles: c.StringSlice("role"), Limit: c.Int("limit")}, &resp); err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, resp)
			}
			if len(resp.Results) == 0 {
				fmt.Fprintln(c.App.Writer, "no matches")
				return nil
			}
			w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "SESSION\tSOURCE\tROLE\tTIME\tSNIPPET")
			for _, r := range resp.Results {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.SessionID, r.Source, r.Role, r.Timestamp.Format(time.RFC3339), oneLine(r.Snippet, 100))
			}
			return w.Flush()
		},
	}
}

func historyCommand() *cli.Command {
	return &cli.Command{
		Name:  "history",
		Usage: "sessions, newest first, ended ones included (from the state database)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "source", Usage: "only sessions of this platform"},
			&cli.IntFlag{Name: "limit", Value: 20, Usage: "most sessions"},
			jsonFlag(),
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return errors.New("usage: fleetctl history [--source P] [--limit N]")
			}
			if c.Int("limit") < 1 {
				return fmt.Errorf("--limit %d: want at least 1", c.Int("limit"))
			}
			cl, ctx, done, err := dial(c)
			if err != nil {
				return err
			}
			defer done()
			var resp statedb.SessionsResponse
			if err := apiCall(ctx, cl, statedb.EndpointSessions, statedb.SessionsRequest{Source: c.String("source"), Limit: c.Int("limit")}, &resp); err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, resp)
			}
			if len(resp.Sessions) == 0 {
				fmt.Fprintln(c.App.Writer, "no sessions")
				return nil
			}
			w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "SESSION\tSOURCE\tSTARTED\tENDED\tMESSAGES\tTITLE\tPREVIEW")
			for _, s := range resp.Sessions {
				ended := "-"
				if s.EndedAt != nil {
					ended = s.EndedAt.Format(time.RFC3339) + " (" + s.EndReason + ")"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", s.ID, s.Source, s.StartedAt.Format(time.RFC3339), ended, s.MessageCount,
					oneLine(s.Title, 30), oneLine(s.Preview, 40))
			}
			return w.Flush()
		},
	}
}

func exportCommand() *cli.Command {
	return &cli.Command{
		Name:      "export",
		Usage:     "export a session, or all of them, with every message (from the state database)",
		ArgsUsage: "SESSION_ID | --all",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "all", Usage: "export every session, oldest first"},
			&cli.StringFlag{Name: "source", Usage: "with --all: only sessions of this platform"},
			&cli.StringFlag{Name: "format", Value: "jsonl", Usage: "jsonl (one session per line) or json (one document)"},
			jsonFlag(),
		},
		Action: func(c *cli.Context) error {
			format := c.String("format")
			if c.Bool("json") {
				format = "json"
			}
			if format != "jsonl" && format != "json" {
				return fmt.Errorf("--format %q: want jsonl or json", format)
			}
			all := c.Bool("all")
			if all == (c.NArg() == 1) || c.NArg() > 1 {
				return errors.New("usage: fleetctl export SESSION_ID | --all [--source P] [--format jsonl|json]")
			}
			if !all && c.IsSet("source") {
				return errors.New("--source goes with --all")
			}
			cl, ctx, done, err := dial(c)
			if err != nil {
				return err
			}
			defer done()
			var sessions []statedb.ExportedSession
			emit := func(s statedb.ExportedSession) error {
				if format == "json" {
					sessions = append(sessions, s)
					return nil
				}
				b, err := json.Marshal(s)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(c.App.Writer, "%s\n", b)
				return err
			}
			if !all {
				var resp statedb.ExportResponse
				if err := apiCall(ctx, cl, statedb.EndpointExport, statedb.ExportRequest{ID: c.Args().First()}, &resp); err != nil {
					return err
				}
				for _, s := range resp.Sessions {
					if err := emit(s); err != nil {
						return err
					}
				}
			} else {
				// Page by page; each page is its own request, so the
				// overall timeout is per page here.
				for off := 0; ; {
					pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.Duration("timeout"))
					var resp statedb.ExportResponse
					err := apiCall(pctx, cl, statedb.EndpointExport, statedb.ExportRequest{All: true, Source: c.String("source"), Offset: off}, &resp)
					cancel()
					if err != nil {
						return err
					}
					for _, s := range resp.Sessions {
						if err := emit(s); err != nil {
							return err
						}
					}
					if resp.Next == 0 {
						break
					}
					off = resp.Next
				}
			}
			if format == "json" {
				if sessions == nil {
					sessions = []statedb.ExportedSession{}
				}
				return printJSON(c.App.Writer, map[string]any{"sessions": sessions})
			}
			return nil
		},
	}
}

func statsCommand() *cli.Command {
	return &cli.Command{
		Name:  "stats",
		Usage: "session, message and token statistics (from the state database)",
		Flags: []cli.Flag{jsonFlag()},
		Action: func(c *cli.Context) error {
			cl, ctx, done, err := dial(c)
			if err != nil {
				return err
			}
			defer done()
			var st statedb.Stats
			if err := apiCall(ctx, cl, statedb.EndpointStats, struct{}{}, &st); err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, st)
			}
			w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "sessions:\t%d (%d open)\n", st.Sessions, st.ActiveSessions)
			fmt.Fprintf(w, "messages:\t%d\n", st.Messages)
			fmt.Fprintf(w, "tokens:\t%d in, %d out\n", st.InputTokens, st.OutputTokens)
			fmt.Fprintf(w, "api calls:\t%d\n", st.APICalls)
			for _, s := range st.BySource {
				fmt.Fprintf(w, "source %s:\t%d sessions, %d messages\n", s.Source, s.Sessions, s.Messages)
			}
			for _, m := range st.ByModel {
				fmt.Fprintf(w, "model %s:\t%d sessions, %d in, %d out\n", m.Model, m.Sessions, m.InputTokens, m.OutputTokens)
			}
			if len(st.TopSessions) > 0 {
				fmt.Fprintln(w, "\ntop sessions by tokens:")
				for _, s := range st.TopSessions {
					fmt.Fprintf(w, "  %s\t%d\t%s\n", s.ID, s.TotalTokens, s.Title)
				}
			}
			return w.Flush()
		},
	}
}
