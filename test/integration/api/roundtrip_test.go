package api

import (
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/meshvol/meshvol/internal/testenv"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// A fixed instant with whole seconds: metav1.Time travels as RFC 3339 without fractions,
// so a sub-second value would not round-trip and the comparison would be about the wire
// format, not the API.
var (
	t0 = metav1.NewTime(time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC))
	t1 = metav1.NewTime(t0.Add(53 * time.Second))
)

func ptr[T any](v T) *T { return &v }

func qty(s string) resource.Quantity { return resource.MustParse(s) }

func qtyPtr(s string) *resource.Quantity { return ptr(resource.MustParse(s)) }

// cond is a condition with every field set, so conditions round-trip in full too.
func cond(typ, status, reason, msg string) metav1.Condition {
	return metav1.Condition{
		Type: typ, Status: metav1.ConditionStatus(status), ObservedGeneration: 1,
		LastTransitionTime: t0, Reason: reason, Message: msg,
	}
}

// drbdOptions sets every override, with explicit false and 0 among them: nil means
// "inherit" and a set zero means "explicitly off" (drbd.OptionSet), so a zero must survive
// the apiserver as a set value, not vanish as an omitted one.
func drbdOptions() *v1.DRBDOptions {
	return &v1.DRBDOptions{
		OnNoQuorum:                ptr("suspend-io"),
		OnNoDataAccessible:        ptr("io-error"),
		DiscardZeroesIfAligned:    ptr(false),
		RsDiscardGranularity:      ptr(int32(0)),
		AllowRemoteRead:           ptr(false),
		PingTimeoutTenthsOfSecond: ptr(int32(5)),
		ResyncMaxRateKiB:          ptr(int32(102400)),
	}
}

// Fixtures: for each kind, objects that between them set every field of spec and
// status. TestRoundTripFixturesCoverEveryField keeps them honest as the API grows.

