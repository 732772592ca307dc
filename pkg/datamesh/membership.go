package datamesh

import (
	"strconv"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh/layout"
)

// The membership forward pass turns open replica requests into transitions. For each
// request the planner first decides whether there is anything to do (a skip leaves the
// message alone, so a completion message survives: docs/datamesh.md
// "One Process call") and derives the plan;
// then the parallelism rules and the plan's guards decide whether it may start now (a
// block sets the request's message).

func (rc *reconcile) membership(open, quorumBusy bool) {
	if !open {
		return // every request is done: nothing to plan (the steady state)
	}
	if quorumBusy || rc.groupInFlight(v1.GroupQuorum) {
		rc.blockOpenRequests("Waiting for ChangeQuorum to complete")
		return
	}
	voting := rc.votingInFlight()
	for i := 0; i < len(rc.st.DatameshReplicaRequests); i++ {
		req := rc.st.DatameshReplicaRequests[i]
		if req.Operation == v1.ReplicaOperationForceLeave || rc.transitionOf(req.Name, true) >= 0 {
			continue
		}
		p, blocked := rc.planFor(&req)
		if p == nil {
			if blocked != "" {
				rc.waiting = true
				rc.setRequestMessage(req.Name, blocked)
			}
			continue
		}
		rc.waiting = true
		if p.Group == v1.GroupVotingMembership && voting != "" {
			rc.setRequestMessage(req.Name, "Waiting for the VotingMembership transition of replica "+voting+" to complete (one voter transition at a time)")
			continue
		}
		if p.Group == v1.GroupVotingMembership || changesDiskless(p) {
			if lost := rc.voterForceLeaving(); lost != "" {
				// A lost voter leaves before the voter set changes again (transitions in
				// flight pause too: pausedByLostVoter), and before its replacement joins
				// (awaitReplacement):
				// a voter step the lost member never confirms would either wait for it
				// for ever or, with a q held raised, stop IO for the whole sync. Nor
				// does the diskless set change meanwhile: a replica that applied the
				// removal counts one voter less and, in an even voter set, keeps quorum
				// one vote short through DRBD's tiebreaker with a diskless member the
				// replicas still connected to the lost one do not know (the model
				// checker's "returns behind a partition", 3D with an Access join).
				rc.setRequestMessage(req.Name, "Waiting for the force removal of "+lost+" (a lost voter leaves before the member set changes)")
				continue
			}
		}
		if (p.From == StateTB || p.To == StateTB) && voting != "" {
			// A TieBreaker appearing or leaving while the voter set is half changed would
			// change what DRBD's tiebreaker allows under a q chosen without it.
			rc.setRequestMessage(req.Name, "Waiting for the VotingMembership transition of replica "+voting+" to complete (a TieBreaker change waits for voter changes)")
			continue
		}
		if changesDiskless(p) {
			if other, g := rc.disklessChangeInFlight(); other != "" {
				// Changes of the diskless member set run one at a time (model checker
				// finding F6): DRBD's tiebreaker asks for a majority of the diskless
				// members a node knows, so while two such changes are half applied, the
				// nodes that know only the old member and those that know only the new
				// one could each hold "their" majority on either side of a cut.
				rc.setRequestMessage(req.Name, "Waiting for the "+string(g)+" transition of replica "+other+" to complete (changes of the diskless member set run one at a time)")
				continue
			}
			if other := rc.zoneGuardedLeaveInFlight(); other != "" {
				// A voter's leave passed the zone guards on the diskless members they
				// counted (DRBD's tiebreaker needs a majority of them outside a lost zone:
				// docs/layouts.md §8.6); a diskless member joining or leaving before it
				// completes would make that count wrong while it runs (the deep model
				// check, 2D+1TB TransZonal with shadow support: D → sD and an Access join
				// in the same zone as the other D, started in one pass; docs/datamesh.md
				// "Parallelism").
				rc.setRequestMessage(req.Name, "Waiting for the "+string(v1.GroupVotingMembership)+" transition of replica "+other+" to complete (its zone guards counted the diskless members)")
				continue
			}
		}
		if p.From == StateTB || p.To == StateTB {
			if other := rc.tieBreakerTransition(); other != "" {
				// TieBreaker changes run one at a time (model checker finding F5): DRBD's
				// tiebreaker needs a majority of the diskless members a node knows, so
				// while one TB change is half applied, members disagree on which TB
				// counts. A replacement TB counts for TBRequired only once every member
				// runs it: its AddReplica must complete before the old TB may leave.
				rc.setRequestMessage(req.Name, "Waiting for the "+string(v1.GroupNonVotingMembership)+" transition of TieBreaker "+other+" to complete (TieBreaker changes run one at a time)")
				continue
			}
		}
		if msg := rc.guards(p, &req); msg != "" {
			rc.setRequestMessage(req.Name, msg)
			continue
		}
		ti := rc.start(p, req.Name)
		rc.confirm(ti, p, 0)
		if p.Group == v1.GroupVotingMembership {
			voting = req.Name
		}
	}
}

