package datamesh

import (
	"strconv"
	"strings"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// A disk that fails after formation (docs/datamesh.md, "A disk that fails after
// formation"). DRBD detaches a disk after an I/O error (on-io-error detach) and the
// member runs on diskless: a voter with no copy. A formed volume may hold data, so
// formation's rule — delete the replica and form again — does not apply; the failed
// member is replaced add-before-remove, with the guards every removal of a D passes:
//
//   - the layout stops counting the failed member, so it asks placement for a Diskful
//     replica (wantAdds) — only while another Diskful member it is connected to reports
//     an UpToDate copy (connectedCopy): otherwise the failed disk may hold the only
//     current data (a transient error a person repairs by attaching it again), and a
//     new replica would have nothing to sync from;
//   - once the replicas that stay make the layout (the replacement is placed), the
//     failed replica is deleted, or retyped to Access when it is attached (the
//     attached-member strategy: it serves IO through its peers meanwhile);
//   - its RemoveReplica (or D → A) then waits at the guards: FTT until the replacement
//     has been added as a voter, GMDR until enough copies are UpToDate without it
//     (layout.GuardGMDR counts a leaving D that is not UpToDate as no copy lost).
//
// The deletion (or the retype) is the decision's memory: a disk that DRBD attaches
// again later (an adjust does) does not bring the failed replica back into the layout.

// diskFailed: member mi is a Diskful member of a formed datamesh whose disk failed
// after it was attached. Its agent reports (AgentReady is not False: a silent agent's
// report is stale) that DRBD runs it without a disk — Diskless, or Failed on the way
// there — at a revision it confirmed as a Diskful member: no membership transition of
// its own is in flight (a member whose D∅ → D step is unconfirmed is still attaching,
// and one that leaves is going anyway) and it has confirmed some revision. A member
// that is D∅ or another diskless type by design is not a D. Formation has its own rule
// (formationDiskFailed).
func (rc *reconcile) diskFailed(mi int) bool {
	if rc.formationActive() || rc.mstate(mi) != StateD {
		return false
	}
	name := rc.st.Datamesh.Members[mi].Name
	r := rc.rvrOfMember(mi)
	if r == nil || r.DeletionTimestamp != nil || r.Spec.Type != v1.ReplicaTypeDiskful || agentNotReady(r) ||
		rc.forceLeaving(name) || rc.transitionOf(name, true) >= 0 || r.Status.DatameshRevision <= 0 {
		return false
	}
	return r.Status.DiskState == v1.DiskStateDiskless || r.Status.DiskState == v1.DiskStateFailed
}

// replacesFailedDisk: member mi's disk failed (diskFailed) and another member holds an
// UpToDate copy it is connected to (connectedCopy), so the layout replaces it.
func (rc *reconcile) replacesFailedDisk(mi int) bool {
	return rc.diskFailed(mi) && rc.connectedCopy(mi)
}

// connectedCopy: another Diskful (or ShadowDiskful) member that is not force-leaving
// reports an UpToDate disk with its agent ready (lastCopy's rule), and member mi
// reports a Connected connection to it. A copy cut off from mi does not count: DRBD
// keeps an isolated replica UpToDate while the side that holds quorum writes on without
// it (docs/soak.md, Findings), and mi's side may have written on until its disk failed;
// a copy mi is connected to has every write mi's node made since they connected.
func (rc *reconcile) connectedCopy(mi int) bool {
	r := rc.rvrOfMember(mi)
	if r == nil {
		return false
	}
	for k := range rc.st.Datamesh.Members {
		st := rc.mstate(k)
		name := rc.st.Datamesh.Members[k].Name
		if k == mi || st != StateD && st != StateSD || rc.forceLeaving(name) || !upToDate(rc.rvrOfMember(k)) {
			continue
		}
		for _, p := range r.Status.Peers {
			if p.Name == name && p.ConnectionState == "Connected" {
				return true
			}
		}
	}
	return false
}

// failedDisksReplaced names the members whose failed disks the layout replaces, in
// member order.
func (rc *reconcile) failedDisksReplaced() (names []string) {
	for mi := range rc.st.Datamesh.Members {
		if rc.replacesFailedDisk(mi) {
			names = append(names, rc.st.Datamesh.Members[mi].Name)
		}
	}
	return names
}

// removeFailedDisks asks, once the replicas that stay make the layout's Diskful count
// (d, counted without the failed members: the replacements are placed), for the
// deletion of each member whose failed disk is replaced — or its retype to Access when
// it is attached. The guards of its removal then hold it until the replacement is a
// voter and enough copies are UpToDate (docs/datamesh.md, "A disk that fails after
// formation").
func (rc *reconcile) removeFailedDisks(d int, failed []string, wanted []WantedReplica) []WantedReplica {
	if len(failed) == 0 || d < rc.cfg.DiskfulCount() {
		return wanted
	}
	for _, name := range failed {
		mi := rc.memberIndex(name)
		m := &rc.st.Datamesh.Members[mi]
		disk := string(rc.rvrOfMember(mi).Status.DiskState)
		why := "the disk of " + name + " failed (it reports " + disk + ") and a replacement Diskful is placed; "
		once := " once the replacement is a voter and enough copies are UpToDate without it"
		if m.Attached {
			wanted = append(wanted, WantedReplica{Action: WantRetype, Type: v1.ReplicaTypeAccess, Replica: name,
				Reason: why + name + " is attached, so it becomes Access (it serves IO through its peers)" + once})
			rc.event(EventWarning, "DiskFailed", "The disk of "+name+" on node "+m.NodeName+" failed (it reports "+disk+
				"): a new Diskful replica replaces it, and "+name+", attached, becomes Access"+once)
			continue
		}
		wanted = append(wanted, WantedReplica{Action: WantDelete, Type: v1.ReplicaTypeDiskful, Replica: name, Reason: why + name + " leaves" + once})
		rc.event(EventWarning, "DiskFailed", "The disk of "+name+" on node "+m.NodeName+" failed (it reports "+disk+
			"): a new Diskful replica replaces it, and "+name+" leaves"+once)
	}
	return wanted
}

// failedDiskLeaving: member mi is a D whose replica leaves the Diskful type (deleted or
// retyped) while its agent reports no disk: the removal of a failed disk, which the
// guards hold until its replacement has joined, and the request's message says so.
func (rc *reconcile) failedDiskLeaving(mi int) bool {
	r := rc.rvrOfMember(mi)
	return r != nil && rc.mstate(mi) == StateD && !agentNotReady(r) &&
		(r.DeletionTimestamp != nil || r.Spec.Type != v1.ReplicaTypeDiskful) &&
		(r.Status.DiskState == v1.DiskStateDiskless || r.Status.DiskState == v1.DiskStateFailed)
}

// failedDiskNote is what wantAdds adds to the reason of the Diskful replicas it asks for
// when failed disks are being replaced.
func failedDiskNote(failed []string) string {
	if len(failed) == 0 {
		return ""
	}
	return "; it replaces " + strings.Join(failed, ", ") + ", whose disk failed (" + strconv.Itoa(len(failed)) + " failed Diskful not counted)"
}

// DiskFailure is the engine's verdict on a Diskful member whose disk failed after
// formation, for the volume's conditions (docs/datamesh.md, "A disk that fails after
// formation").
type DiskFailure uint8

const (
	// DiskNotFailed: the member's disk did not fail (or the member is not a formed
	// datamesh's Diskful member, or the report is not current).
	DiskNotFailed DiskFailure = iota
	// DiskFailedReplacing: the disk failed and another member holds an UpToDate copy:
	// the layout replaces the member.
	DiskFailedReplacing
	// DiskFailedLastCopy: the disk failed and no other member connected to it reports
	// an UpToDate copy: the failed disk may hold the only current data, so nothing is
	// replaced or removed until such a copy exists or the disk is attached again.
	DiskFailedLastCopy
)

// FailedDisk judges member name of rv's datamesh with the rules Process applies
// (diskFailed, connectedCopy), reading only rv's status and the replicas. A member whose
// replica is already being deleted, or retyped out of Diskful, for its failed disk is
// DiskFailedReplacing too.
func FailedDisk(rv *v1.ReplicatedVolume, rvrs []*v1.ReplicatedVolumeReplica, name string) DiskFailure {
	rc := &reconcile{in: &Input{RV: rv, RVRs: rvrs}, st: &rv.Status}
	mi := rc.memberIndex(name)
	if mi < 0 || rc.formationActive() {
		return DiskNotFailed
	}
	if rc.failedDiskLeaving(mi) {
		return DiskFailedReplacing
	}
	switch {
	case !rc.diskFailed(mi):
		return DiskNotFailed
	case !rc.connectedCopy(mi):
		return DiskFailedLastCopy
	}
	return DiskFailedReplacing
}
