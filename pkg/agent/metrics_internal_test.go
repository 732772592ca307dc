package agent

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshvol/meshvol/internal/metricstest"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// metricsNode is node-a of a 2D+1TB volume whose other Diskful, on node-b, is lost
// while a replacement on node-d resyncs from node-a; a replica of a second volume is
// placed on node-a but not a member yet.
func metricsNode() ([]v1.ReplicatedVolumeReplica, map[string]*v1.ReplicatedVolume) {
	yes := true
	rv := &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: "vol"}, Status: v1.ReplicatedVolumeStatus{
		DatameshRevision: 9,
		Datamesh: v1.Datamesh{Members: []v1.DatameshMember{
			{Name: "vol-node-a", Type: v1.MemberTypeDiskful, NodeName: "node-a"},
		}},
	}}
	rvrs := []v1.ReplicatedVolumeReplica{{
		ObjectMeta: metav1.ObjectMeta{Name: "vol-node-a"},
		Spec:       v1.ReplicatedVolumeReplicaSpec{ReplicatedVolumeName: "vol", NodeName: "node-a", Type: v1.ReplicaTypeDiskful},
		Status: v1.ReplicatedVolumeReplicaStatus{DatameshRevision: 8, DiskState: v1.DiskStateUpToDate, Role: v1.RolePrimary, Quorum: &yes,
			Peers: []v1.PeerStatus{
				{Name: "vol-node-b", ConnectionState: "Connecting"},
				{Name: "vol-node-c", ConnectionState: "Connected", ReplicationState: "Established", PeerDiskState: v1.DiskStateDiskless},
				{Name: "vol-node-d", ConnectionState: "Connected", ReplicationState: "SyncSource",
					Resync: &v1.ResyncProgress{PercentDone: 25, OutOfSyncBytes: 48 << 20}},
			}},
	}, {
		ObjectMeta: metav1.ObjectMeta{Name: "new-node-a"},
		Spec:       v1.ReplicatedVolumeReplicaSpec{ReplicatedVolumeName: "new", NodeName: "node-a", Type: v1.ReplicaTypeDiskful},
	}}
	return rvrs, map[string]*v1.ReplicatedVolume{"vol": rv, "new": nil}
}

func testCollector() *nodeCollector {
	pools := &poolStats{}
	pools.set("pool", 10<<30, 4<<30)
	return newNodeCollector("node-a", func(context.Context) ([]v1.ReplicatedVolumeReplica, map[string]*v1.ReplicatedVolume, error) {
		rvrs, rvs := metricsNode()
		return rvrs, rvs, nil
	}, pools, nil)
}

