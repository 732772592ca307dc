// Package e2e runs meshvol end to end on a real Kubernetes cluster on this
// machine (internal/sandbox): real kube-apiserver, etcd, kube-controller-manager
// and kube-scheduler, three real kubelets with containerd and runc, each node
// with namespaces of its own, and meshvol installed as users install it:
// `helm install` of charts/meshvol with the image `make image` builds (the
// controller Deployment with the real external-provisioner and
// external-attacher, the node DaemonSet), and drbdsim in place of every
// node's DRBD kernel module, reached through drbd-utils stand-ins. One
// sandbox serves the whole package; the tests keep apart by object names.
//
// It needs root, the Debian packages of hack/install-deps.sh and the image;
// `make test` provides them (and bin/k8s). Other packages' tests that run a kubelet
// cluster wait for this one (one cluster per machine).
package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/sandbox"
	"github.com/meshvol/meshvol/internal/testenv"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

var sb *sandbox.Sandbox

// leaders says what the release's leader-election Leases showed over the
// suite (releaseHealthy prints it).
var leaders func() []sandbox.LeaderRenewals

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "FAIL: test/e2e needs root (it mounts, creates cgroups and runs containers); `make test` runs as root here and in CI")
		return 1
	}
	// Starting takes well under a minute, but the bound also covers waiting
	// for another cluster on this machine to end (WaitForLock): one e2e run
	// or sandbox of another worktree holds the lock for minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	root, err := testenv.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	// Short: unix sockets live beneath it.
	dir, err := os.MkdirTemp("/tmp", "e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	keep := false
	defer func() {
		if !keep {
			os.RemoveAll(dir)
		}
	}()
	// meshvol as users install it: the chart and the image `make image`
	// built (`make test` builds it first). Run directly (`go test
	// ./test/e2e`), the image may be older than the tree: FromTree checks it
	// and rebuilds it when it is not this tree's build.
	began := time.Now()
	sb, err = sandbox.FromTree(ctx, root, dir, true, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "e2e: sandbox of 3 nodes built and up in %s (%s of it waiting for another cluster on the machine)\n", time.Since(began).Round(time.Millisecond), sb.Kube.LockWait.Round(time.Second))
	// Until the end of the suite (ctx bounds only the start).
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	leaders, err = sb.WatchLeaderLeases(wctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	code := m.Run()
	if !releaseHealthy(ctx) {
		code = 1
	}
	// An open watch holds the apiserver's shutdown up.
	stopWatch()
	if code != 0 {
		// The logs of a failed run are worth keeping.
		keep = true
		fmt.Fprintf(os.Stderr, "e2e: logs kept in %s\n", dir)
	}
	began = time.Now()
	if err := sb.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: teardown:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "e2e: torn down in %s, nothing left on the machine\n", time.Since(began).Round(time.Millisecond))
	return code
}

// releaseHealthy reports what every container of the chart's release did
// over the suite — restarts, peak memory, its limit — and says whether all
// is as the chart promises: no log line with "forbidden" (the RBAC rules
// allow every request meshvol makes) and no restart on a node that did not
// crash. It also prints how the leader elections' holders renewed their
// Leases: the evidence for the chart's controller.leaderElection timing
// (docs/controller.md, "Detection").
func releaseHealthy(ctx context.Context) bool {
	rep, err := sb.ReleaseReport(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: the release's containers:", err)
		return false
	}
	rep = append(uninstalledReport, rep...)
	ok := true
	fmt.Fprintln(os.Stderr, "e2e: the release's containers over the suite (peak memory is the cgroup's high-water mark):")
	for _, r := range rep {
		fmt.Fprintf(os.Stderr, "e2e:   %-40s %-16s %-7s restarts %d, peak memory %5.1f MiB (limit %s)\n",
			r.Pod, r.Container, r.Node, r.Restarts, float64(r.PeakMemory)/(1<<20), r.MemoryLimit)
		for _, l := range r.Forbidden {
			fmt.Fprintf(os.Stderr, "FAIL: %s/%s logged a refused request: %s\n", r.Pod, r.Container, l)
			ok = false
		}
		if r.Restarts > 0 && !sb.Kube.Node(r.Node).CrashedOnce() && !killedPods[r.Pod] {
			fmt.Fprintf(os.Stderr, "FAIL: %s/%s restarted %d times; the last run ended: %s; the end of its log:\n", r.Pod, r.Container, r.Restarts, r.LastExit)
			for _, l := range r.PreviousLog {
				fmt.Fprintf(os.Stderr, "FAIL:   %s\n", l)
			}
			ok = false
		}
	}
	fmt.Fprintln(os.Stderr, "e2e: the leader elections' Leases over the suite (the time between two renewals by one holder):")
	for _, l := range leaders() {
		fmt.Fprintf(os.Stderr, "e2e:   %s\n", l)
	}
	return ok
}

