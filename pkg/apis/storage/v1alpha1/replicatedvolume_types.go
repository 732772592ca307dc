package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ConfigurationMode says where a volume's protection settings come from.
// +kubebuilder:validation:Enum=Auto;Manual
type ConfigurationMode string

const (
	// ConfigurationModeAuto resolves the configuration from the storage class.
	ConfigurationModeAuto ConfigurationMode = "Auto"
	// ConfigurationModeManual takes the configuration from spec.manualConfiguration.
	ConfigurationModeManual ConfigurationMode = "Manual"
)

// ReplicatedVolumeConfiguration is a volume's resolved protection and placement: the five
// parameters of docs/datamesh-spec.md, "Configuration parameters". The legacy replication
// setting never appears here; it is mapped to FTT/GMDR when the configuration is resolved.
// +kubebuilder:validation:XValidation:rule="self.failuresToTolerate <= self.guaranteedMinimumDataRedundancy + 1",message="failuresToTolerate must be at most guaranteedMinimumDataRedundancy + 1: the allowed layouts are 1D, 2D, 3D, 2D+1TB, 4D, 4D+1TB and 5D"
// +kubebuilder:validation:XValidation:rule="self.topology != 'Ignored' || !has(self.zones) || size(self.zones) == 0",message="zones must be empty when topology is Ignored"
// +kubebuilder:validation:XValidation:rule="self.topology != 'TransZonal' || !has(self.zones) || size(self.zones) == 0 || self.failuresToTolerate == 0 || size(self.zones) >= ((self.failuresToTolerate == 1 && self.guaranteedMinimumDataRedundancy == 2) ? 4 : 3)",message="TransZonal must be able to lose any one zone: failuresToTolerate 1 or 2 needs at least 3 zones, and 1 with guaranteedMinimumDataRedundancy 2 (4D) needs 4 (over 3 zones, one zone holds 2 of the 4 Diskful replicas and losing it leaves 2 copies, not 3)"
type ReplicatedVolumeConfiguration struct {
	// storagePool is the ReplicatedStoragePool the backing volumes come from.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	StoragePool string `json:"storagePool"`
	// failuresToTolerate is how many nodes may fail while the volume stays writable.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2
	FailuresToTolerate int32 `json:"failuresToTolerate"`
	// guaranteedMinimumDataRedundancy is how many copies beyond one every acknowledged
	// write is guaranteed to have.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2
	GuaranteedMinimumDataRedundancy int32 `json:"guaranteedMinimumDataRedundancy"`
	// topology says how replicas spread over zones.
	// +kubebuilder:default=Ignored
	// +optional
	Topology Topology `json:"topology,omitempty"`
	// zones restricts placement to these zones.
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Zones []string `json:"zones,omitempty"`
	// volumeAccess says where the volume may be attached.
	// +kubebuilder:default=PreferablyLocal
	// +optional
	VolumeAccess VolumeAccess `json:"volumeAccess,omitempty"`
}

