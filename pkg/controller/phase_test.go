package controller

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

func TestComputePhase(t *testing.T) {
	yes, no := true, false
	cfg := &v1.ReplicatedVolumeConfiguration{StoragePool: "p", FailuresToTolerate: 1, GuaranteedMinimumDataRedundancy: 1}
	members := []v1.DatameshMember{{Name: "r1", Type: v1.MemberTypeDiskful}, {Name: "r2", Type: v1.MemberTypeDiskful}, {Name: "r3", Type: v1.MemberTypeDiskful}}
	rvr := func(name string, disk v1.DiskState, quorum *bool) *v1.ReplicatedVolumeReplica {
		return &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1.ReplicatedVolumeReplicaStatus{DiskState: disk, Quorum: quorum}}
	}
	syncing := rvr("r3", v1.DiskStateInconsistent, &yes)
	syncing.Status.Peers = []v1.PeerStatus{{Name: "r1", ConnectionState: "Connected", Resync: &v1.ResyncProgress{PercentDone: 40}}}
	silent := rvr("r2", v1.DiskStateUpToDate, &yes)
	silent.Status.Conditions = []metav1.Condition{{Type: v1.ConditionAgentReady, Status: metav1.ConditionFalse}}
	formed := func(trans ...v1.DatameshTransition) *v1.ReplicatedVolume {
		rv := &v1.ReplicatedVolume{}
		rv.Status.Configuration = cfg
		rv.Status.DatameshRevision = 3
		rv.Status.Datamesh.Members = members
		rv.Status.DatameshTransitions = trans
		return rv
	}
	deleting := formed()
	deleting.DeletionTimestamp = &metav1.Time{}
	forming := &v1.ReplicatedVolume{}
	forming.Status.Configuration = cfg
	forming.Status.DatameshTransitions = []v1.DatameshTransition{{Type: v1.TransitionFormation, Steps: []v1.DatameshTransitionStep{{Name: "✦ → layout", Status: v1.StepActive, Message: "Waiting for replicas"}}}}

	for _, tc := range []struct {
		name  string
		rv    *v1.ReplicatedVolume
		rvrs  []*v1.ReplicatedVolumeReplica
		phase v1.VolumePhase
		msg   string
	}{
		{"no configuration", &v1.ReplicatedVolume{}, nil, v1.VolumePhasePending, "Waiting"},
		{"deleting wins", deleting, nil, v1.VolumePhaseDeleting, "being deleted"},
		{"forming", forming, nil, v1.VolumePhaseForming, "✦ → layout: Waiting for replicas"},
		{"ready", formed(), []*v1.ReplicatedVolumeReplica{rvr("r1", v1.DiskStateUpToDate, &yes), rvr("r2", v1.DiskStateUpToDate, &yes), rvr("r3", v1.DiskStateUpToDate, &yes)},
			v1.VolumePhaseReady, "3/3 Diskful UpToDate (layout 3D)"},
		{"degraded: syncing", formed(), []*v1.ReplicatedVolumeReplica{rvr("r1", v1.DiskStateUpToDate, &yes), rvr("r2", v1.DiskStateUpToDate, &yes), syncing},
			v1.VolumePhaseDegraded, "2/3 Diskful UpToDate (layout 3D): r3: Inconsistent (syncing 40%)"},
		{"degraded: agent silent", formed(), []*v1.ReplicatedVolumeReplica{rvr("r1", v1.DiskStateUpToDate, &yes), silent, rvr("r3", v1.DiskStateUpToDate, &yes)},
			v1.VolumePhaseDegraded, "r2: agent on  is not reporting"},
		{"failed: no quorum", formed(), []*v1.ReplicatedVolumeReplica{rvr("r1", v1.DiskStateUpToDate, &no), rvr("r2", v1.DiskStateOutdated, &no), rvr("r3", v1.DiskStateOutdated, &no)},
			v1.VolumePhaseFailed, "No replica has quorum"},
		{"failed: no UpToDate copy", formed(), []*v1.ReplicatedVolumeReplica{rvr("r1", v1.DiskStateOutdated, &yes), rvr("r2", v1.DiskStateOutdated, &yes), rvr("r3", v1.DiskStateInconsistent, &yes)},
			v1.VolumePhaseFailed, "No UpToDate Diskful copy is reachable"},
		{"reconfiguring", formed(v1.DatameshTransition{Type: v1.TransitionAddReplica, ReplicaName: "r4"}),
			[]*v1.ReplicatedVolumeReplica{rvr("r1", v1.DiskStateUpToDate, &yes), rvr("r2", v1.DiskStateUpToDate, &yes), rvr("r3", v1.DiskStateUpToDate, &yes)},
			v1.VolumePhaseReconfiguring, "In flight: AddReplica r4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			byName := map[string]*v1.ReplicatedVolumeReplica{}
			for _, r := range tc.rvrs {
				byName[r.Name] = r
			}
			got := ComputePhase(tc.rv, byName, reportingAgent, "")
			if got.Phase != tc.phase || !strings.Contains(got.Message, tc.msg) {
				t.Errorf("got %s %q, want %s containing %q", got.Phase, got.Message, tc.phase, tc.msg)
			}
			// Formed: every volume with a published revision, members and no Formation
			// in flight, whatever its health or deletion; else the phase's own words.
			wantFormed := tc.rv.Status.DatameshRevision > 0
			ok, reason, msg := Formed(&tc.rv.Status, got)
			if ok != wantFormed {
				t.Errorf("Formed = %v (%s: %s), want %v", ok, reason, msg, wantFormed)
			}
			if !ok && (reason != string(got.Phase) || msg != got.Message) {
				t.Errorf("not formed: %s %q, want the phase's %s %q", reason, msg, got.Phase, got.Message)
			}
		})
	}
}