const class = sandbox.DefaultStorageClass // 2 diskful + tie-breaker

// name is a DNS-1123 name unique to the test.
func name(t *testing.T, suffix string) string {
	n := strings.ToLower(strings.TrimPrefix(t.Name(), "Test"))
	n = strings.NewReplacer("_", "-", "/", "-").Replace(n)
	if len(n) > 40 {
		n = n[:40]
	}
	return strings.Trim(n, "-") + suffix
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// pod creates a host-network busybox pod running script, with the claim at
// /data (or as the raw device /dev/xvda when block), pinned to node by its
// hostname label ("" lets the scheduler choose).
func pod(t *testing.T, ctx context.Context, podName, pvc, node, script string, block bool) *corev1.Pod {
	t.Helper()
	spec := sandbox.DemoPodSpec(pvc, script)
	if block {
		spec.Containers[0].VolumeMounts = nil
		spec.Containers[0].VolumeDevices = []corev1.VolumeDevice{{Name: "data", DevicePath: "/dev/xvda"}}
	}
	if node != "" {
		spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName, Namespace: "default", Labels: map[string]string{"e2e": podName}}, Spec: spec}
	if err := sb.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	return p
}

func waitRunning(t *testing.T, ctx context.Context, podName string) *corev1.Pod {
	t.Helper()
	p, err := sb.WaitPodRunning(ctx, map[string]string{"e2e": podName}, "", 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// deletePod deletes a pod and waits until it is gone (its volume unpublished
// and unstaged by the kubelet).
func deletePod(t *testing.T, ctx context.Context, podName string) {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName, Namespace: "default"}}
	if err := sb.Client.Delete(ctx, p); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	waitGone(t, ctx, p, 2*time.Minute)
}

func waitGone(t *testing.T, ctx context.Context, o client.Object, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := sb.Client.Get(ctx, client.ObjectKeyFromObject(o), o)
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%T %s still there after %s (err %v)", o, o.GetName(), timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func exec(t *testing.T, ctx context.Context, podName string, script string) string {
	t.Helper()
	out, err := sb.Kube.Kubectl(ctx, "exec", podName, "--", "sh", "-c", script)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

func pvcBound(t *testing.T, ctx context.Context, pvcName string) *corev1.PersistentVolumeClaim {
	t.Helper()
	var pvc corev1.PersistentVolumeClaim
	if err := sb.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: pvcName}, &pvc); err != nil {
		t.Fatal(err)
	}
	if pvc.Status.Phase != corev1.ClaimBound {
		t.Fatalf("PVC %s is %s, want Bound", pvcName, pvc.Status.Phase)
	}
	return &pvc
}

// otherNode is a live node other than those given.
func otherNode(not ...string) string {
	for _, n := range sb.Kube.Nodes {
		if !n.Crashed() && !slices.Contains(not, n.Name) {
			return n.Name
		}
	}
	return ""
}

// writeScript writes a file of random data and its checksum onto the
// volume and flushes the volume's file system (syncfs(2): a bare sync would
// wait for every file system of the machine, for ever if one is stuck).
const writeScript = `set -e
head -c 1048576 /dev/urandom > /data/blob
sha256sum /data/blob | cut -d' ' -f1 > /data/blob.sha256
sync -f /data
exec sleep 2147483647
`

const sleepScript = `exec sleep 2147483647`

