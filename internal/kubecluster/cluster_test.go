package kubecluster

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/testenv"
)

// TestClusterRunsPodsAndLeavesNothing starts two real kubelet nodes, runs a
// host-network busybox pod through the scheduler on one of them, reads its
// logs and execs into it through the apiserver, crashes a node, and checks
// that the teardown leaves nothing on the machine.
func TestClusterRunsPodsAndLeavesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: it mounts, creates cgroups and runs containers (`make test` runs as root here and in CI)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	pause, err := BuildPause(ctx, root, tmp)
	if err != nil {
		t.Fatal(err)
	}
	// A short directory: unix socket paths live beneath it.
	dir, err := os.MkdirTemp("/tmp", "kc-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)

	began := time.Now()
	c, err := Start(ctx, Options{
		Dir:         dir,
		Nodes:       []NodeSpec{{"node-a", "zone-a"}, {"node-b", "zone-b"}},
		PauseBinary: pause,
		WaitForLock: true,
		Log:         testLog{t},
		CRDDirs:     []string{},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster of %d nodes Ready in %s (after %s waiting for the machine)", len(c.Nodes), (time.Since(began) - c.LockWait).Round(time.Millisecond), c.LockWait.Round(time.Second))
	stopped := false
	defer func() {
		if !stopped {
			if err := c.Stop(); err != nil {
				t.Error(err)
			}
		}
	}()

	// A second cluster on the machine is refused while this one runs.
	if _, err := hostLock(context.Background(), false, t.Logf); !errors.Is(err, ErrBusy) {
		t.Fatalf("a second lock while the cluster runs: %v, want ErrBusy", err)
	}
	// One that waits for it gives up when its context ends (Ctrl-C of
	// `meshvol-sandbox -wait`).
	waitCtx, cancelWait := context.WithTimeout(ctx, time.Second)
	_, err = hostLock(waitCtx, true, t.Logf)
	cancelWait()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting for the lock while the cluster runs, for a second: %v, want the context's deadline", err)
	}

	// Each node's zone label, set by its kubelet.
	for _, n := range c.Nodes {
		var node corev1.Node
		if err := c.Env.Client.Get(ctx, client.ObjectKey{Name: n.Name}, &node); err != nil {
			t.Fatal(err)
		}
		if node.Labels["topology.kubernetes.io/zone"] != n.Zone {
			t.Errorf("node %s has zone label %q, want %q", n.Name, node.Labels["topology.kubernetes.io/zone"], n.Zone)
		}
	}

	// The scheduler places the pod (no nodeName), the kubelet runs it.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "default"},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": "node-b"},
			TerminationGracePeriodSeconds: ptr(int64(1)),
			Containers: []corev1.Container{{
				Name:    "sh",
				Image:   BusyboxImage,
				Command: []string{"sh", "-c", "echo hello from $(hostname) > /tmp/greeting; cat /tmp/greeting; exec sleep 3600"},
			}},
		},
	}
	if err := c.Env.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	began = time.Now()
	if err := waitFor(ctx, 2*time.Minute, func() (bool, error) {
		if err := c.Env.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return false, nil
		}
		return pod.Status.Phase == corev1.PodRunning, nil
	}, "the pod to run"); err != nil {
		out, _ := c.Kubectl(ctx, "describe", "pod", "hello")
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("pod Running on %s in %s", pod.Spec.NodeName, time.Since(began).Round(time.Millisecond))
	if pod.Spec.NodeName != "node-b" {
		t.Fatalf("pod on %s, want node-b", pod.Spec.NodeName)
	}
	// Logs and exec go from the apiserver to the kubelet, with the
	// client certificate the kubelets trust.
	if err := waitFor(ctx, 30*time.Second, func() (bool, error) {
		out, err := c.Kubectl(ctx, "logs", "hello")
		return err == nil && strings.Contains(out, "hello from"), nil
	}, "the pod's log"); err != nil {
		t.Fatal(err)
	}
	out, err := c.Kubectl(ctx, "exec", "hello", "--", "cat", "/tmp/greeting")
	if err != nil || !strings.Contains(out, "hello from") {
		t.Fatalf("kubectl exec: %q, %v", out, err)
	}

	// The crash kills the node's kubelet, containerd, shim and the pod's
	// processes at once, and nothing of node-a.
	b := c.Node("node-b")
	if len(cgroupTreePIDs(b.CgroupRoot)) < 4 {
		t.Fatalf("node-b runs only %v", cgroupTreePIDs(b.CgroupRoot))
	}
	aBefore := len(cgroupTreePIDs(c.Node("node-a").CgroupRoot))
	if err := b.Crash(); err != nil {
		t.Fatal(err)
	}
	if pids := cgroupTreePIDs(b.CgroupRoot); len(pids) != 0 {
		t.Fatalf("processes %v survived the crash of node-b", pids)
	}
	if aAfter := len(cgroupTreePIDs(c.Node("node-a").CgroupRoot)); aAfter < aBefore {
		t.Fatalf("node-a had %d processes before node-b crashed, %d after", aBefore, aAfter)
	}
	// kube-controller-manager sees the node go (10 s grace period).
	began = time.Now()
	if err := waitFor(ctx, time.Minute, func() (bool, error) {
		var node corev1.Node
		if err := c.Env.Client.Get(ctx, client.ObjectKey{Name: "node-b"}, &node); err != nil {
			return false, nil
		}
		return !nodeReady(&node), nil
	}, "node-b to be NotReady"); err != nil {
		t.Fatal(err)
	}
	t.Logf("node-b NotReady %s after the crash", time.Since(began).Round(time.Millisecond))

	host := c.host
	stopped = true
	began = time.Now()
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("teardown in %s", time.Since(began).Round(time.Millisecond))
	// Stop checked the whole machine (leftovers: the cgroup, shared files,
	// network links, sysctls, mounts, processes) while it still held the
	// machine's lock, and fails if anything was left. Since it released the
	// lock, another cluster waiting for it may have started and made its
	// own cgroup (same name), links and files: from here on only what is
	// this cluster's by name is checked.
	if ms := mountsUnder(host.Dir); len(ms) > 0 {
		t.Fatalf("mounts under the cluster's directory: %v", ms)
	}
	for _, pid := range processesWithRoot(host.Dir) {
		if processAlive(pid) {
			t.Errorf("process %d (%s) of the cluster still runs", pid, procName(pid))
		}
	}
	if st, err := loadHostState(); err != nil {
		t.Fatal(err)
	} else if st != nil && st.PID == os.Getpid() {
		t.Fatalf("the host state record of this cluster (%s) is still there", st.Dir)
	}
}

type testLog struct{ t *testing.T }

func (l testLog) Write(b []byte) (int, error) {
	l.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

func ptr[T any](v T) *T { return &v }
