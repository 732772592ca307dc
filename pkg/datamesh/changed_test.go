package datamesh

import (
	"reflect"
	"testing"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSameStatusCoversEveryField fails when a field is added to a type sameStatus
// compares field by field: extend sameStatus (changed.go), then the count here. Every
// scenario step also checks sameStatus against apimachinery's semantic equality
// (checkFreshEngine).
func TestSameStatusCoversEveryField(t *testing.T) {
	for _, c := range []struct {
		v      any
		fields int
	}{
		{v1.ReplicatedVolumeStatus{}, 12},
		{v1.ReplicatedVolumeConfiguration{}, 6},
		{v1.Layout{}, 2},
		{v1.Datamesh{}, 8},
		{v1.DatameshMember{}, 8},
		{v1.DatameshTransition{}, 9},
		{v1.DatameshTransitionStep{}, 6},
		{v1.DatameshReplicaRequest{}, 4},
		{v1.SharedSecretReference{}, 5}, // compared whole (==)
		{metav1.Condition{}, 6},
	} {
		typ := reflect.TypeOf(c.v)
		if typ.NumField() != c.fields {
			t.Errorf("%s has %d fields, sameStatus compares %d: compare the new ones in changed.go", typ.Name(), typ.NumField(), c.fields)
		}
	}
}