// TestWaitForFirstConsumer: the claim stays Pending until a pod needs it,
// then is provisioned where the scheduler put the pod; the PV's node
// affinity is the volume's accessible topology and admits that node.
func TestWaitForFirstConsumer(t *testing.T) {
	ctx := ctxT(t, 4*time.Minute)
	pvcName, podName := name(t, "-pvc"), name(t, "-pod")
	if err := sb.Client.Create(ctx, sandbox.PVC(pvcName, class, "32Mi", corev1.PersistentVolumeFilesystem)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	var pvc corev1.PersistentVolumeClaim
	if err := sb.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: pvcName}, &pvc); err != nil {
		t.Fatal(err)
	}
	if pvc.Status.Phase != corev1.ClaimPending || pvc.Spec.VolumeName != "" {
		t.Fatalf("PVC without a consumer is %s (volume %q), want Pending and unprovisioned", pvc.Status.Phase, pvc.Spec.VolumeName)
	}
	p := pod(t, ctx, podName, pvcName, "", writeScript, false)
	p = waitRunning(t, ctx, p.Name)
	t.Cleanup(func() { deletePod(t, context.Background(), podName) })
	bound := pvcBound(t, ctx, pvcName)
	if bound.Annotations["volume.kubernetes.io/selected-node"] != p.Spec.NodeName {
		t.Errorf("selected-node annotation %q, pod on %s", bound.Annotations["volume.kubernetes.io/selected-node"], p.Spec.NodeName)
	}
	var pv corev1.PersistentVolume
	if err := sb.Client.Get(ctx, client.ObjectKey{Name: bound.Spec.VolumeName}, &pv); err != nil {
		t.Fatal(err)
	}
	var rv v1.ReplicatedVolume
	if err := sb.Client.Get(ctx, client.ObjectKey{Name: pv.Spec.CSI.VolumeHandle}, &rv); err != nil {
		t.Fatalf("the PV's volume handle %s names no ReplicatedVolume: %v", pv.Spec.CSI.VolumeHandle, err)
	}
	affinity := map[string]bool{}
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		t.Fatal("the PV has no node affinity")
	}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			if e.Key == v1.TopologyKeyNode {
				for _, v := range e.Values {
					affinity[v] = true
				}
			}
		}
	}
	if !affinity[p.Spec.NodeName] {
		t.Errorf("the PV's node affinity %v does not admit the pod's node %s", keys(affinity), p.Spec.NodeName)
	}
	for _, m := range rv.Status.Datamesh.Members {
		if m.Type == v1.MemberTypeDiskful && !affinity[m.NodeName] {
			t.Errorf("diskful member on %s is not in the PV's node affinity %v", m.NodeName, keys(affinity))
		}
	}
	for n := range affinity {
		if sb.Kube.Node(n) == nil {
			t.Errorf("the PV's node affinity names %s, which is no node", n)
		}
	}
	t.Logf("PVC %s → PV %s → RV %s; pod on %s; PV node affinity %v", pvcName, pv.Name, rv.Name, p.Spec.NodeName, keys(affinity))
	if got := exec(t, ctx, podName, "sha256sum /data/blob | cut -d' ' -f1; cat /data/blob.sha256"); len(strings.Fields(got)) != 2 || strings.Fields(got)[0] != strings.Fields(got)[1] {
		t.Fatalf("the pod's file and its checksum disagree: %q", got)
	}
}

func keys(m map[string]bool) []string {
	var k []string
	for x := range m {
		k = append(k, x)
	}
	slices.Sort(k)
	return k
}

