package sandbox

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/kubecluster"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
)

// A failover, measured: a Deployment of one writer pod on a meshvol volume,
// a fault of its node, and every step until the pod writes again on
// another node, with the check that no acknowledged write was lost.
//
// The writer keeps a counter in /data/counter, overwritten in place and
// fsynced (dd conv=notrunc,fsync) every 50 ms, and appends one line per
// event to an acknowledgement log outside the volume — a hostPath on the
// machine's disk, which a node's crash does not take — stamped with the
// kernel's uptime (/proc/uptime, 10 ms; busybox's date has no
// sub-second format): "start N" (the counter it found), "try N", "ack N"
// (the fsync of N returned) or "fail N <error>". A write acknowledged is
// one whose ack line is in the log, so the counter a new pod finds must be
// at least the last acknowledged value of the pod before it.
const writerScript = `set -u
acks=/acks/$POD_NAME
up() { read u _ < /proc/uptime; echo $u; }
i=0
[ -s /data/counter ] && read i < /data/counter
echo "start $i $(up) $NODE" >> $acks
while :; do
  i=$((i+1))
  echo "try $i $(up)" >> $acks
  if printf '%12d\n' $i | dd of=/data/counter bs=13 count=1 conv=notrunc,fsync 2>/tmp/err; then
    echo "ack $i $(up)" >> $acks
  else
    echo "fail $i $(up) $(tr '\n' ' ' < /tmp/err)" >> $acks
    i=$((i-1))
    sleep 0.2
  fi
  sleep 0.05
done
`

// Fault is what happens to the writer's node.
type Fault string

const (
	// FaultCrash: the node crashes (CrashNode).
	FaultCrash Fault = "crash"
	// FaultPartition: the node keeps running, cut off from its DRBD peers
	// and from the control plane (Partition).
	FaultPartition Fault = "partition"
)

// FailoverOptions choose a failover run.
type FailoverOptions struct {
	// Name names the run's Deployment, its claim (Name-data) and pods.
	Name  string
	Class string
	// Node is where the first pod should run (a preference the scheduler
	// follows when it can); empty lets it choose.
	Node  string
	Fault Fault
}

// FailoverResult is what a run measured. The durations run from the fault.
type FailoverResult struct {
	Name, Class string
	Fault       Fault
	From, To    string
	// Detected: the node tainted storage.meshvol.io/lost by meshvol's
	// controller (declared lost, its pods about to be freed).
	Detected time.Duration
	// PodDeleted: the old pod object gone.
	PodDeleted time.Duration
	// Detached: no VolumeAttachment of the volume left on the old node.
	Detached time.Duration
	// Primary: meshvol attached the volume on the new node (its RVA
	// Attached: the replica there promoted).
	Primary time.Duration
	// Attached: the new node's VolumeAttachment attached.
	Attached time.Duration
	// Running: the new pod Running and Ready.
	Running time.Duration
	// FirstWrite: the new pod's first acknowledged write.
	FirstWrite time.Duration
	// LastAck is the old pod's last acknowledged counter, Resumed the
	// counter the new pod found on the volume.
	LastAck, Resumed int
	// OldAfterFault is what the old pod's log shows after the fault: its
	// writes acknowledged, failed, and the last write it tried.
	OldAfterFault WriterLog
	// Steps are the milestones in the order seen, for a report.
	Steps []string

	pvc, pv, volume, oldPod, oldContainer string
}

// WriterLog summarizes a writer's acknowledgement log.
type WriterLog struct {
	Acks, Fails int
	// LastAck and LastTry are counters (0: none); FirstFail is the first
	// failure's line.
	LastAck, LastTry int
	FirstFail        string
	// LastAckAt is the last acknowledgement's uptime stamp.
	LastAckAt time.Duration
}

// ackDir is the directory of the writers' logs on the machine, mounted
// into each writer pod at /acks.
func (s *Sandbox) ackDir() string { return filepath.Join(s.opts.Dir, "acks") }

