package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/meshvol/meshvol/internal/sandbox"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
)

// run is one failover as reported.
type run struct {
	Name, Class, From, To string
	Fault                 sandbox.Fault
	Load                  string // the load average when the writer started
	// Milestones from the fault.
	Detected, PodDeleted, Detached, Primary, Attached, Running, Total time.Duration
	LastAck, Resumed                                                  int
	OldAfterFault                                                     sandbox.WriterLog
	Heal                                                              *sandbox.HealResult
	Steps                                                             []string
	// Leaders are the leader elections (leaderRole) whose holder ran on
	// the faulted node when the fault came: each one's new leader comes
	// only after the old one's Lease expired.
	Leaders []string
	// Error is why the run failed ("" when it passed).
	Error string

	result *sandbox.FailoverResult
}

func (r *run) fill(f *sandbox.FailoverResult) {
	r.Name, r.Class, r.From, r.To, r.Fault = f.Name, f.Class, f.From, f.To, f.Fault
	r.Detected, r.PodDeleted, r.Detached, r.Primary, r.Attached, r.Running, r.Total =
		f.Detected, f.PodDeleted, f.Detached, f.Primary, f.Attached, f.Running, f.Total()
	r.LastAck, r.Resumed, r.OldAfterFault, r.Steps = f.LastAck, f.Resumed, f.OldAfterFault, f.Steps
}

// segment is one part of a run's bar: from the previous milestone (or the
// fault) to this one. A milestone seen before the previous one adds
// nothing.
type segment struct {
	name, color string
	end         func(*run) time.Duration
}

var segments = []segment{
	{"detection (Lease expired + grace)", "#4e79a7", func(r *run) time.Duration { return r.Detected }},
	{"old pod deleted", "#f28e2b", func(r *run) time.Duration { return r.PodDeleted }},
	{"VolumeAttachment deleted", "#e15759", func(r *run) time.Duration { return r.Detached }},
	{"attach (Primary, VolumeAttachment attached)", "#76b7b2", func(r *run) time.Duration { return max(r.Primary, r.Attached) }},
	{"stage, mount, container start (Running)", "#59a14f", func(r *run) time.Duration { return r.Running }},
	{"first acknowledged write", "#edc948", func(r *run) time.Duration { return r.Total }},
}

// parts are a run's segment lengths.
func (r *run) parts() []time.Duration {
	var out []time.Duration
	prev := time.Duration(0)
	for _, s := range segments {
		end := max(s.end(r), prev)
		out = append(out, end-prev)
		prev = end
	}
	return out
}

type report struct {
	Started, Finished time.Time
	Commit            string
	CPUs              int
	Goal              time.Duration
	TaintLostNodes    bool
	// LeaderElection is the chart's controller.leaderElection,
	// "leaseDuration/renewDeadline/retryPeriod".
	LeaderElection string
	Runs           []run
	// Leases is how each leader election's Lease was renewed over the runs.
	Leases []sandbox.LeaderRenewals
	// AgentLeases is how each agent's Lease was renewed over the runs.
	AgentLeases []sandbox.LeaderRenewals
}

// leaderRole names a leader election of the release by what it elects.
func leaderRole(lease string) string {
	switch {
	case lease == controller.LeaderElectionID:
		return "meshvol"
	case lease == strings.ReplaceAll(v1.CSIDriverName, ".", "-"):
		return "provisioner"
	case strings.HasPrefix(lease, "external-attacher"):
		return "attacher"
	case strings.HasPrefix(lease, "external-snapshotter"):
		return "snapshotter"
	case strings.HasPrefix(lease, "external-resizer"):
		return "resizer"
	}
	return lease
}

// failoverLeader says whether a leader the failover waits for ran on the
// faulted node: meshvol's (it declares the node lost and frees the pod) or
// external-attacher's (it attaches the volume on the new node).
func (r *run) failoverLeader() bool {
	return slices.Contains(r.Leaders, "meshvol") || slices.Contains(r.Leaders, "attacher")
}

// quantile is the nearest-rank q-quantile of ds (sorted ascending).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(q*float64(len(ds))+0.999999) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

type stats struct{ Min, Median, P95, Max time.Duration }

func statsOf(runs []run, f func(*run) time.Duration) stats {
	var ds []time.Duration
	for i := range runs {
		ds = append(ds, f(&runs[i]))
	}
	slices.Sort(ds)
	if len(ds) == 0 {
		return stats{}
	}
	return stats{ds[0], quantile(ds, 0.5), quantile(ds, 0.95), ds[len(ds)-1]}
}

