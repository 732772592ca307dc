package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// ReclaimPolicy says what happens to a volume's data when its claim goes.
// +kubebuilder:validation:Enum=Delete;Retain
type ReclaimPolicy string

const (
	ReclaimDelete ReclaimPolicy = "Delete"
	ReclaimRetain ReclaimPolicy = "Retain"
)

// ReplicatedStorageClassSpec is a protection and placement policy. Protection is given
// either as failuresToTolerate + guaranteedMinimumDataRedundancy, or as the legacy
// replication setting, never both.
// +kubebuilder:validation:XValidation:rule="!(has(self.replication) && (has(self.failuresToTolerate) || has(self.guaranteedMinimumDataRedundancy)))",message="replication is the legacy form of failuresToTolerate and guaranteedMinimumDataRedundancy: set either replication or both of those, not both forms"
// +kubebuilder:validation:XValidation:rule="has(self.replication) || (has(self.failuresToTolerate) && has(self.guaranteedMinimumDataRedundancy))",message="set replication, or both failuresToTolerate and guaranteedMinimumDataRedundancy"
// +kubebuilder:validation:XValidation:rule="!has(self.failuresToTolerate) || !has(self.guaranteedMinimumDataRedundancy) || self.failuresToTolerate <= self.guaranteedMinimumDataRedundancy + 1",message="failuresToTolerate must be at most guaranteedMinimumDataRedundancy + 1: the allowed layouts are 1D, 2D, 3D, 2D+1TB, 4D, 4D+1TB and 5D"
// +kubebuilder:validation:XValidation:rule="self.topology != 'Ignored' || !has(self.zones) || size(self.zones) == 0",message="zones must be empty when topology is Ignored"
// +kubebuilder:validation:XValidation:rule="self.topology != 'TransZonal' || !has(self.zones) || size(self.zones) == 0 || (has(self.replication) ? (self.replication == 'None' || self.replication == 'Consistency' || size(self.zones) >= 3) : (!has(self.failuresToTolerate) || !has(self.guaranteedMinimumDataRedundancy) || self.failuresToTolerate == 0 || size(self.zones) >= ((self.failuresToTolerate == 1 && self.guaranteedMinimumDataRedundancy == 2) ? 4 : 3)))",message="TransZonal must be able to lose any one zone: failuresToTolerate 1 or 2 needs at least 3 zones, and 1 with guaranteedMinimumDataRedundancy 2 (4D) needs 4 (over 3 zones, one zone holds 2 of the 4 Diskful replicas and losing it leaves 2 copies, not 3)"
// +kubebuilder:validation:XValidation:rule="self.storagePool == oldSelf.storagePool",message="storagePool is immutable: volumes cannot move between pools"
type ReplicatedStorageClassSpec struct {
	// storagePool is the ReplicatedStoragePool that backs volumes of this class.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	StoragePool string `json:"storagePool"`
	// failuresToTolerate is how many nodes may fail while volumes stay writable.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2
	// +optional
	FailuresToTolerate *int32 `json:"failuresToTolerate,omitempty"`
	// guaranteedMinimumDataRedundancy is how many copies beyond one every acknowledged
	// write is guaranteed to have.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2
	// +optional
	GuaranteedMinimumDataRedundancy *int32 `json:"guaranteedMinimumDataRedundancy,omitempty"`
	// replication is the legacy protection setting.
	// +optional
	Replication *Replication `json:"replication,omitempty"`
	// topology says how replicas spread over zones.
	// +kubebuilder:default=Ignored
	// +optional
	Topology Topology `json:"topology,omitempty"`
	// zones restricts placement to these zones.
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Zones []string `json:"zones,omitempty"`
	// volumeAccess says where volumes may be attached.
	// +kubebuilder:default=PreferablyLocal
	// +optional
	VolumeAccess VolumeAccess `json:"volumeAccess,omitempty"`
	// reclaimPolicy is given to the Kubernetes StorageClass.
	// +kubebuilder:default=Delete
	// +optional
	ReclaimPolicy ReclaimPolicy `json:"reclaimPolicy,omitempty"`
	// drbdOptions overrides the built-in DRBD defaults for volumes of this class.
	// +optional
	DRBDOptions *DRBDOptions `json:"drbdOptions,omitempty"`
}

// ReplicatedStorageClassStatus is written by the controller.
type ReplicatedStorageClassStatus struct {
	// observedGeneration is the spec generation this status reflects.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// conditions: Ready (the pool exists and enough nodes are eligible for the layout).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ReplicatedStorageClass is a protection and placement policy for volumes.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=rsc,categories=meshvol
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.storagePool`
// +kubebuilder:printcolumn:name="FTT",type=integer,JSONPath=`.spec.failuresToTolerate`
// +kubebuilder:printcolumn:name="GMDR",type=integer,JSONPath=`.spec.guaranteedMinimumDataRedundancy`
// +kubebuilder:printcolumn:name="Replication",type=string,JSONPath=`.spec.replication`
// +kubebuilder:printcolumn:name="Topology",type=string,JSONPath=`.spec.topology`
// +kubebuilder:printcolumn:name="Access",type=string,JSONPath=`.spec.volumeAccess`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ReplicatedStorageClass struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ReplicatedStorageClassSpec   `json:"spec"`
	Status ReplicatedStorageClassStatus `json:"status,omitempty"`
}

// ReplicatedStorageClassList is a list of ReplicatedStorageClass.
// +kubebuilder:object:root=true
type ReplicatedStorageClassList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ReplicatedStorageClass `json:"items"`
}
