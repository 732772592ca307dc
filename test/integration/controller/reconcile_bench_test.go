package controller_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh"
)

// BenchmarkReconcileWrite measures the part of one volume's reconcile that the engine
// is in: the deep copy of the cached volume, datamesh.Process, and the server-side apply
// of the status it computed to the real kube-apiserver (as pkg/controller's writeStatus
// does: field manager meshvol-controller, conditional on the resourceVersion read). Each
// op is a reconcile that changes the status, so each apply is a real etcd write; the
// status is put back between ops with the timer stopped. engine-ns/op is the time spent
// in Process alone, engine-% its share of the op: what a faster or slower engine can
// change about a reconcile.
//
//	go test ./test/integration/controller -run '^$' -bench ReconcileWrite -count 6
//
// The cases are the engine's cheapest and dearest reconciles that write:
//   - 3D/admit: a 3D volume whose configuration moved to 4D gets its new Diskful
//     replica: the engine derives the plan, runs the guards, publishes ✦ → A.
//   - 32/detach: a 32-member volume (5D + 27 Access, DRBD's limit; 27 attachments, one
//     served) whose served attachment is deleted: the engine starts the Detach.
func BenchmarkReconcileWrite(b *testing.B) {
	b.Run("3D/admit", func(b *testing.B) {
		v := steadyVolume(b, 1, 1, 0)
		v.rv.Spec.ManualConfiguration.GuaranteedMinimumDataRedundancy = 2
		v.process(b)
		v.addRVR(v1.ReplicaTypeDiskful)
		benchReconcileWrite(b, v)
	})
	b.Run("32/detach", func(b *testing.B) {
		v := steadyVolume(b, 2, 2, 27)
		if n := len(v.rv.Status.Datamesh.Members); n != 32 {
			b.Fatalf("%d members, want 32", n)
		}
		served := -1
		for i, a := range v.process(b).Attachments {
			if a.Attached {
				served = i
			}
		}
		if served < 0 {
			b.Fatal("no attachment is attached")
		}
		now := metav1.NewTime(v.now)
		v.rvas[served].DeletionTimestamp = &now
		benchReconcileWrite(b, v)
	})
}

func benchReconcileWrite(b *testing.B, v *benchVolume) {
	ctx := context.Background()
	cached := v.store(b, ctx)
	eng := datamesh.NewEngine(nil, datamesh.Features{})
	var engine time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		work := cached.DeepCopy()
		t0 := time.Now()
		res, err := eng.Process(&datamesh.Input{RV: work, RVRs: v.rvrs, RVAs: v.rvas, Pool: v.pool, Now: v.now})
		engine += time.Since(t0)
		if err != nil || !res.Changed || equality.Semantic.DeepEqual(cached.Status, work.Status) {
			b.Fatalf("the reconcile changed nothing: err=%v changed=%v", err, res.Changed)
		}
		if err := applyRVStatus(ctx, work.Name, cached.ResourceVersion, &work.Status); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		cached.ResourceVersion = applyAndRead(b, ctx, cached)
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(engine.Nanoseconds())/float64(b.N), "engine-ns/op")
	if el := b.Elapsed(); el > 0 {
		b.ReportMetric(100*float64(engine)/float64(el), "engine-%")
	}
}

// applyRVStatus is pkg/controller's status write: the whole status as an apply of the
// controller's fields, conditional on resourceVersion.
func applyRVStatus(ctx context.Context, name, resourceVersion string, st *v1.ReplicatedVolumeStatus) error {
	raw, err := json.Marshal(st)
	if err != nil {
		return err
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return err
	}
	u := &unstructured.Unstructured{Object: map[string]any{"status": m}}
	u.SetGroupVersionKind(v1.SchemeGroupVersion.WithKind("ReplicatedVolume"))
	u.SetName(name)
	u.SetResourceVersion(resourceVersion)
	return env.Client.Status().Patch(ctx, u, client.Apply, client.FieldOwner(v1.FieldManagerController), client.ForceOwnership)
}

