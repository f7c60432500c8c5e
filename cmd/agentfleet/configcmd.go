package main

import (
	"encoding/json"
	"fmt"

	"github.com/urfave/cli/v2"
	"go.yaml.in/yaml/v3"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/config"
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
					return enc.Encode(redacted(cfg))
				}
				out, err := showConfig(cfg, src)
				if err != nil {
					return err
				}
				_, err = fmt.Fprint(c.App.Writer, out)
				return err
			},
		}},
	}
}

// showConfig renders cfg as YAML with its secrets redacted, each value
// that does not come from the defaults commented with its source.
func showConfig(cfg config.Config, src config.Sources) (string, error) {
	var root yaml.Node
	if err := root.Encode(redacted(cfg)); err != nil {
		return "", err
	}
	annotate(&root, "", src)
	out, err := yaml.Marshal(&root)
	if err != nil {
		return "", err
	}
	return "# agentfleet effective configuration (secrets [redacted]); keys without a comment have their default\n" + string(out), nil
}

// redacted is cfg.Redacted() with credentials inside nats.url redacted too.
func redacted(cfg config.Config) config.Config {
	r := cfg.Redacted()
	r.NATS.URL = broker.RedactURL(r.NATS.URL)
	return r
}

func annotate(n *yaml.Node, path string, src config.Sources) {
	if n.Kind != yaml.MappingNode {
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		p := k.Value
		if path != "" {
			p = path + "." + k.Value
		}
		if from := src.Of(p); from != "" && v.Kind == yaml.ScalarNode {
			v.LineComment = "from " + from
		}
		annotate(v, p, src)
	}
}