// TestReadWriteOnceRefusesASecondNode: while a pod on one node uses a
// ReadWriteOnce volume, a pod on another node stays ContainerCreating and
// the refusal is an event on it that says why.
func TestReadWriteOnceRefusesASecondNode(t *testing.T) {
	ctx := ctxT(t, 4*time.Minute)
	pvcName, first, second := name(t, "-pvc"), name(t, "-1"), name(t, "-2")
	if err := sb.Client.Create(ctx, sandbox.PVC(pvcName, class, "32Mi", corev1.PersistentVolumeFilesystem)); err != nil {
		t.Fatal(err)
	}
	p := pod(t, ctx, first, pvcName, "", sleepScript, false)
	p = waitRunning(t, ctx, p.Name)
	t.Cleanup(func() { deletePod(t, context.Background(), first) })
	node2 := otherNode(p.Spec.NodeName)
	pod(t, ctx, second, pvcName, node2, sleepScript, false)
	t.Cleanup(func() { deletePod(t, context.Background(), second) })

	deadline := time.Now().Add(time.Minute)
	for {
		var events corev1.EventList
		if err := sb.Client.List(ctx, &events, client.InNamespace("default")); err != nil {
			t.Fatal(err)
		}
		for _, e := range events.Items {
			if e.InvolvedObject.Name == second && e.Type == corev1.EventTypeWarning &&
				(strings.Contains(e.Message, "Multi-Attach") || strings.Contains(e.Message, "attach")) {
				t.Logf("event on %s: %s: %s", second, e.Reason, e.Message)
				var p2 corev1.Pod
				if err := sb.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: second}, &p2); err != nil {
					t.Fatal(err)
				}
				if p2.Status.Phase == corev1.PodRunning {
					t.Fatalf("the second pod runs on %s while the first uses the volume on %s", node2, p.Spec.NodeName)
				}
				return
			}
		}
		if time.Now().After(deadline) {
			out, _ := sb.Kube.Kubectl(ctx, "describe", "pod", second)
			t.Fatalf("no attach refusal event on %s within a minute:\n%s", second, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestExpansion: a pod's volume grows online as users grow it, by raising
// the claim's request: kube-controller-manager hands the claim to the
// CSI driver's resizer, the sandbox's resizer (external-resizer's part,
// internal/sandbox/resizer.go) calls ControllerExpandVolume, which returns
// once every diskful replica has grown, and marks the PV grown and the
// claim NodeResizePending; the kubelet then calls NodeExpandVolume, which
// grows the mounted file system, and marks the claim done. The pod,
// ControllerGetVolume and NodeGetVolumeStats see the new size. Online ext4
// growth needs CAP_SYS_RESOURCE (pkg/csi/expand.go): where the node plugin
// lacks it, as on this machine, NodeExpandVolume answers FailedPrecondition
// saying so (the kubelet's event on the pod), the file system stays as it
// was, and it grows once a new pod has the volume staged again.
func TestExpansion(t *testing.T) {
	t.Run("xfs", func(t *testing.T) { expansion(t, "xfs", 320<<20, 400<<20) })
	t.Run("ext4", func(t *testing.T) { expansion(t, "ext4", 64<<20, 96<<20) })
}

func expansion(t *testing.T, fs string, size, want int64) {
	ctx := ctxT(t, 4*time.Minute)
	scName, pvcName, podName := name(t, "-sc"), name(t, "-pvc"), name(t, "-pod")
	wffc, expand := storagev1.VolumeBindingWaitForFirstConsumer, true
	sc := &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: scName},
		Provisioner: v1.CSIDriverName,
		Parameters: map[string]string{v1.CSIParameterStorageClass: class,
			"csi.storage.k8s.io/fstype": fs},
		VolumeBindingMode:    &wffc,
		AllowVolumeExpansion: &expand,
	}
	if err := sb.Client.Create(ctx, sc); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Client.Delete(context.Background(), sc) })
	claim := resource.NewQuantity(size, resource.BinarySI).String()
	if err := sb.Client.Create(ctx, sandbox.PVC(pvcName, scName, claim, corev1.PersistentVolumeFilesystem)); err != nil {
		t.Fatal(err)
	}
	p := pod(t, ctx, podName, pvcName, "", sleepScript, false)
	p = waitRunning(t, ctx, p.Name)
	t.Cleanup(func() { deletePod(t, context.Background(), podName) })
	before := dfBytes(t, ctx, podName)
	pvc := pvcBound(t, ctx, pvcName)
	var pv corev1.PersistentVolume
	if err := sb.Client.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv); err != nil {
		t.Fatal(err)
	}
	if pv.Spec.CSI.FSType != fs {
		t.Fatalf("the PV's fsType is %q, want %s", pv.Spec.CSI.FSType, fs)
	}
	volID := pv.Spec.CSI.VolumeHandle

	began := time.Now()
	grown := pvc.DeepCopy()
	grown.Spec.Resources.Requests[corev1.ResourceStorage] = *resource.NewQuantity(want, resource.BinarySI)
	if err := sb.Client.Patch(ctx, grown, client.MergeFrom(pvc)); err != nil {
		t.Fatal(err)
	}
	// The resizer's part: the PV grown once ControllerExpandVolume returned.
	waitUntil(t, ctx, 2*time.Minute, "the PV of "+pvcName+" to grow to "+strconv.FormatInt(want, 10)+" bytes", func() (bool, string) {
		if err := sb.Client.Get(ctx, client.ObjectKey{Name: pv.Name}, &pv); err != nil {
			return false, err.Error()
		}
		c := pv.Spec.Capacity[corev1.ResourceStorage]
		return c.Value() >= want, "capacity " + c.String() + "; claim: " + claimResize(ctx, pvcName)
	})
	controllerTook := time.Since(began)
	// Every diskful replica has grown when ControllerExpandVolume returns.
	var rv v1.ReplicatedVolume
	if err := sb.Client.Get(ctx, client.ObjectKey{Name: volID}, &rv); err != nil {
		t.Fatal(err)
	}
	for _, m := range rv.Status.Datamesh.Members {
		if !m.Type.HasDisk() {
			continue
		}
		var r v1.ReplicatedVolumeReplica
		if err := sb.Client.Get(ctx, client.ObjectKey{Name: m.Name}, &r); err != nil {
			t.Fatal(err)
		}
		if b := r.Status.BackingVolume; b == nil || b.Size.Value() < want || r.Status.DatameshRevision < rv.Status.DatameshRevision {
			t.Fatalf("ControllerExpandVolume returned, but replica %s is at revision %d of %d with backing volume %v",
				m.Name, r.Status.DatameshRevision, rv.Status.DatameshRevision, b)
		}
	}
	cc := csipb.NewControllerClient(csiConn(t, sb.ControllerSocket))
	got, err := cc.ControllerGetVolume(ctx, &csipb.ControllerGetVolumeRequest{VolumeId: volID})
	if err != nil {
		t.Fatal(err)
	}
	if got.Volume.CapacityBytes < want {
		t.Fatalf("ControllerGetVolume reports %d bytes after growing to %d", got.Volume.CapacityBytes, want)
	}

	if fs == "ext4" && !hasCapSysResource(t) {
		// The node plugin's pod lacks it where the machine (and so this
		// test) does: no container has more than the machine gives. The
		// kubelet's NodeExpandVolume is refused with FailedPrecondition,
		// which the kubelet logs (no event: it retries once the volume is
		// staged again).
		var refused string
		waitUntil(t, ctx, 2*time.Minute, "the kubelet's refused NodeExpandVolume on "+p.Spec.NodeName, func() (bool, string) {
			refused = kubeletLogLine(p.Spec.NodeName, "CAP_SYS_RESOURCE")
			return refused != "", "claim: " + claimResize(ctx, pvcName)
		})
		if after := dfBytes(t, ctx, podName); after != before {
			t.Fatalf("the refused growth changed the pod's file system from %d to %d bytes", before, after)
		}
		t.Logf("ControllerExpandVolume through the resizer in %s; the kubelet's NodeExpandVolume refused: %s", controllerTook.Round(time.Millisecond), refused)
		// What the message promises: a new pod, the volume staged again, the
		// file system grown (NodeStage grows the unmounted ext4).
		began = time.Now()
		deletePod(t, ctx, podName)
		again := podName + "-again"
		pod(t, ctx, again, pvcName, p.Spec.NodeName, sleepScript, false)
		waitRunning(t, ctx, again)
		t.Cleanup(func() { deletePod(t, context.Background(), again) })
		after := dfBytes(t, ctx, again)
		if after < before+(want-size)*7/8 {
			t.Fatalf("staged again after the refusal: the file system has %d bytes, had %d, the device grew by %d", after, before, want-size)
		}
		waitClaimGrown(t, ctx, pvcName, want)
		t.Logf("pod restarted on %s: file system %d → %d bytes, claim done, %s", p.Spec.NodeName, before, after, time.Since(began).Round(time.Millisecond))
		return
	}
	// The kubelet's part: NodeExpandVolume, then the claim done.
	waitClaimGrown(t, ctx, pvcName, want)
	nodeTook := time.Since(began) - controllerTook
	after := dfBytes(t, ctx, podName)
	// df leaves out what the file system keeps for itself (xfs's log, ext4's
	// journal and tables): most of the bytes gained, not all.
	if after < before+(want-size)*7/8 {
		t.Fatalf("the pod's file system had %d bytes, has %d after expanding to %d", before, after, want)
	}
	node := sb.Kube.Node(p.Spec.NodeName)
	target := filepath.Join(node.KubeletRootOnNode(), "pods", string(p.UID), "volumes/kubernetes.io~csi", pv.Name, "mount")
	nc := csipb.NewNodeClient(csiConn(t, sb.NodeSocket(p.Spec.NodeName)))
	stats, err := nc.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: volID, VolumePath: target})
	if err != nil {
		t.Fatal(err)
	}
	if total := stats.Usage[0].Total; total != after {
		t.Fatalf("NodeGetVolumeStats reports %d bytes, the pod's df %d", total, after)
	}
	t.Logf("claim edited → PV grown (ControllerExpandVolume) in %s, → claim done (NodeExpandVolume by the kubelet) %s later; file system in the pod: %d → %d bytes",
		controllerTook.Round(time.Millisecond), nodeTook.Round(time.Millisecond), before, after)
}

