package controller

import (
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// mvol builds a formed volume: members "<vol>-<node>" of the given types, q and qmr,
// each replica reporting disk UpToDate (Diskful) or Diskless, with quorum, connected to
// every peer it connects to.
func mvol(name string, q, qmr int32, members map[string]v1.MemberType) volumeOnNode {
	yes := true
	v := volumeOnNode{rv: &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: name}}, rvrs: map[string]*v1.ReplicatedVolumeReplica{}}
	v.rv.Status.DatameshRevision = 3
	v.rv.Status.Datamesh.Quorum, v.rv.Status.Datamesh.QuorumMinimumRedundancy = q, qmr
	for node, typ := range members {
		rn := name + "-" + node
		v.rv.Status.Datamesh.Members = append(v.rv.Status.Datamesh.Members, v1.DatameshMember{Name: rn, NodeName: node, Type: typ})
		disk := v1.DiskStateDiskless
		if typ.HasDisk() {
			disk = v1.DiskStateUpToDate
		}
		v.rvrs[rn] = &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: rn},
			Spec:   v1.ReplicatedVolumeReplicaSpec{ReplicatedVolumeName: name, NodeName: node},
			Status: v1.ReplicatedVolumeReplicaStatus{DiskState: disk, Quorum: &yes, DatameshRevision: 3}}
	}
	for _, a := range v.rv.Status.Datamesh.Members {
		for _, b := range v.rv.Status.Datamesh.Members {
			if a.Name != b.Name && (a.Type.ConnectsToAllPeers() || b.Type.ConnectsToAllPeers()) {
				v.rvrs[a.Name].Status.Peers = append(v.rvrs[a.Name].Status.Peers, v1.PeerStatus{Name: b.Name,
					ConnectionState: "Connected", ReplicationState: "Established", PeerDiskState: v.rvrs[b.Name].Status.DiskState})
			}
		}
	}
	return v
}

