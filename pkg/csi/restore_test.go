package csi

import (
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/resource"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

func TestRestoreSize(t *testing.T) {
	snap := &v1.ReplicatedVolumeSnapshot{Status: v1.ReplicatedVolumeSnapshotStatus{Size: resource.NewQuantity(64<<20, resource.BinarySI)}}
	for _, tc := range []struct {
		name string
		cr   *csipb.CapacityRange
		size int64 // what validateCreate made of cr
		want int64
		code codes.Code
	}{
		{"no range: the snapshot's size", nil, DefaultVolumeSize, 64 << 20, codes.OK},
		{"larger", &csipb.CapacityRange{RequiredBytes: 128 << 20}, 128 << 20, 128 << 20, codes.OK},
		{"equal", &csipb.CapacityRange{RequiredBytes: 64 << 20}, 64 << 20, 64 << 20, codes.OK},
		{"smaller required", &csipb.CapacityRange{RequiredBytes: 32 << 20}, 32 << 20, 0, codes.OutOfRange},
		{"limit below the snapshot", &csipb.CapacityRange{LimitBytes: 32 << 20}, 32 << 20, 0, codes.OutOfRange},
		{"limit only, above", &csipb.CapacityRange{LimitBytes: 128 << 20}, DefaultVolumeSize, max(int64(64<<20), DefaultVolumeSize), codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &createRequest{size: tc.size}
			err := restoreSize(r, snap, tc.cr)
			if status.Code(err) != tc.code {
				t.Fatalf("got %v, want %s", err, tc.code)
			}
			if err == nil && r.size != tc.want {
				t.Fatalf("size %d, want %d", r.size, tc.want)
			}
		})
	}
}

func TestSeedNode(t *testing.T) {
	snap := &v1.ReplicatedVolumeSnapshot{Status: v1.ReplicatedVolumeSnapshotStatus{Copies: []string{"n3", "n1", "n2"}}}
	all := map[string]bool{"n1": true, "n2": true, "n3": true}
	for _, tc := range []struct {
		name  string
		hints *v1.PlacementHints
		live  map[string]bool
		want  string
		code  codes.Code
	}{
		{"first by name", nil, all, "n1", codes.OK},
		{"preferred", &v1.PlacementHints{Preferred: []v1.TopologySegment{{NodeName: "n9"}, {NodeName: "n2"}}}, all, "n2", codes.OK},
		{"requisite narrows", &v1.PlacementHints{Requisite: []v1.TopologySegment{{NodeName: "n3"}}, Preferred: []v1.TopologySegment{{NodeName: "n2"}}}, all, "n3", codes.OK},
		{"requisite without preferred", &v1.PlacementHints{Requisite: []v1.TopologySegment{{NodeName: "n9"}, {NodeName: "n3"}}}, all, "n3", codes.OK},
		// A strict-topology provisioner asks for the scheduler's node alone.
		{"no copy in the requisite topology", &v1.PlacementHints{Requisite: []v1.TopologySegment{{NodeName: "n7"}}, Preferred: []v1.TopologySegment{{NodeName: "n7"}}}, all, "n1", codes.OK},
		{"the first copy's node is lost", nil, map[string]bool{"n2": true, "n3": true}, "n2", codes.OK},
		{"the preferred copy's node is lost", &v1.PlacementHints{Preferred: []v1.TopologySegment{{NodeName: "n2"}}}, map[string]bool{"n1": true, "n3": true}, "n1", codes.OK},
		{"every copy on a lost node", nil, map[string]bool{"n7": true}, "", codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := seedNode(snap, tc.hints, tc.live)
			if status.Code(err) != tc.code || got != tc.want {
				t.Fatalf("got %q, %v; want %q, %s", got, err, tc.want, tc.code)
			}
		})
	}
}

func TestContentSource(t *testing.T) {
	for _, tc := range []struct {
		name string
		cs   *csipb.VolumeContentSource
		want *contentSourceRequest
		code codes.Code
	}{
		{"none", nil, nil, codes.OK},
		{"snapshot", &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: "s"}}}, &contentSourceRequest{snapshot: "s"}, codes.OK},
		{"volume", &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Volume{Volume: &csipb.VolumeContentSource_VolumeSource{VolumeId: "v"}}}, &contentSourceRequest{volume: "v"}, codes.OK},
		{"snapshot without id", &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{}}}, nil, codes.InvalidArgument},
		{"empty", &csipb.VolumeContentSource{}, nil, codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := contentSource(tc.cs)
			if status.Code(err) != tc.code || (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
				t.Fatalf("got %+v, %v; want %+v, %s", got, err, tc.want, tc.code)
			}
		})
	}
}
