package e2e

// Nodes cut off while they run, not crashed: from their DRBD peers and the
// control plane at once, from the control plane alone, and every node's
// control-plane connection stalled for two seconds. The file's name sorts
// before e2e_test.go, whose TestNodeCrash leaves a node dead: these need
// all three.

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/sandbox"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
)

// TestPartitionFailover: the node of a writer pod (fsync after every write)
// is cut off from its DRBD peers and from the control plane while it and
// the pod keep running. Its volume's other replicas hold quorum without
// it, so meshvol declares it lost, deletes the pod and its
// VolumeAttachment, and the Deployment's new pod writes on another node
// from at least the old pod's last acknowledged counter. The old pod,
// still running behind the cut, acknowledges nothing more (DRBD's
// on-no-quorum: its fsync blocks or fails).
//
// Then the partition heals. The old Primary's connects are refused
// (drbdsim, as DRBD 9.2.18: a stale Primary does not rejoin a side that
// promoted and wrote), so its IO would stay suspended for ever; its agent,
// which learns that its member was removed, fails the held writes
// (on-no-quorum io-error), the old pod's kubelet ends it, and the resource
// demotes (docs/controller.md, "--delete-lost-pods"). The old pod
// acknowledged nothing beyond what the new pod found, and a third pod finds
// every write the new pod acknowledged.
func TestPartitionFailover(t *testing.T) {
	for _, cls := range []string{"meshvol-3d", "meshvol-2d-1tb"} {
		t.Run(cls, func(t *testing.T) { partitionFailover(t, cls) })
	}
}

func partitionFailover(t *testing.T, cls string) {
	ctx := ctxT(t, 8*time.Minute)
	r, err := sb.StartWriter(ctx, sandbox.FailoverOptions{Name: name(t, ""), Class: cls, Node: quietNode(t, ctx), Fault: sandbox.FaultPartition})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sb.Heal(r.From)
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if t.Failed() {
			// What the heal did not end, a reboot does, so that the tests
			// after this one find three working nodes.
			err := sb.CrashNode(r.From)
			if err == nil {
				err = sb.RestartNode(cctx, r.From)
			}
			if err != nil {
				t.Errorf("rebooting the partitioned node %s: %v", r.From, err)
			}
		}
		if err := sb.DeleteWriter(cctx, r, 3*time.Minute); err != nil {
			t.Error(err)
		}
	})
	err = sb.Failover(ctx, r, 2*time.Minute)
	for _, s := range r.Steps {
		t.Log(s)
	}
	if err != nil {
		t.Fatal(err)
	}
	if r.To == r.From {
		t.Fatalf("the writer came back on the partitioned node %s", r.From)
	}
	saw := r.OldAfterFault
	t.Logf("%s cut off: the writer on %s moved to %s in %s; it had acknowledged %d, the new pod found %d",
		cls, r.From, r.To, r.Total().Round(10*time.Millisecond), r.LastAck, r.Resumed)
	t.Logf("the partitioned pod after the cut: %d writes acknowledged, %d failed (first: %q), last write tried %d",
		saw.Acks, saw.Fails, saw.FirstFail, saw.LastTry)
	old, _ := r.OldPod()
	l, err := sb.WriterLog(old, 0)
	if err != nil {
		t.Fatal(err)
	}
	if l.LastAck > r.Resumed {
		t.Fatalf("two writers: the partitioned pod acknowledged counter %d, beyond the %d the new pod started from", l.LastAck, r.Resumed)
	}
	h, err := sb.AfterHeal(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	role := h.OldRole
	if role == "" {
		role = "down"
	}
	t.Logf("healed: the old pod's container ended %s after the heal, the old resource %s after %s; the old pod's log over the run: %d acknowledged (last %d), %d failed (first: %q)",
		h.OldStopped.Round(10*time.Millisecond), role, h.OldDemoted.Round(10*time.Millisecond), h.OldLog.Acks, h.OldLog.LastAck, h.OldLog.Fails, h.OldLog.FirstFail)
	t.Logf("the new pod acknowledged up to %d, the pod after it found %d", h.NewLastAck, h.Reread)
}

