package v1alpha1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

func TestNodeScopedNames(t *testing.T) {
	// docs/contract.md: RVR and RVA of a volume on a node are both <rv>-<node>.
	if got := ReplicaName("pvc-1", "node-a"); got != "pvc-1-node-a" {
		t.Errorf("ReplicaName = %q", got)
	}
	if got := AttachmentName("pvc-1", "node-a"); got != "pvc-1-node-a" {
		t.Errorf("AttachmentName = %q", got)
	}
}

func TestPoolCapacityRoundTrip(t *testing.T) {
	in := PoolCapacity{Total: 10 << 30, Free: 4 << 30}
	if s := in.String(); s != "total=10737418240,free=4294967296" {
		t.Fatalf("String() = %q, not the documented total=<bytes>,free=<bytes>", s)
	}
	got, err := ParsePoolCapacity(in.String())
	if err != nil || got != in {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	// A key a newer agent adds is skipped, not an error.
	if got, err := ParsePoolCapacity("total=3,free=1,reserved=2"); err != nil || got != (PoolCapacity{Total: 3, Free: 1}) {
		t.Errorf("unknown key: %+v %v", got, err)
	}
}

func TestParsePoolCapacityRefuses(t *testing.T) {
	for bad, why := range map[string]string{
		"":                       "not key=value",
		"total=1":                "needs total= and free=",
		"free=1":                 "needs total= and free=",
		"total=x,free=1":         "non-negative number",
		"free=-1,total=3":        "non-negative number",
		"total=1,free=1,free=0":  "given twice",
		"total=1, free=1":        "needs total= and free=", // " free" is no key it knows
		"total=1;free=1":         "non-negative number",
		"total=1,free=1,garbage": "not key=value",
	} {
		_, err := ParsePoolCapacity(bad)
		if err == nil {
			t.Errorf("ParsePoolCapacity(%q) accepted it", bad)
			continue
		}
		if !strings.Contains(err.Error(), why) {
			t.Errorf("ParsePoolCapacity(%q): %v, want it to say %q", bad, err, why)
		}
	}
}

func TestVolumeSizes(t *testing.T) {
	gi := func(n int64) *resource.Quantity { return resource.NewQuantity(n<<30, resource.BinarySI) }
	for _, c := range []struct {
		name           string
		spec           int64
		datamesh       *resource.Quantity
		device, report int64
	}{
		{"nothing published yet", 1, nil, 1 << 30, 1 << 30},
		{"published zero", 1, gi(0), 1 << 30, 1 << 30},
		{"published as asked", 1, gi(1), 1 << 30, 1 << 30},
		{"rounded up past the request", 1, resource.NewQuantity(1<<30+4096, resource.BinarySI), 1<<30 + 4096, 1<<30 + 4096},
		{"growing: spec leads", 2, gi(1), 1 << 30, 2 << 30},
	} {
		rv := &ReplicatedVolume{Spec: ReplicatedVolumeSpec{Size: *gi(c.spec)}}
		rv.Status.Datamesh.Size = c.datamesh
		if got := rv.DeviceSize(); got != c.device {
			t.Errorf("%s: DeviceSize = %d, want %d", c.name, got, c.device)
		}
		if got := rv.CapacityBytes(); got != c.report {
			t.Errorf("%s: CapacityBytes = %d, want %d", c.name, got, c.report)
		}
	}
}
