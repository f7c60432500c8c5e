package config_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
