package datamesh

import (
	"slices"
	"strconv"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh/layout"
)

// Configuration → replicas. Replicas are RVR objects that placement creates and deletes;
// the engine only says what the configured layout wants (Result.Wanted) and turns what
// placement did into replica requests. The order is add-before-remove: a removal is
// wanted only when every add the layout needs has become a member of its final type
// (and every D is UpToDate), so redundancy never dips:
//
//	FTT 1→2 (3D → 4D+1TB): create D, create TB.
//	2D+1TB → 3D:            create D; once it is an UpToDate member, delete the TB.
//	3D → 2D+1TB:            create TB; once it is a member, delete one D.
//
// An attached member is never deleted: it is retyped (D → sD with shadow support, else
// D → A), the attached-member strategy. When the members already match the layout but
// q/qmr lag the configuration (a GMDR change with the same D count, or a qmr↑ that had
// to wait for a copy to become UpToDate), the engine starts a ChangeQuorum itself.

func (rc *reconcile) settleLayout(anyForce bool, wanted []WantedReplica) []WantedReplica {
	if rc.in.RV.DeletionTimestamp != nil {
		return wanted
	}
	failed := rc.failedDisksReplaced()
	d, tb := rc.layoutReplicas()
	wanted = rc.wantAdds(d, tb, failed, wanted)
	wanted = rc.removeFailedDisks(d, failed, wanted)
	settled := !slices.ContainsFunc(wanted, func(w WantedReplica) bool { return w.Action == WantCreate }) && rc.addsLanded()
	if settled && len(failed) == 0 {
		wanted = rc.wantRemovals(d, tb, wanted)
	}
	if anyForce {
		// A force-removed replica's object stays until placement deletes it.
		for j, r := range rc.in.RVRs {
			if r.DeletionTimestamp == nil && rc.memberOfRVR(j) < 0 && rc.forceLeaving(r.Name) && !rc.forceInFlight(r.Name) {
				wanted = append(wanted, WantedReplica{Action: WantDelete, Type: r.Spec.Type, Replica: r.Name,
					Reason: r.Name + " was force-removed from the datamesh (its node is lost)"})
			}
		}
	}
	if len(rc.st.DatameshTransitions) > 0 || rc.in.ChangeQuorum != nil {
		return wanted
	}
	c := rc.counts()
	if rc.quorumAfterForceRemoval(c) {
		return wanted
	}
	switch {
	case rc.cfg.GMDR < rc.effective().GMDR || int(rc.st.Datamesh.QuorumMinimumRedundancy) > rc.cfg.GMDR+1:
		// Lowering qmr is safe at any time; it rides on a RemoveReplica(D) (qmr↓ first)
		// when the layout has a D too many (after its adds), else it goes alone (a GMDR
		// change with the same D count, or a retype out of D that QMRReady holds back).
		if d <= rc.cfg.DiskfulCount() && !rc.diskfulLeaving(wanted) {
			rc.settleQuorum(c)
		}
	case settled && !removalWanted(wanted):
		rc.settleQuorum(c)
	}
	return wanted
}

// layoutReplicas counts the Diskful and TieBreaker replica objects that stay (not
// being deleted, not force-leaving, not a member whose failed disk is replaced). A
// force-leaving member that holds the last copy stays (lastCopy): no replacement is
// asked for it, since a new Diskful would have nothing to sync from, and once the node
// is back it would be a peer the returning disk must first reach before DRBD calls it
// UpToDate again. A member whose disk failed stays for the same reason while no other
// member is UpToDate (replacesFailedDisk).
func (rc *reconcile) layoutReplicas() (d, tb int) {
	for _, r := range rc.in.RVRs {
		if r.DeletionTimestamp != nil || rc.forceLeaving(r.Name) && !rc.heldAsLastCopy(r.Name) {
			continue
		}
		if mi := rc.memberIndex(r.Name); mi >= 0 && rc.replacesFailedDisk(mi) {
			continue
		}
		switch r.Spec.Type {
		case v1.ReplicaTypeDiskful:
			d++
		case v1.ReplicaTypeTieBreaker:
			tb++
		}
	}
	return d, tb
}