func (rc *reconcile) groupInFlight(g v1.TransitionGroup) bool {
	ts := rc.st.DatameshTransitions
	for i := range ts {
		if ts[i].Group == g {
			return true
		}
	}
	return false
}

func (rc *reconcile) votingInFlight() string {
	ts := rc.st.DatameshTransitions
	for i := range ts {
		if ts[i].Group == v1.GroupVotingMembership {
			return ts[i].ReplicaName
		}
	}
	return ""
}

// blockOpenRequests sets msg on every request that is not done and has no transition.
func (rc *reconcile) blockOpenRequests(msg string) {
	for i := range rc.st.DatameshReplicaRequests {
		req := rc.st.DatameshReplicaRequests[i]
		if req.Operation == v1.ReplicaOperationForceLeave || rc.transitionOf(req.Name, true) >= 0 {
			continue
		}
		if p, _ := rc.planFor(&req); p != nil {
			rc.waiting = true
			rc.setRequestMessage(req.Name, msg)
		}
	}
}

// planFor is the planner: it returns the plan for a request, or nil and a blocked message,
// or nil and "" when there is nothing to do (skip).
func (rc *reconcile) planFor(req *v1.DatameshReplicaRequest) (*Plan, string) {
	mi := rc.memberIndex(req.Name)
	var from, to State
	switch req.Operation {
	case v1.ReplicaOperationJoin:
		if mi >= 0 || rc.rvrIndex(req.Name) < 0 {
			return nil, ""
		}
		st, ok := StateOfReplicaType(req.Type)
		if !ok {
			return nil, "spec.type: unknown replica type " + strconv.Quote(string(req.Type))
		}
		from, to = StateNew, st
	case v1.ReplicaOperationLeave:
		if mi < 0 {
			return nil, ""
		}
		from, to = rc.mstate(mi), StateGone
	case v1.ReplicaOperationChangeType:
		if mi < 0 {
			return nil, ""
		}
		st, ok := StateOfReplicaType(req.Type)
		if !ok {
			return nil, "spec.type: unknown replica type " + strconv.Quote(string(req.Type))
		}
		from, to = rc.mstate(mi), st
		if from == to {
			return nil, ""
		}
	default:
		return nil, ""
	}
	if from.IsLiminal() {
		return nil, "Member is " + string(from.MemberType()) + ", a transitional state with no transition in flight; it can only be force-removed"
	}
	if (to.IsShadow() || from.IsShadow()) && !rc.features.ShadowDiskful {
		return nil, "ShadowDiskful needs a DRBD with the non-voting disk option (feature ShadowDiskful is off)"
	}
	c := rc.counts()
	eff := rc.effective()
	pp := PathParams{
		VotersOdd: c.voters%2 == 1,
		Shadow:    rc.features.ShadowDiskful,
		QMRUp:     from == StateNew && to == StateD && eff.GMDR < rc.cfg.GMDR,
		QMRDown:   from == StateD && to == StateGone && (eff.GMDR > rc.cfg.GMDR || int(rc.st.Datamesh.QuorumMinimumRedundancy) > rc.cfg.GMDR+1),
		TBHold:    c.tb > 0 || rc.tieBreakerChanging(),
	}
	id, err := DerivedPlanID(from, to, pp)
	if err != nil {
		return nil, "No plan: " + err.Error()
	}
	p, ok := rc.reg.Latest(id)
	if !ok {
		return nil, "Plan " + id + " is not registered in this controller"
	}
	return p, ""
}

