package cluster_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/meshvol/meshvol/internal/localcluster"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// formationBudget is the most apiserver writes, the controller's and the agents'
// together (Events included), one 3D formation may take: docs/controller.md, "Write
// budget", says what each is for.
const formationBudget = 15

// deleteBudget is the same for deleting a formed, detached 3D volume: the goal is 8
// (docs/scale.md), and a delete takes 7 (no teardown revision, docs/contract.md,
// "Deleting a volume"; each replica deleted by name, docs/controller.md, "Deletion"; no
// Secret of the volume's own, its shared secret derived from the cluster key,
// docs/controller.md, "Allocation and the shared secret"). The agents' caches see the
// volume's mark at different moments; a member whose agent has not seen it yet reads
// the volume from the apiserver when its peers leave, and reports nothing (pkg/agent
// peerLeft).
const deleteBudget = 8

// Scenario 8: apiserver writes per operation, counted at the HTTP layer for
// the controller and all agents: a 3D formation (at most formationBudget), an
// attach, a steady minute and a controller restart (0 besides the agents' Lease
// renewals), a detach and a delete (logged for docs/controller.md's "Write budget").
func TestWritesPerOperation(t *testing.T) {
	r := newRig(t)
	class := r.class(1, 1, v1.TopologyIgnored)
	r.settled() // let placement views settle after the class
	before := r.c.Writes.Snapshot()
	history := r.statusHistory("writes-3d")
	r.volume("writes-3d", class, 1)
	rv := r.ready("writes-3d", 2*time.Minute)
	r.settled()
	formation, _ := r.c.Writes.Since(before)
	// Which status writes the formation made, when and what each moved: what a
	// formation of 13 writes or more wrote beyond the 12 of docs/controller.md's
	// "Write budget".
	t.Logf("the status writes of the formation:\n%s", strings.Join(history(), "\n"))
	// The pool's status follows the capacity the agents report with their Leases:
	// the formation's backing volumes move it once the drift passes the pool's
	// threshold. It is counted apart (docs/controller.md, "Write budget").
	n := withoutLeases(formation) - formation[poolStatusWrites]
	t.Logf("3D formation: %d writes besides Lease renewals and the pool's status (%d)\n%s", n, formation[poolStatusWrites], localcluster.Format(formation))
	if n > formationBudget {
		t.Errorf("a 3D formation took %d writes, more than its budget of %d (docs/controller.md, \"Write budget\")", n, formationBudget)
	}

	node := rv.Status.Datamesh.Members[0].NodeName
	before = r.c.Writes.Snapshot()
	r.attach("writes-3d", node)
	r.settled()
	attach, _ := r.c.Writes.Since(before)
	t.Logf("attach: %d writes besides Lease renewals\n%s", withoutLeases(attach), localcluster.Format(attach))

	before = r.c.Writes.Snapshot()
	idleBefore := idleWork(t)
	time.Sleep(time.Minute)
	steady, _ := r.c.Writes.Since(before)
	// An idle node does nothing in proportion to its replicas: the collector of
	// orphans passes over every replica of its node only after something changed
	// (pkg/agent runGC), at most once per agent after the attach's last change and
	// once more per reconcile in the minute, not every GCInterval (5 s here).
	work := idleWork(t).minus(idleBefore)
	t.Logf("steady minute: %d agent reconciles, %d DRBD commands, %d collector passes", work.reconciles, work.commands, work.passes)
	if most := len(r.c.Nodes) + work.reconciles; work.passes > most {
		t.Errorf("the agents' collector passed %d times in a steady minute, more than once per agent and per reconcile (%d)", work.passes, most)
	}
	nonLease := withoutLeases(steady)
	t.Logf("steady minute: %d writes besides Lease renewals\n%s", nonLease, localcluster.Format(steady))
	if nonLease > 0 {
		t.Errorf("a steady volume caused %d writes in a minute, want 0", nonLease)
	}

	// A controller restart (an upgrade, a rescheduled pod) with the volume formed and
	// attached: the new controller reconciles it and finds every status as it would
	// compute it, so it writes nothing and the volume's status does not move.
	rvBefore := r.rv("writes-3d").ResourceVersion
	reconciled := volumeReconciles(t)
	before = r.c.Writes.Snapshot()
	r.must(r.c.StopController())
	r.c.StartController()
	r.eventually("the restarted controller reconciles the volume", time.Minute, func() string {
		if n := volumeReconciles(t); n <= reconciled {
			return fmt.Sprintf("%d volume reconciles, as before the restart", n)
		}
		return ""
	})
	// What the first pass leaves for later (a requeue, a status paced by
	// progressInterval) comes within seconds.
	time.Sleep(6 * time.Second)
	restart, _ := r.c.Writes.Since(before)
	t.Logf("controller restart: %d writes besides Lease renewals\n%s", withoutLeases(restart), localcluster.Format(restart))
	if n := withoutLeases(restart); n > 0 {
		t.Errorf("a controller restart with a formed, attached volume caused %d writes, want 0", n)
	}
	if after := r.rv("writes-3d"); after.ResourceVersion != rvBefore {
		t.Errorf("the volume's status moved across a controller restart (phase %s): its resourceVersion %s → %s", after.Status.Phase, rvBefore, after.ResourceVersion)
	}
	before = r.c.Writes.Snapshot()
	r.detach("writes-3d", node)
	r.settled()
	detach, _ := r.c.Writes.Since(before)
	t.Logf("detach: %d writes besides Lease renewals\n%s", withoutLeases(detach), localcluster.Format(detach))
	before = r.c.Writes.Snapshot()
	r.deleteVolume("writes-3d")
	r.settled()
	deletion, _ := r.c.Writes.Since(before)
	n = withoutLeases(deletion) - deletion[poolStatusWrites]
	t.Logf("delete: %d writes besides Lease renewals and the pool's status (%d)\n%s", n, deletion[poolStatusWrites], localcluster.Format(deletion))
	if n > deleteBudget {
		t.Errorf("a 3D delete took %d writes, more than its budget of %d (docs/controller.md, \"Write budget\")", n, deleteBudget)
	}
}

