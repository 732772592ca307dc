package controller

import (
	"strings"
	"testing"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// fencedBySurvivors on a 2D+1TB volume attached on node-1, which is lost: the answer
// needs both survivors' reports of the lost replica's connection down, the lost
// replica to have run the q of the datamesh (nothing but attachments in flight, and
// its last report no older than them), and quorum on.
func TestFencedBySurvivors(t *testing.T) {
	const rev = 7
	volume := func(ts ...v1.DatameshTransition) *v1.ReplicatedVolume {
		rv := &v1.ReplicatedVolume{}
		rv.Status.Datamesh.Quorum = 2
		rv.Status.Datamesh.Members = []v1.DatameshMember{
			{Name: "r1", Type: v1.MemberTypeDiskful, NodeName: "node-1", Attached: true},
			{Name: "r2", Type: v1.MemberTypeDiskful, NodeName: "node-2"},
			{Name: "r3", Type: v1.MemberTypeTieBreaker, NodeName: "node-3"},
		}
		rv.Status.DatameshRevision = rev
		rv.Status.DatameshTransitions = ts
		return rv
	}
	replica := func(name, node string, revision int64, peers ...v1.PeerStatus) v1.ReplicatedVolumeReplica {
		r := v1.ReplicatedVolumeReplica{}
		r.Name, r.Spec.NodeName, r.Status.DatameshRevision, r.Status.Peers = name, node, revision, peers
		return r
	}
	down := v1.PeerStatus{Name: "r1", ConnectionState: "Connecting"}
	up := v1.PeerStatus{Name: "r1", ConnectionState: "Connected"}
	survivors := func(r1rev int64, p2, p3 v1.PeerStatus) []v1.ReplicatedVolumeReplica {
		return []v1.ReplicatedVolumeReplica{replica("r1", "node-1", r1rev), replica("r2", "node-2", rev, p2), replica("r3", "node-3", rev, p3)}
	}
	live := map[string]bool{"r2": true, "r3": true}
	forceDetach := v1.DatameshTransition{Type: v1.TransitionForceDetach, ReplicaName: "r1",
		Steps: []v1.DatameshTransitionStep{{Name: "force-detach", Status: v1.StepActive, DatameshRevision: rev}}}
	forceRemove := v1.DatameshTransition{Type: v1.TransitionForceRemoveReplica, ReplicaName: "r1",
		Steps: []v1.DatameshTransitionStep{{Name: "D → ✕", Status: v1.StepActive, DatameshRevision: rev}}}

	for _, tc := range []struct {
		name   string
		rv     *v1.ReplicatedVolume
		rvrs   []v1.ReplicatedVolumeReplica
		live   map[string]bool
		fenced bool
	}{
		{"both survivors report it down", volume(), survivors(rev, down, down), live, true},
		{"its force detach in flight, published after its last report", volume(forceDetach), survivors(rev-1, down, down), live, true},
		{"the TieBreaker still connected", volume(), survivors(rev, down, up), live, false},
		{"the TieBreaker reports no connection to it at all", volume(), survivors(rev, down, v1.PeerStatus{Name: "rx", ConnectionState: "Connecting"}), live, false},
		{"the TieBreaker's agent not live", volume(), survivors(rev, down, down), map[string]bool{"r2": true}, false},
		{"its last report older than the datamesh's q", volume(), survivors(rev-1, down, down), live, false},
		{"its force removal in flight: it may run another q", volume(forceRemove), survivors(rev-1, down, down), live, false},
		{"quorum off", func() *v1.ReplicatedVolume { rv := volume(); rv.Status.Datamesh.Quorum = 0; return rv }(), survivors(rev, down, down), live, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fenced, why := fencedBySurvivors(tc.rv, tc.rvrs, "node-1", tc.live)
			if fenced != tc.fenced {
				t.Fatalf("fenced = %v (%q), want %v", fenced, why, tc.fenced)
			}
			if fenced && !strings.Contains(why, "r1 cannot hold quorum (q=2)") {
				t.Fatalf("why = %q: does not say which replica cannot hold which quorum", why)
			}
		})
	}
}
