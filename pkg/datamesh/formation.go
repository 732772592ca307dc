package datamesh

import (
	"slices"
	"strconv"
	"strings"

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
//   - A Diskful member whose disk failed after it took its configuration (it reports
//     Diskless or Failed) can never take part in the day-0 clear, so step 2 would wait
//     for ever: its replica is deleted (Result.Wanted) and the restart above replaces
//     it. Safe because nothing attaches before formation completes, so the volume has
//     never held data (docs/datamesh.md "Formation").
//
// Formation is exclusive: no other transition starts, emergency ones included.

func (rc *reconcile) formationIndex() int {
	ts := rc.st.DatameshTransitions
	for i := range ts {
		if ts[i].Type == v1.TransitionFormation {
			return i
		}
	}
	return -1
}

func (rc *reconcile) formationActive() bool { return rc.formationIndex() >= 0 }

func (rc *reconcile) maybeStartFormation() bool {
	st := rc.st
	if !rc.hasCfg || st.DatameshRevision != 0 || len(st.Datamesh.Members) != 0 || len(st.DatameshTransitions) != 0 {
		return false
	}
	if rc.in.RV.DeletionTimestamp != nil {
		return false
	}
	p, ok := rc.reg.Latest(PlanFormation)
	if !ok {
		return false
	}
	rc.start(p, "")
	return true
}

// formationCandidates picks, in name order, the first ready Diskful and TieBreaker RVRs
// the layout needs (RVR indexes) and returns how many of each it found and why the
// first unready one is not ready.
func (rc *reconcile) formationCandidates() (picked []int, d, tb int, why string) {
	needD := rc.cfg.DiskfulCount()
	needTB := layout.TieBreakerMin(needD, rc.cfg.FTT)
	for _, j := range rc.rvrOrd {
		r := rc.in.RVRs[j]
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
		if msg := rc.joinReady(r, picked); msg != "" {
			if why == "" {
				why = r.Name + ": " + msg
			}
			continue
		}
		*need++
		picked = append(picked, j)
	}
	return picked, d, tb, why
}

// joinReady is the readiness part of the join guards (docs/datamesh.md "Guards"): placement done, addresses
// known, pool available, node eligible and ready, no other member (or pick) on the node.
func (rc *reconcile) joinReady(r *v1.ReplicatedVolumeReplica, picked []int) string {
	if r.Spec.NodeName == "" {
		return "Waiting for placement to choose a node"
	}
	if len(r.Status.Addresses) == 0 {
		return "Waiting for the replica's addresses (status.addresses is empty)"
	}
	for i := range rc.st.Datamesh.Members {
		m := &rc.st.Datamesh.Members[i]
		if m.NodeName == r.Spec.NodeName && m.Name != r.Name {
			return "Node " + r.Spec.NodeName + " already has datamesh member " + m.Name
		}
	}
	for _, j := range picked {
		if o := rc.in.RVRs[j]; o.Spec.NodeName == r.Spec.NodeName {
			return "Node " + r.Spec.NodeName + " already has replica " + o.Name
		}
	}
	pool := rc.in.Pool
	poolName := ""
	if rc.st.Configuration != nil {
		poolName = rc.st.Configuration.StoragePool
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

func (rc *reconcile) formation() (wanted []WantedReplica) {
	ti := rc.formationIndex()
	if ti < 0 {
		return nil
	}
	t := &rc.st.DatameshTransitions[ti]
	p, ok := rc.planOf(t)
	if !ok {
		return nil
	}
	rc.waiting = true
	si := activeStep(t)
	if si > 0 || (si == 0 && t.Steps[0].Status == v1.StepActive) {
		// Published: a member whose replica is going away restarts formation.
		for mi := range rc.st.Datamesh.Members {
			r := rc.rvrOfMember(mi)
			if r == nil || r.DeletionTimestamp != nil {
				rc.restartFormation(ti, rc.st.Datamesh.Members[mi].Name, r != nil && rc.formationDiskFailed(t, mi, r))
				return rc.formation() // and look for replacements at once
			}
		}
		wanted = rc.replaceFailedFormationDisks(ti)
		rc.formationRequestMessages(ti)
		return wanted
	}
	needD := rc.cfg.DiskfulCount()
	needTB := layout.TieBreakerMin(needD, rc.cfg.FTT)
	_, d, tb, why := rc.formationCandidates()
	wanted = rc.wantFormationReplicas(needD, needTB)
	if d < needD || tb < needTB {
		msg := "Waiting for replicas: " + strconv.Itoa(d) + "/" + strconv.Itoa(needD) + " Diskful"
		if needTB > 0 {
			msg += ", " + strconv.Itoa(tb) + "/" + strconv.Itoa(needTB) + " TieBreaker"
		}
		msg += " ready"
		if why != "" {
			msg += "; " + why
		}
		rc.setStepMessage(ti, 0, msg)
		rc.formationRequestMessages(ti)
		return wanted
	}
	rc.publish(ti, p, 0)
	rc.confirm(ti, p, 0)
	rc.formationRequestMessages(ti)
	return wanted
}

// formationPublish adds the replicas formationCandidates picks as members (formation
// publishes right after it found enough of them, from the same input).
func (rc *reconcile) formationPublish() {
	picked, _, _, _ := rc.formationCandidates()
	for _, j := range picked {
		r := rc.in.RVRs[j]
		st, _ := StateOfReplicaType(r.Spec.Type)
		m := v1.DatameshMember{Name: r.Name, Type: st.MemberType(), NodeName: r.Spec.NodeName,
			Addresses: slices.Clone(r.Status.Addresses), NodeID: int32(rc.freeNodeID())}
		if n := rc.in.Pool.FindNode(r.Spec.NodeName); n != nil {
			m.Zone = n.Zone
		}
		rc.st.Datamesh.Members = slices.Insert(rc.st.Datamesh.Members, rc.memberInsertAt(m.Name), m)
	}
	eff := layout.Formed(rc.cfg)
	rc.setEffective(eff)
	c := rc.counts()
	rc.st.Datamesh.Quorum = int32(layout.Quorum(c.voters, eff))
	rc.st.Datamesh.QuorumMinimumRedundancy = int32(layout.QMR(eff))
}

// formationDiskFailed: member mi, a Diskful member of the formation in t whose replica
// is r, took the formation's configuration (so its agent attached the disk) and now
// reports no disk: DRBD detached it after an I/O error (DRBD's on-io-error detach), or
// the disk was taken away. The agent confirms a revision only after its configuration
// ran, so a member still attaching reports an older revision, not this.
func (rc *reconcile) formationDiskFailed(t *v1.DatameshTransition, mi int, r *v1.ReplicatedVolumeReplica) bool {
	m := &rc.st.Datamesh.Members[mi]
	rev := t.Steps[0].DatameshRevision
	if m.Type != v1.MemberTypeDiskful || r.Spec.Type != v1.ReplicaTypeDiskful || rev == 0 || r.Status.DatameshRevision < rev {
		return false
	}
	return r.Status.DiskState == v1.DiskStateDiskless || r.Status.DiskState == v1.DiskStateFailed
}

// replaceFailedFormationDisks asks for the deletion of every Diskful member whose disk
// failed during formation (formationDiskFailed) and says so on the active step. The
// day-0 clear needs every Diskful member Inconsistent and connected (the agent's
// dayZero), and an initial sync needs an UpToDate source, which a formation that
// never cleared does not have: without a replacement the step waits for ever. The
// volume has never held data (no Attach starts before formation completes), so
// forming it again over a new replica loses nothing; the deletion restarts formation
// (restartFormation) on the next pass.
func (rc *reconcile) replaceFailedFormationDisks(ti int) (wanted []WantedReplica) {
	t := &rc.st.DatameshTransitions[ti]
	var failed []string
	for mi := range rc.st.Datamesh.Members {
		if r := rc.rvrOfMember(mi); r != nil && rc.formationDiskFailed(t, mi, r) {
			failed = append(failed, r.Name)
			wanted = append(wanted, WantedReplica{Action: WantDelete, Type: v1.ReplicaTypeDiskful, Replica: r.Name,
				Reason: "its disk failed during formation (it reports " + string(r.Status.DiskState) +
					"); the volume has never held data, so formation starts over with a replacement"})
		}
	}
	if len(failed) > 0 {
		si := activeStep(t)
		rc.setStepMessage(ti, si, "The disk of "+strings.Join(failed, ", ")+" failed during formation: "+
			"replacing it and forming again (the volume has never held data)")
	}
	return wanted
}

func (rc *reconcile) restartFormation(ti int, lost string, diskFailed bool) {
	rc.st.Datamesh.Members = nil
	rc.st.Datamesh.Quorum = 0
	rc.st.Datamesh.QuorumMinimumRedundancy = 0
	rc.st.Datamesh.Multiattach = false
	rc.setEffective(layout.Reset())
	rc.bump()
	t := &rc.st.DatameshTransitions[ti]
	for i := range t.Steps {
		t.Steps[i] = v1.DatameshTransitionStep{Name: t.Steps[i].Name, Status: v1.StepPending}
	}
	if diskFailed {
		t.Steps[0].Message = "Restarted: the disk of replica " + lost + " failed during formation"
		rc.event(EventWarning, "FormationRestarted", "Formation restarted: the disk of replica "+lost+
			" failed before the datamesh was formed; the volume has never held data, so it is formed again with a replacement")
		return
	}
	t.Steps[0].Message = "Restarted: replica " + lost + " was lost during formation"
	rc.event(EventWarning, "FormationRestarted", "Formation restarted: replica "+lost+" was lost before the datamesh was formed")
}

func (rc *reconcile) formationRequestMessages(ti int) {
	t := &rc.st.DatameshTransitions[ti]
	si := activeStep(t)
	if si < 0 {
		return
	}
	for i := range rc.st.DatameshReplicaRequests {
		r := &rc.st.DatameshReplicaRequests[i]
		var msg string
		forming := rc.memberIndex(r.Name) >= 0 ||
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
		}
	}
}

func (rc *reconcile) formationComplete() {
	for i := range rc.st.DatameshReplicaRequests {
		r := &rc.st.DatameshReplicaRequests[i]
		if r.Operation == v1.ReplicaOperationJoin && rc.memberIndex(r.Name) >= 0 {
			r.Message = "Joined datamesh during formation"
		}
	}
	rc.event(EventNormal, "FormationComplete", "Datamesh formed: "+rc.cfg.String()+", q="+
		strconv.Itoa(int(rc.st.Datamesh.Quorum))+", qmr="+strconv.Itoa(int(rc.st.Datamesh.QuorumMinimumRedundancy)))
}

// wantFormationReplicas asks placement for the replicas formation still lacks.
func (rc *reconcile) wantFormationReplicas(needD, needTB int) (wanted []WantedReplica) {
	var d, tb int
	for _, r := range rc.in.RVRs {
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
		wanted = append(wanted, WantedReplica{Action: WantCreate, Type: v1.ReplicaTypeDiskful,
			Reason: "formation of " + rc.cfg.String() + " needs " + strconv.Itoa(needD) + " Diskful"})
	}
	for ; tb < needTB; tb++ {
		wanted = append(wanted, WantedReplica{Action: WantCreate, Type: v1.ReplicaTypeTieBreaker,
			Reason: "formation of " + rc.cfg.String() + " needs " + strconv.Itoa(needTB) + " TieBreaker"})
	}
	return wanted
}
