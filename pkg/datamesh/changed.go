package datamesh

import (
	"slices"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// sameStatus reports whether two volume statuses are equal field by field, the way
// apimachinery's semantic equality sees them (an empty list equals a missing one;
// quantities and times by value). Result.Changed is !sameStatus(before, after). It is
// written out rather than reflected: the model checker calls Process for every state it
// explores, and reflection made that its largest cost. TestSameStatusCoversEveryField
// fails when a field is added to one of these types and not here.
func sameStatus(a, b *v1.ReplicatedVolumeStatus) bool {
	return a.ObservedGeneration == b.ObservedGeneration && a.Phase == b.Phase &&
		slices.EqualFunc(a.Conditions, b.Conditions, sameCondition) &&
		samePtr(a.Configuration, b.Configuration, sameConfiguration) &&
		samePtr(a.EffectiveLayout, b.EffectiveLayout, func(x, y *v1.Layout) bool { return *x == *y }) &&
		sameDatamesh(&a.Datamesh, &b.Datamesh) &&
		a.DatameshRevision == b.DatameshRevision &&
		slices.EqualFunc(a.DatameshTransitions, b.DatameshTransitions, sameTransition) &&
		slices.Equal(a.DatameshReplicaRequests, b.DatameshReplicaRequests) &&
		a.Layout == b.Layout && a.ReadyMembers == b.ReadyMembers && a.SyncProgress == b.SyncProgress
}

func sameDatamesh(a, b *v1.Datamesh) bool {
	return slices.EqualFunc(a.Members, b.Members, sameMember) &&
		a.Quorum == b.Quorum && a.QuorumMinimumRedundancy == b.QuorumMinimumRedundancy &&
		a.Multiattach == b.Multiattach && a.Port == b.Port && a.Minor == b.Minor &&
		samePtr(a.Size, b.Size, func(x, y *resource.Quantity) bool { return x.Cmp(*y) == 0 }) &&
		samePtr(a.SharedSecret, b.SharedSecret, func(x, y *v1.SharedSecretReference) bool { return *x == *y })
}

func sameMember(a, b v1.DatameshMember) bool {
	return a.Name == b.Name && a.Type == b.Type && a.NodeName == b.NodeName && a.Zone == b.Zone &&
		slices.Equal(a.Addresses, b.Addresses) && a.NodeID == b.NodeID && a.Port == b.Port && a.Attached == b.Attached
}

func sameTransition(a, b v1.DatameshTransition) bool {
	return a.Type == b.Type && a.Group == b.Group && a.ReplicaName == b.ReplicaName &&
		samePtr(a.ReplicaNodeID, b.ReplicaNodeID, func(x, y *int32) bool { return *x == *y }) &&
		a.FromType == b.FromType && a.ToType == b.ToType && a.PlanID == b.PlanID && a.PlanVersion == b.PlanVersion &&
		slices.EqualFunc(a.Steps, b.Steps, sameStep)
}

func sameStep(a, b v1.DatameshTransitionStep) bool {
	return a.Name == b.Name && a.Status == b.Status && a.DatameshRevision == b.DatameshRevision &&
		samePtr(a.StartedAt, b.StartedAt, sameTime) && samePtr(a.CompletedAt, b.CompletedAt, sameTime) &&
		a.Message == b.Message
}

func sameCondition(a, b metav1.Condition) bool {
	return a.Type == b.Type && a.Status == b.Status && a.ObservedGeneration == b.ObservedGeneration &&
		sameTime(&a.LastTransitionTime, &b.LastTransitionTime) && a.Reason == b.Reason && a.Message == b.Message
}

func sameTime(a, b *metav1.Time) bool { return a.Time.Equal(b.Time) }

// samePtr: both nil, or both set and same.
func samePtr[T any](a, b *T, same func(a, b *T) bool) bool {
	if a == nil || b == nil {
		return a == b
	}
	return same(a, b)
}
