package soak_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
)

// What the campaign checks, from the simulated kernels (drbdsim's own records), the
// filesystems and the apiserver — never from what meshvol says about itself alone:
//
// After every step, for every volume:
//   - no UpToDate replica that has quorum lacks an acknowledged block write
//     (drbdsim.LostAckedWrites: every write any Primary acknowledged, the
//     filesystem's included);
//   - no two nodes could both write at any moment since the seed began without
//     replicating to each other (drbdsim.TwoWriters, recorded at every state change
//     of the simulated cluster);
//   - no connection ever ended in a split brain (drbdsim.Diverged).
//
// Whenever a filesystem is mounted (after every attach, move and restart of a
// session), every file write the workload had acknowledged reads back.
//
// At the end, after healing every fault (network healed, nodes and agents back, the
// controller running): every volume is Ready, or its Ready condition says why not;
// every acknowledged file write reads back once more; the UpToDate replicas of each
// volume are byte-identical; and every volume deleted during the seed, and every one
// deleted at its end, has left nothing behind (no RV, RVR, RVA or Secret, no DRBD
// resource on any node, no backing file).

func (w *world) checkNow() {
	for _, v := range w.vols {
		w.checkKernels(v.name)
	}
	for _, name := range w.deleted {
		w.checkKernels(name)
	}
	w.checkStale()
	w.stats.checks++
}

// checkStale: a workload left behind an isolation acknowledged no write once a
// workload on the majority side had acknowledged one (two writers, seen from the
// filesystems).
func (w *world) checkStale() {
	w.mu.Lock()
	var bad string
	for _, a := range w.staleAcks {
		for _, v := range w.vols {
			if v.name == a.vol && !v.newerAck.IsZero() && a.at.After(v.newerAck) && bad == "" {
				bad = fmt.Sprintf("%s: the isolated workload on %s acknowledged seq %d (slot %d) %s after the majority side's first acknowledged write: two writers",
					a.vol, a.node, a.seq, a.slot, a.at.Sub(v.newerAck).Round(time.Millisecond))
			}
		}
	}
	w.mu.Unlock()
	if bad != "" {
		w.fail("%s", bad)
	}
}

func (w *world) checkKernels(name string) {
	if lost := w.c.Sim.LostAckedWrites(name); len(lost) > 0 {
		w.fail("%s: acknowledged writes lost: %v", name, lost)
	}
	if two := w.c.Sim.TwoWriters(name); len(two) > 0 {
		w.fail("%s: two writers: %v", name, two)
	}
	if bad, msgs := w.c.Sim.Diverged(name); bad {
		w.fail("%s: split brain: %v", name, msgs)
	}
}

// heal ends every fault: the network heals, crashed nodes restart, cut agents return,
// the controller runs.
func (w *world) heal() {
	w.step("heal: every fault ends")
	w.c.Heal()
	w.partitioned, w.slowLinks = nil, false
	w.endIsolations()
	for _, n := range w.nodeNames() {
		switch {
		case w.crashed[n]:
			if err := w.c.RestartNode(n); err != nil {
				w.step("restart %s: %v", n, err)
			}
		case w.agentStopped[n]:
			if err := w.c.RestartAgent(n); err != nil {
				w.step("restart agent %s: %v", n, err)
			}
		}
	}
	clear(w.crashed)
	clear(w.agentStopped)
	w.c.StartController()
}

func (w *world) checkEnd() {
	// Every volume settles: Ready, or it says why not. One that does not settle is a
	// finding (liveness), reported with the seed's history; its acknowledged writes
	// are still checked on its replicas (checkNow) and it must still delete cleanly.
	ready := map[string]bool{}
	// As long as the seed ran, between 30 s and 2 min: the short seed of `make test`
	// must stay short when a volume does not settle.
	wait := min(2*time.Minute, max(30*time.Second, *flagDuration))
	for _, v := range w.vols {
		why := w.waitReady(v.name, wait)
		ready[v.name] = why == "Ready"
		w.step("end: %s %s", v.name, why)
	}
	w.checkNow()
	// Every attachment of a Ready volume mounts once more and every acknowledged
	// write reads back.
	for _, v := range w.vols {
		if v.node == "" || !ready[v.name] {
			continue
		}
		if v.sess != nil {
			w.deactivate(v)
		}
		w.step("end: remount %s on %s: %s", v.name, v.node, w.activate(v, time.Minute))
		if v.sess == nil {
			w.fail("%s is Ready, but its attachment on %s does not come back after healing", v.name, v.node)
		}
		w.step("end: %s: %s", v.name, w.deactivate(v))
	}
	for _, v := range w.vols {
		w.sameReplicas(v)
	}
	w.noteExits()
	if len(ready) > 0 && slices.Contains(slices.Collect(maps.Values(ready)), false) {
		w.t.Logf("%s: a volume did not return to Ready after healing (it says why); replay: %s\nhistory:\n  %s\nstate:\n%s",
			w.t.Name(), w.replay(), strings.Join(w.history, "\n  "), w.dump())
	}
	// Delete everything; nothing may be left.
	for _, v := range w.vols {
		w.deactivate(v)
		if v.node != "" {
			w.detachVol(v)
		}
		if err := w.c.Client.Delete(w.ctx, &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: v.name}}); err != nil && !apierrors.IsNotFound(err) {
			w.fail("delete %s: %v", v.name, err)
		}
		w.deleted = append(w.deleted, v.name)
	}
	w.vols = nil
	for _, name := range w.deleted {
		w.gone(name, 2*time.Minute)
	}
}

