package cluster_test

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// attach creates the RVA as the CSI controller service would and waits until
// it is Attached and the node's DRBD is Primary.
func (r *rig) attach(volume, node string) {
	r.t.Helper()
	r.requestAttach(volume, node)
	r.attached(volume, node, time.Minute)
}

// moveAttachment does what Kubernetes does for a lost node: the volume's
// attachment on from is deleted and, once it is gone, the volume is attached
// on to.
func (r *rig) moveAttachment(volume, from, to string) {
	r.t.Helper()
	name := v1.AttachmentName(volume, from)
	r.must(client.IgnoreNotFound(r.cl.Delete(r.ctx, &v1.ReplicatedVolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name}})))
	r.eventually("the lost node's RVA released", 2*time.Minute, func() string {
		if err := r.cl.Get(r.ctx, client.ObjectKey{Name: name}, &v1.ReplicatedVolumeAttachment{}); !apierrors.IsNotFound(err) {
			return "RVA still there"
		}
		return ""
	})
	r.attach(volume, to)
}

func (r *rig) requestAttach(volume, node string) {
	r.t.Helper()
	rva := &v1.ReplicatedVolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: v1.AttachmentName(volume, node), Labels: map[string]string{v1.LabelVolume: volume, v1.LabelNode: node}},
		Spec:       v1.ReplicatedVolumeAttachmentSpec{ReplicatedVolumeName: volume, NodeName: node},
	}
	r.must(r.cl.Create(r.ctx, rva))
}

func (r *rig) attached(volume, node string, d time.Duration) {
	r.t.Helper()
	r.eventually(volume+" attached on "+node, d, func() string {
		rva := &v1.ReplicatedVolumeAttachment{}
		r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: v1.AttachmentName(volume, node)}, rva))
		if rva.Status.Phase != v1.AttachmentAttached || rva.Status.DevicePath == "" {
			return fmt.Sprintf("RVA phase %q device %q %v", rva.Status.Phase, rva.Status.DevicePath, rva.Status.Conditions)
		}
		if role := r.role(volume, node); role != "Primary" {
			return "DRBD role " + role
		}
		return ""
	})
}

// role is the DRBD role on the node, read from drbdsim.
func (r *rig) role(volume, node string) string {
	st, err := r.c.Node(node).Sim.Status(r.ctx, volume)
	if err != nil || len(st) != 1 {
		return "not running"
	}
	return st[0].Role
}

// detach deletes the RVA and waits until it is gone and the node is Secondary.
func (r *rig) detach(volume, node string) {
	r.t.Helper()
	err := r.cl.Delete(r.ctx, &v1.ReplicatedVolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: v1.AttachmentName(volume, node)}})
	if err != nil && !apierrors.IsNotFound(err) {
		r.t.Fatal(err)
	}
	r.eventually(volume+" detached from "+node, time.Minute, func() string {
		err := r.cl.Get(r.ctx, client.ObjectKey{Name: v1.AttachmentName(volume, node)}, &v1.ReplicatedVolumeAttachment{})
		if !apierrors.IsNotFound(err) {
			return "RVA still there"
		}
		if role := r.role(volume, node); role == "Primary" {
			return "still Primary"
		}
		return ""
	})
}

// Scenario 3: attach, detach, re-attach elsewhere (a diskless node gets an
// Access replica), multiattach on (two Primaries) and off.
func TestAttachDetachMultiattach(t *testing.T) {
	r := newRig(t)
	const vol = "attach-2d1tb"
	r.volume(vol, r.class(1, 0, v1.TopologyIgnored), 2)
	rv := r.ready(vol, 2*time.Minute)
	var diskful []string
	onVolume := map[string]bool{}
	for _, m := range rv.Status.Datamesh.Members {
		onVolume[m.NodeName] = true
		if m.Type == v1.MemberTypeDiskful {
			diskful = append(diskful, m.NodeName)
		}
	}
	var other string
	for _, n := range r.c.Nodes {
		if !onVolume[n.Name] {
			other = n.Name
			break
		}
	}

	r.attach(vol, diskful[0])
	r.must(r.c.Node(diskful[0]).Sim.Write(r.ctx, vol, 0, bytes.Repeat([]byte{1}, 4096)))
	r.detach(vol, diskful[0])

	r.attach(vol, other) // diskless: through an Access replica
	got, err := r.c.Node(other).Sim.Read(r.ctx, vol, 0, 4096)
	r.must(err)
	if got[0] != 1 {
		t.Fatalf("%s reads %d, want the 1 written on %s", other, got[0], diskful[0])
	}

	// Multiattach: a second attachment while the first holds.
	r.attach(vol, diskful[1])
	if a, b := r.role(vol, other), r.role(vol, diskful[1]); a != "Primary" || b != "Primary" {
		t.Fatalf("multiattach: roles %s and %s, want two Primaries", a, b)
	}
	if !r.rv(vol).Status.Datamesh.Multiattach {
		t.Fatalf("two attachments without datamesh.multiattach")
	}
	r.detach(vol, other)
	r.eventually("multiattach off", time.Minute, func() string {
		if r.rv(vol).Status.Datamesh.Multiattach {
			return "still on"
		}
		return ""
	})
	r.detach(vol, diskful[1])
	if ok, msgs := r.c.Sim.Diverged(vol); ok {
		t.Fatalf("split brain: %v", msgs)
	}
	r.deleteVolume(vol)
}

