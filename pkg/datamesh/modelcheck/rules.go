package modelcheck

import (
	"fmt"

	"github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh"
)

// The engine's safety rules, each stated as the property it exists for and checked
// after every Process call of every run (a golden line in a scenario file is accepted
// by a -rewrite run; these are not: docs/modelcheck.md, "Invariants, exactly as
// checked"). Where the engine counts from the replicas' reports, these count from the
// truth of the world (alive, UpToDate),
// which for a reporting replica is the same and otherwise never more: a rule that
// holds here holds for what the engine could see.
const (
	InvRatchet       = "R-ratchet"          // the effective layout fell, not by a lowered configuration
	InvFloor         = "R-floor"            // q/qmr below the floor derived from the configuration history
	InvTBOneAtATime  = "R-F5-tb"            // two TieBreaker changes in flight
	InvDisklessSet   = "R-F6-diskless"      // two changes of the diskless member set in flight
	InvDisklessGuard = "R-diskless-attach"  // a diskless member attached with UpToDate D ≤ GMDR
	InvFTTGuard      = "R-ftt-guard"        // a voter taken away with no spare voter
	InvZoneGuard     = "R-zone-guard"       // a voter taken away so that one zone's loss breaks IO or GMDR
	InvTBGuard       = "R-tb-guard"         // a TieBreaker taken away that an even voter set needs
	InvRemovedActive = "R-removed-attached" // a member removed while attached or detaching
)

