// Package monitoring_test checks the chart's alert rules with Prometheus' own tool:
// `promtool check rules` on charts/meshvol/rules/meshvol-alerts.yaml, and `promtool
// test rules` on alerts_test.yaml, which fires each alert on the series that should
// fire it and keeps it quiet on its near miss. That every metric the rules name is
// exported is checked against a real scrape in test/integration/cluster.
package monitoring_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// promtool is $PROMTOOL, else bin/promtool, which `make promtool` builds (and `make
// test` first). Without it the test fails, as the packages that need bin/k8s do: a
// rule check that skips would leave the alerts unchecked in a green run.
func promtool(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("PROMTOOL"); p != "" {
		return p
	}
	p, err := filepath.Abs(filepath.Join("..", "..", "bin", "promtool"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("no promtool: run `make promtool` (hack/build-promtool.sh builds it into %s) or set PROMTOOL", p)
	}
	return p
}

func TestAlertRules(t *testing.T) {
	tool := promtool(t)
	for _, args := range [][]string{
		{"check", "rules", filepath.Join("..", "..", "charts", "meshvol", "rules", "meshvol-alerts.yaml")},
		{"test", "rules", "alerts_test.yaml"},
	} {
		out, err := exec.Command(tool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
			continue
		}
		t.Logf("promtool %v:\n%s", args, out)
	}
}
