package datamesh

import (
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh/layout"
)

// Emergency operations (docs/datamesh-spec.md "ForceRemoveReplica", "Transition
// parallelism"):
//
//   - ForceDetach clears a lost member's attachment without waiting for it; it cancels
//     the member's Attach/Detach in flight.
//   - ForceRemoveReplica removes a lost member in one step from whatever state it is in,
//     cancels every transition of that member, and does not wait for voter or quorum
//     transitions of others (they may be stuck waiting for it). Every force removal
//     ready in this pass is published together: one revision, q computed once for the
//     final voter count. The dead member is excluded from the wait set.
//
// Guards: NotAttached (no attachment and no Attach/Detach in flight) and
// MemberUnreachable (no replica whose agent is ready reports a Connected connection to it,
// and every other configured replica's agent is ready: docs/layouts.md §8.5, see
// staleAgent).

func (rc *reconcile) emergency(anyForce bool) {
	if len(rc.in.ForceDetach) == 0 && !anyForce {
		return // no lost node named: nothing below has anything to do
	}
	for _, name := range rc.in.ForceDetach {
		rc.forceDetach(name)
	}
	for i := range rc.st.DatameshReplicaRequests {
		if r := &rc.st.DatameshReplicaRequests[i]; r.Operation == v1.ReplicaOperationForceLeave {
			rc.forceDetach(r.Name)
		}
	}
	ready := rc.forceRemovalsReady()
	if len(ready) == 0 {
		return
	}
	// Cancel first, then append: cancelling moves transitions, appending does not.
	for _, name := range ready {
		for ti := rc.transitionOf(name, false); ti >= 0; ti = rc.transitionOf(name, false) {
			rc.cancel(ti)
		}
	}
	otherDiskless, _ := rc.disklessChangeInFlight()
	if started := rc.startForceRemovals(ready); len(started) > 0 {
		rc.publishForceRemovals(started, otherDiskless != "")
		// Transitions that waited for the dead members may be done now: look again.
		rc.backward()
	}
}

// forceRemovalsReady returns, in name order, the members with a ForceLeave request
// whose guards pass, and writes why on the requests of the others. A request whose
// replica already left the member list has its leftover transitions cancelled.
func (rc *reconcile) forceRemovalsReady() (ready []string) {
	for i := range rc.st.DatameshReplicaRequests {
		r := &rc.st.DatameshReplicaRequests[i]
		if r.Operation != v1.ReplicaOperationForceLeave || rc.forceInFlight(r.Name) {
			continue
		}
		mi := rc.memberIndex(r.Name)
		if mi < 0 {
			// Already out of the datamesh, but a transition (a RemoveReplica whose → ✕
			// waits for the dead replica to confirm) still refers to it. It is not
			// cancelled: its step must still be confirmed by the other members, or a
			// member that has not applied it would still count the removed member — a
			// TieBreaker, say, alive behind a partition — while the diskless set changes
			// again (the deep model check: 2D+1TB, an Access or D∅ join right after the
			// cancelled TB → ✕ gave each side of a cut its own tiebreaker majority). It
			// no longer waits for the dead replica itself (waitSet), which ends it.
			continue
		}
		rc.waiting = true
		if msg := rc.forceRemovalBlocked(mi); msg != "" {
			rc.setRequestMessage(r.Name, msg)
			continue
		}
		ready = append(ready, r.Name)
	}
	return ready
}

// forceRemovalBlocked returns why member mi may not be force-removed now, or "".
func (rc *reconcile) forceRemovalBlocked(mi int) string {
	name := rc.st.Datamesh.Members[mi].Name
	if rc.lastCopy(mi) {
		return lastCopyMessage // first: no other guard's answer would let it go
	}
	if rc.st.Datamesh.Members[mi].Attached || rc.attachmentInFlight(name) {
		return "Cannot force-remove attached member; ForceDetach first"
	}
	if n := rc.connectedFrom(name); n > 0 {
		return "Force-removal blocked: member is reachable (connected from " + strconv.Itoa(n) + " replica(s))"
	}
	if stale := rc.staleAgent(name); stale != "" {
		return "Force-removal blocked: cannot confirm the member is unreachable: the agent of " + stale + " is not reporting"
	}
	return rc.awaitReplacement(mi)
}