func (s stats) String() string {
	return fmt.Sprintf("min %.2f s, median %.2f s, p95 %.2f s, max %.2f s", s.Min.Seconds(), s.Median.Seconds(), s.P95.Seconds(), s.Max.Seconds())
}

// passed are the runs that completed their checks.
func (rep *report) passed() []run {
	var out []run
	for _, r := range rep.Runs {
		if r.Error == "" {
			out = append(out, r)
		}
	}
	return out
}

func (rep *report) summary() string {
	st := statsOf(rep.passed(), func(r *run) time.Duration { return r.Total })
	over, failed := 0, 0
	for _, r := range rep.Runs {
		if r.Error != "" {
			failed++
		} else if r.Total >= rep.Goal {
			over++
		}
	}
	return fmt.Sprintf("%d runs, fault → first write: %s; %d at or over the %s goal; %d failed", len(rep.passed()), st, over, rep.Goal, failed)
}

// byLeader is the summary of the passed runs whose faulted node ran a
// leader the failover waits for (failoverLeader), and of the others.
func (rep *report) byLeader() string {
	var with, without []run
	for _, r := range rep.passed() {
		if r.failoverLeader() {
			with = append(with, r)
		} else {
			without = append(without, r)
		}
	}
	total := func(r *run) time.Duration { return r.Total }
	lost := func(r *run) time.Duration { return r.Detected }
	part := func(rs []run) string {
		if len(rs) == 0 {
			return "none"
		}
		return fmt.Sprintf("%d, fault → first write %s (lost: %s)", len(rs), statsOf(rs, total), statsOf(rs, lost))
	}
	return fmt.Sprintf("runs whose faulted node ran meshvol's or external-attacher's leader: %s; the others: %s", part(with), part(without))
}