// guards runs the plan's preconditions in the specification's order and returns the first blocked
// message, or "".
func (rc *reconcile) guards(p *Plan, req *v1.DatameshReplicaRequest) string {
	if rc.formationActive() {
		return "Waiting for formation to complete"
	}
	mi := rc.memberIndex(req.Name)
	if p.From == StateNew {
		return rc.joinGuards(p, req)
	}
	m := &rc.st.Datamesh.Members[mi]
	if p.To == StateGone {
		// NotAttached: an attached member is converted, never removed (attached-member
		// strategy: the layout asks placement to retype it instead).
		if m.Attached || rc.detachInFlight(m.Name) {
			return "Cannot remove attached member"
		}
	}
	if p.To == StateTB && m.Attached {
		return "Cannot change attached member to TieBreaker"
	}
	if p.From == StateD {
		if msg := rc.leavingDGuards(p, mi); msg != "" {
			if rc.failedDiskLeaving(mi) {
				msg = "Its disk failed: waiting for the replacement Diskful first (" + msg + ")"
			}
			return msg
		}
	}
	if p.From == StateTB {
		if msg := rc.leavingTBGuards(mi); msg != "" {
			return msg
		}
	}
	return ""
}

func (rc *reconcile) detachInFlight(name string) bool {
	ts := rc.st.DatameshTransitions
	for i := range ts {
		if (ts[i].Type == v1.TransitionDetach || ts[i].Type == v1.TransitionForceDetach) && ts[i].ReplicaName == name {
			return true
		}
	}
	return false
}

// joinGuards are the AddReplica guards (docs/datamesh.md "Guards").
func (rc *reconcile) joinGuards(p *Plan, req *v1.DatameshReplicaRequest) string {
	if rc.in.RV.DeletionTimestamp != nil {
		return "Volume is being deleted"
	}
	if p.To == StateA && rc.st.Configuration != nil && rc.st.Configuration.VolumeAccess == v1.VolumeAccessLocal {
		return "volumeAccess=Local: Access replicas cannot join (the volume is used only where a Diskful replica is)"
	}
	r := rc.rvrNamed(req.Name)
	if msg := rc.joinReady(r, nil); msg != "" {
		return msg
	}
	if rc.freeNodeID() < 0 {
		return "No free DRBD node-id (0..31)"
	}
	return ""
}

// unreachedCopies counts the other UpToDate Diskful members that the leaving replica r
// reports it is not connected to. Such a replica may be stale however it reports
// itself: DRBD keeps an isolated replica UpToDate while the side that holds quorum
// writes on without it (docs/soak.md, Findings). Taking r away would leave it as a copy
// that lacks acknowledged writes, so it does not count as one that stays. A peer r does
// not report at all counts, as before.
func (rc *reconcile) unreachedCopies(r *v1.ReplicatedVolumeReplica, mi int) int {
	n := 0
	for k := range rc.st.Datamesh.Members {
		if k == mi || rc.mstate(k) != StateD || !upToDate(rc.rvrOfMember(k)) {
			continue
		}
		name := rc.st.Datamesh.Members[k].Name
		for _, p := range r.Status.Peers {
			if p.Name == name && p.ConnectionState != "Connected" {
				n++
				break
			}
		}
	}
	return n
}

