package datamesh

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The benchmarks measure what one reconcile asks of the engine: Process from the
// objects in to the status out, on objects as a controller's cache hands them over
// (names are separate allocations, as decoded from JSON), with no deep copy of the input.

// steadyWorld forms a volume of the given layout plus `access` Access members, all
// confirmed and UpToDate, and returns it with the engine warmed up.
func steadyWorld(tb testing.TB, ftt, gmdr, access int) *world {
	w := newWorld()
	for i := 10; i <= 40; i++ {
		w.pool.Nodes = append(w.pool.Nodes, v1.EligibleNode{NodeName: "n" + strconv.Itoa(i), Zone: "z1", Ready: true})
	}
	c := w.rv.Spec.ManualConfiguration
	c.FailuresToTolerate, c.GuaranteedMinimumDataRedundancy = int32(ftt), int32(gmdr)
	if err := w.createReplicas(tb); err != nil {
		tb.Fatal(err)
	}
	w.settleAll(tb)
	for i := 0; i < access; i++ {
		n := len(w.rvrs) + 1
		w.addRVR("r"+strconv.Itoa(n), "n"+strconv.Itoa(n), v1.ReplicaTypeAccess)
		// Keep the Access replicas: an RVA on each node (attachments are served up to
		// maxAttachments; the rest stay Pending, which is steady too).
		a := &v1.ReplicatedVolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "rva-n" + strconv.Itoa(n), CreationTimestamp: metav1.NewTime(w.now.Add(time.Duration(i) * time.Second))}}
		a.Spec.NodeName = "n" + strconv.Itoa(n)
		w.rvas = append(w.rvas, a)
	}
	w.settleAll(tb)
	// The objects as a controller's cache hands them over: decoded from JSON, so no two
	// strings share storage (a string comparison cannot succeed on equal pointers, as
	// it would between a member's name and the RVR it was copied from).
	w.rv = roundTrip(tb, w.rv)
	for i := range w.rvrs {
		w.rvrs[i] = roundTrip(tb, w.rvrs[i])
	}
	for i := range w.rvas {
		w.rvas[i] = roundTrip(tb, w.rvas[i])
	}
	if res, _ := w.process(tb); res.Changed || len(w.rv.Status.DatameshTransitions) != 0 {
		tb.Fatalf("not steady: changed=%v transitions=%d\n%s", res.Changed, len(w.rv.Status.DatameshTransitions), w.status(true))
	}
	return w
}

// roundTrip returns a copy of x decoded from its JSON encoding.
func roundTrip[T any](tb testing.TB, x *T) *T {
	b, err := json.Marshal(x)
	if err != nil {
		tb.Fatal(err)
	}
	var y T
	if err := json.Unmarshal(b, &y); err != nil {
		tb.Fatal(err)
	}
	return &y
}

func (w *world) settleAll(tb testing.TB) {
	for i := 0; i < 200; i++ {
		for _, r := range w.rvrs {
			r.Status.DatameshRevision = w.rv.Status.DatameshRevision
			if r.Spec.Type == v1.ReplicaTypeDiskful {
				r.Status.DiskState = v1.DiskStateUpToDate
			}
		}
		before := w.rv.Status.DatameshRevision
		if _, err := w.process(tb); err != nil {
			tb.Fatal(err)
		}
		if len(w.rv.Status.DatameshTransitions) == 0 && before == w.rv.Status.DatameshRevision {
			return
		}
	}
	tb.Fatalf("did not settle:\n%s", w.status(true))
}

func benchSteady(b *testing.B, w *world) {
	in := &Input{RV: w.rv, RVRs: w.rvrs, RVAs: w.rvas, Pool: w.pool, Now: w.now}
	e := NewEngine(w.reg, w.features)
	e.Process(in)
	b.ReportAllocs()
	b.ResetTimer()
	c0 := cpuTime()
	for i := 0; i < b.N; i++ {
		res, err := e.Process(in)
		if err != nil || res.Changed {
			b.Fatalf("steady volume changed: %v", err)
		}
	}
	reportCPU(b, c0)
}