// checkRules checks the rules on one Process call, prev → next. floor is the layout
// the configuration history guarantees (World.Floor, before this call).
func checkRules(s *Scenario, w *World, floor v1alpha1.Layout, prev, next *v1alpha1.ReplicatedVolumeStatus, forceLeave uint32) []Violation {
	var out []Violation
	add := func(inv, f string, a ...any) { out = append(out, Violation{inv, fmt.Sprintf(f, a...)}) }
	dm := &next.Datamesh
	cfg := next.Configuration
	if cfg == nil || len(dm.Members) == 0 {
		return nil
	}
	target := v1alpha1.Layout{FailuresToTolerate: cfg.FailuresToTolerate, GuaranteedMinimumDataRedundancy: cfg.GuaranteedMinimumDataRedundancy}

	// A confirmed loss lowers what the volume can promise (docs/datamesh-spec.md: the q↓ of
	// ForceRemoveReplica(D), even → odd voters, lowers the effective FTT to what the
	// voters provide): once every live replica runs a datamesh without the lost member,
	// the FTT may fall to what the voters that are left provide, never below.
	lostFTT := int32(-1)
	if confirmedLoss(s, w, next, forceLeave) {
		// With the qmr published now: a qmr above the configuration's (not lowered
		// yet) asks for more UpToDate copies, so fewer failures are tolerated.
		lostFTT = providedFTT(next.Datamesh.Members, max(dm.QuorumMinimumRedundancy-1, 0))
	}

	// The ratchet (layout.effective.go): an effective value moves toward the
	// configuration and falls only when the configuration is lowered below it, and
	// then not below the configuration, or after a confirmed loss (above). A formation
	// restart (no members before) resets.
	if pe, ne := prev.EffectiveLayout, next.EffectiveLayout; pe != nil && ne != nil && len(prev.Datamesh.Members) > 0 {
		fttFloor := min(pe.FailuresToTolerate, target.FailuresToTolerate)
		if lostFTT >= 0 {
			fttFloor = min(fttFloor, lostFTT)
		}
		// A removal the configuration allowed when it was lower may finish after the
		// configuration was raised again (its copy is given up once its disk is
		// detached): the effective FTT then falls to what the members provide, not
		// below what the configuration history allows (floor), and the layout asks for
		// the replacement (docs/datamesh.md, "q, qmr and the effective layout").
		if floor.FailuresToTolerate < fttFloor {
			provided := providedFTT(dm.Members, max(dm.QuorumMinimumRedundancy-1, 0))
			fttFloor = min(fttFloor, max(floor.FailuresToTolerate, provided))
		}
		if ne.FailuresToTolerate < fttFloor ||
			ne.GuaranteedMinimumDataRedundancy < min(pe.GuaranteedMinimumDataRedundancy, target.GuaranteedMinimumDataRedundancy) {
			add(InvRatchet, "effective layout fell from FTT=%d,GMDR=%d to FTT=%d,GMDR=%d with the configuration at FTT=%d,GMDR=%d",
				pe.FailuresToTolerate, pe.GuaranteedMinimumDataRedundancy, ne.FailuresToTolerate, ne.GuaranteedMinimumDataRedundancy,
				target.FailuresToTolerate, target.GuaranteedMinimumDataRedundancy)
		}
	}
	// The floor, from the configuration history and the members alone: the volume was
	// formed with its configuration, and the protection it promises falls only with the
	// configuration. q covers a majority of the published voters and the floor's
	// minimum D count; qmr the floor's GMDR.
	voters := 0
	for i := range dm.Members {
		if dm.Members[i].Type.IsVoter() {
			voters++
		}
	}
	if lostFTT >= 0 {
		floor.FailuresToTolerate = min(floor.FailuresToTolerate, lostFTT)
	}
	if rq := RequiredQ(voters, floor); dm.Quorum < rq {
		add(InvFloor, "q=%d with %d voters, but the configuration history guarantees FTT=%d,GMDR=%d: need ≥ %d",
			dm.Quorum, voters, floor.FailuresToTolerate, floor.GuaranteedMinimumDataRedundancy, rq)
	}
	if rq := RequiredQMR(floor); dm.QuorumMinimumRedundancy < rq {
		add(InvFloor, "qmr=%d, but the configuration history guarantees GMDR=%d: need ≥ %d",
			dm.QuorumMinimumRedundancy, floor.GuaranteedMinimumDataRedundancy, rq)
	}

	// F5 and F6: a TieBreaker change, and a change of the diskless member set, run one
	// at a time (force removals excepted: they never wait). While two run, nodes that
	// know only one of them disagree on which diskless members DRBD's tiebreaker needs
	// a majority of, and each side of a cut can hold "its" majority.
	var tbT, dlT []string
	for i := range next.DatameshTransitions {
		t := &next.DatameshTransitions[i]
		if t.Type == v1alpha1.TransitionForceRemoveReplica || !isMembershipT(t.Type) {
			continue
		}
		if t.FromType == v1alpha1.MemberTypeTieBreaker || t.ToType == v1alpha1.MemberTypeTieBreaker {
			tbT = append(tbT, t.ReplicaName)
		}
		if changesDisklessSet(t) {
			dlT = append(dlT, t.ReplicaName)
		}
	}
	if len(tbT) > 1 {
		add(InvTBOneAtATime, "TieBreaker changes of %v in flight at once", tbT)
	}
	if len(dlT) > 1 {
		add(InvDisklessSet, "changes of the diskless member set of %v in flight at once", dlT)
	}

	// Transitions this call started, and members it removed.
	started := func(t *v1alpha1.DatameshTransition) bool {
		for i := range prev.DatameshTransitions {
			p := &prev.DatameshTransitions[i]
			if p.Type == t.Type && p.ReplicaName == t.ReplicaName && p.PlanID == t.PlanID {
				return false
			}
		}
		return true
	}
	utd := func(name string) bool {
		j := s.slotOf(name)
		return j >= 0 && w.DP.Replicas[j].Alive && !w.DP.Replicas[j].Returned && w.DP.Replicas[j].UpToDate
	}
	for i := range next.DatameshTransitions {
		t := &next.DatameshTransitions[i]
		if !started(t) {
			continue
		}
		switch {
		case t.Type == v1alpha1.TransitionAttach:
			// The diskless-attach guard: DRBD checks qmr neither on a diskless node's
			// quorate-peer path nor on the tiebreaker path, so a diskless Primary could
			// write with no more than GMDR UpToDate copies.
			m := member(next, t.ReplicaName)
			if m == nil || m.Type.HasDisk() {
				continue
			}
			n := 0
			for k := range dm.Members {
				if dm.Members[k].Type == v1alpha1.MemberTypeDiskful && utd(dm.Members[k].Name) {
					n++
				}
			}
			if n <= int(target.GuaranteedMinimumDataRedundancy) {
				add(InvDisklessGuard, "Attach of diskless %s started with %d UpToDate D, GMDR %d", t.ReplicaName, n, target.GuaranteedMinimumDataRedundancy)
			}
		case isMembershipT(t.Type) && t.Type != v1alpha1.TransitionForceRemoveReplica:
			from, to := t.FromType, t.ToType
			if from.IsVoter() && !to.IsVoter() {
				out = append(out, checkVoterLeaving(s, next, t, target, utd)...)
			}
			if from == v1alpha1.MemberTypeTieBreaker && to != v1alpha1.MemberTypeTieBreaker {
				out = append(out, checkTBLeaving(next, t, target)...)
			}
		}
	}
	// NotAttached: a member leaves the datamesh (not by force: its node is declared
	// lost) only once it is neither attached nor detaching.
	for i := range prev.Datamesh.Members {
		m := &prev.Datamesh.Members[i]
		if member(next, m.Name) != nil || forceLeave&(1<<uint(max(s.slotOf(m.Name), 0))) != 0 {
			continue
		}
		if m.Attached || detaching(prev, m.Name) {
			add(InvRemovedActive, "member %s left the datamesh while attached or detaching", m.Name)
		}
	}
	return out
}