// lastCopyMessage is the request's message while lastCopy blocks a force removal.
const lastCopyMessage = "Force-removal blocked: no other member holds an UpToDate copy of the data; " +
	"the member stays until its node returns or another copy is UpToDate (docs/controller.md, \"The last copy\")"

// heldAsLastCopy: name is a member whose force removal lastCopy holds back.
func (rc *reconcile) heldAsLastCopy(name string) bool {
	mi := rc.memberIndex(name)
	return mi >= 0 && !rc.forceInFlight(name) && rc.lastCopy(mi)
}

// lastCopy: member mi may hold the data (a member with a disk, or a liminal one whose
// disk is being attached or detached) and no other member holds an UpToDate copy — a D
// or sD whose agent reports UpToDate and that is not itself force-leaving. Removing it
// would destroy the only data there is: once out of the datamesh, its replica is deleted
// and a node that comes back tears down what it still holds (docs/controller.md, "The
// last copy"). A missed Lease is not proof that a node is gone (a node under load, a
// stalled apiserver, a grace period set too short), and no grace period makes it one, so
// no length of silence removes the last copy: the member waits for its node, or for a
// person to delete the volume. The check covers the members force-leaving in the same
// pass together (two lost Diskfuls of 2D: neither counts as the other's copy).
func (rc *reconcile) lastCopy(mi int) bool {
	if !rc.mstate(mi).IsFullMesh() {
		return false // A and TB hold no data
	}
	for k := range rc.st.Datamesh.Members {
		st := rc.mstate(k)
		if k == mi || st != StateD && st != StateSD || rc.forceLeaving(rc.st.Datamesh.Members[k].Name) {
			continue
		}
		if upToDate(rc.rvrOfMember(k)) {
			return false
		}
	}
	return true
}

// startForceRemovals appends a ForceRemoveReplica for each member named and takes the
// member out of the datamesh; it returns the new transitions' indexes. Their one step
// is published together by publishForceRemovals.
func (rc *reconcile) startForceRemovals(names []string) (started []int) {
	for _, name := range names {
		mi := rc.memberIndex(name)
		from := StateOfMember(rc.st.Datamesh.Members[mi].Type)
		c := rc.counts()
		id, err := DerivedPlanID(from, StateGone, PathParams{Force: true, VotersOdd: c.voters%2 == 1, Shadow: rc.features.ShadowDiskful || from.IsShadow()})
		if err != nil {
			rc.setRequestMessage(name, "Cannot force-remove: "+err.Error())
			continue
		}
		p, ok := rc.reg.Latest(id)
		if !ok {
			rc.setRequestMessage(name, "Cannot force-remove: plan "+id+" is not registered")
			continue
		}
		ti := rc.appendTransition(p, name)
		rc.recordNodeID(ti)
		st := rc.st
		st.Datamesh.Members = append(st.Datamesh.Members[:mi], st.Datamesh.Members[mi+1:]...)
		started = append(started, ti)
	}
	return started
}