// applyAndRead writes rv's status back and returns the resourceVersion it got.
func applyAndRead(b *testing.B, ctx context.Context, rv *v1.ReplicatedVolume) string {
	if err := applyRVStatus(ctx, rv.Name, "", &rv.Status); err != nil {
		b.Fatal(err)
	}
	got := &v1.ReplicatedVolume{}
	if err := env.Client.Get(ctx, types.NamespacedName{Name: rv.Name}, got); err != nil {
		b.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(got.Status, rv.Status) {
		b.Fatalf("status did not round-trip through the apiserver:\nwrote %+v\nread  %+v", rv.Status, got.Status)
	}
	return got.ResourceVersion
}

// benchVolume is a volume driven to a steady state by the engine alone, standing in for
// the controller, placement and agents: placement puts each wanted replica on the next
// free node, and every agent confirms every revision at once with an UpToDate disk.
type benchVolume struct {
	rv    *v1.ReplicatedVolume
	rvrs  []*v1.ReplicatedVolumeReplica
	rvas  []*v1.ReplicatedVolumeAttachment
	pool  *datamesh.Pool
	eng   *datamesh.Engine
	now   time.Time
	nodes int
}

// steadyVolume forms a volume of layout (ftt, gmdr) plus access Access replicas, each
// with an attachment on its node (maxAttachments 1: one served, the rest waiting), and
// settles it: no transition in flight, every replica confirmed.
func steadyVolume(b *testing.B, ftt, gmdr int32, access int) *benchVolume {
	v := &benchVolume{eng: datamesh.NewEngine(nil, datamesh.Features{}), now: time.Now().UTC().Truncate(time.Second)}
	v.pool = &datamesh.Pool{Name: "bench-pool", Available: true}
	for i := 1; i <= 40; i++ {
		v.pool.Nodes = append(v.pool.Nodes, v1.EligibleNode{NodeName: "n" + strconv.Itoa(i), Zone: "z1", Ready: true})
	}
	v.rv = &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: benchName(b)}, Spec: v1.ReplicatedVolumeSpec{
		Size: resource.MustParse("1Gi"), ConfigurationMode: v1.ConfigurationModeManual,
		ManualConfiguration: &v1.ReplicatedVolumeConfiguration{StoragePool: "bench-pool", FailuresToTolerate: ftt,
			GuaranteedMinimumDataRedundancy: gmdr, Topology: v1.TopologyIgnored, VolumeAccess: v1.VolumeAccessPreferablyLocal}}}
	v.settle(b)
	for i := 0; i < access; i++ {
		r := v.addRVR(v1.ReplicaTypeAccess)
		a := &v1.ReplicatedVolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "rva-" + r.Spec.NodeName,
			CreationTimestamp: metav1.NewTime(v.now.Add(time.Duration(i) * time.Second))}}
		a.Spec.NodeName = r.Spec.NodeName
		v.rvas = append(v.rvas, a)
	}
	v.settle(b)
	return v
}

// benchName is a name for the benchmark's volume, unique per run (b.Name() repeats
// across -count runs, and the volume of an earlier run is still in the apiserver).
func benchName(b *testing.B) string {
	return "bench-" + strconv.FormatInt(time.Now().UnixNano()&0xffffffffff, 16)
}

func (v *benchVolume) process(b *testing.B) datamesh.Result {
	v.now = v.now.Add(time.Second)
	res, err := v.eng.Process(&datamesh.Input{RV: v.rv, RVRs: v.rvrs, RVAs: v.rvas, Pool: v.pool, Now: v.now})
	if err != nil {
		b.Fatal(err)
	}
	return res
}

func (v *benchVolume) addRVR(t v1.ReplicaType) *v1.ReplicatedVolumeReplica {
	v.nodes++
	n := strconv.Itoa(v.nodes)
	r := &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: v.rv.Name + "-r" + n}}
	r.Spec = v1.ReplicatedVolumeReplicaSpec{ReplicatedVolumeName: v.rv.Name, NodeName: "n" + n, Type: t}
	r.Status.Addresses = []string{"10.0.0." + n}
	v.rvrs = append(v.rvrs, r)
	return r
}

// settle runs reconciles, placing wanted replicas and confirming every revision, until
// nothing is in flight and nothing changes.
func (v *benchVolume) settle(b *testing.B) {
	for i := 0; i < 200; i++ {
		res := v.process(b)
		for _, w := range res.Wanted {
			if w.Action == datamesh.WantCreate {
				v.addRVR(w.Type)
			}
		}
		for _, r := range v.rvrs {
			r.Status.DatameshRevision = v.rv.Status.DatameshRevision
			if r.Spec.Type == v1.ReplicaTypeDiskful {
				r.Status.DiskState = v1.DiskStateUpToDate
			}
		}
		if !res.Changed && len(res.Wanted) == 0 && len(v.rv.Status.DatameshTransitions) == 0 {
			return
		}
	}
	b.Fatalf("volume %s did not settle: %+v", v.rv.Name, v.rv.Status)
}

// store creates the volume in the apiserver with its status and returns it as read
// back, as the controller's cache would hand it over.
func (v *benchVolume) store(b *testing.B, ctx context.Context) *v1.ReplicatedVolume {
	st := v.rv.Status
	rv := v.rv.DeepCopy()
	rv.Status = v1.ReplicatedVolumeStatus{}
	if err := env.Client.Create(ctx, rv); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = env.Client.Delete(context.Background(), rv) })
	rv.Status = st
	rv.ResourceVersion = applyAndRead(b, ctx, rv)
	return rv
}
