package datamesh

import (
	"math/bits"
	"slices"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh/layout"
)

// activeStep is the first step not completed, -1 when all are.
func activeStep(t *v1.DatameshTransition) int {
	for i := range t.Steps {
		if t.Steps[i].Status != v1.StepCompleted {
			return i
		}
	}
	return -1
}

func (rc *reconcile) planOf(t *v1.DatameshTransition) (*Plan, bool) {
	return rc.reg.Lookup(t.PlanID, t.PlanVersion)
}

// start appends a transition running plan p for replica (empty for volume-wide ones) and
// publishes its first step. It returns the transition's index.
func (rc *reconcile) start(p *Plan, replica string) int {
	ti := rc.appendTransition(p, replica)
	st := rc.st
	track := replica != "" && isMembership(p.Type)
	if track && p.From != StateNew {
		// Before the first step, which may remove the member (A → ✕)...
		rc.recordNodeID(ti)
	}
	if p.Type != v1.TransitionFormation {
		rc.publish(ti, p, 0)
	}
	if track && st.DatameshTransitions[ti].ReplicaNodeID == nil {
		// ...or after it: a joining replica has its node-id only from ✦ → X on.
		rc.recordNodeID(ti)
	}
	return ti
}

// recordNodeID stores the affected member's node-id in transition ti
// (DatameshTransition.replicaNodeID, docs/datamesh.md "Node-ids"). It outlives the member during a
// removal: freeNodeID does not hand the id to a newcomer while the transition runs, and
// the progress message names the replica "#id" like every other member even after it
// left the member list.
func (rc *reconcile) recordNodeID(ti int) {
	t := &rc.st.DatameshTransitions[ti]
	mi := rc.memberIndex(t.ReplicaName)
	if mi < 0 {
		return
	}
	id := rc.st.Datamesh.Members[mi].NodeID
	if t.ReplicaNodeID == nil || *t.ReplicaNodeID != id {
		t.ReplicaNodeID = &id
	}
}

// publish applies step si of transition ti to the datamesh and bumps the revision: one
// published change, one revision. A formation sync step publishes nothing.
func (rc *reconcile) publish(ti int, p *Plan, si int) {
	st := rc.st
	t := &st.DatameshTransitions[ti]
	step := &p.Steps[si]
	rev := st.DatameshRevision
	switch step.Kind {
	case StepMember:
		qBefore := st.Datamesh.Quorum
		before := rc.counts()
		tb := before.tb > 0 || rc.tieBreakerChanging()
		rc.applyMember(t.ReplicaName, step.From, step.To)
		switch {
		case step.HoldQ:
			st.Datamesh.Quorum = max(st.Datamesh.Quorum, int32(heldQuorum(before.voters, rc.counts().voters, int(qBefore), tb)))
		case holdActive(p, si) || rc.otherHoldActive(ti) || rc.forceRemovalUnconfirmed():
			// q stays held while this transition's hold lasts, and while another
			// transition's does: a step of an unrelated member recomputes q by the
			// formula, which must not drop a hold a voter transition in flight raised
			// (model checker finding F6), nor the q a force removal kept until every
			// other replica has confirmed it (emergency).
			st.Datamesh.Quorum = max(st.Datamesh.Quorum, qBefore)
		}
		rc.pin() // a person's override beats the holds too: that is what it is for
		rev = rc.bump()
	case StepQ:
		rc.afterMembershipChange()
		rev = rc.bump()
	case StepQMR:
		c := rc.counts()
		rc.setQMR(rc.effective().NextQMR(rc.cfg, c.upToDateD))
		rev = rc.bump()
	case StepAttach, StepDetach:
		if mi := rc.memberIndex(t.ReplicaName); mi >= 0 {
			st.Datamesh.Members[mi].Attached = step.Kind == StepAttach
		}
		rev = rc.bump()
	case StepMultiattach:
		st.Datamesh.Multiattach = step.QMR == Up
		rev = rc.bump()
	case StepQuorum:
		// The values were written when the ChangeQuorum started (changeQuorum).
		rev = rc.bump()
	case StepFormationPublish:
		rc.formationPublish()
		rev = rc.bump()
	case StepFormationSync:
	}
	t = &st.DatameshTransitions[ti]
	ts := &t.Steps[si]
	ts.Status = v1.StepActive
	ts.DatameshRevision = rev
	ts.StartedAt = rc.now()
	ts.CompletedAt = nil
	ts.Message = ""
}

