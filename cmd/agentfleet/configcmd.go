package main

import (
	"encoding/json"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/cmd/internal/cliutil"
)

func configCommand() *cli.Command {
	return &cli.Command{
		Name:  "config",
		Usage: "inspect the configuration",
		Subcommands: []*cli.Command{{
			Name: "show",
			Usage: "print the effective configuration (default < file < environment < flags) as YAML; " +
				"secrets print as [redacted], and a comment says where each value that is not a default came from",
			Flags: append([]cli.Flag{
				&cli.BoolFlag{Name: "json", Usage: "print one JSON document (without the sources)"},
			}, natsFlags()...),
			Action: func(c *cli.Context) error {
				cfg, src, err := loadConfigSourced(c, nil)
				if err != nil {
					return err
				}
				if c.Bool("json") {
					enc := json.NewEncoder(c.App.Writer)
					enc.SetIndent("", "  ")
					return enc.Encode(cliutil.Redacted(cfg))
				}
				out, err := cliutil.ShowConfig(cfg, src)
				if err != nil {
					return err
				}
				_, err = fmt.Fprint(c.App.Writer, out)
				return err
			},
		}},
	}
}
