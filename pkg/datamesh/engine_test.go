package datamesh

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// TestBadInput: bad input is an error naming the field, never a panic, and leaves the
// status alone.
func TestBadInput(t *testing.T) {
	e := NewEngine(nil, Features{})
	if _, err := e.Process(nil); err == nil || !strings.Contains(err.Error(), "input.RV") {
		t.Fatalf("nil input: %v", err)
	}
	w := newWorld()
	w.addRVR("r1", "n1", v1.ReplicaTypeDiskful)
	in := &Input{RV: w.rv, RVRs: []*v1.ReplicatedVolumeReplica{w.rvrs[0], nil}}
	if _, err := e.Process(in); err == nil || !strings.Contains(err.Error(), "input.RVRs[1]") {
		t.Fatalf("nil RVR: %v", err)
	}
	in = &Input{RV: w.rv, ChangeQuorum: &QuorumChange{Quorum: 40}}
	if _, err := e.Process(in); err == nil || !strings.Contains(err.Error(), "input.changeQuorum.quorum") {
		t.Fatalf("bad q: %v", err)
	}
	if !reflect.DeepEqual(w.rv.Status, v1.ReplicatedVolumeStatus{}) {
		t.Fatalf("status touched on bad input: %+v", w.rv.Status)
	}
	// An invalid configuration source is reported, not acted on.
	w.rv.Spec.ManualConfiguration.FailuresToTolerate = 2
	res, err := e.Process(&Input{RV: w.rv, RVRs: w.rvrs, Pool: w.pool})
	if err != nil || len(res.Events) != 1 || !strings.Contains(res.Events[0].Message, "failuresToTolerate") {
		t.Fatalf("invalid configuration: %v %+v", err, res.Events)
	}
	if w.rv.Status.Configuration != nil {
		t.Fatalf("invalid configuration was written")
	}
}

// run drives a volume through a scripted life and returns the status as JSON.
func runLife(t *testing.T, reverse bool) string {
	w := newWorld()
	c := w.rv.Spec.ManualConfiguration
	c.FailuresToTolerate, c.GuaranteedMinimumDataRedundancy = 1, 1
	order := func() {
		if reverse {
			for i, j := 0, len(w.rvrs)-1; i < j; i, j = i+1, j-1 {
				w.rvrs[i], w.rvrs[j] = w.rvrs[j], w.rvrs[i]
			}
		}
	}
	step := func() {
		order()
		if _, err := w.process(t); err != nil {
			t.Fatal(err)
		}
		w.place()
		order()
	}
	for i := 0; i < 5; i++ {
		step()
	}
	w.settleAll(t)
	c.GuaranteedMinimumDataRedundancy = 2
	w.addRVR("r9", "n9", v1.ReplicaTypeAccess)
	for i := 0; i < 30; i++ {
		step()
		// confirm replica by replica, in name order
		for _, r := range w.rvrs {
			if r.Name <= "r"+string(rune('0'+i%10)) {
				r.Status.DatameshRevision = w.rv.Status.DatameshRevision
				if r.Spec.Type == v1.ReplicaTypeDiskful {
					r.Status.DiskState = v1.DiskStateUpToDate
				}
			}
		}
	}
	w.settleAll(t)
	st := w.rv.Status
	b, _ := json.Marshal(st)
	return string(b)
}

// TestDeterministic: the same life gives the same status, whatever the order of the
// RVRs in the input.
func TestDeterministic(t *testing.T) {
	a, b, c := runLife(t, false), runLife(t, false), runLife(t, true)
	if a != b {
		t.Fatalf("two runs differ:\n%s\n%s", a, b)
	}
	if a != c {
		t.Fatalf("RVR order changes the result:\n%s\n%s", a, c)
	}
}

// TestSteadyIsQuiet: once settled, Process changes nothing and publishes nothing.
func TestSteadyIsQuiet(t *testing.T) {
	w := steadyWorld(t, 2, 1, 3)
	before, _ := json.Marshal(w.rv.Status)
	for i := 0; i < 3; i++ {
		res, err := w.process(t)
		if err != nil || res.Changed {
			t.Fatalf("steady volume changed: %v", err)
		}
	}
	after, _ := json.Marshal(w.rv.Status)
	if string(before) != string(after) {
		t.Fatalf("status moved:\n%s\n%s", before, after)
	}
}

// TestPlanVersionPinned: a transition persisted at v1 runs v1's steps after v2 of the
// same plan is registered; a new transition takes v2.
func TestPlanVersionPinned(t *testing.T) {
	w := steadyWorld(t, 1, 1, 0)
	w.rv.Spec.ManualConfiguration.GuaranteedMinimumDataRedundancy = 2
	w.addRVR("r4", "n4", v1.ReplicaTypeDiskful)
	if _, err := w.process(t); err != nil {
		t.Fatal(err)
	}
	tr := w.rv.Status.DatameshTransitions[0]
	if tr.PlanID != "add-d-q-up-qmr-up" || tr.PlanVersion != 1 || len(tr.Steps) != 4 {
		t.Fatalf("unexpected transition %+v", tr)
	}
	v1p, _ := w.reg.Latest(tr.PlanID)
	v2p := *v1p
	v2p.Version = 2
	v2p.Steps = v1p.Steps[:3]
	if err := w.reg.Register(v2p); err != nil {
		t.Fatal(err)
	}
	if err := w.reg.Register(v2p); err == nil {
		t.Fatal("registering the same version twice must fail")
	}
	var published []string
	for i := 0; i < 20 && len(w.rv.Status.DatameshTransitions) > 0; i++ {
		for _, r := range w.rvrs {
			r.Status.DatameshRevision = w.rv.Status.DatameshRevision
			r.Status.DiskState = v1.DiskStateUpToDate
		}
		w.eng = nil // a controller restart between every step
		if _, err := w.process(t); err != nil {
			t.Fatal(err)
		}
		for _, tr := range w.rv.Status.DatameshTransitions {
			if tr.PlanVersion != 1 {
				t.Fatalf("transition switched to v%d", tr.PlanVersion)
			}
			for _, s := range tr.Steps {
				if s.Status == v1.StepActive {
					published = append(published, s.Name)
				}
			}
		}
	}
	if got := strings.Join(published, " | "); !strings.HasSuffix(got, "qmr↑") {
		t.Fatalf("v1's last step did not run: %s", got)
	}
	p, _ := w.reg.Latest("add-d-q-up-qmr-up")
	if p.Version != 2 {
		t.Fatalf("latest is v%d", p.Version)
	}
}

