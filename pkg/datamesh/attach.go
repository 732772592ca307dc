package datamesh

import (
	"strconv"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Attachment (seed 000 Attach/Detach/Enable/DisableMultiattach; seed 001's attachment
// planner). An RVA asks for the volume on a node; up to spec.maxAttachments of them are
// served, attached ones first, then oldest first. Attach and Detach overlap each other
// and membership transitions of other members; Enable/DisableMultiattach excludes them;
// formation and ChangeQuorum block them.
//
// Guard (DRBD-QUORUM.md): upstream DRBD does not check quorum-minimum-redundancy on the
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
)

func (e *Engine) maxAttachments() int {
	if n := e.s.in.RV.Spec.MaxAttachments; n >= 2 {
		return 2
	}
	return 1
}

func (e *Engine) memberOnNode(node string) int {
	if node == "" {
		return -1
	}
	s := &e.s
	ms := s.st.Datamesh.Members
	if len(ms) < 4 {
		for i := range ms {
			if ms[i].NodeName == node {
				return i
			}
		}
		return -1
	}
	if !s.nodeTab.valid {
		s.nodeTab.build(ms, true)
	}
	return s.nodeTab.find(node)
}

func (e *Engine) attachTransition(name string) int {
	ts := e.s.st.DatameshTransitions
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

// served reports whether RVA i is among the first maxAttachments live RVAs.
func (e *Engine) served(i int) bool {
	for _, j := range e.s.rvaOrd {
		if j == i {
			return true
		}
	}
	return false
}

// serveRVAs maps every RVA to the member on its node (s.rvaMember), marks the members
// some live RVA asks for (s.liveMembers), and picks the served RVAs into s.rvaOrd: the
// first maxAttachments live ones, attached first, then oldest. A selection of one or
// two, not a sort: most volumes have one RVA.
func (e *Engine) serveRVAs() {
	s := &e.s
	rvas := s.in.RVAs
	ms := s.st.Datamesh.Members
	limit := e.maxAttachments()
	ord := s.rvaOrd[:0]
	s.liveMembers = 0
	s.rvaMember = resizeInts(s.rvaMember, len(rvas))
	for i, a := range rvas {
		mi := e.memberOnNode(a.Spec.NodeName)
		s.rvaMember[i] = mi
		if a.DeletionTimestamp != nil {
			continue
		}
		att := mi >= 0 && ms[mi].Attached
		if mi >= 0 && mi < 64 {
			s.liveMembers |= 1 << uint(mi)
		}
		// Insert i into ord (kept sorted, at most limit long).
		pos := len(ord)
		for pos > 0 {
			j := ord[pos-1]
			mj := s.rvaMember[j]
			if rvaLess(rvas[i], rvas[j], att, mj >= 0 && ms[mj].Attached) >= 0 {
				break
			}
			pos--
		}
		if pos >= limit {
			continue
		}
		if len(ord) < limit {
			ord = append(ord, 0)
		}
		copy(ord[pos+1:], ord[pos:len(ord)-1])
		ord[pos] = i
	}
	s.rvaOrd = ord
}

func (e *Engine) attachment() {
	s := &e.s
	rvas := s.in.RVAs
	ms := s.st.Datamesh.Members
	e.serveRVAs()
	ord := s.rvaOrd
	wantNode := func(node string) bool {
		for _, j := range ord {
			if rvas[j].Spec.NodeName == node {
				return true
			}
		}
		return false
	}

	block := ""
	switch {
	case e.formationActive():
		block = "Waiting for formation to complete"
	case e.groupInFlight(v1.GroupQuorum) || s.quorumBusy:
		block = "Waiting for ChangeQuorum to complete"
	case e.groupInFlight(v1.GroupMultiattach):
		block = "Waiting for the multiattach change to complete"
	}
	formed := s.hasCfg && len(ms) > 0

	// Detach members nobody asks for any more.
	if block == "" && formed {
		for mi := 0; mi < len(s.st.Datamesh.Members); mi++ {
			m := &s.st.Datamesh.Members[mi]
			if !m.Attached || wantNode(m.NodeName) || e.attachTransition(m.Name) >= 0 {
				continue
			}
			p, ok := e.reg.Latest(PlanDetach)
			if !ok {
				continue
			}
			ti := e.start(p, m.Name)
			e.confirm(ti, p, 0)
		}
	}

	// Multiattach follows the number of served RVAs, outside any Attach/Detach.
	attached := e.attachedCount()
	if block == "" && formed && !e.groupInFlight(v1.GroupAttachment) {
		multi := s.st.Datamesh.Multiattach
		switch {
		case len(ord) >= 2 && !multi:
			e.startVolumeWide(PlanEnableMultiattach)
			block = "Waiting for the multiattach change to complete"
		case len(ord) < 2 && multi && attached <= 1:
			e.startVolumeWide(PlanDisableMultiattach)
			block = "Waiting for the multiattach change to complete"
		}
	}

	for i, a := range rvas {
		st := AttachmentStatus{Name: a.Name, NodeName: a.Spec.NodeName, Phase: v1.AttachmentPending}
		mi := s.rvaMember[i] // attachment changes attached flags, never the members
		if a.DeletionTimestamp == nil && mi >= 0 && !s.st.Datamesh.Members[mi].Attached && !e.served(i) &&
			(len(s.st.DatameshTransitions) == 0 || e.attachTransition(s.st.Datamesh.Members[mi].Name) < 0) {
			// The common waiting case, without the full evaluation.
			s.waiting = true
			st.Message = msgWaitMax2
			if e.maxAttachments() == 1 {
				st.Message = msgWaitMax1
			}
			s.atts = append(s.atts, st)
			continue
		}
		st.Phase, st.Message = e.attachOne(i, a, mi, block, attached, wantNode)
		if st.Phase == v1.AttachmentAttached || st.Phase == v1.AttachmentAttaching {
			attached = e.attachedCount()
		}
		if mi >= 0 {
			st.Attached = s.st.Datamesh.Members[mi].Attached
		}
		s.atts = append(s.atts, st)
	}
	e.wantAccessReplicas()
}

// attachedCount counts members that are attached or still detaching: a Detach is
// published at once but the node may stay Primary until it confirms, so its slot is not
// free before that.
func (e *Engine) attachedCount() int {
	n := 0
	for i := range e.s.st.Datamesh.Members {
		m := &e.s.st.Datamesh.Members[i]
		if m.Attached || (len(e.s.st.DatameshTransitions) > 0 && e.detachInFlight(m.Name)) {
			n++
		}
	}
	return n
}

func (e *Engine) startVolumeWide(id string) {
	if p, ok := e.reg.Latest(id); ok {
		ti := e.start(p, "")
		e.confirm(ti, p, 0)
	}
}

// attachOne decides one RVA's phase and message, starting an Attach when it may.
func (e *Engine) attachOne(i int, a *v1.ReplicatedVolumeAttachment, mi int, block string, attached int, wantNode func(string) bool) (v1.AttachmentPhase, string) {
	s := &e.s
	node := a.Spec.NodeName
	if mi >= 0 {
		m := &s.st.Datamesh.Members[mi]
		if ti := e.attachTransition(m.Name); ti >= 0 {
			t := &s.st.DatameshTransitions[ti]
			msg := ""
			if si := activeStep(t); si >= 0 {
				msg = t.Steps[si].Message
			}
			if t.Type == v1.TransitionAttach {
				return v1.AttachmentAttaching, "Attaching: " + msg
			}
			return v1.AttachmentDetaching, "Detaching: " + msg
		}
		if a.DeletionTimestamp != nil || !wantNode(node) {
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
	s.waiting = true
	if !e.served(i) {
		if e.maxAttachments() == 1 {
			return v1.AttachmentPending, msgWaitMax1
		}
		return v1.AttachmentPending, msgWaitMax2
	}
	if block != "" {
		return v1.AttachmentPending, block
	}
	cfg := s.st.Configuration
	local := cfg != nil && cfg.VolumeAccess == v1.VolumeAccessLocal
	if mi < 0 {
		if local {
			return v1.AttachmentPending, "volumeAccess=Local: node " + node + " has no Diskful replica"
		}
		return v1.AttachmentPending, "Waiting for a replica on node " + node + " to join the datamesh"
	}
	m := &s.st.Datamesh.Members[mi]
	if ti := e.transitionOf(m.Name, true); ti >= 0 {
		return v1.AttachmentPending, "Waiting for the " + string(s.st.DatameshTransitions[ti].Type) + " transition of replica " + m.Name + " to complete"
	}
	if e.forceLeaving(m.Name) {
		return v1.AttachmentPending, "Replica " + m.Name + " is being force-removed"
	}
	for _, n := range s.in.ForceDetach {
		if n == m.Name {
			return v1.AttachmentPending, "Member " + m.Name + " was force-detached: its node is lost"
		}
	}
	if r := e.rvrOfMember(mi); r == nil || r.DeletionTimestamp != nil {
		return v1.AttachmentPending, "Replica " + m.Name + " is leaving the datamesh"
	}
	state := e.mstate(mi)
	switch {
	case state.IsLiminal():
		return v1.AttachmentPending, "Waiting for " + m.Name + " to leave " + string(m.Type)
	case local && state != StateD:
		return v1.AttachmentPending, "volumeAccess=Local: member " + m.Name + " is " + string(m.Type) + ", not Diskful"
	}
	if attached >= e.maxAttachments() {
		return v1.AttachmentPending, "Waiting for another node to detach (maxAttachments=" + strconv.Itoa(e.maxAttachments()) + ")"
	}
	if attached >= 1 && !s.st.Datamesh.Multiattach {
		return v1.AttachmentPending, "Waiting for multiattach to be enabled"
	}
	if state == StateA || state == StateTB || state == StateSDL {
		c := e.counts()
		if c.upToDateD <= s.cfg.GMDR {
			return v1.AttachmentPending, "Cannot attach diskless member: " + strconv.Itoa(c.upToDateD) +
				" UpToDate Diskful, need > GMDR " + strconv.Itoa(s.cfg.GMDR) +
				" (DRBD does not enforce quorum-minimum-redundancy for a diskless Primary)"
		}
	}
	p, ok := e.reg.Latest(PlanAttach)
	if !ok {
		return v1.AttachmentPending, "Plan attach is not registered"
	}
	ti := e.start(p, m.Name)
	e.confirm(ti, p, 0)
	return v1.AttachmentAttaching, "Attaching: " + s.st.DatameshTransitions[ti].Steps[0].Message
}

// wantAccessReplicas asks for an Access replica on every served node without a replica,
// and for deleting Access members no live RVA asks for (a waiting RVA keeps its replica).
func (e *Engine) wantAccessReplicas() {
	s := &e.s
	if !s.hasCfg || e.formationActive() {
		return
	}
	local := s.st.Configuration != nil && s.st.Configuration.VolumeAccess == v1.VolumeAccessLocal
	for _, j := range s.rvaOrd {
		node := s.in.RVAs[j].Spec.NodeName
		has := false
		for _, r := range s.in.RVRs {
			if r.Spec.NodeName == node && r.DeletionTimestamp == nil {
				has = true
				break
			}
		}
		if !has && !local && e.memberOnNode(node) < 0 {
			s.wanted = append(s.wanted, WantedReplica{Action: WantCreate, Type: v1.ReplicaTypeAccess, NodeName: node,
				Reason: "attachment " + s.in.RVAs[j].Name + " needs the volume on node " + node})
		}
	}
	for mi := range s.st.Datamesh.Members {
		m := &s.st.Datamesh.Members[mi]
		r := e.rvrOfMember(mi)
		if e.mstate(mi) != StateA || m.Attached || r == nil || r.DeletionTimestamp != nil ||
			r.Spec.Type != v1.ReplicaTypeAccess || (mi < 64 && s.liveMembers&(1<<uint(mi)) != 0) || e.transitionOf(m.Name, false) >= 0 {
			continue
		}
		s.wanted = append(s.wanted, WantedReplica{Action: WantDelete, Type: v1.ReplicaTypeAccess, Replica: m.Name,
			Reason: "no attachment needs the Access replica on node " + m.NodeName})
	}
}
