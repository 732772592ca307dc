package kubectlmeshvol

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

var now = time.Date(2026, 11, 27, 1, 0, 0, 0, time.UTC)

func lease(node string, renewed time.Time, pools map[string]v1.PoolCapacity) coordinationv1.Lease {
	ann := map[string]string{v1.AnnotationAgentVersion: "v0.1.0", v1.AnnotationZone: "zone-a"}
	for p, c := range pools {
		ann[v1.AnnotationPoolCapacityPrefix+p] = c.String()
	}
	return coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: v1.AgentLeasePrefix + node, Namespace: v1.DefaultNamespace, Annotations: ann},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &node, LeaseDurationSeconds: ptr(int32(10)),
			RenewTime: &metav1.MicroTime{Time: renewed}},
	}
}

func ptr[T any](v T) *T { return &v }

func replica(vol, node string, typ v1.ReplicaType, disk v1.DiskState, role v1.ReplicaRole, rev int64, peers ...v1.PeerStatus) v1.ReplicatedVolumeReplica {
	return v1.ReplicatedVolumeReplica{
		ObjectMeta: metav1.ObjectMeta{Name: v1.ReplicaName(vol, node), Labels: map[string]string{v1.LabelVolume: vol, v1.LabelNode: node}},
		Spec:       v1.ReplicatedVolumeReplicaSpec{ReplicatedVolumeName: vol, NodeName: node, Type: typ},
		Status: v1.ReplicatedVolumeReplicaStatus{DatameshRevision: rev, DiskState: disk, Role: role, Quorum: ptr(true),
			Peers: peers},
	}
}

// degraded2D1TB is a 2D+1TB volume whose second Diskful (node-b) crashed: its
// Lease expired long ago, the engine is removing it and lowered the effective
// protection to FTT=0, the survivor on node-a is attached and UpToDate, and a
// replacement on node-d is syncing.
func degraded2D1TB() VolumeObjects {
	const vol = "pvc-1"
	started := metav1.NewTime(now.Add(-42 * time.Second))
	rv := &v1.ReplicatedVolume{
		ObjectMeta: metav1.ObjectMeta{Name: vol},
		Spec:       v1.ReplicatedVolumeSpec{Size: resource.MustParse("1Gi")},
		Status: v1.ReplicatedVolumeStatus{
			Phase:            v1.VolumePhaseDegraded,
			Configuration:    &v1.ReplicatedVolumeConfiguration{StoragePool: "pool", FailuresToTolerate: 1},
			EffectiveLayout:  &v1.Layout{FailuresToTolerate: 0},
			DatameshRevision: 9,
			Datamesh: v1.Datamesh{Quorum: 1, QuorumMinimumRedundancy: 1, Members: []v1.DatameshMember{
				{Name: v1.ReplicaName(vol, "node-c"), Type: v1.MemberTypeTieBreaker, NodeName: "node-c", NodeID: 2},
				{Name: v1.ReplicaName(vol, "node-a"), Type: v1.MemberTypeDiskful, NodeName: "node-a", NodeID: 0, Attached: true, Zone: "zone-a"},
				{Name: v1.ReplicaName(vol, "node-b"), Type: v1.MemberTypeDiskful, NodeName: "node-b", NodeID: 1},
			}},
			DatameshTransitions: []v1.DatameshTransition{{
				Type: v1.TransitionForceRemoveReplica, Group: v1.GroupEmergency, ReplicaName: v1.ReplicaName(vol, "node-b"),
				FromType: v1.MemberTypeDiskful, PlanID: "force-remove", PlanVersion: 1,
				Steps: []v1.DatameshTransitionStep{
					{Name: "D → ✕", Status: v1.StepCompleted, DatameshRevision: 8},
					{Name: "q↓", Status: v1.StepActive, DatameshRevision: 9, StartedAt: &started,
						Message: "1/2 replicas confirmed revision 9. Waiting: [#2]"},
				},
			}},
			DatameshReplicaRequests: []v1.DatameshReplicaRequest{{Name: v1.ReplicaName(vol, "node-d"), Operation: v1.ReplicaOperationJoin,
				Type: v1.ReplicaTypeDiskful, Message: "waits: voting membership changes run one at a time"}},
			Conditions: []metav1.Condition{
				{Type: v1.ConditionConfigured, Status: metav1.ConditionTrue, Reason: "Configured"},
				{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: string(v1.VolumePhaseDegraded),
					Message: "1/2 Diskful UpToDate: pvc-1-node-b's agent is lost"},
			},
		},
	}
	connected := v1.PeerStatus{Name: v1.ReplicaName(vol, "node-c"), ConnectionState: "Connected", ReplicationState: "Established", PeerDiskState: v1.DiskStateDiskless}
	return VolumeObjects{
		RV: rv,
		Replicas: []v1.ReplicatedVolumeReplica{
			replica(vol, "node-a", v1.ReplicaTypeDiskful, v1.DiskStateUpToDate, v1.RolePrimary, 9, connected,
				v1.PeerStatus{Name: v1.ReplicaName(vol, "node-b"), ConnectionState: "Connecting"}),
			replica(vol, "node-b", v1.ReplicaTypeDiskful, v1.DiskStateUpToDate, v1.RoleSecondary, 7),
			replica(vol, "node-c", v1.ReplicaTypeTieBreaker, v1.DiskStateDiskless, v1.RoleSecondary, 8),
			replica(vol, "node-d", v1.ReplicaTypeDiskful, v1.DiskStateInconsistent, v1.RoleSecondary, 0,
				v1.PeerStatus{Name: v1.ReplicaName(vol, "node-a"), ConnectionState: "Connected", ReplicationState: "SyncTarget",
					Resync: &v1.ResyncProgress{PercentDone: 37, OutOfSyncBytes: 600 << 20}}),
		},
		Leases: map[string]*coordinationv1.Lease{
			"node-a": ptr(lease("node-a", now.Add(-time.Second), nil)),
			"node-b": ptr(lease("node-b", now.Add(-time.Minute), nil)),
			"node-c": ptr(lease("node-c", now.Add(-2*time.Second), nil)),
			"node-d": ptr(lease("node-d", now.Add(-2*time.Second), nil)),
		},
		PVC: "default/data",
	}
}

