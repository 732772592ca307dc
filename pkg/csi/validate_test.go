package csi

import (
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

func mountCap(fs string, mode csipb.VolumeCapability_AccessMode_Mode, flags ...string) *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: fs, MountFlags: flags}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: mode},
	}
}

func blockCap(mode csipb.VolumeCapability_AccessMode_Mode) *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: mode},
	}
}

const (
	snw = csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	ssw = csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
)

func createReq(name string, mut func(*csipb.CreateVolumeRequest)) *csipb.CreateVolumeRequest {
	r := &csipb.CreateVolumeRequest{
		Name:               name,
		VolumeCapabilities: []*csipb.VolumeCapability{mountCap("ext4", snw)},
		Parameters:         map[string]string{v1.CSIParameterStorageClass: "rsc"},
	}
	if mut != nil {
		mut(r)
	}
	return r
}

// TestValidateCreate is the table of every way CreateVolume's request can be wrong,
// with the code and the field its message must name.
func TestValidateCreate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		req   *csipb.CreateVolumeRequest
		code  codes.Code
		field string
	}{
		{"ok", createReq("pvc-1", nil), codes.OK, ""},
		{"no name", createReq("", nil), codes.InvalidArgument, "name"},
		{"long name", createReq(strings.Repeat("x", 1025), nil), codes.InvalidArgument, "name"},
		{"no capabilities", createReq("v", func(r *csipb.CreateVolumeRequest) { r.VolumeCapabilities = nil }), codes.InvalidArgument, "volume_capabilities"},
		{"nil capability", createReq("v", func(r *csipb.CreateVolumeRequest) { r.VolumeCapabilities = []*csipb.VolumeCapability{nil} }), codes.InvalidArgument, "volume_capabilities[0]"},
		{"no access mode", createReq("v", func(r *csipb.CreateVolumeRequest) { r.VolumeCapabilities[0].AccessMode = nil }), codes.InvalidArgument, "volume_capabilities[0].access_mode"},
		{"no access type", createReq("v", func(r *csipb.CreateVolumeRequest) { r.VolumeCapabilities[0].AccessType = nil }), codes.InvalidArgument, "volume_capabilities[0].access_type"},
		{"btrfs", createReq("v", func(r *csipb.CreateVolumeRequest) { r.VolumeCapabilities[0] = mountCap("btrfs", snw) }), codes.InvalidArgument, "fs_type"},
		{"bad mount flag", createReq("v", func(r *csipb.CreateVolumeRequest) { r.VolumeCapabilities[0] = mountCap("", snw, "") }), codes.InvalidArgument, "mount_flags[0]"},
		{"RWX filesystem", createReq("v", func(r *csipb.CreateVolumeRequest) {
			r.VolumeCapabilities[0] = mountCap("xfs", csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
		}), codes.InvalidArgument, "access_mode"},
		{"ROX", createReq("v", func(r *csipb.CreateVolumeRequest) {
			r.VolumeCapabilities[0] = blockCap(csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY)
		}), codes.InvalidArgument, "access_mode"},
		{"unknown mode", createReq("v", func(r *csipb.CreateVolumeRequest) { r.VolumeCapabilities[0] = blockCap(99) }), codes.InvalidArgument, "access_mode"},
		{"RWX block", createReq("v", func(r *csipb.CreateVolumeRequest) {
			r.VolumeCapabilities[0] = blockCap(csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
		}), codes.OK, ""},
		{"negative required", createReq("v", func(r *csipb.CreateVolumeRequest) { r.CapacityRange = &csipb.CapacityRange{RequiredBytes: -1} }), codes.InvalidArgument, "required_bytes"},
		{"negative limit", createReq("v", func(r *csipb.CreateVolumeRequest) { r.CapacityRange = &csipb.CapacityRange{LimitBytes: -1} }), codes.InvalidArgument, "limit_bytes"},
		{"limit below required", createReq("v", func(r *csipb.CreateVolumeRequest) {
			r.CapacityRange = &csipb.CapacityRange{RequiredBytes: 2 << 20, LimitBytes: 1 << 20}
		}), codes.InvalidArgument, "capacity_range"},
		{"rounding past limit", createReq("v", func(r *csipb.CreateVolumeRequest) {
			r.CapacityRange = &csipb.CapacityRange{RequiredBytes: 1<<20 + 1, LimitBytes: 1<<20 + 2}
		}), codes.OutOfRange, "capacity_range"},
		{"too large", createReq("v", func(r *csipb.CreateVolumeRequest) { r.CapacityRange = &csipb.CapacityRange{RequiredBytes: 1 << 60} }), codes.OutOfRange, "required_bytes"},
		{"no parameters", createReq("v", func(r *csipb.CreateVolumeRequest) { r.Parameters = nil }), codes.InvalidArgument, `parameters["replicatedStorageClassName"]`},
		{"unknown parameter", createReq("v", func(r *csipb.CreateVolumeRequest) { r.Parameters["replicas"] = "3" }), codes.InvalidArgument, `parameters["replicas"]`},
		{"provisioner parameters ignored", createReq("v", func(r *csipb.CreateVolumeRequest) { r.Parameters["csi.storage.k8s.io/pvc/name"] = "x" }), codes.OK, ""},
		{"bad class name", createReq("v", func(r *csipb.CreateVolumeRequest) { r.Parameters[v1.CSIParameterStorageClass] = "Not_A_Name" }), codes.InvalidArgument, `parameters["replicatedStorageClassName"]`},
		{"snapshot source without an id", createReq("v", func(r *csipb.CreateVolumeRequest) {
			r.VolumeContentSource = &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{}}}
		}), codes.InvalidArgument, "volume_content_source.snapshot.snapshot_id"},
		{"clone source without an id", createReq("v", func(r *csipb.CreateVolumeRequest) {
			r.VolumeContentSource = &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Volume{Volume: &csipb.VolumeContentSource_VolumeSource{}}}
		}), codes.InvalidArgument, "volume_content_source.volume.volume_id"},
		{"source of no kind", createReq("v", func(r *csipb.CreateVolumeRequest) {
			r.VolumeContentSource = &csipb.VolumeContentSource{}
		}), codes.InvalidArgument, "volume_content_source"},
		{"unknown topology key", createReq("v", func(r *csipb.CreateVolumeRequest) {
			r.AccessibilityRequirements = &csipb.TopologyRequirement{Requisite: []*csipb.Topology{{Segments: map[string]string{"kubernetes.io/hostname": "n1"}}}}
		}), codes.InvalidArgument, "accessibility_requirements.requisite[0].segments"},
		{"empty segment", createReq("v", func(r *csipb.CreateVolumeRequest) {
			r.AccessibilityRequirements = &csipb.TopologyRequirement{Preferred: []*csipb.Topology{{}}}
		}), codes.InvalidArgument, "accessibility_requirements.preferred[0]"},
		{"bad node in segment", createReq("v", func(r *csipb.CreateVolumeRequest) {
			r.AccessibilityRequirements = &csipb.TopologyRequirement{Requisite: []*csipb.Topology{{Segments: map[string]string{v1.TopologyKeyNode: "N 1"}}}}
		}), codes.InvalidArgument, "accessibility_requirements.requisite[0].segments"},
		{"topology ok", createReq("v", func(r *csipb.CreateVolumeRequest) {
			r.AccessibilityRequirements = &csipb.TopologyRequirement{
				Requisite: []*csipb.Topology{{Segments: map[string]string{v1.TopologyKeyNode: "n1", v1.LabelZone: "a"}}},
				Preferred: []*csipb.Topology{{Segments: map[string]string{v1.LabelZone: "a"}}},
			}
		}), codes.OK, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := validateCreate(tc.req)
			if got := status.Code(err); got != tc.code {
				t.Fatalf("code %v (%v), want %v", got, err, tc.code)
			}
			if tc.field != "" && !strings.Contains(status.Convert(err).Message(), tc.field) {
				t.Errorf("message %q does not name %q", status.Convert(err).Message(), tc.field)
			}
		})
	}
}

