package cluster_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/testenv"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/kubectlmeshvol"
)

// TestNodeMaintenance runs `kubectl meshvol drain` and `uncordon` through every
// phase (docs/operating.md, "Node maintenance"): draining the node of a 1D
// volume's only copy while every other node is cordoned (no node can take a copy)
// is refused, naming it, and leaves nothing behind; draining a
// Diskful node of an attached 2D+1TB volume first copies it to a third Diskful
// node (2D+1TB loses DRBD's quorum without the node once the lost-peer agreement has
// run: docs/operating.md, "A volume attached nowhere while a node is away"), then
// waits in Draining until the volume detaches, then says the node may go down; the
// node crashes and stays away past the grace period without its member being
// force-removed or replaced (other nodes could take one) — the volume Ready, its
// configuration's two Diskful replicas UpToDate on other nodes —, the volume attached
// nowhere keeps quorum on its survivors and is then attached on one of them, and a
// drain of another node is refused (one node at a time); it returns, resyncs, the
// maintenance completes and the volume goes back to 2D+1TB.
// Then the TieBreaker's node, drained with --max-downtime 5s, stays down past it:
// the maintenance Fails, the node is lost and its member force-removed, and
// uncordon reports the failure.
func TestNodeMaintenance(t *testing.T) {
	r := newRig(t)
	kc := r.kubeconfig()
	const vol, only = "maint-2d1tb", "maint-1d"
	r.volume(only, r.class(0, 0, v1.TopologyIgnored), 1)
	all, diskful := r.formed2D1TB(vol)
	onlyNode := r.ready(only, 2*time.Minute).Status.Datamesh.Members[0].NodeName
	var timeline bytes.Buffer

	// Refused: the node holds the 1D volume's only copy, and no other node may take a
	// copy (TestNodeMaintenanceCopies drains it when one may).
	uncordonOthers := r.cordonAllBut(onlyNode)
	out, err := r.pluginErr(kc, "drain", onlyNode, "--timeout", "2m")
	uncordonOthers()
	timeline.WriteString("$ kubectl meshvol drain " + onlyNode + " (every other node cordoned)\n" + out)
	if !errors.Is(err, kubectlmeshvol.ErrBlocked) || !strings.Contains(err.Error(), "blocking volumes: "+only) ||
		!strings.Contains(err.Error(), "no node can take a copy") {
		t.Fatalf("drain of %s, the only copy of %s: %v\n%s", onlyNode, only, err, out)
	}
	timeline.WriteString("error: " + err.Error() + "\n")
	if err := r.cl.Get(r.ctx, client.ObjectKey{Name: onlyNode}, &v1.ReplicatedNodeMaintenance{}); !apierrors.IsNotFound(err) {
		t.Errorf("a refused drain left its maintenance behind: %v", err)
	}
	if l := r.nodeLabel(onlyNode); l != "" {
		t.Errorf("a refused drain left node %s cordoned (%s=%q)", onlyNode, v1.LabelCordon, l)
	}
	r.deleteVolume(only)

	// Draining until the attached volume detaches, then ReadyForMaintenance.
	node := diskful[0]
	r.attach(vol, node)
	var drainOut testenv.LockedBuffer
	var drainErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		drainErr = r.pluginTo(kc, &drainOut, "drain", node, "--timeout", "3m")
	}()
	copying := "Draining: Copying the volumes that need node " + node + " to another node first: " + vol +
		": a copy elsewhere is asked for, 2D+1TB raised to 3D while the maintenance lasts (a full sync of each new Diskful replica)"
	draining := "Draining: Waiting for the volumes attached on node " + node + " to detach: " + vol
	// The volume detaches only once the maintenance is Draining on it (or the
	// controller would judge the node free at once) and the plugin has printed that;
	// the copy comes first.
	r.eventually("kubectl meshvol drain "+node+" following Draining on "+vol, 2*time.Minute, func() string {
		m := &v1.ReplicatedNodeMaintenance{}
		if err := r.cl.Get(r.ctx, client.ObjectKey{Name: node}, m); err != nil {
			return err.Error()
		}
		if m.Status.Phase != v1.MaintenanceDraining || !slices.Equal(m.Status.AttachedVolumes, []string{vol}) {
			return string(m.Status.Phase) + ": " + m.Status.Message
		}
		if out := drainOut.String(); !strings.Contains(out, draining) || !strings.Contains(out, copying) {
			return "the plugin has not printed the copy and Draining yet:\n" + out
		}
		return ""
	})
	if l := r.nodeLabel(node); l != "maintenance" {
		t.Errorf("draining node %s is not cordoned for meshvol: %s=%q", node, v1.LabelCordon, l)
	}
	r.detach(vol, node)
	wg.Wait()
	timeline.WriteString("$ kubectl meshvol drain " + node + "\n" + drainOut.String())
	if drainErr != nil || !strings.Contains(drainOut.String(), "ReadyForMaintenance: Node "+node+" may be taken down") {
		t.Fatalf("drain %s: %v\n%s", node, drainErr, drainOut.String())
	}

	// ReadyForMaintenance was judged on the raised layout: 3D, the copy UpToDate.
	// Its replicas are all the volume may have while the node is away.
	cur := r.rv(vol)
	if cur.Status.Layout != "3D" {
		t.Fatalf("ReadyForMaintenance with %s at layout %s, want 3D: %s", vol, cur.Status.Layout, phase(cur))
	}
	var placed, survivors []string
	for _, rvr := range r.rvrs(vol) {
		placed = append(placed, rvr.Spec.NodeName)
		if rvr.Spec.NodeName != node && rvr.Spec.Type == v1.ReplicaTypeDiskful {
			survivors = append(survivors, rvr.Spec.NodeName)
		}
		if rvr.Spec.NodeName != node && rvr.Spec.Type == v1.ReplicaTypeDiskful && rvr.Status.DiskState != v1.DiskStateUpToDate {
			t.Errorf("ReadyForMaintenance with %s on %s %s", rvr.Name, rvr.Spec.NodeName, rvr.Status.DiskState)
		}
	}
	if len(survivors) != 2 {
		t.Fatalf("ReadyForMaintenance with Diskful replicas of %s outside %s on %v, want two", vol, node, survivors)
	}
	timeline.WriteString("(" + vol + " copied: layout 3D, Diskful on " + strings.Join(survivors, ", ") + " besides " + node + ")\n")

	// The node goes down with the volume attached nowhere, and past the grace period
	// its member stays. The volume is Ready, not Degraded: the copy gives it the two
	// UpToDate Diskful replicas its configuration asks for while the node is away.
	r.must(r.c.CrashNode(node))
	crashed := time.Now()
	t.Cleanup(func() { _ = r.c.RestartNode(node) })
	replica := v1.ReplicaName(vol, node)
	r.eventually(vol+" Ready with "+node+" judged lost", 2*time.Minute, func() string {
		cur := r.rv(vol)
		rvr := &v1.ReplicatedVolumeReplica{}
		if err := r.cl.Get(r.ctx, client.ObjectKey{Name: replica}, rvr); err != nil {
			return err.Error()
		}
		if cur.Status.Phase != v1.VolumePhaseReady || rvr.Status.Conditions == nil {
			return phase(cur)
		}
		for _, c := range rvr.Status.Conditions {
			if c.Type == v1.ConditionAgentReady && c.Status == "False" {
				return ""
			}
		}
		return "the controller has not judged " + node + " lost yet"
	})
	// A lost node's member is force-removed within a second or two of the verdict
	// (TestPluginShowsDegraded2D1TB sees the ForceLeave request at once): give it
	// five times that.
	time.Sleep(10 * time.Second)
	cur = r.rv(vol)
	if !slices.ContainsFunc(cur.Status.Datamesh.Members, func(m v1.DatameshMember) bool { return m.Name == replica }) {
		t.Errorf("the member on %s, away for maintenance, was removed: %s", node, phase(cur))
	}
	for _, q := range cur.Status.DatameshReplicaRequests {
		if q.Operation == v1.ReplicaOperationForceLeave {
			t.Errorf("a ForceLeave was requested for %s while its node is away for maintenance: %+v", q.Name, q)
		}
	}
	for _, rvr := range r.rvrs(vol) {
		if !slices.Contains(placed, rvr.Spec.NodeName) {
			t.Errorf("a replacement replica %s was placed on %s while %s is away for maintenance", rvr.Name, rvr.Spec.NodeName, node)
		}
	}
	timeline.WriteString("(node " + node + " crashed; " + time.Since(crashed).Round(time.Second).String() + " later: phase " +
		string(cur.Status.Phase) + ", member " + replica + " kept, no ForceLeave, no replacement)\n")

	// Attached nowhere, the survivors keep quorum long after DRBD's lost-peer
	// agreement among them, and the volume attaches on one: the promotion works.
	if slices.ContainsFunc(cur.Status.Datamesh.Members, func(m v1.DatameshMember) bool { return m.Attached }) {
		t.Fatalf("%s is attached while %s is away: %+v", vol, node, cur.Status.Datamesh.Members)
	}
	for _, n := range survivors {
		if why := r.quorate(vol, n); why != "" {
			t.Errorf("%s on %s, attached nowhere, %s away: %s", vol, n, node, why)
		}
	}
	survivor := survivors[1]
	r.attach(vol, survivor)
	timeline.WriteString("(" + vol + " attached nowhere: quorate on " + strings.Join(survivors, " and ") + "; attached on " + survivor + ", Primary)\n")

	// Refused: one node at a time.
	tb := ""
	for _, n := range all {
		if !slices.Contains(diskful, n) {
			tb = n
		}
	}
	out, err = r.pluginErr(kc, "drain", tb, "--timeout", "1m")
	timeline.WriteString("$ kubectl meshvol drain " + tb + "\n" + out)
	if !errors.Is(err, kubectlmeshvol.ErrBlocked) || !strings.Contains(err.Error(), "Node "+node+" is in maintenance: one node at a time") {
		t.Fatalf("drain of %s while %s is away: %v\n%s", tb, node, err, out)
	}
	timeline.WriteString("error: " + err.Error() + "\n")

	// Back: restart, uncordon, resync, Completed.
	r.must(r.c.RestartNode(node))
	out, err = r.pluginErr(kc, "uncordon", node, "--timeout", "3m")
	timeline.WriteString("$ kubectl meshvol uncordon " + node + "\n" + out)
	if err != nil || !strings.Contains(out, "Completed: Node "+node+" is back") {
		t.Fatalf("uncordon %s: %v\n%s", node, err, out)
	}
	m := &v1.ReplicatedNodeMaintenance{}
	r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: node}, m))
	if m.Status.Phase != v1.MaintenanceCompleted {
		t.Errorf("maintenance after uncordon: %s %s", m.Status.Phase, m.Status.Message)
	}
	if l := r.nodeLabel(node); l != "" {
		t.Errorf("uncordon left node %s cordoned (%s=%q)", node, v1.LabelCordon, l)
	}
	r.eventually(vol+" back to 2D+1TB", 3*time.Minute, func() string {
		cur := r.rv(vol)
		if cur.Status.Phase != v1.VolumePhaseReady || len(cur.Status.DatameshTransitions) > 0 || cur.Status.Layout != "2D+1TB" {
			return phase(cur)
		}
		return ""
	})
	r.must(r.cl.Delete(r.ctx, m))

	// Failed: the TieBreaker's node, drained with --max-downtime, stays away past it;
	// it is lost then, and its member is force-removed as any lost node's. Back to
	// 2D+1TB, the volume's TieBreaker may be on another node than before the copy.
	for _, mem := range r.rv(vol).Status.Datamesh.Members {
		if mem.Type == v1.MemberTypeTieBreaker {
			tb = mem.NodeName
		}
	}
	out, err = r.pluginErr(kc, "drain", tb, "--max-downtime", "5s", "--timeout", "2m")
	timeline.WriteString("$ kubectl meshvol drain " + tb + " --max-downtime 5s\n" + out)
	if err != nil || !strings.Contains(out, "ReadyForMaintenance: Node "+tb+" may be taken down") {
		t.Fatalf("drain %s: %v\n%s", tb, err, out)
	}
	r.must(r.c.CrashNode(tb))
	t.Cleanup(func() { _ = r.c.RestartNode(tb) })
	tbReplica := v1.ReplicaName(vol, tb)
	r.eventually("maintenance of "+tb+" Failed and its member force-removed", 2*time.Minute, func() string {
		m := &v1.ReplicatedNodeMaintenance{}
		r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: tb}, m))
		if m.Status.Phase != v1.MaintenanceFailed || !strings.Contains(m.Status.Message, "longer than spec.maxDowntime 5s") {
			return string(m.Status.Phase) + ": " + m.Status.Message
		}
		cur := r.rv(vol)
		if slices.ContainsFunc(cur.Status.Datamesh.Members, func(m v1.DatameshMember) bool { return m.Name == tbReplica }) &&
			!slices.ContainsFunc(cur.Status.DatameshReplicaRequests, func(q v1.DatameshReplicaRequest) bool {
				return q.Name == tbReplica && q.Operation == v1.ReplicaOperationForceLeave
			}) {
			return "the member on " + tb + " is neither removed nor asked to ForceLeave: " + phase(cur)
		}
		return ""
	})
	r.must(r.c.RestartNode(tb))
	out, err = r.pluginErr(kc, "uncordon", tb, "--timeout", "1m")
	timeline.WriteString("(node " + tb + " crashed, Failed, its member force-removed; restarted)\n$ kubectl meshvol uncordon " + tb + "\n" + out)
	if !errors.Is(err, kubectlmeshvol.ErrFailed) || !strings.Contains(err.Error(), "longer than spec.maxDowntime 5s") {
		t.Fatalf("uncordon of the failed maintenance of %s: %v\n%s", tb, err, out)
	}
	timeline.WriteString("error: " + err.Error() + "\n")
	if l := r.nodeLabel(tb); l != "" {
		t.Errorf("uncordon of a failed maintenance left node %s cordoned (%s=%q)", tb, v1.LabelCordon, l)
	}
	r.ready(vol, 2*time.Minute)
	t.Logf("maintenance timeline:\n%s", timeline.String())
	r.must(r.cl.Delete(r.ctx, &v1.ReplicatedNodeMaintenance{ObjectMeta: metav1.ObjectMeta{Name: tb}}))
	r.detach(vol, survivor)
	r.deleteVolume(vol)
}

