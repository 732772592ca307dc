package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of every meshvol kind.
const GroupName = "storage.meshvol.io"

// SchemeGroupVersion is the group and version of this package.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

var (
	// SchemeBuilder registers the kinds of this package with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the kinds of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Resource turns an unqualified resource name into a group-qualified one.
func Resource(resource string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(resource).GroupResource()
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion,
		&ReplicatedVolume{}, &ReplicatedVolumeList{},
		&ReplicatedVolumeReplica{}, &ReplicatedVolumeReplicaList{},
		&ReplicatedVolumeAttachment{}, &ReplicatedVolumeAttachmentList{},
		&ReplicatedStorageClass{}, &ReplicatedStorageClassList{},
		&ReplicatedStoragePool{}, &ReplicatedStoragePoolList{},
		&ReplicatedVolumeSnapshot{}, &ReplicatedVolumeSnapshotList{},
		&ReplicatedNodeMaintenance{}, &ReplicatedNodeMaintenanceList{},
	)
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}
