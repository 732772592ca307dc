package controller

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/placement"
)

// A Diskful that replaces a failed disk (datamesh.WantedReplica.Replaces) goes where the
// zone rules want the failed one's copy: in TransZonal 3D, to the failed replica's zone,
// not next to a healthy one, where the zone guards would then hold the failed one's
// removal for ever (docs/datamesh.md, "A disk that fails after formation"). The failed
// replica's own node stays taken.
func TestReplacementOfAFailedDiskFillsItsZone(t *testing.T) {
	rv := &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: "vol"}}
	v := &volume{rv: rv}
	for _, n := range []string{"a1", "b1", "c1"} {
		r := &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: v1.ReplicaName("vol", n)}}
		r.Spec.NodeName, r.Spec.Type = n, v1.ReplicaTypeDiskful
		v.rvrs = append(v.rvrs, r)
	}
	node := func(name, zone string) placement.Node {
		return placement.Node{Name: name, Zone: zone, InPool: true, PoolReady: true, AgentLive: true, HMACOK: true, Free: 100 << 30, HasFree: true}
	}
	nodes := []placement.Node{node("a1", "a"), node("a2", "a"), node("b1", "b"), node("b2", "b"), node("c1", "c")}
	in := placement.Input{Config: v1.ReplicatedVolumeConfiguration{StoragePool: "p", FailuresToTolerate: 1, GuaranteedMinimumDataRedundancy: 1,
		Topology: v1.TopologyTransZonal, VolumeAccess: v1.VolumeAccessPreferablyLocal}, Size: resource.MustParse("1Gi"), Diskful: 1, Nodes: nodes}
	in.Existing = existingReplicas(v, []string{v1.ReplicaName("vol", "b1")})
	got, err := placement.Place(in)
	if err != nil || len(got) != 1 || got[0].Node != "b2" {
		t.Fatalf("replacing b1's failed disk: placed %+v (%v), want b2", got, err)
	}
}