func rvAutoFixture(name string) *v1.ReplicatedVolume {
	return &v1.ReplicatedVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.ReplicatedVolumeSpec{
			Size:                       qty("10Gi"),
			ConfigurationMode:          v1.ConfigurationModeAuto,
			ReplicatedStorageClassName: "rsc-3d",
			MaxAttachments:             2,
			DRBDOptions:                drbdOptions(),
			PlacementHints: &v1.PlacementHints{
				Requisite: []v1.TopologySegment{{Zone: "zone-a"}, {NodeName: "node-1", Zone: "zone-b"}},
				Preferred: []v1.TopologySegment{{NodeName: "node-1"}, {Zone: "zone-b"}},
			},
			QuorumOverride: &v1.QuorumOverride{Quorum: ptr(int32(1)), QuorumMinimumRedundancy: ptr(int32(1)), Reason: "two nodes lost; serve from node-1 (ticket 42)"},
		},
		Status: v1.ReplicatedVolumeStatus{
			ObservedGeneration: 1,
			Phase:              v1.VolumePhaseReconfiguring,
			Conditions: []metav1.Condition{
				cond("Configured", "True", "ResolvedFromStorageClass", "configuration resolved from rsc-3d"),
				cond("Ready", "False", "TransitionsInFlight", "AddReplica(D) of replica #3 at step 2/2"),
			},
			Configuration: &v1.ReplicatedVolumeConfiguration{
				StoragePool:                     "pool-a",
				FailuresToTolerate:              1,
				GuaranteedMinimumDataRedundancy: 1,
				Topology:                        v1.TopologyTransZonal,
				Zones:                           []string{"zone-a", "zone-b", "zone-c"},
				VolumeAccess:                    v1.VolumeAccessLocal,
			},
			EffectiveLayout: &v1.Layout{FailuresToTolerate: 1, GuaranteedMinimumDataRedundancy: 0},
			Datamesh: v1.Datamesh{
				Members: []v1.DatameshMember{
					{Name: name + "-0", Type: v1.MemberTypeDiskful, NodeName: "node-1", Zone: "zone-a", Addresses: []string{"10.0.0.1", "fd00::1"}, NodeID: 0, Attached: true},
					{Name: name + "-1", Type: v1.MemberTypeDiskful, NodeName: "node-2", Zone: "zone-b", Addresses: []string{"10.0.0.2"}, NodeID: 1, Port: 7001},
					{Name: name + "-3", Type: v1.MemberTypeLiminalDiskful, NodeName: "node-3", Zone: "zone-c", Addresses: []string{"10.0.0.3"}, NodeID: 3},
				},
				Quorum:                  2,
				QuorumMinimumRedundancy: 1,
				Multiattach:             true,
				Port:                    7001,
				Minor:                   1001,
				Size:                    qtyPtr("10Gi"),
				SharedSecret: &v1.SharedSecretReference{SecretName: "meshvol-drbd-key", Key: "key", Algorithm: "sha256",
					Derivation: v1.DerivationHMACSHA256, KeyFingerprint: "a056d92a0ef9f0f5"},
			},
			DatameshRevision: 7,
			DatameshTransitions: []v1.DatameshTransition{{
				Type:          v1.TransitionAddReplica,
				Group:         v1.GroupVotingMembership,
				ReplicaName:   name + "-3",
				ReplicaNodeID: ptr[int32](3),
				FromType:      v1.MemberTypeAccess,
				ToType:        v1.MemberTypeDiskful,
				PlanID:        "diskful-q-up",
				PlanVersion:   1,
				Steps: []v1.DatameshTransitionStep{
					{Name: "A → D∅ + q↑", Status: v1.StepCompleted, DatameshRevision: 6, StartedAt: &t0, CompletedAt: &t1, Message: "3/3 replicas confirmed revision 6"},
					{Name: "D∅ → D", Status: v1.StepActive, DatameshRevision: 7, StartedAt: &t1, Message: "2/3 replicas confirmed revision 7. Waiting: [#3]"},
				},
			}},
			DatameshReplicaRequests: []v1.DatameshReplicaRequest{
				{Name: name + "-3", Operation: v1.ReplicaOperationJoin, Type: v1.ReplicaTypeDiskful, Message: "running as AddReplica(D)"},
			},
			Layout:       "2D+1D∅",
			ReadyMembers: "2/3",
			SyncProgress: "87%",
		},
	}
}

func rvManualFixture(name string) *v1.ReplicatedVolume {
	rv := rvAutoFixture(name)
	rv.Spec.ConfigurationMode = v1.ConfigurationModeManual
	rv.Spec.ReplicatedStorageClassName = ""
	rv.Spec.ManualConfiguration = &v1.ReplicatedVolumeConfiguration{
		StoragePool:                     "pool-b",
		FailuresToTolerate:              2,
		GuaranteedMinimumDataRedundancy: 2,
		Topology:                        v1.TopologyZonal,
		Zones:                           []string{"zone-a"},
		VolumeAccess:                    v1.VolumeAccessEventuallyLocal,
	}
	rv.Status.EffectiveLayout = &v1.Layout{FailuresToTolerate: 2, GuaranteedMinimumDataRedundancy: 2}
	rv.Spec.DataSource = &v1.VolumeDataSource{ReplicatedVolumeSnapshotName: "snap-1", NodeName: "node-1.example.com"}
	return rv
}

func rvsFixture(name string) *v1.ReplicatedVolumeSnapshot {
	at := metav1.NewTime(time.Date(2026, 11, 27, 3, 0, 0, 0, time.UTC))
	return &v1.ReplicatedVolumeSnapshot{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.ReplicatedVolumeSnapshotSpec{ReplicatedVolumeName: "pvc-1"},
		Status: v1.ReplicatedVolumeSnapshotStatus{
			Phase:   v1.SnapshotReady,
			Attempt: 2,
			Participants: []v1.SnapshotParticipant{
				{NodeName: "node-1", ReplicaName: "pvc-1-node-1", Diskful: true},
				{NodeName: "node-3", ReplicaName: "pvc-1-node-3"},
			},
			SuspendDeadline: &at,
			CreationTime:    &at,
			Size:            qtyPtr("10Gi"),
			StoragePool:     "pool-a",
			ReadyToUse:      true,
			Copies:          []string{"node-1"},
			Message:         "Ready: 1 copy",
			Nodes: []v1.SnapshotNodeStatus{
				{NodeName: "node-1", Attempt: 2, Suspended: true, Message: "resume-io failed: timeout",
					Copy: &v1.SnapshotCopy{Attempt: 2, Pool: "pool-a", Name: "snap-1.a2", SizeBytes: 10 << 30}},
			},
		},
	}
}

