package controller

import (
	"errors"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Minors are unique across the cluster; a volume keeps its minor; a released one is
// reused only after the rest of the range went round; a full range is an error that
// names the field, the rule, the cap and what lifts it.
func TestAllocatorMinors(t *testing.T) {
	a := NewAllocator(7000, 7002, 5, 6)
	x, err := a.Minor("x")
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := a.Minor("x"); again != x {
		t.Fatalf("second call for x gave %d, first %d: a volume keeps its minor", again, x)
	}
	y, err := a.Minor("y")
	if err != nil {
		t.Fatal(err)
	}
	if y == x {
		t.Fatalf("x and y share minor %d", x)
	}
	_, err = a.Minor("z")
	var ex *ExhaustedError
	if !errors.As(err, &ex) || ex.What != "minor" {
		t.Fatalf("third volume: got %v, want minor exhaustion", err)
	}
	for _, want := range []string{"status.datamesh.minor", "no free DRBD minor in 5-6", "unique across the cluster", "at most 2 volumes", "--minor-range"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q does not say %q (the field, what ran out, the rule, the cap and what lifts it)", err, want)
		}
	}
	a.Release("x")
	z, err := a.Minor("z")
	if err != nil {
		t.Fatal(err)
	}
	if z == y {
		t.Fatalf("z got y's minor %d", z)
	}
}

// Ports are unique per node, not across the cluster: two volumes' members on different
// nodes may share a port, two members on one node never do, and a member keeps its
// port. A node's range bounds the replicas on that node only.
func TestAllocatorPortsPerNode(t *testing.T) {
	a := NewAllocator(7000, 7001, 5, 100)
	port := func(vol, member, node string) int32 {
		t.Helper()
		p, err := a.Port(vol, member, node, 0, 0)
		if err != nil {
			t.Fatalf("%s/%s on %s: %v", vol, member, node, err)
		}
		return p
	}
	// Three volumes of three replicas each on nodes a, b, c, and more: with two ports
	// per node, a cluster-wide port would have held two volumes.
	for _, node := range []string{"a", "b", "c"} {
		x, y := port("x", "x-"+node, node), port("y", "y-"+node, node)
		if x == y {
			t.Fatalf("node %s: x and y share port %d", node, x)
		}
		if again := port("x", "x-"+node, node); again != x {
			t.Fatalf("node %s: x's member got %d, then %d: a member keeps its port", node, x, again)
		}
	}
	port("w", "w-d", "d")
	port("w", "w-e", "e")
	if !a.NodeFull("a") || a.NodeFull("d") || a.NodeFull("f") {
		t.Fatalf("NodeFull: a %v (2 of 2 held), d %v (1 of 2), f %v (none)", a.NodeFull("a"), a.NodeFull("d"), a.NodeFull("f"))
	}
	_, err := a.Port("z", "z-a", "a", 0, 0)
	var ex *ExhaustedError
	if !errors.As(err, &ex) || ex.What != "port" || ex.Node != "a" {
		t.Fatalf("a third member on node a: got %v, want port exhaustion on a", err)
	}
	for _, want := range []string{"status.datamesh.members[z-a].port", "no free DRBD port in 7000-7001 on node a", "unique on its node",
		"at most 2 replicas", "--port-range", "open the added ports"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q does not say %q (the field, what ran out, the rule, the cap and what lifts it)", err, want)
		}
	}
	// A member that left the datamesh frees its port on its node, and only there.
	a.RetainMembers("x", func(m string) bool { return m != "x-a" })
	if a.NodeFull("a") != false || !a.NodeFull("b") {
		t.Fatalf("after x-a left: NodeFull a %v (want false), b %v (want true)", a.NodeFull("a"), a.NodeFull("b"))
	}
	if p := port("z", "z-a", "a"); p == port("y", "y-a", "a") {
		t.Fatalf("z-a got y-a's port %d", p)
	}
	// A deleted volume frees every member's port.
	a.Release("y")
	if a.NodeFull("b") || a.NodeFull("c") {
		t.Fatal("y's ports on b and c were not freed with the volume")
	}
}

