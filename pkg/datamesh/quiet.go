package datamesh

import (
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh/layout"
)

// quiet is the steady-state fast path. Most reconciles of a volume find nothing to do:
// the datamesh is formed, no transition runs, every replica is a member of the type it
// asks for, every replica request is done, q/qmr and the effective layout already are
// what the configuration allows, and every attachment is either attached or waiting for
// a slot. Then Process changes nothing and its result follows from the status alone.
//
// quiet checks exactly that, in one pass over the objects, and answers with the result
// the full path would give; at the first fact outside that state it returns ok=false and
// Process runs the full path. It never changes the status. Each condition below is the
// condition under which a phase of the full path does nothing (named in brackets), so the
// two cannot disagree by design; TestQuietMatchesFull and every scenario step (the
// datadriven harness runs the full path beside it and compares) check that they do not.
func (e *Engine) quiet() (Result, bool) {
	s := &e.s
	in, st := s.in, s.st
	ms := st.Datamesh.Members
	// Nothing asked from outside [emergency, changeQuorum], a formed datamesh with no
	// transition [backward, formation], not being deleted [settleLayout, join guards].
	if len(in.ForceLeave) != 0 || len(in.ForceDetach) != 0 || in.ChangeQuorum != nil ||
		in.RV.DeletionTimestamp != nil || st.DatameshRevision <= 0 || len(st.DatameshTransitions) != 0 ||
		len(ms) == 0 || len(ms) > 64 || len(in.RVRs) != len(ms) || st.Configuration == nil {
		return Result{}, false
	}
	// The configuration source resolves to what the status holds [resolveConfiguration];
	// desiredConfiguration validated it.
	if want, ok, _ := desiredConfiguration(in.RV, in.RSC); !ok || !sameConfiguration(st.Configuration, &want) {
		return Result{}, false
	}
	c := st.Configuration
	s.cfg, s.hasCfg = layout.Layout{FTT: int(c.FailuresToTolerate), GMDR: int(c.GuaranteedMinimumDataRedundancy)}, true

	cnt, ok := e.quietReplicas()
	if !ok || !e.quietRequests() {
		return Result{}, false
	}
	// The layout has exactly the replicas it needs and q/qmr/effective are settled
	// [settleLayout: no Create/Delete/Retype; settleQuorum: no ChangeQuorum, no change].
	needD := s.cfg.DiskfulCount()
	if cnt.d != needD || cnt.tb != layout.TieBreakerMin(needD, s.cfg.FTT) {
		return Result{}, false
	}
	q, qmr, next, eff := e.quorumTarget(cnt)
	if q != int(st.Datamesh.Quorum) || qmr != int(st.Datamesh.QuorumMinimumRedundancy) || next != eff ||
		st.EffectiveLayout == nil {
		return Result{}, false
	}
	waiting, ok := e.quietAttachments()
	if !ok {
		return Result{}, false
	}
	return Result{Revision: st.DatameshRevision, Waiting: waiting, Wanted: s.wanted, Attachments: s.atts, Events: s.events}, true
}

// quietReplicas: every RVR is a member (each member matched once), not deleting, of
// the type it asks for [syncRequests: no request to record]. It counts the members for
// settleLayout and records their states in s.memState.
func (e *Engine) quietReplicas() (cnt counts, ok bool) {
	s := &e.s
	ms := s.st.Datamesh.Members
	rvrs := s.in.RVRs
	if cap(s.memState) < len(ms) {
		s.memState = make([]State, len(ms))
	}
	states := s.memState[:len(ms)] // every entry is written: RVRs and members match one to one
	s.memState = states
	var matched uint64
	d, utd, tb := 0, 0, 0
	for j, r := range rvrs {
		mi := j
		if ms[j].Name != r.Name {
			if mi = e.quietFindMember(r.Name); mi < 0 {
				return cnt, false
			}
		}
		bit := uint64(1) << uint(mi)
		if matched&bit != 0 || r.DeletionTimestamp != nil {
			return cnt, false
		}
		matched |= bit
		rs, valid := StateOfReplicaType(r.Spec.Type)
		if !valid || rs != StateOfMember(ms[mi].Type) {
			return cnt, false
		}
		states[mi] = rs
		switch rs {
		case StateD:
			d++
			if upToDate(r) {
				utd++
			}
		case StateTB:
			tb++
		}
	}
	// Every member is settled (no D∅): the voters are the D.
	return counts{voters: d, d: d, upToDateD: utd, tb: tb}, true
}

