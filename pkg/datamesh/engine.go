package datamesh

import (
	"time"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Features are the capabilities of the DRBD the cluster runs. They change which plans the
// planner may derive.
type Features struct {
	// ShadowDiskful: DRBD has the `non-voting` disk option (docs/datamesh-spec.md
	// calls it "flant-drbd"). With it a diskful replica can sync as a non-voter (sD) before it
	// becomes a voter, and a Diskful replica can step down to sD instead of A. Upstream
	// DRBD 9.2 has no such option (docs/drbd-quorum.md).
	ShadowDiskful bool
}

// Pool is the engine's view of the volume's ReplicatedStoragePool.
type Pool struct {
	// Name is the pool's name; it must equal the configuration's storagePool.
	Name string
	// Available is the pool's Ready condition: false blocks every join.
	Available bool
	// Nodes are the pool's eligible nodes with their zones and readiness.
	Nodes []v1.EligibleNode
}

// FindNode returns the eligible node called name, or nil.
func (p *Pool) FindNode(name string) *v1.EligibleNode {
	if p == nil {
		return nil
	}
	for i := range p.Nodes {
		if p.Nodes[i].NodeName == name {
			return &p.Nodes[i]
		}
	}
	return nil
}

// QuorumChange asks for a standalone ChangeQuorum (docs/datamesh-spec.md "ChangeQuorum"): an explicit
// or emergency adjustment of q and/or qmr from outside the engine. Zero fields keep the
// current value.
type QuorumChange struct {
	Quorum                  int32
	QuorumMinimumRedundancy int32
}

// Input is everything one reconcile of one volume knows. The engine reads it and mutates
// only RV.Status (in place: the caller deep-copies first if it needs the original).
type Input struct {
	// RV is the volume. Required.
	RV *v1.ReplicatedVolume
	// RSC is the storage class of an Auto volume (nil for Manual, or when not found).
	RSC *v1.ReplicatedStorageClass
	// RVRs are the volume's replicas, including those being deleted. Order does not
	// change the result; member order is the fast path.
	RVRs []*v1.ReplicatedVolumeReplica
	// RVAs are the volume's attachment requests, including those being deleted.
	RVAs []*v1.ReplicatedVolumeAttachment
	// Pool is the volume's storage pool (nil: not found, blocks joins).
	Pool *Pool
	// Now stamps startedAt/completedAt of steps; the engine reads no clock.
	Now time.Time
	// ForceLeave names replicas whose node is permanently lost (decided by node
	// lifecycle or a person). The engine records a ForceLeave replica request for
	// each; the request stays in status until the ForceRemoveReplica completes, so
	// the caller need not repeat it.
	ForceLeave []string
	// ForceDetach names members whose attachment must be cleared without waiting
	// for them (their node is lost). A ForceLeave of an attached member implies it.
	ForceDetach []string
	// ChangeQuorum, when set, asks for a standalone ChangeQuorum transition.
	ChangeQuorum *QuorumChange
	// ExtraFTT raises the layout above status.configuration's for as long as it is
	// set, so that it tolerates ExtraFTT more Diskful nodes away as DRBD counts them
	// once its lost-peer agreement has run (a node maintenance copies a volume
	// elsewhere before its node goes: docs/operating.md, "Copying a volume elsewhere
	// before its node goes"). Each step is layout.Layout.RaisedForMaintenance: one
	// more failure to tolerate, one more guaranteed copy, or both (1D → 3D, 2D and
	// 2D+1TB → 3D, 3D → 4D or 4D+1TB). The engine converges to the raised layout
	// through its ordinary adds, and back through its ordinary removals once it is
	// cleared. A raise with no layout above (5D) and a raise during formation are
	// ignored.
	ExtraFTT int
}

// WantAction is what the engine wants placement to do with replica objects.
type WantAction string

const (
	// WantCreate: create a replica of Type (on NodeName when set, else placement picks).
	WantCreate WantAction = "Create"
	// WantDelete: delete replica Replica (the engine then runs RemoveReplica).
	WantDelete WantAction = "Delete"
	// WantRetype: set replica Replica's spec.type to Type (the attached-member strategy:
	// an attached member is converted, not removed).
	WantRetype WantAction = "Retype"
)

// WantedReplica is one change of replica objects the configuration asks for. The list in
// Result is ordered add-before-remove: removals appear only once every add the layout
// needs has become a member of its final type, so redundancy never dips.
type WantedReplica struct {
	Action   WantAction
	Type     v1.ReplicaType
	Replica  string // Delete/Retype: the replica
	NodeName string // Create of an Access replica: the node that needs it
	// Replaces (Create of a Diskful replica): the member whose failed disk the new
	// replica replaces (docs/datamesh.md, "A disk that fails after formation"). It
	// leaves once the new one has joined, so placement counts it as going — its zone
	// is the one to fill — although its node still holds it.
	Replaces string
	Reason   string
}

// AttachmentStatus is the engine's verdict on one RVA, for the caller to write to the
// RVA's status (phase and the Attached condition's message).
type AttachmentStatus struct {
	Name     string
	NodeName string
	Phase    v1.AttachmentPhase
	Attached bool
	Message  string
}

// EventType mirrors corev1's Normal/Warning without importing it.
type EventType string

const (
	EventNormal  EventType = "Normal"
	EventWarning EventType = "Warning"
)

// Event is something a person wants to see in `kubectl describe` (formation done, a
// transition completed, a force removal), not every reconcile.
type Event struct {
	Type    EventType
	Reason  string
	Message string
}

// Result is what Process returns besides the mutated status. Its slices are the
// caller's: nothing of them is kept or reused by the Engine.
type Result struct {
	// Changed: RV.Status was modified and must be written.
	Changed bool
	// Revision is status.datameshRevision after the call.
	Revision int64
	// Waiting: some transition or request waits on replicas or guards. Every such
	// wait is on an object change (an RVR's revision or disk state, an RVA), which
	// the caller's watches deliver: the engine never asks for a timed reconcile.
	Waiting bool
	// Wanted are the replica objects placement should create, delete or retype.
	Wanted []WantedReplica
	// Attachments has one entry per RVA, in input order.
	Attachments []AttachmentStatus
	// Events worth showing a person.
	Events []Event
}

// Engine runs the datamesh transitions of one volume per Process call. It holds only
// its plan registry and features, both read-only, and keeps nothing between calls: it
// is safe for concurrent use.
type Engine struct {
	reg      *Registry
	features Features
}

// NewEngine returns an engine that runs the plans of reg. A nil reg means DefaultRegistry().
func NewEngine(reg *Registry, f Features) *Engine {
	if reg == nil {
		reg = DefaultRegistry()
	}
	return &Engine{reg: reg, features: f}
}

// Features returns the engine's features.
func (e *Engine) Features() Features { return e.features }

// Registry returns the engine's plan registry.
func (e *Engine) Registry() *Registry { return e.reg }
