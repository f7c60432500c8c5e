package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/bench"
)

func TestBenchFlags(t *testing.T) {
	s, err := parseScenarios("throughput, floor,throughput")
	if err != nil || !slices.Equal(s, []string{"floor", "throughput"}) {
		t.Fatalf("parseScenarios: %v %v", s, err)
	}
	if s, _ := parseScenarios("all"); !slices.Equal(s, benchScenarios) {
		t.Fatalf("all: %v", s)
	}
	if _, err := parseScenarios("floor,bogus"); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("unknown scenario: %v", err)
	}
	if m, err := parseIngresses("http, adapter"); err != nil || !slices.Equal(m, []string{bench.IngressHTTP, bench.IngressAdapter}) {
		t.Fatalf("parseIngresses: %v %v", m, err)
	}
	for _, bad := range []string{"grpc", "http,http", ""} {
		if _, err := parseIngresses(bad); err == nil {
			t.Fatalf("--ingress %q accepted", bad)
		}
	}
	n, err := parseInts("sessions", "1k,100k,1M,7")
	if err != nil || !slices.Equal(n, []int{1000, 100000, 1000000, 7}) {
		t.Fatalf("parseInts: %v %v", n, err)
	}
	if _, err := parseInts("lanes", "1,-2"); err == nil {
		t.Fatal("a negative lane count was accepted")
	}
	err = newApp().Run([]string{"agentfleet", "bench", "--scenario", "takeover", "--nats-url", "nats://127.0.0.1:1", "--ingress-url", "http://127.0.0.1:1"})
	if err == nil || !strings.Contains(err.Error(), "takeover") {
		t.Fatalf("takeover against a running fleet: %v", err)
	}
}

// TestBenchHelpOneDefault: every flag of bench --help states at most one
// default.
func TestBenchHelpOneDefault(t *testing.T) {
	var out bytes.Buffer
	app := newApp()
	app.Writer = &out
	if err := app.Run([]string{"agentfleet", "bench", "--help"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "--workers") {
		t.Fatalf("no help:\n%s", out.String())
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.Count(line, "(default") > 1 {
			t.Errorf("two defaults: %s", strings.TrimSpace(line))
		}
	}
}

// TestBenchFloorJSON runs the quickest scenario end to end through the
// command: one JSON document, and the Markdown section written. --data
// names a directory that does not exist yet: bench creates it. NATS_URL is
// set: bench says it does not use it.
func TestBenchFloorJSON(t *testing.T) {
	var out, notes bytes.Buffer
	benchStdout, benchStderr = &out, &notes
	defer func() { benchStdout, benchStderr = os.Stdout, os.Stderr }()
	t.Setenv("NATS_URL", "nats://someone:pw@127.0.0.1:1")
	md := filepath.Join(t.TempDir(), "bench.md")
	data := filepath.Join(t.TempDir(), "not", "yet")
	err := newApp().Run([]string{"agentfleet", "bench", "--scenario", "floor", "--lanes", "2", "--duration", "300ms",
		"--warmup", "1", "--json", "--quiet", "--out", md, "--data", data})
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(data); err != nil || !fi.IsDir() {
		t.Fatalf("--data %s was not created: %v", data, err)
	}
	if n := notes.String(); !strings.Contains(n, "NATS_URL=nats://[redacted]@127.0.0.1:1 is not used") || strings.Contains(n, "pw") {
		t.Fatalf("bench did not say (without the password) that it ignores NATS_URL: %q", n)
	}
	var rep bench.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("not one JSON document: %v\n%s", err, out.String())
	}
	if len(rep.Floors) != 1 || rep.Floors[0].Turns == 0 || rep.Floors[0].Lanes != 2 {
		t.Fatalf("floor results: %+v", rep.Floors)
	}
	b, err := os.ReadFile(md)
	if err != nil || !strings.Contains(string(b), "<!-- BEGIN bench:floor") || !strings.Contains(string(b), "<!-- BEGIN bench:machine") {
		t.Fatalf("markdown: %v\n%s", err, b)
	}

	// The saved report renders again without measuring.
	saved := filepath.Join(t.TempDir(), "report.json")
	if err := os.WriteFile(saved, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := newApp().Run([]string{"agentfleet", "bench", "--report", saved}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "== floor") {
		t.Fatalf("re-rendered report:\n%s", out.String())
	}
}
