package api

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshvol/meshvol/internal/testenv"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// TestDefaults checks that the apiserver, not a client library, fills in the documented
// defaults: a user's minimal YAML must mean the same thing as the full one, and the
// controller must be able to rely on the fields being there.
func TestDefaults(t *testing.T) {
	cases := []struct {
		name   string
		obj    string
		status string // applied to the status subresource after obj, when set
		want   map[string]any
	}{
		{
			name: "rsc",
			obj: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, replication: Availability}
`,
			want: map[string]any{
				"spec.topology":      "Ignored",
				"spec.volumeAccess":  "PreferablyLocal",
				"spec.reclaimPolicy": "Delete",
			},
		},
		{
			// A default never overrides a value the user gave.
			name: "rsc keeps explicit values",
			obj: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, failuresToTolerate: 0, guaranteedMinimumDataRedundancy: 0, topology: Zonal, volumeAccess: Any, reclaimPolicy: Retain}
`,
			want: map[string]any{
				"spec.topology":                        "Zonal",
				"spec.volumeAccess":                    "Any",
				"spec.reclaimPolicy":                   "Retain",
				"spec.failuresToTolerate":              int64(0),
				"spec.guaranteedMinimumDataRedundancy": int64(0),
			},
		},
		{
			name: "rv auto",
			obj: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: 1Gi, replicatedStorageClassName: rsc-3d}
`,
			want: map[string]any{
				"spec.configurationMode": "Auto",
				"spec.maxAttachments":    int64(1),
			},
		},
		{
			name: "rv manual configuration",
			obj: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec:
  size: 1Gi
  configurationMode: Manual
  manualConfiguration: {storagePool: pool-a, failuresToTolerate: 1, guaranteedMinimumDataRedundancy: 1}
`,
			want: map[string]any{
				"spec.maxAttachments":                   int64(1),
				"spec.manualConfiguration.topology":     "Ignored",
				"spec.manualConfiguration.volumeAccess": "PreferablyLocal",
			},
		},
		{
			name: "rv status shared secret key",
			obj:  rvOK,
			status: `
kind: ReplicatedVolume
metadata: {name: $NAME}
status:
  datamesh:
    sharedSecret: {secretName: meshvol-drbd-secret, algorithm: sha256}
`,
			want: map[string]any{"status.datamesh.sharedSecret.key": "secret"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := testenv.Name(t)
			u := fromYAML(t, tc.obj, name)
			mustApply(t, u, managerUser)
			if tc.status != "" {
				mustApplyStatus(t, fromYAML(t, tc.status, name), managerController)
			}
			got := get(t, u)
			for path, want := range tc.want {
				if v := field(t, got, strings.Split(path, ".")...); v != want {
					t.Errorf(".%s = %#v, want %#v", path, v, want)
				}
			}
		})
	}
}

// TestDefaultsForGoClients: the CSI controller and the reconcilers build objects as Go
// structs, not YAML. A field left at its zero value must reach the apiserver as absent,
// so that the documented default applies to them too; a zero value sent on the wire
// ("" for an enum) is refused instead, or worse, stored.
func TestDefaultsForGoClients(t *testing.T) {
	t.Run("rsc", func(t *testing.T) {
		rsc := &v1.ReplicatedStorageClass{
			ObjectMeta: metav1.ObjectMeta{Name: testenv.Name(t)},
			Spec:       v1.ReplicatedStorageClassSpec{StoragePool: "pool-a", Replication: ptr(v1.ReplicationAvailability)},
		}
		if err := env.Client.Create(ctx(t), rsc); err != nil {
			t.Fatalf("a Go client's minimal class is refused: %v", err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(ctx(t), rsc) })
		if rsc.Spec.Topology != v1.TopologyIgnored || rsc.Spec.VolumeAccess != v1.VolumeAccessPreferablyLocal || rsc.Spec.ReclaimPolicy != v1.ReclaimDelete {
			t.Errorf("defaults not applied: topology %q volumeAccess %q reclaimPolicy %q", rsc.Spec.Topology, rsc.Spec.VolumeAccess, rsc.Spec.ReclaimPolicy)
		}
	})
	t.Run("rv auto", func(t *testing.T) {
		rv := &v1.ReplicatedVolume{
			ObjectMeta: metav1.ObjectMeta{Name: testenv.Name(t)},
			Spec:       v1.ReplicatedVolumeSpec{Size: qty("1Gi"), ReplicatedStorageClassName: "rsc-3d"},
		}
		if err := env.Client.Create(ctx(t), rv); err != nil {
			t.Fatalf("a Go client's minimal volume is refused: %v", err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(ctx(t), rv) })
		if rv.Spec.ConfigurationMode != v1.ConfigurationModeAuto || rv.Spec.MaxAttachments != 1 {
			t.Errorf("defaults not applied: configurationMode %q maxAttachments %d", rv.Spec.ConfigurationMode, rv.Spec.MaxAttachments)
		}
	})
	t.Run("rv manual", func(t *testing.T) {
		rv := &v1.ReplicatedVolume{
			ObjectMeta: metav1.ObjectMeta{Name: testenv.Name(t)},
			Spec: v1.ReplicatedVolumeSpec{
				Size: qty("1Gi"), ConfigurationMode: v1.ConfigurationModeManual,
				ManualConfiguration: &v1.ReplicatedVolumeConfiguration{StoragePool: "pool-a", FailuresToTolerate: 1, GuaranteedMinimumDataRedundancy: 1},
			},
		}
		if err := env.Client.Create(ctx(t), rv); err != nil {
			t.Fatalf("a Go client's manual volume without topology and volumeAccess is refused: %v", err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(ctx(t), rv) })
		if mc := rv.Spec.ManualConfiguration; mc.Topology != v1.TopologyIgnored || mc.VolumeAccess != v1.VolumeAccessPreferablyLocal {
			t.Errorf("defaults not applied: topology %q volumeAccess %q", mc.Topology, mc.VolumeAccess)
		}
	})
}