// writerDeployment is a Deployment of one writer pod on claim pvc.
func (s *Sandbox) writerDeployment(name, pvc, node string) *appsv1.Deployment {
	one := int32(1)
	labels := map[string]string{"failover": name}
	spec := DemoPodSpec(pvc, writerScript)
	spec.Containers[0].Env = append(spec.Containers[0].Env, corev1.EnvVar{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}})
	spec.Containers[0].VolumeMounts = append(spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "acks", MountPath: "/acks"})
	dirOrCreate := corev1.HostPathDirectoryOrCreate
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "acks", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: s.ackDir(), Type: &dirOrCreate}}})
	if node != "" {
		spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
				Weight: 100,
				Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}},
			}},
		}}
	}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec},
		},
	}
}

// StartWriter creates the run's claim and writer Deployment and waits for
// the writer's first acknowledged writes.
func (s *Sandbox) StartWriter(ctx context.Context, o FailoverOptions) (*FailoverResult, error) {
	if err := os.MkdirAll(s.ackDir(), 0o755); err != nil {
		return nil, err
	}
	r := &FailoverResult{Name: o.Name, Class: o.Class, Fault: o.Fault, pvc: o.Name + "-data"}
	if err := s.Client.Create(ctx, PVC(r.pvc, o.Class, "64Mi", corev1.PersistentVolumeFilesystem)); err != nil {
		return nil, err
	}
	if err := s.Client.Create(ctx, s.writerDeployment(o.Name, r.pvc, o.Node)); err != nil {
		return nil, err
	}
	p, err := s.WaitPodRunning(ctx, map[string]string{"failover": o.Name}, "", 3*time.Minute)
	if err != nil {
		return nil, err
	}
	r.From, r.oldPod = p.Spec.NodeName, p.Name
	if len(p.Status.ContainerStatuses) > 0 {
		_, r.oldContainer, _ = strings.Cut(p.Status.ContainerStatuses[0].ContainerID, "://")
	}
	var pvc corev1.PersistentVolumeClaim
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: r.pvc}, &pvc); err != nil {
		return nil, err
	}
	r.pv = pvc.Spec.VolumeName
	var pv corev1.PersistentVolume
	if err := s.Client.Get(ctx, client.ObjectKey{Name: r.pv}, &pv); err != nil {
		return nil, err
	}
	if pv.Spec.CSI != nil {
		r.volume = pv.Spec.CSI.VolumeHandle
	}
	deadline := time.Now().Add(time.Minute)
	for {
		l, err := s.WriterLog(r.oldPod, 0)
		if err == nil && l.Acks >= 10 {
			return r, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("sandbox: writer %s acknowledged %d writes in a minute (%v)", r.oldPod, l.Acks, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Uptime is the kernel's uptime, the clock of the writers' logs.
func Uptime() (time.Duration, error) {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, errors.New("sandbox: /proc/uptime is empty")
	}
	return parseUptime(f[0])
}

func parseUptime(s string) (time.Duration, error) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("sandbox: uptime %q: %w", s, err)
	}
	return time.Duration(v * float64(time.Second)), nil
}

// WriterLog summarizes a writer pod's acknowledgement log from the
// kernel's uptime since on (Uptime).
func (s *Sandbox) WriterLog(pod string, since time.Duration) (WriterLog, error) {
	var l WriterLog
	f, err := os.Open(filepath.Join(s.ackDir(), pod))
	if err != nil {
		return l, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 3 {
			continue // a line cut short by a crash
		}
		n, err1 := strconv.Atoi(fs[1])
		at, err2 := parseUptime(fs[2])
		if err1 != nil || err2 != nil || at < since {
			continue
		}
		switch fs[0] {
		case "ack":
			l.Acks++
			l.LastAck, l.LastAckAt = n, at
		case "try":
			l.LastTry = n
		case "fail":
			l.Fails++
			if l.FirstFail == "" {
				l.FirstFail = sc.Text()
			}
		}
	}
	return l, sc.Err()
}

