package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReplicaStorage says where a diskful replica's backing volume lives on its node.
type ReplicaStorage struct {
	// pool is the ReplicatedStoragePool.
	// +kubebuilder:validation:MinLength=1
	Pool string `json:"pool"`
	// volumeGroup is the LVM volume group (LVM and LVMThin pools).
	// +optional
	VolumeGroup string `json:"volumeGroup,omitempty"`
	// thinPool is the LVM thin pool (LVMThin pools).
	// +optional
	ThinPool string `json:"thinPool,omitempty"`
	// directory holds the backing file (File pools).
	// +optional
	Directory string `json:"directory,omitempty"`
}

// ReplicatedVolumeReplicaSpec is the placement of one replica, written by the controller.
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.nodeName) || size(oldSelf.nodeName) == 0 || (has(self.nodeName) && self.nodeName == oldSelf.nodeName)",message="nodeName is immutable once set"
// +kubebuilder:validation:XValidation:rule="self.replicatedVolumeName == oldSelf.replicatedVolumeName",message="replicatedVolumeName is immutable"
// +kubebuilder:validation:XValidation:rule="!(self.type == 'Access' || self.type == 'TieBreaker') || !has(self.storage) || (oldSelf.hasValue() && has(oldSelf.value().storage) && oldSelf.value().storage == self.storage)",message="storage must be empty for diskless types Access and TieBreaker, except the storage a replica retyped from Diskful keeps",optionalOldSelf=true
type ReplicatedVolumeReplicaSpec struct {
	// replicatedVolumeName is the volume this replica belongs to.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	ReplicatedVolumeName string `json:"replicatedVolumeName"`
	// nodeName is the node the replica runs on; empty until placement picks one.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +optional
	NodeName string `json:"nodeName,omitempty"`
	// type is the type the replica should become in the datamesh.
	Type ReplicaType `json:"type"`
	// storage is where a diskful replica's backing volume lives. A replica retyped
	// from Diskful to Access or TieBreaker keeps it: its datamesh member stays
	// Diskful until the retype has detached the disk, and its agent frees the
	// backing volume once DRBD runs without it. A diskless replica never gains one.
	// +optional
	Storage *ReplicaStorage `json:"storage,omitempty"`
	// drbdOptions overrides the volume's DRBD options for this replica.
	// +optional
	DRBDOptions *DRBDOptions `json:"drbdOptions,omitempty"`
}

// DiskState is DRBD's disk state of a replica, as the kernel reports it.
// +kubebuilder:validation:Enum=Diskless;Attaching;Detaching;Failed;Negotiating;Inconsistent;Outdated;DUnknown;Consistent;UpToDate
type DiskState string

const (
	DiskStateDiskless     DiskState = "Diskless"
	DiskStateAttaching    DiskState = "Attaching"
	DiskStateDetaching    DiskState = "Detaching"
	DiskStateFailed       DiskState = "Failed"
	DiskStateNegotiating  DiskState = "Negotiating"
	DiskStateInconsistent DiskState = "Inconsistent"
	DiskStateOutdated     DiskState = "Outdated"
	DiskStateUnknown      DiskState = "DUnknown"
	DiskStateConsistent   DiskState = "Consistent"
	DiskStateUpToDate     DiskState = "UpToDate"
)

// ReplicaRole is DRBD's role of a replica.
// +kubebuilder:validation:Enum=Primary;Secondary;Unknown
type ReplicaRole string

const (
	RolePrimary   ReplicaRole = "Primary"
	RoleSecondary ReplicaRole = "Secondary"
	RoleUnknown   ReplicaRole = "Unknown"
)

// ResyncProgress is how far a resync toward or from a peer has come.
type ResyncProgress struct {
	// percentDone is the share of the device already in sync, 0 to 100.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	PercentDone int32 `json:"percentDone"`
	// outOfSyncBytes is what is still to be synchronised.
	// +kubebuilder:validation:Minimum=0
	OutOfSyncBytes int64 `json:"outOfSyncBytes"`
	// secondsRemaining is DRBD's estimate of the time left, when it gives one.
	// +optional
	SecondsRemaining *int64 `json:"secondsRemaining,omitempty"`
}

// PeerStatus is this replica's view of one DRBD peer.
type PeerStatus struct {
	// name is the peer replica's name.
	Name string `json:"name"`
	// nodeID is the peer's DRBD node-id.
	// +optional
	NodeID *int32 `json:"nodeID,omitempty"`
	// connectionState is DRBD's connection state, e.g. Connected, Connecting, StandAlone.
	ConnectionState string `json:"connectionState"`
	// replicationState is DRBD's replication state, e.g. Established, SyncSource.
	// +optional
	ReplicationState string `json:"replicationState,omitempty"`
	// peerDiskState is the peer's disk state as this replica knows it.
	// +optional
	PeerDiskState DiskState `json:"peerDiskState,omitempty"`
	// resync is the progress of a resync with this peer, while one runs.
	// +optional
	Resync *ResyncProgress `json:"resync,omitempty"`
}