// A restarted controller rebuilds from the statuses: the members' own ports on their
// nodes, the volume-wide port of members published before members had ports, and the
// minors; nothing held is handed out again, and a value held twice is reported.
func TestAllocatorRebuilt(t *testing.T) {
	rv := func(name string, port, minor int32, members ...v1.DatameshMember) v1.ReplicatedVolume {
		r := v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: name}}
		r.Status.Datamesh.Port, r.Status.Datamesh.Minor, r.Status.Datamesh.Members = port, minor, members
		r.Status.DatameshRevision = 1
		return r
	}
	member := func(name, node string, port int32) v1.DatameshMember {
		return v1.DatameshMember{Name: name, NodeName: node, Port: port}
	}
	b := NewAllocator(7000, 7002, 5, 100)
	if c := b.Load([]v1.ReplicatedVolume{
		rv("old", 7000, 5, member("old-a", "a", 0), member("old-b", "b", 0)), // one port for all, as volumes were formed before
		rv("new", 0, 6, member("new-a", "a", 7001), member("new-c", "c", 7000)),
		{ObjectMeta: metav1.ObjectMeta{Name: "unallocated"}},
	}); len(c) != 0 {
		t.Fatalf("conflicts %v", c)
	}
	if p, err := b.Port("third", "third-a", "a", 0, 0); err != nil || p != 7002 {
		t.Fatalf("a new member on a got %d (%v): 7000 (old) and 7001 (new) are held there", p, err)
	}
	if p, _ := b.Port("third", "third-c", "c", 0, 0); p == 7000 {
		t.Fatal("a new member on c got 7000, which new-c holds")
	}
	if p, _ := b.Port("old", "old-a", "a", 0, 7000); p != 7000 {
		t.Fatalf("old-a lost its port: %d", p)
	}
	if p, _ := b.Port("new", "new-a", "a", 0, 0); p != 7001 {
		t.Fatalf("new-a lost its port: %d", p)
	}
	// A volume formed with one port for all gives a new member that port where it is
	// free on the member's node (agents of an earlier version render it the same).
	if p, _ := b.Port("old", "old-d", "d", 0, 7000); p != 7000 {
		t.Fatalf("old's new member on d got %d, want the volume's 7000 (free on d)", p)
	}
	if p, _ := b.Port("old", "old-c", "c", 0, 7000); p == 7000 {
		t.Fatal("old's new member on c got 7000, which new-c holds there")
	}
	if m, _ := b.Minor("fresh"); m == 5 || m == 6 {
		t.Fatalf("a new volume got minor %d, which a loaded one holds", m)
	}
	if c := b.Load([]v1.ReplicatedVolume{rv("dup", 0, 50, member("dup-a", "a", 7001))}); len(c) != 1 || !strings.Contains(c[0], "port 7001 on node a") {
		t.Fatalf("a port held twice on one node must be reported, got %v", c)
	}
}

