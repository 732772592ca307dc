package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/kubecluster"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
)

// The demonstration's objects, in the default namespace.
const (
	DemoPVC        = "demo"
	DemoDeployment = "demo"
)

// DemoStorageClass is the demonstration's class unless its caller names
// another: three Diskful replicas, two of three voters left after the crash.
// The default 2D+1TB class fails over on three nodes too (`make
// e2e-crash-2d1tb`), since the engine drops a lost voter at once when
// nothing is attached (docs/datamesh.md).
const DemoStorageClass = "meshvol-3d"

// demoScript is the demonstration pod's script: on the first start it
// writes a file of random data and its checksum onto the volume; on every
// start it checks the file against the checksum and says so in its log,
// then stays up. `sync -f` flushes the volume's file system (syncfs(2)), not
// every file system of the machine as a bare sync does: one stuck device
// elsewhere on the machine would hold a bare sync, and the pod, for ever.
const demoScript = `set -e
cd /data
if [ ! -f hello.sha256 ]; then
  head -c 1048576 /dev/urandom > hello.bin
  sha256sum hello.bin > hello.sha256
  sync -f .
  echo "wrote hello.bin on $NODE: $(cat hello.sha256)"
fi
sha256sum -c hello.sha256 && echo "checksum verified on $NODE"
exec sleep 2147483647
`

// DemoPodSpec is a host-network busybox pod with the PVC at /data.
func DemoPodSpec(pvc string, script string) corev1.PodSpec {
	grace := int64(1)
	return corev1.PodSpec{
		// The nodes' network is loopback only: pods share the host's.
		HostNetwork:                   true,
		TerminationGracePeriodSeconds: &grace,
		Containers: []corev1.Container{{
			Name:    "app",
			Image:   kubecluster.BusyboxImage,
			Command: []string{"sh", "-c", script},
			Env: []corev1.EnvVar{{Name: "NODE", ValueFrom: &corev1.EnvVarSource{
				FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}},
			VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
		}},
		Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: pvc}}}},
	}
}

// PVC returns a ReadWriteOnce claim of size on class.
func PVC(name, class, size string, mode corev1.PersistentVolumeMode) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &class,
			VolumeMode:       &mode,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}
}

// DemoResult is what the demonstration measured.
type DemoResult struct {
	Checksum     string
	FirstNode    string
	SecondNode   string
	CrashToReady time.Duration
}

