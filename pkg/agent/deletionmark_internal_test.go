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