// publishForceRemovals publishes the started force removals as one change: one
// revision, q computed once for the voters that are left.
//
// The tiebreaker hold (model checker, "returns behind a partition"): a force removal
// that leaves an even number of DRBD voters (members with a disk; D∅ is rendered `disk
// none`) next to a diskless member — or while another member's change of the diskless
// set is unconfirmed (otherDiskless) — publishes q one higher until it is confirmed.
// Until then a replica that has not applied the removal still connects to the removed
// member, which, if alive behind a partition, is quorate with it in the old
// configuration (2 of 3 in 3D), while a survivor that applied it is one vote short of
// the new, even voter set and keeps quorum through DRBD's tiebreaker with the diskless
// member: two writers (3D with an Access replica; a TieBreaker removed next to an
// Access join, R3; F6). With q one higher, a side one vote short is two short: only
// all the new voters together (the tiebreaker covers the one vote) stay quorate. A
// ChangeQuorum brings q back once everything is confirmed (settleLayout).
func (rc *reconcile) publishForceRemovals(started []int, otherDiskless bool) {
	qBefore := rc.st.Datamesh.Quorum
	rc.afterMembershipChange()
	// A force removal never lowers q. Its step is not confirmed by the removed member,
	// and until every other replica has confirmed it, some of them (the TieBreaker, say)
	// still connect to that member. If it is in fact alive behind a partition, it keeps
	// the old quorum with them (through the tiebreaker in 2D+1TB) while the survivors
	// that applied a lower q are quorate too: two writers. The model checker found it
	// with a lost node returning behind a partition while the configuration was lowered
	// (2D+1TB → 1D: q would drop to 1 at once). A lower q follows as a ChangeQuorum once
	// the removal is confirmed (settleLayout). The same keeps a voter transition's hold
	// in force (finding F6).
	rc.st.Datamesh.Quorum = max(rc.st.Datamesh.Quorum, qBefore)
	if disks, diskless := rc.drbdVoters(); disks > 0 && disks%2 == 0 && (diskless > 0 || otherDiskless) {
		rc.st.Datamesh.Quorum = min(max(rc.st.Datamesh.Quorum, int32(disks/2+2)), 32)
	}
	rc.pin()
	rev := rc.bump()
	for _, ti := range started {
		ts := &rc.st.DatameshTransitions[ti].Steps[0]
		ts.Status, ts.DatameshRevision, ts.StartedAt = v1.StepActive, rev, rc.now()
		rc.event(EventWarning, "ForceRemoveStarted", "Force-removing replica "+rc.st.DatameshTransitions[ti].ReplicaName+" from the datamesh at revision "+strconv.FormatInt(rev, 10))
	}
}

// drbdVoters counts the members DRBD counts as voters (a disk attached: D) and the
// diskless ones (A, TB, D∅, sD∅), whose majority DRBD's tiebreaker asks for.
func (rc *reconcile) drbdVoters() (disks, diskless int) {
	for mi := range rc.st.Datamesh.Members {
		switch st := rc.mstate(mi); {
		case st == StateD:
			disks++
		case isDiskless(st):
			diskless++
		}
	}
	return disks, diskless
}