// quietFindMember finds a member by name through s.nameTab, built on first use in this
// call (RVRs or requests not in member order).
func (e *Engine) quietFindMember(name string) int {
	s := &e.s
	if !s.nameTab.valid {
		s.nameTab.build(s.st.Datamesh.Members, false)
	}
	return s.nameTab.find(name)
}

// quietRequests: the requests are sorted, none is a ForceLeave, each is a replica's
// that exists [syncRequests: nothing to sort, add or remove; membership: nothing open].
func (e *Engine) quietRequests() bool {
	s := &e.s
	ms := s.st.Datamesh.Members
	rs := s.st.DatameshReplicaRequests
	prev := ""
	for i := range rs {
		r := &rs[i]
		if r.Operation == v1.ReplicaOperationForceLeave || (i > 0 && prev > r.Name) {
			return false
		}
		prev = r.Name
		if i < len(ms) && ms[i].Name == r.Name {
			continue
		}
		if e.quietFindMember(r.Name) < 0 {
			return false
		}
	}
	return true
}

// quietAttachments: every served RVA's member is attached, every other RVA's member is
// not and waits for a slot; no attached member is unwanted, multiattach matches the
// served count [attachment: no Attach, Detach or multiattach change]; every Access
// member that is not attached is on a node a live RVA asks for [wantAccessReplicas: no
// Create, no Delete]. It fills s.atts as the full path would.
func (e *Engine) quietAttachments() (waiting, ok bool) {
	s := &e.s
	st := s.st
	ms := st.Datamesh.Members
	if !e.quietServe() {
		return false, false
	}
	attached := 0
	for mi := range ms {
		if ms[mi].Attached {
			attached++
			if !e.servedNode(ms[mi].NodeName) {
				return false, false
			}
		} else if s.memState[mi] == StateA && s.liveMembers&(1<<uint(mi)) == 0 {
			return false, false
		}
	}
	served := len(s.rvaOrd)
	if (served >= 2 && !st.Datamesh.Multiattach) || (served < 2 && st.Datamesh.Multiattach && attached <= 1) {
		return false, false
	}
	waitMsg := msgWaitMax2
	if e.maxAttachments() == 1 {
		waitMsg = msgWaitMax1
	}
	rvas := s.in.RVAs
	if cap(s.atts) < len(rvas) {
		s.atts = make([]AttachmentStatus, 0, len(rvas))
	}
	atts := s.atts[:len(rvas)]
	for i, a := range rvas {
		mi := s.rvaMember[i]
		srv := e.served(i)
		att := mi >= 0 && ms[mi].Attached
		as := &atts[i]
		switch {
		case att && srv:
			*as = AttachmentStatus{Name: a.Name, NodeName: a.Spec.NodeName, Phase: v1.AttachmentAttached, Attached: true, Message: msgAttached}
		case !att && !srv:
			waiting = true
			*as = AttachmentStatus{Name: a.Name, NodeName: a.Spec.NodeName, Phase: v1.AttachmentPending, Message: waitMsg}
		default:
			// Served and not attached (an Attach to start, or a guard to explain; or no
			// member: an Access replica to ask for), or attached and not served.
			return false, false
		}
	}
	s.atts = atts
	return waiting, true
}

// quietServe is serveRVAs for quiet: the same mapping (s.rvaMember: the first member on
// the RVA's node), the same live-member marks and the same served selection (s.rvaOrd:
// attached first, then oldest, then by name, at most maxAttachments), in one tight loop;
// it gives up (false) at an RVA being deleted, which quiet does not handle.
func (e *Engine) quietServe() bool {
	s := &e.s
	rvas := s.in.RVAs
	ms := s.st.Datamesh.Members
	limit := e.maxAttachments()
	s.rvaMember = resizeInts(s.rvaMember, len(rvas))
	s.liveMembers = 0
	ord := s.rvaOrd[:0]
	for i, a := range rvas {
		if a.DeletionTimestamp != nil {
			return false
		}
		mi := e.memberOnNode(a.Spec.NodeName)
		s.rvaMember[i] = mi
		att := false
		if mi >= 0 {
			att = ms[mi].Attached
			s.liveMembers |= 1 << uint(mi)
		}
		pos := len(ord)
		for pos > 0 {
			j := ord[pos-1]
			mj := s.rvaMember[j]
			attj := mj >= 0 && ms[mj].Attached
			if att != attj {
				if !att {
					break // attached ones first (rvaLess's first rule)
				}
			} else if rvaLess(a, rvas[j], att, attj) >= 0 {
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
	return true
}

// servedNode: some served RVA asks for node.
func (e *Engine) servedNode(node string) bool {
	for _, j := range e.s.rvaOrd {
		if e.s.in.RVAs[j].Spec.NodeName == node {
			return true
		}
	}
	return false
}
