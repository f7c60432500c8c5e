package cliutil

import (
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

func testApp(out *bytes.Buffer, got *[]string) *cli.App {
	record := func(c *cli.Context) error {
		*got = append([]string{c.String("server"), c.String("mode"), strings.Join(c.StringSlice("tag"), "+"), boolStr(c.Bool("json"))}, c.Args().Slice()...)
		return nil
	}
	return &cli.App{
		Name:                 "prog",
		Writer:               out,
		EnableBashCompletion: true,
		Flags:                []cli.Flag{&cli.StringFlag{Name: "server", Aliases: []string{"s"}}},
		Commands: []*cli.Command{
			{Name: "session", Subcommands: []*cli.Command{{
				Name:   "info",
				Flags:  []cli.Flag{&cli.BoolFlag{Name: "json"}, &cli.StringFlag{Name: "mode"}, &cli.StringSliceFlag{Name: "tag"}},
				Action: record,
			}}},
			CompletionCommand(),
		},
	}
}

func boolStr(b bool) string {
	if b {
		return "json"
	}
	return ""
}

func TestReorderAcceptsFlagsAnywhere(t *testing.T) {
	want := []string{"nats://h:4222", "fast", "a+b", "json", "KEY", "-100123"}
	for _, args := range [][]string{
		{"prog", "-s", "nats://h:4222", "session", "info", "--json", "--mode", "fast", "--tag", "a", "--tag=b", "KEY", "-100123"},
		{"prog", "session", "info", "KEY", "--json", "-100123", "--mode=fast", "-s", "nats://h:4222", "--tag", "a", "--tag", "b"},
		{"prog", "session", "-s=nats://h:4222", "info", "KEY", "--mode", "fast", "-100123", "--tag", "a", "--json", "--tag", "b"},
		{"prog", "session", "info", "--tag", "a", "--tag", "b", "--mode", "fast", "-s", "nats://h:4222", "--json", "--", "KEY", "-100123"},
	} {
		var out bytes.Buffer
		var got []string
		app := testApp(&out, &got)
		if err := app.Run(Reorder(app, args)); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%v\n  reordered %v\n  got %q, want %q", args, Reorder(app, args), got, want)
		}
	}
}

func TestReorderLeavesUnknownFlagsToTheCommand(t *testing.T) {
	var out bytes.Buffer
	var got []string
	app := testApp(&out, &got)
	err := app.Run(Reorder(app, []string{"prog", "session", "info", "KEY", "--bogus"}))
	if err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("unknown flag: %v", err)
	}
}

func TestCompletionScripts(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish"} {
		var out bytes.Buffer
		var got []string
		app := testApp(&out, &got)
		if err := app.Run([]string{"prog", "completion", shell}); err != nil {
			t.Fatalf("%s: %v", shell, err)
		}
		if !strings.Contains(out.String(), "prog") {
			t.Fatalf("%s script does not name the program:\n%s", shell, out.String())
		}
		// The shell itself checks the script's syntax, when installed.
		if path, err := exec.LookPath(shell); err == nil && shell != "fish" {
			cmd := exec.Command(path, "-n")
			cmd.Stdin = strings.NewReader(out.String())
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("%s -n: %v\n%s", shell, err, b)
			}
		}
		if shell == "fish" && !strings.Contains(out.String(), "complete -c prog") {
			t.Errorf("fish script:\n%s", out.String())
		}
	}
	var out bytes.Buffer
	var got []string
	app := testApp(&out, &got)
	if err := app.Run([]string{"prog", "completion", "tcsh"}); err == nil {
		t.Error("completion tcsh accepted")
	}
}

// TestUnknownCommandIsAnError: a mistyped command or subcommand is an error
// naming it and the commands there are, not urfave/cli's "No help topic",
// and a command group without a subcommand still shows its help.
func TestUnknownCommandIsAnError(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"prog", "sesion"}, []string{`unknown command "sesion"`, "session", "'prog --help'"}},
		{[]string{"prog", "session", "inf", "KEY"}, []string{`unknown command "inf"`, "commands: info", "'prog session --help'"}},
	} {
		var out bytes.Buffer
		var got []string
		app := testApp(&out, &got)
		RefuseUnknownCommands(app)
		err := app.Run(Reorder(app, tc.args))
		if err == nil {
			t.Fatalf("%v: no error; output %q", tc.args, out.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q does not mention %q", tc.args, err, w)
			}
		}
		if got != nil {
			t.Errorf("%v: ran a command: %q", tc.args, got)
		}
	}
	for _, args := range [][]string{{"prog"}, {"prog", "session"}} {
		var out bytes.Buffer
		var got []string
		app := testApp(&out, &got)
		RefuseUnknownCommands(app)
		if err := app.Run(Reorder(app, args)); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if !strings.Contains(out.String(), "USAGE") {
			t.Errorf("%v: no help shown: %q", args, out.String())
		}
	}
}