// writerStart is the counter a writer pod found on the volume and when,
// from the "start" line of its log.
func (s *Sandbox) writerStart(pod string) (n int, at time.Duration, ok bool) {
	b, err := os.ReadFile(filepath.Join(s.ackDir(), pod))
	if err != nil {
		return 0, 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		fs := strings.Fields(line)
		if len(fs) >= 3 && fs[0] == "start" {
			n, err1 := strconv.Atoi(fs[1])
			at, err2 := parseUptime(fs[2])
			return n, at, err1 == nil && err2 == nil
		}
	}
	return 0, 0, false
}

// firstAck is the uptime of a writer's first acknowledged write.
func (s *Sandbox) firstAck(pod string) (time.Duration, bool) {
	b, err := os.ReadFile(filepath.Join(s.ackDir(), pod))
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		fs := strings.Fields(line)
		if len(fs) >= 3 && fs[0] == "ack" {
			at, err := parseUptime(fs[2])
			return at, err == nil
		}
	}
	return 0, false
}

// Failover applies the fault to the writer's node and follows the failover
// until the new pod's first acknowledged write, then checks the counter
// the new pod found against the old pod's last acknowledged write.
func (s *Sandbox) Failover(ctx context.Context, r *FailoverResult, timeout time.Duration) error {
	fault, err := Uptime()
	if err != nil {
		return err
	}
	began := time.Now()
	switch r.Fault {
	case FaultCrash:
		err = s.CrashNode(r.From)
	case FaultPartition:
		err = s.Partition(r.From, true, true)
	default:
		err = fmt.Errorf("sandbox: no fault %q", r.Fault)
	}
	if err != nil {
		return err
	}
	labels := map[string]string{"failover": r.Name}
	seen := func(d *time.Duration, what string) {
		if *d == 0 {
			*d = time.Since(began)
			r.Steps = append(r.Steps, fmt.Sprintf("+%5.2fs  %s", d.Seconds(), what))
		}
	}
	deadline := time.Now().Add(timeout)
	for r.FirstWrite == 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox: %s of %s: no write on another node within %s; seen:\n  %s", r.Fault, r.From, timeout, strings.Join(r.Steps, "\n  "))
		}
		var n corev1.Node
		if err := s.Client.Get(ctx, client.ObjectKey{Name: r.From}, &n); err == nil {
			for _, t := range n.Spec.Taints {
				if t.Key == controller.TaintLost.Key {
					seen(&r.Detected, "node "+r.From+" declared lost (tainted "+t.Key+")")
				}
			}
		}
		var pods corev1.PodList
		if err := s.Client.List(ctx, &pods, client.InNamespace("default"), client.MatchingLabels(labels)); err == nil {
			old := false
			for _, p := range pods.Items {
				if p.Name == r.oldPod {
					old = true
					continue
				}
				if p.Status.Phase == corev1.PodRunning && podReady(&p) && p.Spec.NodeName != r.From {
					r.To = p.Spec.NodeName
					seen(&r.Running, "pod "+p.Name+" Running on "+p.Spec.NodeName)
					if at, ok := s.firstAck(p.Name); ok {
						r.FirstWrite = at - fault
						r.Steps = append(r.Steps, fmt.Sprintf("+%5.2fs  pod %s's first acknowledged write", r.FirstWrite.Seconds(), p.Name))
						r.Resumed, _, _ = s.writerStart(p.Name)
					}
				}
			}
			if !old {
				seen(&r.PodDeleted, "pod "+r.oldPod+" deleted")
			}
		}
		var vas storagev1.VolumeAttachmentList
		if err := s.Client.List(ctx, &vas); err == nil {
			onOld := false
			for _, va := range vas.Items {
				if va.Spec.Source.PersistentVolumeName == nil || *va.Spec.Source.PersistentVolumeName != r.pv {
					continue
				}
				if va.Spec.NodeName == r.From {
					onOld = true
				} else if va.Status.Attached {
					seen(&r.Attached, "VolumeAttachment on "+va.Spec.NodeName+" attached")
				}
			}
			if !onOld {
				seen(&r.Detached, "VolumeAttachment on "+r.From+" deleted")
			}
		}
		var rvas v1.ReplicatedVolumeAttachmentList
		if err := s.Client.List(ctx, &rvas, client.MatchingLabels{v1.LabelVolume: r.pv}); err == nil {
			for _, a := range rvas.Items {
				if a.Spec.NodeName != r.From && a.Status.Phase == v1.AttachmentAttached {
					seen(&r.Primary, "meshvol attached the volume on "+a.Spec.NodeName+" (Primary there)")
				}
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	old, err := s.WriterLog(r.oldPod, 0)
	if err != nil {
		return err
	}
	r.LastAck = old.LastAck
	if r.OldAfterFault, err = s.WriterLog(r.oldPod, fault); err != nil {
		return err
	}
	if r.Resumed < r.LastAck {
		return fmt.Errorf("sandbox: acknowledged writes lost: the pod on %s acknowledged counter %d, the pod on %s found %d on the volume", r.From, r.LastAck, r.To, r.Resumed)
	}
	return nil
}

// Total is the time from the fault to the new pod's first write.
func (r *FailoverResult) Total() time.Duration { return r.FirstWrite }

// Partition cuts a running node off: from its DRBD peers (every link of its
// simulated DRBD to another node's) when peers is set, and from the control
// plane (kubecluster's CutOff: its link on the bridge down, its traffic to
// the apiserver held) when apiserver is set. Its kubelet, agent and pods
// go on running. Heal undoes it.
func (s *Sandbox) Partition(node string, peers, apiserver bool) error {
	kn := s.Kube.Node(node)
	if kn == nil || s.simd == nil {
		return fmt.Errorf("sandbox: no node %q of the installed sandbox", node)
	}
	if peers {
		for _, o := range s.Kube.Nodes {
			if o.Name != node {
				s.Sim.Cut(node, o.Name)
			}
		}
	}
	if apiserver {
		return kn.CutOff()
	}
	return nil
}

// Heal ends Partition of node.
func (s *Sandbox) Heal(node string) error {
	kn := s.Kube.Node(node)
	if kn == nil || s.simd == nil {
		return fmt.Errorf("sandbox: no node %q of the installed sandbox", node)
	}
	for _, o := range s.Kube.Nodes {
		if o.Name != node {
			s.Sim.Connect(node, o.Name)
		}
	}
	return kn.Reconnect()
}

// RestartNode boots a crashed node again (kubecluster's RestartNode, and a
// simulated DRBD that starts empty) and waits until meshvol has it back:
// its node pod Ready and neither of the controller's taints on it.
func (s *Sandbox) RestartNode(ctx context.Context, node string) error {
	if s.simd == nil {
		return errors.New("sandbox: RestartNode needs the installed sandbox (Options.Image)")
	}
	s.Sim.Node(node).Restart()
	if err := s.Kube.RestartNode(ctx, node); err != nil {
		return err
	}
	return s.WaitNodeBack(ctx, node, 3*time.Minute)
}

// WaitNodeBack waits until node's meshvol node pod is Ready and the
// controller's taints are off the node.
func (s *Sandbox) WaitNodeBack(ctx context.Context, node string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var why []string
		var n corev1.Node
		if err := s.Client.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			why = append(why, err.Error())
		}
		for _, t := range n.Spec.Taints {
			if t.Key == controller.TaintLost.Key || t.Key == controller.TaintOutOfService.Key {
				why = append(why, "tainted "+t.Key)
			}
		}
		pods, err := s.ReleasePods(ctx, "node")
		if err != nil {
			return err
		}
		ready := false
		for i := range pods {
			ready = ready || (pods[i].Spec.NodeName == node && podReady(&pods[i]) && pods[i].DeletionTimestamp == nil)
		}
		if !ready {
			why = append(why, "its meshvol node pod is not Ready")
		}
		if len(why) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox: node %s not back within %s: %s", node, timeout, strings.Join(why, ", "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// DeleteWriter deletes the run's Deployment and claim and waits until the
// claim's volume is gone.
func (s *Sandbox) DeleteWriter(ctx context.Context, r *FailoverResult, timeout time.Duration) error {
	bg := metav1.DeletePropagationForeground
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: r.Name, Namespace: "default"}}
	if err := s.Client.Delete(ctx, dep, &client.DeleteOptions{PropagationPolicy: &bg}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: r.pvc, Namespace: "default"}}
	if err := s.Client.Delete(ctx, pvc); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		var pv corev1.PersistentVolume
		err := s.Client.Get(ctx, client.ObjectKey{Name: r.pv}, &pv)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox: volume %s of %s still there after %s (%v)", r.pv, r.Name, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// OldContainerRunning says whether the old pod's container still has a
