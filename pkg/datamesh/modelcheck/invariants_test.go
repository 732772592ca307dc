package modelcheck

import (
	"testing"

	"github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func status(q, qmr int32, eff *v1alpha1.Layout, types ...v1alpha1.MemberType) *v1alpha1.ReplicatedVolumeStatus {
	st := &v1alpha1.ReplicatedVolumeStatus{EffectiveLayout: eff, DatameshRevision: 1}
	st.Datamesh.Quorum, st.Datamesh.QuorumMinimumRedundancy = q, qmr
	for i, t := range types {
		st.Datamesh.Members = append(st.Datamesh.Members, v1alpha1.DatameshMember{
			Name: string(rune('a' + i)), Type: t, NodeID: int32(i)})
	}
	return st
}

func has(vs []Violation, inv string) bool {
	for _, v := range vs {
		if v.Invariant == inv {
			return true
		}
	}
	return false
}

func TestRequiredQ(t *testing.T) {
	for _, tc := range []struct {
		voters    int
		ftt, gmdr int32
		want      int32
	}{
		{1, 0, 0, 1}, {2, 0, 1, 2}, {2, 1, 0, 2}, {3, 1, 1, 2}, {4, 2, 1, 3}, {5, 2, 2, 3},
		{4, 1, 1, 3}, // 4 voters of a 3D layout mid-transition: majority 3
		{2, 1, 1, 2}, // 3D short of a voter (force removal): the floor ⌊3/2⌋+1 holds q at 2
		{3, 2, 2, 3}, // 5D down to 3 voters: floor 3 — all three must agree
	} {
		if got := RequiredQ(tc.voters, v1alpha1.Layout{FailuresToTolerate: tc.ftt, GuaranteedMinimumDataRedundancy: tc.gmdr}); got != tc.want {
			t.Errorf("RequiredQ(%d, %d/%d) = %d, want %d", tc.voters, tc.ftt, tc.gmdr, got, tc.want)
		}
	}
}

func TestCheckStatus(t *testing.T) {
	eff := &v1alpha1.Layout{FailuresToTolerate: 1, GuaranteedMinimumDataRedundancy: 1}
	ok := status(2, 2, eff, tD, tD, tD)
	if vs := CheckStatus(nil, ok); len(vs) != 0 {
		t.Fatalf("3D q=2 qmr=2: %v", vs)
	}
	if !has(CheckStatus(nil, status(1, 2, eff, tD, tD, tD)), InvQuorumFloor) {
		t.Error("q=1 for 3D not reported")
	}
	if !has(CheckStatus(nil, status(2, 1, eff, tD, tD, tD)), InvQuorumFloor) {
		t.Error("qmr=1 for GMDR 1 not reported")
	}
	if !has(CheckStatus(nil, status(2, 2, nil, tD, tD, tD)), InvQuorumFloor) {
		t.Error("members without an effective layout not reported")
	}
	dup := status(2, 2, eff, tD, tD, tD)
	dup.Datamesh.Members[2].NodeID = 0
	if !has(CheckStatus(nil, dup), InvNodeID) {
		t.Error("duplicate node-id not reported")
	}
	two := status(2, 2, eff, tD, tD, tD)
	two.Datamesh.Members[0].Attached, two.Datamesh.Members[1].Attached = true, true
	if !has(CheckStatus(nil, two), InvAttached) {
		t.Error("two attached without multiattach not reported")
	}
	two.Datamesh.Multiattach = true
	if has(CheckStatus(nil, two), InvAttached) {
		t.Error("two attached with multiattach reported")
	}
	// Revision: a changed datamesh under the same number, and a step back.
	next := ok.DeepCopy()
	next.Datamesh.Members[2].Type = tDL
	if !has(CheckStatus(ok, next), InvRevision) {
		t.Error("change without a new revision not reported")
	}
	next.DatameshRevision = 0
	if !has(CheckStatus(ok, next), InvRevision) {
		t.Error("revision going back not reported")
	}
	// Transitions: an active step after a pending one, two voter transitions.
	bad := ok.DeepCopy()
	bad.DatameshTransitions = []v1alpha1.DatameshTransition{
		{Type: v1alpha1.TransitionAddReplica, Group: v1alpha1.GroupVotingMembership, ReplicaName: "x", Steps: []v1alpha1.DatameshTransitionStep{
			{Name: "1", Status: v1alpha1.StepPending}, {Name: "2", Status: v1alpha1.StepActive, DatameshRevision: 1}}},
		{Type: v1alpha1.TransitionRemoveReplica, Group: v1alpha1.GroupVotingMembership, ReplicaName: "a", Steps: []v1alpha1.DatameshTransitionStep{
			{Name: "1", Status: v1alpha1.StepActive, DatameshRevision: 1}}},
	}
	vs := CheckStatus(nil, bad)
	if !has(vs, InvTransitions) || len(vs) < 2 {
		t.Errorf("bad transitions: %v", vs)
	}
}

func TestRVRReportsWhatTheReplicaRuns(t *testing.T) {
	s := NewScenario(StartLayouts[3], false, v1alpha1.TopologyZonal, Bounds{Spare: 1}) // 3D
	c := NewChecker(s, &fakeEngine{})
	w, err := c.Initial()
	if err != nil {
		t.Fatal(err)
	}
	r := w.RVR(s, 0)
	if r.Status.DatameshRevision != w.RV.Status.DatameshRevision || r.Status.DiskState != v1alpha1.DiskStateUpToDate ||
		r.Status.Conditions[0].Reason != v1alpha1.ReasonConfigured || len(r.Status.Peers) != 2 || r.Status.Peers[0].ConnectionState != "Connected" {
		t.Fatalf("formed replica: %+v", r.Status)
	}
	// A lost node: AgentReady=False, its report frozen with "Connected"
	// peers; the live peers see it gone.
	w.DP.Replicas[0].Alive, w.DP.Replicas[0].AgentReady = false, false
	r = w.RVR(s, 0)
	if r.Status.Conditions[1].Type != v1alpha1.ConditionAgentReady || r.Status.Conditions[1].Status != metav1.ConditionFalse || r.Status.Peers[0].ConnectionState != "Connected" {
		t.Fatalf("lost replica: %+v", r.Status)
	}
	if p := w.RVR(s, 1).Status.Peers[0]; p.Name != "r0" || p.ConnectionState == "Connected" {
		t.Fatalf("live peer's view of the lost replica: %+v", p)
	}
	// A replica that is not a member yet.
	w.DP.Replicas[3] = Replica{Exists: true, Alive: true, AgentReady: true, SpecType: v1alpha1.ReplicaTypeAccess}
	if r := w.RVR(s, 3); r.Status.DatameshRevision != 0 || r.Status.Conditions[0].Reason != v1alpha1.ReasonPendingDatameshJoin {
		t.Fatalf("joining replica: %+v", r.Status)
	}
}