// Demo runs the demonstration on storage class class (DemoStorageClass
// unless the caller wants another), printing each step and `kubectl get` to
// w: a PVC, a Deployment of one pod that writes a file and its checksum, the
// crash of the pod's node, and the pod back on another node with the same
// checksum.
func (s *Sandbox) Demo(ctx context.Context, w io.Writer, class string) (*DemoResult, error) {
	began0 := time.Now()
	step := func(format string, args ...any) {
		fmt.Fprintf(w, "\n== [demo +%.1fs] "+format+"\n", append([]any{time.Since(began0).Seconds()}, args...)...)
	}
	get := func() {
		out, err := s.Kube.Kubectl(ctx, "get", "rv,rvr,rva,pvc,pv,pod", "-o", "wide")
		if err != nil {
			fmt.Fprintf(w, "(kubectl get: %v)\n", err)
			return
		}
		fmt.Fprint(w, out)
	}
	res := &DemoResult{}

	step("a PersistentVolumeClaim on %s (WaitForFirstConsumer: it stays Pending until a pod needs it)", class)
	if err := s.Client.Create(ctx, PVC(DemoPVC, class, "64Mi", corev1.PersistentVolumeFilesystem)); err != nil {
		return nil, err
	}
	get()

	step("a Deployment of one pod that writes 1 MiB of random data and its checksum onto the volume")
	one := int32(1)
	labels := map[string]string{"app": DemoDeployment}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: DemoDeployment, Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			// Never two pods at once: the volume is ReadWriteOnce.
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       DemoPodSpec(DemoPVC, demoScript),
			},
		},
	}
	began := time.Now()
	if err := s.Client.Create(ctx, dep); err != nil {
		return nil, err
	}
	pod, err := s.WaitPodRunning(ctx, labels, "", 3*time.Minute)
	if err != nil {
		return nil, err
	}
	res.FirstNode = pod.Spec.NodeName
	sum, err := s.podChecksum(ctx, pod.Name)
	if err != nil {
		return nil, err
	}
	res.Checksum = sum
	fmt.Fprintf(w, "pod %s Running on %s %s after it was created; sha256 of /data/hello.bin: %s\n",
		pod.Name, pod.Spec.NodeName, time.Since(began).Round(100*time.Millisecond), sum)
	get()

	step("crash of %s: its kubelet, containerd, shims and containers, its meshvol agent and its DRBD, all at once", res.FirstNode)
	crashed := time.Now()
	if err := s.CrashNode(res.FirstNode); err != nil {
		return nil, err
	}
	tl := s.watchFailover(ctx, crashed, res.FirstNode, pod.Name, labels)
	pod2, err := s.WaitPodRunning(ctx, labels, res.FirstNode, 2*time.Minute)
	res.CrashToReady = time.Since(crashed)
	if err == nil {
		// The wait may see the pod Running before the watcher's next poll.
		tl.mark(fmt.Sprintf("pod %s Running", pod2.Name))
	}
	tl.stop()
	fmt.Fprint(w, tl.String())
	if err != nil {
		get()
		return nil, err
	}
	res.SecondNode = pod2.Spec.NodeName
	sum2, err := s.podChecksum(ctx, pod2.Name)
	if err != nil {
		return nil, err
	}
	if sum2 != sum {
		get()
		return res, fmt.Errorf("sandbox: the data changed: sha256 %s on %s, %s on %s", sum, res.FirstNode, sum2, res.SecondNode)
	}
	step("pod %s Running on %s %s after the crash, the same data (sha256 %s)",
		pod2.Name, res.SecondNode, res.CrashToReady.Round(100*time.Millisecond), sum2)
	get()
	return res, nil
}

// failover records when each thing a pod's move off a crashed node waits
// for was first seen, to say where the time goes.
type failover struct {
	began  time.Time
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	seen   []milestone
}

type milestone struct {
	what string
	at   time.Duration
}

func (f *failover) mark(what string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.seen {
		if m.what == what {
			return
		}
	}
	f.seen = append(f.seen, milestone{what, time.Since(f.began)})
}

func (f *failover) stop() {
	f.cancel()
	<-f.done
}

func (f *failover) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, m := range f.seen {
		fmt.Fprintf(&b, "  +%5.1fs  %s\n", m.at.Seconds(), m.what)
	}
	return b.String()
}