// wantAdds asks for the Diskful and TieBreaker replicas the configuration lacks; the
// first Diskful ones replace the members whose failed disks are not counted (failed).
func (rc *reconcile) wantAdds(d, tb int, failed []string, wanted []WantedReplica) []WantedReplica {
	needD := rc.cfg.DiskfulCount()
	needTB := layout.TieBreakerMin(needD, rc.cfg.FTT)
	reason := ""
	if d < needD || tb < needTB {
		reason = "configuration " + rc.cfg.String() + " (FTT=" + strconv.Itoa(rc.cfg.FTT) + ", GMDR=" + strconv.Itoa(rc.cfg.GMDR) + ")"
	}
	note := failedDiskNote(failed)
	for i := d; i < needD; i++ {
		w := WantedReplica{Action: WantCreate, Type: v1.ReplicaTypeDiskful,
			Reason: reason + " needs " + strconv.Itoa(needD) + " Diskful, have " + strconv.Itoa(d) + note}
		if k := i - d; k < len(failed) {
			w.Replaces = failed[k]
		}
		wanted = append(wanted, w)
	}
	for i := tb; i < needTB; i++ {
		wanted = append(wanted, WantedReplica{Action: WantCreate, Type: v1.ReplicaTypeTieBreaker,
			Reason: reason + " needs " + strconv.Itoa(needTB) + " TieBreaker, have " + strconv.Itoa(tb)})
	}
	return wanted
}

// wantRemovals asks, once the adds have landed, for the one Diskful (retyped when it is
// attached) and the one TieBreaker too many, if any.
func (rc *reconcile) wantRemovals(d, tb int, wanted []WantedReplica) []WantedReplica {
	needD := rc.cfg.DiskfulCount()
	needTB := layout.TieBreakerMin(needD, rc.cfg.FTT)
	if d > needD && rc.counts().upToDateD >= needD {
		if mi := rc.pickDiskfulVictim(); mi >= 0 {
			m := &rc.st.Datamesh.Members[mi]
			why := "configuration " + rc.cfg.String() + " needs " + strconv.Itoa(needD) + " Diskful, have " + strconv.Itoa(d)
			if m.Attached {
				to := v1.ReplicaTypeAccess
				if rc.features.ShadowDiskful {
					to = v1.ReplicaTypeShadowDiskful
				}
				wanted = append(wanted, WantedReplica{Action: WantRetype, Type: to, Replica: m.Name, Reason: why + "; " + m.Name + " is attached, so it is converted, not removed"})
			} else {
				wanted = append(wanted, WantedReplica{Action: WantDelete, Type: v1.ReplicaTypeDiskful, Replica: m.Name, Reason: why})
			}
		}
	}
	if tb > needTB {
		if mi := rc.pickTBVictim(); mi >= 0 {
			wanted = append(wanted, WantedReplica{Action: WantDelete, Type: v1.ReplicaTypeTieBreaker, Replica: rc.st.Datamesh.Members[mi].Name,
				Reason: "configuration " + rc.cfg.String() + " needs " + strconv.Itoa(needTB) + " TieBreaker, have " + strconv.Itoa(tb)})
		}
	}
	return wanted
}

