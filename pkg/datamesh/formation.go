package datamesh

import (
	"slices"
	"strconv"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh/layout"
)

// Formation builds the first datamesh of a volume (docs/datamesh.md "Formation"):
//
//   - It starts when the volume has a configuration and has never published a datamesh
//     (revision 0, no members). From then on the configuration is frozen until it ends.
//   - Step 1 "✦ → layout" waits until placement has created the exact replica set of the
//     configuration (DiskfulCount Diskful + TieBreakerMin TieBreaker RVRs, each with a
//     node, addresses, on a ready eligible node of the pool), then publishes all of them
//     at once as D and TB, with q = Quorum(D, configuration), qmr = GMDR+1 and the
//     effective layout = the configuration. All members confirm.
//   - Step 2 "D → UpToDate" publishes nothing and waits for every D to be UpToDate. The
//     day-0 sync skip is the agent's decision: it sees a datamesh formed at this revision
//     with no UpToDate member and creates fresh, identical metadata on every D.
//   - Restart: if a member's RVR is deleted or vanishes before formation ends, the
//     datamesh is torn down (members cleared, q/qmr 0, effective layout reset to zero, one
//     revision so agents unconfigure) and step 1 starts over with a replacement.
//
// Formation is exclusive: no other transition starts, emergency ones included.

func (e *Engine) formationIndex() int {
	ts := e.s.st.DatameshTransitions
	for i := range ts {
		if ts[i].Type == v1.TransitionFormation {
			return i
		}
	}
	return -1
}

func (e *Engine) formationActive() bool { return e.formationIndex() >= 0 }

func (e *Engine) maybeStartFormation() bool {
	st := e.s.st
	if !e.s.hasCfg || st.DatameshRevision != 0 || len(st.Datamesh.Members) != 0 || len(st.DatameshTransitions) != 0 {
		return false
	}
	if e.s.in.RV.DeletionTimestamp != nil {
		return false
	}
	p, ok := e.reg.Latest(PlanFormation)
	if !ok {
		return false
	}
	e.start(p, "")
	return true
}

// formationCandidates picks, in name order, the first ready Diskful and TieBreaker RVRs
// the layout needs into e.s.rvaOrd (reused scratch) and returns how many of each it found
// and why the first unready one is not ready.
func (e *Engine) formationCandidates() (d, tb int, why string) {
	s := &e.s
	needD := s.cfg.DiskfulCount()
	needTB := layout.TieBreakerMin(needD, s.cfg.FTT)
	order := s.rvaOrd[:0]
	for j := range s.in.RVRs {
		order = append(order, j)
	}
	slices.SortFunc(order, func(a, b int) int {
		na, nb := s.in.RVRs[a].Name, s.in.RVRs[b].Name
		switch {
		case na < nb:
			return -1
		case na > nb:
			return 1
		}
		return 0
	})
	picked := order[:0]
	for _, j := range order {
		r := s.in.RVRs[j]
		if r.DeletionTimestamp != nil {
			continue
		}
		var need *int
		var limit int
		switch r.Spec.Type {
		case v1.ReplicaTypeDiskful:
			need, limit = &d, needD
		case v1.ReplicaTypeTieBreaker:
			need, limit = &tb, needTB
		default:
			continue
		}
		if *need >= limit {
			continue
		}
		if msg := e.joinReady(r, picked); msg != "" {
			if why == "" {
				why = r.Name + ": " + msg
			}
			continue
		}
		*need++
		picked = append(picked, j)
	}
	s.rvaOrd = picked
	return d, tb, why
}

// joinReady is the readiness part of the join guards (seed 001): placement done, addresses
// known, pool available, node eligible and ready, no other member (or pick) on the node.
func (e *Engine) joinReady(r *v1.ReplicatedVolumeReplica, picked []int) string {
	s := &e.s
	if r.Spec.NodeName == "" {
		return "Waiting for placement to choose a node"
	}
	if len(r.Status.Addresses) == 0 {
		return "Waiting for the replica's addresses (status.addresses is empty)"
	}
	for i := range s.st.Datamesh.Members {
		m := &s.st.Datamesh.Members[i]
		if m.NodeName == r.Spec.NodeName && m.Name != r.Name {
			return "Node " + r.Spec.NodeName + " already has datamesh member " + m.Name
		}
	}
	for _, j := range picked {
		if o := s.in.RVRs[j]; o.Spec.NodeName == r.Spec.NodeName {
			return "Node " + r.Spec.NodeName + " already has replica " + o.Name
		}
	}
	pool := s.in.Pool
	poolName := ""
	if s.st.Configuration != nil {
		poolName = s.st.Configuration.StoragePool
	}
	if pool == nil || !pool.Available || (poolName != "" && pool.Name != poolName) {
		return "Storage pool " + strconv.Quote(poolName) + " is not available"
	}
	n := pool.FindNode(r.Spec.NodeName)
	if n == nil {
		return "Node " + r.Spec.NodeName + " is not an eligible node of storage pool " + strconv.Quote(poolName)
	}
	if !n.Ready {
		return "Node " + r.Spec.NodeName + " is not ready in storage pool " + strconv.Quote(poolName)
	}
	return ""
}