// volumeReconciles is how many times the in-process controllers' volume reconciler
// has run (controller-runtime's controller_runtime_reconcile_total, which a restarted
// controller goes on counting).
func volumeReconciles(t *testing.T) int {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		if mf.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == "volume" {
					n += int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return n
}

// idle is what the agents did, counted by their metrics.
type idle struct{ reconciles, commands, passes int }

func (i idle) minus(b idle) idle {
	return idle{i.reconciles - b.reconciles, i.commands - b.commands, i.passes - b.passes}
}

func idleWork(t *testing.T) idle {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out idle
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "controller_runtime_reconcile_total":
				for _, l := range m.GetLabel() {
					if l.GetName() == "controller" && l.GetValue() == "meshvol-agent" {
						out.reconciles += int(m.GetCounter().GetValue())
					}
				}
			case "meshvol_agent_drbd_command_duration_seconds":
				out.commands += int(m.GetHistogram().GetSampleCount())
			case "meshvol_agent_collector_passes_total":
				out.passes += int(m.GetCounter().GetValue())
			}
		}
	}
	return out
}

// poolStatusWrites is the Writes key of the controller's writes of a pool's status.
const poolStatusWrites = "controller PATCH replicatedstoragepools/status"

// settled waits until nothing but Lease renewals has been written for 3 s (the
// agents' ProgressInterval here is 2 s): what an operation set off — an Event the
// recorder sends after it, a report paced as progress, the pool's status following
// the capacity its backing volumes moved — is counted with it, not with the next.
func (r *rig) settled() {
	r.t.Helper()
	const quiet = 3 * time.Second
	before, last := r.c.Writes.Snapshot(), time.Now()
	r.eventually("the writes settled", time.Minute, func() string {
		if since, _ := r.c.Writes.Since(before); withoutLeases(since) > 0 {
			before, last = r.c.Writes.Snapshot(), time.Now()
		}
		if d := time.Since(last); d < quiet {
			return fmt.Sprintf("written %s ago", d.Round(100*time.Millisecond))
		}
		return ""
	})
}