// quorumAfterForceRemoval publishes, as soon as nothing is in flight, the q the members
// that are left give, after a force removal:
//
//   - a q the removal held one higher (the tiebreaker hold, see emergency) comes back;
//   - the removal's own q↓ (docs/datamesh-spec.md: ForceRemoveReplica(D) + q↓ for even → odd
//     voters, whose q↓ lowers the effective FTT to what the voters provide) is
//     published now, not with the removal: the model checker found that
//     a q lowered at once lets the removed node, alive behind a partition, keep the
//     old quorum with a replica that has not applied the removal (R1).
//
// Nothing in flight means every survivor has applied the removal: none connects to
// the removed node any more, so whatever q it still runs, it is alone and cannot be
// quorate. It does not wait for the layout to settle: a replacement Diskful may sync
// for hours, or never come (2D+1TB on three nodes), and until then the survivor of
// 2D+1TB is one voter under q=2, and the survivors under a held q are quorate only
// through DRBD's tiebreaker, which never gives quorum back once lost.
//
// Only a datamesh that lost voters is degraded this way: every other step moves the
// effective FTT with the voters it adds or removes (AfterMembershipChange). The one
// other way the members come to provide less than the effective FTT is a removal that a
// lowered configuration allowed and that finishes after the configuration was raised
// again (AfterMembershipChange does not move past the configuration): its copy went
// with its disk, so the effective FTT falls here to what is left, and the layout asks
// for the replacement (docs/datamesh.md, "q, qmr and the effective layout").
func (rc *reconcile) quorumAfterForceRemoval(c counts) bool {
	if oq, _ := rc.override(); oq > 0 {
		return false
	}
	switch want, eff := rc.quorumVotersGive(c); {
	case want < int(rc.st.Datamesh.Quorum):
		rc.startQuorum(want, int(rc.st.Datamesh.QuorumMinimumRedundancy), &eff)
		return true
	case eff != rc.effective():
		rc.setEffective(eff) // q stays: no revision to publish
	}
	return false
}

// quorumVotersGive is the q the members give (layout.Quorum of the voters, under the
// effective FTT lowered to what the voters provide) and that layout.
func (rc *reconcile) quorumVotersGive(c counts) (int, layout.Layout) {
	eff := rc.effective()
	if provided := eff.FTTForVoters(c.voters, c.tb); provided < eff.FTT {
		eff.FTT = provided
	}
	return layout.Quorum(c.voters, eff), eff
}

// quorumDropDue: quorumAfterForceRemoval lowers q as soon as the transitions in flight
// are Attaches and Detaches at most (they are the only ones an Attach may overlap).
// Attaches wait for it (attachmentBlocked): the survivor of a lost voter may have no
// quorum until q comes down, an Attach it cannot confirm would keep the q↓ from ever
// starting, and one it can confirm may wait a few rounds.
func (rc *reconcile) quorumDropDue() bool {
	if rc.in.ChangeQuorum != nil || rc.in.RV.DeletionTimestamp != nil {
		return false
	}
	if oq, _ := rc.override(); oq > 0 {
		return false
	}
	for i := range rc.st.DatameshTransitions {
		if rc.st.DatameshTransitions[i].Group != v1.GroupAttachment {
			return false
		}
	}
	want, _ := rc.quorumVotersGive(rc.counts())
	return want < int(rc.st.Datamesh.Quorum)
}

// addsLanded: every replica that is not leaving is a member of the type it asks for and
// no membership transition runs: the adds the layout needed are done.
func (rc *reconcile) addsLanded() bool {
	ts := rc.st.DatameshTransitions
	for i := range ts {
		if isMembership(ts[i].Type) || ts[i].Type == v1.TransitionChangeQuorum {
			return false
		}
	}
	for j, r := range rc.in.RVRs {
		if r.DeletionTimestamp != nil || rc.forceLeaving(r.Name) {
			continue
		}
		want, ok := rc.rstate(j)
		mi := rc.memberOfRVR(j)
		if !ok || mi < 0 || rc.mstate(mi) != want {
			return false
		}
	}
	return true
}

// diskfulLeaving: a D is about to be removed (wanted, or its RVR is being deleted), so
// the qmr↓ will be the first step of its RemoveReplica.
func (rc *reconcile) diskfulLeaving(wanted []WantedReplica) bool {
	for _, w := range wanted {
		if w.Action == WantDelete && w.Type == v1.ReplicaTypeDiskful {
			return true
		}
	}
	for mi := range rc.st.Datamesh.Members {
		if rc.mstate(mi) != StateD {
			continue
		}
		if r := rc.rvrOfMember(mi); r != nil && r.DeletionTimestamp != nil {
			return true
		}
	}
	return false
}

