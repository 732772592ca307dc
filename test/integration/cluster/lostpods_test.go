package cluster_test

// The controller frees a lost node's pods (controller.Options.DeleteLostPods,
// docs/controller.md "--delete-lost-pods"): once the node's agent Lease is past
// its grace period and the survivors of every meshvol volume a pod there uses
// hold quorum without it, the pod object and the node's VolumeAttachments go.
// No kubelet runs here: the pods are objects bound to a node, which is all the
// controller reads.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
)

const lostPodsNS = "lostpods"

// workload creates what Kubernetes holds for a pod on node using volume:
// the PV of meshvol's driver, its bound claim, the pod and its VolumeAttachment.
func (r *rig) workload(volume, node string) (pod *corev1.Pod, va *storagev1.VolumeAttachment) {
	r.t.Helper()
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lostPodsNS}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: lostPodsNS}},
	} {
		if err := r.cl.Create(r.ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			r.t.Fatal(err)
		}
	}
	size := resource.MustParse("64Mi")
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-" + volume}, Spec: corev1.PersistentVolumeSpec{
		Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
		AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
		PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: v1.CSIDriverName, VolumeHandle: volume}},
	}}
	empty := ""
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "claim-" + volume, Namespace: lostPodsNS}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: &empty, VolumeName: pv.Name,
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
	}}
	pod = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "app-" + volume, Namespace: lostPodsNS}, Spec: corev1.PodSpec{
		NodeName:   node,
		Containers: []corev1.Container{{Name: "app", Image: "app"}},
		Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: pvc.Name}}}},
	}}
	va = &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "va-" + volume}, Spec: storagev1.VolumeAttachmentSpec{
		Attacher: v1.CSIDriverName, NodeName: node, Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv.Name}}}
	for _, o := range []client.Object{pv, pvc, pod, va} {
		r.must(r.cl.Create(r.ctx, o))
		r.t.Cleanup(func() { r.remove(o) })
	}
	return pod, va
}

// remove deletes an object of the scenario, dropping the protection finalizers
// no kube-controller-manager runs here to drop.
func (r *rig) remove(o client.Object) {
	ctx := context.Background()
	if err := r.cl.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
		return
	}
	if len(o.GetFinalizers()) > 0 {
		p := client.MergeFrom(o.DeepCopyObject().(client.Object))
		o.SetFinalizers(nil)
		_ = r.cl.Patch(ctx, o, p)
	}
	_ = r.cl.Delete(ctx, o, client.GracePeriodSeconds(0))
}

func (r *rig) exists(o client.Object) bool {
	r.t.Helper()
	err := r.cl.Get(r.ctx, client.ObjectKeyFromObject(o), o.DeepCopyObject().(client.Object))
	if err != nil && !apierrors.IsNotFound(err) {
		r.t.Fatal(err)
	}
	return err == nil
}

// freedEvent is the controller's Event on the object, "" while there is none.
func (r *rig) freedEvent(kind, name string) string {
	var evs corev1.EventList
	r.must(r.cl.List(r.ctx, &evs, client.InNamespace(lostPodsNS)))
	for _, e := range evs.Items {
		if e.InvolvedObject.Kind == kind && e.InvolvedObject.Name == name && e.Reason == controller.EventPodFreed {
			return e.Message
		}
	}
	return ""
}

// lost waits until the controller marks the volume's replica on node
// AgentReady=False: the node is lost.
func (r *rig) lost(volume, node string) {
	r.t.Helper()
	r.eventually(node+" lost", time.Minute, func() string {
		for _, rvr := range r.rvrs(volume) {
			if rvr.Spec.NodeName == node && meta.IsStatusConditionFalse(rvr.Status.Conditions, v1.ConditionAgentReady) {
				return ""
			}
		}
		return "no replica of " + volume + " on " + node + " with AgentReady=False"
	})
}

// memberNode is a node holding a member of the volume.
func memberNode(rv *v1.ReplicatedVolume) string { return rv.Status.Datamesh.Members[0].NodeName }

// A crashed node's pod on a 3D volume: the two survivors hold quorum, so the
// pod and its VolumeAttachment are deleted, with an Event on the pod and its
// claim; a pod there without a meshvol volume stays.
func TestLostNodePodDeleted(t *testing.T) {
	r := newRig(t)
	vol := "lostpod-3d"
	r.volume(vol, r.class(1, 1, v1.TopologyIgnored), 1)
	node := memberNode(r.ready(vol, 2*time.Minute))
	r.attach(vol, node)
	pod, va := r.workload(vol, node)
	other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "no-meshvol-" + vol, Namespace: lostPodsNS}, Spec: corev1.PodSpec{
		NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "app"}}}}
	r.must(r.cl.Create(r.ctx, other))
	t.Cleanup(func() { r.remove(other) })

	crashed := time.Now()
	r.must(r.c.CrashNode(node))
	t.Cleanup(func() { _ = r.c.RestartNode(node) })
	r.eventually("the lost node's pod and VolumeAttachment deleted", time.Minute, func() string {
		if r.exists(pod) || r.exists(va) {
			return fmt.Sprintf("pod there %v, VolumeAttachment there %v", r.exists(pod), r.exists(va))
		}
		return ""
	})
	// The agents' default 10 s Lease and this cluster's 3 s grace period make
	// most of it (docs/controller.md, "Detection").
	t.Logf("crash of %s → pod and VolumeAttachment deleted in %s", node, time.Since(crashed).Round(100*time.Millisecond))
	n := &corev1.Node{}
	r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: node}, n))
	if !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == controller.TaintLost.Key }) {
		t.Fatalf("node %s is not tainted %s, so a replacement may land on it: %v", node, controller.TaintLost.ToString(), n.Spec.Taints)
	}
	if !r.exists(other) {
		t.Fatalf("pod %s, which uses no meshvol volume, was deleted", other.Name)
	}
	r.eventually("Events on the pod and its claim", 10*time.Second, func() string {
		if r.freedEvent("Pod", pod.Name) == "" || r.freedEvent("PersistentVolumeClaim", "claim-"+vol) == "" {
			return "no " + controller.EventPodFreed + " Event on both"
		}
		return ""
	})
	t.Logf("Event on the pod: %s", r.freedEvent("Pod", pod.Name))
	r.detach(vol, node)
	r.must(r.c.RestartNode(node))
	r.deleteVolume(vol)
}