func rvrFixture(name string) *v1.ReplicatedVolumeReplica {
	return &v1.ReplicatedVolumeReplica{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.ReplicatedVolumeReplicaSpec{
			ReplicatedVolumeName: "pvc-1",
			NodeName:             "node-1.example.com",
			Type:                 v1.ReplicaTypeShadowDiskful,
			// A real replica sets only the fields of its pool type; the API does not
			// restrict the combination, and the round trip wants every field.
			Storage:     &v1.ReplicaStorage{Pool: "pool-a", VolumeGroup: "vg-data", ThinPool: "thin", Directory: "/var/lib/meshvol"},
			DRBDOptions: drbdOptions(),
		},
		Status: v1.ReplicatedVolumeReplicaStatus{
			ObservedGeneration: 1,
			DatameshRevision:   7,
			Addresses:          []string{"10.0.0.1", "fd00::1"},
			DiskState:          v1.DiskStateUpToDate,
			Role:               v1.RolePrimary,
			// false, not nil: "DRBD says no quorum" differs from "not reported".
			Quorum:        ptr(false),
			IOSuspended:   true,
			DevicePath:    "/dev/drbd1001",
			BackingVolume: &v1.BackingVolumeStatus{Name: "pvc-1_00000", DevicePath: "/dev/vg-data/pvc-1_00000", Size: qty("10244Mi")},
			Peers: []v1.PeerStatus{
				{
					Name: "pvc-1-1", NodeID: ptr(int32(0)), ConnectionState: "Connected", ReplicationState: "SyncSource",
					PeerDiskState: v1.DiskStateInconsistent,
					Resync:        &v1.ResyncProgress{PercentDone: 13, OutOfSyncBytes: 10737418240, SecondsRemaining: ptr(int64(0))},
				},
				{Name: "pvc-1-2", NodeID: ptr(int32(2)), ConnectionState: "Connected", ReplicationState: "Established", PeerDiskState: v1.DiskStateUpToDate},
			},
			Conditions: []metav1.Condition{
				cond(v1.ConditionDRBDConfigured, "True", v1.ReasonConfigured, "DRBD runs datamesh revision 7"),
				cond("InSync", "False", "Resyncing", "peer pvc-1-1 is 13% synced"),
			},
		},
	}
}

func rvaFixture(name string) *v1.ReplicatedVolumeAttachment {
	return &v1.ReplicatedVolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.ReplicatedVolumeAttachmentSpec{ReplicatedVolumeName: "pvc-1", NodeName: "node-1.example.com"},
		Status: v1.ReplicatedVolumeAttachmentStatus{
			ObservedGeneration: 1,
			Phase:              v1.AttachmentAttached,
			DevicePath:         "/dev/drbd1001",
			Conditions:         []metav1.Condition{cond("Attached", "True", "Attached", "the node may use /dev/drbd1001")},
		},
	}
}

func rscFixture(name string) *v1.ReplicatedStorageClass {
	return &v1.ReplicatedStorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.ReplicatedStorageClassSpec{
			StoragePool:                     "pool-a",
			FailuresToTolerate:              ptr(int32(1)),
			GuaranteedMinimumDataRedundancy: ptr(int32(0)),
			Topology:                        v1.TopologyTransZonal,
			Zones:                           []string{"zone-a", "zone-b", "zone-c"},
			VolumeAccess:                    v1.VolumeAccessAny,
			ReclaimPolicy:                   v1.ReclaimRetain,
			DRBDOptions:                     drbdOptions(),
		},
		Status: v1.ReplicatedStorageClassStatus{
			ObservedGeneration: 1,
			Conditions:         []metav1.Condition{cond("Ready", "False", "NotEnoughZones", "TransZonal 2D+1TB needs 3 zones with eligible nodes; pool-a has 2")},
		},
	}
}