// waitClaimGrown waits until the kubelet marked the claim's resize done:
// status.capacity at least want, no resize status or condition left.
func waitClaimGrown(t *testing.T, ctx context.Context, pvcName string, want int64) {
	t.Helper()
	waitUntil(t, ctx, 2*time.Minute, "claim "+pvcName+" to be grown to "+strconv.FormatInt(want, 10)+" bytes", func() (bool, string) {
		var pvc corev1.PersistentVolumeClaim
		if err := sb.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: pvcName}, &pvc); err != nil {
			return false, err.Error()
		}
		c := pvc.Status.Capacity[corev1.ResourceStorage]
		return c.Value() >= want && len(pvc.Status.AllocatedResourceStatuses) == 0 && len(pvc.Status.Conditions) == 0, claimResize(ctx, pvcName)
	})
}

// claimResize describes a claim's resize state for a failure message.
func claimResize(ctx context.Context, pvcName string) string {
	var pvc corev1.PersistentVolumeClaim
	if err := sb.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: pvcName}, &pvc); err != nil {
		return err.Error()
	}
	c := pvc.Status.Capacity[corev1.ResourceStorage]
	var conds []string
	for _, cd := range pvc.Status.Conditions {
		conds = append(conds, string(cd.Type)+": "+cd.Message)
	}
	return fmt.Sprintf("capacity %s, allocated %v %v, conditions %v", c.String(), pvc.Status.AllocatedResources, pvc.Status.AllocatedResourceStatuses, conds)
}

// kubeletLogLine is the last line of a node's kubelet log that contains
// text ("" when none does).
func kubeletLogLine(node, text string) string {
	b, err := os.ReadFile(filepath.Join(sb.Kube.Node(node).LogDir(), "kubelet.log"))
	if err != nil {
		return ""
	}
	found := ""
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, text) {
			found = l
		}
	}
	return found
}

