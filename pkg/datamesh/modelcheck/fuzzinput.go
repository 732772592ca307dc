package modelcheck

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh"
)

// FuzzInput decodes arbitrary bytes into a schema-valid engine input: every
// enum holds one of its values, every number is in its API range, list map
// keys are unique, and the CEL rules of the configuration hold. Nothing else
// is promised: members, transitions, requests and replicas are combined at
// random, so the engine sees statuses no sane history produces (a stale
// transition, a member without a replica, duplicated node-ids). It must
// cope with all of them without panicking.
//
// When the bytes run out every further choice is zero, so short inputs give
// small, valid volumes.
func FuzzInput(data []byte) *datamesh.Input {
	b := &byteSource{data: data}
	cfg := v1alpha1.ReplicatedVolumeConfiguration{
		StoragePool:                     "pool",
		GuaranteedMinimumDataRedundancy: int32(b.intn(3)),
		Topology:                        pick(b, []v1alpha1.Topology{v1alpha1.TopologyIgnored, v1alpha1.TopologyZonal, v1alpha1.TopologyTransZonal}),
		VolumeAccess:                    pick(b, []v1alpha1.VolumeAccess{v1alpha1.VolumeAccessPreferablyLocal, v1alpha1.VolumeAccessLocal, v1alpha1.VolumeAccessEventuallyLocal, v1alpha1.VolumeAccessAny}),
	}
	cfg.FailuresToTolerate = int32(b.intn(int(cfg.GuaranteedMinimumDataRedundancy) + 2))
	if cfg.FailuresToTolerate > 2 {
		cfg.FailuresToTolerate = 2
	}
	rv := &v1alpha1.ReplicatedVolume{
		ObjectMeta: metav1.ObjectMeta{Name: volumeName, Generation: 1 + int64(b.intn(3)), UID: "vol-uid"},
		Spec: v1alpha1.ReplicatedVolumeSpec{
			Size:                resource.MustParse("1Gi"),
			ConfigurationMode:   v1alpha1.ConfigurationModeManual,
			ManualConfiguration: &cfg,
			MaxAttachments:      int32(1 + b.intn(2)),
		},
	}
	if b.bool() {
		t := metav1.NewTime(epoch)
		rv.DeletionTimestamp = &t
	}
	st := &rv.Status
	if b.bool() {
		c := cfg
		c.FailuresToTolerate = int32(b.intn(int(c.GuaranteedMinimumDataRedundancy) + 2))
		if c.FailuresToTolerate > 2 {
			c.FailuresToTolerate = 2
		}
		st.Configuration = &c
	}
	if b.bool() {
		st.EffectiveLayout = &v1alpha1.Layout{FailuresToTolerate: int32(b.intn(3)), GuaranteedMinimumDataRedundancy: int32(b.intn(3))}
	}
	st.DatameshRevision = int64(b.intn(20))
	memberTypes := []v1alpha1.MemberType{v1alpha1.MemberTypeDiskful, v1alpha1.MemberTypeTieBreaker, v1alpha1.MemberTypeAccess,
		v1alpha1.MemberTypeLiminalDiskful, v1alpha1.MemberTypeShadowDiskful, v1alpha1.MemberTypeLiminalShadowDiskful}
	const names = 7
	name := func(k int) string { return fmt.Sprintf("r%d", k) }
	node := func(k int) string { return fmt.Sprintf("node-%d", k) }
	used := b.bits(names)
	for k := 0; k < names; k++ {
		if used&(1<<k) == 0 || !b.bool() {
			continue
		}
		st.Datamesh.Members = append(st.Datamesh.Members, v1alpha1.DatameshMember{
			Name: name(k), Type: pick(b, memberTypes), NodeName: node(k), Zone: Zones[b.intn(3)],
			Addresses: []string{fmt.Sprintf("10.0.0.%d", k+1)}, NodeID: int32(b.intn(32)), Attached: b.intn(4) == 0,
		})
	}
	st.Datamesh.Quorum = int32(b.intn(33))
	st.Datamesh.QuorumMinimumRedundancy = int32(b.intn(33))
	st.Datamesh.Multiattach = b.intn(4) == 0

	ttypes := []v1alpha1.TransitionType{v1alpha1.TransitionAddReplica, v1alpha1.TransitionRemoveReplica, v1alpha1.TransitionChangeReplicaType,
		v1alpha1.TransitionAttach, v1alpha1.TransitionDetach, v1alpha1.TransitionForceRemoveReplica, v1alpha1.TransitionForceDetach,
		v1alpha1.TransitionChangeQuorum, v1alpha1.TransitionEnableMultiattach, v1alpha1.TransitionDisableMultiattach, v1alpha1.TransitionFormation}
	groups := []v1alpha1.TransitionGroup{v1alpha1.GroupVotingMembership, v1alpha1.GroupNonVotingMembership, v1alpha1.GroupAttachment,
		v1alpha1.GroupEmergency, v1alpha1.GroupQuorum, v1alpha1.GroupMultiattach, v1alpha1.GroupFormation}
	plans := []string{"diskful-q-up", "diskful", "access", "tiebreaker", "attach", "detach", "formation", "change-quorum", "bogus"}
	stepNames := []string{"✦ → A", "✦ → D∅", "D∅ → D", "A → D∅ + q↑", "D → D∅", "D∅ → ✕", "qmr↑", "qmr↓", "attach", "detach", "?"}
	statuses := []v1alpha1.StepStatus{v1alpha1.StepActive, v1alpha1.StepPending, v1alpha1.StepCompleted}
	for n := b.intn(4); n > 0; n-- {
		t := v1alpha1.DatameshTransition{
			Type: pick(b, ttypes), Group: pick(b, groups), PlanID: pick(b, plans), PlanVersion: int32(1 + b.intn(3)),
		}
		if b.intn(5) != 0 {
			t.ReplicaName = name(b.intn(names))
		}
		if b.bool() {
			t.FromType = pick(b, memberTypes)
			t.ToType = pick(b, memberTypes)
		}
		for s := 1 + b.intn(4); s > 0; s-- {
			t.Steps = append(t.Steps, v1alpha1.DatameshTransitionStep{
				Name: pick(b, stepNames), Status: pick(b, statuses), DatameshRevision: int64(b.intn(22)),
			})
		}
		st.DatameshTransitions = append(st.DatameshTransitions, t)
	}
	ops := []v1alpha1.ReplicaOperation{v1alpha1.ReplicaOperationJoin, v1alpha1.ReplicaOperationLeave, v1alpha1.ReplicaOperationChangeType, v1alpha1.ReplicaOperationForceLeave}
	rtypes := []v1alpha1.ReplicaType{v1alpha1.ReplicaTypeDiskful, v1alpha1.ReplicaTypeAccess, v1alpha1.ReplicaTypeTieBreaker, v1alpha1.ReplicaTypeShadowDiskful}
	reqUsed := b.bits(names)
	for k := 0; k < names; k++ {
		if reqUsed&(1<<k) != 0 && b.intn(3) == 0 {
			st.DatameshReplicaRequests = append(st.DatameshReplicaRequests, v1alpha1.DatameshReplicaRequest{
				Name: name(k), Operation: pick(b, ops), Type: pick(b, rtypes), Message: pick(b, []string{"", "waiting"}),
			})
		}
	}

	in := &datamesh.Input{RV: rv, Now: epoch, Pool: &datamesh.Pool{Name: "pool", Available: b.intn(8) != 0}}
	for k := 0; k < names; k++ {
		in.Pool.Nodes = append(in.Pool.Nodes, v1alpha1.EligibleNode{NodeName: node(k), Zone: Zones[k%3], Ready: b.intn(6) != 0})
	}
	reasons := []string{v1alpha1.ReasonConfigured, v1alpha1.ReasonApplyingConfiguration,
		v1alpha1.ReasonPendingDatameshJoin, v1alpha1.ReasonConfigurationFailed}
	disks := []v1alpha1.DiskState{v1alpha1.DiskStateUpToDate, v1alpha1.DiskStateDiskless, v1alpha1.DiskStateInconsistent,
		v1alpha1.DiskStateOutdated, v1alpha1.DiskStateAttaching, v1alpha1.DiskStateUnknown, v1alpha1.DiskStateFailed}
	conns := []string{"Connected", "Connecting", "StandAlone"}
	rvrUsed := b.bits(names)
	for k := 0; k < names; k++ {
		if rvrUsed&(1<<k) == 0 {
			continue
		}
		r := &v1alpha1.ReplicatedVolumeReplica{
			ObjectMeta: metav1.ObjectMeta{Name: name(k), Generation: 1, UID: types.UID("uid-" + name(k))},
			Spec:       v1alpha1.ReplicatedVolumeReplicaSpec{ReplicatedVolumeName: volumeName, NodeName: node(k), Type: pick(b, rtypes)},
		}
		if b.intn(6) == 0 {
			r.Spec.NodeName = ""
		}
		if r.Spec.Type == v1alpha1.ReplicaTypeDiskful || r.Spec.Type == v1alpha1.ReplicaTypeShadowDiskful {
			r.Spec.Storage = &v1alpha1.ReplicaStorage{Pool: "pool", VolumeGroup: "vg"}
		}
		if b.intn(5) == 0 {
			t := metav1.NewTime(epoch)
			r.DeletionTimestamp = &t
			r.Finalizers = []string{"storage.meshvol.io/datamesh"}
		}
		rs := &r.Status
		rs.DatameshRevision = int64(b.intn(23))
		if b.intn(6) != 0 {
			rs.Addresses = []string{fmt.Sprintf("10.0.0.%d", k+1)}
		}
		rs.DiskState = pick(b, disks)
		if b.intn(4) != 0 {
			reason := pick(b, reasons)
			status := metav1.ConditionFalse
			if reason == v1alpha1.ReasonConfigured {
				status = metav1.ConditionTrue
			}
			rs.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionDRBDConfigured, Status: status, Reason: reason,
				Message: "fuzz", LastTransitionTime: metav1.NewTime(epoch)}}
		}
		// The controller's liveness verdict: absent, True, False or Unknown.
		if v := b.intn(4); v != 0 {
			c := metav1.Condition{Type: v1alpha1.ConditionAgentReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAgentLeaseValid,
				Message: "fuzz", LastTransitionTime: metav1.NewTime(epoch)}
			if v == 2 {
				c.Status, c.Reason = metav1.ConditionFalse, v1alpha1.ReasonAgentLeaseExpired
			} else if v == 3 {
				c.Status, c.Reason = metav1.ConditionUnknown, v1alpha1.ReasonAgentLeaseMissing
			}
			rs.Conditions = append(rs.Conditions, c)
		}
		peers := b.bits(names)
		for j := 0; j < names; j++ {
			if j != k && peers&(1<<j) != 0 {
				id := int32(j)
				rs.Peers = append(rs.Peers, v1alpha1.PeerStatus{Name: name(j), NodeID: &id, ConnectionState: pick(b, conns), PeerDiskState: pick(b, disks)})
			}
		}
		in.RVRs = append(in.RVRs, r)
	}
	rvas := b.bits(names)
	for k := 0; k < names; k++ {
		if rvas&(1<<k) != 0 && b.intn(3) == 0 {
			a := &v1alpha1.ReplicatedVolumeAttachment{
				ObjectMeta: metav1.ObjectMeta{Name: "rva-" + node(k), Generation: 1},
				Spec:       v1alpha1.ReplicatedVolumeAttachmentSpec{ReplicatedVolumeName: volumeName, NodeName: node(k)},
			}
			if b.intn(5) == 0 {
				t := metav1.NewTime(epoch)
				a.DeletionTimestamp = &t
			}
			in.RVAs = append(in.RVAs, a)
		}
	}
	if b.intn(4) == 0 {
		in.ForceLeave = append(in.ForceLeave, name(b.intn(names)))
	}
	if b.intn(4) == 0 {
		in.ForceDetach = append(in.ForceDetach, name(b.intn(names)))
	}
	if b.intn(8) == 0 {
		in.ChangeQuorum = &datamesh.QuorumChange{Quorum: int32(b.intn(6)), QuorumMinimumRedundancy: int32(b.intn(4))}
	}
	return in
}

type byteSource struct {
	data []byte
	pos  int
}

func (b *byteSource) byte() byte {
	if b.pos >= len(b.data) {
		return 0
	}
	b.pos++
	return b.data[b.pos-1]
}

func (b *byteSource) intn(n int) int {
	if n <= 1 {
		return 0
	}
	return int(b.byte()) % n
}

func (b *byteSource) bool() bool { return b.byte()&1 == 1 }

func (b *byteSource) bits(n int) uint32 {
	return (uint32(b.byte()) | uint32(b.byte())<<8) & (1<<n - 1)
}

func pick[T any](b *byteSource, xs []T) T { return xs[b.intn(len(xs))] }