// Requisite without preferred: the requisite segments become the placement preference,
// in their order; an explicit preferred list is kept as it is.
func TestPlacementHintsPreferRequisite(t *testing.T) {
	seg := func(n string) *csipb.Topology {
		return &csipb.Topology{Segments: map[string]string{v1.TopologyKeyNode: n}}
	}
	h, err := placementHints(&csipb.TopologyRequirement{Requisite: []*csipb.Topology{seg("n2"), seg("n1")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Preferred) != 2 || h.Preferred[0].NodeName != "n2" || h.Preferred[1].NodeName != "n1" || len(h.Requisite) != 2 {
		t.Fatalf("requisite only: hints %+v, want preferred n2, n1", h)
	}
	h, err = placementHints(&csipb.TopologyRequirement{Requisite: []*csipb.Topology{seg("n2"), seg("n1")}, Preferred: []*csipb.Topology{seg("n1")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Preferred) != 1 || h.Preferred[0].NodeName != "n1" {
		t.Fatalf("with preferred: hints %+v, want preferred n1 only", h)
	}
}

func TestRequiredSize(t *testing.T) {
	for _, tc := range []struct {
		cr   *csipb.CapacityRange
		want int64
	}{
		{nil, DefaultVolumeSize},
		{&csipb.CapacityRange{}, DefaultVolumeSize},
		{&csipb.CapacityRange{LimitBytes: 64 << 20}, 64 << 20},
		{&csipb.CapacityRange{RequiredBytes: 1}, 1 << 20},
		{&csipb.CapacityRange{RequiredBytes: 10<<20 + 1, LimitBytes: 20 << 20}, 11 << 20},
	} {
		got, err := requiredSize(tc.cr)
		if err != nil || got != tc.want {
			t.Errorf("requiredSize(%v) = %d, %v; want %d", tc.cr, got, err, tc.want)
		}
	}
}

// An xfs volume is made at least 300 MiB, what mkfs.xfs accepts: CSI's capacity_range
// allows a larger volume than required_bytes, not one above limit_bytes.
func TestXFSMinimumSize(t *testing.T) {
	xfs := func(cr *csipb.CapacityRange) *csipb.CreateVolumeRequest {
		return createReq("v", func(r *csipb.CreateVolumeRequest) {
			r.VolumeCapabilities[0] = mountCap("xfs", snw)
			r.CapacityRange = cr
		})
	}
	for _, tc := range []struct {
		name string
		req  *csipb.CreateVolumeRequest
		want int64
	}{
		{"xfs 64Mi", xfs(&csipb.CapacityRange{RequiredBytes: 64 << 20}), minXFSSize},
		{"xfs 1Gi", xfs(&csipb.CapacityRange{RequiredBytes: 1 << 30}), 1 << 30},
		{"xfs 64Mi within a limit", xfs(&csipb.CapacityRange{RequiredBytes: 64 << 20, LimitBytes: 1 << 30}), minXFSSize},
		{"ext4 64Mi", createReq("v", func(r *csipb.CreateVolumeRequest) {
			r.VolumeCapabilities[0] = mountCap("ext4", snw)
			r.CapacityRange = &csipb.CapacityRange{RequiredBytes: 64 << 20}
		}), 64 << 20},
	} {
		got, err := validateCreate(tc.req)
		if err != nil || got.size != tc.want {
			t.Errorf("%s: size %d, %v; want %d", tc.name, got.size, err, tc.want)
		}
	}
	_, err := validateCreate(xfs(&csipb.CapacityRange{RequiredBytes: 64 << 20, LimitBytes: 128 << 20}))
	if status.Code(err) != codes.OutOfRange || !strings.Contains(err.Error(), "limit_bytes") || !strings.Contains(err.Error(), "xfs") {
		t.Errorf("xfs under a 128Mi limit: %v, want OutOfRange naming limit_bytes and xfs", err)
	}
}

func TestRVNameFor(t *testing.T) {
	if n, h := rvNameFor("pvc-0d3f"); n != "pvc-0d3f" || h {
		t.Errorf("a DNS label is used as it is, got %q hashed=%v", n, h)
	}
	a, ha := rvNameFor("sanity-Create-ABC")
	b, _ := rvNameFor("sanity-Create-ABD")
	if !ha || a == b || len(validation.IsDNS1123Label(a)) > 0 {
		t.Errorf("names that are not labels hash to distinct labels: %q %q", a, b)
	}
	if c, _ := rvNameFor("sanity-Create-ABC"); c != a {
		t.Errorf("the hash is not stable: %q then %q", a, c)
	}
}

// FuzzValidateCreate: no request makes validation panic, and whatever it accepts is
// something the API will take: an RV name that is a DNS label, a whole-MiB size
// inside the requested range, a class name, valid topology.
func FuzzValidateCreate(f *testing.F) {
	f.Add("pvc-1", int64(0), int64(0), "ext4", int32(1), true, "rsc", "", "n1", "")
	f.Add("Sanity-X", int64(1<<20+1), int64(2<<20), "xfs", int32(5), false, "a", "x", "", "z")
	f.Add("", int64(-1), int64(5), "btrfs", int32(3), true, "", "csi.storage.k8s.io/pvc/name", "N", "")
	f.Fuzz(func(t *testing.T, name string, req, lim int64, fs string, mode int32, block bool, rsc, extraKey, node, zone string) {
		vc := mountCap(fs, csipb.VolumeCapability_AccessMode_Mode(mode))
		if block {
			vc = blockCap(csipb.VolumeCapability_AccessMode_Mode(mode))
		}
		params := map[string]string{v1.CSIParameterStorageClass: rsc}
		if extraKey != "" {
			params[extraKey] = "v"
		}
		r := &csipb.CreateVolumeRequest{
			Name: name, VolumeCapabilities: []*csipb.VolumeCapability{vc}, Parameters: params,
			CapacityRange: &csipb.CapacityRange{RequiredBytes: req, LimitBytes: lim},
		}
		seg := map[string]string{}
		if node != "" {
			seg[v1.TopologyKeyNode] = node
		}
		if zone != "" {
			seg[v1.LabelZone] = zone
		}
		if len(seg) > 0 {
			r.AccessibilityRequirements = &csipb.TopologyRequirement{Requisite: []*csipb.Topology{{Segments: seg}}}
		}
		got, err := validateCreate(r)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument && c != codes.OutOfRange {
				t.Fatalf("validation error with code %v: %v", c, err)
			}
			return
		}
		if len(validation.IsDNS1123Label(got.rvName)) > 0 {
			t.Fatalf("accepted name %q maps to %q, not a DNS label", name, got.rvName)
		}
		if got.size <= 0 || got.size%sizeAlign != 0 || (lim > 0 && got.size > lim) || got.size < req {
			t.Fatalf("size %d for range [%d, %d]", got.size, req, lim)
		}
		if len(validation.IsDNS1123Subdomain(got.rsc)) > 0 {
			t.Fatalf("accepted class %q", got.rsc)
		}
	})
}