// Scenario 4: the node of the attached replica crashes; the volume becomes
// attachable on another node. Prints the time from the crash to Attached.
func TestNodeCrashAttachableElsewhere(t *testing.T) {
	r := newRig(t)
	const vol = "crash-3d"
	r.volume(vol, r.class(1, 1, v1.TopologyIgnored), 1)
	rv := r.ready(vol, 2*time.Minute)
	a := rv.Status.Datamesh.Members[0].NodeName
	b := rv.Status.Datamesh.Members[1].NodeName
	r.attach(vol, a)
	for i := range 16 {
		r.must(r.c.Node(a).Sim.Write(r.ctx, vol, int64(i)*4096, bytes.Repeat([]byte{byte(i + 1)}, 4096)))
	}

	crashed := time.Now()
	r.must(r.c.CrashNode(a))
	t.Cleanup(func() { _ = r.c.RestartNode(a) })
	// What Kubernetes does for a lost node: the old attachment is released
	// (ControllerUnpublish), a new one asked for elsewhere.
	r.must(client.IgnoreNotFound(r.cl.Delete(r.ctx, &v1.ReplicatedVolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: v1.AttachmentName(vol, a)}})))
	r.requestAttach(vol, b)
	// ControllerUnpublish of the dead node's attachment returns once its RVA
	// is gone (finalizer released after the force-detach): the external
	// attacher does not attach elsewhere before that.
	r.eventually("the dead node's RVA released", 2*time.Minute, func() string {
		rva := &v1.ReplicatedVolumeAttachment{}
		if err := r.cl.Get(r.ctx, client.ObjectKey{Name: v1.AttachmentName(vol, a)}, rva); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("RVA %s still there: phase %q %v; transitions %v", rva.Name, rva.Status.Phase, rva.Status.Conditions, r.rv(vol).Status.DatameshTransitions)
		}
		return ""
	})
	t.Logf("node crash → dead node's RVA released: %s", time.Since(crashed).Round(10*time.Millisecond))
	r.attached(vol, b, 2*time.Minute)
	took := time.Since(crashed)
	t.Logf("node crash → attachable on %s: %s", b, took.Round(10*time.Millisecond))

	for i := range 16 {
		got, err := r.c.Node(b).Sim.Read(r.ctx, vol, int64(i)*4096, 4096)
		r.must(err)
		if got[0] != byte(i+1) {
			t.Fatalf("block %d reads %d on %s after failover, want %d", i, got[0], b, i+1)
		}
	}
	if lost := r.c.Sim.LostAckedWrites(vol); len(lost) > 0 {
		t.Fatalf("acknowledged writes lost: %v", lost)
	}
	r.detach(vol, b)
	r.must(r.c.RestartNode(a))
	r.deleteVolume(vol)
}

// stage does what the CSI node service's NodeStage does to an attached
// volume: a file system on the node's DRBD device, mounted, written. It
// returns the unstage (unmount) that NodeUnstage does.
func (r *rig) stage(volume, node string) (unstage func()) {
	r.t.Helper()
	_, unstage = r.stageAt(volume, node)
	return unstage
}

// stageAt is stage, and says where the file system is mounted.
func (r *rig) stageAt(volume, node string) (dir string, unstage func()) {
	r.t.Helper()
	dev := ""
	for _, x := range r.rvrs(volume) {
		if x.Spec.NodeName == node {
			dev = x.Status.DevicePath
		}
	}
	if dev == "" {
		r.t.Fatalf("no device path reported for %s on %s", volume, node)
	}
	dir = r.t.TempDir()
	// sync -f flushes this file system only: a bare sync waits on every file system
	// of the machine, a hung one of another test's included.
	for _, cmd := range [][]string{{"mkfs.ext4", "-q", "-F", dev}, {"mount", dev, dir}, {"sh", "-c", "echo hello > " + dir + "/f && sync -f " + dir + "/f"}} {
		if out, err := exec.CommandContext(r.ctx, cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			r.t.Fatalf("%v: %v: %s", cmd, err, out)
		}
	}
	done := false
	unstage = func() {
		if done {
			return
		}
		done = true
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			r.t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	}
	r.t.Cleanup(unstage)
	return dir, unstage
}