// checkVoterLeaving: a normal transition that takes a voter away starts only with a
// spare voter (FTT guard: more voters than the target layout's minimum D count) and,
// in TransZonal, so that losing any one zone afterwards still leaves the others
// quorate (ZoneFTT) and more than GMDR UpToDate copies (ZoneGMDR). Counted on the
// datamesh the call published (other members may have changed in the same call, a
// force removal for one), with the leaving member counted as the voter it was.
func checkVoterLeaving(s *Scenario, next *v1alpha1.ReplicatedVolumeStatus, t *v1alpha1.DatameshTransition,
	target v1alpha1.Layout, utd func(string) bool) []Violation {
	var out []Violation
	dm := &next.Datamesh
	voters := 0
	for i := range dm.Members {
		if m := &dm.Members[i]; m.Type.IsVoter() && m.Name != t.ReplicaName {
			voters++
		}
	}
	voters++ // the leaving member, whatever its first step made of it
	minD := int(target.FailuresToTolerate + target.GuaranteedMinimumDataRedundancy + 1)
	if voters <= minD {
		out = append(out, Violation{InvFTTGuard, fmt.Sprintf("%s %s took a voter away with %d voters, target layout needs %d", t.Type, t.ReplicaName, voters, minD)})
	}
	if s.Config.Topology != v1alpha1.TopologyTransZonal || next.EffectiveLayout == nil {
		return out
	}
	after := voters - 1
	q := int(RequiredQ(after, *next.EffectiveLayout))
	type zc struct{ d, utd, dl int }
	zones := map[string]*zc{}
	dlTotal, utdTotal := 0, 0
	for i := range dm.Members {
		m := &dm.Members[i]
		z := zones[m.Zone]
		if z == nil {
			z = &zc{}
			zones[m.Zone] = z
		}
		switch {
		case m.Name == t.ReplicaName:
			// gone from the voters
		case m.Type.IsVoter():
			z.d++
			if m.Type == v1alpha1.MemberTypeDiskful && utd(m.Name) {
				z.utd++
				utdTotal++
			}
		case m.Type != v1alpha1.MemberTypeShadowDiskful:
			z.dl++
			dlTotal++
		}
	}
	for name, z := range zones {
		d := after - z.d
		quorate := d >= q || (d == q-1 && after%2 == 0 && 2*(dlTotal-z.dl) > dlTotal)
		if !quorate {
			out = append(out, Violation{InvZoneGuard, fmt.Sprintf("%s %s: losing zone %s afterwards leaves %d of %d voters, q=%d", t.Type, t.ReplicaName, name, d, after, q)})
		}
		if left := utdTotal - z.utd; left <= int(target.GuaranteedMinimumDataRedundancy) {
			out = append(out, Violation{InvZoneGuard, fmt.Sprintf("%s %s: losing zone %s afterwards leaves %d UpToDate D, GMDR %d", t.Type, t.ReplicaName, name, left, target.GuaranteedMinimumDataRedundancy)})
		}
	}
	return out
}

// checkTBLeaving: a TieBreaker leaves only if the voters do not need it: an even voter
// count whose target FTT is half of it survives FTT failures only through DRBD's
// tiebreaker (TBRequired).
func checkTBLeaving(next *v1alpha1.ReplicatedVolumeStatus, t *v1alpha1.DatameshTransition, target v1alpha1.Layout) []Violation {
	voters, tbs := 0, 1 // the leaving TB, whatever its first step made of it
	for i := range next.Datamesh.Members {
		switch m := &next.Datamesh.Members[i]; {
		case m.Name == t.ReplicaName:
		case m.Type.IsVoter():
			voters++
		case m.Type == v1alpha1.MemberTypeTieBreaker:
			tbs++
		}
	}
	if voters > 0 && voters%2 == 0 && int(target.FailuresToTolerate) == voters/2 && tbs <= 1 {
		return []Violation{{InvTBGuard, fmt.Sprintf("%s %s took the only TieBreaker of %d voters with FTT %d", t.Type, t.ReplicaName, voters, target.FailuresToTolerate)}}
	}
	return nil
}

func member(st *v1alpha1.ReplicatedVolumeStatus, name string) *v1alpha1.DatameshMember {
	for i := range st.Datamesh.Members {
		if st.Datamesh.Members[i].Name == name {
			return &st.Datamesh.Members[i]
		}
	}
	return nil
}

