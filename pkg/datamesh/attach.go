package datamesh

import (
	"slices"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Attachment (docs/datamesh-spec.md Attach/Detach/Enable/DisableMultiattach;
// docs/datamesh.md "Parallelism"). An RVA asks for the volume on a node; up to spec.maxAttachments of them are
// served, attached ones first, then oldest first. Attach and Detach overlap each other
// and membership transitions of other members; Enable/DisableMultiattach excludes them;
// formation and ChangeQuorum block them.
//
// Guard (docs/drbd-quorum.md): upstream DRBD does not check quorum-minimum-redundancy on the
// quorate-peer or tiebreaker paths, so a diskless Primary could write with fewer UpToDate
// copies than GMDR promises. The engine therefore does not attach a diskless member (A,
// TB) while UpToDate D ≤ target GMDR.
//
// A TieBreaker is attached where it is, as a diskless Primary, not converted to Access
// first. DRBD runs A and TB alike (both `disk none` star peers, both counted among the
// diskless nodes its tiebreaker asks a majority of), so an attached TB is exactly an
// attached A to the kernel and to the safety argument; the layout keeps counting it as
// the TB it still is. Converting it would take the layout's TB away while it is needed
// (TBRequired in 2D+1TB), which on a three-node cluster has nowhere else to go: the pod
// that lands on the TB's node — after a crash of a diskful node, say — would never start.

const (
	msgAttached = "Attached"
	msgWaitMax1 = "Waiting: maxAttachments=1 and another attachment is older or attached"
	msgWaitMax2 = "Waiting: maxAttachments=2 and two other attachments are older or attached"

	msgWaitMultiattach = "Waiting for the multiattach change to complete"
)

func (rc *reconcile) maxAttachments() int {
	if n := rc.in.RV.Spec.MaxAttachments; n >= 2 {
		return 2
	}
	return 1
}

// memberOnNode returns the index of the first member on node, or -1.
func (rc *reconcile) memberOnNode(node string) int {
	if node == "" {
		return -1
	}
	return slices.IndexFunc(rc.st.Datamesh.Members, func(m v1.DatameshMember) bool { return m.NodeName == node })
}

func (rc *reconcile) attachTransition(name string) int {
	ts := rc.st.DatameshTransitions
	for i := range ts {
		switch ts[i].Type {
		case v1.TransitionAttach, v1.TransitionDetach, v1.TransitionForceDetach:
			if ts[i].ReplicaName == name {
				return i
			}
		}
	}
	return -1
}

func rvaLess(a, b *v1.ReplicatedVolumeAttachment, aAtt, bAtt bool) int {
	if aAtt != bAtt {
		if aAtt {
			return -1
		}
		return 1
	}
	if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
		return c
	}
	switch {
	case a.Name < b.Name:
		return -1
	case a.Name > b.Name:
		return 1
	}
	return 0
}

// serving is what the RVAs ask of the members: the member on each RVA's node, the
// members some live RVA asks for, and the RVAs served (the first maxAttachments live
// ones, attached first, then oldest).
type serving struct {
	member []int  // RVA index → member on its node, -1 when none
	live   uint64 // members (by index) on a node some live RVA asks for
	served []int  // the served RVAs' indexes, in serving order
}

// isServed reports whether RVA i is served.
func (sv serving) isServed(i int) bool { return slices.Contains(sv.served, i) }

// wantsNode reports whether a served RVA asks for node.
func (sv serving) wantsNode(rvas []*v1.ReplicatedVolumeAttachment, node string) bool {
	for _, j := range sv.served {
		if rvas[j].Spec.NodeName == node {
			return true
		}
	}
	return false
}

// serveRVAs computes which RVAs are served. A selection of one or two, not a sort:
// most volumes have one RVA.
func (rc *reconcile) serveRVAs() serving {
	rvas := rc.in.RVAs
	ms := rc.st.Datamesh.Members
	limit := rc.maxAttachments()
	sv := serving{member: make([]int, len(rvas))}
	for i, a := range rvas {
		mi := rc.memberOnNode(a.Spec.NodeName)
		sv.member[i] = mi
		if a.DeletionTimestamp != nil {
			continue
		}
		att := mi >= 0 && ms[mi].Attached
		if mi >= 0 && mi < 64 {
			sv.live |= 1 << uint(mi)
		}
		// Insert i into served (kept in order, at most limit long).
		pos := len(sv.served)
		for pos > 0 {
			j := sv.served[pos-1]
			mj := sv.member[j]
			if rvaLess(rvas[i], rvas[j], att, mj >= 0 && ms[mj].Attached) >= 0 {
				break
			}
			pos--
		}
		if pos < limit {
			sv.served = slices.Insert(sv.served, pos, i)[:min(len(sv.served)+1, limit)]
		}
	}
	return sv
}

func (rc *reconcile) attachment(quorumBusy bool) ([]AttachmentStatus, []WantedReplica) {
	sv := rc.serveRVAs()
	block := rc.attachmentBlocked(quorumBusy)
	if block == "" && rc.hasCfg && len(rc.st.Datamesh.Members) > 0 {
		rc.detachUnasked(sv)
		block = rc.followMultiattach(sv)
	}
	attached := rc.attachedCount()
	atts := make([]AttachmentStatus, 0, len(rc.in.RVAs))
	for i, a := range rc.in.RVAs {
		st := AttachmentStatus{Name: a.Name, NodeName: a.Spec.NodeName}
		mi := sv.member[i] // attachment changes attached flags, never the members
		st.Phase, st.Message = rc.attachOne(i, a, mi, block, attached, sv)
		if st.Phase == v1.AttachmentAttached || st.Phase == v1.AttachmentAttaching {
			attached = rc.attachedCount()
		}
		if mi >= 0 {
			st.Attached = rc.st.Datamesh.Members[mi].Attached
		}
		atts = append(atts, st)
	}
	return atts, rc.wantAccessReplicas(sv)
}

// attachmentBlocked says why no Attach may start now, or "": formation, a ChangeQuorum
// (in flight or waiting) and a multiattach change exclude them.
func (rc *reconcile) attachmentBlocked(quorumBusy bool) string {
	switch {
	case rc.formationActive():
		return "Waiting for formation to complete"
	case rc.groupInFlight(v1.GroupQuorum) || quorumBusy:
		return "Waiting for ChangeQuorum to complete"
	case rc.groupInFlight(v1.GroupMultiattach):
		return msgWaitMultiattach
	case rc.quorumDropDue():
		return "Waiting for q to come down to what the remaining voters give, after a lost member's force removal"
	}
	return ""
}

// detachUnasked starts a Detach of every attached member no served RVA asks for.
func (rc *reconcile) detachUnasked(sv serving) {
	for mi := range rc.st.Datamesh.Members {
		m := &rc.st.Datamesh.Members[mi]
		if !m.Attached || sv.wantsNode(rc.in.RVAs, m.NodeName) || rc.attachTransition(m.Name) >= 0 {
			continue
		}
		if p, ok := rc.reg.Latest(PlanDetach); ok {
			ti := rc.start(p, m.Name)
			rc.confirm(ti, p, 0)
		}
	}
}

// followMultiattach turns multiattach on when two RVAs are served and off when one is
// (and at most one member is attached), outside any Attach/Detach. It returns the
// block for Attaches when it started a change.
func (rc *reconcile) followMultiattach(sv serving) string {
	if rc.groupInFlight(v1.GroupAttachment) {
		return ""
	}
	multi := rc.st.Datamesh.Multiattach
	switch {
	case len(sv.served) >= 2 && !multi:
		rc.startVolumeWide(PlanEnableMultiattach)
		return msgWaitMultiattach
	case len(sv.served) < 2 && multi && rc.attachedCount() <= 1:
		rc.startVolumeWide(PlanDisableMultiattach)
		return msgWaitMultiattach
	}
	return ""
}

// attachedCount counts members that are attached or still detaching: a Detach is
// published at once but the node may stay Primary until it confirms, so its slot is not
// free before that.
func (rc *reconcile) attachedCount() int {
	n := 0
	for i := range rc.st.Datamesh.Members {
		m := &rc.st.Datamesh.Members[i]
		if m.Attached || (len(rc.st.DatameshTransitions) > 0 && rc.detachInFlight(m.Name)) {
			n++
		}
	}
	return n
}

func (rc *reconcile) startVolumeWide(id string) {
	if p, ok := rc.reg.Latest(id); ok {
		ti := rc.start(p, "")
		rc.confirm(ti, p, 0)
	}
}

// attachOne decides one RVA's phase and message, starting an Attach when it may.
func (rc *reconcile) attachOne(i int, a *v1.ReplicatedVolumeAttachment, mi int, block string, attached int, sv serving) (v1.AttachmentPhase, string) {
	node := a.Spec.NodeName
	if mi >= 0 {
		m := &rc.st.Datamesh.Members[mi]
		if ti := rc.attachTransition(m.Name); ti >= 0 {
			t := &rc.st.DatameshTransitions[ti]
			msg := ""
			if si := activeStep(t); si >= 0 {
				msg = t.Steps[si].Message
			}
			if t.Type == v1.TransitionAttach {
				return v1.AttachmentAttaching, "Attaching: " + msg
			}
			return v1.AttachmentDetaching, "Detaching: " + msg
		}
		if a.DeletionTimestamp != nil || !sv.wantsNode(rc.in.RVAs, node) {
			if m.Attached {
				return v1.AttachmentDetaching, "Detaching"
			}
			if a.DeletionTimestamp != nil {
				return v1.AttachmentDetaching, "Detached"
			}
		} else if m.Attached {
			return v1.AttachmentAttached, msgAttached
		}
	} else if a.DeletionTimestamp != nil {
		return v1.AttachmentDetaching, "Detached"
	}
	rc.waiting = true
	if !sv.isServed(i) {
		if rc.maxAttachments() == 1 {
			return v1.AttachmentPending, msgWaitMax1
		}
		return v1.AttachmentPending, msgWaitMax2
	}
	if block != "" {
		return v1.AttachmentPending, block
	}
	cfg := rc.st.Configuration
	local := cfg != nil && cfg.VolumeAccess == v1.VolumeAccessLocal
	if mi < 0 {
		if local {
			return v1.AttachmentPending, "volumeAccess=Local: node " + node + " has no Diskful replica"
		}
		return v1.AttachmentPending, rc.awaitingJoin(node)
	}
	if msg := rc.attachBlocked(mi, local, attached); msg != "" {
		return v1.AttachmentPending, msg
	}
	p, ok := rc.reg.Latest(PlanAttach)
	if !ok {
		return v1.AttachmentPending, "Plan attach is not registered"
	}
	ti := rc.start(p, rc.st.Datamesh.Members[mi].Name)
	rc.confirm(ti, p, 0)
	return v1.AttachmentAttaching, "Attaching: " + rc.st.DatameshTransitions[ti].Steps[0].Message
}

// awaitingJoin says why no member serves node yet. When placement has created the
// replica there and a join guard holds it back, the guard's message comes along (the
// same text as its replica request), so the attachment alone tells a user what the
// volume waits for.
func (rc *reconcile) awaitingJoin(node string) string {
	msg := "Waiting for a replica on node " + node + " to join the datamesh"
	for _, j := range rc.rvrOrd {
		r := rc.in.RVRs[j]
		if r.Spec.NodeName != node || r.DeletionTimestamp != nil {
			continue
		}
		if i := rc.findRequest(r.Name); i >= 0 {
			if req := &rc.st.DatameshReplicaRequests[i]; req.Operation == v1.ReplicaOperationJoin && req.Message != "" {
				return msg + ": replica " + r.Name + ": " + req.Message
			}
		}
	}
	return msg
}

// attachBlocked returns why member mi may not be attached now, or "" (docs/datamesh.md
// "Guards"); attached is how many members are attached or still detaching.
func (rc *reconcile) attachBlocked(mi int, local bool, attached int) string {
	if rc.in.RV.DeletionTimestamp != nil {
		// A volume being deleted waits for its attachments to go and takes no new one:
		// once its deletion mark shows no member attached and no Attach or Detach in
		// flight, it stays detached, which lets each agent take down a replica the
		// controller deletes with the volume without a teardown revision first
		// (docs/contract.md, "Deleting a volume").
		return "Volume is being deleted"
	}
	m := &rc.st.Datamesh.Members[mi]
	if ti := rc.transitionOf(m.Name, true); ti >= 0 {
		return "Waiting for the " + string(rc.st.DatameshTransitions[ti].Type) + " transition of replica " + m.Name + " to complete"
	}
	if rc.forceLeaving(m.Name) {
		return "Replica " + m.Name + " is being force-removed"
	}
	for _, n := range rc.in.ForceDetach {
		if n == m.Name {
			return "Member " + m.Name + " was force-detached: its node is lost"
		}
	}
	if r := rc.rvrOfMember(mi); r == nil || r.DeletionTimestamp != nil {
		return "Replica " + m.Name + " is leaving the datamesh"
	}
	state := rc.mstate(mi)
	switch {
	case state.IsLiminal():
		return "Waiting for " + m.Name + " to leave " + string(m.Type)
	case local && state != StateD:
		return "volumeAccess=Local: member " + m.Name + " is " + string(m.Type) + ", not Diskful"
	}
	if attached >= rc.maxAttachments() {
		return "Waiting for another node to detach (maxAttachments=" + strconv.Itoa(rc.maxAttachments()) + ")"
	}
	if attached >= 1 && !rc.st.Datamesh.Multiattach {
		return "Waiting for multiattach to be enabled"
	}
	if step := rc.stepAwaiting(mi); step != "" && !(attached == 0 && rc.heldPrimary(mi)) {
		return "Waiting for " + m.Name + " to confirm " + step + " first"
	}
	if state == StateA || state == StateTB || state == StateSDL {
		c := rc.counts()
		if c.upToDateD <= rc.cfg.GMDR {
			return "Cannot attach diskless member: " + strconv.Itoa(c.upToDateD) +
				" UpToDate Diskful, need > GMDR " + strconv.Itoa(rc.cfg.GMDR) +
				" (DRBD does not enforce quorum-minimum-redundancy for a diskless Primary)"
		}
	}
	return ""
}

// wantAccessReplicas asks for an Access replica on every served node without a replica,
// and for deleting Access members no live RVA asks for (a waiting RVA keeps its replica).
func (rc *reconcile) wantAccessReplicas(sv serving) (wanted []WantedReplica) {
	if !rc.hasCfg || rc.formationActive() {
		return nil
	}
	local := rc.st.Configuration != nil && rc.st.Configuration.VolumeAccess == v1.VolumeAccessLocal
	for _, j := range sv.served {
		node := rc.in.RVAs[j].Spec.NodeName
		has := false
		for _, r := range rc.in.RVRs {
			if r.Spec.NodeName == node && r.DeletionTimestamp == nil {
				has = true
				break
			}
		}
		if !has && !local && rc.memberOnNode(node) < 0 {
			wanted = append(wanted, WantedReplica{Action: WantCreate, Type: v1.ReplicaTypeAccess, NodeName: node,
				Reason: "attachment " + rc.in.RVAs[j].Name + " needs the volume on node " + node})
		}
	}
	for mi := range rc.st.Datamesh.Members {
		m := &rc.st.Datamesh.Members[mi]
		r := rc.rvrOfMember(mi)
		if rc.mstate(mi) != StateA || m.Attached || r == nil || r.DeletionTimestamp != nil ||
			r.Spec.Type != v1.ReplicaTypeAccess || (mi < 64 && sv.live&(1<<uint(mi)) != 0) || rc.transitionOf(m.Name, false) >= 0 {
			continue
		}
		wanted = append(wanted, WantedReplica{Action: WantDelete, Type: v1.ReplicaTypeAccess, Replica: m.Name,
			Reason: "no attachment needs the Access replica on node " + m.NodeName})
	}
	return wanted
}

// stepAwaiting names a step of another transition that waits for member mi's
// confirmation ("the ForceRemoveReplica of r3 (revision 7)"), or "". An Attach of mi
// waits for it (attachBlocked): the Attach's revision would carry that step too, and
// mi confirms a revision only once it is Primary, so a member that cannot be promoted
// yet — a survivor whose quorum a lost voter took, until the removal's q↓ or the
// replacement's join that the step belongs to — would confirm neither (docs/datamesh.md,
// "An Attach its member cannot promote").
func (rc *reconcile) stepAwaiting(mi int) string {
	m := &rc.st.Datamesh.Members[mi]
	bit := uint32(1) << uint(m.NodeID&31)
	for i := range rc.st.DatameshTransitions {
		t := &rc.st.DatameshTransitions[i]
		if (t.Type == v1.TransitionAttach || t.Type == v1.TransitionDetach) && t.ReplicaName == m.Name {
			continue
		}
		p, ok := rc.planOf(t)
		si := activeStep(t)
		if !ok || si < 0 || len(p.Steps) != len(t.Steps) || t.Steps[si].Status != v1.StepActive {
			continue
		}
		rev := t.Steps[si].DatameshRevision
		if w := rc.waitSet(t, &p.Steps[si], rev); w.Must&^w.Confirmed&bit != 0 {
			what := string(t.Type)
			if t.ReplicaName != "" {
				what += " of " + t.ReplicaName
			}
			return "the " + what + " (revision " + strconv.FormatInt(rev, 10) + ")"
		}
	}
	return ""
}

// heldPrimary: member mi's agent (reporting) says its DRBD resource is Primary while
// the datamesh does not attach it — a member force-detached while its node was thought
// lost, whose device stayed open (its pod ran on behind the cut, and DRBD refuses to
// demote a device held open). Such a member confirms no revision until the datamesh
// gives it back the role it holds, so a step waiting for it (stepAwaiting: a force
// removal of another member, say) waits for exactly the Attach that stepAwaiting would
// hold back: with nothing else attached, the Attach goes first and the member confirms
// both (docs/datamesh.md, "An Attach its member cannot promote"). The Attach takes
// nothing from anyone: the member is Primary already, and no other member is attached.
func (rc *reconcile) heldPrimary(mi int) bool {
	r := rc.rvrOfMember(mi)
	return r != nil && !agentNotReady(r) && r.Status.Role == v1.RolePrimary && !rc.st.Datamesh.Members[mi].Attached
}

// promotionRefused says why DRBD refused to promote member mi for want of quorum, or
// "": its agent (reporting) says the last promotion failed with "No quorum" (-25), a
// refusal the kernel computes afresh, unlike the quorum flag it displays.
func (rc *reconcile) promotionRefused(mi int) string {
	r := rc.rvrOfMember(mi)
	if r == nil || agentNotReady(r) {
		return ""
	}
	for k := range r.Status.Conditions {
		if c := &r.Status.Conditions[k]; c.Type == v1.ConditionDRBDRole && c.Status != metav1.ConditionTrue && c.Reason == v1.ReasonPromoteNoQuorum {
			return "DRBD refused to promote replica " + r.Name + ": " + c.Message
		}
	}
	return ""
}

// promotionFailed says why the agent of member mi failed its last promotion for any
// reason (DRBDRole=False, PromoteFailed or PromoteNoQuorum), or "".
func (rc *reconcile) promotionFailed(mi int) string {
	r := rc.rvrOfMember(mi)
	if r == nil || agentNotReady(r) {
		return ""
	}
	for k := range r.Status.Conditions {
		if c := &r.Status.Conditions[k]; c.Type == v1.ConditionDRBDRole && c.Status != metav1.ConditionTrue &&
			(c.Reason == v1.ReasonPromoteFailed || c.Reason == v1.ReasonPromoteNoQuorum) {
			return "DRBD refused to promote replica " + r.Name + ": " + c.Message
		}
	}
	return ""
}

// lossPending: a lost member's force removal is asked for or in flight, or the q↓
// after one is due — the steps that give a survivor its quorum back.
func (rc *reconcile) lossPending() bool {
	for i := range rc.st.DatameshReplicaRequests {
		if rc.st.DatameshReplicaRequests[i].Operation == v1.ReplicaOperationForceLeave {
			return true
		}
	}
	return rc.forceRemovalUnconfirmed() || rc.quorumDropDue()
}

// withdrawAttaches gives up every Attach that its member has not confirmed because DRBD
// refused the promotion for want of quorum (promotionRefused), when something else
// waits behind it: another transition's step the member must confirm (stepAwaiting),
// or a lost member's removal or the q↓ after it (lossPending) — often the very steps
// that would give the member its quorum back. The member confirms a revision only once
// it is Primary, so those would wait for good (docs/datamesh.md, "An Attach its
// member cannot promote"). The Attach is cancelled and a Detach publishes the member
// not attached; it is Secondary, so that takes nothing from anyone: no RVA was
// Attached, nothing opened the device. The RVA waits, saying why (attachBlocked,
// attachmentBlocked), and attaches once the member has confirmed what it waited for.
// With nothing behind it the Attach stays: quorum may come back by itself (a partition
// heals), and withdrawing would only churn revisions — unless no attachment asks for
// it any more (its RVA deleted, the volume being deleted): then nothing would ever
// detach the member, since a Detach waits for the Attach to complete, and the volume
// could not be deleted while the quorum stays away. For that case any refusal the
// agent reports will do (promotionFailed: also "(-2) Need access to UpToDate data", a
// disk that came back Consistent with no UpToDate peer): the member is Secondary all
// the same, and nobody wants it attached.
func (rc *reconcile) withdrawAttaches() {
	loss := rc.lossPending()
	sv := rc.serveRVAs()
	for ti := 0; ti < len(rc.st.DatameshTransitions); ti++ {
		t := &rc.st.DatameshTransitions[ti]
		si := activeStep(t)
		if t.Type != v1.TransitionAttach || si < 0 || t.Steps[si].Status != v1.StepActive {
			continue
		}
		mi := rc.memberIndex(t.ReplicaName)
		r := rc.rvrOfMember(mi)
		if mi < 0 || r == nil || r.Status.Role == v1.RolePrimary || r.Status.DatameshRevision >= t.Steps[si].DatameshRevision {
			continue
		}
		why := rc.promotionRefused(mi)
		unwanted := !sv.wantsNode(rc.in.RVAs, rc.st.Datamesh.Members[mi].NodeName)
		if why == "" && unwanted {
			why = rc.promotionFailed(mi)
		}
		if why == "" || (!loss && !unwanted && rc.stepAwaiting(mi) == "") {
			continue
		}
		name := t.ReplicaName
		rc.cancel(ti)
		p, ok := rc.reg.Latest(PlanDetach)
		if !ok {
			return
		}
		nt := rc.start(p, name)
		rc.confirm(nt, p, 0)
		if unwanted {
			rc.event(EventWarning, "AttachWithdrawn", "The Attach of "+name+" was withdrawn: no attachment asks for it any more, and "+why)
		} else {
			rc.event(EventWarning, "AttachWithdrawn", "The Attach of "+name+" was withdrawn until the steps waiting behind it are done: "+why)
		}
		ti = -1 // the list changed: look again from the start
	}
}
