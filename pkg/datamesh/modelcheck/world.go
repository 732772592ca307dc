package modelcheck

import (
	"fmt"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh"
	"github.com/meshvol/meshvol/pkg/drbd/quorum"
)

// Replica is one replica slot: the RVR object (if it exists), its node, and
// what DRBD runs there.
type Replica struct {
	// Exists: the RVR object exists. A slot is used at most once: a deleted
	// replica's slot stays empty (Gone), so a name always means one object.
	Exists bool
	Gone   bool
	// SpecType is rvr.spec.type, the type the replica should become.
	SpecType v1alpha1.ReplicaType
	// Deleting: the RVR has a deletion timestamp.
	Deleting bool
	// Alive: the node runs. A lost node never comes back for the control
	// plane; it may come back alive behind a partition (Returned).
	Alive bool
	// Returned: a lost node came back alive behind a partition: its kernel runs
	// what it ran when it was lost, its agent never reports again, no reporting
	// replica sees it, and it applies nothing new. Any cut may still put it on
	// either side, next to nodes whose configuration still includes it.
	Returned bool
	// Rejoined: a node that came back (Returned) reports again (ActRejoin) and has
	// not applied a datamesh since: its kernel still runs, maybe as Primary, the
	// one it ran while lost. Like a returned node's, such a Primary is I1w's
	// question, not I4p's: it was force-detached while lost.
	Rejoined bool
	// AgentReady: the node's agent reports. While not ready, the RVR status
	// is stale and the kernel keeps running what it had applied.
	AgentReady bool
	// Applied is the datamesh the kernel runs, nil before the first apply.
	Applied *Snapshot
	// UpToDate: the local disk holds current data (only meaningful while
	// the applied type has a disk attached).
	UpToDate bool
	// DiskFailed: the backing disk failed and DRBD detached it (on-io-error
	// detach): the replica runs diskless whatever its applied type, and is
	// configured with its disk by its peers, which count it as a present
	// voter while connected, like a D∅ (docs/drbd-quorum.md, "The rule"). A
	// new backing volume (the replica's type gains a disk again) clears it.
	DiskFailed bool
}

// Slot is a replica slot's fixed placement.
type Slot struct {
	Name, Node, Zone string
}

// World is one state of the system: the volume with its status as the
// engine wrote it, the replicas, the attachments, and what the remaining
// run may still inject.
type World struct {
	DP DataPlane
	RV *v1alpha1.ReplicatedVolume
	// RVA[i]: an attachment request exists for slot i's node.
	RVA uint32
	// ForceLeave: slots the node lifecycle declared permanently lost.
	ForceLeave uint32
	// ExtraFTT is Input.ExtraFTT: 1 while a node maintenance copies the volume
	// elsewhere first (ReqMaintenance).
	ExtraFTT int8
	// Wanted is what the engine asked placement for at its last Process.
	Wanted []WantedReplica
	// Attachments is the engine's verdict on each RVA at its last Process
	// (for the message check of a settled state; not part of the state).
	Attachments []datamesh.AttachmentStatus

	LossesLeft, RestartsLeft, RequestsLeft, AttachLeft, ReturnsLeft, DiskFailsLeft int8

	// Floor is the protection the configuration history guarantees: the configuration
	// the volume was formed with, lowered (per value) by every configuration lowered
	// since, never raised. The checker derives it from the requests alone, apart from
	// the engine's effective layout (R-floor).
	Floor v1alpha1.Layout

	// Caches of values derived from RV, which is never mutated once a
	// world holds it (Process works on a deep copy): reset by setRV.
	pub      *Snapshot
	rvHash   uint64
	rvHashed bool
}

func (w *World) setRV(rv *v1alpha1.ReplicatedVolume) {
	w.RV, w.pub, w.rvHash, w.rvHashed = rv, nil, 0, false
}

func (w *World) statusHash() uint64 {
	if !w.rvHashed {
		w.rvHash, w.rvHashed = statusHash(&w.RV.Status), true
	}
	return w.rvHash
}

