package agent

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// A volume's deletion mark wakes its replicas when the volume goes (nothing attached,
// no Attach or Detach in flight): they are taken down and released then. The mark alone
// of a volume still attached wakes none; the teardown revision that follows a mark, a
// status written together with a mark seen late (a relist), and every update of a
// volume not being marked do.
func TestVolumeUpdatesThatWakeReplicas(t *testing.T) {
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
	attached := live.DeepCopy()
	attached.Status.Datamesh.Members[0].Attached = true
	markedAttached := attached.DeepCopy()
	markedAttached.DeletionTimestamp, markedAttached.Generation, markedAttached.ResourceVersion = &now, 2, "11"
	tornDown := marked.DeepCopy()
	tornDown.Status.Datamesh.Members, tornDown.Status.Datamesh.Quorum = nil, 0
	tornDown.Status.DatameshRevision, tornDown.ResourceVersion = 5, "12"
	markedLate := tornDown.DeepCopy() // a relist: the mark and the teardown in one update
	resized := live.DeepCopy()
	resized.Spec.ReplicatedStorageClassName = "other"
	resized.DeletionTimestamp = &now

	for _, tc := range []struct {
		name           string
		old, new       *v1.ReplicatedVolume
		markOnly, wake bool
	}{
		{"the deletion mark of a volume that goes", live, marked, true, true},
		{"the deletion mark of a volume attached", attached, markedAttached, true, false},
		{"the teardown revision after the mark", marked, tornDown, false, true},
		{"the mark and the teardown in one update", live, markedLate, false, true},
		{"the mark and a spec change in one update", live, resized, false, true},
		{"an update of a volume already marked", tornDown, tornDown.DeepCopy(), false, true},
		{"an update of a live volume", live, live.DeepCopy(), false, true},
	} {
		if got := deletionMarkOnly(tc.old, tc.new); got != tc.markOnly {
			t.Errorf("%s: deletionMarkOnly = %v, want %v", tc.name, got, tc.markOnly)
		}
		if got := volumeUpdateWakesReplicas(tc.old, tc.new); got != tc.wake {
			t.Errorf("%s: volumeUpdateWakesReplicas = %v, want %v", tc.name, got, tc.wake)
		}
	}
}

// A volume goes (its members are taken down and released, deleted or not yet) when it
// is marked and shows no member attached and no Attach or Detach in flight.
func TestVolumeGoes(t *testing.T) {
	now := metav1.Now()
	rv := &v1.ReplicatedVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "vol", DeletionTimestamp: &now},
		Status: v1.ReplicatedVolumeStatus{Datamesh: v1.Datamesh{Members: []v1.DatameshMember{
			{Name: "vol-node-1", NodeName: "node-1"}, {Name: "vol-node-2", NodeName: "node-2"}}}},
	}
	live := rv.DeepCopy()
	live.DeletionTimestamp = nil
	attached := rv.DeepCopy()
	attached.Status.Datamesh.Members[0].Attached = true
	detaching := rv.DeepCopy()
	detaching.Status.DatameshTransitions = []v1.DatameshTransition{{Type: v1.TransitionDetach, ReplicaName: "vol-node-1"}}
	forming := rv.DeepCopy()
	forming.Status.DatameshTransitions = []v1.DatameshTransition{{Type: v1.TransitionFormation}}

	for _, tc := range []struct {
		name string
		rv   *v1.ReplicatedVolume
		goes bool
	}{
		{"deleted, nothing attached", rv, true},
		{"deleted while forming", forming, true},
		{"not deleted", live, false},
		{"gone from the cache", nil, false},
		{"a member attached", attached, false},
		{"a Detach in flight", detaching, false},
	} {
		if got := volumeGoes(tc.rv); got != tc.goes {
			t.Errorf("%s: volumeGoes = %v, want %v", tc.name, got, tc.goes)
		}
	}
}

// A peer's departure is a peer the replica last reported Connected that its next report
// shows otherwise, or not at all, while the volume as cached still has it as a member:
// the one report for which the agent reads the volume past its cache (peerLeft).
func TestPeerLeft(t *testing.T) {
	rv := &v1.ReplicatedVolume{Status: v1.ReplicatedVolumeStatus{Datamesh: v1.Datamesh{Members: []v1.DatameshMember{
		{Name: "vol-node-1"}, {Name: "vol-node-2"}, {Name: "vol-node-3"},
	}}}}
	peers := func(states ...string) v1.ReplicatedVolumeReplicaStatus {
		var st v1.ReplicatedVolumeReplicaStatus
		for i, s := range states {
			st.Peers = append(st.Peers, v1.PeerStatus{Name: "vol-node-" + string(rune('2'+i)), ConnectionState: s})
		}
		return st
	}
	removed := rv.DeepCopy()
	removed.Status.Datamesh.Members = removed.Status.Datamesh.Members[:2]
	for _, tc := range []struct {
		name           string
		rv             *v1.ReplicatedVolume
		reported, next v1.ReplicatedVolumeReplicaStatus
		want           bool
	}{
		{"a connected peer now Connecting", rv, peers("Connected", "Connected"), peers("Connected", "Connecting"), true},
		{"a connected peer no longer listed", rv, peers("Connected", "Connected"), peers("Connected"), true},
		{"both still connected", rv, peers("Connected", "Connected"), peers("Connected", "Connected"), false},
		{"a peer that was not connected", rv, peers("Connected", "Connecting"), peers("Connected", "StandAlone"), false},
		{"a peer connecting", rv, peers("Connecting", "Connecting"), peers("Connected", "Connecting"), false},
		{"a peer removed from the datamesh", removed, peers("Connected", "Connected"), peers("Connected"), false},
		{"no volume in the cache", nil, peers("Connected", "Connected"), peers(), false},
	} {
		if got := peerLeft(tc.rv, tc.reported, tc.next); got != tc.want {
			t.Errorf("%s: peerLeft = %v, want %v", tc.name, got, tc.want)
		}
	}
}