// pluginErr runs the plugin as plugin does and returns its output and error.
func (r *rig) pluginErr(kc pluginConfig, args ...string) (string, error) {
	var out bytes.Buffer
	err := r.pluginTo(kc, &out, args...)
	return out.String(), err
}

// pluginTo runs the plugin as plugin does, writing its output to out.
func (r *rig) pluginTo(kc pluginConfig, out io.Writer, args ...string) error {
	var errOut bytes.Buffer
	return kubectlmeshvol.Run(r.ctx, append(args, "--kubeconfig", kc.path, "--context", kc.context), out, &errOut)
}

// nodeLabel is the node's meshvol cordon label ("" when absent).
func (r *rig) nodeLabel(node string) string {
	n := &corev1.Node{}
	r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: node}, n))
	return n.Labels[v1.LabelCordon]
}

// TestNodeMaintenanceCopies drains the node of a 1D volume's only copy when other
// nodes may take one (docs/operating.md, "Copying a volume elsewhere before its node
// goes"): the maintenance is Draining, naming the copy, while the volume becomes 3D
// (2D+1TB would lose DRBD's quorum once the node is away: "A volume attached nowhere
// while a node is away"), and ReadyForMaintenance only once the copies are UpToDate;
// the node crashes, the copies keep quorum with the volume attached nowhere, and the
// volume attaches on a copy's node; the node returns, the maintenance completes, and
// the volume goes back to one Diskful replica.
func TestNodeMaintenanceCopies(t *testing.T) {
	r := newRig(t)
	kc := r.kubeconfig()
	const vol = "maint-copy-1d"
	r.volume(vol, r.class(0, 0, v1.TopologyIgnored), 1)
	node := r.ready(vol, 2*time.Minute).Status.Datamesh.Members[0].NodeName

	out, err := r.pluginErr(kc, "drain", node, "--timeout", "3m")
	if err != nil || !strings.Contains(out, "Draining: Copying the volumes that need node "+node+" to another node first: "+vol+
		": a copy elsewhere is asked for, 1D raised to 3D while the maintenance lasts (a full sync of each new Diskful replica)") ||
		!strings.Contains(out, "ReadyForMaintenance: Node "+node+" may be taken down") {
		t.Fatalf("drain %s: %v\n%s", node, err, out)
	}
	t.Logf("$ kubectl meshvol drain %s\n%s", node, out)
	// ReadyForMaintenance was judged with the copy UpToDate and quorate; nothing
	// takes it away while the maintenance lasts.
	m := &v1.ReplicatedNodeMaintenance{}
	r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: node}, m))
	if !slices.Equal(m.Status.CopiedVolumes, []string{vol}) {
		t.Errorf("maintenance %s: copiedVolumes %v, want [%s]", node, m.Status.CopiedVolumes, vol)
	}
	var copyNodes []string
	cur := r.rv(vol)
	for _, mem := range cur.Status.Datamesh.Members {
		if mem.Type != v1.MemberTypeDiskful || mem.NodeName == node {
			continue
		}
		rvr := &v1.ReplicatedVolumeReplica{}
		r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: mem.Name}, rvr))
		if rvr.Status.DiskState != v1.DiskStateUpToDate {
			t.Errorf("ReadyForMaintenance with the copy %s %s", mem.Name, rvr.Status.DiskState)
		}
		copyNodes = append(copyNodes, mem.NodeName)
	}
	if len(copyNodes) != 2 || cur.Status.Layout != "3D" {
		t.Fatalf("ReadyForMaintenance without a copy elsewhere: %s, members %+v", phase(cur), cur.Status.Datamesh.Members)
	}

	// Away, attached nowhere, the copies keep quorum without the node, long after
	// DRBD's lost-peer agreement among them (the controller judges the node away only
	// past its grace period); then the volume attaches on a copy's node.
	r.must(r.c.CrashNode(node))
	t.Cleanup(func() { _ = r.c.RestartNode(node) })
	replica := v1.ReplicaName(vol, node)
	r.eventually(node+" judged away, "+vol+" quorate on "+strings.Join(copyNodes, " and "), 2*time.Minute, func() string {
		rvr := &v1.ReplicatedVolumeReplica{}
		r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: replica}, rvr))
		if c := meta.FindStatusCondition(rvr.Status.Conditions, v1.ConditionAgentReady); c == nil || c.Status != metav1.ConditionFalse {
			return "the controller has not judged " + node + " away yet"
		}
		for _, n := range copyNodes {
			if why := r.quorate(vol, n); why != "" {
				return n + ": " + why
			}
		}
		return ""
	})
	if cur := r.rv(vol); slices.ContainsFunc(cur.Status.Datamesh.Members, func(m v1.DatameshMember) bool { return m.Attached }) {
		t.Fatalf("%s is attached while %s is away: %+v", vol, node, cur.Status.Datamesh.Members)
	}
	copyNode := copyNodes[0]
	r.attach(vol, copyNode)

	// Back: Completed, then the volume goes back to 1D.
	r.must(r.c.RestartNode(node))
	out, err = r.pluginErr(kc, "uncordon", node, "--timeout", "3m")
	if err != nil || !strings.Contains(out, "Completed: Node "+node+" is back") {
		t.Fatalf("uncordon %s: %v\n%s", node, err, out)
	}
	t.Logf("$ kubectl meshvol uncordon %s\n%s", node, out)
	r.eventually(vol+" back to 1D", 3*time.Minute, func() string {
		cur := r.rv(vol)
		if cur.Status.Phase != v1.VolumePhaseReady || len(cur.Status.DatameshTransitions) > 0 || cur.Status.Layout != "1D" {
			return phase(cur)
		}
		if n := len(r.rvrs(vol)); n != 1 {
			return fmt.Sprintf("%d replicas left", n)
		}
		return ""
	})
	r.must(r.cl.Delete(r.ctx, m))
	r.detach(vol, copyNode)
	r.deleteVolume(vol)
}
