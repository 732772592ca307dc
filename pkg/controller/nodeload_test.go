package controller

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/placement"
)

// Placement's node counts, kept from the cache's events, equal at every step what a
// list of each node's replicas and of the volumes' sizes gives (what placementNodes
// read per placement before): replicas seen before their volume, a backing volume
// reported, a deletion mark, an expansion, a replica placed after it was created, a
// deletion, and the same event twice.
func TestNodeLoadsMatchTheReplicas(t *testing.T) {
	l := newNodeLoads()
	replicas := map[string]*v1.ReplicatedVolumeReplica{}
	sizes := map[string]int64{}
	check := func(step string) {
		t.Helper()
		for _, node := range []string{"a", "b", "c"} {
			for _, pool := range []string{"p", "q"} {
				wantN, wantB := 0, int64(0)
				for _, r := range replicas {
					if r.Spec.NodeName != node {
						continue
					}
					wantN++
					if r.Spec.Type == v1.ReplicaTypeDiskful && r.Status.BackingVolume == nil && r.DeletionTimestamp == nil &&
						r.Spec.Storage != nil && r.Spec.Storage.Pool == pool {
						wantB += placement.BackingBytes(sizes[r.Spec.ReplicatedVolumeName])
					}
				}
				if n, b := l.load(node, pool); n != wantN || b != wantB {
					t.Fatalf("%s: node %s pool %s: counted %d replicas, %d unbacked bytes; the replicas give %d, %d", step, node, pool, n, b, wantN, wantB)
				}
			}
		}
		for name, r := range replicas {
			if seen, deleting := l.seen(name); !seen || deleting != (r.DeletionTimestamp != nil) {
				t.Fatalf("%s: replica %s seen=%v deleting=%v", step, name, seen, deleting)
			}
		}
	}
	set := func(name, volume, node string, typ v1.ReplicaType, pool string) *v1.ReplicatedVolumeReplica {
		r := &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1.ReplicatedVolumeReplicaSpec{ReplicatedVolumeName: volume, NodeName: node, Type: typ}}
		if pool != "" {
			r.Spec.Storage = &v1.ReplicaStorage{Pool: pool}
		}
		replicas[name] = r
		l.setReplica(r)
		return r
	}
	volume := func(name, size string) {
		q := resource.MustParse(size)
		sizes[name] = q.Value()
		l.setVolume(name, sizes[name])
	}

	x1 := set("x-a", "x", "a", v1.ReplicaTypeDiskful, "p")
	check("a replica before its volume")
	volume("x", "1Gi")
	check("its volume")
	set("x-b", "x", "b", v1.ReplicaTypeDiskful, "p")
	set("x-c", "x", "c", v1.ReplicaTypeTieBreaker, "")
	volume("y", "10Gi")
	set("y-a", "y", "a", v1.ReplicaTypeDiskful, "q")
	y2 := set("y-b", "y", "", v1.ReplicaTypeDiskful, "q")
	check("two volumes, one replica not placed")
	y2.Spec.NodeName = "b"
	l.setReplica(y2)
	l.setReplica(y2)
	check("placed, the event twice")
	x1.Status.BackingVolume = &v1.BackingVolumeStatus{}
	l.setReplica(x1)
	check("a backing volume reported")
	volume("y", "20Gi")
	check("an expansion")
	now := metav1.Now()
	y2.DeletionTimestamp = &now
	l.setReplica(y2)
	check("a deletion mark")
	delete(replicas, "y-b")
	l.deleteReplica("y-b")
	if seen, _ := l.seen("y-b"); seen {
		t.Fatal("a deleted replica is still seen")
	}
	check("the replica deleted")
	delete(sizes, "y")
	l.deleteVolume("y")
	check("a volume deleted before its replica")
	for name := range replicas {
		l.deleteReplica(name)
	}
	replicas = map[string]*v1.ReplicatedVolumeReplica{}
	check("every replica deleted")
	if len(l.nodes) != 0 || len(l.unbacked) != 0 {
		t.Fatalf("counts left for nothing: nodes %v, unbacked %v", l.nodes, l.unbacked)
	}
}
