package controller

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshvol/meshvol/internal/metricstest"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// stateFixture: "deg", a 2D+1TB volume whose Diskful member on node b is lost
// (AgentReady=False, its Lease expired past the grace period) while an AddReplica
// waits in its second step; "ok", a Ready 1D volume; "new", a volume the
// controller has not judged yet. Node c holds a TieBreaker and a live Lease.
func stateFixture(now time.Time) stateSnapshot {
	yes := true
	cfg := func(ftt, gmdr int32) *v1.ReplicatedVolumeConfiguration {
		return &v1.ReplicatedVolumeConfiguration{StoragePool: "p", FailuresToTolerate: ftt, GuaranteedMinimumDataRedundancy: gmdr}
	}
	at := func(ago time.Duration) *metav1.Time { t := metav1.NewTime(now.Add(-ago)); return &t }
	deg := v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: "deg"}, Status: v1.ReplicatedVolumeStatus{
		Phase: v1.VolumePhaseDegraded, Configuration: cfg(1, 0), EffectiveLayout: &v1.Layout{FailuresToTolerate: 1},
		Datamesh: v1.Datamesh{Members: []v1.DatameshMember{
			{Name: "deg-a", NodeName: "a", Type: v1.MemberTypeDiskful}, {Name: "deg-b", NodeName: "b", Type: v1.MemberTypeDiskful},
			{Name: "deg-c", NodeName: "c", Type: v1.MemberTypeTieBreaker}}},
		DatameshTransitions: []v1.DatameshTransition{
			{Type: v1.TransitionAddReplica, ReplicaName: "deg-d", Steps: []v1.DatameshTransitionStep{
				{Status: v1.StepCompleted, StartedAt: at(10 * time.Minute)}, {Status: v1.StepActive, StartedAt: at(90 * time.Second)}}},
			{Type: v1.TransitionAddReplica, ReplicaName: "deg-e", Steps: []v1.DatameshTransitionStep{{Status: v1.StepActive, StartedAt: at(30 * time.Second)}}},
		}}}
	ok := v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: "ok"}, Status: v1.ReplicatedVolumeStatus{
		Phase: v1.VolumePhaseReady, Configuration: cfg(0, 0), EffectiveLayout: &v1.Layout{},
		Datamesh: v1.Datamesh{Members: []v1.DatameshMember{{Name: "ok-a", NodeName: "a", Type: v1.MemberTypeDiskful}}}}}
	rvr := func(vol, node string, disk v1.DiskState) v1.ReplicatedVolumeReplica {
		return v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: vol + "-" + node},
			Spec:   v1.ReplicatedVolumeReplicaSpec{ReplicatedVolumeName: vol, NodeName: node},
			Status: v1.ReplicatedVolumeReplicaStatus{DiskState: disk, Quorum: &yes}}
	}
	lostB := rvr("deg", "b", v1.DiskStateUpToDate)
	lostB.Status.Conditions = []metav1.Condition{{Type: v1.ConditionAgentReady, Status: metav1.ConditionFalse}}
	lease := func(node string, renewedAgo time.Duration) coordinationv1.Lease {
		d := int32(10)
		return coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: v1.AgentLeasePrefix + node},
			Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: &d, RenewTime: &metav1.MicroTime{Time: now.Add(-renewedAgo)}}}
	}
	return stateSnapshot{
		rvs:    []v1.ReplicatedVolume{deg, ok, {ObjectMeta: metav1.ObjectMeta{Name: "new"}}},
		rvrs:   []v1.ReplicatedVolumeReplica{rvr("deg", "a", v1.DiskStateUpToDate), lostB, rvr("deg", "c", v1.DiskStateDiskless), rvr("ok", "a", v1.DiskStateUpToDate), rvr("ok", "z", v1.DiskStateDiskless)},
		leases: []coordinationv1.Lease{lease("a", time.Second), lease("b", time.Minute), lease("c", 15*time.Second), {ObjectMeta: metav1.ObjectMeta{Name: "meshvol-controller"}}},
	}
}

