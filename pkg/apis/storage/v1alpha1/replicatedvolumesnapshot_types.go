package v1alpha1

import (
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReplicatedVolumeSnapshotSpec names the volume to snapshot. The CSI controller
// service writes it (CreateSnapshot); docs/snapshots.md says what a snapshot holds.
type ReplicatedVolumeSnapshotSpec struct {
	// replicatedVolumeName is the volume the snapshot is taken of. It stays set after
	// the volume is deleted: the snapshot outlives it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="replicatedVolumeName is immutable"
	ReplicatedVolumeName string `json:"replicatedVolumeName"`
}

// SnapshotPhase is where a snapshot stands (docs/snapshots.md, "How a snapshot is taken").
// +kubebuilder:validation:Enum=Pending;Suspending;Snapshotting;Ready;Aborting;Failed
type SnapshotPhase string

const (
	// SnapshotPending: waiting for the volume to have an UpToDate Diskful replica.
	SnapshotPending SnapshotPhase = "Pending"
	// SnapshotSuspending: every participant suspends IO on the volume.
	SnapshotSuspending SnapshotPhase = "Suspending"
	// SnapshotSnapshotting: IO is suspended everywhere; each UpToDate Diskful
	// participant snapshots its backing volume.
	SnapshotSnapshotting SnapshotPhase = "Snapshotting"
	// SnapshotReady: every copy is taken; participants resume IO. Final.
	SnapshotReady SnapshotPhase = "Ready"
	// SnapshotAborting: an attempt ran past its deadline or failed; participants
	// resume IO and delete that attempt's copies, then the next attempt starts.
	SnapshotAborting SnapshotPhase = "Aborting"
	// SnapshotFailed: the snapshot cannot be taken (the volume's pool cannot
	// snapshot, or the volume is gone before any copy was taken). Final.
	SnapshotFailed SnapshotPhase = "Failed"
)

// SnapshotParticipant is a member of the volume's datamesh when an attempt began.
type SnapshotParticipant struct {
	// nodeName is the member's node.
	NodeName string `json:"nodeName"`
	// replicaName is the member's ReplicatedVolumeReplica.
	ReplicaName string `json:"replicaName"`
	// diskful: an UpToDate Diskful member, which takes a copy; the others only
	// suspend IO.
	// +optional
	Diskful bool `json:"diskful,omitempty"`
}

// SnapshotCopy is one node's copy of the volume's data at the snapshot's point.
type SnapshotCopy struct {
	// attempt is the attempt that took the copy.
	Attempt int32 `json:"attempt"`
	// pool is the ReplicatedStoragePool the copy lives in.
	Pool string `json:"pool"`
	// name is the copy's backing name in the pool (LV or file name).
	Name string `json:"name"`
	// sizeBytes is the copy's size: the replica's backing volume, DRBD metadata included.
	SizeBytes int64 `json:"sizeBytes"`
}

// SnapshotNodeStatus is one node's part in a snapshot. Only that node's agent writes
// it (field manager meshvol-agent-<node>).
type SnapshotNodeStatus struct {
	// nodeName is the node.
	NodeName string `json:"nodeName"`
	// attempt is the attempt suspended says something about.
	// +optional
	Attempt int32 `json:"attempt,omitempty"`
	// suspended: the agent suspended IO on the volume for this attempt and has not
	// resumed it yet.
	// +optional
	Suspended bool `json:"suspended,omitempty"`
	// copy is this node's copy, once taken.
	// +optional
	Copy *SnapshotCopy `json:"copy,omitempty"`
	// message says what failed last, empty when nothing did.
	// +optional
	Message string `json:"message,omitempty"`
}

// ReplicatedVolumeSnapshotStatus is written by the controller, except nodes, where each
// node's agent writes its own entry.
type ReplicatedVolumeSnapshotStatus struct {
	// phase is where the snapshot stands.
	// +optional
	Phase SnapshotPhase `json:"phase,omitempty"`
	// attempt counts the attempts; an aborted one is followed by the next.
	// +optional
	Attempt int32 `json:"attempt,omitempty"`
	// participants are the datamesh members of the current attempt.
	// +listType=map
	// +listMapKey=nodeName
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Participants []SnapshotParticipant `json:"participants,omitempty"`
	// suspendDeadline bounds the current attempt's IO suspension: past it every agent
	// resumes IO on its own and the controller aborts the attempt.
	// +optional
	SuspendDeadline *metav1.Time `json:"suspendDeadline,omitempty"`
	// creationTime is when IO was suspended everywhere: the snapshot's point in time.
	// +optional
	CreationTime *metav1.Time `json:"creationTime,omitempty"`
	// size is the volume's size at the snapshot: a restore is at least this large.
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`
	// storagePool is the volume's pool, which holds the copies.
	// +optional
	StoragePool string `json:"storagePool,omitempty"`
	// readyToUse: every copy of the attempt is taken; the snapshot can be restored.
	// +optional
	ReadyToUse bool `json:"readyToUse,omitempty"`
	// copies are the nodes holding a copy of the ready snapshot.
	// +listType=set
	// +optional
	Copies []string `json:"copies,omitempty"`
	// message says why the snapshot waits or failed.
	// +optional
	Message string `json:"message,omitempty"`
	// nodes are the agents' reports, one per node.
	// +listType=map
	// +listMapKey=nodeName
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Nodes []SnapshotNodeStatus `json:"nodes,omitempty"`
}

// ReplicatedVolumeSnapshot is a crash-consistent point-in-time copy of a volume, held on
// every UpToDate Diskful replica's node (docs/snapshots.md).
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=rvs,categories=meshvol
// +kubebuilder:printcolumn:name="Volume",type=string,JSONPath=`.spec.replicatedVolumeName`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=boolean,JSONPath=`.status.readyToUse`
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.status.size`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be a DNS label of at most 63 characters (it names the backing copies)"
type ReplicatedVolumeSnapshot struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ReplicatedVolumeSnapshotSpec   `json:"spec"`
	Status ReplicatedVolumeSnapshotStatus `json:"status,omitempty"`
}

// ReplicatedVolumeSnapshotList is a list of ReplicatedVolumeSnapshot.
// +kubebuilder:object:root=true
type ReplicatedVolumeSnapshotList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ReplicatedVolumeSnapshot `json:"items"`
}

// SnapshotCopyName is the backing name of a snapshot's copy taken by attempt: one
// name per attempt, so a copy left by an aborted attempt is never taken for the
// next one's.
func SnapshotCopyName(snapshot string, attempt int32) string {
	return snapshot + ".a" + strconv.Itoa(int(attempt))
}

// FieldManagerAgentOf is the field manager of a node's agent on snapshot status: each
// node owns its own entry of status.nodes.
func FieldManagerAgentOf(node string) string { return FieldManagerAgent + "-" + node }