// After a confirmed loss, 2D+1TB's lone survivor writes with q=1 (the engine's
// quorumAfterForceRemoval, docs/layouts.md): the FaultTolerance condition says what
// that trades and when it ends; with the layout whole it says so too.
func TestFaultTolerance(t *testing.T) {
	cfg := &v1.ReplicatedVolumeConfiguration{FailuresToTolerate: 1, GuaranteedMinimumDataRedundancy: 0}
	st := func(effFTT int32, q int32, members ...v1.DatameshMember) *v1.ReplicatedVolumeStatus {
		s := &v1.ReplicatedVolumeStatus{Configuration: cfg, EffectiveLayout: &v1.Layout{FailuresToTolerate: effFTT}}
		s.Datamesh.Members = members
		s.Datamesh.Quorum, s.Datamesh.QuorumMinimumRedundancy = q, 1
		return s
	}
	d := func(n string) v1.DatameshMember { return v1.DatameshMember{Name: n, Type: v1.MemberTypeDiskful} }
	tb := v1.DatameshMember{Name: "r3", Type: v1.MemberTypeTieBreaker}

	ok, reason, msg := FaultTolerance(st(0, 1, d("r1"), tb))
	if ok || reason != ReasonBelowConfiguration {
		t.Fatalf("lone survivor: got %v %s, want False %s", ok, reason, ReasonBelowConfiguration)
	}
	for _, want := range []string{"FTT=0, GMDR=0 where the configuration asks for FTT=1, GMDR=0", "1 Diskful voter(s) + 1 TieBreaker, q=1",
		"one more failure stops IO", "the one Diskful holds the only copy", "Restored when the layout's 2D+1TB members have joined again"} {
		if !strings.Contains(msg, want) {
			t.Errorf("lone survivor: message %q does not say %q", msg, want)
		}
	}
	ok, reason, msg = FaultTolerance(st(1, 2, d("r1"), d("r2"), tb))
	if !ok || reason != ReasonAsConfigured || !strings.Contains(msg, "as configured (2 Diskful voter(s) + 1 TieBreaker, q=2") {
		t.Errorf("whole layout: got %v %s %q", ok, reason, msg)
	}
	if _, reason, _ = FaultTolerance(&v1.ReplicatedVolumeStatus{Configuration: cfg}); reason != "" {
		t.Errorf("not formed: got reason %q, want none", reason)
	}
}

