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
//	Input.ForceLeave                      → ForceLeave (sticky until it completes; withdrawn
//	                                        if the node is back before the removal started)
//	member without an RVR                 → Leave
//
// A request whose replica has nothing more to ask stays, with its completion message
// ("Joined datamesh successfully"), until the replica asks something else or its RVR is
// gone: that is how completion messages survive (docs/datamesh.md "One Process call"). Requests are kept sorted
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
func (rc *reconcile) transitionOf(name string, membershipOnly bool) int {
	ts := rc.st.DatameshTransitions
	for i := range ts {
		if (!membershipOnly || isMembership(ts[i].Type)) && ts[i].ReplicaName == name {
			return i
		}
	}
	return -1
}

// findRequest returns the index of name's request, or -1. Requests are kept in name
// order (setRequest inserts in place; syncRequests sorts a list written by someone
// else first).
func (rc *reconcile) findRequest(name string) int {
	if i, ok := rc.requestAt(name); ok {
		return i
	}
	return -1
}

// requestAt is where name's request is, or goes to keep the requests in name order.
func (rc *reconcile) requestAt(name string) (int, bool) {
	return slices.BinarySearchFunc(rc.st.DatameshReplicaRequests, name, func(r v1.DatameshReplicaRequest, n string) int { return strings.Compare(r.Name, n) })
}

// setRequest records op for name; an unchanged request keeps its message.
func (rc *reconcile) setRequest(name string, op v1.ReplicaOperation, t v1.ReplicaType) {
	i, ok := rc.requestAt(name)
	if !ok {
		rc.st.DatameshReplicaRequests = slices.Insert(rc.st.DatameshReplicaRequests, i, v1.DatameshReplicaRequest{Name: name, Operation: op, Type: t})
		return
	}
	if r := &rc.st.DatameshReplicaRequests[i]; r.Operation != op || r.Type != t {
		r.Operation, r.Type, r.Message = op, t, ""
	}
}

func (rc *reconcile) removeRequest(i int) {
	rc.st.DatameshReplicaRequests = slices.Delete(rc.st.DatameshReplicaRequests, i, i+1)
}

// setRequestMessage sets the message of name's request, when there is one.
func (rc *reconcile) setRequestMessage(name, msg string) {
	if i := rc.findRequest(name); i >= 0 {
		rc.st.DatameshReplicaRequests[i].Message = msg
	}
}

// syncRequests derives the replica requests from the RVRs (see above). It reports
// whether some replica asks for something not done yet (open) and whether some request
// is a ForceLeave.
func (rc *reconcile) syncRequests() (open, anyForce bool) {
	rs := rc.st.DatameshReplicaRequests
	if !slices.IsSortedFunc(rs, compareRequests) {
		slices.SortStableFunc(rs, compareRequests)
	}
	for _, name := range rc.in.ForceLeave {
		if (rc.memberIndex(name) >= 0 || rc.transitionOf(name, true) >= 0) && !rc.forceInFlight(name) && !rc.forceLeaving(name) {
			rc.setRequest(name, v1.ReplicaOperationForceLeave, "")
		}
	}
	rc.withdrawReturnedForceLeaves()
	for _, j := range rc.rvrOrd {
		open = rc.syncReplicaRequest(j) || open
	}
	// A member whose RVR is gone can only leave.
	for mi := range rc.st.Datamesh.Members {
		name := rc.st.Datamesh.Members[mi].Name
		if rc.rvrOfMember(mi) != nil || rc.transitionOf(name, true) >= 0 || rc.forceLeaving(name) {
			continue
		}
		open = true
		rc.setRequest(name, v1.ReplicaOperationLeave, "")
	}
	for i := range rc.st.DatameshReplicaRequests {
		if rc.st.DatameshReplicaRequests[i].Operation == v1.ReplicaOperationForceLeave {
			anyForce, open = true, true
		}
	}
	// Requests of replicas that are gone entirely are history nobody can read.
	rc.st.DatameshReplicaRequests = slices.DeleteFunc(rc.st.DatameshReplicaRequests, func(r v1.DatameshReplicaRequest) bool {
		return rc.rvrIndex(r.Name) < 0 && rc.memberIndex(r.Name) < 0 && rc.transitionOf(r.Name, false) < 0
	})
	return open, anyForce
}

