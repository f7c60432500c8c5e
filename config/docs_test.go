package config_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/agentfleet/agentfleet/config"
)

var update = flag.Bool("update", false, "rewrite the key table in docs/configuration.md from config.Keys()")

const (
	docsPath   = "../docs/configuration.md"
	tableBegin = "<!-- BEGIN KEY TABLE: generated from config.Keys() by `go test ./config -run TestDocs -update`; do not edit -->"
	tableEnd   = "<!-- END KEY TABLE -->"
)

// keyTable renders Keys() as the Markdown table of docs/configuration.md.
func keyTable() string {
	var b strings.Builder
	b.WriteString("| Key | Environment variable | Type | Default | Description |\n")
	b.WriteString("|---|---|---|---|---|\n")
	for _, k := range config.Keys() {
		env := "—"
		if k.Env != "" {
			env = "`" + k.Env + "`"
		}
		if k.EnvFallback != "" {
			env += ", else `" + k.EnvFallback + "`"
		}
		def := "`" + k.Default + "`"
		if k.Default == "" {
			def = `""`
		}
		if k.Default == "inherited" {
			def = "inherited"
		}
		b.WriteString("| `" + k.Path + "` | " + env + " | " + k.Type + " | " + def + " | " +
			strings.ReplaceAll(k.Description, "|", `\|`) + " |\n")
	}
	return b.String()
}

// TestDocs checks that docs/configuration.md holds the key table generated
// from Keys(), so that it mentions every key, its variable and its default.
func TestDocs(t *testing.T) {
	data, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	before, rest, ok1 := strings.Cut(doc, tableBegin+"\n")
	_, after, ok2 := strings.Cut(rest, tableEnd)
	if !ok1 || !ok2 {
		t.Fatalf("%s lacks the markers %q and %q", docsPath, tableBegin, tableEnd)
	}
	want := before + tableBegin + "\n" + keyTable() + tableEnd + after
	if *update {
		if err := os.WriteFile(filepath.Clean(docsPath), []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		doc = want
	} else if doc != want {
		t.Errorf("%s: the key table is out of date; run: go test ./config -run TestDocs -update", docsPath)
	}
	for _, k := range config.Keys() {
		if !strings.Contains(doc, "`"+k.Path+"`") {
			t.Errorf("%s does not mention key %s", docsPath, k.Path)
		}
		if k.Env != "" && !strings.Contains(doc, k.Env) {
			t.Errorf("%s does not mention %s", docsPath, k.Env)
		}
		if k.EnvFallback != "" && !strings.Contains(doc, k.EnvFallback) {
			t.Errorf("%s does not mention %s", docsPath, k.EnvFallback)
		}
	}
}

// TestDocsExample checks that the example file of docs/configuration.md loads.
func TestDocsExample(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "## Example")
	if !ok {
		t.Fatal("no Example section")
	}
	_, rest, ok1 := strings.Cut(rest, "```yaml\n")
	example, _, ok2 := strings.Cut(rest, "```")
	if !ok1 || !ok2 {
		t.Fatal("no yaml block in the Example section")
	}
	c, err := config.Load(writeFile(t, example), nil)
	if err != nil {
		t.Fatalf("the documented example does not load: %v", err)
	}
	rc := c.ResetConfig()
	if got := rc.ByPlatformChatType["telegram"]["group"]; got.IdleMinutes != 720 || got.Mode != "idle" || got.AtHour != 4 || !got.Notify {
		t.Errorf("telegram group policy = %+v, want the one the docs describe", got)
	}
	if got := rc.ByPlatformChatType["slack"]["channel"]; got.Mode != "none" {
		t.Errorf("slack channel policy = %+v, want mode none", got)
	}
}

// yamlBlock is a fenced ```yaml block of a Markdown file.
type yamlBlock struct {
	file string
	line int    // of the opening fence
	info string // the fence's info string, "yaml" included
	text string
}

// yamlBlocks returns the fenced blocks of path whose info string starts
// with yaml (or yml).
func yamlBlocks(t *testing.T, path string) []yamlBlock {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []yamlBlock
	var cur *yamlBlock
	var body strings.Builder
	for i, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur == nil {
			if info, ok := strings.CutPrefix(trimmed, "```"); ok {
				f := strings.Fields(info)
				if len(f) > 0 && (f[0] == "yaml" || f[0] == "yml") {
					cur = &yamlBlock{file: path, line: i + 1, info: info}
					body.Reset()
				}
			}
			continue
		}
		if trimmed == "```" {
			cur.text = body.String()
			out = append(out, *cur)
			cur = nil
			continue
		}
		body.WriteString(line + "\n")
	}
	return out
}

// TestDocsYAMLExamples loads every YAML example of README.md and docs/*.md
// that is an agentfleet configuration (one whose top-level keys include a
// configuration section; a compose file, say, is left alone): each must
// load, every key known and every value valid. Unless its fence says
// `yaml cluster` (a configuration for separate processes on a NATS
// cluster), it must also be one `agentfleet up --config` accepts, since that
// is how a reader tries it first.
func TestDocsYAMLExamples(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{"../README.md"}, files...)
	sections := map[string]bool{}
	for _, k := range config.Keys() {
		top, _, _ := strings.Cut(k.Path, ".")
		sections[top] = true
	}
	checked := 0
	for _, f := range files {
		for _, b := range yamlBlocks(t, f) {
			var top map[string]any
			if err := yaml.Unmarshal([]byte(b.text), &top); err != nil {
				t.Errorf("%s:%d: the YAML example does not parse: %v", b.file, b.line, err)
				continue
			}
			isConfig := false
			for k := range top {
				isConfig = isConfig || sections[k]
			}
			if !isConfig {
				continue
			}
			checked++
			c, src, err := config.LoadSourced(writeFile(t, b.text), nil, nil)
			if err != nil {
				t.Errorf("%s:%d: the documented configuration does not load:\n%v", b.file, b.line, err)
				continue
			}
			if strings.Contains(b.info, "cluster") {
				continue
			}
			if err := c.CheckUp(src); err != nil {
				t.Errorf("%s:%d: `agentfleet up` refuses the documented configuration (fence it as ```yaml cluster if it is meant for a cluster):\n%v", b.file, b.line, err)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no YAML configuration example found in the docs")
	}
}