func TestBuildVolumeDegraded2D1TB(t *testing.T) {
	v := BuildVolume(degraded2D1TB(), now)
	if !v.Degraded || v.Configured.Layout != "2D+1TB" || v.Effective.Layout != "1D" || v.UpToDateDiskful != 1 || v.WantDiskful != 2 {
		t.Errorf("protection: degraded %v, configured %v, effective %v; want degraded, 2D+1TB, 1D", v.Degraded, v.Configured, v.Effective)
	}
	var order []string
	for _, m := range v.Members {
		order = append(order, m.Node)
	}
	if got := strings.Join(order, ","); got != "node-a,node-b,node-c,node-d" {
		t.Errorf("members in node-id order then the non-members: %s", got)
	}
	a, b, c, d := v.Members[0], v.Members[1], v.Members[2], v.Members[3]
	if a.Agent != "Live" || !a.Attached || a.Sync != "100%" || !a.Current || a.Role != "Primary" || len(a.Peers) != 2 {
		t.Errorf("the attached survivor: %+v", a)
	}
	if b.Agent != "Lost" || !b.Stale || b.Current || a.Stale {
		t.Errorf("the lost Diskful must be Lost and behind revision 9: %+v", b)
	}
	if c.Sync != "-" || c.Type != string(v1.MemberTypeTieBreaker) {
		t.Errorf("the TieBreaker has no disk to sync: %+v", c)
	}
	if d.Type != "-" || d.Wants != "Diskful" || d.Sync != "37%" {
		t.Errorf("the replacement outside the datamesh, syncing: %+v", d)
	}
	if len(v.Transitions) != 1 || v.Transitions[0].Steps[1].Age != "42s" {
		t.Errorf("the active step waits for 42s: %+v", v.Transitions)
	}
	if len(v.Conditions) != 1 || v.Conditions[0].Type != v1.ConditionReady {
		t.Errorf("only the conditions that are not True: %+v", v.Conditions)
	}
}