// awaitReplacement decides the order of replacing a lost voter (docs/datamesh.md
// "Replacing a lost node"): it
// returns why the force removal of member mi waits, or "".
//
// In an even voter set with a TieBreaker (2D+1TB losing a D) the survivors keep quorum
// through DRBD's tiebreaker while the lost voter is still configured: one of two voters
// plus the TB. Removing it leaves one voter under q=2 until every survivor has
// confirmed the removal and its q↓ follows (quorumAfterForceRemoval), and DRBD refuses
// a change that takes an attached survivor's quorum. This order is for a survivor
// that serves IO; with none attached the removal does not wait (servingIO).
// So when the removal would take the survivors' quorum away and the layout wants a
// replacement Diskful that is not yet ready to join, the removal waits for it: the
// volume keeps serving IO meanwhile, however long placement takes (no free node, a
// backing volume being created). Once a replacement is ready, the lost member is
// removed and the replacement's AddReplica starts in the same reconcile; IO pauses only
// for the few confirmation rounds until the new D's disk is attached.
//
// The other order — the replacement joins and syncs first, the lost member excluded
// from the wait sets, then the removal — is not used: while the lost member is still
// configured on the TieBreaker and the survivors, a voter step it never confirmed lets
// it, if it is in fact alive behind a partition with the TB, keep the old quorum
// through the tiebreaker while the survivors and the newcomer form a majority of the
// new voter set: two writers (the model checker's "return behind a partition" finds
// it). Holding q raised instead (TBHold) stops IO for the whole sync, which is worse
// than the order above.
func (rc *reconcile) awaitReplacement(mi int) string {
	m := &rc.st.Datamesh.Members[mi]
	if !rc.mstate(mi).IsVoter() {
		return ""
	}
	c := rc.counts()
	reporting := 0 // voters other than m whose agent reports and that are not being force-removed
	for k := range rc.st.Datamesh.Members {
		if k == mi || !rc.mstate(k).IsVoter() || rc.forceLeaving(rc.st.Datamesh.Members[k].Name) {
			continue
		}
		if r := rc.rvrOfMember(k); r != nil && !agentNotReady(r) {
			reporting++
		}
	}
	if !rc.servingIO(m.Name) {
		// No survivor is attached or attaching: the removal stops no IO, and waiting
		// for a replacement that may never come (2D+1TB on three nodes) would keep the
		// volume from attaching anywhere. The survivors are one voter under q for the
		// few rounds until every one of them has confirmed the removal; then the
		// removal's q↓ follows (quorumAfterForceRemoval) and a new attachment promotes.
		return ""
	}
	qNow := int(rc.st.Datamesh.Quorum)
	quorateNow := reporting >= qNow || (c.voters%2 == 0 && c.tb > 0 && reporting == qNow-1)
	after := c.voters - 1
	qAfter := layout.Quorum(after, rc.effective().AfterMembershipChange(rc.cfg, after, c.tb))
	quorateAfter := reporting >= qAfter || (after%2 == 0 && c.tb > 0 && reporting == qAfter-1)
	if !quorateNow || quorateAfter {
		return ""
	}
	// A replacement is a Diskful replica object that is not a member and can join now.
	// When the D members that stay already make the configured layout (it was lowered),
	// no replacement is coming: nothing to wait for.
	stay := 0
	for j, r := range rc.in.RVRs {
		if r.DeletionTimestamp != nil || rc.forceLeaving(r.Name) || r.Spec.Type != v1.ReplicaTypeDiskful {
			continue
		}
		if rc.memberOfRVR(j) >= 0 {
			stay++
		} else if rc.joinReady(r, nil) == "" {
			return ""
		}
	}
	if stay >= rc.cfg.DiskfulCount() {
		return ""
	}
	if other := rc.waitsOnMember(mi); other != "" {
		// Another transition cannot finish without the lost member's confirmation, and
		// waiting for a replacement that may never come (no free node) would keep both
		// waiting for ever. The removal goes now, which ends that wait; IO pauses until
		// the survivors have confirmed it and its q↓ follows (quorumAfterForceRemoval),
		// as when no survivor is attached. Said in the event, since the request's
		// message becomes the removal's progress.
		rc.event(EventWarning, "ForceRemoveNotWaiting", "Force-removing "+m.Name+" without waiting for a replacement Diskful: the "+
			other+" waits for "+m.Name+" to confirm, which its lost node never will; IO pauses until the survivors have confirmed the removal")
		return ""
	}
	return "Force-removal waits for a replacement Diskful replica ready to join: removing " + m.Name +
		" now would leave " + strconv.Itoa(reporting) + " of " + strconv.Itoa(after) + " voters under q=" + strconv.Itoa(qAfter) +
		" and stop IO, while the tiebreaker keeps the volume quorate until then"
}

// waitsOnMember names a transition of another replica (type and replica, e.g.
// "AddReplica of r4") that cannot finish before member mi is gone, or "": its active
// step waits for mi to confirm, or it is a membership transition, which publishes no
// further step while a voter is lost (pausedByLostVoter).
func (rc *reconcile) waitsOnMember(mi int) string {
	bit := uint32(1) << uint(rc.st.Datamesh.Members[mi].NodeID&31)
	name := rc.st.Datamesh.Members[mi].Name
	ts := rc.st.DatameshTransitions
	for i := range ts {
		t := &ts[i]
		if t.ReplicaName == name {
			continue // the removal cancels the member's own transitions
		}
		p, ok := rc.planOf(t)
		si := activeStep(t)
		if !ok || si < 0 || len(p.Steps) != len(t.Steps) {
			continue
		}
		waits := isMembership(t.Type) && t.Type != v1.TransitionForceRemoveReplica
		if !waits && t.Steps[si].Status == v1.StepActive {
			w := rc.waitSet(t, &p.Steps[si], t.Steps[si].DatameshRevision)
			waits = w.Must&^w.Confirmed&bit != 0
		}
		if waits {
			if t.ReplicaName == "" {
				return string(t.Type)
			}
			return string(t.Type) + " of " + t.ReplicaName
		}
	}
	return ""
}