// ReplicatedVolumeSpec is the user's intent for one volume.
// +kubebuilder:validation:XValidation:rule="self.configurationMode != 'Manual' || has(self.manualConfiguration)",message="manualConfiguration is required when configurationMode is Manual"
// +kubebuilder:validation:XValidation:rule="self.configurationMode != 'Auto' || (has(self.replicatedStorageClassName) && size(self.replicatedStorageClassName) > 0)",message="replicatedStorageClassName is required when configurationMode is Auto"
// +kubebuilder:validation:XValidation:rule="self.configurationMode != 'Auto' || !has(self.manualConfiguration)",message="manualConfiguration must be empty when configurationMode is Auto"
// +kubebuilder:validation:XValidation:rule="has(self.dataSource) == has(oldSelf.dataSource) && (!has(self.dataSource) || self.dataSource == oldSelf.dataSource)",message="dataSource is set at creation and immutable"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.size) || !isQuantity(string(self.size)) || !isQuantity(string(oldSelf.size)) || quantity(string(self.size)).compareTo(quantity(string(oldSelf.size))) >= 0",message="size may not shrink: a volume can only grow"
type ReplicatedVolumeSpec struct {
	// size is the usable size of the volume. It may grow, never shrink.
	// +kubebuilder:validation:XValidation:rule="!isQuantity(string(self)) || quantity(string(self)).isGreaterThan(quantity('0'))",message="size must be greater than zero"
	Size resource.Quantity `json:"size"`
	// configurationMode says where the protection settings come from.
	// +kubebuilder:default=Auto
	// +optional
	ConfigurationMode ConfigurationMode `json:"configurationMode,omitempty"`
	// replicatedStorageClassName is the storage class of an Auto volume.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	ReplicatedStorageClassName string `json:"replicatedStorageClassName,omitempty"`
	// manualConfiguration is the configuration of a Manual volume.
	// +optional
	ManualConfiguration *ReplicatedVolumeConfiguration `json:"manualConfiguration,omitempty"`
	// maxAttachments is how many nodes may attach the volume at once. 2 allows a short
	// dual-primary window for live migration of a virtual machine.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2
	// +kubebuilder:default=1
	// +optional
	MaxAttachments int32 `json:"maxAttachments,omitempty"`
	// drbdOptions overrides the storage class's DRBD options for this volume.
	// +optional
	DRBDOptions *DRBDOptions `json:"drbdOptions,omitempty"`
	// placementHints carry the CSI CreateVolume accessibility requirements: where the
	// volume must be, and would best be, reachable from. Placement reads them when it
	// first places the volume's replicas.
	// +optional
	PlacementHints *PlacementHints `json:"placementHints,omitempty"`
	// quorumOverride pins the datamesh's quorum and/or quorum-minimum-redundancy to
	// these values until it is removed, whatever the layout asks for: an emergency
	// lever for a person, for example to let a volume that lost a majority of its voters
	// serve IO again from the survivors, accepting that a lost node alive behind a
	// partition could then write too. The engine publishes it as a ChangeQuorum once
	// nothing but emergencies runs, keeps it through every later membership step, and
	// returns to the layout's values (another ChangeQuorum) when the field is removed.
	// docs/datamesh.md "Emergency quorum override".
	// +optional
	QuorumOverride *QuorumOverride `json:"quorumOverride,omitempty"`
	// dataSource makes a new volume start with a snapshot's data (a restore, or a
	// clone, which restores a snapshot taken for it): its Diskful replica on
	// dataSource.nodeName is created from that node's copy and every other replica
	// syncs from it (docs/snapshots.md, "Restore and clone"). Set at creation only.
	// +optional
	DataSource *VolumeDataSource `json:"dataSource,omitempty"`
}

// VolumeDataSource is the data a volume starts with.
type VolumeDataSource struct {
	// replicatedVolumeSnapshotName is the snapshot whose data the volume starts with.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	ReplicatedVolumeSnapshotName string `json:"replicatedVolumeSnapshotName"`
	// nodeName is the node whose copy of the snapshot seeds the volume's first
	// Diskful replica.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName"`
}

// QuorumOverride is a person's explicit, sticky choice of q and/or qmr.
// +kubebuilder:validation:XValidation:rule="has(self.quorum) || has(self.quorumMinimumRedundancy)",message="quorumOverride must set quorum, quorumMinimumRedundancy or both"
type QuorumOverride struct {
	// quorum is DRBD's quorum for the voters (D and D∅): how many must see each other
	// to serve IO.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=32
	// +optional
	Quorum *int32 `json:"quorum,omitempty"`
	// quorumMinimumRedundancy is DRBD's quorum-minimum-redundancy: how many UpToDate
	// disks a diskful node must see to serve IO.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=32
	// +optional
	QuorumMinimumRedundancy *int32 `json:"quorumMinimumRedundancy,omitempty"`
	// reason says who set the override and why; the engine repeats it in its events.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason"`
}

// TopologySegment is one CSI topology segment: a node, a zone, or both. An empty field
// matches anything.
type TopologySegment struct {
	// nodeName is the value of the topology.meshvol.io/node key.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	NodeName string `json:"nodeName,omitempty"`
	// zone is the value of the topology.kubernetes.io/zone key.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Zone string `json:"zone,omitempty"`
}

// PlacementHints are a volume's accessibility requirements (CSI TopologyRequirement).
// With volumeAccess Local, at least one diskful replica goes to a requisite segment;
// with the other modes any node with an agent can attach, and the hints only steer
// diskful replicas toward the preferred segments.
type PlacementHints struct {
	// requisite: the volume must be accessible from at least one of these segments.
	// Empty means anywhere.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Requisite []TopologySegment `json:"requisite,omitempty"`
	// preferred: segments in order of preference; the first is usually the node the
	// scheduler picked for the first consumer (WaitForFirstConsumer), where a diskful
	// replica should go.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Preferred []TopologySegment `json:"preferred,omitempty"`
}

// VolumePhase summarises a volume's state for people; conditions are the truth.
// +kubebuilder:validation:Enum=Pending;Forming;Ready;Degraded;Reconfiguring;Failed;Deleting
type VolumePhase string