// The kubelet's order: NodeUnstage (unmount), then ControllerUnpublish
// (delete the RVA, wait until it is gone). The mount on the Primary's
// device is what the in-process detach above never had.
func TestDetachAfterUnstage(t *testing.T) {
	r := newRig(t)
	const vol = "unstage-2d1tb"
	r.volume(vol, r.class(1, 0, v1.TopologyIgnored), 1)
	rv := r.ready(vol, 2*time.Minute)
	var a, b string
	for _, m := range rv.Status.Datamesh.Members {
		if m.Type == v1.MemberTypeDiskful {
			if a == "" {
				a = m.NodeName
			} else {
				b = m.NodeName
			}
		}
	}
	r.attach(vol, a)
	unstage := r.stage(vol, a)
	unstage()
	began := time.Now()
	r.detach(vol, a)
	t.Logf("detach after unstage on %s: %s", a, time.Since(began).Round(10*time.Millisecond))
	r.attach(vol, b)
	r.detach(vol, b)
	r.deleteVolume(vol)
}

// cordonAllBut marks every other node unschedulable (as `kubectl cordon`),
// so that the volume's nodes are the whole cluster as far as placement
// goes: the sandbox's three nodes, where a lost replica has no
// replacement. The nodes are uncordoned when the test ends.
func (r *rig) cordonAllBut(nodes ...string) (undo func()) {
	r.t.Helper()
	set := func(name string, v bool) error {
		n := &corev1.Node{}
		if err := r.cl.Get(r.ctx, client.ObjectKey{Name: name}, n); err != nil {
			return err
		}
		p := client.MergeFrom(n.DeepCopy())
		n.Spec.Unschedulable = v
		return r.cl.Patch(context.Background(), n, p)
	}
	for _, n := range r.c.Nodes {
		if slices.Contains(nodes, n.Name) {
			continue
		}
		r.must(set(n.Name, true))
		r.t.Cleanup(func() { _ = set(n.Name, false) })
	}
	return func() {
		for _, n := range r.c.Nodes {
			if !slices.Contains(nodes, n.Name) {
				r.must(set(n.Name, false))
			}
		}
	}
}

// moveAfterCrash crashes node a, where volume is attached, releases a's
// attachment as Kubernetes does for a lost node (ControllerUnpublish), attaches
// on b, and waits until b can write. Quorum must then hold, not flicker: the
// state changes that follow the promotion (the force removal of the dead
// member, its q↓) must not lose it. It returns the time from the crash until b
// could write.
func (r *rig) moveAfterCrash(volume, a, b string) time.Duration {
	r.t.Helper()
	crashed := time.Now()
	r.must(r.c.CrashNode(a))
	r.t.Cleanup(func() { _ = r.c.RestartNode(a) })
	r.must(client.IgnoreNotFound(r.cl.Delete(r.ctx, &v1.ReplicatedVolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: v1.AttachmentName(volume, a)}})))
	r.eventually("the dead node's RVA released", 2*time.Minute, func() string {
		if err := r.cl.Get(r.ctx, client.ObjectKey{Name: v1.AttachmentName(volume, a)}, &v1.ReplicatedVolumeAttachment{}); !apierrors.IsNotFound(err) {
			return "RVA still there"
		}
		return ""
	})
	r.requestAttach(volume, b)
	r.attached(volume, b, 2*time.Minute)
	r.eventually(volume+" writable on "+b, time.Minute, func() string { return r.quorate(volume, b) })
	took := time.Since(crashed)
	time.Sleep(3 * time.Second)
	if msg := r.quorate(volume, b); msg != "" {
		r.t.Fatalf("%s on %s lost quorum after the attach: %s", volume, b, msg)
	}
	return took
}

// quorate says whether node's DRBD has quorum for volume and IO is not
// suspended: what a pod's writes need.
func (r *rig) quorate(volume, node string) string {
	st, err := r.c.Node(node).Sim.Status(r.ctx, volume)
	if err != nil || len(st) != 1 {
		return "not running"
	}
	if st[0].Suspended || len(st[0].Devices) == 0 || !st[0].Devices[0].Quorum {
		return fmt.Sprintf("role %s, quorum %v, suspended %v", st[0].Role, len(st[0].Devices) > 0 && st[0].Devices[0].Quorum, st[0].Suspended)
	}
	return ""
}