// heldQuorum is the smallest q for the new voter set such that, while a step that
// changes the voter count from nOld to nNew is half applied, no quorum of the new
// configuration is disjoint from a quorum of the old one (q = qOld), DRBD's tiebreaker
// included. The tiebreaker lets an even voter set keep quorum one vote short with a
// majority of the diskless members; since a TieBreaker can be on one side of a
// partition only, at most one of the two disjoint sides uses it, so with N = max(nOld,
// nNew) voters in play it is enough that
//
//	(qOld − tOld) + qNew > N   and   qOld + (qNew − tNew) > N
//
// where t is 1 for an even voter set with a TieBreaker. Without a TieBreaker this is
// the specification's rule (q rises odd→even, stays even→odd); with one it is one more in the
// cases the model checker found (2D+1TB → 3D: q=3 while half applied).
func heldQuorum(nOld, nNew, qOld int, tb bool) int {
	n := max(nOld, nNew)
	t := func(v int) int {
		if tb && v%2 == 0 && v > 0 {
			return 1
		}
		return 0
	}
	return min(max(n-(qOld-t(nOld))+1, n-qOld+t(nNew)+1), 32)
}

// holdActive: a HoldQ step of plan p came before step si and its closing StepQ has not
// been published yet, so q stays held.
func holdActive(p *Plan, si int) bool {
	held := false
	for j := 0; j < si && j < len(p.Steps); j++ {
		switch {
		case p.Steps[j].HoldQ:
			held = true
		case p.Steps[j].Kind == StepQ:
			held = false
		}
	}
	return held
}

// otherHoldActive: a transition other than ti holds q raised (its HoldQ step is
// published and its closing q↓ is not).
func (rc *reconcile) otherHoldActive(ti int) bool {
	ts := rc.st.DatameshTransitions
	for i := range ts {
		if i != ti && ts[i].Group == v1.GroupVotingMembership && rc.holdPublished(&ts[i]) {
			return true
		}
	}
	return false
}

// holdPublished: transition t's hold is in force — its HoldQ step was published and its
// closing StepQ was not (a transition whose plan is unknown counts as holding).
func (rc *reconcile) holdPublished(t *v1.DatameshTransition) bool {
	p, ok := rc.planOf(t)
	if !ok || len(p.Steps) != len(t.Steps) {
		return true
	}
	published := 0
	for published < len(t.Steps) && t.Steps[published].Status != v1.StepPending {
		published++
	}
	return holdActive(p, published)
}

// applyMember moves member name from → to (✦ adds it, ✕ removes it), then ratchets the
// effective layout and recomputes q.
func (rc *reconcile) applyMember(name string, from, to State) {
	st := rc.st
	switch {
	case from == StateNew:
		j := rc.rvrIndex(name)
		m := v1.DatameshMember{Name: name, Type: to.MemberType(), NodeID: int32(rc.freeNodeID())}
		if j >= 0 {
			r := rc.in.RVRs[j]
			m.NodeName = r.Spec.NodeName
			m.Addresses = slices.Clone(r.Status.Addresses)
			if n := rc.in.Pool.FindNode(r.Spec.NodeName); n != nil {
				m.Zone = n.Zone
			}
		}
		st.Datamesh.Members = slices.Insert(st.Datamesh.Members, rc.memberInsertAt(name), m)
	case to == StateGone:
		if mi := rc.memberIndex(name); mi >= 0 {
			st.Datamesh.Members = slices.Delete(st.Datamesh.Members, mi, mi+1)
		}
	default:
		if mi := rc.memberIndex(name); mi >= 0 {
			st.Datamesh.Members[mi].Type = to.MemberType()
		}
	}
	rc.afterMembershipChange()
}

