package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// ReplicatedNodeMaintenanceSpec asks to take one node out of service for maintenance (a
// kernel or DRBD module upgrade, a reboot) and, with return, to bring it back
// (docs/operating.md, "Node maintenance").
// +kubebuilder:validation:XValidation:rule="self.nodeName == oldSelf.nodeName",message="spec.nodeName is immutable: create a new maintenance instead"
type ReplicatedNodeMaintenanceSpec struct {
	// nodeName is the node going away.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	NodeName string `json:"nodeName"`
	// return says the node is back (or the maintenance is called off): the controller
	// waits until every replica on it is in sync again, then completes.
	// +optional
	Return bool `json:"return,omitempty"`
	// maxDowntime bounds how long the node may be away: from ReadyForMaintenance
	// until Completed (back and in sync). Past it the maintenance is Failed and the
	// node is no longer away but lost, so its volumes' lost members may be removed
	// and replaced as for any lost node. Unset: no bound.
	// +optional
	MaxDowntime *metav1.Duration `json:"maxDowntime,omitempty"`
}

// MaintenancePhase is where a node maintenance stands.
// +kubebuilder:validation:Enum=Pending;Blocked;Draining;ReadyForMaintenance;Returning;Completed;Failed
type MaintenancePhase string

const (
	// MaintenancePending: not judged yet.
	MaintenancePending MaintenancePhase = "Pending"
	// MaintenanceBlocked: the pre-checks refuse: taking the node out now would leave the
	// volumes in status.blockingVolumes without quorum or their guaranteed redundancy,
	// or another node is in maintenance. Judged again on every change.
	MaintenanceBlocked MaintenancePhase = "Blocked"
	// MaintenanceDraining: the pre-checks pass; volumes are still attached on the node
	// (status.attachedVolumes): their pods must move.
	MaintenanceDraining MaintenancePhase = "Draining"
	// MaintenanceReadyForMaintenance: nothing is attached on the node and every volume
	// with a replica there keeps quorum and its guaranteed redundancy without it: the
	// node may be taken down. Its replicas stay members: no replacement starts.
	MaintenanceReadyForMaintenance MaintenancePhase = "ReadyForMaintenance"
	// MaintenanceReturning: spec.return is set; waiting for the node's agent and for
	// every replica on the node to be in sync again.
	MaintenanceReturning MaintenancePhase = "Returning"
	// MaintenanceCompleted: the node is back and in sync (or the maintenance was called
	// off before the node went away).
	MaintenanceCompleted MaintenancePhase = "Completed"
	// MaintenanceFailed: the node was away longer than spec.maxDowntime (it did not
	// return, or its replicas did not get back in sync); the message says what was
	// still missing. Final: the node is lost, no longer away.
	MaintenanceFailed MaintenancePhase = "Failed"
)

// ReplicatedNodeMaintenanceStatus is written by the controller.
type ReplicatedNodeMaintenanceStatus struct {
	// observedGeneration is the spec generation this status reflects.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// phase is where the maintenance stands.
	// +optional
	Phase MaintenancePhase `json:"phase,omitempty"`
	// message says what the phase waits for, or why the maintenance is blocked.
	// +optional
	Message string `json:"message,omitempty"`
	// blockingVolumes are the volumes that refuse to lose the node, while Blocked.
	// +listType=set
	// +optional
	BlockingVolumes []string `json:"blockingVolumes,omitempty"`
	// copiedVolumes are the volumes that would lose quorum or their guaranteed
	// redundancy with the node gone, and that are copied elsewhere first: until the
	// maintenance is Completed (or Failed) each tolerates one more failure than its
	// configuration (one more Diskful, and a TieBreaker where its layout needs one),
	// then goes back to its configured layout.
	// +listType=set
	// +optional
	CopiedVolumes []string `json:"copiedVolumes,omitempty"`
	// attachedVolumes are the volumes still attached on the node, while Draining.
	// +listType=set
	// +optional
	AttachedVolumes []string `json:"attachedVolumes,omitempty"`
	// lastPhaseChange is when phase last changed.
	// +optional
	LastPhaseChange *metav1.Time `json:"lastPhaseChange,omitempty"`
	// awaySince is when the node was first judged ReadyForMaintenance: the start of
	// its downtime, which spec.maxDowntime bounds.
	// +optional
	AwaySince *metav1.Time `json:"awaySince,omitempty"`
}

// ReplicatedNodeMaintenance takes one node out of service and brings it back:
// Pending → Draining → ReadyForMaintenance → (spec.return) Returning → Completed, or
// Blocked while the pre-checks refuse, or Failed past spec.maxDowntime. Its name is the node's (`kubectl meshvol drain`
// creates it).
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=rnm,categories=meshvol
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.message`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ReplicatedNodeMaintenance struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ReplicatedNodeMaintenanceSpec   `json:"spec"`
	Status ReplicatedNodeMaintenanceStatus `json:"status,omitempty"`
}

// ReplicatedNodeMaintenanceList is a list of ReplicatedNodeMaintenance.
// +kubebuilder:object:root=true
type ReplicatedNodeMaintenanceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ReplicatedNodeMaintenance `json:"items"`
}