// task in its node's containerd.
func (s *Sandbox) OldContainerRunning(r *FailoverResult) (bool, error) {
	kn := s.Kube.Node(r.From)
	if kn == nil || r.oldContainer == "" {
		return false, fmt.Errorf("sandbox: no container of %s on %s known", r.oldPod, r.From)
	}
	return kubecluster.TaskRunning(kn, r.oldContainer)
}

// HealResult is what followed the end of a partition.
type HealResult struct {
	// OldStopped: the old pod's container ended (its kubelet, back, found
	// the pod deleted); OldDemoted: the old node's DRBD resource of the
	// volume is no longer Primary (Secondary, or down). Both from the heal.
	OldStopped, OldDemoted time.Duration
	// OldRole is the old node's DRBD role for the volume when OldDemoted
	// was seen: "Secondary", or "" when the resource is down there. On
	// three nodes the returning node usually gets the volume's replacement
	// replica, so its resource is down only between the teardown of the
	// force-removed replica and the join of the new one.
	OldRole string
	// OldLog is the old pod's log over the whole run.
	OldLog WriterLog
	// NewLastAck is the new pod's last acknowledged counter once stopped,
	// Reread the counter a third pod found on the volume.
	NewLastAck, Reread int
}

// AfterHeal heals a partition run's node and checks what follows: the old
// pod's container ends, the old node's DRBD resource demotes, the old pod
// acknowledged no write beyond what the new pod found, and no write the
// new pod acknowledged is lost — the writer is stopped and started again
// (anywhere, the healed node included), and finds at least the new pod's
// last acknowledged counter.
func (s *Sandbox) AfterHeal(ctx context.Context, r *FailoverResult) (*HealResult, error) {
	h := &HealResult{}
	began := time.Now()
	if err := s.Heal(r.From); err != nil {
		return h, err
	}
	deadline := time.Now().Add(2 * time.Minute)
	lastRole := ""
	for h.OldStopped == 0 || h.OldDemoted == 0 {
		if h.OldStopped == 0 {
			if running, err := s.OldContainerRunning(r); err == nil && !running {
				h.OldStopped = time.Since(began)
			}
		}
		if h.OldDemoted == 0 {
			if role, err := s.DRBDRole(ctx, r.From, r.volume); err == nil {
				lastRole = role
				if role != "Primary" {
					h.OldDemoted, h.OldRole = time.Since(began), role
				}
			}
		}
		if time.Now().After(deadline) {
			return h, fmt.Errorf("sandbox: 2 minutes after the partition of %s healed: old container stopped %v, DRBD resource %s still %s there",
				r.From, h.OldStopped > 0, r.volume, lastRole)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var err error
	if h.OldLog, err = s.WriterLog(r.oldPod, 0); err != nil {
		return h, err
	}
	if h.OldLog.LastAck > r.Resumed {
		return h, fmt.Errorf("sandbox: two writers: the old pod on %s acknowledged counter %d, beyond the %d the new pod on %s started from",
			r.From, h.OldLog.LastAck, r.Resumed, r.To)
	}
	if err := s.WaitNodeBack(ctx, r.From, 2*time.Minute); err != nil {
		return h, err
	}
	labels := map[string]string{"failover": r.Name}
	var pods corev1.PodList
	if err := s.Client.List(ctx, &pods, client.InNamespace("default"), client.MatchingLabels(labels)); err != nil || len(pods.Items) != 1 {
		return h, fmt.Errorf("sandbox: writer pods of %s: %d (%v)", r.Name, len(pods.Items), err)
	}
	newPod := pods.Items[0].Name
	if err := s.scaleWriter(ctx, r.Name, 0); err != nil {
		return h, err
	}
	newLog, err := s.WriterLog(newPod, 0)
	if err != nil {
		return h, err
	}
	h.NewLastAck = newLog.LastAck
	if err := s.scaleWriter(ctx, r.Name, 1); err != nil {
		return h, err
	}
	third, err := s.WaitPodRunning(ctx, labels, "", 2*time.Minute)
	if err != nil {
		return h, fmt.Errorf("%w\n%s", err, s.VolumeReport(ctx, r.volume))
	}
	for try := 0; ; try++ {
		n, _, ok := s.writerStart(third.Name)
		if ok {
			h.Reread = n
			break
		}
		if try > 100 {
			return h, fmt.Errorf("sandbox: writer %s logged no start", third.Name)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if h.Reread < h.NewLastAck {
		return h, fmt.Errorf("sandbox: acknowledged writes lost after the heal: the pod on %s acknowledged %d, the next pod found %d", r.To, h.NewLastAck, h.Reread)
	}
	return h, nil
}

// scaleWriter sets the writer Deployment's replicas and, for 0, waits
// until its pod is gone.
func (s *Sandbox) scaleWriter(ctx context.Context, name string, replicas int32) error {
	var d appsv1.Deployment
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &d); err != nil {
		return err
	}
	d.Spec.Replicas = &replicas
	if err := s.Client.Update(ctx, &d); err != nil {
		return err
	}
	if replicas > 0 {
		return nil
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var pods corev1.PodList
		if err := s.Client.List(ctx, &pods, client.InNamespace("default"), client.MatchingLabels{"failover": name}); err == nil && len(pods.Items) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox: writer %s's pod still there 2 minutes after scaling to 0", name)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// OldPod names the run's first writer pod and its container.
func (r *FailoverResult) OldPod() (pod, container string) { return r.oldPod, r.oldContainer }

// PV is the run's PersistentVolume.
func (r *FailoverResult) PV() string { return r.pv }

// TaskRunning says whether container id runs on node.
func (s *Sandbox) TaskRunning(node, id string) (bool, error) {
	kn := s.Kube.Node(node)
	if kn == nil {
		return false, fmt.Errorf("sandbox: no node %q", node)
	}
	return kubecluster.TaskRunning(kn, id)
}

// StallAPIServer holds every node's connections to the apiserver for d
// (kubecluster's StallAPIServer).
func (s *Sandbox) StallAPIServer(d time.Duration) error { return s.Kube.StallAPIServer(d) }

// VolumeReport is what a test that waited for a volume in vain prints: the
// volume's RV, RVRs and RVAs as the apiserver holds them, and the volume's
// resource in each node's simulated DRBD (`drbdsetup status --json`).
func (s *Sandbox) VolumeReport(ctx context.Context, volume string) string {
	var b strings.Builder
	out, err := s.Kube.Kubectl(ctx, "get", "rv", volume, "-o", "yaml")
	fmt.Fprintf(&b, "ReplicatedVolume %s (%v):\n%s\n", volume, err, out)
	out, err = s.Kube.Kubectl(ctx, "get", "rvr,rva", "-l", v1.LabelVolume+"="+volume, "-o", "yaml")
	fmt.Fprintf(&b, "its replicas and attachments (%v):\n%s\n", err, out)
	for _, n := range s.Kube.Nodes {
		st, err := s.Sim.Node(n.Name).Status(ctx, volume)
		js, _ := json.MarshalIndent(st, "", "  ")
		fmt.Fprintf(&b, "DRBD of %s on %s (%v):\n%s\n", volume, n.Name, err, js)
	}
	return b.String()
}