func TestJudgeMaintenance(t *testing.T) {
	d, tb := v1.MemberTypeDiskful, v1.MemberTypeTieBreaker
	allLive := func(string) bool { return true }
	except := func(down string) func(string) bool { return func(n string) bool { return n != down } }
	maint := func(phase v1.MaintenancePhase, ret bool) *v1.ReplicatedNodeMaintenance {
		return &v1.ReplicatedNodeMaintenance{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: v1.ReplicatedNodeMaintenanceSpec{NodeName: "a", Return: ret},
			Status: v1.ReplicatedNodeMaintenanceStatus{Phase: phase, Message: "kept"}}
	}
	twoD1TB := func() volumeOnNode { return mvol("v2d", 2, 1, map[string]v1.MemberType{"a": d, "b": d, "c": tb}) }
	threeD := func() volumeOnNode { return mvol("v3d", 2, 2, map[string]v1.MemberType{"a": d, "b": d, "c": d}) }
	threeDSyncing := mvol("v3d", 2, 2, map[string]v1.MemberType{"a": d, "b": d, "c": d})
	threeDSyncing.rvrs["v3d-c"].Status.DiskState = v1.DiskStateInconsistent
	oneD := mvol("v1d", 1, 1, map[string]v1.MemberType{"a": d})
	syncingBack := twoD1TB()
	syncingBack.rvrs["v2d-a"].Status.DiskState = v1.DiskStateInconsistent
	syncingBack.rvrs["v2d-a"].Status.Peers = []v1.PeerStatus{{Name: "v2d-b", Resync: &v1.ResyncProgress{PercentDone: 40}}}
	staleReport := twoD1TB()
	for i, p := range staleReport.rvrs["v2d-b"].Status.Peers {
		if p.Name == "v2d-a" {
			staleReport.rvrs["v2d-b"].Status.Peers[i] = v1.PeerStatus{Name: "v2d-a", ConnectionState: "Connecting", ReplicationState: "Off", PeerDiskState: v1.DiskStateUnknown}
		}
	}
	// The replica on a is in the cache, but the volume's status does not list it (yet).
	unlisted := twoD1TB()
	unlisted.rv.Status.Datamesh.Members = slices.DeleteFunc(unlisted.rv.Status.Datamesh.Members, func(m v1.DatameshMember) bool { return m.NodeName == "a" })
	oneDUnlisted := mvol("v1d", 1, 1, map[string]v1.MemberType{"a": d})
	oneDUnlisted.rv.Status.Datamesh.Members = nil
	leaving := twoD1TB()
	leaving.rv.Status.Datamesh.Members = unlisted.rv.Status.Datamesh.Members
	leaving.rvrs["v2d-a"].DeletionTimestamp = &metav1.Time{}
	oldRevision := twoD1TB()
	oldRevision.rvrs["v2d-c"].Status.DatameshRevision = 2
	for _, tc := range []struct {
		name     string
		f        maintenanceFacts
		phase    v1.MaintenancePhase
		msg      string
		blocking []string
		attached []string
	}{
		{"3D keeps quorum after the agreement", maintenanceFacts{m: maint("", false), volumes: []volumeOnNode{threeD()}, live: allLive, nodeLive: true},
			v1.MaintenanceReadyForMaintenance, "Node a may be taken down", nil, nil},
		// At the moment node a goes, b keeps quorum through the tiebreaker; the
		// agreement among b and c takes a out of b's electorate, and q=2 is then
		// one voter more than b. Without a configuration, no copy is asked for.
		{"2D+1TB loses quorum after the agreement", maintenanceFacts{m: maint("", false), volumes: []volumeOnNode{twoD1TB()}, live: allLive, nodeLive: true},
			v1.MaintenanceBlocked, "v2d: on b, 1 of 1 nodes visible, need 2 for quorum once DRBD's agreement among the nodes left takes node a out of the electorate; its configuration is not resolved", []string{"v2d"}, nil},
		{"attached volumes hold the node in Draining", maintenanceFacts{m: maint("", false), volumes: []volumeOnNode{threeD()}, attached: []string{"v3d"}, live: allLive, nodeLive: true},
			v1.MaintenanceDraining, "Waiting for the volumes attached on node a to detach: v3d; their pods must be moved by their owners (kubectl drain a)", nil, []string{"v3d"}},
		{"2D+1TB whose tiebreaker is down", maintenanceFacts{m: maint("", false), volumes: []volumeOnNode{twoD1TB()}, live: except("c"), nodeLive: true},
			v1.MaintenanceBlocked, "v2d: on b, 1 of 2 nodes visible, need 2 for quorum", []string{"v2d"}, nil},
		{"3D with a syncing member: qmr 2 needs two UpToDate", maintenanceFacts{m: maint("", false), volumes: []volumeOnNode{threeDSyncing, mvol("v3e", 2, 2, map[string]v1.MemberType{"a": d, "b": d, "c": d})}, live: allLive, nodeLive: true},
			v1.MaintenanceBlocked, "v3d: on b, 1 of 3 nodes up_to_date, need 2 for quorum-minimum-redundancy", []string{"v3d"}, nil},
		{"the only copy", maintenanceFacts{m: maint("", false), volumes: []volumeOnNode{oneD}, live: allLive, nodeLive: true},
			v1.MaintenanceBlocked, "v1d: no UpToDate Diskful replica with a live agent is left outside node a", []string{"v1d"}, nil},
		{"a replica the volume's status does not list is not judged", maintenanceFacts{m: maint("", false), volumes: []volumeOnNode{oneDUnlisted, unlisted}, live: allLive, nodeLive: true},
			v1.MaintenancePending, "before judging them: v1d-a, v2d-a", nil, nil},
		{"a replica being deleted is leaving", maintenanceFacts{m: maint("", false), volumes: []volumeOnNode{leaving}, live: allLive, nodeLive: true},
			v1.MaintenanceReadyForMaintenance, "Node a may be taken down", nil, nil},
		{"one node at a time", maintenanceFacts{m: maint("", false), busy: "x", volumes: []volumeOnNode{twoD1TB()}, live: allLive, nodeLive: true},
			v1.MaintenanceBlocked, "Node x is in maintenance: one node at a time", nil, nil},
		{"ready stays ready while the node is down", maintenanceFacts{m: maint(v1.MaintenanceReadyForMaintenance, false), volumes: []volumeOnNode{twoD1TB()}, live: except("a")},
			v1.MaintenanceReadyForMaintenance, "kept", nil, nil},
		{"returning: agent not back", maintenanceFacts{m: maint(v1.MaintenanceReadyForMaintenance, true), volumes: []volumeOnNode{twoD1TB()}, live: except("a")},
			v1.MaintenanceReturning, "the agent of node a is not live", nil, nil},
		{"returning: resync", maintenanceFacts{m: maint(v1.MaintenanceReturning, true), volumes: []volumeOnNode{syncingBack}, live: allLive, nodeLive: true},
			v1.MaintenanceReturning, "v2d-a: Inconsistent (syncing 40%)", nil, nil},
		{"returning: the node's own report is the one it left with", maintenanceFacts{m: maint(v1.MaintenanceReturning, true), volumes: []volumeOnNode{staleReport}, live: allLive, nodeLive: true},
			v1.MaintenanceReturning, "v2d-b sees v2d-a Connecting/Off/DUnknown", nil, nil},
		{"returning: completed", maintenanceFacts{m: maint(v1.MaintenanceReturning, true), volumes: []volumeOnNode{twoD1TB()}, live: allLive, nodeLive: true},
			v1.MaintenanceCompleted, "Node a is back", nil, nil},
		{"called off while blocked", maintenanceFacts{m: maint(v1.MaintenanceBlocked, true), volumes: []volumeOnNode{oneD}, live: allLive, nodeLive: true},
			v1.MaintenanceCompleted, "never taken out of service", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := judgeMaintenance(tc.f)
			if st.Phase != tc.phase || !strings.Contains(st.Message, tc.msg) {
				t.Errorf("got %s %q, want %s containing %q", st.Phase, st.Message, tc.phase, tc.msg)
			}
			if strings.Join(st.BlockingVolumes, ",") != strings.Join(tc.blocking, ",") || strings.Join(st.AttachedVolumes, ",") != strings.Join(tc.attached, ",") {
				t.Errorf("blocking %v attached %v, want %v %v", st.BlockingVolumes, st.AttachedVolumes, tc.blocking, tc.attached)
			}
		})
	}
	// spec.maxDowntime, counted from status.awaySince, the first ReadyForMaintenance.
	t0 := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	bounded := func(phase v1.MaintenancePhase, ret bool) *v1.ReplicatedNodeMaintenance {
		m := maint(phase, ret)
		m.Spec.MaxDowntime = &metav1.Duration{Duration: time.Hour}
		m.Status.AwaySince = &metav1.Time{Time: t0}
		return m
	}
	for _, tc := range []struct {
		name  string
		f     maintenanceFacts
		phase v1.MaintenancePhase
		msg   string
	}{
		{"away within maxDowntime", maintenanceFacts{m: bounded(v1.MaintenanceReadyForMaintenance, false), volumes: []volumeOnNode{twoD1TB()}, live: except("a"), now: t0.Add(59 * time.Minute)},
			v1.MaintenanceReadyForMaintenance, "kept"},
		{"away past maxDowntime", maintenanceFacts{m: bounded(v1.MaintenanceReadyForMaintenance, false), volumes: []volumeOnNode{twoD1TB()}, live: except("a"), now: t0.Add(2 * time.Hour)},
			v1.MaintenanceFailed, "Node a has been away since 2026-01-01T10:00:00Z, longer than spec.maxDowntime 1h0m0s: it is lost now, and its volumes' members there may be replaced; still missing: the agent of node a is not live"},
		{"a resync past maxDowntime", maintenanceFacts{m: bounded(v1.MaintenanceReturning, true), volumes: []volumeOnNode{syncingBack}, live: allLive, nodeLive: true, now: t0.Add(61 * time.Minute)},
			v1.MaintenanceFailed, "still missing: v2d-a: Inconsistent (syncing 40%)"},
		{"failed stays failed", maintenanceFacts{m: bounded(v1.MaintenanceFailed, true), volumes: []volumeOnNode{twoD1TB()}, live: allLive, nodeLive: true, now: t0},
			v1.MaintenanceFailed, "kept"},
		{"back in time", maintenanceFacts{m: bounded(v1.MaintenanceReturning, true), volumes: []volumeOnNode{twoD1TB()}, live: allLive, nodeLive: true, now: t0.Add(59 * time.Minute)},
			v1.MaintenanceCompleted, "Node a is back"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := judgeMaintenance(tc.f)
			if st.Phase != tc.phase || !strings.Contains(st.Message, tc.msg) || st.AwaySince == nil || !st.AwaySince.Time.Equal(t0) {
				t.Errorf("got %s %q away since %v, want %s containing %q away since %s", st.Phase, st.Message, st.AwaySince, tc.phase, tc.msg, t0)
			}
		})
	}
	// The first ReadyForMaintenance starts the downtime.
	if st := judgeMaintenance(maintenanceFacts{m: maint("", false), volumes: []volumeOnNode{threeD()}, live: allLive, nodeLive: true, now: t0}); st.AwaySince == nil || !st.AwaySince.Time.Equal(t0) {
		t.Errorf("ReadyForMaintenance: away since %v, want %s", st.AwaySince, t0)
	}
	// A replica on a returning node that runs an old revision is not back yet.
	f := maintenanceFacts{m: maint(v1.MaintenanceReturning, true), volumes: []volumeOnNode{oldRevision}, live: allLive, nodeLive: true}
	f.m.Spec.NodeName = "c"
	if st := judgeMaintenance(f); st.Phase != v1.MaintenanceReturning || !strings.Contains(st.Message, "v2d-c: runs revision 2 of 3") {
		t.Errorf("old revision: %s %q", st.Phase, st.Message)
	}
}