// waitUntil polls cond every half second until it holds, or fails the test
// after d with what cond last said.
func waitUntil(t *testing.T, ctx context.Context, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("waiting for %s: not after %s: %s", what, d, state)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// hasCapSysResource reports whether this process may grow a mounted ext4
// (CAP_SYS_RESOURCE, bit 24 of CapEff in /proc/self/status).
func hasCapSysResource(t *testing.T) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return caps&(1<<24) != 0
		}
	}
	t.Fatal("no CapEff in /proc/self/status")
	return false
}

func dfBytes(t *testing.T, ctx context.Context, podName string) int64 {
	t.Helper()
	out := exec(t, ctx, podName, "df -k /data | tail -n 1")
	f := strings.Fields(out)
	if len(f) < 2 {
		t.Fatalf("df: %q", out)
	}
	kb, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		t.Fatalf("df: %q", out)
	}
	return kb << 10
}

func csiConn(t *testing.T, socket string) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

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
// to it is read back, then read again by a pod on another node of the
// volume — the TieBreaker's when the first pod was not there: a pod
// scheduled on the tie-breaker's node attaches it as a diskless Primary.
func TestBlockVolume(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	pvcName, podName, second := name(t, "-pvc"), name(t, "-pod"), name(t, "-2")
	if err := sb.Client.Create(ctx, sandbox.PVC(pvcName, class, "16Mi", corev1.PersistentVolumeBlock)); err != nil {
		t.Fatal(err)
	}
	pod(t, ctx, podName, pvcName, "", sleepScript, true)
	p := waitRunning(t, ctx, podName)
	t.Cleanup(func() { deletePod(t, context.Background(), podName) })
	out := exec(t, ctx, podName, `set -e
test -b /dev/xvda
head -c 65536 /dev/urandom > /tmp/in
dd if=/tmp/in of=/dev/xvda bs=4096 seek=100 conv=fsync 2>/dev/null
dd if=/dev/xvda of=/tmp/out bs=4096 skip=100 count=16 2>/dev/null
cmp /tmp/in /tmp/out && echo same
blockdev --getsize64 /dev/xvda
sha256sum /tmp/in | cut -d' ' -f1`)
	lines := strings.Fields(out)
	if len(lines) != 3 || lines[0] != "same" {
		t.Fatalf("block device round trip: %q", out)
	}
	size, _ := strconv.ParseInt(lines[1], 10, 64)
	if size < 16<<20 {
		t.Fatalf("the device has %d bytes, the claim asked for 16 MiB", size)
	}
	sum := lines[2]

	// Another node of the volume: the TieBreaker's if the first pod is not on it.
	pv := pvcBound(t, ctx, pvcName).Spec.VolumeName
	var rvrs v1.ReplicatedVolumeReplicaList
	if err := sb.Client.List(ctx, &rvrs, client.MatchingLabels{v1.LabelVolume: pv}); err != nil {
		t.Fatal(err)
	}
	node2, typ := "", v1.ReplicaType("")
	for _, r := range rvrs.Items {
		if r.Spec.NodeName != p.Spec.NodeName && (node2 == "" || r.Spec.Type == v1.ReplicaTypeTieBreaker) {
			node2, typ = r.Spec.NodeName, r.Spec.Type
		}
	}
	if node2 == "" {
		t.Fatalf("volume %s has no replica off node %s: %d replicas", pv, p.Spec.NodeName, len(rvrs.Items))
	}
	deletePod(t, ctx, podName)
	pod(t, ctx, second, pvcName, node2, sleepScript, true)
	waitRunning(t, ctx, second)
	t.Cleanup(func() { deletePod(t, context.Background(), second) })
	got := exec(t, ctx, second, "dd if=/dev/xvda bs=4096 skip=100 count=16 2>/dev/null | sha256sum | cut -d' ' -f1")
	if got != sum {
		t.Fatalf("written on %s: sha256 %s; read on %s (%s replica): %s", p.Spec.NodeName, sum, node2, typ, got)
	}
	t.Logf("written on %s, read on %s (%s replica): sha256 %s", p.Spec.NodeName, node2, typ, sum)
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
	waitGone(t, ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: sb.Namespace, Name: "drbd-" + rvName}}, time.Minute)
	deadline := time.Now().Add(time.Minute)
	for {
		left := backingFiles(rvName)
		for _, n := range sb.Kube.Nodes {
			if res, err := sb.DRBDResources(ctx, n.Name); err == nil && slices.Contains(res, rvName) {
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
	for _, f := range sb.PoolFiles() {
		if strings.Contains(filepath.Base(f), volume) {
			fs = append(fs, f)
		}
	}
	return fs
}

// TestHelmUpgradeWhileWriting: `helm upgrade` from the previous commit's
// chart and build (sandbox.PreviousRevision: where this branch left main, or
// HEAD's parent on main), installed first, to this tree's (its meshvol
// stamped with another version: other bytes, another `meshvol version`), as
// a user upgrades from the release before, while a pod writes to a 2D+1TB
// and a 3D volume, with controller transitions in flight across the upgrade
// — the 3D volume growing (its claim raised just before) and a new volume
// forming for a new pod. The node DaemonSet rolls one node at a time
// (maxUnavailable 1: the agent adopts the running DRBD resources, so one node
// at a time keeps every volume's quorum), the controller Deployment rolls, no
// write fails, the transitions finish under the new build, and every pod of
// the release runs it.
func TestHelmUpgradeWhileWriting(t *testing.T) {
	ctx := ctxT(t, 20*time.Minute)
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// A checkout without history (a shallow clone, an exported tree) has no previous
	// commit: it upgrades from its own build stamped as another version, which still
	// rolls every pod of the release onto other bytes.
	prevRoot, prevLabel := root, "this tree's build as another version"
	prevVersion := "v0.0.0-previous"
	if prev, err := sandbox.PreviousRevision(ctx, root); err != nil {
		t.Logf("%v: upgrading from %s", err, prevLabel)
	} else {
		prevRoot = t.TempDir()
		if err := sandbox.ExportRevision(ctx, root, prev, prevRoot); err != nil {
			t.Fatal(err)
		}
		prevLabel, prevVersion = "the previous commit "+prev[:12], prevVersion+"-"+prev[:12]
	}
	prevArchive, prevRef, err := sb.BuildImage(ctx, prevRoot, prevVersion)
	if err != nil {
		t.Fatal(err)
	}
	const version = "v0.0.0-upgrade-test"
	archive, ref, err := sb.BuildImage(ctx, root, version)
	if err != nil {
		t.Fatal(err)
	}
	down, err := sb.HelmUpgradeChart(ctx, filepath.Join(prevRoot, "charts", "meshvol"), prevArchive, prevRef)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s installed (its chart and build, helm upgrade %s → %s): Ready in %s",
		prevLabel, down.From, down.To, down.Took.Round(100*time.Millisecond))
	script := `i=0; while true; do i=$((i+1)); echo $i | dd of=/data/counter conv=fsync 2>/tmp/err || { echo "WRITE FAILED after $i: $(cat /tmp/err)"; exit 1; }; sleep 0.2; done`
	var writers, claims []string
	for _, cls := range []string{"meshvol-2d-1tb", "meshvol-3d"} {
		pvcName, podName := name(t, "-"+cls), name(t, "-w-"+cls)
		if err := sb.Client.Create(ctx, sandbox.PVC(pvcName, cls, "32Mi", corev1.PersistentVolumeFilesystem)); err != nil {
			t.Fatal(err)
		}
		pod(t, ctx, podName, pvcName, "", script, false)
		waitRunning(t, ctx, podName)
		t.Cleanup(func() { deletePod(t, context.Background(), podName) })
		writers, claims = append(writers, podName), append(claims, pvcName)
	}
	before := map[string]int{}
	for _, w := range writers {
		n, _ := strconv.Atoi(waitFile(t, ctx, w, "/data/counter"))
		before[w] = n
	}
	// In flight across the upgrade: the 3D volume grows (the resizer's
	// ControllerExpandVolume, the controller's resize transition), and a
	// new volume forms for a new pod.
	grow := int64(48 << 20)
	var pvc corev1.PersistentVolumeClaim
	if err := sb.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: claims[1]}, &pvc); err != nil {
		t.Fatal(err)
	}
	grown := pvc.DeepCopy()
	grown.Spec.Resources.Requests[corev1.ResourceStorage] = *resource.NewQuantity(grow, resource.BinarySI)
	if err := sb.Client.Patch(ctx, grown, client.MergeFrom(&pvc)); err != nil {
		t.Fatal(err)
	}
	freshPVC, freshPod := name(t, "-fresh"), name(t, "-fresh-w")
	if err := sb.Client.Create(ctx, sandbox.PVC(freshPVC, class, "32Mi", corev1.PersistentVolumeFilesystem)); err != nil {
		t.Fatal(err)
	}
	pod(t, ctx, freshPod, freshPVC, "", script, false)
	t.Cleanup(func() { deletePod(t, context.Background(), freshPod) })

	up, err := sb.HelmUpgrade(ctx, archive, ref)
	if up != nil {
		for _, e := range up.Timeline {
			t.Logf("+%5.1fs  %s (node pods Ready: %d)", e.At.Seconds(), e.What, e.Ready)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("helm upgrade %s → %s: the release Ready on the new build in %s; at least %d node pods Ready throughout",
		up.From, up.To, up.Took.Round(100*time.Millisecond), up.MinNodeReady)
	if up.From != prevRef {
		t.Errorf("the upgrade started from %s, want the previous commit's %s", up.From, prevRef)
	}
	if live := len(sb.Kube.Nodes); up.MinNodeReady < live-1 {
		t.Errorf("only %d of %d node pods were Ready at one moment: the DaemonSet rolled more than one node at a time", up.MinNodeReady, live)
	}
	// Every pod of the release runs the new build. A pod of the old template may still
	// be terminating (a Deployment's status no longer counts it): it is on its way out,
	// and its containers may have exited already (phase Failed), so it is not asked.
	for _, c := range []string{"controller", "node"} {
		pods, err := sb.ReleasePods(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods {
			if p.DeletionTimestamp != nil {
				continue
			}
			out, err := sb.Kube.Kubectl(ctx, "-n", sandbox.ReleaseNamespace, "exec", p.Name, "-c", "meshvol", "--", "meshvol", "version")
			if err != nil || !strings.Contains(out, version) {
				t.Errorf("pod %s after the upgrade: `meshvol version` printed %q (%v), want %s", p.Name, out, err, version)
			}
		}
	}
	// The transitions in flight finished under the new build.
	upgraded := time.Now()
	var pv corev1.PersistentVolume
	waitUntil(t, ctx, 3*time.Minute, "the 3D volume to be grown after the upgrade", func() (bool, string) {
		if err := sb.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: claims[1]}, &pvc); err != nil {
			return false, err.Error()
		}
		if err := sb.Client.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv); err != nil {
			return false, err.Error()
		}
		c := pv.Spec.Capacity[corev1.ResourceStorage]
		return c.Value() >= grow, "PV capacity " + c.String() + "; claim: " + claimResize(ctx, claims[1])
	})
	t.Logf("the 3D volume's growth, raised before the upgrade: done %s after the release was Ready on the new build", time.Since(upgraded).Round(100*time.Millisecond))
	p := waitRunning(t, ctx, freshPod)
	n, _ := strconv.Atoi(waitFile(t, ctx, freshPod, "/data/counter"))
	t.Logf("the new volume, created before the upgrade: its pod Running on %s and writing (%d writes) %s after the release was Ready",
		p.Spec.NodeName, n, time.Since(upgraded).Round(100*time.Millisecond))
	for _, w := range writers {
		var p corev1.Pod
		if err := sb.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: w}, &p); err != nil {
			t.Fatal(err)
		}
		logs, _ := sb.Kube.Kubectl(ctx, "logs", w)
		if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].RestartCount > 0 || strings.Contains(logs, "WRITE FAILED") {
			t.Errorf("writer %s: phase %s, statuses %+v, log %q: a write failed during the upgrade", w, p.Status.Phase, p.Status.ContainerStatuses, logs)
		}
		n, _ := strconv.Atoi(waitFile(t, ctx, w, "/data/counter"))
		if n <= before[w] {
			t.Errorf("writer %s wrote %d before the upgrade and %d after: it stopped", w, before[w], n)
		}
		t.Logf("writer %s: %d writes before the upgrade, %d after, none failed", w, before[w], n)
	}
}