// waitReady waits until the volume is Ready with no transition in flight; otherwise
// its Ready condition must say why.
func (w *world) waitReady(name string, d time.Duration) string {
	var rv v1.ReplicatedVolume
	deadline := time.Now().Add(d)
	for {
		if err := w.c.Client.Get(w.ctx, client.ObjectKey{Name: name}, &rv); err != nil {
			w.fail("%s: %v", name, err)
		}
		if rv.Status.Phase == v1.VolumePhaseReady && len(rv.Status.DatameshTransitions) == 0 {
			return "Ready"
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	c := meta.FindStatusCondition(rv.Status.Conditions, v1.ConditionReady)
	if c == nil || c.Status == "True" || strings.TrimSpace(c.Message) == "" {
		w.fail("%s is not Ready %s after healing (phase %s, %d transitions) and does not say why: %+v", name, d, rv.Status.Phase, len(rv.Status.DatameshTransitions), c)
	}
	w.stats.count("end not-ready")
	return fmt.Sprintf("not Ready after %s: %s: %s", d, c.Reason, c.Message)
}

// sameReplicas compares the data of the volume's UpToDate replicas byte for byte once
// every replica is connected to every peer and no resync runs (the DRBD device's size, from the front of each backing file: its
// metadata is internal, at the end).
func (w *world) sameReplicas(v *vol) {
	var paths map[string]string // node → backing file of an UpToDate replica
	var size int64
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		paths, size = map[string]string{}, 0
		settled := true
		for _, n := range w.c.Nodes {
			st, err := n.Sim.Status(w.ctx, v.name)
			if err != nil || len(st) != 1 || len(st[0].Devices) != 1 {
				continue
			}
			// After healing every replica is connected to every peer with no resync
			// running; one still reconnecting (DRBD retries every connect-int) may
			// show a stale UpToDate.
			for _, c := range st[0].Connections {
				settled = settled && c.ConnectionState == "Connected"
				for _, p := range c.PeerDevices {
					settled = settled && p.ReplicationState == "Established"
				}
			}
			d := st[0].Devices[0]
			sh, err := n.Show(w.ctx, v.name)
			if d.DiskState != "UpToDate" || err != nil || sh == nil || len(sh.ThisHost.Volumes) != 1 {
				continue
			}
			if size == 0 || d.Size*1024 < size {
				size = d.Size * 1024
			}
			paths[n.Name] = sh.ThisHost.Volumes[0].BackingDisk
		}
		if settled {
			break
		}
		if time.Now().After(deadline) {
			w.fail("%s: its replicas are not all connected and in sync a minute after healing", v.name)
		}
	}
	first, want := "", [32]byte{}
	for _, n := range slices.Sorted(maps.Keys(paths)) {
		got := hashPrefix(w, paths[n], size)
		if first == "" {
			first, want = n, got
			continue
		}
		if !bytes.Equal(got[:], want[:]) {
			w.fail("%s: UpToDate replicas on %s and %s differ in their first %d bytes", v.name, first, n, size)
		}
	}
	w.stats.compared += len(paths)
	w.step("end: %s: %d UpToDate replicas identical", v.name, len(paths))
}

func hashPrefix(w *world, path string, size int64) [32]byte {
	f, err := os.Open(path)
	if err != nil {
		w.fail("%v", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(f, size)); err != nil {
		w.fail("%v", err)
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// gone waits until nothing of the volume is left anywhere.
func (w *world) gone(name string, d time.Duration) {
	deadline := time.Now().Add(d)
	last := ""
	for time.Now().Before(deadline) {
		if last = w.leftOf(name); last == "" {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	w.fail("%s deleted, but after %s: %s", name, d, last)
}

func (w *world) leftOf(name string) string {
	if err := w.c.Client.Get(w.ctx, client.ObjectKey{Name: name}, &v1.ReplicatedVolume{}); !apierrors.IsNotFound(err) {
		return "RV still exists"
	}
	var rvrs v1.ReplicatedVolumeReplicaList
	if err := w.c.Client.List(w.ctx, &rvrs, client.MatchingLabels{v1.LabelVolume: name}); err != nil || len(rvrs.Items) > 0 {
		return fmt.Sprintf("%d RVRs left (%v)", len(rvrs.Items), err)
	}
	var rvas v1.ReplicatedVolumeAttachmentList
	if err := w.c.Client.List(w.ctx, &rvas, client.MatchingLabels{v1.LabelVolume: name}); err != nil || len(rvas.Items) > 0 {
		return fmt.Sprintf("%d RVAs left (%v)", len(rvas.Items), err)
	}
	if err := w.c.Client.Get(w.ctx, client.ObjectKey{Namespace: w.c.Namespace, Name: controller.SecretName(name)}, &corev1.Secret{}); err == nil {
		return "Secret left"
	}
	for _, n := range w.c.Nodes {
		res, _ := n.Resources(w.ctx)
		if slices.Contains(res, name) {
			return "DRBD resource left on " + n.Name
		}
		for _, f := range n.Files() {
			if strings.Contains(f, "/"+name+"-") {
				return "backing file left: " + f
			}
		}
	}
	return ""
}

// stats are a seed's (or the campaign's) figures.
type stats struct {
	seeds            int
	minutes          float64
	steps            map[string]int
	acked, checked   int64
	checks, compared int
}

func (s *stats) count(kind string) {
	if s.steps == nil {
		s.steps = map[string]int{}
	}
	s.steps[kind]++
}

func (s *stats) add(o stats) {
	s.seeds += o.seeds
	s.minutes += o.minutes
	s.acked += o.acked
	s.checked += o.checked
	s.checks += o.checks
	s.compared += o.compared
	if s.steps == nil {
		s.steps = map[string]int{}
	}
	for k, n := range o.steps {
		s.steps[k] += n
	}
}

func (s stats) String() string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(s.steps)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, s.steps[k]))
	}
	return fmt.Sprintf("%d seeds, %.1f seed-minutes; %s; %d file writes acknowledged, %d read back and checked; %d invariant checks; %d UpToDate replicas compared",
		s.seeds, s.minutes, strings.Join(parts, ", "), s.acked, s.checked, s.checks, s.compared)
}

// dump describes every volume as the apiserver and the simulated kernels see it, for
// a failure's report.
func (w *world) dump() string {
	var b strings.Builder
	names := append([]string{}, w.deleted...)
	for _, v := range w.vols {
		names = append(names, v.name)
	}
	for _, name := range names {
		rv := &v1.ReplicatedVolume{}
		if err := w.c.Client.Get(w.ctx, client.ObjectKey{Name: name}, rv); err != nil {
			fmt.Fprintf(&b, "  %s: %v\n", name, err)
			continue
		}
		fmt.Fprintf(&b, "  %s: phase %s, revision %d, q %d qmr %d, layout %+v\n", name, rv.Status.Phase, rv.Status.DatameshRevision,
			rv.Status.Datamesh.Quorum, rv.Status.Datamesh.QuorumMinimumRedundancy, rv.Status.EffectiveLayout)
		for _, c := range rv.Status.Conditions {
			fmt.Fprintf(&b, "    condition %s=%s %s: %s\n", c.Type, c.Status, c.Reason, c.Message)
		}
		for _, m := range rv.Status.Datamesh.Members {
			fmt.Fprintf(&b, "    member %s %s node-id %d attached %v\n", m.Name, m.Type, m.NodeID, m.Attached)
		}
		for _, t := range rv.Status.DatameshTransitions {
			fmt.Fprintf(&b, "    transition %s %s: %+v\n", t.Type, t.ReplicaName, t.Steps)
		}
		for _, q := range rv.Status.DatameshReplicaRequests {
			fmt.Fprintf(&b, "    request %s %s: %s\n", q.Name, q.Operation, q.Message)
		}
		var rvrs v1.ReplicatedVolumeReplicaList
		_ = w.c.Client.List(w.ctx, &rvrs, client.MatchingLabels{v1.LabelVolume: name})
		for _, r := range rvrs.Items {
			fmt.Fprintf(&b, "    replica %s %s deleting %v: revision %d disk %s role %s quorum %v\n", r.Name, r.Spec.Type, r.DeletionTimestamp != nil,
				r.Status.DatameshRevision, r.Status.DiskState, r.Status.Role, r.Status.Quorum)
			for _, c := range r.Status.Conditions {
				if c.Status != "True" {
					fmt.Fprintf(&b, "      %s=%s %s: %s\n", c.Type, c.Status, c.Reason, c.Message)
				}
			}
		}
		for _, n := range w.c.Nodes {
			st, err := n.Sim.Status(w.ctx, name)
			if err != nil || len(st) != 1 {
				continue
			}
			fmt.Fprintf(&b, "    drbd %s: role %s", n.Name, st[0].Role)
			for _, d := range st[0].Devices {
				fmt.Fprintf(&b, " disk %s quorum %v", d.DiskState, d.Quorum)
			}
			for _, c := range st[0].Connections {
				fmt.Fprintf(&b, "; %s %s", c.Name, c.ConnectionState)
				for _, p := range c.PeerDevices {
					fmt.Fprintf(&b, " %s/%s", p.PeerDiskState, p.ReplicationState)
				}
			}
			b.WriteString("\n")
			fmt.Fprintf(&b, "      %s\n", n.Sim.QuorumView(name))
		}
	}
	return b.String()
}
