package agent_test

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// A replica force-removed while its node was away, and placed on that node again
// under the same name (a new UID) before its agent came back, starts from a backing
// volume of its own and syncs from the survivors. The earlier replica's DRBD
// resource, still running on the node with its disk, is taken down rather than
// adjusted, and its backing volume is deleted rather than adopted
// (docs/contract.md, "Node that is gone").
func TestReplacedReplicaStartsFresh(t *testing.T) {
	r := newRig(t, 3, nil)
	names := r.form3D()
	away := r.node(2)
	old := r.rvr(names[2])
	rev := r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members[0].Attached = true })
	r.confirmed(rev, "", names...)
	r.must(r.node(0).Sim.Write(r.ctx, r.rv, 0, bytes.Repeat([]byte{1}, 4096)))

	// The node goes away: its agent stops and its links are cut; its DRBD runs on.
	r.must(r.c.StopAgent(away.Name))
	r.c.Partition(away.Name)
	t.Cleanup(r.c.Heal)
	// The controller removes its member, releases the agent's finalizer and
	// deletes the replica; the survivors write on.
	rev = r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members = st.Datamesh.Members[:2] })
	r.confirmed(rev, "", names[:2]...)
	survivors := bytes.Repeat([]byte{2}, 4096)
	r.must(r.node(0).Sim.Write(r.ctx, r.rv, 0, survivors))
	r.releaseAndDelete(names[2])

	// Placed again under the same name and node-id, then the agent comes back,
	// still cut off from its peers: the kernel runs the earlier replica's
	// resource on the earlier backing volume.
	r.addReplica(2, v1.ReplicaTypeDiskful)
	placed := r.rvr(names[2])
	if placed.UID == old.UID {
		t.Fatalf("the new replica has the earlier one's UID %s", old.UID)
	}
	m := r.member(names[2], v1.MemberTypeDiskful, 2)
	rev = r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members = append(st.Datamesh.Members, m) })
	r.must(r.c.RestartAgent(away.Name))
	oldUID, newUID := uidPart(old.UID), uidPart(placed.UID)
	r.eventually("the new replica on a backing volume of its own, the earlier one's deleted", time.Minute, func() string {
		o := r.rvr(names[2])
		if bv := o.Status.BackingVolume; bv == nil || !strings.Contains(bv.Name, newUID) {
			return fmt.Sprintf("backing volume %+v, want one named after the UID %s", o.Status.BackingVolume, placed.UID)
		}
		show, err := away.Sim.Show(r.ctx, r.rv)
		if err != nil || len(show) != 1 || len(show[0].ThisHost.Volumes) != 1 {
			return fmt.Sprintf("drbdsetup show: %v %+v", err, show)
		}
		if disk := show[0].ThisHost.Volumes[0].BackingDisk; disk != o.Status.BackingVolume.DevicePath {
			return fmt.Sprintf("the kernel runs backing disk %q, the replica's volume is %s", disk, o.Status.BackingVolume.DevicePath)
		}
		files := away.Files()
		if slices.ContainsFunc(files, func(f string) bool { return strings.Contains(f, oldUID) }) {
			return fmt.Sprintf("the earlier replica's backing file is still there: %v", files)
		}
		return ""
	})

	r.c.Heal()
	r.confirmed(rev, v1.DiskStateUpToDate, names...)
	if got := r.backing(2, 0, 4096); !bytes.Equal(got, survivors) {
		t.Fatalf("the new replica reads %d at offset 0, want %d: the survivors' write (it kept the earlier replica's data?)", got[0], survivors[0])
	}
	if lost := r.c.Sim.LostAckedWrites(r.rv); len(lost) > 0 {
		t.Fatalf("acknowledged writes lost: %v", lost)
	}
	if split, msgs := r.c.Sim.Diverged(r.rv); split {
		t.Fatalf("split brain: %v", msgs)
	}
}

// uidPart is the part of the replica's UID its backing volume's name carries.
func uidPart(uid types.UID) string {
	return strings.ReplaceAll(string(uid), "-", "")[:12]
}