func TestNodeCollectorSeries(t *testing.T) {
	c := testCollector()
	want := `
# HELP meshvol_agent_peer_connection_state DRBD connection state of the replica to the peer on peer_node: 1 for the current state.
# TYPE meshvol_agent_peer_connection_state gauge
meshvol_agent_peer_connection_state{node="node-a",peer_node="node-b",state="Connecting",volume="vol"} 1
meshvol_agent_peer_connection_state{node="node-a",peer_node="node-c",state="Connected",volume="vol"} 1
meshvol_agent_peer_connection_state{node="node-a",peer_node="node-d",state="Connected",volume="vol"} 1
# HELP meshvol_agent_peer_out_of_sync_bytes Bytes still to resynchronise with the peer while a resync runs, 0 when connected and in sync; absent when unknown.
# TYPE meshvol_agent_peer_out_of_sync_bytes gauge
meshvol_agent_peer_out_of_sync_bytes{node="node-a",peer_node="node-c",volume="vol"} 0
meshvol_agent_peer_out_of_sync_bytes{node="node-a",peer_node="node-d",volume="vol"} 5.0331648e+07
# HELP meshvol_agent_peer_resync_progress_ratio Share of the device in sync with the peer while a resync runs, 0 to 1.
# TYPE meshvol_agent_peer_resync_progress_ratio gauge
meshvol_agent_peer_resync_progress_ratio{node="node-a",peer_node="node-d",volume="vol"} 0.25
# HELP meshvol_agent_pool_capacity_bytes Size of the storage pool on this node.
# TYPE meshvol_agent_pool_capacity_bytes gauge
meshvol_agent_pool_capacity_bytes{node="node-a",pool="pool"} 1.073741824e+10
# HELP meshvol_agent_pool_free_bytes Bytes of the storage pool on this node that can still be allocated.
# TYPE meshvol_agent_pool_free_bytes gauge
meshvol_agent_pool_free_bytes{node="node-a",pool="pool"} 4.294967296e+09
# HELP meshvol_agent_replica_quorum 1 when the replica's DRBD has quorum, 0 when not; absent before DRBD reports it.
# TYPE meshvol_agent_replica_quorum gauge
meshvol_agent_replica_quorum{node="node-a",volume="vol"} 1
# HELP meshvol_agent_replica_revision_current 1 when DRBD on this node runs the volume's current datamesh revision, 0 while the agent has not applied it.
# TYPE meshvol_agent_replica_revision_current gauge
meshvol_agent_replica_revision_current{node="node-a",volume="vol"} 0
# HELP meshvol_agent_replicas Replicas on this node by datamesh member type (NotInDatamesh for a replica that is not a member).
# TYPE meshvol_agent_replicas gauge
meshvol_agent_replicas{node="node-a",type="Diskful"} 1
meshvol_agent_replicas{node="node-a",type="NotInDatamesh"} 1
`
	names := []string{"meshvol_agent_peer_connection_state", "meshvol_agent_peer_out_of_sync_bytes", "meshvol_agent_peer_resync_progress_ratio",
		"meshvol_agent_pool_capacity_bytes", "meshvol_agent_pool_free_bytes", "meshvol_agent_replica_quorum",
		"meshvol_agent_replica_revision_current", "meshvol_agent_replicas"}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	// Enumerations: every value, 1 for the current one only.
	if n := testutil.CollectAndCount(c, "meshvol_agent_replica_disk_state"); n != 2*len(diskStates) {
		t.Errorf("disk state series: %d, want %d", n, 2*len(diskStates))
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	series, _ := metricstest.Series(t, reg, "meshvol_agent_replica_")
	var current []string
	for key, v := range series {
		if v == 1 && (strings.HasPrefix(key, "meshvol_agent_replica_role{") || strings.HasPrefix(key, "meshvol_agent_replica_disk_state{")) {
			current = append(current, key)
		}
	}
	slices.Sort(current)
	// One current value each for the member; none for the replica not a member yet.
	if want := []string{"meshvol_agent_replica_disk_state{node=node-a,state=UpToDate,volume=vol}",
		"meshvol_agent_replica_role{node=node-a,role=Primary,volume=vol}"}; !slices.Equal(current, want) {
		t.Errorf("current role and disk state: %v, want %v", current, want)
	}
}

// TestNodeCollectorLint: the names, units and help texts pass client_golang's
// linter (promlint, the rules `promtool check metrics` applies).
func TestNodeCollectorLint(t *testing.T) {
	observeCommand("adjust", time.Now(), nil)
	observeCommand("adjust", time.Now(), errors.New("exit 10"))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(testCollector(), drbdCommandSeconds, drbdCommandFailures)
	metricstest.Lint(t, reg)
}

// TestNodeCollectorSourceError: a cache that cannot answer yields no replica series
// (and no wrong count), the pools still.
func TestNodeCollectorSourceError(t *testing.T) {
	var reported error
	c := newNodeCollector("node-a", func(context.Context) ([]v1.ReplicatedVolumeReplica, map[string]*v1.ReplicatedVolume, error) {
		return nil, nil, errors.New("cache not started")
	}, &poolStats{}, func(err error) { reported = err })
	c.pools.set("pool", 1, 1)
	if n := testutil.CollectAndCount(c); n != 2 || reported == nil {
		t.Errorf("%d series, error reported %v; want the 2 pool series and the error", n, reported)
	}
}