// freeNodeID is the lowest DRBD node-id (0..31) no member holds and no replica still has
// configured as a peer of a non-member: a replica that left may still be known to its
// former peers until they confirm its removal, and reusing its node-id before that would
// hand its bitmap slot to a stranger. -1 when none is free.
func (rc *reconcile) freeNodeID() int {
	var used uint32
	for i := range rc.st.Datamesh.Members {
		used |= 1 << uint(rc.st.Datamesh.Members[i].NodeID&31)
	}
	// A replica in a transition keeps its node-id until the transition is done
	// (docs/datamesh.md "Node-ids"):
	// a leaving member's peers drop it only as they confirm its removal.
	for i := range rc.st.DatameshTransitions {
		if id := rc.st.DatameshTransitions[i].ReplicaNodeID; id != nil && *id >= 0 && *id < 32 {
			used |= 1 << uint(*id)
		}
	}
	for _, r := range rc.in.RVRs {
		for k := range r.Status.Peers {
			p := &r.Status.Peers[k]
			if p.NodeID != nil && *p.NodeID >= 0 && *p.NodeID < 32 && rc.memberIndex(p.Name) < 0 {
				used |= 1 << uint(*p.NodeID)
			}
		}
	}
	for id := 0; id < 32; id++ {
		if used&(1<<uint(id)) == 0 {
			return id
		}
	}
	return -1
}

// backward confirms the active step of every transition in flight, advancing to the next
// step or completing the transition when every replica that must has confirmed.
func (rc *reconcile) backward() {
	st := rc.st
	// paused: a step was held back by a lost voter's removal (pausedByLostVoter);
	// lostGone: such a removal completed in this pass. Then the held steps may go now.
	paused, lostGone := false, false
	defer func() {
		if paused && lostGone {
			rc.backward()
		}
	}()
	for ti := 0; ti < len(st.DatameshTransitions); {
		t := &st.DatameshTransitions[ti]
		p, ok := rc.planOf(t)
		if !ok || len(p.Steps) != len(t.Steps) {
			// A plan this controller does not know (a downgrade?) is never guessed at.
			if si := activeStep(t); si >= 0 {
				rc.setStepMessage(ti, si, "Plan "+t.PlanID+" version "+strconv.Itoa(int(t.PlanVersion))+" is not registered in this controller; cannot continue")
			}
			rc.waiting = true
			ti++
			continue
		}
		if t.ReplicaNodeID == nil && t.ReplicaName != "" && isMembership(t.Type) {
			rc.recordNodeID(ti) // a transition written before replicaNodeID existed
		}
		si := activeStep(t)
		if si < 0 {
			rc.complete(ti, p)
			continue
		}
		if t.Steps[si].Status == v1.StepPending {
			if t.Type == v1.TransitionFormation && si == 0 {
				ti++ // formation() publishes when the replicas are ready
				continue
			}
			if msg := rc.pausedByLostVoter(t); msg != "" {
				paused = true
				rc.setStepMessage(ti, si, msg)
				rc.setRequestMessage(t.ReplicaName, requestPrefix(t.Type)+", step "+strconv.Itoa(si+1)+"/"+strconv.Itoa(len(t.Steps))+" ("+p.Steps[si].Name+"): "+msg)
				rc.waiting = true
				ti++
				continue
			}
			if msg := rc.detachUnsafe(t, &p.Steps[si]); msg != "" {
				// The disk this transition would detach has become the copy GMDR needs
				// (another copy was lost since the guards passed): give the transition up
				// before it detaches; the request is planned again and waits at the guard.
				name, typ := t.ReplicaName, t.Type
				rc.cancel(ti)
				rc.setRequestMessage(name, msg)
				rc.event(EventWarning, "TransitionCancelled", "The "+string(typ)+" of replica "+name+" was cancelled before detaching its disk: "+msg)
				rc.waiting = true
				continue
			}
			if msg := rc.notReady(t, &p.Steps[si]); msg != "" {
				rc.setStepMessage(ti, si, msg)
				if isMembership(t.Type) {
					rc.setRequestMessage(t.ReplicaName, requestPrefix(t.Type)+", step "+strconv.Itoa(si+1)+"/"+strconv.Itoa(len(t.Steps))+" ("+p.Steps[si].Name+"): "+msg)
				}
				rc.waiting = true
				ti++
				continue
			}
			rc.publish(ti, p, si)
		}
		if !rc.confirm(ti, p, si) {
			ti++
			continue
		}
		t = &st.DatameshTransitions[ti]
		t.Steps[si].Status = v1.StepCompleted
		t.Steps[si].CompletedAt = rc.now()
		if si+1 < len(t.Steps) {
			continue // publish the next step (when ready) and confirm it: 0/n
		}
		lostGone = lostGone || (t.Type == v1.TransitionForceRemoveReplica && StateOfMember(t.FromType).IsVoter())
		rc.complete(ti, p)
	}
}

