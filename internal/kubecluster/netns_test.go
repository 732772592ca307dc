package kubecluster

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/loopdev"
	"github.com/meshvol/meshvol/internal/testenv"
)

// TestNodesWithNamespacesLookLikeNodes starts two nodes with namespaces of
// their own and checks what makes them look like two machines: each
// node's host-network pod has the node's name as host name, serves the
// same port, sees the node's own
// /var/lib/kubelet through a hostPath, has the node's own address, and
// reaches the apiserver with the in-cluster configuration and service
// account token Kubernetes gives it; then a crash and a teardown that
// leaves nothing (the bridge and the links included). Pods without the
// host network get a network of their own and reach each other across
// nodes.
func TestNodesWithNamespacesLookLikeNodes(t *testing.T) {
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
	dir, err := os.MkdirTemp("/tmp", "kn-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// Another program's file system on a loop device, mounted before the
	// nodes start: they must not hold it (dropForeignDeviceMounts).
	foreign := mountOnLoop(t, tmp)
	prepared := map[string]bool{}
	c, err := Start(ctx, Options{
		Dir:         dir,
		Nodes:       []NodeSpec{{"node-a", "zone-a"}, {"node-b", "zone-b"}},
		PauseBinary: pause,
		WaitForLock: true,
		Log:         testLog{t},
		CRDDirs:     []string{},
		Namespaces:  true,
		PrepareNode: func(n *Node) error {
			_, err := n.Run(ctx, "touch /var/lib/meshvol/prepared")
			prepared[n.Name] = err == nil
			return err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			if err := c.Stop(); err != nil {
				t.Error(err)
			}
		}
	}()
	for _, n := range c.Nodes {
		if !prepared[n.Name] {
			t.Errorf("PrepareNode did not run on %s", n.Name)
		}
		if _, err := os.Stat(filepath.Join(n.StateDir(), "prepared")); err != nil {
			t.Errorf("%s's /var/lib/meshvol is not its own directory: %v", n.Name, err)
		}
		var node corev1.Node
		if err := c.Env.Client.Get(ctx, client.ObjectKey{Name: n.Name}, &node); err != nil {
			t.Fatal(err)
		}
		if len(node.Status.Addresses) == 0 || node.Status.Addresses[0].Address != n.IP {
			t.Errorf("node %s has addresses %v, want %s", n.Name, node.Status.Addresses, n.IP)
		}
	}

	for _, n := range c.Nodes {
		b, err := os.ReadFile(n.MountInfo())
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), " "+foreign.dir+" ") {
			t.Errorf("node %s holds a copy of the machine's mount %s (on %s)", n.Name, foreign.dir, foreign.loop)
		}
	}
	foreign.release(t)

	// The same host port on both nodes; the node's own /var/lib/kubelet;
	// the apiserver through the kubernetes Service's address.
	script := `set -e
echo "service $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"
echo "hostname $(hostname)"
test -s /var/run/secrets/kubernetes.io/serviceaccount/token
test -s /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
echo "$NODE" > /host-kubelet/marker
echo | nc "$KUBERNETES_SERVICE_HOST" "$KUBERNETES_SERVICE_PORT" >/dev/null && echo "apiserver reached"
exec httpd -f -p 7777`
	for _, n := range c.Nodes {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "look-" + n.Name, Namespace: "default"},
			Spec: corev1.PodSpec{
				HostNetwork:                   true,
				NodeName:                      n.Name,
				TerminationGracePeriodSeconds: ptr(int64(1)),
				Containers: []corev1.Container{{
					Name:         "sh",
					Image:        BusyboxImage,
					Command:      []string{"sh", "-c", script},
					Env:          []corev1.EnvVar{{Name: "NODE", Value: n.Name}},
					VolumeMounts: []corev1.VolumeMount{{Name: "kubelet", MountPath: "/host-kubelet"}},
				}},
				Volumes: []corev1.Volume{{Name: "kubelet", VolumeSource: corev1.VolumeSource{
					HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/kubelet"}}}},
			},
		}
		if err := c.Env.Client.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.Nodes {
		name := "look-" + n.Name
		if err := waitFor(ctx, 2*time.Minute, func() (bool, error) {
			out, err := c.Kubectl(ctx, "logs", name)
			return err == nil && strings.Contains(out, "apiserver reached"), nil
		}, name+" to reach the apiserver"); err != nil {
			out, _ := c.Kubectl(ctx, "describe", "pod", name)
			logs, _ := c.Kubectl(ctx, "logs", name)
			t.Fatalf("%v\n%s\n%s", err, out, logs)
		}
		out, _ := c.Kubectl(ctx, "logs", name)
		if !strings.Contains(out, "service 127.0.0.1:443") {
			t.Errorf("%s: in-cluster configuration %q, want the kubernetes Service at 127.0.0.1:443", name, out)
		}
		if !strings.Contains(out, "hostname "+n.Name+"\n") {
			t.Errorf("%s: host name %q, want the node's name %s", name, out, n.Name)
		}
		b, err := os.ReadFile(filepath.Join(n.KubeletRootDir, "marker"))
		if err != nil || strings.TrimSpace(string(b)) != n.Name {
			t.Errorf("%s wrote %q to its hostPath /var/lib/kubelet, found in %s (%v)", name, b, n.KubeletRootDir, err)
		}
	}
	// Both still serve port 7777: each node has its own ports.
	time.Sleep(2 * time.Second)
	for _, n := range c.Nodes {
		var p corev1.Pod
		if err := c.Env.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "look-" + n.Name}, &p); err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].RestartCount != 0 {
			t.Errorf("pod %s: phase %s, statuses %+v: the port is not its node's own", p.Name, p.Status.Phase, p.Status.ContainerStatuses)
		}
		if _, err := n.Run(ctx, "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc 127.0.0.1 7777"); err != nil {
			t.Errorf("port 7777 on %s: %v", n.Name, err)
		}
	}

	podNetwork(t, ctx, c)

	if err := c.Node("node-b").Crash(); err != nil {
		t.Fatal(err)
	}
	host := c.host
	stopped = true
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(host); len(left) > 0 {
		t.Fatalf("left on the machine: %v", left)
	}
}