func detaching(st *v1alpha1.ReplicatedVolumeStatus, name string) bool {
	for i := range st.DatameshTransitions {
		if t := &st.DatameshTransitions[i]; t.ReplicaName == name && (t.Type == v1alpha1.TransitionDetach || t.Type == v1alpha1.TransitionAttach) {
			return true
		}
	}
	return false
}

func isMembershipT(t v1alpha1.TransitionType) bool {
	switch t {
	case v1alpha1.TransitionAddReplica, v1alpha1.TransitionRemoveReplica, v1alpha1.TransitionChangeReplicaType, v1alpha1.TransitionForceRemoveReplica:
		return true
	}
	return false
}

// changesDisklessSet: some step of the transition's plan moves its member into or out
// of the set of members DRBD runs diskless (A, TB, and D∅ and sD∅: docs/layouts.md
// §8.4). The steps come from the registry the transition names; a plan the registry
// does not know counts as a change.
func changesDisklessSet(t *v1alpha1.DatameshTransition) bool {
	p, ok := registry.Lookup(t.PlanID, t.PlanVersion)
	if !ok {
		return true
	}
	diskless := func(s datamesh.State) bool {
		return s == datamesh.StateA || s == datamesh.StateTB || s == datamesh.StateDL || s == datamesh.StateSDL
	}
	for _, st := range p.Steps {
		if st.Kind == datamesh.StepMember && diskless(st.From) != diskless(st.To) {
			return true
		}
	}
	return false
}

var registry = datamesh.DefaultRegistry()

// forceRemovedSlots are the slots whose force removal the engine records in st (a
// ForceLeave request, or a ForceRemoveReplica in flight): node lifecycle declared them
// lost when the removal started, and the rules' allowances for a lost member (a
// confirmed loss lowers the FTT; a lost member leaves while attached) hold for them
// after their agent reports again too (ActRejoin), since a started removal is never
// withdrawn.
func forceRemovedSlots(s *Scenario, st *v1alpha1.ReplicatedVolumeStatus) uint32 {
	var out uint32
	mark := func(name string) {
		if j := s.slotOf(name); j >= 0 {
			out |= 1 << uint(j)
		}
	}
	for i := range st.DatameshReplicaRequests {
		if r := &st.DatameshReplicaRequests[i]; r.Operation == v1alpha1.ReplicaOperationForceLeave {
			mark(r.Name)
		}
	}
	for i := range st.DatameshTransitions {
		if t := &st.DatameshTransitions[i]; t.Type == v1alpha1.TransitionForceRemoveReplica {
			mark(t.ReplicaName)
		}
	}
	return out
}

// confirmedLoss: a member the node lifecycle declared lost (forceLeave) is out of the
// published datamesh, and no live replica that runs the volume, the lost node behind
// a partition aside, still runs a datamesh with a connection to it (star members,
// A and TB, never connect to each other).
func confirmedLoss(s *Scenario, w *World, next *v1alpha1.ReplicatedVolumeStatus, forceLeave uint32) bool {
	dp := &w.DP
	for i := 0; i < dp.N; i++ {
		if forceLeave&(1<<i) == 0 || memberOf(next, s.Slots[i].Name) {
			continue
		}
		confirmed := true
		for j := 0; j < dp.N && confirmed; j++ {
			r := &dp.Replicas[j]
			if j == i || !r.Alive || r.Returned || r.Applied.Member(j) == nil || r.Applied.Member(i) == nil {
				continue
			}
			if wantsLink(r.Applied.Member(j).Type, r.Applied.Member(i).Type) {
				confirmed = false
			}
		}
		if confirmed {
			return true
		}
	}
	return false
}

func memberOf(st *v1alpha1.ReplicatedVolumeStatus, name string) bool {
	for i := range st.Datamesh.Members {
		if st.Datamesh.Members[i].Name == name {
			return true
		}
	}
	return false
}

// providedFTT is the FTT the voters (D, D∅) and TieBreakers of members provide with
// GMDR gmdr, written out from docs/datamesh-spec.md rather than taken from pkg/datamesh/layout:
// a majority of the voters must stay, DRBD's tiebreaker forgives one missing voter of
// an even set with a TieBreaker, and gmdr+1 UpToDate copies must stay.
func providedFTT(members []v1alpha1.DatameshMember, gmdr int32) int32 {
	var voters, tb int32
	for i := range members {
		switch {
		case members[i].Type.IsVoter():
			voters++
		case members[i].Type == v1alpha1.MemberTypeTieBreaker:
			tb++
		}
	}
	if voters == 0 {
		return 0
	}
	f := voters - (voters/2 + 1)
	if tb > 0 && voters%2 == 0 {
		f++
	}
	f = min(f, voters-(gmdr+1))
	return max(f, 0)
}