// crashClass is TestNodeCrash's storage class. The suite's one sandbox has
// three nodes, and the run on the default 2D+1TB class, which needs all
// three to itself, is a run of its own: `make e2e-crash-2d1tb`
// (-crash-class=meshvol-2d-1tb).
var crashClass = flag.String("crash-class", sandbox.DemoStorageClass, "storage class of TestNodeCrash's volume")

// TestNodeCrash: the node of a Deployment's pod crashes (kubelet,
// containerd, shims, containers, agent, DRBD at once); the pod comes back
// on another node with its data. It runs the sandbox's demonstration, on
// -crash-class. At its end the crashed node boots again and the test waits
// until meshvol has it back: the tests after it (in this file and the
// files after it) place volumes whose layouts need the three nodes — a
// 2D+1TB volume is refused while one of three nodes is down (CreateVolume
// ResourceExhausted: no node left for its TieBreaker).
func TestNodeCrash(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	res, err := sb.Demo(ctx, testWriter{t}, *crashClass)
	for _, n := range sb.Kube.Nodes {
		if !n.Crashed() {
			continue
		}
		t.Cleanup(func() {
			began := time.Now()
			if err := sb.RestartNode(ctx, n.Name); err != nil {
				t.Errorf("booting the crashed node %s again: %v", n.Name, err)
				return
			}
			t.Logf("node %s booted again; meshvol has it back (its node pod Ready, untainted) in %s", n.Name, time.Since(began).Round(100*time.Millisecond))
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	if res.SecondNode == res.FirstNode {
		t.Fatalf("the pod came back on the crashed node %s", res.FirstNode)
	}
	t.Logf("crash of %s → pod Running on %s with the same data (sha256 %s) in %s",
		res.FirstNode, res.SecondNode, res.Checksum, res.CrashToReady.Round(100*time.Millisecond))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