func (rc *reconcile) forceLeaving(name string) bool {
	i := rc.findRequest(name)
	return i >= 0 && rc.st.DatameshReplicaRequests[i].Operation == v1.ReplicaOperationForceLeave
}

// pickDiskfulVictim chooses the D to give up: not attached before attached, not UpToDate
// before UpToDate, then the highest node-id (a stable, explainable choice).
func (rc *reconcile) pickDiskfulVictim() int {
	best, bestScore := -1, -1
	for mi := range rc.st.Datamesh.Members {
		m := &rc.st.Datamesh.Members[mi]
		r := rc.rvrOfMember(mi)
		if rc.mstate(mi) != StateD || r == nil || r.DeletionTimestamp != nil || r.Spec.Type != v1.ReplicaTypeDiskful {
			continue
		}
		score := int(m.NodeID)
		if !m.Attached {
			score += 2 << 6
		}
		if !upToDate(r) {
			score += 1 << 6
		}
		if score > bestScore {
			best, bestScore = mi, score
		}
	}
	return best
}

func (rc *reconcile) pickTBVictim() int {
	best := -1
	for mi := range rc.st.Datamesh.Members {
		m := &rc.st.Datamesh.Members[mi]
		r := rc.rvrOfMember(mi)
		if rc.mstate(mi) != StateTB || r == nil || r.DeletionTimestamp != nil {
			continue
		}
		if best < 0 || m.NodeID > rc.st.Datamesh.Members[best].NodeID {
			best = mi
		}
	}
	return best
}

// settleQuorum moves q/qmr and the effective layout to what the configuration and the
// members allow, through a ChangeQuorum when q or qmr must change.
func (rc *reconcile) settleQuorum(c counts) {
	q, qmr, next, eff := rc.quorumTarget(c)
	if q != int(rc.st.Datamesh.Quorum) || qmr != int(rc.st.Datamesh.QuorumMinimumRedundancy) {
		rc.startQuorum(q, qmr, &next)
		return
	}
	if next != eff {
		rc.setEffective(next)
	}
}

// quorumTarget is what settleQuorum moves to: q, qmr and the effective layout the
// configuration and the members allow, and the effective layout now.
func (rc *reconcile) quorumTarget(c counts) (q, qmr int, next, eff layout.Layout) {
	eff = rc.effective()
	qmr = int(rc.st.Datamesh.QuorumMinimumRedundancy)
	oq, oqmr := rc.override()
	switch {
	case oqmr > 0:
		// A pinned qmr is the target while the override stands, and the effective GMDR
		// says what it really guarantees (qmr-1), as after any ChangeQuorum.
		qmr = oqmr
		next = eff.AfterQMRChange(rc.cfg, qmr, c.voters, c.tb)
	case rc.cfg.GMDR != eff.GMDR || qmr != layout.QMR(eff):
		qmr = eff.NextQMR(rc.cfg, c.upToDateD)
		next = eff.AfterQMRChange(rc.cfg, qmr, c.voters, c.tb)
	default:
		next = eff.AfterMembershipChange(rc.cfg, c.voters, c.tb)
	}
	q = layout.Quorum(c.voters, next)
	if oq > 0 {
		q = oq
	}
	return q, qmr, next, eff
}

// override is spec.quorumOverride's q and qmr (0: not pinned).
func (rc *reconcile) override() (q, qmr int) {
	o := rc.in.RV.Spec.QuorumOverride
	if o == nil {
		return 0, 0
	}
	if o.Quorum != nil && *o.Quorum >= 1 && *o.Quorum <= 32 {
		q = int(*o.Quorum)
	}
	if o.QuorumMinimumRedundancy != nil && *o.QuorumMinimumRedundancy >= 1 && *o.QuorumMinimumRedundancy <= 32 {
		qmr = int(*o.QuorumMinimumRedundancy)
	}
	return q, qmr
}