// pausedByLostVoter returns why membership transition t publishes no further step now,
// or "": a voter of the datamesh is lost (named in ForceLeave, or its ForceRemoveReplica
// not yet confirmed by every other replica), docs/datamesh.md "A voter lost under a
// transition in flight". Until every survivor runs the removal, a replica that has not
// applied it still connects to the lost member, which, alive behind a partition, runs
// the datamesh it last applied. A step published meanwhile — the newcomer's disk
// attached (D∅ → D), a held q lowered (q↓), a qmr change — gives the survivors that
// applied it a quorum the old configuration does not intersect: the lost member and a
// replica still connected to it keep the old quorum through DRBD's tiebreaker on the
// other side of a cut (the model checker's "returns behind a partition", 2D+1TB with an
// AddReplica in flight). Steps already published are still confirmed (without the
// lost member); the transition resumes once the removal is confirmed. The lost
// member's own transitions are cancelled by its removal and are not held here.
func (rc *reconcile) pausedByLostVoter(t *v1.DatameshTransition) string {
	if !isMembership(t.Type) || t.Type == v1.TransitionForceRemoveReplica {
		return ""
	}
	lost := rc.voterForceLeaving()
	if lost == "" || lost == t.ReplicaName {
		return ""
	}
	return "Paused until the force removal of " + lost + " is confirmed (a lost voter leaves before the member set changes)"
}

// detachUnsafe returns the GMDR guard's message when step would detach the disk of a
// Diskful member (D → D∅) that is now needed as a copy, or "". The leaving-D guards ran
// when the transition started; a copy lost since then (a node died and its replica is
// no longer counted) must not be followed by detaching another: that is the last live
// UpToDate disk going away (found by the model checker, 2D → 1D with the other D lost
// mid-removal). D → D∅ is the first member step of every plan that takes a D away, so
// only qmr↓ can have been published before it, and cancelling leaves a consistent state.
func (rc *reconcile) detachUnsafe(t *v1.DatameshTransition, step *Step) string {
	if step.Kind != StepMember || step.From != StateD || step.To != StateDL {
		return ""
	}
	mi := rc.memberIndex(t.ReplicaName)
	if mi < 0 {
		return ""
	}
	if ok, msg := layout.GuardGMDR(rc.counts().upToDateD, upToDate(rc.rvrOfMember(mi)), rc.cfg.GMDR); !ok {
		return msg
	}
	return ""
}

// notReady returns why a pending step may not be published yet, or "". The qmr↑ at the
// end of AddReplica(D) waits for the new D to be UpToDate: before that, raising qmr would
// cost the fault tolerance it is meant to add (layout.NextQMR keeps the effective FTT),
// so publishing it would only publish the old value.
func (rc *reconcile) notReady(t *v1.DatameshTransition, step *Step) string {
	if step.Kind != StepQMR || step.QMR != Up {
		return ""
	}
	mi := rc.memberIndex(t.ReplicaName)
	if mi >= 0 && !upToDate(rc.rvrOfMember(mi)) {
		return "Waiting for " + t.ReplicaName + " to be UpToDate before raising qmr (qmr=" +
			strconv.Itoa(int(rc.st.Datamesh.QuorumMinimumRedundancy)) + ")"
	}
	return ""
}