func rscLegacyFixture(name string) *v1.ReplicatedStorageClass {
	rsc := rscFixture(name)
	rsc.Spec.FailuresToTolerate = nil
	rsc.Spec.GuaranteedMinimumDataRedundancy = nil
	rsc.Spec.Replication = ptr(v1.ReplicationConsistencyAndAvailability)
	return rsc
}

func rspThinFixture(name string) *v1.ReplicatedStoragePool {
	return &v1.ReplicatedStoragePool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.ReplicatedStoragePoolSpec{
			Type: v1.PoolTypeLVMThin,
			VolumeGroups: []v1.PoolVolumeGroup{
				{NodeName: "node-1", Name: "vg-data", ThinPool: "thin"},
				{NodeName: "node-2", Name: "vg_ssd.0", ThinPool: "thin-ssd"},
			},
			NodeSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"storage.meshvol.io/pool-a": ""},
				MatchExpressions: []metav1.LabelSelectorRequirement{
					{Key: "node-role.kubernetes.io/control-plane", Operator: metav1.LabelSelectorOpDoesNotExist},
					{Key: "topology.kubernetes.io/zone", Operator: metav1.LabelSelectorOpIn, Values: []string{"zone-a", "zone-b"}},
				},
			},
			Zones: []string{"zone-a", "zone-b"},
		},
		Status: v1.ReplicatedStoragePoolStatus{
			ObservedGeneration: 1,
			EligibleNodes: []v1.EligibleNode{
				{NodeName: "node-1", Zone: "zone-a", Ready: true, TotalCapacity: qtyPtr("1Ti"), FreeCapacity: qtyPtr("512Gi")},
				{NodeName: "node-2", Zone: "zone-b", Ready: false, Unschedulable: true, TotalCapacity: qtyPtr("2Ti"), FreeCapacity: qtyPtr("0")},
			},
			Conditions: []metav1.Condition{cond("Ready", "True", "NodesEligible", "2 nodes, 1 ready")},
		},
	}
}

func rspFileFixture(name string) *v1.ReplicatedStoragePool {
	rsp := rspThinFixture(name)
	rsp.Spec.Type = v1.PoolTypeFile
	rsp.Spec.VolumeGroups = nil
	rsp.Spec.File = &v1.FilePool{Directory: "/var/lib/meshvol/pool"}
	return rsp
}

// roundTrip names each kind's fixtures; a kind's fixtures together cover its fields.
var roundTrip = []struct {
	kind     string
	fixtures []func(name string) client.Object
}{
	{"ReplicatedVolume", []func(string) client.Object{
		func(n string) client.Object { return rvAutoFixture(n) },
		func(n string) client.Object { return rvManualFixture(n) },
	}},
	{"ReplicatedVolumeReplica", []func(string) client.Object{
		func(n string) client.Object { return rvrFixture(n) },
	}},
	{"ReplicatedVolumeAttachment", []func(string) client.Object{
		func(n string) client.Object { return rvaFixture(n) },
	}},
	{"ReplicatedStorageClass", []func(string) client.Object{
		func(n string) client.Object { return rscFixture(n) },
		func(n string) client.Object { return rscLegacyFixture(n) },
	}},
	{"ReplicatedVolumeSnapshot", []func(string) client.Object{
		func(n string) client.Object { return rvsFixture(n) },
	}},
	{"ReplicatedStoragePool", []func(string) client.Object{
		func(n string) client.Object { return rspThinFixture(n) },
		func(n string) client.Object { return rspFileFixture(n) },
	}},
}

// apiEqual compares API values as the API means them: quantities by value (the
// apiserver may keep "10Gi" while Go builds it from bytes) and times by instant (the
// decoder returns local time).
var apiEqual = []cmp.Option{
	cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 }),
	cmp.Comparer(func(a, b metav1.Time) bool { return a.Equal(&b) }),
	cmpopts.IgnoreTypes(metav1.TypeMeta{}, metav1.ObjectMeta{}),
}