func TestEligibleNodes(t *testing.T) {
	now := time.Now()
	d := int32(10)
	mkLease := func(node, capacity string) *coordinationv1.Lease {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: v1.AgentLeasePrefix + node, Annotations: map[string]string{}},
			Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: &d, RenewTime: &metav1.MicroTime{Time: now}}}
		if capacity != "" {
			l.Annotations[v1.AnnotationPoolCapacityPrefix+"fast"] = capacity
		}
		return l
	}
	nodes := []corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{v1.LabelZone: "z1", "disk": "ssd"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "b", Labels: map[string]string{v1.LabelZone: "z2", "disk": "ssd", v1.LabelCordon: "true"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "c", Labels: map[string]string{v1.LabelZone: "z3", "disk": "hdd"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "d", Labels: map[string]string{v1.LabelZone: "z1", "disk": "ssd"}}},
	}
	leases := map[string]*coordinationv1.Lease{
		"a": mkLease("a", "total=100,free=60"), "b": mkLease("b", "total=100,free=100"), "c": mkLease("c", "total=1,free=1"),
		"d": mkLease("d", ""),
	}
	rsp := &v1.ReplicatedStoragePool{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Spec: v1.ReplicatedStoragePoolSpec{Type: v1.PoolTypeFile,
		File: &v1.FilePool{Directory: "/var/lib/meshvol"}, NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"disk": "ssd"}}}}
	got, err := EligibleNodes(rsp, nodes, leases, now, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].NodeName != "a" || got[1].NodeName != "b" || got[2].NodeName != "d" {
		t.Fatalf("eligible %+v, want a, b, d (c does not match the selector)", got)
	}
	if !got[0].Ready || got[0].FreeCapacity.Value() != 60 || got[0].Zone != "z1" {
		t.Errorf("a: %+v", got[0])
	}
	if !got[1].Unschedulable {
		t.Errorf("b is cordoned: %+v", got[1])
	}
	if got[2].Ready {
		t.Errorf("d reports no capacity for the pool, so it is not ready: %+v", got[2])
	}

	// An agent that reports missing prerequisites makes its node not ready, and the
	// pool's message says what is missing.
	leases["a"].Annotations[v1.AnnotationPrerequisites] = "drbd kernel module: not loaded (no /proc/drbd)"
	if got, _ := EligibleNodes(rsp, nodes, leases, now, 10*time.Second); got[0].Ready {
		t.Errorf("a reports missing prerequisites but is ready: %+v", got[0])
	}
	if msg := missingPrerequisites(got, leases); msg != "; node a is missing prerequisites: drbd kernel module: not loaded (no /proc/drbd)" {
		t.Errorf("pool message suffix %q", msg)
	}
	delete(leases["a"].Annotations, v1.AnnotationPrerequisites)

	// Capacity drift below min(1%, 1GiB) is not a change; a node's readiness is.
	q := func(v int64) *resource.Quantity { return resource.NewQuantity(v, resource.BinarySI) }
	base := []v1.EligibleNode{{NodeName: "a", Ready: true, TotalCapacity: q(1000 << 30), FreeCapacity: q(500 << 30)}}
	small := []v1.EligibleNode{{NodeName: "a", Ready: true, TotalCapacity: q(1000 << 30), FreeCapacity: q(500<<30 - 512<<20)}}
	big := []v1.EligibleNode{{NodeName: "a", Ready: true, TotalCapacity: q(1000 << 30), FreeCapacity: q(498 << 30)}}
	unready := []v1.EligibleNode{{NodeName: "a", Ready: false, TotalCapacity: q(1000 << 30), FreeCapacity: q(500 << 30)}}
	if EligibleChanged(base, small) {
		t.Error("512Mi on a 1000Gi pool is below the threshold")
	}
	if !EligibleChanged(base, big) || !EligibleChanged(base, unready) {
		t.Error("2Gi drift and a readiness change must be written")
	}
}

func TestChooseAlgorithm(t *testing.T) {
	pref := []string{"sha256", "sha1", "md5"}
	for _, tc := range []struct {
		offers [][]string
		want   string
	}{
		{nil, "sha256"},
		{[][]string{{"sha256", "sha1"}, {"sha1", "sha256"}}, "sha256"},
		{[][]string{{"sha256", "sha1"}, {"sha1", "md5"}}, "sha1"},
		{[][]string{{"md5"}, {"sha1"}, {"sha1"}}, "sha1"},
	} {
		if got, _ := ChooseAlgorithm(pref, tc.offers); got != tc.want {
			t.Errorf("ChooseAlgorithm(%v) = %s, want %s", tc.offers, got, tc.want)
		}
	}
	if _, ok := ChooseAlgorithm(pref, [][]string{{"crc32c"}}); ok {
		t.Error("no preferred algorithm offered must be refused")
	}
}