func TestRenderVolumeDegraded2D1TB(t *testing.T) {
	v := BuildVolume(degraded2D1TB(), now)
	var out bytes.Buffer
	if err := RenderVolume(&out, v, OutputWide); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	t.Logf("\n%s", s)
	for _, want := range []string{
		"ReplicatedVolume pvc-1 (PVC default/data)\n",
		"Protection: configured 2D+1TB (FTT=1 GMDR=0), effective 1D (FTT=0 GMDR=0), 1/2 Diskful UpToDate  DEGRADED\n",
		"Datamesh:   revision 9, q=1 qmr=1, 2 Diskful, 1 TieBreaker\n",
		"[Active] q↓ (revision 9) for 42s: 1/2 replicas confirmed revision 9. Waiting: [#2]",
		"pvc-1-node-d Join Diskful: waits: voting membership changes run one at a time",
		"Ready=False Degraded: 1/2 Diskful UpToDate: pvc-1-node-b's agent is lost",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	for _, c := range []struct{ replica, want string }{
		{"pvc-1-node-a", "Diskful,attached"},
		{"pvc-1-node-b", "7 (behind)"},
		{"pvc-1-node-d", "-(wants Diskful)"},
		{"pvc-1-node-a", "node-c:Connected/Established/Diskless node-b:Connecting"},
	} {
		if row := lineOf(s, c.replica); !strings.Contains(row, c.want) {
			t.Errorf("row %q lacks %q", row, c.want)
		}
	}
	if row := lineOf(s, "├─ pvc-1-node-b"); !strings.Contains(row, " Lost (stale report) ") || !strings.Contains(row, "7 (behind)") {
		t.Errorf("the lost node's row: %q", row)
	}
}

func TestRenderVolumeEncodings(t *testing.T) {
	v := BuildVolume(degraded2D1TB(), now)
	for _, o := range []Output{OutputJSON, OutputYAML} {
		var out bytes.Buffer
		if err := RenderVolume(&out, v, o); err != nil {
			t.Fatal(err)
		}
		var back VolumeView
		var err error
		if o == OutputJSON {
			err = json.Unmarshal(out.Bytes(), &back)
		} else {
			err = yaml.Unmarshal(out.Bytes(), &back)
		}
		if err != nil || back.Name != v.Name || !back.Degraded || len(back.Members) != len(v.Members) {
			t.Errorf("-o %s does not read back: %v %+v", o, err, back)
		}
	}
	if _, err := ParseOutput("table"); err == nil || !strings.Contains(err.Error(), "wide, yaml, json") {
		t.Errorf("-o table: %v", err)
	}
}

func TestNodes(t *testing.T) {
	o := degraded2D1TB()
	var rvrs []v1.ReplicatedVolumeReplica
	rvrs = append(rvrs, o.Replicas...)
	objs := NodeObjects{
		Nodes: []corev1.Node{
			{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{v1.LabelZone: "zone-a"}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "node-e", Labels: map[string]string{v1.LabelCordon: "maintenance"}}},
		},
		Leases: []coordinationv1.Lease{
			lease("node-a", now.Add(-time.Second), map[string]v1.PoolCapacity{"pool": {Total: 10 << 30, Free: 9 << 30}, "fast": {Total: 1 << 30, Free: 1 << 29}}),
			lease("node-b", now.Add(-time.Minute), map[string]v1.PoolCapacity{"pool": {Total: 10 << 30, Free: 8 << 30}}),
			{ObjectMeta: metav1.ObjectMeta{Name: "not-an-agent", Namespace: v1.DefaultNamespace}},
		},
		Volumes:  []v1.ReplicatedVolume{*o.RV},
		Replicas: rvrs,
	}
	// node-a's agent announces what it understands; node-b's announcement was written
	// by another version than the one that renews its Lease (a rollback): void.
	objs.Leases[0].Annotations[v1.AnnotationCapabilities] = v1.CapabilityDerivedSharedSecret + "," + v1.CapabilityTearDownWithVolume
	objs.Leases[0].Annotations[v1.AnnotationCapabilitiesAgentVersion] = "v0.1.0"
	objs.Leases[1].Annotations[v1.AnnotationCapabilities] = v1.CapabilityDerivedSharedSecret
	objs.Leases[1].Annotations[v1.AnnotationCapabilitiesAgentVersion] = "v0.2.0"
	nodes := BuildNodes(objs, now)
	var names []string
	for _, n := range nodes {
		names = append(names, n.Name+":"+n.Agent)
	}
	if got := strings.Join(names, ","); got != "node-a:Live,node-b:Lost,node-c:NoLease,node-d:NoLease,node-e:NoLease" {
		t.Errorf("nodes: %s", got)
	}
	a := nodes[0]
	if len(a.Attached) != 1 || a.Attached[0] != "pvc-1" || a.Replicas["Diskful"] != 1 || len(a.Pools) != 2 || a.Pools[0].Name != "fast" {
		t.Errorf("node-a: %+v", a)
	}
	if nodes[3].Replicas["-Diskful"] != 1 || !nodes[4].Cordoned {
		t.Errorf("node-d's replica is outside the datamesh, node-e is cordoned: %+v %+v", nodes[3], nodes[4])
	}
	var out bytes.Buffer
	if err := RenderNodes(&out, nodes, OutputWide); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	t.Logf("\n%s", s)
	if row := lineOf(s, "node-a "); !strings.Contains(row, "fast 512.0Mi/1.0Gi, pool 9.0Gi/10.0Gi") || !strings.Contains(row, "1 Diskful") || !strings.Contains(row, "pvc-1") {
		t.Errorf("node-a row: %q", row)
	}
	if row := lineOf(s, "node-a "); !strings.Contains(row, "derived-shared-secret,teardown-with-volume") {
		t.Errorf("node-a row does not show its agent's capabilities: %q", row)
	}
	if len(nodes[1].Capabilities) != 0 {
		t.Errorf("node-b's capabilities, written by another agent version: %v, want none", nodes[1].Capabilities)
	}
	if row := lineOf(s, "node-e "); !strings.Contains(row, "true") {
		t.Errorf("node-e row is not cordoned: %q", row)
	}
}

