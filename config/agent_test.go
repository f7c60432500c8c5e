package config_test

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/agentfleet/agentfleet/config"
)

func TestAgentBackendSettings(t *testing.T) {
	t.Parallel()
	path := writeFile(t, `
agent:
  backend: openai
  openai:
    model: gpt-test
    api_key: sk-from-file
    mcp_servers:
      - name: files
        command: [mcp-files, --root, /srv]
      - name: web
        url: http://127.0.0.1:9000/mcp
        headers: {Authorization: Bearer mcp-secret}
    prices:
      gpt-test: {input: 1.5, output: 6, cache_read: 0.5}
  bridge:
    token: bridge-secret
`)
	env := map[string]string{"OPENAI_BASE_URL": "http://127.0.0.1:11434/v1", "OPENAI_API_KEY": "sk-from-env"}
	c, err := config.Load(path, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	o := c.Agent.OpenAI
	if o.Model != "gpt-test" || o.BaseURL != "http://127.0.0.1:11434/v1" || o.APIKey != "sk-from-env" || o.MaxToolSteps != 8 ||
		len(o.MCPServers) != 2 || o.MCPServers[0].Command[2] != "/srv" || o.Prices["gpt-test"].Output != 6 {
		t.Fatalf("openai settings %+v", o)
	}
	out, err := yaml.Marshal(c.Redacted())
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"sk-from-env", "mcp-secret", "bridge-secret"} {
		if strings.Contains(string(out), secret) {
			t.Errorf("redacted configuration shows %q:\n%s", secret, out)
		}
	}
	if c.Agent.OpenAI.APIKey != "sk-from-env" || c.Agent.OpenAI.MCPServers[1].Headers["Authorization"] != "Bearer mcp-secret" {
		t.Error("Redacted changed the original")
	}
}

func TestAgentBackendSettingsRefused(t *testing.T) {
	t.Parallel()
	path := writeFile(t, `
agent:
  bridge:
    url: ftp://x
  openai:
    mcp_servers:
      - name: "bad name"
        command: [x]
      - name: both
        command: [x]
        url: http://h/mcp
      - name: neither
      - name: neither
        url: http://h/mcp
    prices:
      m: {input: -1}
`)
	_, err := config.Load(path, nil)
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"agent.bridge.url", "mcp_servers[0].name", "not both", "a command (stdio) or a url", "names two servers", "agent.openai.prices.m"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}