// WantedReplica is the checker's copy of one placement wish of the engine.
type WantedReplica struct {
	Action string // "Create", "Delete", "Retype"
	Type   v1alpha1.ReplicaType
	Slot   int // Delete/Retype: the replica; Create: the node's slot, or -1 for "placement picks"
}

// Clone copies the world. The RV and the snapshots are shared: they are
// immutable; whoever changes the RV installs a copy with setRV.
func (w *World) Clone() *World {
	c := *w
	c.Wanted = append([]WantedReplica(nil), w.Wanted...)
	return &c
}

// Scenario fixes what does not change during a run: the slots, the
// features, and the budgets.
type Scenario struct {
	Name   string
	Slots  []Slot
	Shadow bool
	// Initial: slot → type of the starting layout's replicas. The starting
	// state is reached by formation with every replica confirming at once.
	Initial   []v1alpha1.ReplicaType
	Config    v1alpha1.ReplicatedVolumeConfiguration
	MaxAttach int32
	// AttachFirst: the starting state has the volume attached on slot 0's
	// node (an RVA, the Attach transition completed).
	AttachFirst bool
	Losses      int8
	// DiskFailures: disks that may fail per run (ActDiskFail).
	DiskFailures int8
	Restarts     int8
	Requests     int8
	// Returns: lost nodes that may come back alive behind a partition per run.
	Returns int8
	// AttachRequests are attach or detach requests a run may inject beyond
	// Requests, so that moving an attachment (detach here, attach there) fits
	// in a run without paying for two requests of every kind.
	AttachRequests int8
	MaxDepth       int
	MaxStates      int
	// Only, when not zero, restricts injected requests to these kinds
	// (bit 1<<ReqKind); the checker's own tests use it.
	Only       uint32
	slotByName map[string]int
}

func (s *Scenario) slotOf(name string) int {
	if i, ok := s.slotByName[name]; ok {
		return i
	}
	return -1
}

func (s *Scenario) slotOfNode(node string) int {
	for i := range s.Slots {
		if s.Slots[i].Node == node {
			return i
		}
	}
	return -1
}

// epoch is the fixed "now" of every Process call: the engine takes no
// clock, and the checker explores orders, not durations.
var epoch = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

const volumeName = "vol"

func (s *Scenario) newRV() *v1alpha1.ReplicatedVolume {
	cfg := s.Config
	cfg.Zones = append([]string(nil), s.Config.Zones...)
	return &v1alpha1.ReplicatedVolume{
		ObjectMeta: metav1.ObjectMeta{Name: volumeName, Generation: 1, UID: "vol-uid"},
		Spec: v1alpha1.ReplicatedVolumeSpec{
			Size:                resource.MustParse("1Gi"),
			ConfigurationMode:   v1alpha1.ConfigurationModeManual,
			ManualConfiguration: &cfg,
			MaxAttachments:      s.MaxAttach,
		},
	}
}

// reportedRevision is what the agent writes to rvr.status.datameshRevision:
// the revision the kernel runs, or 0 once the replica has applied a datamesh
// without itself and torn DRBD down (docs/datamesh.md, "Confirmation": a leaving
// replica confirms by reporting revision 0).
func reportedRevision(r *Replica, slot int) int64 {
	if r.Applied == nil || r.Applied.Member(slot) == nil {
		return 0
	}
	return r.Applied.Revision
}