func TestRunArguments(t *testing.T) {
	r := Reader{}
	for _, args := range [][]string{{"status"}, {"status", "a", "b"}, {"nodes", "x"}, {"drain"}} {
		if err := r.Run(t.Context(), args, OutputDefault, &bytes.Buffer{}, now); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

func lineOf(out, s string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

// TestDegradedBeforeTheEngineActs: a Diskful node is lost but nothing has changed
// the membership yet, so the effective layout is still the configured one; the
// view is degraded all the same, because one of the two copies is gone.
func TestDegradedBeforeTheEngineActs(t *testing.T) {
	o := degraded2D1TB()
	o.RV.Status.EffectiveLayout = &v1.Layout{FailuresToTolerate: 1}
	o.RV.Status.DatameshTransitions = nil
	v := BuildVolume(o, now)
	if !v.Degraded || v.UpToDateDiskful != 1 {
		t.Errorf("degraded %v with %d UpToDate Diskful", v.Degraded, v.UpToDateDiskful)
	}
	o.Leases["node-b"] = ptr(lease("node-b", now.Add(-time.Second), nil))
	if v := BuildVolume(o, now); v.Degraded || v.UpToDateDiskful != 2 {
		t.Errorf("with node-b back: degraded %v with %d UpToDate Diskful", v.Degraded, v.UpToDateDiskful)
	}
}
