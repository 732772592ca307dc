package cluster_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"
)

// The chart's alert rules and Grafana dashboard name metrics; a name no target
// exports is a panel that stays empty and an alert that never fires. These
// helpers check them against the metrics the in-process controller and agents
// really serve (metrics.Registry, what their endpoints expose).
var (
	rulesFile     = filepath.Join("..", "..", "..", "charts", "meshvol", "rules", "meshvol-alerts.yaml")
	dashboardFile = filepath.Join("..", "..", "..", "charts", "meshvol", "dashboards", "meshvol.json")
	// metricName finds the metric names in a PromQL expression: the families
	// meshvol's processes export, by prefix (labels, functions and label values
	// never start with these).
	metricName = regexp.MustCompile(`\b(?:meshvol|controller_runtime|workqueue|rest_client|process)_[a-z0-9_]+\b`)
	// whileRunning are series that exist only while something runs, with what:
	// a scenario may not catch them, and the check then says so instead of failing.
	whileRunning = map[string]string{
		"meshvol_controller_volume_transition_step_wait_seconds": "a datamesh transition is in flight",
		"meshvol_agent_peer_resync_progress_ratio":               "a resync runs",
	}
)

// scraper gathers the registry every 200 ms until stopped (or the test ends)
// and returns every metric family name it saw.
func (r *rig) scraper() (stop func() map[string]bool) {
	seen := map[string]bool{}
	var mu sync.Mutex
	done := make(chan struct{})
	var wg sync.WaitGroup
	gather := func() {
		mfs, err := metrics.Registry.Gather()
		if err != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for _, mf := range mfs {
			if len(mf.GetMetric()) > 0 {
				seen[mf.GetName()] = true
			}
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			gather()
			select {
			case <-done:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	var once sync.Once
	stop = func() map[string]bool {
		once.Do(func() { close(done); wg.Wait() })
		gather()
		return seen
	}
	r.t.Cleanup(func() { stop() })
	return stop
}

// monitoredNames are the metric names the rule file's expressions and the
// dashboard's queries use, each with where it is used.
func (r *rig) monitoredNames() map[string][]string {
	r.t.Helper()
	used := map[string][]string{}
	add := func(where, expr string) {
		for _, n := range metricName.FindAllString(expr, -1) {
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				if strings.HasSuffix(n, "_seconds"+suffix) {
					n = strings.TrimSuffix(n, suffix)
				}
			}
			if !slices.Contains(used[n], where) {
				used[n] = append(used[n], where)
			}
		}
	}
	b, err := os.ReadFile(rulesFile)
	r.must(err)
	var rules struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	r.must(yaml.Unmarshal(b, &rules))
	for _, g := range rules.Groups {
		for _, rule := range g.Rules {
			add("alert "+rule.Alert, rule.Expr)
		}
	}
	b, err = os.ReadFile(dashboardFile)
	r.must(err)
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct{ List []struct{ Query any } }
	}
	r.must(json.Unmarshal(b, &dash))
	for _, p := range dash.Panels {
		for _, t := range p.Targets {
			add("panel "+p.Title, t.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(string); ok {
			add("dashboard variable", q)
		}
	}
	if len(used) < 10 {
		r.t.Fatalf("only %d metric names found in %s and %s: the parsing is broken", len(used), rulesFile, dashboardFile)
	}
	return used
}

// checkMonitored fails for every metric a rule or panel uses that the scrape never
// saw.
func (r *rig) checkMonitored(seen map[string]bool) {
	r.t.Helper()
	used := r.monitoredNames()
	var found, conditional []string
	for n, where := range used {
		switch {
		case seen[n]:
			found = append(found, n)
		case whileRunning[n] != "":
			conditional = append(conditional, n+" (exists while "+whileRunning[n]+")")
		default:
			r.t.Errorf("%s uses %s, which neither the controller nor an agent exported during the scenario", strings.Join(where, ", "), n)
		}
	}
	slices.Sort(conditional)
	r.t.Logf("%d metric names of the alerts and the dashboard seen in the scrapes; not seen: %v", len(found), conditional)
}
