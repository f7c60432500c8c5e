package cliutil

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"
)

// RefuseUnknownCommands makes an unknown command an error that says so
// (`fleetctl: unknown command "workers" (commands: key, session, ...)`),
// where urfave/cli answers "No help topic for 'workers'" as if help had
// been asked for. It gives the application and every command that has
// subcommands but no action of its own an action that refuses a positional
// argument and shows the help without one, as before.
func RefuseUnknownCommands(app *cli.App) {
	if app.Action == nil {
		app.Action = func(c *cli.Context) error {
			if c.Args().Present() {
				return unknownCommand(app.Name, c.Args().First(), app.Commands)
			}
			return cli.ShowAppHelp(c)
		}
	}
	var walk func(path string, cmds []*cli.Command)
	walk = func(path string, cmds []*cli.Command) {
		for _, cmd := range cmds {
			if len(cmd.Subcommands) == 0 {
				continue
			}
			name := path + " " + cmd.Name
			if cmd.Action == nil {
				subs := cmd.Subcommands
				cmd.Action = func(c *cli.Context) error {
					if c.Args().Present() {
						return unknownCommand(name, c.Args().First(), subs)
					}
					return cli.ShowSubcommandHelp(c)
				}
			}
			walk(name, cmd.Subcommands)
		}
	}
	walk(app.Name, app.Commands)
}

func unknownCommand(path, name string, cmds []*cli.Command) error {
	var names []string
	for _, c := range cmds {
		if !c.Hidden && c.Name != "help" {
			names = append(names, c.Name)
		}
	}
	return fmt.Errorf("unknown command %q (commands: %s; see '%s --help')", name, strings.Join(names, ", "), path)
}