// servingIO: a member other than the lost one is attached, or an Attach or Detach of
// one is in flight.
func (rc *reconcile) servingIO(lost string) bool {
	for _, m := range rc.st.Datamesh.Members {
		if m.Name != lost && (m.Attached || rc.attachmentInFlight(m.Name)) {
			return true
		}
	}
	return false
}

// voterForceLeaving names a lost voter that is not gone yet, or "": a voter member with
// a ForceLeave request, or one whose ForceRemoveReplica is not confirmed by every
// other replica. A new voter joins only after that (awaitReplacement): until the
// removal is confirmed, a replica that has not applied it still connects to the lost
// member, and a voter step published meanwhile gives a half-applied datamesh in which
// the lost member, if alive behind a partition, keeps the old quorum with that replica
// while the survivors and the newcomer form a quorum of the new one (the model
// checker's "returns behind a partition", 3D and 2D+1TB).
func (rc *reconcile) voterForceLeaving() string {
	ts := rc.st.DatameshTransitions
	for i := range ts {
		if t := &ts[i]; t.Type == v1.TransitionForceRemoveReplica && StateOfMember(t.FromType).IsVoter() {
			return t.ReplicaName
		}
	}
	for mi := range rc.st.Datamesh.Members {
		if name := rc.st.Datamesh.Members[mi].Name; rc.mstate(mi).IsVoter() && rc.forceLeaving(name) {
			return name
		}
	}
	return ""
}

// forceRemovalUnconfirmed: a ForceRemoveReplica is published and not yet confirmed by
// every other replica. While it is, no step lowers q (see emergency).
func (rc *reconcile) forceRemovalUnconfirmed() bool {
	ts := rc.st.DatameshTransitions
	for i := range ts {
		if ts[i].Type == v1.TransitionForceRemoveReplica {
			return true
		}
	}
	return false
}

// appendTransition adds a transition for plan p without publishing it.
func (rc *reconcile) appendTransition(p *Plan, replica string) int {
	steps := make([]v1.DatameshTransitionStep, len(p.Steps))
	for i := range p.Steps {
		steps[i] = v1.DatameshTransitionStep{Name: p.Steps[i].Name, Status: v1.StepPending}
	}
	st := rc.st
	st.DatameshTransitions = append(st.DatameshTransitions, v1.DatameshTransition{
		Type: p.Type, Group: p.Group, ReplicaName: replica,
		FromType: p.From.MemberType(), ToType: p.To.MemberType(),
		PlanID: p.ID, PlanVersion: p.Version, Steps: steps,
	})
	return len(st.DatameshTransitions) - 1
}

func (rc *reconcile) attachmentInFlight(name string) bool {
	return rc.attachTransition(name) >= 0
}

// connectedFrom counts replicas with a ready agent that report a Connected DRBD
// connection to name. A replica whose agent is not ready (AgentReady=False) is not
// counted here (its peers list may be stale): staleAgent blocks on it instead.
func (rc *reconcile) connectedFrom(name string) int {
	n := 0
	for _, r := range rc.in.RVRs {
		if r.Name == name || agentNotReady(r) {
			continue
		}
		for k := range r.Status.Peers {
			if p := &r.Status.Peers[k]; p.Name == name && p.ConnectionState == "Connected" {
				n++
				break
			}
		}
	}
	return n
}

