package datamesh

import (
	"slices"
	"strings"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Replica requests (status.datameshReplicaRequests) are the engine's record of what each
// replica asks of the datamesh and how far that got. They are derived from the replica
// objects, which placement owns:
//
//	RVR not a member, not deleting        → Join(spec.type)
//	RVR member, being deleted             → Leave
//	RVR member, spec.type ≠ member's type → ChangeType(spec.type)
//	Input.ForceLeave                      → ForceLeave (sticky until it completes)
//	member without an RVR                 → Leave
//
// A request whose replica has nothing more to ask stays, with its completion message
// ("Joined datamesh successfully"), until the replica asks something else or its RVR is
// gone: that is how completion messages survive (seed 001 §6). Requests are kept sorted
// by name so the status does not depend on the order of Input.RVRs.

func isMembership(t v1.TransitionType) bool {
	switch t {
	case v1.TransitionAddReplica, v1.TransitionRemoveReplica, v1.TransitionChangeReplicaType, v1.TransitionForceRemoveReplica:
		return true
	}
	return false
}

// transitionOf returns the index of a transition about replica name (membership ones only
// when membershipOnly), or -1.
func (e *Engine) transitionOf(name string, membershipOnly bool) int {
	ts := e.s.st.DatameshTransitions
	for i := range ts {
		if (!membershipOnly || isMembership(ts[i].Type)) && ts[i].ReplicaName == name {
			return i
		}
	}
	return -1
}

func (e *Engine) findRequest(name string, guess int) int {
	rs := e.s.st.DatameshReplicaRequests
	if guess >= 0 && guess < len(rs) && rs[guess].Name == name {
		return guess
	}
	// Kept sorted by name (setRequest inserts in place; syncRequests sorts a list
	// written by someone else once).
	lo, hi := 0, len(rs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if rs[m].Name < name {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(rs) && rs[lo].Name == name {
		return lo
	}
	return -1
}

// setRequest records op for name; an unchanged request keeps its message.
func (e *Engine) setRequest(name string, op v1.ReplicaOperation, t v1.ReplicaType, guess int) int {
	st := e.s.st
	if i := e.findRequest(name, guess); i >= 0 {
		r := &st.DatameshReplicaRequests[i]
		if r.Operation != op || r.Type != t {
			r.Operation, r.Type, r.Message = op, t, ""
			e.markChanged()
		}
		return i
	}
	rs := st.DatameshReplicaRequests
	i, hi := 0, len(rs) // the first request named after name: the list stays sorted
	for i < hi {
		m := int(uint(i+hi) >> 1)
		if rs[m].Name < name {
			i = m + 1
		} else {
			hi = m
		}
	}
	st.DatameshReplicaRequests = slices.Insert(st.DatameshReplicaRequests, i, v1.DatameshReplicaRequest{Name: name, Operation: op, Type: t})
	e.markChanged()
	return i
}

func (e *Engine) removeRequest(i int) {
	st := e.s.st
	st.DatameshReplicaRequests = slices.Delete(st.DatameshReplicaRequests, i, i+1)
	e.markChanged()
}

// setRequestMessage sets the message of name's request from msg, allocating only when it
// changed, and returns the request's message ("" when there is no request).
func (e *Engine) setRequestMessage(name string, msg []byte) string {
	i := e.findRequest(name, -1)
	if i < 0 {
		return ""
	}
	r := &e.s.st.DatameshReplicaRequests[i]
	if r.Message != string(msg) {
		r.Message = string(msg)
		e.markChanged()
	}
	return r.Message
}

func (e *Engine) setRequestMessageString(name, msg string) {
	if i := e.findRequest(name, -1); i >= 0 {
		r := &e.s.st.DatameshReplicaRequests[i]
		if r.Message != msg {
			r.Message = msg
			e.markChanged()
		}
	}
}

// syncRequests derives the replica requests from the RVRs (see above).
func (e *Engine) syncRequests() {
	s := &e.s
	rs := s.st.DatameshReplicaRequests
	for i := 1; i < len(rs); i++ {
		if rs[i-1].Name > rs[i].Name {
			slices.SortStableFunc(rs, func(a, b v1.DatameshReplicaRequest) int { return strings.Compare(a.Name, b.Name) })
			e.markChanged()
			break
		}
	}
	for _, name := range s.in.ForceLeave {
		if (e.memberIndex(name) >= 0 || e.transitionOf(name, true) >= 0) && !e.forceInFlight(name) {
			if i := e.findRequest(name, -1); i < 0 || s.st.DatameshReplicaRequests[i].Operation != v1.ReplicaOperationForceLeave {
				e.setRequest(name, v1.ReplicaOperationForceLeave, "", -1)
			}
		}
	}
	// In name order: requests are sorted by name too, so in the steady state (one
	// request per replica) the k-th request is the k-th replica's.
	nReq, matched := len(s.st.DatameshReplicaRequests), 0
	for k, j := range s.rvrOrd {
		r := s.in.RVRs[j]
		mi := s.rvrMember[j]
		ri := e.findRequest(r.Name, k)
		if ri >= 0 {
			matched++
			if s.st.DatameshReplicaRequests[ri].Operation == v1.ReplicaOperationForceLeave {
				s.openRequests = true
				continue
			}
		}
		if len(s.st.DatameshTransitions) > 0 && e.transitionOf(r.Name, true) >= 0 {
			continue
		}
		deleting := r.DeletionTimestamp != nil
		var op v1.ReplicaOperation
		var t v1.ReplicaType
		switch {
		case mi < 0 && !deleting:
			op, t = v1.ReplicaOperationJoin, r.Spec.Type
		case mi < 0:
			// Deleted before it joined: a Join that never happened is not history.
			if ri >= 0 && s.st.DatameshReplicaRequests[ri].Operation == v1.ReplicaOperationJoin {
				e.removeRequest(ri)
			}
			continue
		case deleting:
			op = v1.ReplicaOperationLeave
		default:
			want, ok := e.rstate(j)
			if !ok || want == e.mstate(mi) {
				continue
			}
			op, t = v1.ReplicaOperationChangeType, r.Spec.Type
		}
		s.openRequests = true
		e.setRequest(r.Name, op, t, k)
	}
	// A member whose RVR is gone can only leave.
	for mi := range s.st.Datamesh.Members {
		if s.memberRVR[mi] >= 0 {
			continue
		}
		name := s.st.Datamesh.Members[mi].Name
		if e.transitionOf(name, true) >= 0 {
			continue
		}
		if ri := e.findRequest(name, -1); ri >= 0 && s.st.DatameshReplicaRequests[ri].Operation == v1.ReplicaOperationForceLeave {
			continue
		}
		s.openRequests = true
		e.setRequest(name, v1.ReplicaOperationLeave, "", -1)
	}
	// Requests of replicas that are gone entirely are history nobody can read. When
	// every request there was before the loop above matched an RVR, there are none: the
	// loop only added requests of RVRs and members (and removed matched ones).
	if matched == nReq {
		for i := range s.st.DatameshReplicaRequests {
			if s.st.DatameshReplicaRequests[i].Operation == v1.ReplicaOperationForceLeave {
				s.anyForce, s.openRequests = true, true
			}
		}
		return
	}
	for i := 0; i < len(s.st.DatameshReplicaRequests); i++ {
		r := &s.st.DatameshReplicaRequests[i]
		if r.Operation == v1.ReplicaOperationForceLeave {
			s.anyForce, s.openRequests = true, true
		}
		g := -1
		if i < len(s.rvrOrd) {
			g = s.rvrOrd[i]
		}
		if e.findRVR(r.Name, g) >= 0 || e.memberIndexGuess(r.Name, i) >= 0 || e.transitionOf(r.Name, false) >= 0 {
			continue
		}
		e.removeRequest(i)
		i--
	}
}

func (e *Engine) forceInFlight(name string) bool {
	ts := e.s.st.DatameshTransitions
	for i := range ts {
		if ts[i].Type == v1.TransitionForceRemoveReplica && ts[i].ReplicaName == name {
			return true
		}
	}
	return false
}