// watchFailover polls, until stopped, what moves the pod: the Node object
// and its taint, meshvol's view of the node, the old pod, the new pod and
// its VolumeAttachment.
func (s *Sandbox) watchFailover(ctx context.Context, began time.Time, node, oldPod string, labels map[string]string) *failover {
	ctx, cancel := context.WithCancel(ctx)
	f := &failover{began: began, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		for ctx.Err() == nil {
			var n corev1.Node
			if err := s.Client.Get(ctx, client.ObjectKey{Name: node}, &n); err == nil {
				for _, c := range n.Status.Conditions {
					if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
						f.mark(fmt.Sprintf("node %s NotReady (kube-controller-manager)", node))
					}
				}
				for _, t := range n.Spec.Taints {
					if t.Key == controller.TaintOutOfService.Key {
						f.mark(fmt.Sprintf("node %s tainted %s by meshvol's controller", node, t.Key))
					}
				}
			}
			var pods corev1.PodList
			if err := s.Client.List(ctx, &pods, client.InNamespace("default"), client.MatchingLabels(labels)); err == nil {
				oldThere := false
				for _, p := range pods.Items {
					if p.Name == oldPod {
						oldThere = true
						if p.DeletionTimestamp != nil {
							f.mark(fmt.Sprintf("pod %s being deleted", oldPod))
						}
						continue
					}
					if p.Spec.NodeName != "" {
						f.mark(fmt.Sprintf("pod %s scheduled to %s", p.Name, p.Spec.NodeName))
					}
					if p.Status.Phase == corev1.PodRunning {
						f.mark(fmt.Sprintf("pod %s Running", p.Name))
					}
				}
				if !oldThere {
					f.mark(fmt.Sprintf("pod %s gone", oldPod))
				}
			}
			var rvas v1.ReplicatedVolumeAttachmentList
			if err := s.Client.List(ctx, &rvas); err == nil {
				for _, a := range rvas.Items {
					switch {
					case a.Spec.NodeName == node && a.Status.Phase == v1.AttachmentDetaching:
						f.mark(fmt.Sprintf("RVA %s Detaching", a.Name))
					case a.Spec.NodeName != node && a.Status.Phase == v1.AttachmentAttached:
						f.mark(fmt.Sprintf("RVA %s Attached (meshvol promoted %s)", a.Name, a.Spec.NodeName))
					}
				}
			}
			var vas storagev1.VolumeAttachmentList
			if err := s.Client.List(ctx, &vas); err == nil {
				for _, va := range vas.Items {
					if va.Spec.NodeName != node && va.Status.Attached {
						f.mark(fmt.Sprintf("volume attached to %s (VolumeAttachment %s)", va.Spec.NodeName, va.Name))
					}
				}
				gone := true
				for _, va := range vas.Items {
					gone = gone && va.Spec.NodeName != node
				}
				if gone {
					f.mark(fmt.Sprintf("VolumeAttachment on %s gone (detached)", node))
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return f
}

// WaitPodRunning waits for a Running, ready pod with those labels on any
// node but notOn, and returns it.
func (s *Sandbox) WaitPodRunning(ctx context.Context, labels map[string]string, notOn string, timeout time.Duration) (*corev1.Pod, error) {
	deadline := time.Now().Add(timeout)
	for {
		var pods corev1.PodList
		if err := s.Client.List(ctx, &pods, client.InNamespace("default"), client.MatchingLabels(labels)); err == nil {
			for i := range pods.Items {
				p := &pods.Items[i]
				if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Spec.NodeName != notOn && podReady(p) {
					return p, nil
				}
			}
		}
		if time.Now().After(deadline) {
			out, _ := s.Kube.Kubectl(ctx, "describe", "pod", "-l", labelSelector(labels))
			return nil, fmt.Errorf("sandbox: no pod %s Running within %s:\n%s", labelSelector(labels), timeout, out)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func labelSelector(l map[string]string) string {
	var parts []string
	for k, v := range l {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

// podChecksum checks the file against the checksum written with it, in the
// pod, and returns the checksum.
func (s *Sandbox) podChecksum(ctx context.Context, pod string) (string, error) {
	var out string
	var err error
	// The file is written right after the pod starts, but only the log line
	// the script prints after its sync says the data is on the volume: a
	// node that crashes before takes the written data with its page cache,
	// as any machine would (the flush takes seconds when the machine is
	// busy).
	for try := 0; try < 120; try++ {
		out, err = s.Kube.Kubectl(ctx, "logs", pod)
		if err == nil && !strings.Contains(out, "checksum verified on") {
			err = errors.New("the pod has not yet said its data is synced (\"checksum verified on\" in its log)")
		}
		if err == nil {
			out, err = s.Kube.Kubectl(ctx, "exec", pod, "--", "sh", "-c", "cd /data && sha256sum -c hello.sha256 >/dev/null && cut -d' ' -f1 hello.sha256")
		}
		if err == nil {
			return strings.TrimSpace(out), nil
		}
		time.Sleep(250 * time.Millisecond)
	}
	return "", fmt.Errorf("sandbox: checking the data in pod %s: %w", pod, err)
}
