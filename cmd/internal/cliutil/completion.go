package cliutil

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"
)

// CompletionCommand prints a shell completion script for bash, zsh or fish.
// The bash and zsh scripts ask the program itself (urfave/cli's
// --generate-bash-completion), so they follow its commands as they change;
// fish gets urfave/cli's generated script. The application must set
// EnableBashCompletion.
func CompletionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print a shell completion script: source <(PROG completion bash), PROG completion fish | source",
		ArgsUsage: "bash|zsh|fish",
		Action: func(c *cli.Context) error {
			prog := c.App.Name
			switch c.Args().First() {
			case "bash":
				_, err := fmt.Fprint(c.App.Writer, strings.ReplaceAll(bashScript, "PROG", prog))
				return err
			case "zsh":
				_, err := fmt.Fprint(c.App.Writer, strings.ReplaceAll(zshScript, "PROG", prog))
				return err
			case "fish":
				s, err := c.App.ToFishCompletion()
				if err != nil {
					return err
				}
				_, err = fmt.Fprint(c.App.Writer, s)
				return err
			}
			return fmt.Errorf("usage: %s completion bash|zsh|fish", prog)
		},
	}
}

const bashScript = `# bash completion for PROG: source <(PROG completion bash)
_PROG_complete() {
  local cur opts
  COMPREPLY=()
  cur="${COMP_WORDS[COMP_CWORD]}"
  if [[ "$cur" == -* ]]; then
    opts=$("${COMP_WORDS[@]:0:$COMP_CWORD}" "$cur" --generate-bash-completion 2>/dev/null)
  else
    opts=$("${COMP_WORDS[@]:0:$COMP_CWORD}" --generate-bash-completion 2>/dev/null)
  fi
  COMPREPLY=($(compgen -W "$opts" -- "$cur"))
  return 0
}
complete -o bashdefault -o default -F _PROG_complete PROG
`

const zshScript = `#compdef PROG
# zsh completion for PROG: source <(PROG completion zsh)
_PROG() {
  local -a opts
  local cur=${words[-1]}
  if [[ "$cur" == -* ]]; then
    opts=("${(@f)$(${words[@]:0:#words[@]-1} "$cur" --generate-bash-completion 2>/dev/null)}")
  else
    opts=("${(@f)$(${words[@]:0:#words[@]-1} --generate-bash-completion 2>/dev/null)}")
  fi
  if [[ -n "${opts[1]}" ]]; then
    _describe 'values' opts
  else
    _files
  fi
}
if (( $+functions[compdef] )); then
  compdef _PROG PROG
fi
`
