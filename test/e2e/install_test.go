package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/sandbox"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// uninstalledReport is what the release's containers did before
// TestHelmUninstall removed them: releaseHealthy reports them too.
var uninstalledReport []sandbox.ContainerReport

// TestHelmUninstall: `helm uninstall` with a volume present does what
// docs/install.md says: nothing the chart made is left (every object of
// its manifest, its pods and their mounts, the node plugin's sockets, the
// driver's registration with every kubelet), and the data stays — the
// CRDs, the volume's ReplicatedVolume and PersistentVolume, its backing
// files and its DRBD resources in the nodes' kernels. Installed again,
// meshvol serves the same volume, and a pod reads what was written before.
func TestHelmUninstall(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	pvcName, writer, reader := name(t, "-pvc"), name(t, "-w"), name(t, "-r")
	if err := sb.Client.Create(ctx, sandbox.PVC(pvcName, class, "32Mi", corev1.PersistentVolumeFilesystem)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePVCAndVolume(t, pvcName) })
	waitRunning(t, ctx, pod(t, ctx, writer, pvcName, "", writeScript, false).Name)
	sum := waitFile(t, ctx, writer, "/data/blob.sha256")
	deletePod(t, ctx, writer)
	pv := pvcBound(t, ctx, pvcName).Spec.VolumeName
	var pvObj corev1.PersistentVolume
	if err := sb.Client.Get(ctx, client.ObjectKey{Name: pv}, &pvObj); err != nil {
		t.Fatal(err)
	}
	rv := pvObj.Spec.CSI.VolumeHandle
	files, resources := volumeData(t, ctx, rv)
	if len(files) == 0 || len(resources) == 0 {
		t.Fatalf("volume %s before uninstalling: backing files %v, DRBD resources on %v", rv, files, resources)
	}

	rep, err := sb.ReleaseReport(ctx)
	if err != nil {
		t.Fatal(err)
	}
	uninstalledReport = append(uninstalledReport, rep...)
	u, err := sb.HelmUninstall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range u.Left {
		t.Errorf("left by helm uninstall after %s: %s", u.Took.Round(time.Millisecond), l)
	}
	t.Logf("helm uninstall: the release's %d objects, pods, sockets, registrations and mounts gone in %s",
		u.Objects, u.Took.Round(time.Millisecond))

	// What stays: the CRDs and every volume's objects, files and resources.
	var crds apiextensionsv1.CustomResourceDefinitionList
	if err := sb.Client.List(ctx, &crds); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range crds.Items {
		if c.Spec.Group == v1.GroupName {
			n++
		}
	}
	if n == 0 {
		t.Errorf("no CRD of %s left after helm uninstall: Helm never deletes a chart's crds/", v1.GroupName)
	}
	var rvObj v1.ReplicatedVolume
	if err := sb.Client.Get(ctx, client.ObjectKey{Name: rv}, &rvObj); err != nil {
		t.Errorf("ReplicatedVolume %s after helm uninstall: %v", rv, err)
	}
	if err := sb.Client.Get(ctx, client.ObjectKey{Name: pv}, &pvObj); err != nil || pvObj.Status.Phase != corev1.VolumeBound {
		t.Errorf("PersistentVolume %s after helm uninstall: %v (phase %s)", pv, err, pvObj.Status.Phase)
	}
	filesAfter, resourcesAfter := volumeData(t, ctx, rv)
	if !slices.Equal(files, filesAfter) || !slices.Equal(resources, resourcesAfter) {
		t.Errorf("volume %s after helm uninstall: backing files %v (had %v), DRBD resources on %v (had %v)", rv, filesAfter, files, resourcesAfter, resources)
	}
	t.Logf("kept: %d CRDs, ReplicatedVolume %s, PersistentVolume %s, backing files %v, DRBD resources on %v", n, rv, pv, filesAfter, resourcesAfter)

	began := time.Now()
	if err := sb.HelmReinstall(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("helm install again: Ready in %s", time.Since(began).Round(time.Millisecond))
	pod(t, ctx, reader, pvcName, "", sleepScript, false)
	p := waitRunning(t, ctx, reader)
	t.Cleanup(func() { deletePod(t, context.Background(), reader) })
	if got := exec(t, ctx, reader, "sha256sum /data/blob | cut -d' ' -f1"); got != sum {
		t.Fatalf("written before helm uninstall: sha256 %s; read on %s after installing again: %s", sum, p.Spec.NodeName, got)
	}
	t.Logf("read after installing again on %s: sha256 %s", p.Spec.NodeName, sum)
}

// volumeData lists a volume's backing files and the nodes whose kernel
// runs its DRBD resource.
func volumeData(t *testing.T, ctx context.Context, rv string) (files, nodes []string) {
	t.Helper()
	for _, f := range sb.PoolFiles() {
		if strings.Contains(f, rv) {
			files = append(files, f)
		}
	}
	for _, n := range sb.Kube.Nodes {
		res, err := sb.DRBDResources(ctx, n.Name)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(res, rv) {
			nodes = append(nodes, n.Name)
		}
	}
	slices.Sort(files)
	return files, nodes
}

// killedPods are the release's pods whose meshvol container a test killed
// on purpose: releaseHealthy expects the restart of each of their
// containers — meshvol's, and the sidecars', which exit when the driver's
// socket goes away ("Lost connection to CSI driver, exiting").
var killedPods = map[string]bool{}

// TestLeaderHandover: the controller's leader election hands over when the
// leader's pod is deleted (it gives its Lease up as it exits) and when its
// process is SIGKILLed, as a crash ends it (the Lease must expire first:
// the chart's lease duration); after each, the Deployment is whole again,
// and a new volume is provisioned, attached and mounted by the new leader.
func TestLeaderHandover(t *testing.T) {
	ctx := ctxT(t, 8*time.Minute)
	for _, crash := range []bool{false, true} {
		how := "pod deleted"
		if crash {
			how = "process SIGKILLed"
		}
		h, err := sb.LeaderHandover(ctx, crash)
		if h != nil && crash {
			killedPods[h.OldLeader] = true
		}
		if err != nil {
			t.Fatalf("%s: %v", how, err)
		}
		t.Logf("leader hand-over, %s: %s → %s in %s", how, h.OldLeader, h.NewLeader, h.Took.Round(100*time.Millisecond))
		// The chart's Lease of 8 s, tried every 0.5 to 1.1 s
		// (controller.leaderElection): a crashed leader's Lease expires
		// within 8 s of a candidate's seeing its last renewal, then the
		// candidate's next try takes it.
		if limit := 45 * time.Second; h.Took > limit {
			t.Errorf("%s: the hand-over took %s, more than %s", how, h.Took.Round(100*time.Millisecond), limit)
		}
	}
	pvcName, podName := name(t, "-pvc"), name(t, "-pod")
	if err := sb.Client.Create(ctx, sandbox.PVC(pvcName, class, "16Mi", corev1.PersistentVolumeFilesystem)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePVCAndVolume(t, pvcName) })
	pod(t, ctx, podName, pvcName, "", writeScript, false)
	waitRunning(t, ctx, podName)
	t.Cleanup(func() { deletePod(t, context.Background(), podName) })
	waitFile(t, ctx, podName, "/data/blob.sha256")
}