// pin applies spec.quorumOverride after a step computed q/qmr by the layout: the
// override sticks through every membership step until a person removes it. It is
// applied only once the override's own ChangeQuorum has published it (overrideLive), so
// that a person's change always reaches every replica through a ChangeQuorum first.
func (rc *reconcile) pin() {
	oq, oqmr := rc.override()
	if (oq == 0 && oqmr == 0) || !rc.overrideLive {
		return
	}
	if oq > 0 {
		rc.st.Datamesh.Quorum = int32(oq)
	}
	if oqmr > 0 {
		rc.st.Datamesh.QuorumMinimumRedundancy = int32(oqmr)
	}
}

// changeQuorum starts an explicit ChangeQuorum: Input.ChangeQuorum, or
// spec.quorumOverride when it is not yet what the datamesh runs. It is exclusive: it
// waits until nothing but emergency transitions runs, and while it waits no new
// membership transition starts (so it cannot starve).
func (rc *reconcile) changeQuorum() (waits bool) {
	cq := rc.in.ChangeQuorum
	if oq, oqmr := rc.override(); cq == nil && (oq > 0 || oqmr > 0) {
		cq = &QuorumChange{Quorum: int32(oq), QuorumMinimumRedundancy: int32(oqmr)}
	}
	if cq == nil || rc.groupInFlight(v1.GroupQuorum) {
		return false
	}
	q, qmr := int(rc.st.Datamesh.Quorum), int(rc.st.Datamesh.QuorumMinimumRedundancy)
	if cq.Quorum > 0 {
		q = int(cq.Quorum)
	}
	if cq.QuorumMinimumRedundancy > 0 {
		qmr = int(cq.QuorumMinimumRedundancy)
	}
	if q == int(rc.st.Datamesh.Quorum) && qmr == int(rc.st.Datamesh.QuorumMinimumRedundancy) {
		return false
	}
	ts := rc.st.DatameshTransitions
	for i := range ts {
		if ts[i].Group != v1.GroupEmergency {
			rc.waiting = true
			return true
		}
	}
	if o := rc.in.RV.Spec.QuorumOverride; o != nil && rc.in.ChangeQuorum == nil {
		rc.event(EventWarning, "QuorumOverride", "spec.quorumOverride pins q="+strconv.Itoa(q)+", qmr="+strconv.Itoa(qmr)+" until it is removed: "+o.Reason)
	}
	rc.startQuorum(q, qmr, nil)
	return false
}

// startQuorum publishes q/qmr (and the effective layout: next, or GMDR = qmr-1 when nil)
// as a ChangeQuorum: D + D∅ confirm a q-only change, everyone a qmr change.
func (rc *reconcile) startQuorum(q, qmr int, next *layout.Layout) {
	id := PlanChangeQuorumQ
	if qmr != int(rc.st.Datamesh.QuorumMinimumRedundancy) {
		id = PlanChangeQuorumQMR
	}
	p, ok := rc.reg.Latest(id)
	if !ok {
		return
	}
	if next != nil {
		rc.setEffective(*next)
	} else if qmr != int(rc.st.Datamesh.QuorumMinimumRedundancy) {
		c := rc.counts()
		rc.setEffective(rc.effective().AfterQMRChange(rc.cfg, qmr, c.voters, c.tb))
	}
	rc.st.Datamesh.Quorum = int32(q)
	rc.st.Datamesh.QuorumMinimumRedundancy = int32(qmr)
	ti := rc.start(p, "")
	rc.confirm(ti, p, 0)
	rc.event(EventNormal, "ChangeQuorumStarted", "ChangeQuorum: q="+strconv.Itoa(q)+", qmr="+strconv.Itoa(qmr))
}

func removalWanted(wanted []WantedReplica) bool {
	for _, w := range wanted {
		if w.Action != WantCreate && (w.Type == v1.ReplicaTypeDiskful || w.Type == v1.ReplicaTypeTieBreaker) {
			return true
		}
	}
	return false
}