// withdrawReturnedForceLeaves drops the ForceLeave requests whose member's node is back
// before its force removal started: Input.ForceLeave no longer names the member, and
// either its agent reports again (AgentReady is not False) or the request waits only
// because the member holds the last copy (lastCopy). A request is sticky otherwise, but
// a removal that has not started has published nothing: every other member's steps
// still wait for the member (waitSet leaves a force-leaving member out only of its own
// transition's last step, and of a step of the removal itself), so with its agent
// reporting it is a member like any other, which confirms what it runs. Kept, such a
// request would stay for ever — its guard blocked on "member is reachable" once the
// node's peers connect to it again — force-detach the member in every pass (emergency),
// pause every voter transition (pausedByLostVoter) and hold the volume's attachments
// behind it (docs/datamesh.md, "A lost node that comes back"). A removal already
// published (ForceRemoveReplica in flight) is never withdrawn: some survivors may run
// it, and it finishes.
func (rc *reconcile) withdrawReturnedForceLeaves() {
	var back []string // decided before any is dropped: lastCopy reads the requests
	for _, r := range rc.st.DatameshReplicaRequests {
		if r.Operation != v1.ReplicaOperationForceLeave || slices.Contains(rc.in.ForceLeave, r.Name) {
			continue
		}
		mi := rc.memberIndex(r.Name)
		if mi < 0 || rc.forceInFlight(r.Name) {
			continue
		}
		if rvr := rc.rvrOfMember(mi); rvr != nil && !agentNotReady(rvr) || rc.heldAsLastCopy(r.Name) {
			back = append(back, r.Name)
		}
	}
	for _, name := range back {
		if i := rc.findRequest(name); i >= 0 {
			rc.st.DatameshReplicaRequests = slices.Delete(rc.st.DatameshReplicaRequests, i, i+1)
			rc.event(EventNormal, "ForceLeaveWithdrawn", "The node of replica "+name+
				" is back before its force removal started: the replica stays a member of the datamesh")
		}
	}
}

func compareRequests(a, b v1.DatameshReplicaRequest) int { return strings.Compare(a.Name, b.Name) }

// syncReplicaRequest records what RVR j asks of the datamesh and reports whether that
// is not done yet.
func (rc *reconcile) syncReplicaRequest(j int) (open bool) {
	r := rc.in.RVRs[j]
	if rc.forceLeaving(r.Name) {
		return true
	}
	if rc.transitionOf(r.Name, true) >= 0 {
		return false
	}
	mi := rc.memberOfRVR(j)
	deleting := r.DeletionTimestamp != nil
	var op v1.ReplicaOperation
	var t v1.ReplicaType
	switch {
	case mi < 0 && !deleting:
		op, t = v1.ReplicaOperationJoin, r.Spec.Type
	case mi < 0:
		// Deleted before it joined: a Join that never happened is not history.
		if ri := rc.findRequest(r.Name); ri >= 0 && rc.st.DatameshReplicaRequests[ri].Operation == v1.ReplicaOperationJoin {
			rc.removeRequest(ri)
		}
		return false
	case deleting:
		op = v1.ReplicaOperationLeave
	default:
		want, ok := rc.rstate(j)
		if !ok || want == rc.mstate(mi) {
			return false
		}
		op, t = v1.ReplicaOperationChangeType, r.Spec.Type
	}
	rc.setRequest(r.Name, op, t)
	return true
}

func (rc *reconcile) forceInFlight(name string) bool {
	ts := rc.st.DatameshTransitions
	for i := range ts {
		if ts[i].Type == v1.TransitionForceRemoveReplica && ts[i].ReplicaName == name {
			return true
		}
	}
	return false
}