// write writes base.md and base.svg.
func (rep *report) write(base string) error {
	if err := os.WriteFile(base+".svg", []byte(rep.svg()), 0o644); err != nil {
		return err
	}
	return os.WriteFile(base+".md", []byte(rep.markdown(base)), 0o644)
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2f", d.Seconds()) }

func (rep *report) markdown(base string) string {
	var b strings.Builder
	svg := base[strings.LastIndex(base, "/")+1:] + ".svg"
	fmt.Fprintf(&b, "# Failover benchmark\n\n")
	fmt.Fprintf(&b, "Written by `make bench-failover` (hack/benchfailover); what the milestones are and what bounds them: docs/controller.md, Failover, measured.\n\n")
	fmt.Fprintf(&b, "- commit %s, %s to %s UTC, %d CPUs; the load average (1, 5, 15 min) at each run's start is in the table\n",
		rep.Commit, rep.Started.Format("2006-01-02 15:04"), rep.Finished.Format("15:04"), rep.CPUs)
	fmt.Fprintf(&b, "- the sandbox's chart values: controller.taintLostNodes %v, controller.deleteLostPods true, node.leaseDuration 6s, node.leaseRenewInterval 2s, controller.nodeGracePeriod 3s, controller.leaderElection %s (leaseDuration/renewDeadline/retryPeriod)\n", rep.TaintLostNodes, rep.LeaderElection)
	fmt.Fprintf(&b, "- %s\n", rep.summary())
	fmt.Fprintf(&b, "- %s\n\n", rep.byLeader())
	fmt.Fprintf(&b, "| milestone (s from the fault) | min | median | p95 | max |\n|---|---|---|---|---|\n")
	for _, m := range []struct {
		name string
		f    func(*run) time.Duration
	}{
		{"node declared lost (tainted storage.meshvol.io/lost)", func(r *run) time.Duration { return r.Detected }},
		{"old pod deleted", func(r *run) time.Duration { return r.PodDeleted }},
		{"old VolumeAttachment deleted", func(r *run) time.Duration { return r.Detached }},
		{"Primary on the new node (RVA Attached)", func(r *run) time.Duration { return r.Primary }},
		{"new VolumeAttachment attached", func(r *run) time.Duration { return r.Attached }},
		{"new pod Running", func(r *run) time.Duration { return r.Running }},
		{"**first acknowledged write**", func(r *run) time.Duration { return r.Total }},
	} {
		st := statsOf(rep.passed(), m.f)
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", m.name, secs(st.Min), secs(st.Median), secs(st.P95), secs(st.Max))
	}
	fmt.Fprintf(&b, "\n![a stacked bar per run](%s)\n\n", svg)
	fmt.Fprintf(&b, "| run | fault | class | from → to | lost | pod deleted | VA deleted | Primary | VA attached | Running | first write | last ack → found | old pod after the fault | leaders on the faulted node | load |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rep.Runs {
		if r.Error != "" {
			fmt.Fprintf(&b, "| %s | %s | %s | %s → %s | failed: %s ||||||||||||\n", r.Name, r.Fault, r.Class, r.From, r.To, strings.ReplaceAll(r.Error, "\n", " "))
			continue
		}
		old := fmt.Sprintf("%d acks, %d fails", r.OldAfterFault.Acks, r.OldAfterFault.Fails)
		if r.Fault == sandbox.FaultPartition {
			old += fmt.Sprintf(", last try %d", r.OldAfterFault.LastTry)
			if r.Heal != nil {
				old += fmt.Sprintf("; healed: container ended +%.1f s, DRBD no longer Primary +%.1f s (%s), new pod's %d → next found %d",
					r.Heal.OldStopped.Seconds(), r.Heal.OldDemoted.Seconds(), orDown(r.Heal.OldRole), r.Heal.NewLastAck, r.Heal.Reread)
			}
		}
		leaders := strings.Join(r.Leaders, ", ")
		if leaders == "" {
			leaders = "none"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s → %s | %s | %s | %s | %s | %s | %s | **%s** | %d → %d | %s | %s | %s |\n",
			r.Name, r.Fault, r.Class, r.From, r.To, secs(r.Detected), secs(r.PodDeleted), secs(r.Detached), secs(r.Primary),
			secs(r.Attached), secs(r.Running), secs(r.Total), r.LastAck, r.Resumed, old, leaders, r.Load)
	}
	if len(rep.Leases) > 0 {
		fmt.Fprintf(&b, "\nThe leader elections' Leases over the runs (the time between two renewals by one holder, which renews every retryPeriod and stops leading when no renewal succeeded for renewDeadline):\n\n")
		for _, l := range rep.Leases {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	if len(rep.AgentLeases) > 0 {
		fmt.Fprintf(&b, "\nThe agents' Leases over the runs (the time between two renewals by one agent, which renews every node.leaseRenewInterval; its node is lost when none reached the controller for node.leaseDuration + controller.nodeGracePeriod; a faulted node's agent renewing again counts as a new holder, not a gap):\n\n")
		for _, l := range rep.AgentLeases {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	return b.String()
}

// svg draws a horizontal stacked bar per run, its segments as in segments,
// with the goal as a vertical line.
func (rep *report) svg() string {
	const left, top, rowH, barH, width = 190, 40, 22, 14, 560
	maxT := rep.Goal + 2*time.Second
	for _, r := range rep.Runs {
		maxT = max(maxT, r.Total+time.Second)
	}
	scale := float64(width) / maxT.Seconds()
	h := top + rowH*len(rep.Runs) + 40 + 18*len(segments)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", left+width+60, h)
	fmt.Fprintf(&b, `<text x="10" y="18" font-size="13">meshvol failover, fault → first acknowledged write (s), commit %s</text>`+"\n", esc(rep.Commit))
	for s := 0; s <= int(maxT.Seconds()); s += 5 {
		x := left + int(float64(s)*scale)
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#ddd"/><text x="%d" y="%d" text-anchor="middle">%d</text>`+"\n",
			x, top-8, x, top+rowH*len(rep.Runs), x, top-12, s)
	}
	for i, r := range rep.Runs {
		y := top + i*rowH
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s %s %s</text>`+"\n", left-6, y+barH-3, esc(r.Name), esc(string(r.Fault)), esc(strings.TrimPrefix(r.Class, "meshvol-")))
		if r.Error != "" {
			fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#c00">failed (see the table)</text>`+"\n", left+4, y+barH-3)
			continue
		}
		x := float64(left)
		for j, p := range r.parts() {
			w := p.Seconds() * scale
			fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x, y, w, barH, segments[j].color)
			x += w
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d">%.1f</text>`+"\n", x+4, y+barH-3, r.Total.Seconds())
	}
	gx := left + int(rep.Goal.Seconds()*scale)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#c00" stroke-dasharray="4 3"/><text x="%d" y="%d" fill="#c00">goal %s</text>`+"\n",
		gx, top-8, gx, top+rowH*len(rep.Runs), gx+3, top+rowH*len(rep.Runs)+12, rep.Goal)
	ly := top + rowH*len(rep.Runs) + 30
	for j, s := range segments {
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", left, ly+18*j, s.color, left+18, ly+18*j+10, esc(s.name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}

// orDown names a DRBD role, "" being a resource that is down.
func orDown(role string) string {
	if role == "" {
		return "down"
	}
	return role
}