// withoutLeases totals counts but the agents' Lease renewals, which are a function of
// time, not of the operation.
func withoutLeases(counts map[string]int) int {
	n := 0
	for k, v := range counts {
		if !strings.HasSuffix(k, " leases") {
			n += v
		}
	}
	return n
}

// statusHistory watches the volume called name and its replicas from now on and
// returns a function that lists their status writes so far: the time since the
// watch began, which fields of the status moved, and for the RV its phase, datamesh
// revision, members and transitions and the Ready condition's message.
func (r *rig) statusHistory(name string) func() []string {
	r.t.Helper()
	cl, err := client.NewWithWatch(r.c.Env.Config, client.Options{Scheme: r.c.Env.Scheme})
	r.must(err)
	rvs, err := cl.Watch(r.ctx, &v1.ReplicatedVolumeList{}, client.MatchingFields{"metadata.name": name})
	r.must(err)
	r.t.Cleanup(rvs.Stop)
	rvrs, err := cl.Watch(r.ctx, &v1.ReplicatedVolumeReplicaList{}, client.MatchingLabels{v1.LabelVolume: name})
	r.must(err)
	r.t.Cleanup(rvrs.Stop)
	var mu sync.Mutex
	var out []string
	start := time.Now()
	last := map[string]any{} // object → its last status, as JSON
	record := func(key string, status any, detail string) {
		mu.Lock()
		defer mu.Unlock()
		cur := asJSON(status)
		prev, seen := last[key]
		moved := changedPaths("", prev, cur)
		if seen && len(moved) == 0 {
			return
		}
		last[key] = cur
		slices.Sort(moved)
		if n := len(moved); n > 12 {
			moved = append(moved[:12], fmt.Sprintf("and %d more", n-12))
		}
		out = append(out, fmt.Sprintf("  %6.2fs %s: %s moved%s", time.Since(start).Seconds(), key, strings.Join(moved, ", "), detail))
	}
	go func() {
		for ev := range rvs.ResultChan() {
			if rv, ok := ev.Object.(*v1.ReplicatedVolume); ok {
				detail := fmt.Sprintf("; %s revision %d, %d members, %d transitions", rv.Status.Phase,
					rv.Status.DatameshRevision, len(rv.Status.Datamesh.Members), len(rv.Status.DatameshTransitions))
				if c := meta.FindStatusCondition(rv.Status.Conditions, v1.ConditionReady); c != nil {
					detail += "; Ready: " + c.Message
				}
				record("RV", rv.Status, detail)
			}
		}
	}()
	go func() {
		for ev := range rvrs.ResultChan() {
			if rvr, ok := ev.Object.(*v1.ReplicatedVolumeReplica); ok {
				record("RVR "+rvr.Name+" ("+rvr.Spec.NodeName+")", rvr.Status, "")
			}
		}
	}()
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(out)
	}
}

// changedPaths lists the JSON paths of the values that differ between a and b
// (objects by key, lists by index), e.g. "datameshTransitions[0].steps[1].status".
func changedPaths(at string, a, b any) []string {
	switch b := b.(type) {
	case map[string]any:
		a, _ := a.(map[string]any)
		var out []string
		for k := range b {
			out = append(out, changedPaths(join(at, k), a[k], b[k])...)
		}
		for k := range a {
			if _, ok := b[k]; !ok {
				out = append(out, join(at, k))
			}
		}
		return out
	case []any:
		a, _ := a.([]any)
		var out []string
		for i := range max(len(a), len(b)) {
			var x, y any
			if i < len(a) {
				x = a[i]
			}
			if i < len(b) {
				y = b[i]
			}
			out = append(out, changedPaths(fmt.Sprintf("%s[%d]", at, i), x, y)...)
		}
		return out
	}
	if equality.Semantic.DeepEqual(a, b) {
		return nil
	}
	return []string{at}
}

func join(at, key string) string {
	if at == "" {
		return key
	}
	return at + "." + key
}

// asJSON is a status as a JSON object's fields (a status always marshals; the
// watches' goroutines may outlive the test, so nothing here reports to it).
func asJSON(v any) any {
	b, _ := json.Marshal(v)
	var m any
	_ = json.Unmarshal(b, &m)
	return m
}