// halves splits a typed object into the two apply configurations its two writers would
// send: the spec half for the main resource, the status half for the status subresource.
func halves(t *testing.T, obj client.Object) (spec, status *unstructured.Unstructured) {
	t.Helper()
	gvk, err := apiutil.GVKForObject(obj, env.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	half := func(key string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{key: m[key]}}
		u.SetGroupVersionKind(gvk)
		u.SetName(obj.GetName())
		return u
	}
	return half("spec"), half("status")
}

// TestRoundTrip creates every fixture with server-side apply (spec by one manager, status
// by another through the status subresource), reads it back with the typed client and
// compares every field of spec and status.
func TestRoundTrip(t *testing.T) {
	for _, k := range roundTrip {
		for i, fixture := range k.fixtures {
			t.Run(k.kind+"/"+string(rune('a'+i)), func(t *testing.T) {
				name := testenv.Name(t)
				want := fixture(name)
				spec, status := halves(t, want)
				mustApply(t, spec, managerUser)
				mustApplyStatus(t, status, managerController)

				got := reflect.New(reflect.TypeOf(want).Elem()).Interface().(client.Object)
				if err := env.Client.Get(ctx(t), client.ObjectKey{Name: name}, got); err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(want, got, apiEqual...); diff != "" {
					t.Errorf("%s %s changed on the round trip (-sent +read):\n%s", k.kind, name, diff)
				}
			})
		}
	}
}

// TestRoundTripFixturesCoverEveryField fails when a field of spec or status is zero in
// every fixture of its kind: a field added to the API without a fixture value would
// otherwise pass TestRoundTrip without ever travelling (and a CRD that prunes it would
// go unnoticed). It needs no apiserver, but lives here with the fixtures it checks.
func TestRoundTripFixturesCoverEveryField(t *testing.T) {
	for _, k := range roundTrip {
		seen := map[string]bool{}
		for _, fixture := range k.fixtures {
			v := reflect.ValueOf(fixture("x")).Elem()
			cover(v.FieldByName("Spec"), "spec", true, seen)
			cover(v.FieldByName("Status"), "status", true, seen)
		}
		var missing []string
		for path, set := range seen {
			if !set {
				missing = append(missing, path)
			}
		}
		sort.Strings(missing)
		if len(missing) > 0 {
			t.Errorf("%s: no fixture sets %s", k.kind, strings.Join(missing, ", "))
		}
	}
}

// leafTypes are walked no further: their zero-ness is the whole story.
var leafTypes = map[reflect.Type]bool{
	reflect.TypeOf(metav1.Time{}):       true,
	reflect.TypeOf(resource.Quantity{}): true,
}

// cover records, for v and everything below it, whether it is set. live is false under
// a nil pointer or an empty list, where the walk goes on through zero values only to
// register the paths that exist.
func cover(v reflect.Value, path string, live bool, seen map[string]bool) {
	// false and 0 are legitimate values but cannot show that a field travels, so a
	// scalar counts as covered only when some fixture sets it to something else.
	seen[path] = seen[path] || (live && !v.IsZero())
	switch {
	case leafTypes[v.Type()]:
	case v.Kind() == reflect.Pointer:
		if v.IsNil() {
			cover(reflect.Zero(v.Type().Elem()), path, false, seen)
		} else {
			cover(v.Elem(), path, live, seen)
		}
	case v.Kind() == reflect.Slice:
		if v.Len() == 0 {
			cover(reflect.Zero(v.Type().Elem()), path+"[]", false, seen)
		}
		for i := 0; i < v.Len(); i++ {
			cover(v.Index(i), path+"[]", live, seen)
		}
	case v.Kind() == reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			f := v.Type().Field(i)
			name := strings.Split(f.Tag.Get("json"), ",")[0]
			if !f.IsExported() || name == "-" || name == "" {
				continue
			}
			cover(v.Field(i), path+"."+name, live, seen)
		}
	}
}