func (e *Engine) formation() {
	s := &e.s
	ti := e.formationIndex()
	if ti < 0 {
		return
	}
	t := &s.st.DatameshTransitions[ti]
	p, ok := e.planOf(t)
	if !ok {
		return
	}
	s.waiting = true
	si := activeStep(t)
	if si > 0 || (si == 0 && t.Steps[0].Status == v1.StepActive) {
		// Published: a member whose replica is going away restarts formation.
		for mi := range s.st.Datamesh.Members {
			r := e.rvrOfMember(mi)
			if r == nil || r.DeletionTimestamp != nil {
				e.restartFormation(ti, s.st.Datamesh.Members[mi].Name)
				e.formation() // and look for replacements at once
				return
			}
		}
		e.formationRequestMessages(ti)
		return
	}
	needD := s.cfg.DiskfulCount()
	needTB := layout.TieBreakerMin(needD, s.cfg.FTT)
	d, tb, why := e.formationCandidates()
	e.wantFormationReplicas(needD, needTB)
	if d < needD || tb < needTB {
		msg := "Waiting for replicas: " + strconv.Itoa(d) + "/" + strconv.Itoa(needD) + " Diskful"
		if needTB > 0 {
			msg += ", " + strconv.Itoa(tb) + "/" + strconv.Itoa(needTB) + " TieBreaker"
		}
		msg += " ready"
		if why != "" {
			msg += "; " + why
		}
		e.setStepMessage(ti, 0, msg)
		e.formationRequestMessages(ti)
		return
	}
	e.publish(ti, p, 0)
	e.confirm(ti, p, 0)
	e.formationRequestMessages(ti)
}

// formationPublish adds the picked replicas (formationCandidates) as members.
func (e *Engine) formationPublish() {
	s := &e.s
	for _, j := range s.rvaOrd {
		r := s.in.RVRs[j]
		st, _ := StateOfReplicaType(r.Spec.Type)
		m := v1.DatameshMember{Name: r.Name, Type: st.MemberType(), NodeName: r.Spec.NodeName,
			Addresses: slices.Clone(r.Status.Addresses), NodeID: int32(e.freeNodeID())}
		if n := s.in.Pool.FindNode(r.Spec.NodeName); n != nil {
			m.Zone = n.Zone
		}
		s.st.Datamesh.Members = slices.Insert(s.st.Datamesh.Members, e.memberInsertAt(m.Name), m)
	}
	e.index()
	eff := layout.Formed(s.cfg)
	e.setEffective(eff)
	c := e.counts()
	s.st.Datamesh.Quorum = int32(layout.Quorum(c.voters, eff))
	s.st.Datamesh.QuorumMinimumRedundancy = int32(layout.QMR(eff))
}

func (e *Engine) restartFormation(ti int, lost string) {
	s := &e.s
	s.st.Datamesh.Members = nil
	s.st.Datamesh.Quorum = 0
	s.st.Datamesh.QuorumMinimumRedundancy = 0
	s.st.Datamesh.Multiattach = false
	e.index()
	e.setEffective(layout.Reset())
	e.bump()
	t := &s.st.DatameshTransitions[ti]
	for i := range t.Steps {
		t.Steps[i] = v1.DatameshTransitionStep{Name: t.Steps[i].Name, Status: v1.StepPending}
	}
	t.Steps[0].Message = "Restarted: replica " + lost + " was lost during formation"
	e.event(EventWarning, "FormationRestarted", "Formation restarted: replica "+lost+" was lost before the datamesh was formed")
}

func (e *Engine) formationRequestMessages(ti int) {
	s := &e.s
	t := &s.st.DatameshTransitions[ti]
	si := activeStep(t)
	if si < 0 {
		return
	}
	for i := range s.st.DatameshReplicaRequests {
		r := &s.st.DatameshReplicaRequests[i]
		var msg string
		forming := e.memberIndex(r.Name) >= 0 ||
			(si == 0 && r.Operation == v1.ReplicaOperationJoin && (r.Type == v1.ReplicaTypeDiskful || r.Type == v1.ReplicaTypeTieBreaker))
		switch {
		case forming:
			msg = "Forming datamesh, step " + strconv.Itoa(si+1) + "/" + strconv.Itoa(len(t.Steps)) + " (" + t.Steps[si].Name + "): " + t.Steps[si].Message
		case r.Operation == v1.ReplicaOperationJoin:
			msg = "Waiting for formation to complete"
		default:
			continue
		}
		if r.Message != msg {
			r.Message = msg
			e.markChanged()
		}
	}
}

func (e *Engine) formationComplete() {
	s := &e.s
	for i := range s.st.DatameshReplicaRequests {
		r := &s.st.DatameshReplicaRequests[i]
		if r.Operation == v1.ReplicaOperationJoin && e.memberIndex(r.Name) >= 0 {
			r.Message = "Joined datamesh during formation"
		}
	}
	e.event(EventNormal, "FormationComplete", "Datamesh formed: "+s.cfg.String()+", q="+
		strconv.Itoa(int(s.st.Datamesh.Quorum))+", qmr="+strconv.Itoa(int(s.st.Datamesh.QuorumMinimumRedundancy)))
}

// wantFormationReplicas asks placement for the replicas formation still lacks.
func (e *Engine) wantFormationReplicas(needD, needTB int) {
	var d, tb int
	for _, r := range e.s.in.RVRs {
		if r.DeletionTimestamp != nil {
			continue
		}
		switch r.Spec.Type {
		case v1.ReplicaTypeDiskful:
			d++
		case v1.ReplicaTypeTieBreaker:
			tb++
		}
	}
	for ; d < needD; d++ {
		e.s.wanted = append(e.s.wanted, WantedReplica{Action: WantCreate, Type: v1.ReplicaTypeDiskful,
			Reason: "formation of " + e.s.cfg.String() + " needs " + strconv.Itoa(needD) + " Diskful"})
	}
	for ; tb < needTB; tb++ {
		e.s.wanted = append(e.s.wanted, WantedReplica{Action: WantCreate, Type: v1.ReplicaTypeTieBreaker,
			Reason: "formation of " + e.s.cfg.String() + " needs " + strconv.Itoa(needTB) + " TieBreaker"})
	}
}
