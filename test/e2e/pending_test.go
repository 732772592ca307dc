//go:build e2epending

package e2e

// These scenarios of issue 11 run on the same sandbox as e2e_test.go but do
// not pass yet, for reasons in the controller and CSI services, not in the
// cluster they run on (seen on 2026-11-25, all with the same stack):
//
//   - TestDataFollowsThePod, TestDeleteLeavesNothing: after the kubelet
//     unstages a volume, ControllerUnpublishVolume never returns: the RVA
//     stays "phase Detaching" with its Attached condition already
//     "Detached", so its finalizer is never released, the VolumeAttachment
//     stays, and the volume can neither attach elsewhere nor be deleted.
//   - TestBlockVolume (a pod on the node of the 2D+1TB volume's
//     tie-breaker): "Waiting for TieBreaker ... to become Access" forever.
//   - TestNodeCrash: the controller decides the node lost in about 6 s,
//     taints it out-of-service and force-detaches the member; Kubernetes
//     moves the pod at once, but the RVA of the dead node stays Detaching,
//     so ControllerUnpublishVolume for it, and with it the attach on the
//     new node ("ControllerUnpublishVolume is already in progress"), never
//     finish.
//
// Run them with `go test -tags e2epending ./test/e2e/`; they move into
// e2e_test.go as they pass. Not part of `make test`: a test that cannot pass
// would only hide the ones that do.

import (
	"context"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/sandbox"
)

// TestDataFollowsThePod: a pod writes, is deleted; a new pod on another
// node reads the same data.
func TestDataFollowsThePod(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	pvcName, first, second := name(t, "-pvc"), name(t, "-1"), name(t, "-2")
	if err := sb.Client.Create(ctx, sandbox.PVC(pvcName, class, "32Mi", corev1.PersistentVolumeFilesystem)); err != nil {
		t.Fatal(err)
	}
	p := pod(t, ctx, first, pvcName, "", writeScript, false)
	p = waitRunning(t, ctx, p.Name)
	sum := waitFile(t, ctx, first, "/data/blob.sha256")
	node1 := p.Spec.NodeName
	deletePod(t, ctx, first)

	node2 := otherNode(node1)
	pod(t, ctx, second, pvcName, node2, sleepScript, false)
	waitRunning(t, ctx, second)
	t.Cleanup(func() { deletePod(t, context.Background(), second) })
	got := exec(t, ctx, second, "sha256sum /data/blob | cut -d' ' -f1")
	if got != sum {
		t.Fatalf("data written on %s has sha256 %s; read on %s: %s", node1, sum, node2, got)
	}
	t.Logf("written on %s, read on %s: sha256 %s", node1, node2, sum)
}

// TestBlockVolume: a Block PVC is a raw device in the pod; what is written
// to it is read back.
func TestBlockVolume(t *testing.T) {
	ctx := ctxT(t, 4*time.Minute)
	pvcName, podName := name(t, "-pvc"), name(t, "-pod")
	if err := sb.Client.Create(ctx, sandbox.PVC(pvcName, class, "16Mi", corev1.PersistentVolumeBlock)); err != nil {
		t.Fatal(err)
	}
	pod(t, ctx, podName, pvcName, "", sleepScript, true)
	waitRunning(t, ctx, podName)
	t.Cleanup(func() { deletePod(t, context.Background(), podName) })
	out := exec(t, ctx, podName, `set -e
test -b /dev/xvda
head -c 65536 /dev/urandom > /tmp/in
dd if=/tmp/in of=/dev/xvda bs=4096 seek=100 conv=fsync 2>/dev/null
dd if=/dev/xvda of=/tmp/out bs=4096 skip=100 count=16 2>/dev/null
cmp /tmp/in /tmp/out && echo same
blockdev --getsize64 /dev/xvda`)
	lines := strings.Fields(out)
	if len(lines) != 2 || lines[0] != "same" {
		t.Fatalf("block device round trip: %q", out)
	}
	size, _ := strconv.ParseInt(lines[1], 10, 64)
	if size < 16<<20 {
		t.Fatalf("the device has %d bytes, the claim asked for 16 MiB", size)
	}
}