// TestAPIServerCutOffKeepsVolume: a writer's node is cut off from the
// control plane only; its DRBD peers still reach it. Its agent's Lease
// lapses, well past the grace period, but the peers report their
// connections to its replica, so meshvol must not declare it lost: the pod
// and its VolumeAttachment stay, the volume stays attached there, and the
// pod goes on writing through the cut. Once reconnected, all is as before.
func TestAPIServerCutOffKeepsVolume(t *testing.T) {
	ctx := ctxT(t, 6*time.Minute)
	r, err := sb.StartWriter(ctx, sandbox.FailoverOptions{Name: name(t, ""), Class: "meshvol-3d", Node: quietNode(t, ctx)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sb.Heal(r.From)
		if err := sb.DeleteWriter(context.Background(), r, 3*time.Minute); err != nil {
			t.Error(err)
		}
	})
	pod, container := r.OldPod()
	cut, err := sandbox.Uptime()
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Partition(r.From, false, true); err != nil {
		t.Fatal(err)
	}
	// Three times what declares a node lost: the Lease's duration plus
	// the grace period.
	hold := 3 * (6*time.Second + sandbox.AgentGracePeriod)
	deadline := time.Now().Add(hold)
	lapsed := false
	for time.Now().Before(deadline) {
		var n corev1.Node
		if err := sb.Client.Get(ctx, client.ObjectKey{Name: r.From}, &n); err != nil {
			t.Fatal(err)
		}
		for _, tn := range n.Spec.Taints {
			if tn.Key == controller.TaintLost.Key || tn.Key == controller.TaintOutOfService.Key {
				t.Fatalf("node %s, cut off from the apiserver only, was tainted %s while its DRBD peers reach it", r.From, tn.Key)
			}
		}
		var p corev1.Pod
		if err := sb.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: pod}, &p); err != nil || p.DeletionTimestamp != nil {
			t.Fatalf("the writer %s on %s was deleted while its node's DRBD peers reach it (%v)", pod, r.From, err)
		}
		if !attachedOn(t, ctx, r.PV(), r.From) {
			t.Fatalf("the volume %s is no longer attached on %s", r.PV(), r.From)
		}
		lapsed = lapsed || leaseLapsed(t, ctx, r.From)
		time.Sleep(500 * time.Millisecond)
	}
	if !lapsed {
		t.Fatalf("the agent Lease of %s never lapsed in %s: the cut did not cut", r.From, hold)
	}
	during, err := sb.WriterLog(pod, cut)
	if err != nil {
		t.Fatal(err)
	}
	if during.Acks == 0 {
		t.Fatalf("the writer on %s acknowledged no write while its node was cut off from the apiserver only (%d failed: %q)", r.From, during.Fails, during.FirstFail)
	}
	if err := sb.Heal(r.From); err != nil {
		t.Fatal(err)
	}
	if err := sb.WaitNodeBack(ctx, r.From, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if running, err := sb.TaskRunning(r.From, container); err != nil || !running {
		t.Fatalf("the writer's container on %s is not running after the cut healed (%v)", r.From, err)
	}
	t.Logf("%s cut off from the apiserver for %s (its agent Lease lapsed), DRBD peers connected: nothing freed, the writer acknowledged %d writes meanwhile (%d failed)",
		r.From, hold, during.Acks, during.Fails)
}

// TestAPIServerStall: every node's connection to the apiserver stalls for
// 2 s, three times, 4 s apart, while a pod writes: shorter than the Lease
// plus the grace period, so no node is declared lost and nothing is
// deleted.
func TestAPIServerStall(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	r, err := sb.StartWriter(ctx, sandbox.FailoverOptions{Name: name(t, ""), Class: "meshvol-2d-1tb"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.DeleteWriter(context.Background(), r, 3*time.Minute); err != nil {
			t.Error(err)
		}
	})
	pod, _ := r.OldPod()
	for i := 0; i < 3; i++ {
		if err := sb.StallAPIServer(2 * time.Second); err != nil {
			t.Fatal(err)
		}
		time.Sleep(4 * time.Second)
	}
	// What a wrong decision would need to show: the grace after the last stall.
	deadline := time.Now().Add(6*time.Second + sandbox.AgentGracePeriod)
	for time.Now().Before(deadline) {
		var nodes corev1.NodeList
		if err := sb.Client.List(ctx, &nodes); err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes.Items {
			for _, tn := range n.Spec.Taints {
				if tn.Key == controller.TaintLost.Key || tn.Key == controller.TaintOutOfService.Key {
					t.Fatalf("node %s tainted %s after 2 s stalls of the apiserver", n.Name, tn.Key)
				}
			}
		}
		var p corev1.Pod
		if err := sb.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: pod}, &p); err != nil || p.DeletionTimestamp != nil {
			t.Fatalf("the writer %s was deleted after 2 s stalls of the apiserver (%v)", pod, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	l, err := sb.WriterLog(pod, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("three 2 s stalls of every node's apiserver connection: no node declared lost, the writer on %s acknowledged %d writes, %d failed", r.From, l.Acks, l.Fails)
}

// quietNode is a node that runs no replica of the controller: a cut of the
// writer's node is then not also a leader election.
func quietNode(t *testing.T, ctx context.Context) string {
	t.Helper()
	var pods corev1.PodList
	if err := sb.Client.List(ctx, &pods, client.InNamespace(sandbox.ReleaseNamespace), client.MatchingLabels{"app.kubernetes.io/component": "controller"}); err != nil {
		t.Fatal(err)
	}
	busy := map[string]bool{}
	for _, p := range pods.Items {
		busy[p.Spec.NodeName] = true
	}
	for _, n := range sb.Kube.Nodes {
		if !busy[n.Name] && !n.Crashed() {
			return n.Name
		}
	}
	return ""
}

// attachedOn says whether pv has an attached VolumeAttachment on node.
func attachedOn(t *testing.T, ctx context.Context, pv, node string) bool {
	t.Helper()
	var vas storagev1.VolumeAttachmentList
	if err := sb.Client.List(ctx, &vas); err != nil {
		t.Fatal(err)
	}
	for _, va := range vas.Items {
		if va.Spec.Source.PersistentVolumeName != nil && *va.Spec.Source.PersistentVolumeName == pv && va.Spec.NodeName == node && va.Status.Attached {
			return true
		}
	}
	return false
}

// leaseLapsed says whether node's agent Lease has expired.
func leaseLapsed(t *testing.T, ctx context.Context, node string) bool {
	t.Helper()
	var l coordinationv1.Lease
	if err := sb.Client.Get(ctx, client.ObjectKey{Namespace: sandbox.ReleaseNamespace, Name: v1.AgentLeasePrefix + node}, &l); err != nil {
		t.Fatal(err)
	}
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return false
	}
	return time.Since(l.Spec.RenewTime.Time) > time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second
}
