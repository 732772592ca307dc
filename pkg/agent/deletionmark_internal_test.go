package agent

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// A volume's deletion mark alone wakes no replica; the teardown revision that
// follows it, a status written together with a mark seen late (a relist), and
// every update of a volume not being marked do.
func TestDeletionMarkOnlyWakesNoReplica(t *testing.T) {
	now := metav1.Now()
	member := v1.DatameshMember{Name: "vol-node-1", Type: v1.MemberTypeDiskful, NodeName: "node-1"}
	live := &v1.ReplicatedVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "vol", Generation: 1, ResourceVersion: "10"},
		Spec:       v1.ReplicatedVolumeSpec{ReplicatedStorageClassName: "bench"},
		Status: v1.ReplicatedVolumeStatus{
			Datamesh:         v1.Datamesh{Members: []v1.DatameshMember{member}, Quorum: 1},
			DatameshRevision: 4,
		},
	}
	marked := live.DeepCopy()
	marked.DeletionTimestamp, marked.Generation, marked.ResourceVersion = &now, 2, "11"
	tornDown := marked.DeepCopy()
	tornDown.Status.Datamesh.Members, tornDown.Status.Datamesh.Quorum = nil, 0
	tornDown.Status.DatameshRevision, tornDown.ResourceVersion = 5, "12"
	markedLate := tornDown.DeepCopy() // a relist: the mark and the teardown in one update
	resized := live.DeepCopy()
	resized.Spec.ReplicatedStorageClassName = "other"
	resized.DeletionTimestamp = &now

	for _, tc := range []struct {
		name     string
		old, new *v1.ReplicatedVolume
		skip     bool
	}{
		{"the deletion mark", live, marked, true},
		{"the teardown revision after the mark", marked, tornDown, false},
		{"the mark and the teardown in one update", live, markedLate, false},
		{"the mark and a spec change in one update", live, resized, false},
		{"an update of a volume already marked", tornDown, tornDown.DeepCopy(), false},
		{"an update of a live volume", live, live.DeepCopy(), false},
	} {
		if got := deletionMarkOnly(tc.old, tc.new); got != tc.skip {
			t.Errorf("%s: deletionMarkOnly = %v, want %v", tc.name, got, tc.skip)
		}
	}
}

// A volume goes (its members are left as they are until their own deletion) when it
// is marked and shows no member attached and no Attach or Detach in flight; a replica
// is deleted with it when the replica is marked too.
func TestDeletedWithVolume(t *testing.T) {
	now := metav1.Now()
	rv := &v1.ReplicatedVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "vol", DeletionTimestamp: &now},
		Status: v1.ReplicatedVolumeStatus{Datamesh: v1.Datamesh{Members: []v1.DatameshMember{
			{Name: "vol-node-1", NodeName: "node-1"}, {Name: "vol-node-2", NodeName: "node-2"}}}},
	}
	rvr := &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: "vol-node-2", DeletionTimestamp: &now}}
	live := rv.DeepCopy()
	live.DeletionTimestamp = nil
	attached := rv.DeepCopy()
	attached.Status.Datamesh.Members[0].Attached = true
	detaching := rv.DeepCopy()
	detaching.Status.DatameshTransitions = []v1.DatameshTransition{{Type: v1.TransitionDetach, ReplicaName: "vol-node-1"}}
	forming := rv.DeepCopy()
	forming.Status.DatameshTransitions = []v1.DatameshTransition{{Type: v1.TransitionFormation}}
	kept := rvr.DeepCopy()
	kept.DeletionTimestamp = nil

	for _, tc := range []struct {
		name       string
		rvr        *v1.ReplicatedVolumeReplica
		rv         *v1.ReplicatedVolume
		goes, want bool
	}{
		{"both deleted, nothing attached", rvr, rv, true, true},
		{"both deleted while forming", rvr, forming, true, true},
		{"the volume not deleted", rvr, live, false, false},
		{"the volume gone from the cache", rvr, nil, false, false},
		{"the replica not deleted", kept, rv, true, false},
		{"a member attached", rvr, attached, false, false},
		{"a Detach in flight", rvr, detaching, false, false},
	} {
		if got := volumeGoes(tc.rv); got != tc.goes {
			t.Errorf("%s: volumeGoes = %v, want %v", tc.name, got, tc.goes)
		}
		if got := deletedWithVolume(tc.rvr, tc.rv); got != tc.want {
			t.Errorf("%s: deletedWithVolume = %v, want %v", tc.name, got, tc.want)
		}
	}
}
