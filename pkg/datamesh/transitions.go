package datamesh

import (
	"slices"
	"strconv"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
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

func (e *Engine) planOf(t *v1.DatameshTransition) (*Plan, bool) {
	return e.reg.Lookup(t.PlanID, t.PlanVersion)
}

// start appends a transition running plan p for replica (empty for volume-wide ones) and
// publishes its first step. It returns the transition's index.
func (e *Engine) start(p *Plan, replica string) int {
	steps := make([]v1.DatameshTransitionStep, len(p.Steps))
	for i := range p.Steps {
		steps[i] = v1.DatameshTransitionStep{Name: p.Steps[i].Name, Status: v1.StepPending}
	}
	st := e.s.st
	st.DatameshTransitions = append(st.DatameshTransitions, v1.DatameshTransition{
		Type: p.Type, Group: p.Group, ReplicaName: replica,
		FromType: p.From.MemberType(), ToType: p.To.MemberType(),
		PlanID: p.ID, PlanVersion: p.Version, Steps: steps,
	})
	e.markChanged()
	ti := len(st.DatameshTransitions) - 1
	if p.Type != v1.TransitionFormation {
		e.publish(ti, p, 0)
	}
	return ti
}

// publish applies step si of transition ti to the datamesh and bumps the revision: one
// published change, one revision. A formation sync step publishes nothing.
func (e *Engine) publish(ti int, p *Plan, si int) {
	st := e.s.st
	t := &st.DatameshTransitions[ti]
	step := &p.Steps[si]
	rev := st.DatameshRevision
	switch step.Kind {
	case StepMember:
		qBefore := st.Datamesh.Quorum
		before := e.counts()
		tb := before.tb > 0 || e.tieBreakerChanging()
		e.applyMember(t.ReplicaName, step.From, step.To)
		switch {
		case step.HoldQ:
			st.Datamesh.Quorum = max(st.Datamesh.Quorum, int32(heldQuorum(before.voters, e.counts().voters, int(qBefore), tb)))
		case holdActive(p, si):
			st.Datamesh.Quorum = max(st.Datamesh.Quorum, qBefore)
		}
		rev = e.bump()
	case StepQ:
		e.afterMembershipChange()
		rev = e.bump()
	case StepQMR:
		c := e.counts()
		e.setQMR(e.effective().NextQMR(e.s.cfg, c.upToDateD))
		rev = e.bump()
	case StepAttach, StepDetach:
		if mi := e.memberIndex(t.ReplicaName); mi >= 0 {
			st.Datamesh.Members[mi].Attached = step.Kind == StepAttach
		}
		rev = e.bump()
	case StepMultiattach:
		st.Datamesh.Multiattach = step.QMR == Up
		rev = e.bump()
	case StepQuorum:
		// The values were written when the ChangeQuorum started (changeQuorum).
		rev = e.bump()
	case StepFormationPublish:
		e.formationPublish()
		rev = e.bump()
	case StepFormationSync:
	}
	t = &st.DatameshTransitions[ti]
	ts := &t.Steps[si]
	ts.Status = v1.StepActive
	ts.DatameshRevision = rev
	ts.StartedAt = e.now()
	ts.CompletedAt = nil
	ts.Message = ""
	e.markChanged()
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
// the seed's rule (q rises odd→even, stays even→odd); with one it is one more in the
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

// applyMember moves member name from → to (✦ adds it, ✕ removes it), then ratchets the
// effective layout and recomputes q.
func (e *Engine) applyMember(name string, from, to State) {
	st := e.s.st
	switch {
	case from == StateNew:
		r := e.rvrByName(name)
		m := v1.DatameshMember{Name: name, Type: to.MemberType(), NodeID: int32(e.freeNodeID())}
		if r != nil {
			m.NodeName = r.Spec.NodeName
			m.Addresses = slices.Clone(r.Status.Addresses)
			if n := e.s.in.Pool.FindNode(r.Spec.NodeName); n != nil {
				m.Zone = n.Zone
			}
		}
		st.Datamesh.Members = slices.Insert(st.Datamesh.Members, e.memberInsertAt(name), m)
		e.index()
	case to == StateGone:
		if mi := e.memberIndex(name); mi >= 0 {
			st.Datamesh.Members = slices.Delete(st.Datamesh.Members, mi, mi+1)
			e.index()
		}
	default:
		if mi := e.memberIndex(name); mi >= 0 {
			st.Datamesh.Members[mi].Type = to.MemberType()
			if mi < len(e.s.memState) {
				e.s.memState[mi] = to
			}
		}
	}
	e.afterMembershipChange()
}

// freeNodeID is the lowest DRBD node-id (0..31) no member holds and no replica still has
// configured as a peer of a non-member: a replica that left may still be known to its
// former peers until they confirm its removal, and reusing its node-id before that would
// hand its bitmap slot to a stranger. -1 when none is free.
func (e *Engine) freeNodeID() int {
	var used uint32
	for i := range e.s.st.Datamesh.Members {
		used |= 1 << uint(e.s.st.Datamesh.Members[i].NodeID&31)
	}
	for _, r := range e.s.in.RVRs {
		for k := range r.Status.Peers {
			p := &r.Status.Peers[k]
			if p.NodeID != nil && *p.NodeID >= 0 && *p.NodeID < 32 && e.memberIndex(p.Name) < 0 {
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
func (e *Engine) backward() {
	st := e.s.st
	for ti := 0; ti < len(st.DatameshTransitions); {
		t := &st.DatameshTransitions[ti]
		p, ok := e.planOf(t)
		if !ok || len(p.Steps) != len(t.Steps) {
			// A plan this controller does not know (a downgrade?) is never guessed at.
			if si := activeStep(t); si >= 0 {
				e.setStepMessage(ti, si, "Plan "+t.PlanID+" version "+strconv.Itoa(int(t.PlanVersion))+" is not registered in this controller; cannot continue")
			}
			e.s.waiting = true
			ti++
			continue
		}
		si := activeStep(t)
		if si < 0 {
			e.complete(ti, p)
			continue
		}
		if t.Steps[si].Status == v1.StepPending {
			if t.Type == v1.TransitionFormation && si == 0 {
				ti++ // formation() publishes when the replicas are ready
				continue
			}
			if msg := e.notReady(t, &p.Steps[si]); msg != "" {
				e.setStepMessage(ti, si, msg)
				if isMembership(t.Type) {
					e.setRequestMessageString(t.ReplicaName, requestPrefix(t.Type)+", step "+strconv.Itoa(si+1)+"/"+strconv.Itoa(len(t.Steps))+" ("+p.Steps[si].Name+"): "+msg)
				}
				e.s.waiting = true
				ti++
				continue
			}
			e.publish(ti, p, si)
		}
		if !e.confirm(ti, p, si) {
			ti++
			continue
		}
		t = &st.DatameshTransitions[ti]
		t.Steps[si].Status = v1.StepCompleted
		t.Steps[si].CompletedAt = e.now()
		e.markChanged()
		if si+1 < len(t.Steps) {
			continue // publish the next step (when ready) and confirm it: 0/n
		}
		e.complete(ti, p)
	}
}

// notReady returns why a pending step may not be published yet, or "". The qmr↑ at the
// end of AddReplica(D) waits for the new D to be UpToDate: before that, raising qmr would
// cost the fault tolerance it is meant to add (layout.NextQMR keeps the effective FTT),
// so publishing it would only publish the old value.
func (e *Engine) notReady(t *v1.DatameshTransition, step *Step) string {
	if step.Kind != StepQMR || step.QMR != Up {
		return ""
	}
	mi := e.memberIndex(t.ReplicaName)
	if mi >= 0 && !upToDate(e.rvrOfMember(mi)) {
		return "Waiting for " + t.ReplicaName + " to be UpToDate before raising qmr (qmr=" +
			strconv.Itoa(int(e.s.st.Datamesh.QuorumMinimumRedundancy)) + ")"
	}
	return ""
}

// complete removes a finished transition, leaving its completion message on the request.
func (e *Engine) complete(ti int, p *Plan) {
	st := e.s.st
	t := st.DatameshTransitions[ti]
	switch t.Type {
	case v1.TransitionAddReplica:
		e.setRequestMessageString(t.ReplicaName, "Joined datamesh successfully")
		e.event(EventNormal, "ReplicaJoined", "Replica "+t.ReplicaName+" joined the datamesh as "+string(t.ToType))
	case v1.TransitionRemoveReplica:
		e.setRequestMessageString(t.ReplicaName, "Left datamesh successfully")
		e.event(EventNormal, "ReplicaLeft", "Replica "+t.ReplicaName+" left the datamesh")
	case v1.TransitionChangeReplicaType:
		e.setRequestMessageString(t.ReplicaName, "Changed type to "+string(t.ToType)+" successfully")
		e.event(EventNormal, "ReplicaTypeChanged", "Replica "+t.ReplicaName+" changed from "+string(t.FromType)+" to "+string(t.ToType))
	case v1.TransitionForceRemoveReplica:
		e.setRequestMessageString(t.ReplicaName, "Force-removed from datamesh")
		e.event(EventWarning, "ReplicaForceRemoved", "Replica "+t.ReplicaName+" was force-removed from the datamesh")
	case v1.TransitionFormation:
		e.formationComplete()
	case v1.TransitionChangeQuorum:
		e.event(EventNormal, "QuorumChanged", "Quorum changed to q="+itoa(int(st.Datamesh.Quorum))+", qmr="+itoa(int(st.Datamesh.QuorumMinimumRedundancy)))
	}
	st.DatameshTransitions = slices.Delete(st.DatameshTransitions, ti, ti+1)
	e.markChanged()
}

// cancel removes transition ti without completing it (emergency preemption).
func (e *Engine) cancel(ti int) {
	st := e.s.st
	st.DatameshTransitions = slices.Delete(st.DatameshTransitions, ti, ti+1)
	e.markChanged()
}

func (e *Engine) setStepMessage(ti, si int, msg string) {
	ts := &e.s.st.DatameshTransitions[ti].Steps[si]
	if ts.Message != msg {
		ts.Message = msg
		e.markChanged()
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

// waitSet computes the step's wait set (seed 000 "Step confirmation rules"): the step's
// own group, united with D + D∅ when the step changes q, without the dead member on force
// paths, and without members that joined after the step was published (their first
// configuration is already newer).
func (e *Engine) waitSet(t *v1.DatameshTransition, step *Step, rev int64) WaitSet {
	var w WaitSet
	ms := e.s.st.Datamesh.Members
	affected := t.ReplicaName
	affectedMember := false
	for i := range ms {
		m := &ms[i]
		s := e.mstate(i)
		isAffected := affected != "" && m.Name == affected
		if isAffected {
			affectedMember = true
		}
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
		if step.Force && isAffected {
			in = false
		}
		if !in || (!isAffected && e.joinedAfter(m.Name, rev)) {
			continue
		}
		bit := uint32(1) << uint(m.NodeID&31)
		w.Must |= bit
		r := e.rvrOfMember(i)
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
		r := e.rvrByName(affected)
		w.SelfConfirmed = r == nil || r.Status.DatameshRevision == 0 || r.Status.DatameshRevision >= rev
	}
	return w
}

// joinedAfter: member name is still joining through a transition published after rev.
func (e *Engine) joinedAfter(name string, rev int64) bool {
	ts := e.s.st.DatameshTransitions
	for i := range ts {
		if ts[i].ReplicaName == name && ts[i].Type == v1.TransitionAddReplica &&
			len(ts[i].Steps) > 0 && ts[i].Steps[0].DatameshRevision > rev {
			return true
		}
	}
	return false
}

// confirm evaluates the active step of transition ti and writes its progress message
// (on the step, and on the replica request for membership transitions). It reports
// whether the step is confirmed.
func (e *Engine) confirm(ti int, p *Plan, si int) bool {
	t := &e.s.st.DatameshTransitions[ti]
	step := &p.Steps[si]
	rev := t.Steps[si].DatameshRevision
	w := e.waitSet(t, step, rev)
	done := w.Done()
	if !done {
		e.s.waiting = true
	}
	b := e.progress(e.s.buf[:0], t, step, rev, w)
	e.s.buf = b
	ts := &t.Steps[si]
	if ts.Message != string(b) {
		ts.Message = string(b)
		e.markChanged()
	}
	if isMembership(t.Type) && !done {
		n := len(b)
		b = append(b, requestPrefix(t.Type)...)
		b = append(b, ", step "...)
		b = strconv.AppendInt(b, int64(si+1), 10)
		b = append(b, '/')
		b = strconv.AppendInt(b, int64(len(t.Steps)), 10)
		b = append(b, " ("...)
		b = append(b, step.Name...)
		b = append(b, "): "...)
		b = append(b, b[:n]...)
		e.s.buf = b
		e.setRequestMessage(t.ReplicaName, b[n:])
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

// progress renders seed 001 §9's message:
//
//	3/4 replicas confirmed revision 7. Waiting: [#2]. Errors: #2 DRBDConfigured/Reason: msg
//
// Errors lists the waiting replicas whose DRBDConfigured condition is not True, except
// the normal in-flight reason ApplyingConfiguration and a joining replica's own
// PendingDatameshJoin.
func (e *Engine) progress(b []byte, t *v1.DatameshTransition, step *Step, rev int64, w WaitSet) []byte {
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
		return b
	}
	b = append(b, " Waiting: ["...)
	first := true
	for id := 0; id < 32; id++ {
		if waiting&(1<<uint(id)) == 0 {
			continue
		}
		if !first {
			b = append(b, ", "...)
		}
		first = false
		b = append(b, '#')
		b = strconv.AppendInt(b, int64(id), 10)
	}
	if selfWaiting {
		if !first {
			b = append(b, ", "...)
		}
		b = append(b, t.ReplicaName...)
	}
	b = append(b, "]."...)
	errStart := len(b)
	for id := 0; id < 32; id++ {
		if waiting&(1<<uint(id)) == 0 {
			continue
		}
		mi := e.memberByNodeID(int32(id))
		r := e.rvrOfMember(mi)
		b = e.appendError(b, r, "#"+strconv.Itoa(id), t, step, errStart)
	}
	if selfWaiting {
		b = e.appendError(b, e.rvrByName(t.ReplicaName), t.ReplicaName, t, step, errStart)
	}
	return b
}

func (e *Engine) appendError(b []byte, r *v1.ReplicatedVolumeReplica, label string, t *v1.DatameshTransition, step *Step, errStart int) []byte {
	if r == nil {
		return b
	}
	for k := range r.Status.Conditions {
		c := &r.Status.Conditions[k]
		if c.Type != v1.ConditionDRBDConfigured || c.Status == "True" {
			continue
		}
		if c.Reason == v1.ReasonApplyingConfiguration || c.Reason == v1.ReasonConfigured {
			return b
		}
		if c.Reason == v1.ReasonPendingDatameshJoin && r.Name == t.ReplicaName && step.From == StateNew {
			return b
		}
		if len(b) == errStart {
			b = append(b, " Errors: "...)
		} else {
			b = append(b, ", "...)
		}
		b = append(b, label...)
		b = append(b, " DRBDConfigured/"...)
		b = append(b, c.Reason...)
		if c.Message != "" {
			b = append(b, ": "...)
			b = append(b, c.Message...)
		}
		return b
	}
	return b
}

func (e *Engine) memberByNodeID(id int32) int {
	ms := e.s.st.Datamesh.Members
	for i := range ms {
		if ms[i].NodeID == id {
			return i
		}
	}
	return -1
}

func popcount(x uint32) int {
	n := 0
	for x != 0 {
		x &= x - 1
		n++
	}
	return n
}

// WaitSetOf returns the wait set of the active step of transition ti of rv, as Process
// would compute it from rvrs (for the model checker and for tests). It does not change
// rv. ok is false when there is no such transition, no active step, or its plan is not
// registered.
func (e *Engine) WaitSetOf(rv *v1.ReplicatedVolume, rvrs []*v1.ReplicatedVolumeReplica, ti int) (w WaitSet, ok bool) {
	if rv == nil || ti < 0 || ti >= len(rv.Status.DatameshTransitions) {
		return w, false
	}
	s := &e.s
	s.in = &Input{RV: rv, RVRs: rvrs}
	s.st = &rv.Status
	e.sortRVRs()
	e.index()
	t := &rv.Status.DatameshTransitions[ti]
	p, found := e.planOf(t)
	si := activeStep(t)
	if !found || si < 0 || si >= len(p.Steps) || t.Steps[si].Status != v1.StepActive {
		return w, false
	}
	return e.waitSet(t, &p.Steps[si], t.Steps[si].DatameshRevision), true
}
