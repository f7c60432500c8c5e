// Package cliutil holds what fleetctl and agentfleet share on the command
// line: flags in any position, shell completion, and printing the effective
// configuration.
package cliutil

import (
	"strings"

	"github.com/urfave/cli/v2"
)

// Reorder rewrites args (args[0] is the program) so that urfave/cli, which
// reads a command's flags only before its first positional argument and the
// application's flags only before the subcommand, accepts every flag in any
// position: `fleetctl session info KEY --json -s nats://h:4222` becomes
// `fleetctl -s nats://h:4222 session info --json KEY`.
//
// Each flag moves to the level (application, command, subcommand) that
// defines it, the deepest one first; a flag no level defines stays with the
// deepest command so that urfave/cli reports it. Everything after "--" is
// positional and kept in order.
func Reorder(app *cli.App, args []string) []string {
	if len(args) == 0 || args[len(args)-1] == "--generate-bash-completion" {
		// Completion asks with the words typed so far, as they are.
		return args
	}
	type level struct {
		name  string // "" for the application
		flags []cli.Flag
		subs  []*cli.Command
		out   []string
	}
	levels := []*level{{flags: app.Flags, subs: app.Commands}}
	var positional []string
	dashdash := false
	rest := args[1:]
	for i := 0; i < len(rest); i++ {
		tok := rest[i]
		if dashdash {
			positional = append(positional, tok)
			continue
		}
		if tok == "--" {
			dashdash = true
			continue
		}
		if len(tok) > 1 && tok[0] == '-' && !isNumber(tok) {
			name := strings.TrimLeft(tok, "-")
			hasValue := false
			if j := strings.IndexByte(name, '='); j >= 0 {
				name, hasValue = name[:j], true
			}
			target := levels[len(levels)-1]
			takes := false
			for k := len(levels) - 1; k >= 0; k-- {
				if f := findFlag(levels[k].flags, name); f != nil {
					target = levels[k]
					takes = takesValue(f)
					break
				}
			}
			target.out = append(target.out, tok)
			if takes && !hasValue && i+1 < len(rest) {
				i++
				target.out = append(target.out, rest[i])
			}
			continue
		}
		cur := levels[len(levels)-1]
		if len(positional) == 0 {
			if sub := findCommand(cur.subs, tok); sub != nil {
				levels = append(levels, &level{name: tok, flags: sub.Flags, subs: sub.Subcommands})
				continue
			}
		}
		positional = append(positional, tok)
	}
	out := []string{args[0]}
	for _, l := range levels {
		if l.name != "" {
			out = append(out, l.name)
		}
		out = append(out, l.out...)
	}
	if dashdash || startsWithDash(positional) {
		out = append(out, "--")
	}
	return append(out, positional...)
}

// isNumber reports whether a token such as "-100123" (a Telegram group id)
// is a negative number rather than a flag.
func isNumber(tok string) bool {
	for _, r := range tok[1:] {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

func startsWithDash(ps []string) bool {
	for _, p := range ps {
		if strings.HasPrefix(p, "-") {
			return true
		}
	}
	return false
}

func findFlag(flags []cli.Flag, name string) cli.Flag {
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				return f
			}
		}
	}
	return nil
}

func takesValue(f cli.Flag) bool {
	if tv, ok := f.(interface{ TakesValue() bool }); ok {
		return tv.TakesValue()
	}
	return false
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}