// A Lease renewal that changes only a pool's capacity figures wakes only the volumes
// that wait for room; any other fact, the liveness verdict, or a pool reported for the
// first time or no longer (the node becomes ready or unready in it) wakes the node's
// volumes.
func TestOnlyCapacityChanged(t *testing.T) {
	now := time.Now()
	c := &Controller{opts: Options{Now: func() time.Time { return now }, AgentGracePeriod: 10 * time.Second}}
	secs := int32(10)
	lease := func(renewed time.Time, ann map[string]string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: v1.AgentLeasePrefix + "n1", Annotations: ann},
			Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: renewed}, LeaseDurationSeconds: &secs}}
	}
	base := map[string]string{v1.AnnotationAddresses: "10.0.0.1", v1.AnnotationPoolCapacityPrefix + "p": "total=10,free=9"}
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		m[k] = v
		return m
	}
	for _, tc := range []struct {
		name string
		old  *coordinationv1.Lease
		new  *coordinationv1.Lease
		want bool
	}{
		{"capacity", lease(now, base), lease(now, with(v1.AnnotationPoolCapacityPrefix+"p", "total=10,free=5")), true},
		{"new pool", lease(now, base), lease(now, with(v1.AnnotationPoolCapacityPrefix+"q", "total=1,free=1")), false},
		{"pool withdrawn", lease(now, with(v1.AnnotationPoolCapacityPrefix+"q", "total=1,free=1")), lease(now, base), false},
		{"addresses", lease(now, base), lease(now, with(v1.AnnotationAddresses, "10.0.0.2")), false},
		{"back from expiry", lease(now.Add(-time.Minute), base), lease(now, with(v1.AnnotationPoolCapacityPrefix+"p", "total=10,free=5")), false},
	} {
		if got := c.onlyCapacityChanged(tc.old, tc.new); got != tc.want {
			t.Errorf("%s: onlyCapacityChanged = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// What a volume waits for, by which the index finds the volumes a node's change wakes.
func TestWaitingFor(t *testing.T) {
	cond := func(typ string, s metav1.ConditionStatus) metav1.Condition {
		return metav1.Condition{Type: typ, Status: s}
	}
	for _, tc := range []struct {
		name string
		st   v1.ReplicatedVolumeStatus
		want string
	}{
		{"ready", v1.ReplicatedVolumeStatus{Phase: v1.VolumePhaseReady, Conditions: []metav1.Condition{cond(v1.ConditionScheduled, metav1.ConditionTrue)}}, ""},
		{"forming", v1.ReplicatedVolumeStatus{Phase: v1.VolumePhaseForming}, waitingNodes},
		{"no room", v1.ReplicatedVolumeStatus{Phase: v1.VolumePhasePending, Conditions: []metav1.Condition{cond(v1.ConditionScheduled, metav1.ConditionFalse)}},
			waitingNodes + "," + waitingRoom},
		{"no port", v1.ReplicatedVolumeStatus{Phase: v1.VolumePhaseReady, Conditions: []metav1.Condition{cond(v1.ConditionAllocated, metav1.ConditionFalse)}}, waitingNodes},
	} {
		if got := strings.Join(waitingFor(&v1.ReplicatedVolume{Status: tc.st}), ","); got != tc.want {
			t.Errorf("%s: waitingFor = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// lostMembers names, on a lost node no live peer reaches, every replica the datamesh
// still waits for: a member (and ForceDetach when it is attached), and one that already
// left the member list while its RemoveReplica's last step waits for its confirmation —
// else that transition would wait for ever (the model checker's I5 with the
// controller's rule modelled). A replica that never joined is not named (it is deleted).
func TestLostMembersNamesEveryReplicaTheDatameshWaitsFor(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	lease := func(node string, renewedAgo time.Duration) *coordinationv1.Lease {
		d := int32(6)
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: v1.AgentLeasePrefix + node},
			Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: &d, RenewTime: &metav1.MicroTime{Time: now.Add(-renewedAgo)}}}
	}
	rvr := func(name, node string) *v1.ReplicatedVolumeReplica {
		return &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.ReplicatedVolumeReplicaSpec{NodeName: node}}
	}
	rv := &v1.ReplicatedVolume{}
	rv.Status.Datamesh.Members = []v1.DatameshMember{{Name: "r-live", NodeName: "live"}, {Name: "r-lost", NodeName: "lost", Attached: true}}
	rv.Status.DatameshTransitions = []v1.DatameshTransition{{Type: v1.TransitionRemoveReplica, ReplicaName: "r-leaving"}}
	v := &volume{rv: rv, now: now, leases: map[string]*coordinationv1.Lease{
		"live": lease("live", time.Second), "lost": lease("lost", time.Minute), "gone": lease("gone", time.Minute), "new": lease("new", time.Minute)}}
	c := &Controller{opts: Options{AgentGracePeriod: 3 * time.Second}}
	forceLeave, forceDetach := c.lostMembers(v, []*v1.ReplicatedVolumeReplica{
		rvr("r-live", "live"), rvr("r-lost", "lost"), rvr("r-leaving", "gone"), rvr("r-never-joined", "new")})
	if strings.Join(forceLeave, ",") != "r-lost,r-leaving" || strings.Join(forceDetach, ",") != "r-lost" {
		t.Fatalf("ForceLeave %v, ForceDetach %v; want [r-lost r-leaving], [r-lost]", forceLeave, forceDetach)
	}
}

// The cache keeps the data of the cluster key's Secret alone: of a volume's own Secret,
// and of any other Secret of the namespace, the controller needs only the metadata.
func TestSecretCacheKeepsOnlyTheKeysData(t *testing.T) {
	for name, keep := range map[string]bool{v1.SecretDRBDKey: true, SecretName("pvc-1"): false, "sh.helm.release.v1.meshvol.v1": false} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"a": "b"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}},
			Data: map[string][]byte{"k": []byte("v")}, StringData: map[string]string{"k": "v"}}
		if _, err := secretMetaExceptKey(s); err != nil {
			t.Fatal(err)
		}
		if (s.Data != nil) != keep || s.ManagedFields != nil || s.Labels["a"] != "b" {
			t.Errorf("%s: data kept %v (want %v), managedFields %v, labels %v", name, s.Data != nil, keep, s.ManagedFields, s.Labels)
		}
	}
}

