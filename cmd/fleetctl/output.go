package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/jedib0t/go-pretty/v6/text"
	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/cmd/internal/cliutil"
)

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// plainStyle is an aligned table without borders, like kubectl and the
// nats CLI's compact listings: columns separated by two spaces.
var plainStyle = func() table.Style {
	s := table.StyleDefault
	s.Options = table.OptionsNoBordersAndSeparators
	s.Box.PaddingLeft = ""
	s.Box.PaddingRight = "  "
	s.Format.Header = text.FormatDefault
	s.Format.HeaderAlign = text.AlignLeft
	return s
}()

// tbl collects rows and prints them aligned.
type tbl struct{ t table.Writer }

func newTable(header ...any) *tbl {
	t := table.NewWriter()
	t.SetStyle(plainStyle)
	if len(header) > 0 {
		t.AppendHeader(table.Row(header))
	}
	return &tbl{t: t}
}

// row appends a row; every cell is shown through safe (users' text never
// reaches the terminal raw).
func (t *tbl) row(cells ...any) {
	r := make(table.Row, len(cells))
	for i, c := range cells {
		if str, ok := c.(string); ok {
			c = safe(str)
		}
		r[i] = c
	}
	t.t.AppendRow(r)
}

// print writes the table without trailing spaces (stable output for
// scripts and golden tests).
func (t *tbl) print(w io.Writer) error {
	lines := strings.Split(t.t.Render(), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ")
	}
	_, err := fmt.Fprintln(w, strings.Join(lines, "\n"))
	return err
}

// fields prints name: value pairs aligned, for one object.
type fields struct{ t *tbl }

func newFields() *fields                  { return &fields{t: newTable()} }
func (f *fields) add(name string, v any)  { f.t.row(name+":", v) }
func (f *fields) print(w io.Writer) error { return f.t.print(w) }

func configCommand() *cli.Command {
	return &cli.Command{
		Name:  "config",
		Usage: "the configuration fleetctl runs with",
		Subcommands: []*cli.Command{{
			Name: "show",
			Usage: "print the effective configuration (default < file < environment < nats context < flags) as YAML; " +
				"secrets print as [redacted], and a comment says where each value that is not a default came from",
			Flags: []cli.Flag{jsonFlag()},
			Action: func(c *cli.Context) error {
				s, err := loadSettings(c)
				if err != nil {
					return err
				}
				if c.Bool("json") {
					sources := map[string]string(s.sources)
					if sources == nil {
						sources = map[string]string{}
					}
					return printJSON(c.App.Writer, map[string]any{"config": cliutil.Redacted(s.cfg), "sources": sources, "nats_context": s.context})
				}
				out, err := cliutil.ShowConfig(s.cfg, s.sources)
				if err != nil {
					return err
				}
				if s.context != "" {
					out += "# nats context: " + s.context + "\n"
				}
				_, err = fmt.Fprint(c.App.Writer, out)
				return err
			},
		}},
	}
}