// complete removes a finished transition, leaving its completion message on the request.
func (rc *reconcile) complete(ti int, p *Plan) {
	st := rc.st
	t := st.DatameshTransitions[ti]
	if t.Type != v1.TransitionForceRemoveReplica && t.Type != v1.TransitionRemoveReplica && isMembership(t.Type) &&
		rc.forceLeaving(t.ReplicaName) && rc.memberIndex(t.ReplicaName) >= 0 {
		// The last step went without the member, whose node is lost (waitSet): the
		// request stays ForceLeave, with its own message on what the removal waits for.
		rc.event(EventWarning, "TransitionEndedWithoutLostMember", "The "+string(t.Type)+" of replica "+t.ReplicaName+
			" completed without its confirmation: its node is lost and every other member confirmed the last step; its force removal follows")
		st.DatameshTransitions = slices.Delete(st.DatameshTransitions, ti, ti+1)
		return
	}
	switch t.Type {
	case v1.TransitionAddReplica:
		rc.setRequestMessage(t.ReplicaName, "Joined datamesh successfully")
		rc.event(EventNormal, "ReplicaJoined", "Replica "+t.ReplicaName+" joined the datamesh as "+string(t.ToType))
	case v1.TransitionRemoveReplica:
		if rc.forceLeaving(t.ReplicaName) {
			// Its node was declared lost after it left the member list: every other
			// member has confirmed the removal, the replica itself never will.
			rc.setRequestMessage(t.ReplicaName, "Force-removed from datamesh")
			rc.event(EventWarning, "ReplicaForceRemoved", "Replica "+t.ReplicaName+" was force-removed: its node is lost, every other member confirmed its removal")
			break
		}
		rc.setRequestMessage(t.ReplicaName, "Left datamesh successfully")
		rc.event(EventNormal, "ReplicaLeft", "Replica "+t.ReplicaName+" left the datamesh")
	case v1.TransitionChangeReplicaType:
		rc.setRequestMessage(t.ReplicaName, "Changed type to "+string(t.ToType)+" successfully")
		rc.event(EventNormal, "ReplicaTypeChanged", "Replica "+t.ReplicaName+" changed from "+string(t.FromType)+" to "+string(t.ToType))
	case v1.TransitionForceRemoveReplica:
		rc.setRequestMessage(t.ReplicaName, "Force-removed from datamesh")
		rc.event(EventWarning, "ReplicaForceRemoved", "Replica "+t.ReplicaName+" was force-removed from the datamesh")
	case v1.TransitionFormation:
		rc.formationComplete()
	case v1.TransitionChangeQuorum:
		rc.event(EventNormal, "QuorumChanged", "Quorum changed to q="+itoa(int(st.Datamesh.Quorum))+", qmr="+itoa(int(st.Datamesh.QuorumMinimumRedundancy)))
	}
	st.DatameshTransitions = slices.Delete(st.DatameshTransitions, ti, ti+1)
}

// cancel removes transition ti without completing it (emergency preemption).
func (rc *reconcile) cancel(ti int) {
	st := rc.st
	st.DatameshTransitions = slices.Delete(st.DatameshTransitions, ti, ti+1)
}

func (rc *reconcile) setStepMessage(ti, si int, msg string) {
	ts := &rc.st.DatameshTransitions[ti].Steps[si]
	if ts.Message != msg {
		ts.Message = msg
	}
}

// WaitSet says who must confirm a step, who has, and who is still waited for, as bitsets
// of DRBD node-ids; Self* is the affected replica once it is no longer a member (a
// leaving replica confirms by revision, by reporting 0, or by its RVR being gone).
type WaitSet struct {
	Must, Confirmed uint32
	SelfMust        bool
	SelfConfirmed   bool
}

