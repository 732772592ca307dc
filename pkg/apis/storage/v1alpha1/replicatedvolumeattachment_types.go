package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// ReplicatedVolumeAttachmentSpec asks for a volume to be usable on a node. It maps 1:1
// to a CSI ControllerPublish and never changes: a different node is a different object.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable: create a new attachment instead"
type ReplicatedVolumeAttachmentSpec struct {
	// replicatedVolumeName is the volume to attach.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	ReplicatedVolumeName string `json:"replicatedVolumeName"`
	// nodeName is the node to attach it on.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	NodeName string `json:"nodeName"`
}

// AttachmentPhase summarises an attachment for people; conditions are the truth.
// +kubebuilder:validation:Enum=Pending;Attaching;Attached;Detaching
type AttachmentPhase string

const (
	AttachmentPending   AttachmentPhase = "Pending"   // waiting: a guard or the replica blocks it (see conditions)
	AttachmentAttaching AttachmentPhase = "Attaching" // the Attach transition runs
	AttachmentAttached  AttachmentPhase = "Attached"  // the node may use the device
	AttachmentDetaching AttachmentPhase = "Detaching" // the Detach transition runs
)

// ReplicatedVolumeAttachmentStatus is written by the controller.
type ReplicatedVolumeAttachmentStatus struct {
	// observedGeneration is the spec generation this status reflects.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// phase summarises the attachment.
	// +optional
	Phase AttachmentPhase `json:"phase,omitempty"`
	// devicePath is the block device on the node, once attached.
	// +optional
	DevicePath string `json:"devicePath,omitempty"`
	// conditions: Attached, with a reason and message saying why not yet.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ReplicatedVolumeAttachment makes a volume usable on one node.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=rva,categories=meshvol
// +kubebuilder:printcolumn:name="Volume",type=string,JSONPath=`.spec.replicatedVolumeName`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Device",type=string,JSONPath=`.status.devicePath`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ReplicatedVolumeAttachment struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ReplicatedVolumeAttachmentSpec   `json:"spec"`
	Status ReplicatedVolumeAttachmentStatus `json:"status,omitempty"`
}

// ReplicatedVolumeAttachmentList is a list of ReplicatedVolumeAttachment.
// +kubebuilder:object:root=true
type ReplicatedVolumeAttachmentList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ReplicatedVolumeAttachment `json:"items"`
}
