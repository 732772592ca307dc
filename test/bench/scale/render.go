package main

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// backingOf is what backed a run's replicas; runs from before it was recorded
// used loop devices.
func backingOf(r Result) string { return cmp.Or(r.Backing, backingLoop) }

// cpuSeconds is a period's CPU seconds by process, "-" for a run from before
// they were recorded.
func cpuSeconds(c CPU) string {
	if c == (CPU{}) {
		return "-"
	}
	return fmt.Sprintf("%.1f / %.1f / %.1f", c.Controller, c.Agents, c.APIServer)
}

// deleteFigure formats a figure of the deletion, "held" for a run that left
// its volumes in place (-hold).
func deleteFigure(r Result, format string, v float64) string {
	if r.Held {
		return "held"
	}
	return fmt.Sprintf(format, v)
}

// render writes results.md (every figure of every run) and the plots.
func render(dir string, rs []Result, plotLabels []string) error {
	slices.SortStableFunc(rs, func(a, b Result) int {
		return cmp.Or(cmp.Compare(a.Label, b.Label), cmp.Compare(a.Class, b.Class), cmp.Compare(a.N, b.N))
	})
	var b strings.Builder
	b.WriteString("# Scale benchmark results\n\n")
	b.WriteString("Written by `make bench-scale` (test/bench/scale); what each figure means is in [../scale.md](../scale.md).\n")
	b.WriteString("Times in seconds; writes per volume from the apiserver's audit log, Lease renewals left out; formation CPU in seconds of each process; idle CPU in % of one core over the idle period; memory resident (peak).\n\n")
	b.WriteString("| label | commit | date | load start → end | class | N | backing | Ready | all Ready | p50 | p95 | formation CPU s controller / agents+sim / apiserver | reconciles/vol | writes/vol (controller + agents) | counters agree | idle CPU controller / agents+sim / apiserver | idle writes besides Leases | RSS controller (peak) | RSS agents+sim (peak) | RSS apiserver | delete all | delete CPU s controller / agents+sim / apiserver | delete writes/vol | error |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		idleWrites := r.Idle.AuditController + r.Idle.AuditAgents - r.Idle.Leases
		fmt.Fprintf(&b, "| %s | %s | %s | %s → %s | %s | %d | %s | %d | %.1f | %.1f | %.1f | %.1f / %.1f / %.1f | %.1f | %.1f (%.1f + %.1f) | %s | %.1f / %.1f / %.1f | %d | %d (%d) MB | %d (%d) MB | %d MB | %s | %s | %s | %s |\n",
			r.Label, r.Commit, r.Date, r.LoadStart, r.LoadEnd, r.Class, r.N, backingOf(r), r.Ready, r.ReadySeconds, r.P50, r.P95,
			r.FormationCPU.Controller, r.FormationCPU.Agents, r.FormationCPU.APIServer, float64(r.Formation.VolumeReconciles)/float64(r.N),
			r.Formation.PerVolume, r.Formation.ControllerPerVolume, r.Formation.AgentsPerVolume, agreement(r),
			r.IdleCPU.Controller, r.IdleCPU.Agents, r.IdleCPU.APIServer, idleWrites,
			r.Memory.ControllerRSS>>20, r.Memory.ControllerPeak>>20, r.Memory.AgentsRSS>>20, r.Memory.AgentsPeak>>20, r.Memory.APIServerRSS>>20,
			deleteFigure(r, "%.1f", r.DeleteSeconds), cpuSeconds(r.DeleteCPU), deleteFigure(r, "%.1f", r.Delete.PerVolume), strings.ReplaceAll(r.Error, "|", "/"))
	}
	b.WriteString("\n## Controller restart with every volume formed\n\n")
	b.WriteString("The controller stopped (SIGTERM) and started again on the formed, idle cluster: from the new process's start to its caches synced (`/readyz`) and to every volume reconciled once; then the writes and the RV updates from the stop until 10 s after that pass (nothing changed, so the budget is 0 and any RV update is a status flapping), and how often a Ready volume was seen otherwise.\n\n")
	b.WriteString("| label | class | N | caches synced | every volume reconciled | writes besides Leases (controller + agents) | RV updates | left Ready | controller flags |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		rs := r.Restart
		if rs.PassSeconds == 0 && rs.SyncedSeconds == 0 {
			continue // a run from before the restart was measured
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %.1f s | %.1f s | %d (%d + %d) | %d | %d | %s |\n", r.Label, r.Class, r.N, rs.SyncedSeconds, rs.PassSeconds,
			rs.Writes.AuditController+rs.Writes.AuditAgents-rs.Writes.Leases, rs.Writes.AuditController, rs.Writes.AuditAgents-rs.Writes.Leases,
			rs.RVUpdates, rs.LeftReady, controllerSetting(r))
	}
	b.WriteString("\n## Writes of each formation, by component, verb and resource (audit log)\n\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "### %s %s N=%d\n\n", r.Label, r.Class, r.N)
		fmt.Fprintf(&b, "Audit: controller %d, agents %d (of which %d Lease renewals); the processes' own counts: controller client-go %d (its reconcilers %d, Events and refused requests not among them), agents %d.\n\n",
			r.Formation.AuditController, r.Formation.AuditAgents, r.Formation.Leases, r.Formation.ControllerHTTP, r.Formation.ControllerReconciler, r.Formation.AgentsHTTP)
		if r.Formation.VolumeReconciles > 0 {
			fmt.Fprintf(&b, "The controller reconciled a volume %d times (%.1f per volume).\n\n",
				r.Formation.VolumeReconciles, float64(r.Formation.VolumeReconciles)/float64(r.N))
		}
		b.WriteString("| writes | per volume | component verb resource |\n|---|---|---|\n")
		keys := slices.Sorted(maps.Keys(r.Formation.ByResource))
		for _, k := range keys {
			n := r.Formation.ByResource[k]
			fmt.Fprintf(&b, "| %d | %.2f | %s |\n", n, float64(n)/float64(r.N), k)
		}
		b.WriteString("\n")
	}
	renderAgents(&b, rs)
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	plots := []struct {
		file, title, unit string
		series            []seriesOf
	}{
		{"ready.svg", "First create → all Ready", "s", []seriesOf{{"", func(r Result) float64 { return r.ReadySeconds }}}},
		{"p95.svg", "Each volume's create → Ready, 95th percentile", "s", []seriesOf{{"", func(r Result) float64 { return r.P95 }}}},
		{"writes.svg", "Apiserver writes per volume formed (audit log, Leases left out)", "writes", []seriesOf{{"", func(r Result) float64 { return r.Formation.PerVolume }}}},
		{"delete.svg", "Delete all → nothing left", "s", []seriesOf{{"", func(r Result) float64 {
			if r.Held || r.DeleteSeconds == 0 {
				return math.NaN() // not deleted, or not measured
			}
			return r.DeleteSeconds
		}}}},
		{"cpu.svg", "CPU in the idle period after formation", "% of one core", []seriesOf{
			{"controller", func(r Result) float64 { return r.IdleCPU.Controller }},
			{"agents+sim", func(r Result) float64 { return r.IdleCPU.Agents }}}},
		{"memory.svg", "Resident memory after formation", "MB", []seriesOf{
			{"controller", func(r Result) float64 { return float64(r.Memory.ControllerRSS >> 20) }},
			{"agents+sim", func(r Result) float64 { return float64(r.Memory.AgentsRSS >> 20) }}}},
	}
	plotted := slices.DeleteFunc(slices.Clone(rs), func(r Result) bool {
		return !slices.ContainsFunc(plotLabels, func(prefix string) bool { return strings.HasPrefix(r.Label, prefix) })
	})
	for _, p := range plots {
		svg := plot(p.title, p.unit, lines(plotted, p.series))
		if err := os.WriteFile(filepath.Join(dir, p.file), []byte(svg), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func agreement(r Result) string {
	w := r.Whole
	if w.Agree {
		return fmt.Sprintf("yes (%d + %d)", w.ControllerHTTP, w.AgentsHTTP)
	}
	return fmt.Sprintf("NO: audit %d + %d, own %d + %d", w.AuditController, w.AuditAgents-w.Leases, w.ControllerHTTP, w.AgentsHTTP)
}

// seriesOf picks one figure of a run; name tells several figures of one plot apart.
type seriesOf struct {
	name string
	of   func(Result) float64
}

// lines groups the runs into one line per label, class and figure, with
// their points by N. A run that did not reach all Ready is left out: its
// time is not a time to Ready.
func lines(rs []Result, figures []seriesOf) []line {
	byName := map[string]*line{}
	var order []string
	for _, r := range rs {
		if r.Ready < r.N {
			continue
		}
		for _, f := range figures {
			name := strings.TrimSpace(r.Label + " " + r.Class + " " + f.name)
			y := f.of(r)
			if math.IsNaN(y) {
				continue // the run has no such figure
			}
			l, ok := byName[name]
			if !ok {
				l = &line{name: name, dashed: r.Label == "before"}
				byName[name] = l
				order = append(order, name)
			}
			l.points = append(l.points, point{x: float64(r.N), y: y})
		}
	}
	out := make([]line, 0, len(order))
	for _, n := range order {
		l := *byName[n]
		slices.SortFunc(l.points, func(a, b point) int { return cmp.Compare(a.x, b.x) })
		out = append(out, l)
	}
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return "`" + s + "`"
}

// controllerSetting is how the run ran the controller: its flags and, when it
// ran in a memory cgroup, the cgroup's limit and the kernel's kills in it.
func controllerSetting(r Result) string {
	s := r.ControllerArgs
	if r.ControllerMemoryLimit != "" {
		s = strings.TrimSpace(s + " in a memory cgroup of " + r.ControllerMemoryLimit + " (OOM kills: " + r.ControllerOOMKills + ")")
	}
	return orDash(s)
}