// A crashed node's pod on a 2D+1TB volume attached there: the survivors (the
// other Diskful and the TieBreaker) lose quorum about a second after the loss,
// as on DRBD (docs/drbd-quorum.md, "The members set"), and regain it only once
// the lost member is force-removed and q lowered. The pod does not wait for
// that: both survivors report the lost node's connection down, and one voter
// of two under q=2, cut off from the TieBreaker, cannot be quorate, so the pod
// and its VolumeAttachment go on that (pkg/fencing), and the attachment then
// moves to the other Diskful, which writes once the removal and q↓ are through.
func TestLostNodePodDeleted2D1TB(t *testing.T) {
	r := newRig(t)
	vol := "lostpod-2d1tb"
	r.volume(vol, r.class(1, 0, v1.TopologyIgnored), 1)
	rv := r.ready(vol, 2*time.Minute)
	var diskful []string
	for _, m := range rv.Status.Datamesh.Members {
		if m.Type == v1.MemberTypeDiskful {
			diskful = append(diskful, m.NodeName)
		}
	}
	a, b := diskful[0], diskful[1]
	r.attach(vol, a)
	pod, va := r.workload(vol, a)

	crashed := time.Now()
	r.must(r.c.CrashNode(a))
	t.Cleanup(func() { _ = r.c.RestartNode(a) })
	r.eventually("the lost node's pod and VolumeAttachment deleted", time.Minute, func() string {
		if r.exists(pod) || r.exists(va) {
			return fmt.Sprintf("pod there %v, VolumeAttachment there %v", r.exists(pod), r.exists(va))
		}
		return ""
	})
	freed := time.Since(crashed)
	r.eventually("the Event on the pod", 10*time.Second, func() string {
		if r.freedEvent("Pod", pod.Name) == "" {
			return "no " + controller.EventPodFreed + " Event"
		}
		return ""
	})
	why := r.freedEvent("Pod", pod.Name)
	t.Logf("crash of %s → pod and VolumeAttachment deleted in %s: %s", a, freed.Round(100*time.Millisecond), why)
	if !strings.Contains(why, "cannot hold quorum") {
		t.Fatalf("the pod was freed on %q, not on the survivors' reports that the lost replica cannot hold quorum", why)
	}

	// What Kubernetes does next: external-attacher releases the lost node's
	// attachment (ControllerUnpublishVolume) and attaches the new pod's node.
	r.must(client.IgnoreNotFound(r.cl.Delete(r.ctx, &v1.ReplicatedVolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: v1.AttachmentName(vol, a)}})))
	r.requestAttach(vol, b)
	r.attached(vol, b, 2*time.Minute)
	r.eventually(vol+" writable on "+b, time.Minute, func() string { return r.quorate(vol, b) })
	t.Logf("crash of %s → writable on %s in %s", a, b, time.Since(crashed).Round(100*time.Millisecond))
	r.detach(vol, b)
	r.must(r.c.RestartNode(a))
	r.deleteVolume(vol)
}

// A node whose agent stops while its DRBD keeps its peers: lost by its Lease,
// but the survivors still reach it, so nothing of it is deleted.
func TestLostNodeReachedKeepsPods(t *testing.T) {
	r := newRig(t)
	r.keepsPods("lostpod-reached", 1, 1, "a node its peers still reach", true, r.c.StopAgent, r.c.RestartAgent)
}

// A crashed node holding the only replica of a 1D volume: no survivor holds
// quorum, so its pod and VolumeAttachment stay.
func TestLostNodeWithoutQuorumKeepsPods(t *testing.T) {
	r := newRig(t)
	r.keepsPods("lostpod-1d", 0, 0, "a node whose volume has no quorum without it", false, r.c.CrashNode, r.c.RestartNode)
}

// keepsPods runs a pod on a member node of a new volume of the layout, cuts
// the node with cut, and checks that once the node is lost, and for a few of
// the controller's one-second looks after, its pod and VolumeAttachment stay;
// a node its peers still reach (reached) is not tainted either.
func (r *rig) keepsPods(vol string, ftt, gmdr int32, what string, reached bool, cut, restore func(node string) error) {
	r.t.Helper()
	r.volume(vol, r.class(ftt, gmdr, v1.TopologyIgnored), 1)
	node := memberNode(r.ready(vol, 2*time.Minute))
	r.attach(vol, node)
	pod, va := r.workload(vol, node)
	r.must(cut(node))
	r.t.Cleanup(func() { _ = restore(node) })
	r.lost(vol, node)
	time.Sleep(4 * time.Second)
	if !r.exists(pod) || !r.exists(va) {
		r.t.Fatalf("%s lost its pod (there %v) or VolumeAttachment (there %v)", what, r.exists(pod), r.exists(va))
	}
	if reached {
		n := &corev1.Node{}
		r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: node}, n))
		if slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == controller.TaintLost.Key }) {
			r.t.Fatalf("%s is tainted %s", what, controller.TaintLost.ToString())
		}
	}
	r.must(restore(node))
	r.detach(vol, node)
	r.deleteVolume(vol)
}
