package agent

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// The cache keeps of a volume what the agent reads (spec, datamesh, its
// revision and transitions, whether it was Formed) and drops the rest.
func TestAgentVolumeKeepsWhatTheAgentReads(t *testing.T) {
	size := resource.MustParse("64Mi")
	now := metav1.Now()
	rv := &v1.ReplicatedVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "vol", UID: "u1", ResourceVersion: "7", DeletionTimestamp: &now,
			Finalizers:    []string{v1.FinalizerAgent},
			Labels:        map[string]string{"team": "a"},
			Annotations:   map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "meshvol-controller"}}},
		Spec: v1.ReplicatedVolumeSpec{Size: size, ReplicatedStorageClassName: "bench", MaxAttachments: 1},
		Status: v1.ReplicatedVolumeStatus{
			ObservedGeneration: 3,
			Phase:              v1.VolumePhaseReady,
			Conditions: []metav1.Condition{
				{Type: v1.ConditionFormed, Status: metav1.ConditionTrue, Reason: "Formed", Message: "every member UpToDate", LastTransitionTime: now},
				{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", Message: "3/3 replicas UpToDate"},
			},
			Datamesh: v1.Datamesh{
				Members: []v1.DatameshMember{{Name: "vol-node-1", Type: v1.MemberTypeDiskful, NodeName: "node-1", NodeID: 0}},
				Quorum:  2, Port: 7001, Minor: 3, Size: &size,
				SharedSecret: &v1.SharedSecretReference{SecretName: "vol-secret"},
			},
			DatameshRevision:    5,
			DatameshTransitions: []v1.DatameshTransition{{}},
			Layout:              "3D",
			ReadyMembers:        "3/3",
			SyncProgress:        "100%",
		},
	}
	want := rv.DeepCopy()
	got, err := agentVolume(rv)
	if err != nil {
		t.Fatal(err)
	}
	kept := got.(*v1.ReplicatedVolume)
	if !reflect.DeepEqual(kept.Spec, want.Spec) {
		t.Errorf("spec: %+v, want %+v", kept.Spec, want.Spec)
	}
	if !reflect.DeepEqual(kept.Status.Datamesh, want.Status.Datamesh) || kept.Status.DatameshRevision != 5 ||
		!reflect.DeepEqual(kept.Status.DatameshTransitions, want.Status.DatameshTransitions) {
		t.Errorf("datamesh: %+v revision %d transitions %+v", kept.Status.Datamesh, kept.Status.DatameshRevision, kept.Status.DatameshTransitions)
	}
	if !meta.IsStatusConditionTrue(kept.Status.Conditions, v1.ConditionFormed) || len(kept.Status.Conditions) != 1 {
		t.Errorf("conditions: %+v, want Formed=True alone", kept.Status.Conditions)
	}
	if kept.Name != "vol" || kept.UID != "u1" || kept.ResourceVersion != "7" || kept.DeletionTimestamp == nil ||
		!reflect.DeepEqual(kept.Finalizers, want.Finalizers) || !reflect.DeepEqual(kept.Labels, want.Labels) {
		t.Errorf("metadata: %+v", kept.ObjectMeta)
	}
	if kept.ManagedFields != nil || kept.Annotations != nil || kept.Status.Phase != "" || kept.Status.Layout != "" ||
		kept.Status.ReadyMembers != "" || kept.Status.SyncProgress != "" || kept.Status.ObservedGeneration != 0 {
		t.Errorf("kept what the agent never reads: %+v", kept)
	}

	// Not yet Formed: no condition at all, as on the apiserver.
	rv = want.DeepCopy()
	rv.Status.Conditions = rv.Status.Conditions[1:]
	got, _ = agentVolume(rv)
	if c := got.(*v1.ReplicatedVolume).Status.Conditions; len(c) != 0 {
		t.Errorf("conditions of a volume never Formed: %+v, want none", c)
	}
}

// The cache keeps a replica's status but the other writers' conditions, which
// neither the status comparison nor the conditions' transition times read.
func TestAgentReplicaKeepsItsOwnStatus(t *testing.T) {
	rvr := &v1.ReplicatedVolumeReplica{
		ObjectMeta: metav1.ObjectMeta{Name: "vol-node-1", Labels: map[string]string{v1.LabelNode: "node-1"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: v1.FieldManagerAgent}}},
		Status: v1.ReplicatedVolumeReplicaStatus{
			DatameshRevision: 4, DiskState: v1.DiskStateInconsistent,
			Conditions: []metav1.Condition{
				{Type: v1.ConditionDRBDConfigured, Status: metav1.ConditionTrue},
				{Type: v1.ConditionAgentReady, Status: metav1.ConditionTrue, Message: "the controller's"},
				{Type: v1.ConditionDRBDRole, Status: metav1.ConditionFalse},
			},
		},
	}
	want := rvr.DeepCopy()
	got, err := agentReplica(rvr)
	if err != nil {
		t.Fatal(err)
	}
	kept := got.(*v1.ReplicatedVolumeReplica)
	if !sameStatus(kept.Status, want.Status) {
		t.Errorf("the agent's own status changed: %+v, want %+v", kept.Status, want.Status)
	}
	if len(kept.Status.Conditions) != 2 || meta.FindStatusCondition(kept.Status.Conditions, v1.ConditionAgentReady) != nil {
		t.Errorf("conditions: %+v, want DRBDConfigured and DRBDRole", kept.Status.Conditions)
	}
	if kept.ManagedFields != nil || kept.Labels[v1.LabelNode] != "node-1" {
		t.Errorf("metadata: %+v", kept.ObjectMeta)
	}
}
