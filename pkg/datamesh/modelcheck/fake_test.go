package modelcheck

// TEST SCAFFOLDING OF THE CHECKER ITSELF — not a datamesh engine.
//
// fakeEngine is a deliberately tiny engine (formation, Access join,
// attach/detach, and a few one-step shortcuts) used only to show that the
// checker's exploration and each invariant work: with bug flags set it
// makes exactly the mistakes the invariants exist to catch, and the tests
// in checker_test.go assert that the checker finds them. The model check of
// the real engine (modelcheck_test.go) never uses it.

import (
	"sort"

	"github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh"
)

type fakeBugs struct {
	lowQ         bool // publish q one below the requirement
	doubleAttach bool // attach a second member without multiattach
	stuckAttach  bool // never complete an Attach
	unsafeAddD   bool // add a Diskful replica straight as D, q unchanged
	unsafeRemove bool // remove a deleting D in one step, no guard
	silentBlock  bool // block Access joins without a message
	eagerAttach  bool // attach elsewhere before the detach is confirmed
}

type fakeEngine struct{ bugs fakeBugs }

func (f *fakeEngine) Process(in *datamesh.Input) (datamesh.Result, error) {
	st := &in.RV.Status
	cfg := *in.RV.Spec.ManualConfiguration
	st.Configuration = &cfg
	rvrByName := map[string]*v1alpha1.ReplicatedVolumeReplica{}
	for _, r := range in.RVRs {
		rvrByName[r.Name] = r
	}
	member := func(name string) *v1alpha1.DatameshMember {
		for i := range st.Datamesh.Members {
			if st.Datamesh.Members[i].Name == name {
				return &st.Datamesh.Members[i]
			}
		}
		return nil
	}
	voters := func() int {
		n := 0
		for _, m := range st.Datamesh.Members {
			if m.Type.IsVoter() {
				n++
			}
		}
		return n
	}
	setQ := func() {
		st.Datamesh.Quorum = RequiredQ(voters(), *st.EffectiveLayout)
		if f.bugs.lowQ && voters() > 2 {
			st.Datamesh.Quorum--
		}
		st.Datamesh.QuorumMinimumRedundancy = RequiredQMR(*st.EffectiveLayout)
	}
	nextID := func() int32 {
		used := map[int32]bool{}
		for _, m := range st.Datamesh.Members {
			used[m.NodeID] = true
		}
		for id := int32(0); ; id++ {
			if !used[id] {
				return id
			}
		}
	}
	publish := func(t v1alpha1.TransitionType, name, step string) {
		st.DatameshRevision++
		st.DatameshTransitions = append(st.DatameshTransitions, v1alpha1.DatameshTransition{
			Type: t, Group: v1alpha1.GroupAttachment, ReplicaName: name, PlanID: "fake", PlanVersion: 1,
			Steps: []v1alpha1.DatameshTransitionStep{{Name: step, Status: v1alpha1.StepActive, DatameshRevision: st.DatameshRevision}},
		})
	}

	// Formation: everything at once.
	if len(st.Datamesh.Members) == 0 {
		names := []string{}
		for _, r := range in.RVRs {
			names = append(names, r.Name)
		}
		sort.Strings(names)
		eff := v1alpha1.Layout{FailuresToTolerate: cfg.FailuresToTolerate, GuaranteedMinimumDataRedundancy: cfg.GuaranteedMinimumDataRedundancy}
		st.EffectiveLayout = &eff
		for _, n := range names {
			r := rvrByName[n]
			t := v1alpha1.MemberTypeDiskful
			if r.Spec.Type == v1alpha1.ReplicaTypeTieBreaker {
				t = v1alpha1.MemberTypeTieBreaker
			}
			st.Datamesh.Members = append(st.Datamesh.Members, v1alpha1.DatameshMember{Name: n, Type: t, NodeName: r.Spec.NodeName, NodeID: nextID()})
		}
		setQ()
		st.DatameshRevision = 1
		return datamesh.Result{Changed: true, Revision: 1}, nil
	}

	// Backward: a transition completes when the member confirmed.
	kept := st.DatameshTransitions[:0]
	for _, t := range st.DatameshTransitions {
		r := rvrByName[t.ReplicaName]
		done := r != nil && r.Status.DatameshRevision >= t.Steps[0].DatameshRevision
		if t.Type == v1alpha1.TransitionAttach && f.bugs.stuckAttach {
			done = false
		}
		if !done {
			kept = append(kept, t)
		}
	}
	st.DatameshTransitions = kept
	busy := func(name string) bool {
		for _, t := range st.DatameshTransitions {
			if t.ReplicaName == name {
				return true
			}
		}
		return false
	}

	// Membership.
	st.DatameshReplicaRequests = nil
	for _, r := range in.RVRs {
		m := member(r.Name)
		switch {
		case m == nil && r.DeletionTimestamp == nil && r.Spec.Type == v1alpha1.ReplicaTypeAccess:
			if f.bugs.silentBlock {
				st.DatameshReplicaRequests = append(st.DatameshReplicaRequests, v1alpha1.DatameshReplicaRequest{Name: r.Name, Operation: v1alpha1.ReplicaOperationJoin, Type: r.Spec.Type})
				continue
			}
			st.Datamesh.Members = append(st.Datamesh.Members, v1alpha1.DatameshMember{Name: r.Name, Type: v1alpha1.MemberTypeAccess, NodeName: r.Spec.NodeName, NodeID: nextID()})
			publish(v1alpha1.TransitionAddReplica, r.Name, "✦ → A")
		case m == nil && r.DeletionTimestamp == nil && r.Spec.Type == v1alpha1.ReplicaTypeDiskful && f.bugs.unsafeAddD:
			st.Datamesh.Members = append(st.Datamesh.Members, v1alpha1.DatameshMember{Name: r.Name, Type: v1alpha1.MemberTypeDiskful, NodeName: r.Spec.NodeName, NodeID: nextID()})
			publish(v1alpha1.TransitionAddReplica, r.Name, "✦ → D")
		case m != nil && r.DeletionTimestamp != nil && !busy(r.Name) && !m.Attached &&
			(m.Type == v1alpha1.MemberTypeAccess || (f.bugs.unsafeRemove && m.Type == v1alpha1.MemberTypeDiskful)):
			ms := st.Datamesh.Members[:0]
			for _, x := range st.Datamesh.Members {
				if x.Name != r.Name {
					ms = append(ms, x)
				}
			}
			st.Datamesh.Members = ms
			setQ()
			st.DatameshRevision++
		}
	}

	// Attachment.
	want := map[string]bool{}
	for _, a := range in.RVAs {
		want[a.Spec.NodeName] = true
	}
	attached := 0
	for _, m := range st.Datamesh.Members {
		if m.Attached {
			attached++
		}
	}
	for i := range st.Datamesh.Members {
		m := &st.Datamesh.Members[i]
		if !want[m.NodeName] && m.Attached && !busy(m.Name) {
			m.Attached = false
			attached--
			publish(v1alpha1.TransitionDetach, m.Name, "detach")
		}
	}
	// Attach only once no member is attached and no detach is unconfirmed:
	// otherwise two nodes would be told to be Primary at once (I4p).
	detaching := false
	for _, t := range st.DatameshTransitions {
		detaching = detaching || (t.Type == v1alpha1.TransitionDetach && !f.bugs.eagerAttach)
	}
	for i := range st.Datamesh.Members {
		m := &st.Datamesh.Members[i]
		if want[m.NodeName] && !m.Attached && !busy(m.Name) && ((attached == 0 && !detaching) || f.bugs.doubleAttach) {
			m.Attached = true
			attached++
			publish(v1alpha1.TransitionAttach, m.Name, "attach")
		}
	}
	return datamesh.Result{Changed: true, Revision: st.DatameshRevision}, nil
}
