package cluster_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

func rvaName(volume, node string) string { return volume + "-" + node }

// attach creates the RVA as the CSI controller service would and waits until
// it is Attached and the node's DRBD is Primary.
func (r *rig) attach(volume, node string) {
	r.t.Helper()
	r.requestAttach(volume, node)
	r.attached(volume, node, time.Minute)
}

func (r *rig) requestAttach(volume, node string) {
	r.t.Helper()
	rva := &v1.ReplicatedVolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: rvaName(volume, node), Labels: map[string]string{v1.LabelVolume: volume, v1.LabelNode: node}},
		Spec:       v1.ReplicatedVolumeAttachmentSpec{ReplicatedVolumeName: volume, NodeName: node},
	}
	r.must(r.cl.Create(r.ctx, rva))
}

func (r *rig) attached(volume, node string, d time.Duration) {
	r.t.Helper()
	r.eventually(volume+" attached on "+node, d, func() string {
		rva := &v1.ReplicatedVolumeAttachment{}
		r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: rvaName(volume, node)}, rva))
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
	err := r.cl.Delete(r.ctx, &v1.ReplicatedVolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: rvaName(volume, node)}})
	if err != nil && !apierrors.IsNotFound(err) {
		r.t.Fatal(err)
	}
	r.eventually(volume+" detached from "+node, time.Minute, func() string {
		err := r.cl.Get(r.ctx, client.ObjectKey{Name: rvaName(volume, node)}, &v1.ReplicatedVolumeAttachment{})
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
	r.must(client.IgnoreNotFound(r.cl.Delete(r.ctx, &v1.ReplicatedVolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: rvaName(vol, a)}})))
	r.requestAttach(vol, b)
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
