package cliutil

import (
	"go.yaml.in/yaml/v3"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/config"
)

// ShowConfig renders cfg as YAML with its secrets redacted, each value
// that does not come from the defaults commented with its source.
func ShowConfig(cfg config.Config, src config.Sources) (string, error) {
	var root yaml.Node
	if err := root.Encode(Redacted(cfg)); err != nil {
		return "", err
	}
	annotate(&root, "", src)
	out, err := yaml.Marshal(&root)
	if err != nil {
		return "", err
	}
	return "# effective configuration (secrets [redacted]); keys without a comment have their default\n" + string(out), nil
}

// Redacted is cfg.Redacted() with credentials inside nats.url redacted too.
func Redacted(cfg config.Config) config.Config {
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