// RVR builds slot i's ReplicatedVolumeReplica as its agent would report it.
// A replica whose agent is not ready keeps its last report (stale), and the
// controller marks it AgentReady=False; a dead node's report stays stale forever,
// including the connections it had, so a guard that trusts it would be
// wrong (docs/datamesh-spec.md, "Preconditions for ForceRemoveReplica": MemberUnreachable).
func (w *World) RVR(s *Scenario, i int) *v1alpha1.ReplicatedVolumeReplica {
	r := &w.DP.Replicas[i]
	sl := &s.Slots[i]
	rvr := &v1alpha1.ReplicatedVolumeReplica{
		ObjectMeta: metav1.ObjectMeta{Name: sl.Name, Generation: 1, UID: types.UID("uid-" + sl.Name)},
		Spec: v1alpha1.ReplicatedVolumeReplicaSpec{
			ReplicatedVolumeName: volumeName,
			NodeName:             sl.Node,
			Type:                 r.SpecType,
		},
	}
	if r.SpecType == v1alpha1.ReplicaTypeDiskful || r.SpecType == v1alpha1.ReplicaTypeShadowDiskful {
		rvr.Spec.Storage = &v1alpha1.ReplicaStorage{Pool: s.Config.StoragePool, VolumeGroup: "vg"}
	}
	if r.Deleting {
		t := metav1.NewTime(epoch)
		rvr.DeletionTimestamp = &t
		rvr.Finalizers = []string{"storage.meshvol.io/datamesh"}
	}
	st := &rvr.Status
	st.ObservedGeneration = 1
	st.Addresses = []string{"10.0.0." + strconv.Itoa(i+1)}
	st.DatameshRevision = reportedRevision(r, i)
	member := r.Applied.Member(i)
	// DRBDConfigured is the agent's; while the agent is silent it is whatever the agent
	// last wrote, which for the revision the node still runs is what it would write now.
	// AgentReady is the controller's verdict from the node's Lease.
	reason, status := v1alpha1.ReasonConfigured, metav1.ConditionTrue
	switch {
	case member == nil:
		reason, status = v1alpha1.ReasonPendingDatameshJoin, metav1.ConditionFalse
	case r.Applied.Revision < w.RV.Status.DatameshRevision:
		reason, status = v1alpha1.ReasonApplyingConfiguration, metav1.ConditionFalse
	}
	ready := metav1.Condition{Type: v1alpha1.ConditionAgentReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAgentLeaseValid,
		Message: "model checker", ObservedGeneration: 1, LastTransitionTime: metav1.NewTime(epoch)}
	if !r.AgentReady {
		ready.Status, ready.Reason = metav1.ConditionFalse, v1alpha1.ReasonAgentLeaseExpired
	}
	st.Conditions = []metav1.Condition{{
		Type: v1alpha1.ConditionDRBDConfigured, Status: status, Reason: reason,
		Message: "model checker", ObservedGeneration: 1, LastTransitionTime: metav1.NewTime(epoch),
	}, ready}
	if member == nil {
		return rvr
	}
	st.Role = v1alpha1.RoleSecondary
	if member.Attached {
		st.Role = v1alpha1.RolePrimary
	}
	disk, _ := w.DP.physicalOf(i, member.Type)
	st.DiskState = diskState(disk)
	// Connections: what the node saw when it last reported. For a live
	// node that is now; a dead node's report froze while it was alive,
	// which is modelled by evaluating its links as if it still ran.
	dp := &w.DP
	if !r.Alive || r.Returned {
		cp := *dp
		cp.Replicas[i].Alive = true
		dp = &cp
	}
	for _, m := range r.Applied.Members {
		j := int(m.Slot)
		if j == i {
			continue
		}
		ps := v1alpha1.PeerStatus{Name: s.Slots[j].Name, ConnectionState: "Connecting"}
		id := m.NodeID
		ps.NodeID = &id
		if dp.Connected(i, j, ^uint32(0)) && (!dp.Replicas[j].Returned || !r.Alive) {
			ps.ConnectionState = "Connected"
			ps.ReplicationState = "Established"
			pj := dp.Replicas[j]
			d, _ := dp.physicalOf(j, pj.Applied.Member(j).Type)
			ps.PeerDiskState = diskState(d)
		} else {
			ps.PeerDiskState = v1alpha1.DiskStateUnknown
		}
		st.Peers = append(st.Peers, ps)
	}
	return rvr
}

func diskState(d quorum.Disk) v1alpha1.DiskState {
	switch d {
	case quorum.DiskUpToDate:
		return v1alpha1.DiskStateUpToDate
	case quorum.DiskPresent:
		return v1alpha1.DiskStateInconsistent
	}
	return v1alpha1.DiskStateDiskless
}