// leavingDGuards are docs/datamesh-spec.md "Preconditions for leaving D".
func (rc *reconcile) leavingDGuards(p *Plan, mi int) string {
	m := &rc.st.Datamesh.Members[mi]
	cfg := rc.st.Configuration
	if m.Attached && cfg != nil && cfg.VolumeAccess == v1.VolumeAccessLocal && p.To != StateSD {
		return "Cannot demote Diskful: volumeAccess=Local requires D on attached node"
	}
	// QMRReady looks at the qmr the removal will run under: a plan that starts with
	// qmr↓ lowers it itself.
	qmr := int(rc.st.Datamesh.QuorumMinimumRedundancy)
	if len(p.Steps) > 0 && p.Steps[0].Kind == StepQMR && p.Steps[0].QMR == Down {
		qmr = rc.cfg.GMDR + 1
	}
	if ok, msg := layout.GuardQMRReady(qmr, rc.cfg.GMDR); !ok {
		return msg
	}
	c := rc.counts()
	r := rc.rvrOfMember(mi)
	leavingUpToDate := upToDate(r)
	copies := c.upToDateD
	if leavingUpToDate {
		copies -= rc.unreachedCopies(r, mi)
	}
	if ok, msg := layout.GuardGMDR(copies, leavingUpToDate, rc.cfg.GMDR); !ok {
		return msg
	}
	if ok, msg := layout.GuardFTT(c.voters, rc.cfg); !ok {
		return msg
	}
	if after := c.voters - 1; c.tb < layout.TieBreakerMin(after, rc.cfg.FTT) {
		// The voters left would be an even set that survives FTT failures only through
		// DRBD's tiebreaker, and there is no TieBreaker yet: the TieBreaker joins first
		// (add before remove). Without this, 3D → 2D+1TB by a retype (not by the
		// layout, which creates the TB first) drops the effective FTT below the
		// configuration for as long as placement needs to create the TB (model checker,
		// R-ratchet).
		return "Would violate FTT: " + strconv.Itoa(after) + " voters need a TieBreaker for FTT=" + strconv.Itoa(rc.cfg.FTT) + " (TB_count=" + strconv.Itoa(c.tb) + "); waiting for a TieBreaker to join first"
	}
	if cfg != nil && cfg.Topology == v1.TopologyTransZonal {
		zones := rc.zoneCounts()
		l := layout.Leaving{Zone: m.Zone, UpToDate: leavingUpToDate}
		if ok, msg := layout.GuardZoneGMDR(zones, l, rc.cfg.GMDR); !ok {
			return msg
		}
		if ok, msg := layout.GuardZoneFTT(zones, l, rc.effective()); !ok {
			return msg
		}
	}
	return ""
}

// leavingTBGuards are docs/datamesh-spec.md "Preconditions for leaving TB".
//
// The guard is checked against the configuration both raised by Input.ExtraFTT and
// as written: it is the one guard that a higher FTT can pass where a lower one does
// not (a TB is required exactly when FTT = D/2), and a node maintenance only adds
// protection. Two voters left of a 3D (one lost) need the TB for FTT 1; that the raise
// to 4D+1TB asks for FTT 2, which two voters cannot give, must not let it go
// (docs/modelcheck-findings.md, M2).
func (rc *reconcile) leavingTBGuards(mi int) string {
	c := rc.counts()
	for _, ftt := range []int{rc.cfg.FTT, rc.baseCfg.FTT} {
		if ok, msg := layout.GuardTBRequired(c.tb, c.voters, ftt); !ok {
			return msg
		}
	}
	if cfg := rc.st.Configuration; cfg != nil && cfg.Topology == v1.TopologyTransZonal {
		if ok, msg := layout.GuardZoneTBRequired(rc.zoneCounts(), rc.st.Datamesh.Members[mi].Zone, rc.effective()); !ok {
			return msg
		}
	}
	return ""
}