const (
	VolumePhasePending       VolumePhase = "Pending"       // waiting for configuration or replicas
	VolumePhaseForming       VolumePhase = "Forming"       // the first datamesh is being built
	VolumePhaseReady         VolumePhase = "Ready"         // the configured layout is in place and in sync
	VolumePhaseDegraded      VolumePhase = "Degraded"      // usable, with less protection than configured
	VolumePhaseReconfiguring VolumePhase = "Reconfiguring" // transitions are moving toward the configuration
	VolumePhaseFailed        VolumePhase = "Failed"        // no quorum anywhere, or no UpToDate copy reachable
	VolumePhaseDeleting      VolumePhase = "Deleting"      // being deleted: replicas leave, then the Secret goes
)

// DatameshMember is one replica in the datamesh, as the controller publishes it.
type DatameshMember struct {
	// name is the ReplicatedVolumeReplica's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// type is the member's datamesh type, including the liminal ones.
	Type MemberType `json:"type"`
	// nodeName is the node the member runs on.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	NodeName string `json:"nodeName"`
	// zone is the node's topology zone, empty when the cluster has none.
	// +optional
	Zone string `json:"zone,omitempty"`
	// addresses are the IP addresses DRBD uses for this member's connections.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=4
	// +optional
	Addresses []string `json:"addresses,omitempty"`
	// nodeID is the member's DRBD node-id, unique in the volume and fixed while it is a
	// member.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=31
	NodeID int32 `json:"nodeID"`
	// port is the TCP port the member listens on for this volume, on its node: unique
	// among the DRBD resources of that node, which is all DRBD needs (every host of a
	// resource has its own address and port). 0: the member listens on datamesh.port
	// (members published before members had ports, or given that same port).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`
	// attached says the member's node is allowed to use the volume (DRBD Primary).
	// +optional
	Attached bool `json:"attached,omitempty"`
}

