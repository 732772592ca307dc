package agent

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// The backing volume's key carries the replica's UID, except for a volume the
// replica's own status names without it (created for this object by an agent
// from before the key carried the UID).
func TestBackingKey(t *testing.T) {
	const uid = "3f2a9c1b-4d5e-4f60-8a7b-0c1d2e3f4a5b"
	rvr := func(status *v1.BackingVolumeStatus) *v1.ReplicatedVolumeReplica {
		return &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: "pvc-1-node-1", UID: uid},
			Status: v1.ReplicatedVolumeReplicaStatus{BackingVolume: status}}
	}
	for _, c := range []struct {
		what   string
		status *v1.BackingVolumeStatus
		want   string
	}{
		{"a new replica", nil, "pvc-1-node-1.3f2a9c1b4d5e"},
		{"a replica on its own keyed file", &v1.BackingVolumeStatus{Name: "pvc-1-node-1.3f2a9c1b4d5e.img"}, "pvc-1-node-1.3f2a9c1b4d5e"},
		{"a replica on its own keyed LV", &v1.BackingVolumeStatus{Name: "pvc-1-node-1.3f2a9c1b4d5e"}, "pvc-1-node-1.3f2a9c1b4d5e"},
		{"a replica whose status names a file without the UID", &v1.BackingVolumeStatus{Name: "pvc-1-node-1.img"}, "pvc-1-node-1"},
		{"a replica whose status names an LV without the UID", &v1.BackingVolumeStatus{Name: "pvc-1-node-1"}, "pvc-1-node-1"},
	} {
		if got := backingKey(rvr(c.status)); got != c.want {
			t.Errorf("%s: key %q, want %q", c.what, got, c.want)
		}
	}
	other := rvr(nil)
	other.UID = "9e8d7c6b-5a49-4837-a261-504f3e2d1c0b"
	if backingKey(other) == backingKey(rvr(nil)) {
		t.Errorf("two replicas of one name with different UIDs share the key %q", backingKey(other))
	}
}