// zoneCounts counts the members per zone for the zone guards.
func (rc *reconcile) zoneCounts() []layout.ZoneCount {
	var z []layout.ZoneCount
	for i := range rc.st.Datamesh.Members {
		m := &rc.st.Datamesh.Members[i]
		k := -1
		for j := range z {
			if z[j].Zone == m.Zone {
				k = j
				break
			}
		}
		if k < 0 {
			z = append(z, layout.ZoneCount{Zone: m.Zone})
			k = len(z) - 1
		}
		switch rc.mstate(i) {
		case StateD:
			z[k].D++
			if upToDate(rc.rvrOfMember(i)) {
				z[k].UpToDateD++
			}
		case StateDL:
			z[k].D++
		case StateTB:
			z[k].TB++
		case StateA, StateSDL:
			z[k].Diskless++
		}
	}
	return z
}

// isDiskless: the member is configured without a disk, so DRBD counts it among the
// diskless nodes whose majority its tiebreaker needs: A, TB, and D∅, sD∅
// (docs/layouts.md §8.4).
func isDiskless(s State) bool {
	return s == StateA || s == StateTB || s == StateDL || s == StateSDL
}

// changesDiskless: some step of p adds a member to the diskless set or takes one out of
// it (a diskless member joining or leaving, a disk attached or detached).
func changesDiskless(p *Plan) bool {
	for i := range p.Steps {
		if st := &p.Steps[i]; st.Kind == StepMember && isDiskless(st.From) != isDiskless(st.To) {
			return true
		}
	}
	return false
}

// disklessChangeInFlight names the replica (and group) of a membership transition in
// flight that changes the diskless set, or "". A transition whose plan this controller
// does not know counts as one, and so does every force removal not yet confirmed,
// whatever the type it removes: the lost member may have been lost in the middle of
// a join whose last published step (sD∅ → sD, D∅ → D) no survivor applied, so the
// survivors that have not confirmed the removal still run it as a diskless member
// (the deep model check, 2D TransZonal with shadow support: an sD∅ joining is lost,
// force-removed as sD, and an Access or sD∅ join that followed at once gave each side
// of a cut its own diskless majority: docs/modelcheck-findings.md D5).
func (rc *reconcile) disklessChangeInFlight() (string, v1.TransitionGroup) {
	ts := rc.st.DatameshTransitions
	for i := range ts {
		t := &ts[i]
		if !isMembership(t.Type) {
			continue
		}
		if p, ok := rc.planOf(t); !ok || t.Type == v1.TransitionForceRemoveReplica || changesDiskless(p) {
			return t.ReplicaName, t.Group
		}
	}
	return "", ""
}

// zoneGuardedLeaveInFlight names the replica of a voter's leave in flight (a
// non-force transition from a voter to a non-voter or out) of a TransZonal volume, or
// "": its ZoneFTT guard judged the loss of each zone with the diskless members of the
// datamesh it started in. The leaves whose plan changes the diskless set themselves
// (D → D∅ → …) already hold diskless changes back (disklessChangeInFlight); this covers
// the ones that do not, the shadow D → sD.
func (rc *reconcile) zoneGuardedLeaveInFlight() string {
	if cfg := rc.st.Configuration; cfg == nil || cfg.Topology != v1.TopologyTransZonal {
		return ""
	}
	ts := rc.st.DatameshTransitions
	for i := range ts {
		t := &ts[i]
		if !isMembership(t.Type) || t.Type == v1.TransitionForceRemoveReplica {
			continue
		}
		if p, ok := rc.planOf(t); ok && p.From.IsVoter() && !p.To.IsVoter() {
			return t.ReplicaName
		}
	}
	return ""
}

// tieBreakerTransition names the replica of a membership transition in flight that adds,
// removes or retypes a TieBreaker, or "".
func (rc *reconcile) tieBreakerTransition() string {
	ts := rc.st.DatameshTransitions
	for i := range ts {
		if isMembership(ts[i].Type) && (ts[i].FromType == v1.MemberTypeTieBreaker || ts[i].ToType == v1.MemberTypeTieBreaker) {
			return ts[i].ReplicaName
		}
	}
	return ""
}

// tieBreakerChanging: a TieBreaker is joining, leaving or changing type, so some members
// may still count it: a voter change must hold q as if it were there.
func (rc *reconcile) tieBreakerChanging() bool { return rc.tieBreakerTransition() != "" }