// Done reports whether every replica that must confirm has.
func (w WaitSet) Done() bool {
	return w.Must&^w.Confirmed == 0 && (!w.SelfMust || w.SelfConfirmed)
}

// waitSet computes the step's wait set (docs/datamesh-spec.md "Step confirmation rules"): the step's
// own group, united with D + D∅ when the step changes q, without the dead member on force
// paths, and without members that joined after the step was published (their first
// configuration is already newer).
func (rc *reconcile) waitSet(t *v1.DatameshTransition, step *Step, rev int64) WaitSet {
	var w WaitSet
	ms := rc.st.Datamesh.Members
	affected := t.ReplicaName
	am := -1 // the affected member, found once instead of comparing every name
	if affected != "" {
		am = rc.memberIndex(affected)
	}
	affectedMember := am >= 0
	late := rc.joinedAfterSet(rev)
	// The last step of a lost member's own transition does not wait for the member
	// (docs/datamesh.md "A voter lost under a transition in flight"): every other member
	// confirmed it, the member's node never will, and nothing is published after it.
	// Without this a join lost at its last step (the hold's q↓) waited for ever when its
	// force removal waited for a replacement that no free node could host (model
	// checker, M1). An earlier step still waits: the next one would be published for a
	// member that is gone, and the force removal cancels the transition instead.
	lostAtLastStep := am >= 0 && isMembership(t.Type) && t.Type != v1.TransitionForceRemoveReplica &&
		activeStep(t) == len(t.Steps)-1 && rc.forceLeaving(affected)
	for i := range ms {
		m := &ms[i]
		s := rc.mstate(i)
		isAffected := i == am
		in := false
		switch step.Confirm {
		case ConfirmAffected:
			in = isAffected
		case ConfirmFullMeshAffected:
			in = isAffected || s.IsFullMesh()
		case ConfirmAll:
			in = true
		case ConfirmVoters:
			in = s.IsVoter()
		case ConfirmDiskful:
			in = s == StateD
		}
		if (step.Q != NoChange || step.HoldQ) && s.IsVoter() {
			in = true
		}
		if (step.Force || lostAtLastStep) && isAffected {
			in = false
		}
		if !in || (!isAffected && i < 64 && late&(1<<uint(i)) != 0) {
			continue
		}
		bit := uint32(1) << uint(m.NodeID&31)
		w.Must |= bit
		r := rc.rvrOfMember(i)
		if step.Confirm == ConfirmDiskful {
			if upToDate(r) {
				w.Confirmed |= bit
			}
		} else if r != nil && r.Status.DatameshRevision >= rev {
			w.Confirmed |= bit
		}
	}
	if affected != "" && !affectedMember && !step.Force && step.Kind == StepMember {
		w.SelfMust = true
		r := rc.rvrNamed(affected)
		// A replica declared lost (ForceLeave) confirms nothing any more: its removal is
		// done once the others have confirmed it (forceRemovalsReady).
		w.SelfConfirmed = r == nil || r.Status.DatameshRevision == 0 || r.Status.DatameshRevision >= rev || rc.forceLeaving(affected)
	}
	return w
}

// joinedAfterSet marks (by member index) the members still joining through a transition
// published after rev: their first configuration is already newer than rev.
func (rc *reconcile) joinedAfterSet(rev int64) uint64 {
	var set uint64
	ts := rc.st.DatameshTransitions
	for i := range ts {
		if ts[i].Type == v1.TransitionAddReplica && len(ts[i].Steps) > 0 && ts[i].Steps[0].DatameshRevision > rev {
			if mi := rc.memberIndex(ts[i].ReplicaName); mi >= 0 && mi < 64 {
				set |= 1 << uint(mi)
			}
		}
	}
	return set
}