// RVA builds the attachment request for slot i's node.
func (s *Scenario) RVA(i int) *v1alpha1.ReplicatedVolumeAttachment {
	return &v1alpha1.ReplicatedVolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "rva-" + s.Slots[i].Node, Generation: 1, UID: types.UID("uid-rva-" + s.Slots[i].Node)},
		Spec:       v1alpha1.ReplicatedVolumeAttachmentSpec{ReplicatedVolumeName: volumeName, NodeName: s.Slots[i].Node},
	}
}

// String prints the world compactly for a counterexample trace.
func (w *World) String(s *Scenario) string {
	st := &w.RV.Status
	out := fmt.Sprintf("rev=%d q=%d qmr=%d multi=%v", st.DatameshRevision, st.Datamesh.Quorum, st.Datamesh.QuorumMinimumRedundancy, st.Datamesh.Multiattach)
	if st.EffectiveLayout != nil {
		out += fmt.Sprintf(" eff=%d/%d", st.EffectiveLayout.FailuresToTolerate, st.EffectiveLayout.GuaranteedMinimumDataRedundancy)
	}
	if st.Configuration != nil {
		out += fmt.Sprintf(" cfg=%d/%d", st.Configuration.FailuresToTolerate, st.Configuration.GuaranteedMinimumDataRedundancy)
	}
	if w.ExtraFTT > 0 {
		out += fmt.Sprintf(" maintenance(extraFTT=%d)", w.ExtraFTT)
	}
	out += "\n  members:"
	for _, m := range st.Datamesh.Members {
		out += fmt.Sprintf(" %s:%s", m.Name, shortType(m.Type))
		if m.Attached {
			out += "*"
		}
	}
	for _, t := range st.DatameshTransitions {
		out += fmt.Sprintf("\n  transition %s %s %s→%s plan=%s/v%d:", t.Type, t.ReplicaName, shortType(t.FromType), shortType(t.ToType), t.PlanID, t.PlanVersion)
		for _, sp := range t.Steps {
			out += fmt.Sprintf(" [%s %s r%d %q]", sp.Name, sp.Status, sp.DatameshRevision, sp.Message)
		}
	}
	for _, r := range st.DatameshReplicaRequests {
		out += fmt.Sprintf("\n  request %s %s %s: %q", r.Name, r.Operation, r.Type, r.Message)
	}
	for i := 0; i < w.DP.N; i++ {
		r := &w.DP.Replicas[i]
		if !r.Exists && r.Applied == nil {
			continue
		}
		out += fmt.Sprintf("\n  %s(%s) spec=%s", s.Slots[i].Name, s.Slots[i].Zone, r.SpecType)
		if r.Deleting {
			out += " deleting"
		}
		if r.Returned {
			out += " RETURNED-behind-partition"
		} else if r.Rejoined {
			out += " rejoined-not-applied"
		} else if !r.Alive {
			out += " DEAD"
		} else if !r.AgentReady {
			out += " agent-not-ready"
		}
		if m := r.Applied.Member(i); m != nil {
			out += fmt.Sprintf(" applied r%d as %s q=%d qmr=%d", r.Applied.Revision, shortType(m.Type), r.Applied.Q, r.Applied.QMR)
			if m.Attached {
				out += " Primary"
			}
			if r.UpToDate && m.Type.HasDisk() {
				out += " UpToDate"
			}
			if r.DiskFailed && m.Type.HasDisk() {
				out += " DISK-FAILED"
			}
		} else if r.Applied != nil {
			out += fmt.Sprintf(" applied r%d (not a member)", r.Applied.Revision)
		}
		if w.RVA&(1<<i) != 0 {
			out += " RVA"
		}
		if w.ForceLeave&(1<<i) != 0 {
			out += " force-leave"
		}
	}
	return out
}

func shortType(t v1alpha1.MemberType) string {
	// The engine's notation; an empty type is a replica not yet in the datamesh (✦), and
	// an unknown one is printed as it is, so a trace never hides a bad value.
	if t == "" {
		return datamesh.StateNew.String()
	}
	if st := datamesh.StateOfMember(t); st != datamesh.StateGone {
		return st.String()
	}
	return string(t)
}
