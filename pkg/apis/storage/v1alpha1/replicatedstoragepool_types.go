package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PoolType is the kind of backing storage a pool provides.
// +kubebuilder:validation:Enum=LVM;LVMThin;File
type PoolType string

const (
	// PoolTypeLVM: thick logical volumes in a volume group.
	PoolTypeLVM PoolType = "LVM"
	// PoolTypeLVMThin: thin volumes in a thin pool.
	PoolTypeLVMThin PoolType = "LVMThin"
	// PoolTypeFile: sparse files on loop devices, for development and the sandbox.
	PoolTypeFile PoolType = "File"
)

// PoolVolumeGroup is the LVM volume group (and thin pool) one node contributes.
type PoolVolumeGroup struct {
	// nodeName is the node.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	NodeName string `json:"nodeName"`
	// name is the volume group's name on that node.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=127
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9+_.][A-Za-z0-9+_.-]*$`
	Name string `json:"name"`
	// thinPool is the thin pool's name inside the volume group (LVMThin only).
	// +kubebuilder:validation:MaxLength=127
	// +optional
	ThinPool string `json:"thinPool,omitempty"`
}

// FilePool places backing files in a directory on every eligible node.
type FilePool struct {
	// directory is an absolute path on the node.
	// +kubebuilder:validation:Pattern=`^/.*`
	// +kubebuilder:validation:MaxLength=4096
	Directory string `json:"directory"`
}

// ReplicatedStoragePoolSpec says where backing volumes come from.
// +kubebuilder:validation:XValidation:rule="self.type == 'File' || (has(self.volumeGroups) && size(self.volumeGroups) > 0)",message="volumeGroups must list at least one node's volume group when type is LVM or LVMThin"
// +kubebuilder:validation:XValidation:rule="self.type != 'File' || has(self.file)",message="file.directory is required when type is File"
// +kubebuilder:validation:XValidation:rule="self.type == 'File' || !has(self.file)",message="file must be empty unless type is File"
// +kubebuilder:validation:XValidation:rule="self.type != 'LVMThin' || !has(self.volumeGroups) || self.volumeGroups.all(v, has(v.thinPool) && size(v.thinPool) > 0)",message="every volumeGroups entry needs thinPool when type is LVMThin"
// +kubebuilder:validation:XValidation:rule="self.type != 'LVM' || !has(self.volumeGroups) || self.volumeGroups.all(v, !has(v.thinPool) || size(v.thinPool) == 0)",message="thinPool must be empty when type is LVM"
// +kubebuilder:validation:XValidation:rule="self.type == oldSelf.type",message="type is immutable"
type ReplicatedStoragePoolSpec struct {
	// type is the kind of backing storage.
	Type PoolType `json:"type"`
	// volumeGroups lists, per node, the LVM volume group (LVM, LVMThin).
	// +listType=map
	// +listMapKey=nodeName
	// +kubebuilder:validation:MaxItems=1000
	// +optional
	VolumeGroups []PoolVolumeGroup `json:"volumeGroups,omitempty"`
	// file configures a File pool.
	// +optional
	File *FilePool `json:"file,omitempty"`
	// nodeSelector limits the pool to matching nodes.
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	// zones limits the pool to nodes in these zones.
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Zones []string `json:"zones,omitempty"`
}

// EligibleNode is a node that can hold replicas of this pool.
type EligibleNode struct {
	// nodeName is the node.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	NodeName string `json:"nodeName"`
	// zone is the node's topology zone.
	// +optional
	Zone string `json:"zone,omitempty"`
	// ready says the node's agent is alive and the pool's storage is usable there.
	Ready bool `json:"ready"`
	// unschedulable says no new replicas go there (cordoned or draining).
	// +optional
	Unschedulable bool `json:"unschedulable,omitempty"`
	// totalCapacity is the pool's size on the node.
	// +optional
	TotalCapacity *resource.Quantity `json:"totalCapacity,omitempty"`
	// freeCapacity is what can still be allocated on the node.
	// +optional
	FreeCapacity *resource.Quantity `json:"freeCapacity,omitempty"`
}

// ReplicatedStoragePoolStatus is written by the controller from the agents' reports.
type ReplicatedStoragePoolStatus struct {
	// observedGeneration is the spec generation this status reflects.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// eligibleNodes are the nodes that can hold replicas of this pool.
	// +listType=map
	// +listMapKey=nodeName
	// +optional
	EligibleNodes []EligibleNode `json:"eligibleNodes,omitempty"`
	// conditions: Ready.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ReplicatedStoragePool says where backing volumes come from on each node.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=rsp,categories=meshvol
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.spec.type`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ReplicatedStoragePool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ReplicatedStoragePoolSpec   `json:"spec"`
	Status ReplicatedStoragePoolStatus `json:"status,omitempty"`
}

// ReplicatedStoragePoolList is a list of ReplicatedStoragePool.
// +kubebuilder:object:root=true
type ReplicatedStoragePoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ReplicatedStoragePool `json:"items"`
}
