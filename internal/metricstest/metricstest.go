// Package metricstest reads and lints what a Prometheus registry exports, for the
// tests of the packages that export meshvol's metrics and of the cluster that serves
// them (docs/operating.md, "Metrics").
package metricstest

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Series gathers g: every series whose metric name starts with prefix, as
// name{label=value,...} (labels in the order exported, which is sorted) → its value
// (a histogram's: its sample count), and the names of those metrics.
func Series(t testing.TB, g prometheus.Gatherer, prefix string) (map[string]float64, []string) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]float64{}
	var names []string
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), prefix) {
			continue
		}
		names = append(names, mf.GetName())
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
			series[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = v
		}
	}
	return series, names
}

// Lint fails t with every problem client_golang's linter finds (promlint: the rules
// `promtool check metrics` applies) in the metrics named, or in every metric of g
// when none is named.
func Lint(t testing.TB, g prometheus.Gatherer, names ...string) {
	t.Helper()
	problems, err := testutil.GatherAndLint(g, names...)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}
