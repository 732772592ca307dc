package modelcheck

import (
	"fmt"

	"github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Invariant names, as docs/modelcheck.md states them.
const (
	InvQuorumSplit   = "I1-quorum-split"  // two disjoint sides both quorate
	InvWriteSplit    = "I1w-write-split"  // two disjoint sides both able to promote and write
	InvQuorumFloor   = "I2-q-qmr-floor"   // published q/qmr below the effective layout's
	InvGMDR          = "I3-gmdr"          // a non-force step took UpToDate D to ≤ target GMDR
	InvAttached      = "I4-one-attached"  // more than one attached member without multiattach
	InvPrimaries     = "I4p-one-primary"  // more than one live Primary without multiattach applied on each
	InvLiveness      = "I5-liveness"      // a transition never completes with every replica confirming
	InvMessage       = "I5m-message"      // a blocked request or attachment without a message
	InvRevision      = "S-revision"       // revision not monotonic, or a change published without a bump
	InvNodeID        = "S-node-id"        // duplicate or out-of-range node-id, duplicate member
	InvTransitions   = "S-transitions"    // members and transitions inconsistent
	InvEngineFailure = "S-engine-failure" // Process returned an error or panicked on a valid input
	InvUnknownMember = "S-unknown-member" // a member that is no replica of the volume
)

// Violation is one broken invariant.
type Violation struct {
	Invariant string
	Detail    string
}

func (v Violation) Error() string { return v.Invariant + ": " + v.Detail }

// RequiredQ is what the effective layout requires of the published q for a
// datamesh with the given voters: docs/datamesh-spec.md, "Derived values",
// q = max(⌊voters/2⌋+1, ⌊minD/2⌋+1), minD = FTT+GMDR+1. It is written out
// here rather than taken from pkg/datamesh/layout so that the checker states
// the requirement independently of the code it checks.
func RequiredQ(voters int, eff v1alpha1.Layout) int32 {
	q := int32(voters/2 + 1)
	minD := eff.FailuresToTolerate + eff.GuaranteedMinimumDataRedundancy + 1
	if f := minD/2 + 1; f > q {
		q = f
	}
	return q
}

// RequiredQMR is qmr = effective GMDR + 1.
func RequiredQMR(eff v1alpha1.Layout) int32 { return eff.GuaranteedMinimumDataRedundancy + 1 }

// CheckStatus checks the invariants that a status must satisfy on its own
// (the fuzz target uses exactly these): I2, I4, node-ids, and the shape of
// transitions. prev, when not nil, is the status before the Process call
// that produced st: then the revision rules are checked too.
func CheckStatus(prev, st *v1alpha1.ReplicatedVolumeStatus) []Violation {
	var out []Violation
	add := func(inv, f string, a ...any) { out = append(out, Violation{inv, fmt.Sprintf(f, a...)}) }
	dm := &st.Datamesh

	voters, attached := 0, 0
	names := map[string]bool{}
	ids := map[int32]string{}
	for i := range dm.Members {
		m := &dm.Members[i]
		if m.Type.IsVoter() {
			voters++
		}
		if m.Attached {
			attached++
		}
		if names[m.Name] {
			add(InvNodeID, "member %s listed twice", m.Name)
		}
		names[m.Name] = true
		if m.NodeID < 0 || m.NodeID > 31 {
			add(InvNodeID, "member %s has node-id %d outside 0..31", m.Name, m.NodeID)
		}
		if o, dup := ids[m.NodeID]; dup {
			add(InvNodeID, "members %s and %s share node-id %d", o, m.Name, m.NodeID)
		}
		ids[m.NodeID] = m.Name
	}

	// I2: only once the datamesh has members (before formation publishes
	// the first members there is nothing to protect).
	if len(dm.Members) > 0 {
		if st.EffectiveLayout == nil {
			add(InvQuorumFloor, "datamesh has %d members but no effective layout", len(dm.Members))
		} else {
			eff := *st.EffectiveLayout
			if rq := RequiredQ(voters, eff); dm.Quorum < rq {
				add(InvQuorumFloor, "q=%d with %d voters and effective layout FTT=%d GMDR=%d, need ≥ %d",
					dm.Quorum, voters, eff.FailuresToTolerate, eff.GuaranteedMinimumDataRedundancy, rq)
			}
			if rq := RequiredQMR(eff); dm.QuorumMinimumRedundancy < rq {
				add(InvQuorumFloor, "qmr=%d with effective GMDR=%d, need ≥ %d",
					dm.QuorumMinimumRedundancy, eff.GuaranteedMinimumDataRedundancy, rq)
			}
		}
	}

	// I4.
	if attached > 1 && !dm.Multiattach {
		add(InvAttached, "%d members attached without multiattach", attached)
	}
	if attached > 2 {
		add(InvAttached, "%d members attached; at most 2 even with multiattach", attached)
	}

	// Transitions: steps are Completed* Active? Pending*, published steps
	// carry a revision no newer than the volume's, at most one membership
	// transition per replica, one voter transition at a time, and the
	// replica of a transition that needs one is a member or a requester.
	perReplica := map[string]v1alpha1.TransitionType{}
	voterActive := 0
	for ti := range st.DatameshTransitions {
		t := &st.DatameshTransitions[ti]
		if len(t.Steps) == 0 {
			add(InvTransitions, "transition %s %s has no steps", t.Type, t.ReplicaName)
			continue
		}
		phase := 0 // 0 completed, 1 active seen, 2 pending seen
		for si := range t.Steps {
			sp := &t.Steps[si]
			switch sp.Status {
			case v1alpha1.StepCompleted:
				if phase != 0 {
					add(InvTransitions, "transition %s %s: completed step %q after an active or pending one", t.Type, t.ReplicaName, sp.Name)
				}
			case v1alpha1.StepActive:
				if phase != 0 {
					add(InvTransitions, "transition %s %s: second active step %q", t.Type, t.ReplicaName, sp.Name)
				}
				phase = 1
			case v1alpha1.StepPending:
				phase = 2
			default:
				add(InvTransitions, "transition %s %s: step %q has status %q", t.Type, t.ReplicaName, sp.Name, sp.Status)
			}
			if sp.Status != v1alpha1.StepPending && sp.DatameshRevision > st.DatameshRevision {
				add(InvTransitions, "transition %s %s: step %q at revision %d beyond the volume's %d", t.Type, t.ReplicaName, sp.Name, sp.DatameshRevision, st.DatameshRevision)
			}
		}
		switch t.Type {
		case v1alpha1.TransitionAddReplica, v1alpha1.TransitionRemoveReplica, v1alpha1.TransitionChangeReplicaType, v1alpha1.TransitionForceRemoveReplica:
			if t.ReplicaName == "" {
				add(InvTransitions, "%s without a replica", t.Type)
			}
			if o, dup := perReplica[t.ReplicaName]; dup {
				add(InvTransitions, "replica %s has two membership transitions: %s and %s", t.ReplicaName, o, t.Type)
			}
			perReplica[t.ReplicaName] = t.Type
			if t.Type == v1alpha1.TransitionChangeReplicaType && !names[t.ReplicaName] {
				// A ChangeType whose member vanished is a transition
				// nobody can finish. (Add, Remove and ForceRemove run
				// while the replica is not, or no longer, a member.)
				add(InvTransitions, "%s of %s, which is not a member", t.Type, t.ReplicaName)
			}
		case v1alpha1.TransitionAttach, v1alpha1.TransitionDetach:
			if !names[t.ReplicaName] {
				add(InvTransitions, "%s of %s, which is not a member", t.Type, t.ReplicaName)
			}
		}
		if t.Group == v1alpha1.GroupVotingMembership {
			voterActive++
		}
	}
	if voterActive > 1 {
		add(InvTransitions, "%d voter transitions at once (one voter at a time)", voterActive)
	}

	if prev != nil {
		if st.DatameshRevision < prev.DatameshRevision {
			add(InvRevision, "revision went back from %d to %d", prev.DatameshRevision, st.DatameshRevision)
		}
		if st.DatameshRevision == prev.DatameshRevision && !sameDatamesh(&prev.Datamesh, &st.Datamesh) {
			add(InvRevision, "datamesh changed without a new revision (still %d): replicas could not tell the two apart", st.DatameshRevision)
		}
	}
	return out
}

// sameDatamesh compares what replicas render from the datamesh.
func sameDatamesh(a, b *v1alpha1.Datamesh) bool {
	if a.Quorum != b.Quorum || a.QuorumMinimumRedundancy != b.QuorumMinimumRedundancy ||
		a.Multiattach != b.Multiattach || len(a.Members) != len(b.Members) {
		return false
	}
	for i := range a.Members {
		ma := &a.Members[i]
		var mb *v1alpha1.DatameshMember
		for j := range b.Members {
			if b.Members[j].Name == ma.Name {
				mb = &b.Members[j]
			}
		}
		if mb == nil || ma.Type != mb.Type || ma.Attached != mb.Attached || ma.NodeID != mb.NodeID || ma.NodeName != mb.NodeName {
			return false
		}
	}
	return true
}

// upToDateD counts members published as D whose replica is alive with an
// UpToDate disk, and returns them by slot.
func upToDateD(s *Scenario, w *World, st *v1alpha1.ReplicatedVolumeStatus) (n int, slots uint32) {
	for i := range st.Datamesh.Members {
		m := &st.Datamesh.Members[i]
		if m.Type != v1alpha1.MemberTypeDiskful {
			continue
		}
		j := s.slotOf(m.Name)
		if j < 0 {
			continue
		}
		r := &w.DP.Replicas[j]
		if r.Alive && !r.Returned && r.UpToDate {
			n++
			slots |= 1 << j
		}
	}
	return n, slots
}

// checkGMDR is I3: a Process call that stops publishing a live UpToDate D
// as D (a non-force step: force-removal only takes dead members) must leave
// more UpToDate D than the target GMDR.
func checkGMDR(s *Scenario, w *World, prev, next *v1alpha1.ReplicatedVolumeStatus) []Violation {
	before, bs := upToDateD(s, w, prev)
	after, as := upToDateD(s, w, next)
	lost := bs &^ as
	if lost == 0 || next.Configuration == nil {
		return nil
	}
	target := int(next.Configuration.GuaranteedMinimumDataRedundancy)
	if after > target {
		return nil
	}
	var who []string
	for j := 0; j < w.DP.N; j++ {
		if lost&(1<<j) != 0 {
			who = append(who, s.Slots[j].Name)
		}
	}
	return []Violation{{InvGMDR, fmt.Sprintf("UpToDate D went from %d to %d (target GMDR %d) by demoting or removing live %v", before, after, target, who)}}
}

// checkDataPlane is I1, I1w and I4p on the replicas' applied state.
func checkDataPlane(s *Scenario, a *Analyzer, dp *DataPlane) []Violation {
	var out []Violation
	qs, ws := a.FindSplits(dp)
	if ws != nil {
		out = append(out, Violation{InvWriteSplit, describeSplit(s, ws, true)})
	}
	if qs != nil {
		out = append(out, Violation{InvQuorumSplit, describeSplit(s, qs, false)})
	}
	primaries, multi := 0, true
	for i := 0; i < dp.N; i++ {
		r := &dp.Replicas[i]
		if !dp.configured(i) || r.Returned || r.Rejoined {
			// A returned node may still run as Primary from before it was lost and
			// force-detached, also once its agent reports again, until it applies
			// a newer datamesh; whether it can write is I1w's question.
			continue
		}
		if r.Applied.Member(i).Attached {
			primaries++
			multi = multi && r.Applied.Multiattach
		}
	}
	if primaries > 1 && !multi {
		out = append(out, Violation{InvPrimaries, fmt.Sprintf("%d live Primaries, not all of them configured for multiattach", primaries)})
	}
	return out
}

func describeSplit(s *Scenario, sp *Split, writers bool) string {
	side := func(mask, q, w uint32) string {
		out := "{"
		for i := range s.Slots {
			if mask&(1<<i) == 0 {
				continue
			}
			if len(out) > 1 {
				out += " "
			}
			out += s.Slots[i].Name
			switch {
			case w&(1<<i) != 0:
				out += "(writer)"
			case q&(1<<i) != 0:
				out += "(quorate)"
			}
		}
		return out + "}"
	}
	what := "quorate"
	if writers {
		what = "able to promote and write"
	}
	return fmt.Sprintf("sides %s and %s are both %s", side(sp.SideA, sp.ResultA.Quorate, sp.ResultA.Writers),
		side(sp.SideB, sp.ResultB.Quorate, sp.ResultB.Writers), what)
}