// The sandbox's crash: a volume on a three-node cluster (the other nodes
// cordoned), the attached node crashes, and the pod moves to one of the two
// nodes left, where it must be able to write although no replacement can
// be placed. 3D: two of three voters keep quorum by count. 2D+1TB:
// TestNodeCrashThreeNodes2D1TB.
func TestNodeCrashThreeNodes(t *testing.T) {
	r := newRig(t)
	const vol = "crash3-3d"
	r.volume(vol, r.class(1, 1, v1.TopologyIgnored), 1)
	rv := r.ready(vol, 2*time.Minute)
	var all []string
	for _, m := range rv.Status.Datamesh.Members {
		all = append(all, m.NodeName)
	}
	r.cordonAllBut(all...)
	a, b := all[0], all[1]
	r.attach(vol, a)
	for i := range 16 {
		r.must(r.c.Node(a).Sim.Write(r.ctx, vol, int64(i)*4096, bytes.Repeat([]byte{byte(i + 1)}, 4096)))
	}
	took := r.moveAfterCrash(vol, a, b)
	for i := range 16 {
		got, err := r.c.Node(b).Sim.Read(r.ctx, vol, int64(i)*4096, 4096)
		r.must(err)
		if got[0] != byte(i+1) {
			t.Fatalf("block %d reads %d on %s after failover, want %d", i, got[0], b, i+1)
		}
	}
	r.must(r.c.Node(b).Sim.Write(r.ctx, vol, 0, bytes.Repeat([]byte{9}, 4096)))
	t.Logf("node crash → writable on %s: %s", b, took.Round(10*time.Millisecond))
	r.detach(vol, b)
	r.must(r.c.RestartNode(a))
	r.deleteVolume(vol)
}

// A pod scheduled on the node of 2D+1TB's TieBreaker: the TieBreaker is
// attached in place (a diskless Primary, as DRBD runs an Access member),
// reads what a Diskful Primary wrote, and is a plain TieBreaker again after
// the detach.
func TestAttachOnTieBreaker(t *testing.T) {
	r := newRig(t)
	const vol = "attach-tb"
	r.volume(vol, r.class(1, 0, v1.TopologyIgnored), 1)
	rv := r.ready(vol, 2*time.Minute)
	var d, tb string
	for _, m := range rv.Status.Datamesh.Members {
		switch m.Type {
		case v1.MemberTypeDiskful:
			d = m.NodeName
		case v1.MemberTypeTieBreaker:
			tb = m.NodeName
		}
	}
	r.attach(vol, d)
	r.must(r.c.Node(d).Sim.Write(r.ctx, vol, 0, bytes.Repeat([]byte{7}, 4096)))
	r.detach(vol, d)
	r.attach(vol, tb)
	got, err := r.c.Node(tb).Sim.Read(r.ctx, vol, 0, 4096)
	r.must(err)
	if got[0] != 7 {
		t.Fatalf("the TieBreaker on %s reads %d, want the 7 written on %s", tb, got[0], d)
	}
	r.must(r.c.Node(tb).Sim.Write(r.ctx, vol, 4096, bytes.Repeat([]byte{8}, 4096)))
	r.detach(vol, tb)
	rv = r.ready(vol, time.Minute)
	if rv.Status.Layout != "2D+1TB" {
		t.Fatalf("layout %s after attaching the TieBreaker, want 2D+1TB", rv.Status.Layout)
	}
	r.deleteVolume(vol)
}

// The stuck Detaching of the sandbox's first runs: the CSI service then
// created the RVA with the controller's finalizer already in it, so its own
// field manager co-owned the finalizer, and the controller's release by
// server-side apply (which drops only what the applier alone owns) left it
// in place: the engine said "Detached", the RVA stayed phase Detaching, and
// ControllerUnpublish never returned. Whoever put the finalizer there, the
// controller releases it once the node is detached.
func TestDetachReleasesACreatorsFinalizer(t *testing.T) {
	r := newRig(t)
	const vol = "detach-finalizer"
	r.volume(vol, r.class(0, 0, v1.TopologyIgnored), 1)
	rv := r.ready(vol, 2*time.Minute)
	node := rv.Status.Datamesh.Members[0].NodeName
	rva := &v1.ReplicatedVolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: v1.AttachmentName(vol, node), Labels: map[string]string{v1.LabelVolume: vol, v1.LabelNode: node},
			Finalizers: []string{v1.FinalizerController}},
		Spec: v1.ReplicatedVolumeAttachmentSpec{ReplicatedVolumeName: vol, NodeName: node},
	}
	r.must(r.cl.Create(r.ctx, rva, client.FieldOwner(v1.FieldManagerCSI)))
	r.attached(vol, node, time.Minute)
	r.detach(vol, node)
	r.deleteVolume(vol)
}