// A Diskful member whose disk failed after formation: the Ready condition says whether
// the engine replaces it (datamesh.FailedDisk) and, when not, why; a Warning event says
// so once, when the condition first does (docs/datamesh.md, "A disk that fails after
// formation").
func TestFailedDiskInTheReadyCondition(t *testing.T) {
	yes := true
	cfg := &v1.ReplicatedVolumeConfiguration{StoragePool: "p", FailuresToTolerate: 0, GuaranteedMinimumDataRedundancy: 1}
	rvr := func(name string, disk v1.DiskState, peers ...string) *v1.ReplicatedVolumeReplica {
		r := &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:   v1.ReplicatedVolumeReplicaSpec{Type: v1.ReplicaTypeDiskful},
			Status: v1.ReplicatedVolumeReplicaStatus{DiskState: disk, Quorum: &yes, DatameshRevision: 3}}
		for _, p := range peers {
			r.Status.Peers = append(r.Status.Peers, v1.PeerStatus{Name: p, ConnectionState: "Connected"})
		}
		return r
	}
	formed := func() *v1.ReplicatedVolume {
		rv := &v1.ReplicatedVolume{}
		rv.Status.Configuration = cfg
		rv.Status.DatameshRevision = 3
		rv.Status.Datamesh.Members = []v1.DatameshMember{{Name: "r1", Type: v1.MemberTypeDiskful, NodeName: "n1"}, {Name: "r2", Type: v1.MemberTypeDiskful, NodeName: "n2"}}
		return rv
	}
	byName := func(rs ...*v1.ReplicatedVolumeReplica) map[string]*v1.ReplicatedVolumeReplica {
		m := map[string]*v1.ReplicatedVolumeReplica{}
		for _, r := range rs {
			m[r.Name] = r
		}
		return m
	}
	unscheduled := formed()
	unscheduled.Status.Conditions = []metav1.Condition{{Type: v1.ConditionScheduled, Status: metav1.ConditionFalse, Reason: "NotEnoughNodes", Message: "No node fits: need 1 Diskful replica(s)"}}
	deleted := rvr("r2", v1.DiskStateDiskless, "r1")
	deleted.DeletionTimestamp = &metav1.Time{}
	for _, tc := range []struct {
		name  string
		rv    *v1.ReplicatedVolume
		rvrs  map[string]*v1.ReplicatedVolumeReplica
		phase v1.VolumePhase
		msg   string
	}{
		{"replaced", formed(), byName(rvr("r1", v1.DiskStateUpToDate), rvr("r2", v1.DiskStateDiskless, "r1")),
			v1.VolumePhaseDegraded, "1/2 Diskful UpToDate (layout 2D): r2: Diskless (its disk failed: replacing it)"},
		{"replaced, being deleted", formed(), byName(rvr("r1", v1.DiskStateUpToDate), deleted),
			v1.VolumePhaseDegraded, "r2: Diskless (its disk failed: replacing it)"},
		{"no node for the replacement", unscheduled, byName(rvr("r1", v1.DiskStateUpToDate), rvr("r2", v1.DiskStateFailed, "r1")),
			v1.VolumePhaseDegraded, "r2: Failed (its disk failed: replacing it once a node fits: No node fits: need 1 Diskful replica(s))"},
		{"the last current copy", formed(), byName(rvr("r1", v1.DiskStateOutdated), rvr("r2", v1.DiskStateDiskless, "r1")),
			v1.VolumePhaseFailed, "No UpToDate Diskful copy is reachable: r1: Outdated; r2: Diskless " + lastCopyDiskNote},
		{"the UpToDate copy is cut off from it", formed(), byName(rvr("r1", v1.DiskStateUpToDate), rvr("r2", v1.DiskStateDiskless)),
			v1.VolumePhaseDegraded, "r2: Diskless " + lastCopyDiskNote},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ComputePhase(tc.rv, tc.rvrs, reportingAgent, "")
			if got.Phase != tc.phase || !strings.HasSuffix(got.Message, tc.msg) {
				t.Errorf("got %s %q, want %s ending %q", got.Phase, got.Message, tc.phase, tc.msg)
			}
			// One event, when the condition first says the disk is not replaced.
			old, work := tc.rv.DeepCopy(), tc.rv.DeepCopy()
			work.Status.Conditions = []metav1.Condition{{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: string(got.Phase), Message: got.Message}}
			events := lastCopyDiskEvents(old, work, tc.rvrs)
			wantEvents := 0
			if strings.Contains(tc.msg, lastCopyDiskNote) {
				wantEvents = 1
			}
			if len(events) != wantEvents || wantEvents == 1 && (events[0].Reason != EventDiskFailedNotReplaced || !strings.Contains(events[0].Message, "The disk of r2 on node n2 failed")) {
				t.Errorf("events %+v, want %d %s", events, wantEvents, EventDiskFailedNotReplaced)
			}
			if again := lastCopyDiskEvents(work, work, tc.rvrs); len(again) != 0 {
				t.Errorf("the condition already said it, yet events %+v", again)
			}
		})
	}
}
