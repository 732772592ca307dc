package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/sandbox"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// snapshotWriterScript writes a blob and its checksum, then appends numbered
// 16-byte records to /data/log, each with fsync (dd conv=fsync), and after each
// acknowledged one writes its number to /tmp/acked, outside the volume.
const snapshotWriterScript = `set -e
` + blobScript + `
i=0
while true; do
  i=$((i+1))
  printf '%015d\n' $i | dd of=/data/log bs=16 seek=$((i-1)) conv=notrunc,fsync 2>/tmp/err || { echo "WRITE FAILED at $i: $(cat /tmp/err)"; exit 1; }
  echo $i > /tmp/acked
  sleep 0.05
done
`

// blobScript writes 1 MiB of random data to /data/blob and its checksum to
// /data/blob.sha256, each with fsync (not sync(1): that flushes every filesystem of
// the machine).
const blobScript = `head -c 1048576 /dev/urandom | dd of=/data/blob bs=64k conv=fsync 2>/dev/null
sha256sum /data/blob | cut -d' ' -f1 | dd of=/data/blob.sha256 conv=fsync 2>/dev/null`

// TestSnapshotRestoreClone (docs/snapshots.md): a pod writes a blob and its checksum to
// a 2D+1TB claim and then appends fsynced records in a loop. A VolumeSnapshot taken
// while it writes becomes ready; the blob is then overwritten. A claim restored from
// the snapshot holds the first blob (its checksum of the snapshot time) and every
// record acknowledged before the VolumeSnapshot was created; a clone of the claim holds
// the second blob. Deleting the pods, the claims and the snapshot leaves no
// ReplicatedVolumeSnapshot, no volume and no backing file behind.
func TestSnapshotRestoreClone(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	src, writer := name(t, "-src"), name(t, "-w")
	srcPVC := sandbox.PVC(src, class, "32Mi", corev1.PersistentVolumeFilesystem)
	if err := sb.Client.Create(ctx, srcPVC); err != nil {
		t.Fatal(err)
	}
	pod(t, ctx, writer, src, "", snapshotWriterScript, false)
	waitRunning(t, ctx, writer)
	first := waitFile(t, ctx, writer, "/data/blob.sha256")
	acked := waitAcked(t, ctx, writer, 20)

	snap := name(t, "-snap")
	vs := volumeSnapshot(snap, src)
	began := time.Now()
	if err := sb.Client.Create(ctx, vs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Client.Delete(context.Background(), volumeSnapshot(snap, src)) })
	waitUntil(t, ctx, 3*time.Minute, "VolumeSnapshot "+snap+" ready", func() (bool, string) {
		if err := sb.Client.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
			return false, err.Error()
		}
		ready, _, _ := unstructured.NestedBool(vs.Object, "status", "readyToUse")
		st, _, _ := unstructured.NestedMap(vs.Object, "status")
		return ready, fmt.Sprintf("status %v", st)
	})
	content, _, _ := unstructured.NestedString(vs.Object, "status", "boundVolumeSnapshotContentName")
	t.Logf("VolumeSnapshot %s ready in %s (content %s); %d records acknowledged before it was created",
		snap, time.Since(began).Round(time.Millisecond), content, acked)
	var vsc unstructured.Unstructured
	vsc.SetGroupVersionKind(schema.GroupVersionKind{Group: "snapshot.storage.k8s.io", Version: "v1", Kind: "VolumeSnapshotContent"})
	if err := sb.Client.Get(ctx, client.ObjectKey{Name: content}, &vsc); err != nil {
		t.Fatal(err)
	}
	handle, _, _ := unstructured.NestedString(vsc.Object, "status", "snapshotHandle")
	var rvs v1.ReplicatedVolumeSnapshot
	if err := sb.Client.Get(ctx, client.ObjectKey{Name: handle}, &rvs); err != nil {
		t.Fatalf("the ReplicatedVolumeSnapshot of %s (handle %q): %v", content, handle, err)
	}
	if !rvs.Status.ReadyToUse || len(rvs.Status.Copies) != 2 {
		t.Fatalf("ReplicatedVolumeSnapshot %s: ready %v, copies on %v; want ready with a copy on both diskful nodes", handle, rvs.Status.ReadyToUse, rvs.Status.Copies)
	}
	t.Logf("ReplicatedVolumeSnapshot %s: attempt %d, object created %s, IO suspended everywhere at %s (%s)", handle, rvs.Status.Attempt,
		rvs.CreationTimestamp.UTC().Format(time.RFC3339), rvs.Status.CreationTime.UTC().Format(time.RFC3339Nano), rvs.Status.Message)

	second := exec(t, ctx, writer, "set -e\n"+blobScript+"\ncat /data/blob.sha256")
	if second == first {
		t.Fatal("the second blob has the first's checksum")
	}

	restored, clone := name(t, "-restored"), name(t, "-clone")
	restoredPVC := sandbox.PVC(restored, class, "32Mi", corev1.PersistentVolumeFilesystem)
	restoredPVC.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: ptr("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: snap}
	clonePVC := sandbox.PVC(clone, class, "32Mi", corev1.PersistentVolumeFilesystem)
	clonePVC.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: src}
	for _, c := range []*corev1.PersistentVolumeClaim{restoredPVC, clonePVC} {
		if err := sb.Client.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
		pod(t, ctx, c.Name+"-r", c.Name, "", sleepScript, false)
	}
	for _, c := range []struct {
		claim, want, what string
	}{{restored, first, "the snapshot time's"}, {clone, second, "the source's current"}} {
		reader := c.claim + "-r"
		waitRunning(t, ctx, reader)
		got := exec(t, ctx, reader, `sha256sum /data/blob | cut -d' ' -f1; cat /data/blob.sha256`)
		if lines := strings.Fields(got); len(lines) != 2 || lines[0] != c.want || lines[1] != c.want {
			t.Fatalf("%s: blob and recorded checksum %q, want %s checksum %s", c.claim, got, c.what, c.want)
		}
	}
	log := exec(t, ctx, restored+"-r", `cat /data/log`)
	records := strings.Split(log, "\n")
	for i := 1; i <= acked; i++ {
		if i > len(records) || records[i-1] != fmt.Sprintf("%015d", i) {
			t.Fatalf("the restored log lacks record %d of the %d acknowledged before the snapshot (it has %d lines)", i, acked, len(records))
		}
	}
	t.Logf("restore: the first blob and %d records (all %d acknowledged before the snapshot); clone: the second blob", len(records), acked)

	for _, p := range []string{writer, restored + "-r", clone + "-r"} {
		deletePod(t, ctx, p)
	}
	var volumes []string
	for _, c := range []*corev1.PersistentVolumeClaim{srcPVC, restoredPVC, clonePVC} {
		volumes = append(volumes, pvcBound(t, ctx, c.Name).Spec.VolumeName)
		if err := sb.Client.Delete(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := sb.Client.Delete(ctx, volumeSnapshot(snap, src)); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	waitGone(t, ctx, volumeSnapshot(snap, src), 2*time.Minute)
	waitGone(t, ctx, &v1.ReplicatedVolumeSnapshot{ObjectMeta: metav1.ObjectMeta{Name: handle}}, 2*time.Minute)
	for _, vol := range volumes {
		waitGone(t, ctx, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: vol}}, 2*time.Minute)
		waitGone(t, ctx, &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: vol}}, 2*time.Minute)
	}
	waitUntil(t, ctx, time.Minute, "no backing file left", func() (bool, string) {
		var left []string
		for _, n := range append(volumes, handle) {
			left = append(left, backingFiles(n)...)
		}
		return len(left) == 0, strings.Join(left, ", ")
	})
}