// TestDeleteLeavesNothing: deleting the claim deletes the PV, the
// ReplicatedVolume, its replicas and Secret, the backing files and the
// devices.
func TestDeleteLeavesNothing(t *testing.T) {
	ctx := ctxT(t, 4*time.Minute)
	pvcName, podName := name(t, "-pvc"), name(t, "-pod")
	pvcObj := sandbox.PVC(pvcName, class, "32Mi", corev1.PersistentVolumeFilesystem)
	if err := sb.Client.Create(ctx, pvcObj); err != nil {
		t.Fatal(err)
	}
	pod(t, ctx, podName, pvcName, "", writeScript, false)
	waitRunning(t, ctx, podName)
	waitFile(t, ctx, podName, "/data/blob.sha256")
	pvc := pvcBound(t, ctx, pvcName)
	var pv corev1.PersistentVolume
	if err := sb.Client.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv); err != nil {
		t.Fatal(err)
	}
	rvName := pv.Spec.CSI.VolumeHandle
	var rvrs v1.ReplicatedVolumeReplicaList
	if err := sb.Client.List(ctx, &rvrs, client.MatchingLabels{v1.LabelVolume: rvName}); err != nil || len(rvrs.Items) == 0 {
		t.Fatalf("replicas of %s: %d, %v", rvName, len(rvrs.Items), err)
	}
	filesBefore := backingFiles(rvName)
	if len(filesBefore) == 0 {
		t.Fatalf("no backing file of %s on any node", rvName)
	}

	deletePod(t, ctx, podName)
	if err := sb.Client.Delete(ctx, pvcObj); err != nil {
		t.Fatal(err)
	}
	waitGone(t, ctx, &pv, 2*time.Minute)
	waitGone(t, ctx, &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: rvName}}, 2*time.Minute)
	for i := range rvrs.Items {
		waitGone(t, ctx, &rvrs.Items[i], time.Minute)
	}
	waitGone(t, ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: sb.Mesh.Namespace, Name: "drbd-" + rvName}}, time.Minute)
	deadline := time.Now().Add(time.Minute)
	for {
		left := backingFiles(rvName)
		for _, n := range sb.Mesh.Nodes {
			if res, err := n.Resources(ctx); err == nil && slices.Contains(res, rvName) {
				left = append(left, n.Name+": DRBD resource "+rvName)
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the PVC was deleted: %v", left)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("PVC, PV, RV %s, %d replicas, Secret, %d backing files and the DRBD resources gone", rvName, len(rvrs.Items), len(filesBefore))
}

// TestNodeCrash: the node of a Deployment's pod crashes (kubelet,
// containerd, shims, containers, agent, DRBD at once); the pod comes back
// on another node with its data. Last: the node stays dead.
func TestNodeCrash(t *testing.T) {
	ctx := ctxT(t, 6*time.Minute)
	res, err := sb.Demo(ctx, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	if res.SecondNode == res.FirstNode {
		t.Fatalf("the pod came back on the crashed node %s", res.FirstNode)
	}
	t.Logf("crash of %s → pod Running on %s with the same data (sha256 %s) in %s",
		res.FirstNode, res.SecondNode, res.Checksum, res.CrashToReady.Round(100*time.Millisecond))
}

// waitFile waits for a file in the pod and returns its content.
func waitFile(t *testing.T, ctx context.Context, podName, path string) string {
	t.Helper()
	for try := 0; ; try++ {
		out, err := sb.Kube.Kubectl(ctx, "exec", podName, "--", "cat", path)
		if err == nil && strings.TrimSpace(out) != "" {
			return strings.TrimSpace(out)
		}
		if try > 120 {
			t.Fatalf("%s in pod %s: %q %v", path, podName, out, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// backingFiles lists the files on any node's pool that belong to volume.
func backingFiles(volume string) []string {
	var fs []string
	for _, n := range sb.Mesh.Nodes {
		for _, f := range n.Files() {
			if strings.Contains(filepath.Base(f), volume) {
				fs = append(fs, f)
			}
		}
	}
	return fs
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
