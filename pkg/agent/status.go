package agent

import (
	"encoding/json"
	"math"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/storage"
)

// ownedConditions are the condition types the agent writes; every other type
// in status.conditions (the controller's AgentReady) is left to its owner.
var ownedConditions = []string{v1.ConditionDRBDConfigured, v1.ConditionDRBDRole}

// observed is what the kernel says about the replica's resource, by name of
// the members it talks to.
type observed struct {
	state   *drbd.ResourceState // nil: not running
	members map[int32]string    // DRBD node-id → member (RVR) name
	device  string              // the driver's device path
}

// kernelStatus fills the kernel-derived fields of st.
func kernelStatus(st *v1.ReplicatedVolumeReplicaStatus, o observed) {
	s := o.state
	if s == nil {
		return
	}
	st.Role = v1.ReplicaRole(s.Role)
	st.IOSuspended = len(s.Suspended) > 0
	st.DevicePath = o.device
	if d := s.Devices[drbd.VolumeNumber]; d != nil {
		st.DiskState = v1.DiskState(d.DiskState)
		q := d.Quorum
		st.Quorum = &q
	}
	ids := make([]int, 0, len(s.Connections))
	for id := range s.Connections {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		c := s.Connections[id]
		name := o.members[int32(id)]
		if name == "" {
			// A connection the datamesh no longer names (it is being removed):
			// report it under the DRBD host name so the peer list stays honest.
			name = c.Name
		}
		nid := int32(id)
		p := v1.PeerStatus{Name: name, NodeID: &nid, ConnectionState: c.State}
		if pd := c.PeerDevices[drbd.VolumeNumber]; pd != nil {
			p.ReplicationState = pd.Replication
			p.PeerDiskState = v1.DiskState(pd.PeerDisk)
			if pd.Resyncing() {
				p.Resync = &v1.ResyncProgress{OutOfSyncBytes: pd.OutOfSyncKiB * 1024}
				if !math.IsNaN(pd.PercentInSync) {
					p.Resync.PercentDone = int32(math.Floor(pd.PercentInSync))
				}
			}
		}
		st.Peers = append(st.Peers, p)
	}
}

func backingStatus(v *storage.Volume) *v1.BackingVolumeStatus {
	if v == nil {
		return nil
	}
	return &v1.BackingVolumeStatus{Name: v.Name, DevicePath: v.DevicePath, Size: *resource.NewQuantity(v.SizeBytes, resource.BinarySI)}
}

// setCondition sets a condition in conds, keeping lastTransitionTime when the
// status did not change (so an unchanged condition is not a change).
func setCondition(conds []metav1.Condition, prev []metav1.Condition, c metav1.Condition, gen int64, now metav1.Time) []metav1.Condition {
	c.ObservedGeneration = gen
	c.LastTransitionTime = now
	for _, p := range prev {
		if p.Type == c.Type && p.Status == c.Status {
			c.LastTransitionTime = p.LastTransitionTime
		}
	}
	return append(conds, c)
}

// ownedStatus is the part of an RVR status this agent owns: everything but
// the conditions of other writers.
func ownedStatus(st *v1.ReplicatedVolumeReplicaStatus) v1.ReplicatedVolumeReplicaStatus {
	out := *st.DeepCopy()
	out.Conditions = nil
	for _, c := range st.Conditions {
		if slices.Contains(ownedConditions, c.Type) {
			out.Conditions = append(out.Conditions, c)
		}
	}
	slices.SortFunc(out.Conditions, func(a, b metav1.Condition) int { return strings.Compare(a.Type, b.Type) })
	if len(out.Peers) == 0 {
		out.Peers = nil
	}
	return out
}

// sameStatus compares two owned statuses semantically (quantities by value).
func sameStatus(a, b v1.ReplicatedVolumeReplicaStatus) bool {
	return equality.Semantic.DeepEqual(ownedStatus(&a), ownedStatus(&b))
}

// withoutProgress blanks the resync figures, which move continuously: a change
// in them alone is rate-limited (docs/contract.md: "resync progress at most
// every few seconds").
func withoutProgress(st v1.ReplicatedVolumeReplicaStatus) v1.ReplicatedVolumeReplicaStatus {
	st = *st.DeepCopy()
	for i := range st.Peers {
		if st.Peers[i].Resync != nil {
			st.Peers[i].Resync = &v1.ResyncProgress{}
		}
	}
	return st
}

// withoutPeers blanks the peers (awaitsDayZero).
func withoutPeers(st v1.ReplicatedVolumeReplicaStatus) v1.ReplicatedVolumeReplicaStatus {
	st = *st.DeepCopy()
	st.Peers = nil
	return st
}

// withoutPeersOrGeneration blanks the peers and the observed generation (goingAway).
func withoutPeersOrGeneration(st v1.ReplicatedVolumeReplicaStatus) v1.ReplicatedVolumeReplicaStatus {
	st = withoutPeers(st)
	st.ObservedGeneration = 0
	return st
}

// applyBody is the server-side apply request body for an RVR's status: only
// the fields the agent owns. Leaving a field out hands it back (deletes it),
// which is how a field that no longer applies disappears.
func applyBody(name string, st v1.ReplicatedVolumeReplicaStatus) ([]byte, error) {
	owned := ownedStatus(&st)
	return json.Marshal(map[string]any{
		"apiVersion": v1.SchemeGroupVersion.String(),
		"kind":       "ReplicatedVolumeReplica",
		"metadata":   map[string]any{"name": name},
		"status":     owned,
	})
}