// staleAgent returns the first replica (in name order) that could still hold a DRBD
// connection to the member called name without saying so: one whose agent is not
// reporting (AgentReady=False: its peers list is stale), or a member
// whose replica object is gone (no status at all). docs/layouts.md §8.5: such a replica may be the
// one still connected to name and running the old configuration with it; together they
// can hold the old quorum while the rest, with name removed, keeps quorum through a
// TieBreaker (layout finding 2, docs/layouts.md §8.5). So MemberUnreachable blocks on
// it instead of skipping it.
//
// Not counted: replicas that are not configured in the datamesh (neither a member nor in
// a membership transition: they never joined, or confirmed leaving), and replicas with a
// ForceLeave request — their node is declared lost like name's, and when both go in
// the same pass (two failed nodes) they are removed together; waiting for one of them
// to report would block both for ever.
func (rc *reconcile) staleAgent(name string) string {
	for _, j := range rc.rvrOrd {
		r := rc.in.RVRs[j]
		if r.Name == name || !agentNotReady(r) {
			continue
		}
		if rc.memberOfRVR(j) < 0 && rc.transitionOf(r.Name, true) < 0 {
			continue
		}
		if rc.forceLeaving(r.Name) {
			continue
		}
		return r.Name
	}
	for mi := range rc.st.Datamesh.Members {
		m := &rc.st.Datamesh.Members[mi]
		if rc.rvrOfMember(mi) != nil || m.Name == name || rc.forceLeaving(m.Name) {
			continue
		}
		return m.Name
	}
	return ""
}

// upToDate: the replica reports an UpToDate disk and its agent is reporting. A replica
// whose agent is not ready keeps its last report (often UpToDate) for ever once its node
// is gone, so it never counts as a copy for guards, qmr or the choice of which D to give
// up (model checker finding F1).
func upToDate(r *v1.ReplicatedVolumeReplica) bool {
	return r != nil && r.Status.DiskState == v1.DiskStateUpToDate && !agentNotReady(r)
}

// agentNotReady: the controller's AgentReady condition on the replica says its agent is
// not reporting (its node's Lease expired beyond the grace period, or there is none), so
// everything else in its status is the last thing the agent said, not what holds now.
// The controller owns AgentReady (docs/contract.md); the agent owns the rest of the
// status and cannot report its own silence. A replica without the condition is taken as
// reporting: the controller writes it for every replica it sees, and a missing one means
// it has not looked yet, not that the agent is silent. Unknown counts as not ready: the
// guards that read this (docs/modelcheck-findings.md F1, docs/layouts.md §8.5) must
// not trust a report nobody vouches for.
func agentNotReady(r *v1.ReplicatedVolumeReplica) bool {
	c := agentReadyCondition(r)
	return c != nil && c.Status != metav1.ConditionTrue
}

func agentReadyCondition(r *v1.ReplicatedVolumeReplica) *metav1.Condition {
	for k := range r.Status.Conditions {
		if c := &r.Status.Conditions[k]; c.Type == v1.ConditionAgentReady {
			return c
		}
	}
	return nil
}

// forceDetach clears name's attachment without waiting for it.
func (rc *reconcile) forceDetach(name string) {
	mi := rc.memberIndex(name)
	if mi < 0 {
		return
	}
	for i := range rc.st.DatameshTransitions {
		if t := &rc.st.DatameshTransitions[i]; t.Type == v1.TransitionForceDetach && t.ReplicaName == name {
			return
		}
	}
	attached := rc.st.Datamesh.Members[mi].Attached
	inFlight := false
	for ti := 0; ti < len(rc.st.DatameshTransitions); {
		t := &rc.st.DatameshTransitions[ti]
		if (t.Type == v1.TransitionAttach || t.Type == v1.TransitionDetach) && t.ReplicaName == name {
			inFlight = true
			rc.cancel(ti)
			continue
		}
		ti++
	}
	if !attached && !inFlight {
		return
	}
	p, ok := rc.reg.Latest(PlanForceDetach)
	if !ok {
		return
	}
	ti := rc.start(p, name)
	rc.confirm(ti, p, 0)
	rc.event(EventWarning, "ForceDetached", "Member "+name+" was force-detached")
}