// cpuTime is the process's user+system CPU time. On a shared, overloaded machine the
// wall-clock ns/op includes the time the benchmark waited for a core; cpu-ns/op does not.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportCPU(b *testing.B, c0 time.Duration) {
	if d := cpuTime() - c0; d > 0 && b.N > 0 {
		b.ReportMetric(float64(d.Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

// BenchmarkProcessSteady3D: a formed 3D volume with nothing to do.
func BenchmarkProcessSteady3D(b *testing.B) {
	benchSteady(b, steadyWorld(b, 1, 1, 0))
}

// BenchmarkProcessSteady32: a steady volume with 32 members, DRBD's limit. The largest
// layout is 5D (FTT=2, GMDR=2); the other 27 members can only be Access replicas, and
// the engine keeps an Access member only while a live attachment (RVA) asks for its
// node — without one it wants the replica deleted, and the volume would not be steady.
// So: 5D + 27 A and 27 RVAs; maxAttachments=1, so one RVA is served (its member is
// attached) and 26 wait for the slot, which is steady too: nothing changes until an
// RVA goes away (Result.Waiting is true, Changed false, no transition, nothing
// wanted). Every Diskful is UpToDate, every replica confirmed, every request done.
// steady32 checks all of that before timing. RVRs are passed sorted by name (r1, r10,
// r11, …), the order a lister returns.
func BenchmarkProcessSteady32(b *testing.B) {
	w := steady32(b)
	slices.SortFunc(w.rvrs, func(x, y *v1.ReplicatedVolumeReplica) int { return strings.Compare(x.Name, y.Name) })
	benchSteady(b, w)
}

// BenchmarkProcessSteady32Unsorted: the same with RVRs in creation order (r1, r2, …,
// r32), not name order.
func BenchmarkProcessSteady32Unsorted(b *testing.B) {
	benchSteady(b, steady32(b))
}

func steady32(b *testing.B) *world {
	w := steadyWorld(b, 2, 2, 27)
	st := &w.rv.Status
	if n := len(st.Datamesh.Members); n != 32 {
		b.Fatalf("%d members", n)
	}
	res, err := NewEngine(w.reg, w.features).Process(&Input{RV: w.rv.DeepCopy(), RVRs: w.rvrs, RVAs: w.rvas, Pool: w.pool, Now: w.now})
	attached, waiting := 0, 0
	for _, a := range res.Attachments {
		switch {
		case a.Phase == v1.AttachmentAttached && a.Attached:
			attached++
		case a.Phase == v1.AttachmentPending && a.Message == msgWaitMax1:
			waiting++
		}
	}
	if err != nil || res.Changed || len(res.Wanted) != 0 || len(st.DatameshTransitions) != 0 || attached != 1 || waiting != 26 {
		b.Fatalf("not the steady 32-member volume: err=%v changed=%v wanted=%v attached=%d waiting=%d\n%s",
			err, res.Changed, res.Wanted, attached, waiting, w.status(true))
	}
	for _, r := range st.DatameshReplicaRequests {
		if !strings.HasSuffix(r.Message, "successfully") && !strings.HasSuffix(r.Message, "during formation") {
			b.Fatalf("request %s not done: %q", r.Name, r.Message)
		}
	}
	for _, r := range w.rvrs {
		if r.Status.DatameshRevision != st.DatameshRevision || (r.Spec.Type == v1.ReplicaTypeDiskful && r.Status.DiskState != v1.DiskStateUpToDate) {
			b.Fatalf("replica %s not settled", r.Name)
		}
	}
	return w
}

// statusSnapshot restores a status cheaply (reusing the slices' storage), so a benchmark
// can run the same admitting reconcile again without a deep copy.
type statusSnapshot struct {
	st       v1.ReplicatedVolumeStatus
	members  []v1.DatameshMember
	requests []v1.DatameshReplicaRequest
	eff      v1.Layout
}

func snapshot(st *v1.ReplicatedVolumeStatus) *statusSnapshot {
	s := &statusSnapshot{st: *st, eff: *st.EffectiveLayout}
	s.members = append([]v1.DatameshMember(nil), st.Datamesh.Members...)
	s.requests = append([]v1.DatameshReplicaRequest(nil), st.DatameshReplicaRequests...)
	return s
}

func (s *statusSnapshot) restore(st *v1.ReplicatedVolumeStatus) {
	members := append(st.Datamesh.Members[:0], s.members...)
	requests := append(st.DatameshReplicaRequests[:0], s.requests...)
	transitions := st.DatameshTransitions[:0]
	eff := st.EffectiveLayout
	*st = s.st
	*eff = s.eff
	st.EffectiveLayout = eff
	st.Datamesh.Members = members
	st.DatameshReplicaRequests = requests
	st.DatameshTransitions = transitions
}

// BenchmarkAdmitAddReplicaD: a 3D volume whose configuration moved to 4D, and a new
// Diskful replica: the reconcile that admits AddReplica(D) (derives the plan, runs the
// guards, publishes ✦ → A). The status is restored in place before each iteration
// (statusSnapshot.restore, measured alone by BenchmarkRestoreOnly: subtract it).
func BenchmarkAdmitAddReplicaD(b *testing.B) {
	w := steadyWorld(b, 1, 1, 0)
	w.rv.Spec.ManualConfiguration.GuaranteedMinimumDataRedundancy = 2
	w.process(b)
	w.addRVR("r4", "n4", v1.ReplicaTypeDiskful)
	w.rvrs[3].Name = strings.Clone("r4")
	snap := snapshot(&w.rv.Status)
	in := &Input{RV: w.rv, RVRs: w.rvrs, RVAs: w.rvas, Pool: w.pool, Now: w.now}
	e := NewEngine(w.reg, w.features)
	e.Process(in)
	if len(w.rv.Status.DatameshTransitions) != 1 || w.rv.Status.DatameshTransitions[0].Type != v1.TransitionAddReplica {
		b.Fatalf("AddReplica not admitted:\n%s", w.status(true))
	}
	b.ReportAllocs()
	b.ResetTimer()
	c0 := cpuTime()
	for i := 0; i < b.N; i++ {
		snap.restore(&w.rv.Status)
		e.Process(in)
	}
	reportCPU(b, c0)
}

// BenchmarkRestoreOnly is the restore part of BenchmarkAdmitAddReplicaD.
func BenchmarkRestoreOnly(b *testing.B) {
	w := steadyWorld(b, 1, 1, 0)
	snap := snapshot(&w.rv.Status)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		snap.restore(&w.rv.Status)
	}
}

// BenchmarkDeepCopyInput is the yardstick for the steady-path figures: before every
// Process the controller deep-copies the volume it read from its informer cache (the
// engine mutates RV.Status in place; docs/datamesh.md "Contract"). A steady reconcile
// of the engine that costs less than that copy is below what a reconcile costs anyway.
func BenchmarkDeepCopyInput(b *testing.B) {
	for _, c := range []struct {
		name string
		w    func(testing.TB) *world
	}{
		{"3D", func(tb testing.TB) *world { return steadyWorld(tb, 1, 1, 0) }},
		{"32", func(tb testing.TB) *world { return steadyWorld(tb, 2, 2, 27) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			w := c.w(b)
			b.ReportAllocs()
			b.ResetTimer()
			c0 := cpuTime()
			for i := 0; i < b.N; i++ {
				_ = w.rv.DeepCopy()
			}
			reportCPU(b, c0)
		})
	}
}
