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

	"github.com/meshvol/meshvol/internal/testenv"
)

// promtool is $PROMTOOL, else bin/k8s/promtool. promtool builds from its Go module
// (github.com/prometheus/prometheus/cmd/promtool).
func promtool(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("PROMTOOL"); p != "" {
		return p
	}
	bin, err := testenv.DefaultBinDir()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(bin, "promtool")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no promtool: set PROMTOOL or build it into %s (go install github.com/prometheus/prometheus/cmd/promtool)", p)
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
