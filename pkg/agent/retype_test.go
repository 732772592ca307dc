package agent_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// retype changes the replica's spec.type as the controller's retype does: one
// write of the spec, spec.storage kept (the replica's backing volume stays
// described until its agent has released it).
func (r *rig) retype(name string, typ v1.ReplicaType) {
	r.t.Helper()
	for {
		o := r.rvr(name)
		o.Spec.Type = typ
		err := r.cl.Update(r.ctx, o)
		if !apierrors.IsConflict(err) {
			r.must(err)
			return
		}
	}
}

// backingFiles lists node i's backing files of replica name.
func (r *rig) backingFiles(i int, name string) []string {
	var out []string
	for _, f := range r.node(i).Files() {
		if strings.Contains(f, name) {
			out = append(out, f)
		}
	}
	return out
}

// An attached Diskful replica retyped to Access (the engine converts an
// attached surplus Diskful rather than removing it, docs/controller.md): while
// its member is still Diskful it keeps running with its disk (a revision
// published meanwhile is confirmed, the disk UpToDate); D∅ detaches the disk
// and keeps the backing volume; as an Access member it stays Primary, reads
// through its peers, and its backing volume is freed. Retyped back to
// Diskful it gets a fresh backing volume and resyncs into it.
//
// On real DRBD this was a replica whose spec.storage the retype dropped while
// its member was still Diskful: the agent could no longer render the member
// ("member is Diskful but spec.storage is empty") and the backing volume it
// detached was never freed (test/vm/FINDINGS.md).
func TestRetypeAttachedDiskfulToAccessAndBack(t *testing.T) {
	r := newRig(t, 3, nil)
	names := r.form3D()
	rev := r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members[1].Attached = true })
	r.confirmed(rev, "", names...)
	data := bytes.Repeat([]byte{5}, 4096)
	r.must(r.node(1).Sim.Write(r.ctx, r.rv, 0, data))

	r.retype(names[1], v1.ReplicaTypeAccess)
	if s := r.rvr(names[1]).Spec.Storage; s == nil || s.Pool != r.pool() {
		t.Fatalf("spec.storage after the retype to Access: %+v, want pool %s kept", s, r.pool())
	}
	// The engine may hold the member at Diskful for a while (its guards);
	// every revision meanwhile still renders the member with its disk.
	rev = r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.QuorumMinimumRedundancy = 1 })
	r.confirmed(rev, v1.DiskStateUpToDate, names[1])
	r.confirmed(rev, "", names...)

	rev = r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members[1].Type = v1.MemberTypeLiminalDiskful })
	r.confirmed(rev, v1.DiskStateDiskless, names[1])
	r.confirmed(rev, "", names...)
	if len(r.backingFiles(1, names[1])) == 0 {
		t.Fatalf("D∅ freed the backing volume; a liminal member keeps it (docs/layouts.md §8.4)")
	}

	rev = r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members[1].Type = v1.MemberTypeAccess })
	r.confirmed(rev, v1.DiskStateDiskless, names[1])
	r.confirmed(rev, "", names...)
	r.eventually("the Access replica's backing volume freed", 30*time.Second, func() string {
		if f := r.backingFiles(1, names[1]); len(f) > 0 {
			return fmt.Sprintf("files %v", f)
		}
		if bv := r.rvr(names[1]).Status.BackingVolume; bv != nil {
			return fmt.Sprintf("status.backingVolume %+v", bv)
		}
		return ""
	})
	if o := r.rvr(names[1]); o.Status.Role != v1.RolePrimary {
		t.Fatalf("%s role %s as Access, want Primary (still attached)", names[1], o.Status.Role)
	}
	got, err := r.node(1).Sim.Read(r.ctx, r.rv, 0, len(data))
	r.must(err)
	if !bytes.Equal(got, data) {
		t.Fatalf("the Access Primary reads %v..., want the %d written while Diskful", got[:4], data[0])
	}

	r.retype(names[1], v1.ReplicaTypeDiskful)
	rev = r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members[1].Type = v1.MemberTypeLiminalDiskful })
	r.confirmed(rev, v1.DiskStateDiskless, names[1])
	rev = r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members[1].Type = v1.MemberTypeDiskful })
	r.confirmed(rev, "", names...)
	r.eventually("the fresh backing volume resynced", time.Minute, func() string {
		if d := r.rvr(names[1]).Status.DiskState; d != v1.DiskStateUpToDate {
			return "disk " + string(d)
		}
		return ""
	})
	if got := r.backing(1, 0, len(data)); !bytes.Equal(got, data) {
		t.Fatalf("the new backing volume holds %v..., want the %d resynced from the peers", got[:4], data[0])
	}
}