// BackingVolumeStatus is the replica's backing volume as the agent found it.
type BackingVolumeStatus struct {
	// name is the volume's name in its pool (LV name or file name).
	Name string `json:"name"`
	// devicePath is the block device DRBD uses.
	DevicePath string `json:"devicePath"`
	// size is the real size, after rounding up to the pool's extent size.
	Size resource.Quantity `json:"size"`
}

// DRBDConfigured condition: whether the agent has applied the datamesh to DRBD.
const (
	ConditionDRBDConfigured = "DRBDConfigured"

	// ReasonAgentNotReady: the node's agent is not reporting; this status may be stale.
	// Nothing writes it any more and the engine does not read it: liveness is the
	// controller's AgentReady condition (wellknown.go), since an agent cannot report
	// its own silence in a condition it owns.
	ReasonAgentNotReady = "AgentNotReady"
	// ReasonPendingDatameshJoin: the replica is not a member yet; nothing to configure.
	ReasonPendingDatameshJoin = "PendingDatameshJoin"
	// ReasonApplyingConfiguration: the agent is applying a newer revision.
	ReasonApplyingConfiguration = "ApplyingConfiguration"
	// ReasonConfigurationFailed: applying the configuration failed; the message says why.
	ReasonConfigurationFailed = "ConfigurationFailed"
	// ReasonConfigured: DRBD runs the datamesh revision in status.datameshRevision.
	ReasonConfigured = "Configured"
)

// ReplicatedVolumeReplicaStatus is what the replica's node agent observes. That agent
// writes it (field manager meshvol-agent), but for the controller's AgentReady
// condition. peers and backingVolume, which the agent writes whole, are atomic: one
// field each to server-side apply (docs/contract.md).
type ReplicatedVolumeReplicaStatus struct {
	// observedGeneration is the spec generation this status reflects.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// datameshRevision is the datamesh revision DRBD really runs on this node, read back
	// from the kernel. 0 means the replica is not (or no longer) configured.
	// +kubebuilder:validation:Minimum=0
	// +optional
	DatameshRevision int64 `json:"datameshRevision,omitempty"`
	// addresses are the node's IP addresses for DRBD replication traffic.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=4
	// +optional
	Addresses []string `json:"addresses,omitempty"`
	// diskState is DRBD's local disk state.
	// +optional
	DiskState DiskState `json:"diskState,omitempty"`
	// role is DRBD's role.
	// +optional
	Role ReplicaRole `json:"role,omitempty"`
	// quorum is DRBD's quorum flag. It can be stale: DRBD recomputes it only on a state
	// change of its own.
	// +optional
	Quorum *bool `json:"quorum,omitempty"`
	// ioSuspended says DRBD holds IO (for example suspend-io without quorum).
	// +optional
	IOSuspended bool `json:"ioSuspended,omitempty"`
	// devicePath is the DRBD block device on the node.
	// +optional
	DevicePath string `json:"devicePath,omitempty"`
	// backingVolume is the replica's backing volume, for diskful replicas.
	// +structType=atomic
	// +optional
	BackingVolume *BackingVolumeStatus `json:"backingVolume,omitempty"`
	// peers are this replica's DRBD connections.
	// +listType=atomic
	// +optional
	Peers []PeerStatus `json:"peers,omitempty"`
	// conditions: DRBDConfigured, BackingVolumeReady, InSync, Ready.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ReplicatedVolumeReplica is one replica of a volume on one node.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=rvr,categories=meshvol
// +kubebuilder:printcolumn:name="Volume",type=string,JSONPath=`.spec.replicatedVolumeName`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.spec.type`
// +kubebuilder:printcolumn:name="Disk",type=string,JSONPath=`.status.diskState`
// +kubebuilder:printcolumn:name="Role",type=string,JSONPath=`.status.role`
// +kubebuilder:printcolumn:name="Revision",type=integer,JSONPath=`.status.datameshRevision`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ReplicatedVolumeReplica struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ReplicatedVolumeReplicaSpec   `json:"spec"`
	Status ReplicatedVolumeReplicaStatus `json:"status,omitempty"`
}

// ReplicatedVolumeReplicaList is a list of ReplicatedVolumeReplica.
// +kubebuilder:object:root=true
type ReplicatedVolumeReplicaList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ReplicatedVolumeReplica `json:"items"`
}
