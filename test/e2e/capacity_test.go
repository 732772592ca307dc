package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/sandbox"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// TestStorageCapacity: external-provisioner publishes a CSIStorageCapacity
// for every class on every node with what GetCapacity answers for that
// node's segment, and the scheduler uses it: a claim larger than any node
// can hold keeps its pod Pending with the scheduler's reason, and
// CreateVolume is never asked for it.
func TestStorageCapacity(t *testing.T) {
	ctx := ctxT(t, 3*time.Minute)
	caps, err := sb.Capacities(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("unix://"+sb.ControllerSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	seen := map[string]bool{}
	var largest int64
	for _, c := range caps {
		seen[c.Class+"/"+c.Node] = true
		largest = max(largest, c.MaxVolumeSize)
		n := sb.Kube.Node(c.Node)
		if n == nil {
			t.Fatalf("CSIStorageCapacity %s selects %s, which is no node", c.Object, c.Node)
		}
		resp, err := csipb.NewControllerClient(cc).GetCapacity(ctx, &csipb.GetCapacityRequest{
			Parameters:         map[string]string{v1.CSIParameterStorageClass: c.Class},
			AccessibleTopology: &csipb.Topology{Segments: map[string]string{v1.TopologyKeyNode: n.Name, v1.LabelZone: n.Zone}},
		})
		if err != nil {
			t.Fatal(err)
		}
		// The pools are files on the machine's own file system, whose
		// free space moves with every other writer on it between the
		// provisioner's poll and this call: close is what can be asked.
		const slack = 1 << 30
		if d := resp.GetMaximumVolumeSize().GetValue() - c.MaxVolumeSize; d > slack || d < -slack || c.MaxVolumeSize <= 0 {
			t.Errorf("%s on %s: CSIStorageCapacity %s says maximum volume size %d, GetCapacity for the node's segment %d",
				c.Class, c.Node, c.Object, c.MaxVolumeSize, resp.GetMaximumVolumeSize().GetValue())
		}
	}
	for _, n := range sb.Kube.Nodes {
		if !n.Crashed() && !seen[class+"/"+n.Name] {
			t.Errorf("no CSIStorageCapacity of class %s selects node %s (have %v)", class, n.Name, keys(seen))
		}
	}
	t.Logf("%d CSIStorageCapacity objects; the largest volume any node admits: %s", len(caps), resource.NewQuantity(largest, resource.BinarySI))

	pvcName, podName := name(t, "-pvc"), name(t, "-pod")
	tooBig := resource.NewQuantity(2*largest, resource.BinarySI).String()
	if err := sb.Client.Create(ctx, sandbox.PVC(pvcName, class, tooBig, corev1.PersistentVolumeFilesystem)); err != nil {
		t.Fatal(err)
	}
	pod(t, ctx, podName, pvcName, "", sleepScript, false)
	t.Cleanup(func() {
		deletePod(t, context.Background(), podName)
		pvc := sandbox.PVC(pvcName, class, tooBig, corev1.PersistentVolumeFilesystem)
		if err := sb.Client.Delete(context.Background(), pvc); err != nil {
			t.Error(err)
		}
	})
	deadline := time.Now().Add(time.Minute)
	for {
		var p corev1.Pod
		if err := sb.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: podName}, &p); err != nil {
			t.Fatal(err)
		}
		msg := ""
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				msg = c.Message
			}
		}
		if strings.Contains(msg, "did not have enough free storage") {
			t.Logf("a claim of %s: pod %s unschedulable: %s", tooBig, podName, msg)
			break
		}
		if p.Spec.NodeName != "" {
			t.Fatalf("a pod with a claim of %s was scheduled to %s", tooBig, p.Spec.NodeName)
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s with a claim of %s: no scheduler condition naming storage capacity within a minute (PodScheduled: %q)", podName, tooBig, msg)
		}
		time.Sleep(500 * time.Millisecond)
	}
	var pvc corev1.PersistentVolumeClaim
	if err := sb.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: pvcName}, &pvc); err != nil {
		t.Fatal(err)
	}
	if pvc.Status.Phase != corev1.ClaimPending || pvc.Annotations["volume.kubernetes.io/selected-node"] != "" {
		t.Fatalf("PVC %s is %s with selected-node %q; want Pending with no node selected", pvcName, pvc.Status.Phase, pvc.Annotations["volume.kubernetes.io/selected-node"])
	}
	var events corev1.EventList
	if err := sb.Client.List(ctx, &events, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if e.InvolvedObject.Name == pvcName && e.Reason == "ProvisioningFailed" {
			t.Errorf("CreateVolume was asked for a claim the scheduler should have held back: %s", e.Message)
		}
	}
}