func TestStateCollector(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	col := newStateCollector(func(context.Context) (stateSnapshot, error) { return stateFixture(now), nil },
		func() time.Time { return now }, 10*time.Second, nil)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	want := `
# HELP meshvol_controller_volume_diskful_up_to_date Diskful members of the volume that are UpToDate and whose agent reports (AgentReady not False).
# TYPE meshvol_controller_volume_diskful_up_to_date gauge
meshvol_controller_volume_diskful_up_to_date{volume="deg"} 1
meshvol_controller_volume_diskful_up_to_date{volume="ok"} 1
# HELP meshvol_controller_volume_diskful_wanted Diskful members the volume's configured layout wants.
# TYPE meshvol_controller_volume_diskful_wanted gauge
meshvol_controller_volume_diskful_wanted{volume="deg"} 2
meshvol_controller_volume_diskful_wanted{volume="ok"} 1
# HELP meshvol_controller_volume_transition_step_wait_seconds How long the active step of the volume's transition of this type has waited (the longest, when several run).
# TYPE meshvol_controller_volume_transition_step_wait_seconds gauge
meshvol_controller_volume_transition_step_wait_seconds{type="AddReplica",volume="deg"} 90
# HELP meshvol_controller_nodes Nodes with an agent Lease or a replica, by the agent's state: Live, Expired (within the grace period) or Lost.
# TYPE meshvol_controller_nodes gauge
meshvol_controller_nodes{state="Expired"} 1
meshvol_controller_nodes{state="Live"} 1
meshvol_controller_nodes{state="Lost"} 2
# HELP meshvol_controller_volumes_by_layout Volumes by configured layout and by the layout the datamesh provides now (status.effectiveLayout, "none" before it forms).
# TYPE meshvol_controller_volumes_by_layout gauge
meshvol_controller_volumes_by_layout{configured="1D",effective="1D"} 1
meshvol_controller_volumes_by_layout{configured="2D+1TB",effective="2D+1TB"} 1
meshvol_controller_volumes_by_layout{configured="none",effective="none"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "meshvol_controller_volume_diskful_up_to_date",
		"meshvol_controller_volume_diskful_wanted", "meshvol_controller_volume_transition_step_wait_seconds",
		"meshvol_controller_nodes", "meshvol_controller_volumes_by_layout"); err != nil {
		t.Error(err)
	}
	got, _ := metricstest.Series(t, reg, "")
	for series, v := range map[string]float64{
		"meshvol_controller_volumes{phase=Degraded}":                                               1,
		"meshvol_controller_volumes{phase=Pending}":                                                1,
		"meshvol_controller_volumes{phase=Failed}":                                                 0,
		"meshvol_controller_volume_phase{phase=Degraded,volume=deg}":                               1,
		"meshvol_controller_volume_phase{phase=Ready,volume=deg}":                                  0,
		"meshvol_controller_transitions{type=AddReplica}":                                          2,
		"meshvol_controller_transitions{type=Attach}":                                              0,
		"meshvol_controller_volume_failures_to_tolerate{layout=configured,volume=deg}":             1,
		"meshvol_controller_volume_quorum{volume=deg}":                                             1,
		"meshvol_controller_node_agent_state{node=b,state=Lost}":                                   1,
		"meshvol_controller_node_agent_state{node=z,state=Lost}":                                   1,
		"meshvol_controller_node_agent_state{node=c,state=Expired}":                                1,
		"meshvol_controller_volume_guaranteed_minimum_data_redundancy{layout=effective,volume=ok}": 0,
	} {
		if g, ok := got[series]; !ok || g != v {
			t.Errorf("%s = %v (exported %v), want %v", series, g, ok, v)
		}
	}
	if _, ok := got["meshvol_controller_volume_quorum{volume=new}"]; ok {
		t.Error("a volume without a quorum report exports a quorum")
	}
	metricstest.Lint(t, reg)
}

// TestStateCollectorUnsynced: a cache that cannot answer yields no series, not
// zeros that would read as "no volume is degraded".
func TestStateCollectorUnsynced(t *testing.T) {
	var reported error
	col := newStateCollector(func(context.Context) (stateSnapshot, error) { return stateSnapshot{}, errors.New("cache not synced") },
		time.Now, 10*time.Second, func(err error) { reported = err })
	if n := testutil.CollectAndCount(col); n != 0 || reported == nil {
		t.Errorf("unsynced cache: %d series, error reported: %v", n, reported)
	}
}