// confirm evaluates the active step of transition ti and writes its progress message
// (on the step, and on the replica request for membership transitions). It reports
// whether the step is confirmed.
func (rc *reconcile) confirm(ti int, p *Plan, si int) bool {
	t := &rc.st.DatameshTransitions[ti]
	step := &p.Steps[si]
	rev := t.Steps[si].DatameshRevision
	w := rc.waitSet(t, step, rev)
	done := w.Done()
	if !done {
		rc.waiting = true
	}
	msg := rc.progress(t, step, rev, w)
	t.Steps[si].Message = msg
	if isMembership(t.Type) && !done {
		// The request says the same, naming the transition and the step.
		rc.setRequestMessage(t.ReplicaName, requestPrefix(t.Type)+", step "+strconv.Itoa(si+1)+"/"+strconv.Itoa(len(t.Steps))+" ("+step.Name+"): "+msg)
	}
	return done
}

func requestPrefix(t v1.TransitionType) string {
	switch t {
	case v1.TransitionAddReplica:
		return "Joining datamesh"
	case v1.TransitionRemoveReplica:
		return "Leaving datamesh"
	case v1.TransitionChangeReplicaType:
		return "Changing type"
	case v1.TransitionForceRemoveReplica:
		return "Force-removing from datamesh"
	}
	return string(t)
}

// progress renders the progress message (docs/datamesh.md "Confirmation"):
//
//	3/4 replicas confirmed revision 7. Waiting: [#2]. Errors: #2 DRBDConfigured/Reason: msg
//
// Errors lists the waiting replicas whose agent is not reporting (AgentReady not True),
// and those whose DRBDConfigured condition is not True, except the normal in-flight
// reason ApplyingConfiguration and a joining replica's own PendingDatameshJoin.
func (rc *reconcile) progress(t *v1.DatameshTransition, step *Step, rev int64, w WaitSet) string {
	var b []byte
	total := popcount(w.Must)
	ok := popcount(w.Must & w.Confirmed)
	if w.SelfMust {
		total++
		if w.SelfConfirmed {
			ok++
		}
	}
	b = strconv.AppendInt(b, int64(ok), 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(total), 10)
	if step.Confirm == ConfirmDiskful {
		b = append(b, " Diskful replicas UpToDate."...)
	} else {
		b = append(b, " replicas confirmed revision "...)
		b = strconv.AppendInt(b, rev, 10)
		b = append(b, '.')
	}
	waiting := w.Must &^ w.Confirmed
	selfWaiting := w.SelfMust && !w.SelfConfirmed
	if waiting == 0 && !selfWaiting {
		return string(b)
	}
	// A replica that already left the member list is named by the node-id its
	// transition kept (docs/datamesh.md "Node-ids"), in node-id order with the others; a transition written
	// before replicaNodeID existed has only the name.
	selfID, selfByName := -1, false
	if selfWaiting {
		if id := t.ReplicaNodeID; id != nil && *id >= 0 && *id < 32 && waiting&(1<<uint(*id)) == 0 {
			selfID = int(*id)
			waiting |= 1 << uint(selfID)
		} else {
			selfByName = true
		}
	}
	b = append(b, " Waiting: ["...)
	first := true
	for rest := waiting; rest != 0; rest &= rest - 1 {
		id := bits.TrailingZeros32(rest)
		if !first {
			b = append(b, ", "...)
		}
		first = false
		b = append(b, '#')
		b = strconv.AppendInt(b, int64(id), 10)
	}
	if selfByName {
		if !first {
			b = append(b, ", "...)
		}
		b = append(b, t.ReplicaName...)
	}
	b = append(b, "]."...)
	errStart := len(b)
	for rest := waiting; rest != 0; rest &= rest - 1 {
		id := bits.TrailingZeros32(rest)
		var r *v1.ReplicatedVolumeReplica
		if id == selfID {
			r = rc.rvrNamed(t.ReplicaName)
		} else {
			r = rc.rvrOfMember(rc.memberByNodeID(int32(id)))
		}
		b = rc.appendError(b, r, id, "", t, step, errStart)
	}
	if selfByName {
		b = rc.appendError(b, rc.rvrNamed(t.ReplicaName), -1, t.ReplicaName, t, step, errStart)
	}
	return string(b)
}