// A new volume's secret is derived only while every agent whose node exists announces
// it knows derived references; a Lease whose Node is gone does not count, an expired
// one does (its node may come back with the agent it had), and an announcement written
// by another version than the one renewing the Lease is void.
func TestDerivationHoldout(t *testing.T) {
	lease := func(writer, renewer string) *coordinationv1.Lease {
		ann := map[string]string{v1.AnnotationAgentVersion: renewer}
		if writer != "" {
			ann[v1.AnnotationCapabilities] = v1.CapabilityDerivedSharedSecret
			ann[v1.AnnotationCapabilitiesAgentVersion] = writer
		}
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Annotations: ann}}
	}
	nodes := map[string]*corev1.Node{}
	for _, n := range []string{"a", "b", "c"} {
		nodes[n] = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}
	}
	for _, tc := range []struct {
		name   string
		leases map[string]*coordinationv1.Lease
		want   string
	}{
		{"every agent announces", map[string]*coordinationv1.Lease{"a": lease("v2", "v2"), "b": lease("v2", "v2")}, ""},
		{"no agent yet", map[string]*coordinationv1.Lease{}, ""},
		{"one agent of the earlier version", map[string]*coordinationv1.Lease{"a": lease("v2", "v2"), "c": lease("", "v1"), "b": lease("", "v1")}, "b"},
		{"an earlier agent renews a newer one's Lease", map[string]*coordinationv1.Lease{"a": lease("v2", "v2"), "c": lease("v2", "v1")}, "c"},
		{"the earlier agent's Node is gone", map[string]*coordinationv1.Lease{"a": lease("v2", "v2"), "gone": lease("", "v1")}, ""},
	} {
		if got := derivationHoldout(tc.leases, nodes); got != tc.want {
			t.Errorf("%s: holdout %q, want %q", tc.name, got, tc.want)
		}
	}
}
