package agent

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// The marks of the replicas an agent released itself (released): a replica gone from
// the cache asks for a collector pass unless its mark says the agent released it, every
// time its name is found gone while the mark is kept; a replica of the same name
// created again drops the earlier one's mark; and the marks of replicas gone are
// forgotten after releasedKeep.
func TestReleasedMarks(t *testing.T) {
	a := &Agent{released: map[string]released{}}
	replica := func(name string, uid types.UID) *v1.ReplicatedVolumeReplica {
		return &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid}}
	}
	now := time.Date(2026, 11, 28, 20, 0, 0, 0, time.UTC)

	if !a.goneReplica("vol-a-node-1", now) {
		t.Fatal("a replica this agent never released asks for no pass when gone")
	}

	// Released here, still cached (a live replica released on its volume's deletion
	// mark, or a deleted one whose deletion the cache has yet to show).
	a.markReleased(replica("vol-a-node-1", "1"))
	for range 2 {
		if !a.releasedHere(replica("vol-a-node-1", "1")) {
			t.Fatal("the released replica, as the cache shows it still, is not known as released")
		}
	}
	// Found gone, twice (an event queued while it was cached, then its deletion's).
	for i := range 2 {
		if a.goneReplica("vol-a-node-1", now.Add(time.Duration(i)*time.Second)) {
			t.Fatalf("found gone (%d), the replica this agent released asks for a pass", i+1)
		}
	}

	// The same name again: another replica, which the mark does not cover.
	if a.releasedHere(replica("vol-a-node-1", "2")) {
		t.Fatal("a replica created again under the released one's name is taken for released")
	}
	if !a.goneReplica("vol-a-node-1", now.Add(2*time.Second)) {
		t.Fatal("the replica created again under a released one's name asks for no pass when gone")
	}

	// Forgotten a while after they are gone; kept while cached.
	a.markReleased(replica("vol-b-node-1", "3"))
	a.markReleased(replica("vol-c-node-1", "4"))
	a.goneReplica("vol-b-node-1", now.Add(3*time.Second))
	a.goneReplica("vol-x-node-1", now.Add(3*time.Second+releasedKeep))
	if _, kept := a.released["vol-b-node-1"]; kept {
		t.Errorf("the mark of a replica gone %s ago is kept", releasedKeep)
	}
	if !a.releasedHere(replica("vol-c-node-1", "4")) {
		t.Errorf("the mark of a released replica still cached was forgotten")
	}
}