// podNetwork checks that pods without the host network get one of their own
// (the pod network of netns.go): an address in their node's pod subnet, and
// a connection to a pod on the other node.
func podNetwork(t *testing.T, ctx context.Context, c *Cluster) {
	t.Helper()
	a, b := c.Nodes[0], c.Nodes[1]
	mk := func(name string, n *Node, script string) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.PodSpec{
				NodeName:                      n.Name,
				TerminationGracePeriodSeconds: ptr(int64(1)),
				Containers:                    []corev1.Container{{Name: "sh", Image: BusyboxImage, Command: []string{"sh", "-c", script}}},
			},
		}
		if err := c.Env.Client.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	mk("serve-"+b.Name, b, "while true; do echo hello-from-pod | nc -l -p 8080; done")
	var ip string
	if err := waitFor(ctx, 2*time.Minute, func() (bool, error) {
		var p corev1.Pod
		if err := c.Env.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "serve-" + b.Name}, &p); err != nil {
			return false, err
		}
		ip = p.Status.PodIP
		return p.Status.Phase == corev1.PodRunning && ip != "", nil
	}, "the pod on "+b.Name+" to run with an address"); err != nil {
		out, _ := c.Kubectl(ctx, "describe", "pod", "serve-"+b.Name)
		t.Fatalf("%v\n%s", err, out)
	}
	if want := strings.TrimSuffix(podSubnet(b.IP), "0/24"); !strings.HasPrefix(ip, want) {
		t.Errorf("pod on %s has address %s, not in its pod subnet %s", b.Name, ip, podSubnet(b.IP))
	}
	mk("client-"+a.Name, a, "until nc "+ip+" 8080; do sleep 1; done; sleep 3600")
	if err := waitFor(ctx, 2*time.Minute, func() (bool, error) {
		out, err := c.Kubectl(ctx, "logs", "client-"+a.Name)
		return err == nil && strings.Contains(out, "hello-from-pod"), nil
	}, "the pod on "+a.Name+" to reach the pod on "+b.Name+" at "+ip); err != nil {
		out, _ := c.Kubectl(ctx, "describe", "pod", "client-"+a.Name)
		t.Fatalf("%v\n%s", err, out)
	}
}

// loopMount is a file system on a loop device, mounted on dir.
type loopMount struct{ dir, loop string }

// mountOnLoop makes an ext4 file system in a file under parent, attaches it to
// a loop device and mounts it; the test's cleanup releases it if the test
// did not.
func mountOnLoop(t *testing.T, parent string) *loopMount {
	t.Helper()
	img, dir := filepath.Join(parent, "foreign.img"), filepath.Join(parent, "foreign")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v: %s", name, args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run("truncate", "-s", "16M", img)
	run("mkfs.ext4", "-q", img)
	m := &loopMount{dir: dir, loop: run("losetup", "--find", "--show", img)}
	run("mount", m.loop, dir)
	t.Cleanup(func() {
		_ = exec.Command("umount", dir).Run()
		_ = exec.Command("losetup", "-d", m.loop).Run()
	})
	return m
}

// release unmounts the file system and detaches its loop device, and fails
// the test if the device stays in use: it must be free once its owner is done.
func (m *loopMount) release(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("umount", m.dir).CombinedOutput(); err != nil {
		t.Fatalf("umount %s: %v: %s", m.dir, err, out)
	}
	if out, err := exec.Command("losetup", "-d", m.loop).CombinedOutput(); err != nil {
		t.Fatalf("losetup -d %s: %v: %s", m.loop, err, out)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		left := loopdev.Under(filepath.Dir(m.dir))
		if len(left) == 0 {
			return // detached
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still backs %s 10 s after its owner unmounted it and detached it: something else holds the file system", left[0].Dev, left[0].Backing)
		}
	}
}
