package datamesh

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh/layout"
)

// TestClassRefusedByTheSharedRule: the engine refuses a class that decides no layout
// with layout.FromClass's message, the one the CSI controller service refuses
// CreateVolume with (pkg/csi TestCreateRefusesAClassTheEngineRefuses).
func TestClassRefusedByTheSharedRule(t *testing.T) {
	one := int32(1)
	rsc := &v1.ReplicatedStorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gold"},
		Spec: v1.ReplicatedStorageClassSpec{StoragePool: "p", FailuresToTolerate: &one}}
	rv := &v1.ReplicatedVolume{Spec: v1.ReplicatedVolumeSpec{ReplicatedStorageClassName: "gold", ConfigurationMode: v1.ConfigurationModeAuto}}
	_, ok, why := desiredConfiguration(rv, rsc)
	_, err := layout.FromClass("gold", nil, &one, nil)
	if ok || err == nil || why != err.Error() {
		t.Fatalf("desiredConfiguration: ok=%v %q; layout.FromClass: %v", ok, why, err)
	}
}
