package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/meshvol/meshvol/internal/sandbox"
	"github.com/meshvol/meshvol/internal/testenv"
)

// TestKubectlMeshvol runs the plugin as users run it, `kubectl meshvol`, the
// binary `make build` builds found on PATH by kubectl, against the installed
// driver (docs/operating.md): status of a claim's volume and nodes, then a node
// maintenance: drain of the node where a pod writes (Draining, naming the claim,
// until the pod is deleted; then ReadyForMaintenance), the node's crash and
// restart (kubelet, agent and DRBD), uncordon (Completed once its replica is in
// sync again), and the volume Ready again. File name before e2e_test.go:
// TestNodeCrash there leaves a node dead.
func TestKubectlMeshvol(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	kubectl := pluginOnPath(t, ctx)
	const claim = "plugin"
	if err := sb.Client.Create(ctx, sandbox.PVC(claim, sandbox.DemoStorageClass, "64Mi", corev1.PersistentVolumeFilesystem)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePVCAndVolume(t, claim) })
	pod(t, ctx, claim, claim, "", sleepScript, false)
	node := waitRunning(t, ctx, claim).Spec.NodeName
	vol := pvcBound(t, ctx, claim).Spec.VolumeName

	status := kubectl(t, "status", claim)
	for _, want := range []string{"ReplicatedVolume " + vol + " (PVC default/" + claim + ")", "Phase:      Ready", "3/3 Diskful UpToDate"} {
		if !strings.Contains(status, want) {
			t.Errorf("kubectl meshvol status %s lacks %q:\n%s", claim, want, status)
		}
	}
	nodes := kubectl(t, "nodes")
	for _, n := range sb.Kube.Nodes {
		if row := line(nodes, n.Name+" "); !strings.Contains(row, "Live") || n.Name == node && !strings.Contains(row, vol) {
			t.Errorf("kubectl meshvol nodes: %s is not Live (or lacks %s attached): %q\n%s", n.Name, vol, row, nodes)
		}
	}

	var drain testenv.LockedBuffer
	done := make(chan error, 1)
	go func() { done <- kubectlTo(ctx, &drain, "drain", node, "--timeout", "5m") }()
	waitUntil(t, ctx, 2*time.Minute, "drain of "+node+" naming "+claim, func() (bool, string) {
		out := drain.String()
		return strings.Contains(out, "Draining: Waiting for the volumes attached on node "+node+" to detach: "+vol) &&
			strings.Contains(out, vol+" is PVC default/"+claim+": move the pods that use it"), out
	})
	deletePod(t, ctx, claim)
	if err := <-done; err != nil || !strings.Contains(drain.String(), "ReadyForMaintenance: Node "+node+" may be taken down") {
		t.Fatalf("kubectl meshvol drain %s: %v\n%s", node, err, drain.String())
	}
	t.Logf("kubectl meshvol drain %s:\n%s", node, drain.String())

	if err := sb.CrashNode(node); err != nil {
		t.Fatal(err)
	}
	if err := sb.RestartNode(ctx, node); err != nil {
		t.Fatal(err)
	}
	back := kubectl(t, "uncordon", node, "--timeout", "5m")
	if !strings.Contains(back, "Completed: Node "+node+" is back") {
		t.Errorf("kubectl meshvol uncordon %s:\n%s", node, back)
	}
	t.Logf("kubectl meshvol uncordon %s:\n%s", node, back)
	waitUntil(t, ctx, 2*time.Minute, vol+" Ready after the maintenance", func() (bool, string) {
		out := kubectl(t, "status", claim)
		return strings.Contains(out, "Phase:      Ready") && strings.Contains(out, "3/3 Diskful UpToDate"), out
	})
}

// pluginOnPath builds the plugin into a directory of the test's own and returns
// a runner of `kubectl meshvol ARGS --kubeconfig ADMIN` with that directory on
// PATH: kubectl finds the plugin as it finds any (kubectl-meshvol on PATH).
func pluginOnPath(t *testing.T, ctx context.Context) func(t *testing.T, args ...string) string {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	build := osexec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, "kubectl-meshvol"), "./cmd/kubectl-meshvol")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the plugin: %v\n%s", err, out)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return func(t *testing.T, args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := kubectlTo(ctx, &out, args...); err != nil {
			t.Fatalf("kubectl meshvol %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
		return out.String()
	}
}

// kubectlTo runs `kubectl meshvol ARGS` (the plugin's name first: kubectl reads
// no flag before it), writing its output to out.
func kubectlTo(ctx context.Context, out io.Writer, args ...string) error {
	cmd := osexec.CommandContext(ctx, filepath.Join(sb.Kube.BinDir, "kubectl"), append(append([]string{"meshvol"}, args...), "--kubeconfig", sb.Kube.Kubeconfig)...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = out, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%w: %s", err, stderr.String())
	}
	return nil
}

// line is the first line of out that contains s.
func line(out, s string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}
