package provider_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"

	"github.com/agentfleet/agentfleet/telemetry/provider"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// deployExprs returns the PromQL expressions of the Grafana dashboard and
// of the alert rules in deploy/observability, by file.
func deployExprs(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	data, err := os.ReadFile("../../deploy/observability/grafana/dashboards/agentfleet.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			out["dashboard"] = append(out["dashboard"], tg.Expr)
		}
	}
	data, err = os.ReadFile("../../deploy/observability/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatalf("alerts: %v", err)
	}
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || strings.TrimSpace(r.Expr) == "" {
				t.Errorf("alert rule %+v: want a name and an expression", r)
			}
			alerts[r.Alert] = true
			out["alerts"] = append(out["alerts"], r.Expr)
		}
	}
	// The alerts the fleet's operators are promised.
	for _, a := range []string{"AgentfleetBacklogGrowing", "AgentfleetDeadLetters", "AgentfleetDeliveryFailures",
		"AgentfleetNoWatcherLeader", "AgentfleetSpuriousTakeovers", "AgentfleetPartitionBacklog"} {
		if !alerts[a] {
			t.Errorf("no alert rule %s", a)
		}
	}
	return out
}

var metricRef = regexp.MustCompile(`agentfleet_[a-zA-Z0-9_]+`)

// TestDeployReferencesExposedMetrics reads every metric name the dashboard
// and the alert rules use and finds it in /metrics after a workload (a
// histogram's _bucket, _sum and _count series by its family), with every
// label the expressions filter or group by.
func TestDeployReferencesExposedMetrics(t *testing.T) {
	exprs := deployExprs(t)
	p, err := provider.New(t.Context(), provider.Config{ServiceName: "agentfleet-test", Version: "test", Prometheus: true,
		Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	f := startFleet(t, p)
	_, seq := f.send(t, "deploy-a", "one", 0)
	f.send(t, "deploy-a", "two", seq)

	// The backlog gauges appear once the watcher's leader has counted.
	var fams map[string]*dto.MetricFamily
	natstest.WaitFor(t, waitTimeout, "the inbox backlog gauges", func() error {
		var err error
		if fams, err = scrape(f.hc, f.base+"/metrics"); err != nil {
			return err
		}
		if fams["agentfleet_inbox_backlog"] == nil {
			return fmt.Errorf("no agentfleet_inbox_backlog yet")
		}
		return nil
	})
	labels := map[string]bool{"le": true}
	for _, fam := range fams {
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
	}
	var checked []string
	for file, list := range exprs {
		for _, e := range list {
			for _, name := range metricRef.FindAllString(e, -1) {
				if labels[name] {
					continue // a label (agentfleet_platform), checked below
				}
				fam := name
				if _, ok := fams[fam]; !ok {
					for _, suf := range []string{"_bucket", "_sum", "_count"} {
						if base, cut := strings.CutSuffix(name, suf); cut && fams[base] != nil {
							fam = base
						}
					}
				}
				if _, ok := fams[fam]; !ok {
					t.Errorf("%s: %s is not in /metrics (expression %q)", file, name, e)
					continue
				}
				checked = append(checked, fam)
			}
			// Labels filtered on ({name="..."}) or grouped by (by (a, b)).
			for _, m := range regexp.MustCompile(`([a-z_]+)\s*(=~|!=|=)\s*"`).FindAllStringSubmatch(e, -1) {
				if !labels[m[1]] {
					t.Errorf("%s: label %s is on no series (expression %q)", file, m[1], e)
				}
			}
			for _, m := range regexp.MustCompile(`\b(?:by|without|on|ignoring) \(([^)]*)\)`).FindAllStringSubmatch(e, -1) {
				for _, l := range strings.Split(m[1], ",") {
					if l = strings.TrimSpace(l); l != "" && !labels[l] {
						t.Errorf("%s: label %s is on no series (expression %q)", file, l, e)
					}
				}
			}
		}
	}
	sort.Strings(checked)
	if len(checked) < 10 {
		t.Fatalf("only %d metric references checked: %v", len(checked), checked)
	}
}