// withConfig gives v the configuration (ftt, gmdr).
func withConfig(v volumeOnNode, ftt, gmdr int32) volumeOnNode {
	v.rv.Status.Configuration = &v1.ReplicatedVolumeConfiguration{FailuresToTolerate: ftt, GuaranteedMinimumDataRedundancy: gmdr}
	for _, r := range v.rvrs {
		for _, m := range v.rv.Status.Datamesh.Members {
			if m.Name == r.Name && m.Type == v1.MemberTypeDiskful {
				r.Spec.Type = v1.ReplicaTypeDiskful
			}
		}
	}
	return v
}

// TestJudgeMaintenanceCopies: a volume that would lose quorum or its guaranteed
// redundancy with the node gone — judged after DRBD's lost-peer agreement — is copied
// elsewhere first (status.copiedVolumes, which the volume reconciler turns into the
// raised layout of layout.Layout.RaisedForMaintenance), the maintenance Draining until
// the copy is UpToDate and the raise's steps are done; where no copy can help, it
// stays Blocked.
func TestJudgeMaintenanceCopies(t *testing.T) {
	d, tb := v1.MemberTypeDiskful, v1.MemberTypeTieBreaker
	allLive := func(string) bool { return true }
	maint := func(phase v1.MaintenancePhase, ret bool, copied ...string) *v1.ReplicatedNodeMaintenance {
		return &v1.ReplicatedNodeMaintenance{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: v1.ReplicatedNodeMaintenanceSpec{NodeName: "a", Return: ret},
			Status: v1.ReplicatedNodeMaintenanceStatus{Phase: phase, Message: "kept", CopiedVolumes: copied}}
	}
	oneD := withConfig(mvol("v1d", 1, 1, map[string]v1.MemberType{"a": d}), 0, 0)
	// The copy's replica exists on b but has not joined yet.
	joining := withConfig(mvol("v1d", 1, 1, map[string]v1.MemberType{"a": d}), 0, 0)
	joining.rvrs["v1d-b"] = &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: "v1d-b"},
		Spec: v1.ReplicatedVolumeReplicaSpec{ReplicatedVolumeName: "v1d", NodeName: "b", Type: v1.ReplicaTypeDiskful}}
	// Raised to 3D: the copies on b and c sync from a.
	syncing := withConfig(mvol("v1d", 2, 2, map[string]v1.MemberType{"a": d, "b": d, "c": d}), 0, 0)
	syncing.rvrs["v1d-b"].Status.DiskState = v1.DiskStateInconsistent
	syncing.rvrs["v1d-b"].Status.Peers = []v1.PeerStatus{{Name: "v1d-a", Resync: &v1.ResyncProgress{PercentDone: 30}}}
	copied := withConfig(mvol("v1d", 2, 2, map[string]v1.MemberType{"a": d, "b": d, "c": d}), 0, 0)
	// Raised to 2D+1TB only, as before the lost-peer agreement was known: not enough.
	copiedTo2D1TB := withConfig(mvol("v1d", 2, 1, map[string]v1.MemberType{"a": d, "b": d, "c": tb}), 0, 0)
	twoD1TB := withConfig(mvol("v2t", 2, 1, map[string]v1.MemberType{"a": d, "b": d, "c": tb}), 1, 0)
	// Attached (Primary) on b: DRBD would let b keep its quorum through the agreement,
	// but not through the next connection loss among b and c.
	twoD1TBAttached := withConfig(mvol("v2t", 2, 1, map[string]v1.MemberType{"a": d, "b": d, "c": tb}), 1, 0)
	for i := range twoD1TBAttached.rv.Status.Datamesh.Members {
		m := &twoD1TBAttached.rv.Status.Datamesh.Members[i]
		m.Attached = m.NodeName == "b"
	}
	// 2D+1TB raised to 3D: the third Diskful is in, the TieBreaker still leaving, then
	// gone from the steps but still a member.
	tbLeaving := withConfig(mvol("v2t", 2, 2, map[string]v1.MemberType{"a": d, "b": d, "c": tb, "e": d}), 1, 0)
	tbLeaving.rv.Status.DatameshTransitions = []v1.DatameshTransition{{Type: v1.TransitionRemoveReplica, ReplicaName: "v2t-c"}}
	notRaised := withConfig(mvol("v2t", 2, 2, map[string]v1.MemberType{"a": d, "b": d, "c": tb, "e": d}), 1, 0)
	raised := withConfig(mvol("v2t", 2, 2, map[string]v1.MemberType{"a": d, "b": d, "e": d}), 1, 0)
	// 5D with two members elsewhere still syncing: qmr 3 fails, and no layout is above
	// 5D.
	unplaceable := withConfig(mvol("v1d", 1, 1, map[string]v1.MemberType{"a": d}), 0, 0)
	unplaceable.rv.Status.Conditions = []metav1.Condition{{Type: v1.ConditionScheduled, Status: metav1.ConditionFalse, Reason: "NoEligibleNodes", Message: "no eligible node is free"}}
	twoD := withConfig(mvol("v2d", 2, 2, map[string]v1.MemberType{"a": d, "b": d}), 0, 1)
	noMore := withConfig(mvol("v5d", 3, 3, map[string]v1.MemberType{"a": d, "b": d, "c": d, "e": d, "f": d}), 2, 2)
	noMore.rvrs["v5d-e"].Status.DiskState = v1.DiskStateInconsistent
	noMore.rvrs["v5d-f"].Status.DiskState = v1.DiskStateInconsistent
	except := func(down string) func(string) bool { return func(n string) bool { return n != down } }
	for _, tc := range []struct {
		name   string
		f      maintenanceFacts
		phase  v1.MaintenancePhase
		msg    string
		copied []string
	}{
		{"1D: a copy is asked for", maintenanceFacts{m: maint("", false), volumes: []volumeOnNode{oneD}, live: allLive, nodeLive: true},
			v1.MaintenanceDraining, "Copying the volumes that need node a to another node first: v1d: a copy elsewhere is asked for, 1D raised to 3D while the maintenance lasts (a full sync of each new Diskful replica), since no UpToDate Diskful replica", []string{"v1d"}},
		{"2D (GMDR 1): a copy is asked for", maintenanceFacts{m: maint("", false), volumes: []volumeOnNode{twoD}, live: allLive, nodeLive: true},
			v1.MaintenanceDraining, "v2d: a copy elsewhere is asked for, 2D raised to 3D while the maintenance lasts (a full sync of each new Diskful replica), since on b, 1 of 2 nodes visible, need 2 for quorum", []string{"v2d"}},
		{"2D+1TB: a copy is asked for, the lost-peer agreement", maintenanceFacts{m: maint("", false), volumes: []volumeOnNode{twoD1TB}, live: allLive, nodeLive: true},
			v1.MaintenanceDraining, "v2t: a copy elsewhere is asked for, 2D+1TB raised to 3D while the maintenance lasts (a full sync of each new Diskful replica), since on b, 1 of 1 nodes visible, need 2 for quorum once DRBD's agreement among the nodes left takes node a out of the electorate", []string{"v2t"}},
		{"2D+1TB attached on a survivor: a Primary's quorum is not counted on", maintenanceFacts{m: maint("", false), volumes: []volumeOnNode{twoD1TBAttached}, live: allLive, nodeLive: true},
			v1.MaintenanceDraining, "v2t: a copy elsewhere is asked for, 2D+1TB raised to 3D", []string{"v2t"}},
		{"the raise's steps still run", maintenanceFacts{m: maint(v1.MaintenanceDraining, false, "v2t"), volumes: []volumeOnNode{tbLeaving}, live: allLive, nodeLive: true},
			v1.MaintenanceDraining, "v2t: waiting for its steps in flight: RemoveReplica v2t-c", []string{"v2t"}},
		{"the raised layout is not reached", maintenanceFacts{m: maint(v1.MaintenanceDraining, false, "v2t"), volumes: []volumeOnNode{notRaised}, live: allLive, nodeLive: true},
			v1.MaintenanceDraining, "v2t: raised to 3D, it has 3 Diskful and 1 TieBreaker members", []string{"v2t"}},
		{"the raised layout is reached", maintenanceFacts{m: maint(v1.MaintenanceDraining, false, "v2t"), volumes: []volumeOnNode{raised}, live: allLive, nodeLive: true},
			v1.MaintenanceReadyForMaintenance, "Node a may be taken down", []string{"v2t"}},
		{"a copy that is 2D+1TB is not enough", maintenanceFacts{m: maint(v1.MaintenanceDraining, false, "v1d"), volumes: []volumeOnNode{copiedTo2D1TB}, live: allLive, nodeLive: true},
			v1.MaintenanceDraining, "v1d: on b, 1 of 1 nodes visible, need 2 for quorum once DRBD's agreement", []string{"v1d"}},
		{"the copy joins", maintenanceFacts{m: maint(v1.MaintenanceDraining, false, "v1d"), volumes: []volumeOnNode{joining}, live: allLive, nodeLive: true},
			v1.MaintenanceDraining, "v1d: copy v1d-b on node b joining", []string{"v1d"}},
		{"the copy syncs", maintenanceFacts{m: maint(v1.MaintenanceDraining, false, "v1d"), volumes: []volumeOnNode{syncing}, live: allLive, nodeLive: true},
			v1.MaintenanceDraining, "v1d: copy v1d-b on node b Inconsistent (syncing 30%)", []string{"v1d"}},
		{"the copy is UpToDate: the node may go, and the volume stays copied", maintenanceFacts{m: maint(v1.MaintenanceDraining, false, "v1d"), volumes: []volumeOnNode{copied}, live: allLive, nodeLive: true},
			v1.MaintenanceReadyForMaintenance, "Node a may be taken down", []string{"v1d"}},
		{"copied while the node is away", maintenanceFacts{m: maint(v1.MaintenanceReadyForMaintenance, false, "v1d"), volumes: []volumeOnNode{copied}, live: except("a")},
			v1.MaintenanceReadyForMaintenance, "kept", []string{"v1d"}},
		{"copied while returning", maintenanceFacts{m: maint(v1.MaintenanceReadyForMaintenance, true, "v1d"), volumes: []volumeOnNode{copied}, live: except("a")},
			v1.MaintenanceReturning, "the agent of node a is not live", []string{"v1d"}},
		{"completed: back to the configured layout", maintenanceFacts{m: maint(v1.MaintenanceReturning, true, "v1d"), volumes: []volumeOnNode{copied}, live: allLive, nodeLive: true},
			v1.MaintenanceCompleted, "the volumes copied for the maintenance go back to their configured layout: v1d", nil},
		{"no node can take the copy", maintenanceFacts{m: maint(v1.MaintenanceDraining, false, "v1d"), volumes: []volumeOnNode{unplaceable}, live: allLive, nodeLive: true},
			v1.MaintenanceBlocked, "v1d: no UpToDate Diskful replica with a live agent is left outside node a; no node can take a copy: no eligible node is free", []string{"v1d"}},
		{"a member elsewhere is down", maintenanceFacts{m: maint("", false), volumes: []volumeOnNode{twoD}, live: except("b"), nodeLive: true},
			v1.MaintenanceBlocked, "a copy elsewhere waits for every other member to be up, and v2d-b on node b is not", nil},
		{"no layout is above 5D", maintenanceFacts{m: maint("", false), volumes: []volumeOnNode{noMore}, live: allLive, nodeLive: true},
			v1.MaintenanceBlocked, "2 of 5 nodes up_to_date, need 3 for quorum-minimum-redundancy; a copy elsewhere cannot help: no layout is above its own (FTT=2, GMDR=2; both are at most 2)", nil},
		{"one volume that cannot be copied blocks the others' copies", maintenanceFacts{m: maint("", false), volumes: []volumeOnNode{oneD, noMore}, live: allLive, nodeLive: true},
			v1.MaintenanceBlocked, "v5d: on ", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := judgeMaintenance(tc.f)
			if st.Phase != tc.phase || !strings.Contains(st.Message, tc.msg) {
				t.Errorf("got %s %q, want %s containing %q", st.Phase, st.Message, tc.phase, tc.msg)
			}
			if !slices.Equal(st.CopiedVolumes, tc.copied) {
				t.Errorf("copied %v, want %v", st.CopiedVolumes, tc.copied)
			}
		})
	}
}