// TestRevisionPerPublishedChange: every published step bumps the revision by exactly one,
// except the batch of force removals (one revision for all) and formation's sync step.
func TestRevisionPerPublishedChange(t *testing.T) {
	w := steadyWorld(t, 1, 1, 0)
	w.rv.Spec.ManualConfiguration.GuaranteedMinimumDataRedundancy = 2
	w.addRVR("r4", "n4", v1.ReplicaTypeDiskful)
	seen := map[int64]int{}
	for i := 0; i < 20; i++ {
		before := w.rv.Status.DatameshRevision
		if _, err := w.process(t); err != nil {
			t.Fatal(err)
		}
		newSteps := 0
		for _, tr := range w.rv.Status.DatameshTransitions {
			for _, s := range tr.Steps {
				if s.Status != v1.StepPending && s.DatameshRevision > before {
					newSteps++
					seen[s.DatameshRevision]++
				}
			}
		}
		if got := w.rv.Status.DatameshRevision - before; got != int64(newSteps) {
			t.Fatalf("revision moved by %d for %d published steps", got, newSteps)
		}
		for _, r := range w.rvrs {
			r.Status.DatameshRevision = w.rv.Status.DatameshRevision
			r.Status.DiskState = v1.DiskStateUpToDate
		}
	}
	for rev, n := range seen {
		if n != 1 {
			t.Fatalf("revision %d published %d steps", rev, n)
		}
	}
}

// TestHeldQuorum checks heldQuorum against the cases worked out in its comment, and that
// without a TieBreaker it never asks more than the specification's q.
func TestHeldQuorum(t *testing.T) {
	for _, c := range []struct {
		nOld, nNew, qOld int
		tb               bool
		want             int
	}{
		{2, 3, 2, true, 3}, // 2D+1TB → 3D (finding F4)
		{4, 5, 3, true, 4}, // 4D+1TB → 5D
		{3, 4, 2, true, 4}, // 3D+TB → 4D+1TB
		{3, 2, 2, true, 3}, // 3D+TB → 2D+1TB
		{4, 3, 3, true, 3}, // 4D+TB → 3D
		{5, 4, 3, true, 4}, // 5D+TB → 4D+1TB
		{2, 3, 2, false, 2},
		{3, 4, 2, false, 3},
		{4, 3, 3, false, 2},
	} {
		if got := heldQuorum(c.nOld, c.nNew, c.qOld, c.tb); got != c.want {
			t.Errorf("heldQuorum(%d→%d, qOld=%d, tb=%v) = %d, want %d", c.nOld, c.nNew, c.qOld, c.tb, got, c.want)
		}
	}
}

// TestLeavingReplicaLabel: a leaving replica is "#id" in progress messages (docs/datamesh.md
// "Node-ids"), and a
// transition persisted before replicaNodeID existed (nil) falls back to the name.
func TestLeavingReplicaLabel(t *testing.T) {
	w := newWorld()
	w.rv.Spec.ManualConfiguration.FailuresToTolerate = 1
	w.rv.Spec.ManualConfiguration.GuaranteedMinimumDataRedundancy = 1
	if err := w.createReplicas(t); err != nil {
		t.Fatal(err)
	}
	w.settleAll(t)
	w.addRVR("r4", "n4", v1.ReplicaTypeAccess)
	w.settleAll(t)
	w.rvr("r4").DeletionTimestamp = &w.rv.CreationTimestamp
	if _, err := w.process(t); err != nil {
		t.Fatal(err)
	}
	ts := w.rv.Status.DatameshTransitions
	if len(ts) != 1 || ts[0].ReplicaNodeID == nil || *ts[0].ReplicaNodeID != 3 {
		t.Fatalf("want one RemoveReplica with replicaNodeID 3, got %+v", ts)
	}
	if msg := ts[0].Steps[0].Message; !strings.Contains(msg, "Waiting: [#0, #1, #2, #3].") {
		t.Fatalf("leaving replica not named #3: %q", msg)
	}
	ts[0].ReplicaNodeID = nil // as written by a controller before replicaNodeID existed
	if _, err := w.process(t); err != nil {
		t.Fatal(err)
	}
	if msg := w.rv.Status.DatameshTransitions[0].Steps[0].Message; !strings.Contains(msg, "Waiting: [#0, #1, #2, r4].") {
		t.Fatalf("fallback to the name expected: %q", msg)
	}
}