// SharedSecretReference says where a volume's DRBD shared secret comes from
// (docs/contract.md, "The shared secret"): the volume's own Secret (volumes formed
// before the cluster key), or derived from the cluster key in the Secret named, for
// this volume. The secret and the key never appear in a status.
// +kubebuilder:validation:XValidation:rule="has(self.derivation) == has(self.keyFingerprint)",message="derivation and keyFingerprint go together: a derived secret names the key it is derived from, a Secret of the volume's own has neither"
type SharedSecretReference struct {
	// secretName is the Secret's name, in the controller's namespace: the volume's own
	// (drbd-<rv>), or the cluster key's when derivation is set.
	SecretName string `json:"secretName"`
	// key is the key inside the Secret's data: of the secret, or of the cluster key.
	// +kubebuilder:default=secret
	// +kubebuilder:validation:MinLength=1
	// +optional
	Key string `json:"key,omitempty"`
	// algorithm is DRBD's cram-hmac-alg.
	// +kubebuilder:validation:Enum=sha256;sha1;md5
	Algorithm string `json:"algorithm"`
	// derivation, when set, says the Secret holds the cluster key and the volume's
	// secret is derived from it: HMAC-SHA256 under the key of a fixed context and the
	// volume's UID, base64url-encoded. Unset: the Secret holds the volume's secret.
	// +kubebuilder:validation:Enum=HMAC-SHA256
	// +optional
	Derivation SharedSecretDerivation `json:"derivation,omitempty"`
	// keyFingerprint is the fingerprint of the key the secret is derived from (16 hex
	// digits, derived from the key; never the key). An agent refuses to derive the
	// secret from a key of any other fingerprint: a key Secret replaced would otherwise
	// change the secret of every volume under its running replicas.
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{16}$`
	// +optional
	KeyFingerprint string `json:"keyFingerprint,omitempty"`
}

// SharedSecretDerivation names how a volume's shared secret is derived from the
// cluster key.
type SharedSecretDerivation string

// DerivationHMACSHA256: HMAC-SHA256(key, context || UID), base64url (pkg/sharedsecret).
const DerivationHMACSHA256 SharedSecretDerivation = "HMAC-SHA256"

// Datamesh is the replica set and DRBD settings that every replica converges to. The
// controller publishes it; each change bumps status.datameshRevision.
type Datamesh struct {
	// members are the replicas in the datamesh, in no particular order.
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Members []DatameshMember `json:"members,omitempty"`
	// quorum is DRBD's quorum (q) for voters; star and shadow members use 32.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=32
	// +optional
	Quorum int32 `json:"quorum,omitempty"`
	// quorumMinimumRedundancy is DRBD's quorum-minimum-redundancy (qmr).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=32
	// +optional
	QuorumMinimumRedundancy int32 `json:"quorumMinimumRedundancy,omitempty"`
	// multiattach lets two members be Primary at once (allow-two-primaries).
	// +optional
	Multiattach bool `json:"multiattach,omitempty"`
	// port is the TCP port of the members whose own port is 0. Volumes formed before
	// members had ports of their own have it (a port unique across the cluster); newer
	// ones leave it 0 and give each member its own.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`
	// minor is the DRBD device minor (/dev/drbd<minor>) on every member's node.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1048575
	// +optional
	Minor int32 `json:"minor,omitempty"`
	// size is the DRBD device size the members provide.
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`
	// sharedSecret references the DRBD shared secret and its algorithm.
	// +optional
	SharedSecret *SharedSecretReference `json:"sharedSecret,omitempty"`
}

// TransitionType names a datamesh transition (docs/datamesh-spec.md, "Transitions").
// +kubebuilder:validation:Enum=Formation;AddReplica;RemoveReplica;ForceRemoveReplica;ChangeReplicaType;ChangeQuorum;Attach;Detach;ForceDetach;EnableMultiattach;DisableMultiattach
type TransitionType string

const (
	TransitionFormation          TransitionType = "Formation"
	TransitionAddReplica         TransitionType = "AddReplica"
	TransitionRemoveReplica      TransitionType = "RemoveReplica"
	TransitionForceRemoveReplica TransitionType = "ForceRemoveReplica"
	TransitionChangeReplicaType  TransitionType = "ChangeReplicaType"
	TransitionChangeQuorum       TransitionType = "ChangeQuorum"
	TransitionAttach             TransitionType = "Attach"
	TransitionDetach             TransitionType = "Detach"
	TransitionForceDetach        TransitionType = "ForceDetach"
	TransitionEnableMultiattach  TransitionType = "EnableMultiattach"
	TransitionDisableMultiattach TransitionType = "DisableMultiattach"
)

// TransitionGroup is what a transition affects; the parallelism rules are stated per group.
// +kubebuilder:validation:Enum=Formation;VotingMembership;NonVotingMembership;Quorum;Attachment;Multiattach;Emergency
type TransitionGroup string

const (
	GroupFormation           TransitionGroup = "Formation"
	GroupVotingMembership    TransitionGroup = "VotingMembership"
	GroupNonVotingMembership TransitionGroup = "NonVotingMembership"
	GroupQuorum              TransitionGroup = "Quorum"
	GroupAttachment          TransitionGroup = "Attachment"
	GroupMultiattach         TransitionGroup = "Multiattach"
	GroupEmergency           TransitionGroup = "Emergency"
)

// StepStatus is where a transition step stands.
// +kubebuilder:validation:Enum=Pending;Active;Completed
type StepStatus string

const (
	StepPending   StepStatus = "Pending"
	StepActive    StepStatus = "Active"
	StepCompleted StepStatus = "Completed"
)

// DatameshTransitionStep is one published change of a transition and its confirmation.
type DatameshTransitionStep struct {
	// name is the step in the notation of docs/datamesh-spec.md, e.g. "A → D∅ + q↑".
	Name string `json:"name"`
	// status is where the step stands.
	Status StepStatus `json:"status"`
	// datameshRevision is the revision that published this step; replicas confirm the
	// step by reporting a revision at least this high.
	// +optional
	DatameshRevision int64 `json:"datameshRevision,omitempty"`
	// startedAt is when the step was published.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// completedAt is when every required replica had confirmed the step.
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`
	// message is the step's progress, e.g. "2/3 replicas confirmed revision 7. Waiting: [#2]".
	// +optional
	Message string `json:"message,omitempty"`
}

// DatameshTransition is a change to the datamesh in flight. It is persisted with its plan
// and the plan's version, so a restarted or upgraded controller resumes it exactly.
type DatameshTransition struct {
	// type is the transition.
	Type TransitionType `json:"type"`
	// group is what the transition affects.
	Group TransitionGroup `json:"group"`
	// replicaName is the replica the transition is about; empty for volume-wide ones.
	// +optional
	ReplicaName string `json:"replicaName,omitempty"`
	// replicaNodeID is the DRBD node-id of that replica while the transition runs. It
	// outlives the member during a removal, so the node-id is not handed to a new member
	// before every peer has dropped its connection to the old one.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=31
	// +optional
	ReplicaNodeID *int32 `json:"replicaNodeID,omitempty"`
	// fromType is the member type the transition starts from.
	// +optional
	FromType MemberType `json:"fromType,omitempty"`
	// toType is the member type the transition ends in.
	// +optional
	ToType MemberType `json:"toType,omitempty"`
	// planID names the plan the transition runs, e.g. "diskful-q-up".
	PlanID string `json:"planID"`
	// planVersion is the version of that plan; a plan whose steps change gets a new one.
	// +kubebuilder:validation:Minimum=1
	PlanVersion int32 `json:"planVersion"`
	// steps are the plan's steps with their progress.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Steps []DatameshTransitionStep `json:"steps"`
}

