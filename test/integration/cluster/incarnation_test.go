package cluster_test

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// The sandbox's partition of a 2D+1TB volume on three nodes, up to the heal: the
// attached Diskful node is cut off (its agent stopped, its links cut, its DRBD
// running on with the device held open, as the partitioned pod's mount holds
// it), the controller force-removes its member, and the volume moves to the
// other Diskful and is written there. When the node comes back, the controller
// places a replica on it again under the same name `<rv>-<node>`, while the old
// pod still holds the earlier replica's device. The new replica must not adopt
// the earlier one's DRBD resource or backing volume (docs/contract.md, "Node
// that is gone"): once the device is let go, the node gets a backing volume of
// its own that syncs from the survivors, and a reader there sees the survivors'
// writes.
func TestReturningNodeGetsFreshReplica(t *testing.T) {
	r := newRig(t)
	const vol = "return-2d1tb"
	all, diskful := r.formed2D1TB(vol)
	r.cordonAllBut(all...)
	a, b := diskful[0], diskful[1]
	r.attach(vol, a)
	r.must(r.c.Node(a).Sim.Write(r.ctx, vol, 0, bytes.Repeat([]byte{1}, 4096)))
	old := r.replicaOn(vol, a)
	held, err := os.OpenFile(old.Status.DevicePath, os.O_RDWR, 0)
	r.must(err)
	release := func() { _ = held.Close() }
	t.Cleanup(release)

	r.must(r.c.StopAgent(a))
	r.c.Partition(a)
	t.Cleanup(func() {
		r.c.Heal()
		_ = r.c.RestartAgent(a)
	})
	// What Kubernetes does for a lost node: its attachment is released, the
	// volume attached elsewhere.
	r.moveAttachment(vol, a, b)
	survivors := bytes.Repeat([]byte{2}, 4096)
	r.must(r.c.Node(b).Sim.Write(r.ctx, vol, 0, survivors))
	r.eventually("the lost node's replica removed", 2*time.Minute, func() string {
		if x := r.replicaOn(vol, a); x != nil && x.UID == old.UID {
			return "still there"
		}
		return ""
	})

	// The node comes back, its DRBD still cut off from its peers: the
	// earlier replica's resource runs there, held open.
	r.must(r.c.RestartAgent(a))
	r.newReplicaWaitsForEarlierDevice(vol, a, old.UID)
	release() // the kubelet ends the partitioned pod
	r.c.Heal()

	oldKey, newKey := "", ""
	r.eventually("the new replica on a backing volume of its own, UpToDate, the earlier one's deleted", 2*time.Minute, func() string {
		x := r.replicaOn(vol, a)
		if x == nil {
			return "no replica on " + a
		}
		oldKey, newKey = old.Name+"."+uidPart(old.UID), x.Name+"."+uidPart(x.UID)
		if bv := x.Status.BackingVolume; bv == nil || !strings.HasPrefix(bv.Name, newKey) {
			return fmt.Sprintf("backing volume %+v, want %s", bv, newKey)
		}
		if x.Status.DiskState != v1.DiskStateUpToDate {
			return "disk " + string(x.Status.DiskState)
		}
		show, err := r.c.Node(a).Show(r.ctx, vol)
		if err != nil || show == nil || len(show.ThisHost.Volumes) != 1 {
			return fmt.Sprintf("drbdsetup show: %v %+v", err, show)
		}
		if disk := show.ThisHost.Volumes[0].BackingDisk; disk != x.Status.BackingVolume.DevicePath {
			return fmt.Sprintf("the kernel runs backing disk %q, the replica's volume is %s", disk, x.Status.BackingVolume.DevicePath)
		}
		if files := r.c.Node(a).Files(); slices.ContainsFunc(files, func(f string) bool { return strings.Contains(f, oldKey) }) {
			return fmt.Sprintf("the earlier replica's backing file is still there: %v", files)
		}
		return ""
	})
	t.Logf("%s: the earlier replica's volume %s deleted, the new one %s UpToDate", a, oldKey, newKey)

	r.ready(vol, 2*time.Minute)
	r.detach(vol, b)
	r.attach(vol, a)
	got, err := r.c.Node(a).Sim.Read(r.ctx, vol, 0, len(survivors))
	r.must(err)
	if !bytes.Equal(got, survivors) {
		t.Fatalf("%s reads %d at offset 0, want %d: the write made on %s while %s was away", a, got[0], survivors[0], b, a)
	}
	r.consistent(vol)
	r.detach(vol, a)
	r.deleteVolume(vol)
}

// replicaOn is the volume's replica on node, nil when there is none.
func (r *rig) replicaOn(vol, node string) *v1.ReplicatedVolumeReplica {
	for _, x := range r.rvrs(vol) {
		if x.Spec.NodeName == node {
			return &x
		}
	}
	return nil
}

// uidPart is the part of a replica's UID its backing volume's name carries.
func uidPart(uid types.UID) string { return strings.ReplaceAll(string(uid), "-", "")[:12] }

// newReplicaWaitsForEarlierDevice waits until node's replica of vol is a new
// incarnation (not oldUID) whose DRBDRole condition says it waits for the
// earlier replica's device, still held open on the node.
func (r *rig) newReplicaWaitsForEarlierDevice(vol, node string, oldUID types.UID) {
	r.t.Helper()
	r.eventually("a new replica on "+node+" waits for the earlier one's device", 2*time.Minute, func() string {
		x := r.replicaOn(vol, node)
		if x == nil || x.UID == oldUID {
			return "no new replica on " + node
		}
		c := meta.FindStatusCondition(x.Status.Conditions, v1.ConditionDRBDRole)
		if c == nil || c.Reason != v1.ReasonDemoteRefused || !strings.Contains(c.Message, "earlier replica") {
			return fmt.Sprintf("%s: %v", v1.ConditionDRBDRole, c)
		}
		return ""
	})
}