// appendError appends r's error, labelled "#id" (or name when id < 0): its AgentReady
// condition when the controller says its agent is not reporting (the agent's own
// conditions are then stale), else its DRBDConfigured condition when that is not True.
func (rc *reconcile) appendError(b []byte, r *v1.ReplicatedVolumeReplica, id int, name string, t *v1.DatameshTransition, step *Step, errStart int) []byte {
	if r == nil {
		// A member whose replica object vanished (deleted past its finalizer) cannot
		// confirm anything: nobody will report for it. Say so, and what ends the wait.
		if id < 0 {
			return b
		}
		if len(b) == errStart {
			b = append(b, " Errors: "...)
		} else {
			b = append(b, ", "...)
		}
		b = append(b, '#')
		b = strconv.AppendInt(b, int64(id), 10)
		return append(b, " replica object is gone (name it in ForceLeave if its node is lost, or recreate it)"...)
	}
	c := agentReadyCondition(r)
	if c == nil || c.Status == metav1.ConditionTrue {
		c = nil
		for k := range r.Status.Conditions {
			if d := &r.Status.Conditions[k]; d.Type == v1.ConditionDRBDConfigured {
				c = d
				break
			}
		}
		if c == nil || c.Status == metav1.ConditionTrue ||
			c.Reason == v1.ReasonApplyingConfiguration || c.Reason == v1.ReasonConfigured {
			return b
		}
		if c.Reason == v1.ReasonPendingDatameshJoin && r.Name == t.ReplicaName && step.From == StateNew {
			return b
		}
	}
	if len(b) == errStart {
		b = append(b, " Errors: "...)
	} else {
		b = append(b, ", "...)
	}
	if id >= 0 {
		b = append(b, '#')
		b = strconv.AppendInt(b, int64(id), 10)
	} else {
		b = append(b, name...)
	}
	b = append(b, ' ')
	b = append(b, c.Type...)
	b = append(b, '/')
	b = append(b, c.Reason...)
	if c.Message != "" {
		b = append(b, ": "...)
		b = append(b, c.Message...)
	}
	if c.Type == v1.ConditionAgentReady {
		// Say what ends the wait (docs/datamesh.md "Replacing a lost node"): the agent
		// reporting again, or the node lifecycle declaring the node lost, after which the
		// replica is force-removed and no step waits for it any more.
		if rc.forceLeaving(r.Name) {
			b = append(b, " (its node is declared lost: the wait ends when it is force-removed)"...)
		} else {
			b = append(b, " (the wait ends when its agent reports again, or when its node is declared lost and it is force-removed)"...)
		}
	}
	return b
}

func (rc *reconcile) memberByNodeID(id int32) int {
	ms := rc.st.Datamesh.Members
	for i := range ms {
		if ms[i].NodeID == id {
			return i
		}
	}
	return -1
}

func popcount(x uint32) int { return bits.OnesCount32(x) }

// WaitSetOf returns the wait set of the active step of transition ti of rv, as Process
// would compute it from rvrs (for the model checker and for tests). It does not change
// rv. ok is false when there is no such transition, no active step, or its plan is not
// registered.
func (e *Engine) WaitSetOf(rv *v1.ReplicatedVolume, rvrs []*v1.ReplicatedVolumeReplica, ti int) (w WaitSet, ok bool) {
	if rv == nil || ti < 0 || ti >= len(rv.Status.DatameshTransitions) {
		return w, false
	}
	rc := e.newReconcile(&Input{RV: rv, RVRs: rvrs})
	t := &rv.Status.DatameshTransitions[ti]
	p, found := rc.planOf(t)
	si := activeStep(t)
	if !found || si < 0 || si >= len(p.Steps) || t.Steps[si].Status != v1.StepActive {
		return w, false
	}
	return rc.waitSet(t, &p.Steps[si], t.Steps[si].DatameshRevision), true
}