// volumeSnapshot is a VolumeSnapshot of the claim with the VolumeSnapshotClass the
// chart makes beside the storage class, of the same name.
func volumeSnapshot(name, claim string) *unstructured.Unstructured {
	vs := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": name, "namespace": "default"},
		"spec": map[string]any{
			"volumeSnapshotClassName": class,
			"source":                  map[string]any{"persistentVolumeClaimName": claim},
		},
	}}
	vs.SetGroupVersionKind(schema.GroupVersionKind{Group: "snapshot.storage.k8s.io", Version: "v1", Kind: "VolumeSnapshot"})
	return vs
}

// waitAcked waits until the writer pod has acknowledged at least min records and
// returns how many it had.
func waitAcked(t *testing.T, ctx context.Context, podName string, min int) int {
	t.Helper()
	n := 0
	waitUntil(t, ctx, 2*time.Minute, fmt.Sprintf("%d records written in %s", min, podName), func() (bool, string) {
		out, err := sb.Kube.Kubectl(ctx, "exec", podName, "--", "cat", "/tmp/acked")
		if err != nil {
			return false, err.Error()
		}
		n, err = strconv.Atoi(strings.TrimSpace(out))
		return err == nil && n >= min, fmt.Sprintf("acked %q", out)
	})
	return n
}

func ptr[T any](v T) *T { return &v }
