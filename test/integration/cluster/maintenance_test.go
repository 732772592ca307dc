package cluster_test

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/kubectlmeshvol"
)

// TestNodeMaintenance runs `kubectl meshvol drain` and `uncordon` through every
// phase (docs/operating.md, "Node maintenance"): draining the node of a 1D
// volume's only copy is refused, naming it, and leaves nothing behind; draining a
// Diskful node of an attached 2D+1TB volume waits in Draining until the volume
// detaches, then says the node may go down; the node crashes and stays away past
// the grace period without its member being force-removed or replaced (eight
// other nodes could take one); it returns, resyncs, and the maintenance completes.
func TestNodeMaintenance(t *testing.T) {
	r := newRig(t)
	kc := r.kubeconfig()
	const vol, only = "maint-2d1tb", "maint-1d"
	r.volume(vol, r.class(1, 0, v1.TopologyIgnored), 1)
	r.volume(only, r.class(0, 0, v1.TopologyIgnored), 1)
	rv := r.ready(vol, 2*time.Minute)
	onlyNode := r.ready(only, 2*time.Minute).Status.Datamesh.Members[0].NodeName
	members := map[string]bool{}
	var diskful []string
	for _, m := range rv.Status.Datamesh.Members {
		members[m.NodeName] = true
		if m.Type == v1.MemberTypeDiskful {
			diskful = append(diskful, m.NodeName)
		}
	}
	var timeline bytes.Buffer

	// Refused: the node holds the 1D volume's only copy.
	out, err := r.pluginErr(kc, "drain", onlyNode, "--timeout", "2m")
	timeline.WriteString("$ kubectl meshvol drain " + onlyNode + "\n" + out)
	if !errors.Is(err, kubectlmeshvol.ErrBlocked) || !strings.Contains(err.Error(), "blocking volumes: "+only) {
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
	var drainOut string
	var drainErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		drainOut, drainErr = r.pluginErr(kc, "drain", node, "--timeout", "3m")
	}()
	r.eventually("maintenance of "+node+" Draining on "+vol, time.Minute, func() string {
		m := &v1.ReplicatedNodeMaintenance{}
		if err := r.cl.Get(r.ctx, client.ObjectKey{Name: node}, m); err != nil {
			return err.Error()
		}
		if m.Status.Phase != v1.MaintenanceDraining || !slices.Equal(m.Status.AttachedVolumes, []string{vol}) {
			return string(m.Status.Phase) + ": " + m.Status.Message
		}
		return ""
	})
	if l := r.nodeLabel(node); l != "maintenance" {
		t.Errorf("draining node %s is not cordoned for meshvol: %s=%q", node, v1.LabelCordon, l)
	}
	r.detach(vol, node)
	wg.Wait()
	timeline.WriteString("$ kubectl meshvol drain " + node + "\n" + drainOut)
	if drainErr != nil || !strings.Contains(drainOut, "Draining: Waiting for the volumes attached on node "+node+" to detach: "+vol) ||
		!strings.Contains(drainOut, "ReadyForMaintenance: Node "+node+" may be taken down") {
		t.Fatalf("drain %s: %v\n%s", node, drainErr, drainOut)
	}

	// Away: the node goes down; past the grace period its member stays, Degraded.
	r.must(r.c.CrashNode(node))
	crashed := time.Now()
	t.Cleanup(func() { _ = r.c.RestartNode(node) })
	replica := v1.ReplicaName(vol, node)
	r.eventually(vol+" Degraded with "+node+" judged lost", 2*time.Minute, func() string {
		cur := r.rv(vol)
		rvr := &v1.ReplicatedVolumeReplica{}
		if err := r.cl.Get(r.ctx, client.ObjectKey{Name: replica}, rvr); err != nil {
			return err.Error()
		}
		if cur.Status.Phase != v1.VolumePhaseDegraded || rvr.Status.Conditions == nil {
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
	cur := r.rv(vol)
	if !slices.ContainsFunc(cur.Status.Datamesh.Members, func(m v1.DatameshMember) bool { return m.Name == replica }) {
		t.Errorf("the member on %s, away for maintenance, was removed: %s", node, phase(cur))
	}
	for _, q := range cur.Status.DatameshReplicaRequests {
		if q.Operation == v1.ReplicaOperationForceLeave {
			t.Errorf("a ForceLeave was requested for %s while its node is away for maintenance: %+v", q.Name, q)
		}
	}
	for _, rvr := range r.rvrs(vol) {
		if !members[rvr.Spec.NodeName] {
			t.Errorf("a replacement replica %s was placed on %s while %s is away for maintenance", rvr.Name, rvr.Spec.NodeName, node)
		}
	}
	timeline.WriteString("(node " + node + " crashed; " + time.Since(crashed).Round(time.Second).String() + " later: phase " +
		string(cur.Status.Phase) + ", member " + replica + " kept, no ForceLeave, no replacement)\n")

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
	r.ready(vol, 2*time.Minute)
	t.Logf("maintenance timeline:\n%s", timeline.String())
	r.must(r.cl.Delete(r.ctx, m))
	r.deleteVolume(vol)
}

// pluginErr runs the plugin as plugin does and returns its output and error.
func (r *rig) pluginErr(kc pluginConfig, args ...string) (string, error) {
	var out, errOut bytes.Buffer
	err := kubectlmeshvol.Run(r.ctx, append(args, "--kubeconfig", kc.path, "--context", kc.context), &out, &errOut)
	return out.String(), err
}

// nodeLabel is the node's meshvol cordon label ("" when absent).
func (r *rig) nodeLabel(node string) string {
	n := &corev1.Node{}
	r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: node}, n))
	return n.Labels[v1.LabelCordon]
}