// ReplicaOperation is what a replica asks of the datamesh.
// +kubebuilder:validation:Enum=Join;Leave;ChangeType;ForceLeave
type ReplicaOperation string

const (
	ReplicaOperationJoin       ReplicaOperation = "Join"
	ReplicaOperationLeave      ReplicaOperation = "Leave"
	ReplicaOperationChangeType ReplicaOperation = "ChangeType"
	ReplicaOperationForceLeave ReplicaOperation = "ForceLeave"
)

// DatameshReplicaRequest is a pending membership change for one replica, with the reason
// it is not running yet or how it ended.
type DatameshReplicaRequest struct {
	// name is the ReplicatedVolumeReplica's name.
	Name string `json:"name"`
	// operation is what the replica asks for.
	Operation ReplicaOperation `json:"operation"`
	// type is the replica type the request wants (for Join and ChangeType).
	// +optional
	Type ReplicaType `json:"type,omitempty"`
	// message says why the request waits, how far it is, or how it ended.
	// +optional
	Message string `json:"message,omitempty"`
}

// ReplicatedVolumeStatus is what the controller publishes for a volume.
// The controller alone writes it, and always whole: it is atomic, one field to
// server-side apply, so the object's managedFields stay small (docs/contract.md).
// +structType=atomic
type ReplicatedVolumeStatus struct {
	// observedGeneration is the spec generation this status reflects.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// phase summarises the state for people; conditions are the truth.
	// +optional
	Phase VolumePhase `json:"phase,omitempty"`
	// conditions: Configured, Formed, Ready, ... with reasons a person can act on.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// configuration is the resolved configuration (never the legacy replication field).
	// +optional
	Configuration *ReplicatedVolumeConfiguration `json:"configuration,omitempty"`
	// effectiveLayout is the protection the datamesh provides right now; q and qmr derive
	// from it. It ratchets toward the configuration as transitions complete.
	// +optional
	EffectiveLayout *Layout `json:"effectiveLayout,omitempty"`
	// datamesh is the replica set every replica converges to.
	// +optional
	Datamesh Datamesh `json:"datamesh,omitempty"`
	// datameshRevision increases with every published change of the datamesh.
	// +kubebuilder:validation:Minimum=0
	// +optional
	DatameshRevision int64 `json:"datameshRevision,omitempty"`
	// datameshTransitions are the changes in flight.
	// +listType=atomic
	// +optional
	DatameshTransitions []DatameshTransition `json:"datameshTransitions,omitempty"`
	// datameshReplicaRequests are the membership changes replicas ask for.
	// +listType=map
	// +listMapKey=name
	// +optional
	DatameshReplicaRequests []DatameshReplicaRequest `json:"datameshReplicaRequests,omitempty"`
	// layout is the members by type for kubectl, e.g. "3D" or "2D+1TB".
	// +optional
	Layout string `json:"layout,omitempty"`
	// readyMembers is "<in sync>/<members>" for kubectl.
	// +optional
	ReadyMembers string `json:"readyMembers,omitempty"`
	// syncProgress is the least-synced diskful replica's progress, e.g. "87%".
	// +optional
	SyncProgress string `json:"syncProgress,omitempty"`
}

// ReplicatedVolume is one replicated block volume.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=rv,categories=meshvol
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.spec.size`
// +kubebuilder:printcolumn:name="Layout",type=string,JSONPath=`.status.layout`
// +kubebuilder:printcolumn:name="Members",type=string,JSONPath=`.status.readyMembers`,description="in-sync members / members"
// +kubebuilder:printcolumn:name="Sync",type=string,JSONPath=`.status.syncProgress`
// +kubebuilder:printcolumn:name="Class",type=string,JSONPath=`.spec.replicatedStorageClassName`,priority=1
// +kubebuilder:printcolumn:name="Revision",type=integer,JSONPath=`.status.datameshRevision`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be a DNS label of at most 63 characters (it becomes the DRBD resource name)"
type ReplicatedVolume struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ReplicatedVolumeSpec   `json:"spec"`
	Status ReplicatedVolumeStatus `json:"status,omitempty"`
}

// ReplicatedVolumeList is a list of ReplicatedVolume.
// +kubebuilder:object:root=true
type ReplicatedVolumeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ReplicatedVolume `json:"items"`
}
