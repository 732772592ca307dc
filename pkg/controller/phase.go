package controller

import (
	"slices"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh"
	"github.com/meshvol/meshvol/pkg/datamesh/layout"
)

// The phase machine (docs/controller.md, "Phases"): every phase has one rule, every rule
// reads only what the status and the replicas report, so the phase is a function and not
// a memory:
//
//	Deleting       the RV has a deletionTimestamp, whatever else holds
//	Pending        no configuration yet, or formation has not started (placement,
//	               allocation or the pool hold it: the other conditions say which)
//	Forming        the Formation transition runs
//	Failed         formed, and no member reports quorum, or no UpToDate Diskful copy is
//	               reachable (every reporting D is something else, or no agent reports)
//	Degraded       formed, usable, fewer UpToDate Diskful than the layout wants (a member
//	               is syncing, not reporting, force-removed, or not placed yet)
//	Reconfiguring  formed, every wanted copy UpToDate, transitions still in flight
//	Ready          formed, the layout's Diskful all UpToDate, nothing in flight
//
// Ready is also a condition (type Ready) whose reason is the phase and whose message
// names the replicas and why.

// Formed is the Formed condition's status, reason and message: True once the first
// datamesh is in place (a published revision with members, no Formation transition in
// flight), the rule the CSI controller service waits on in CreateVolume
// (docs/contract.md "CSI"); while not, the reason is the phase and the message the
// Ready condition's, which says what formation waits for. Its True message names no
// revision, so the condition changes once, when the volume forms.
func Formed(st *v1.ReplicatedVolumeStatus, verdict PhaseVerdict) (bool, string, string) {
	forming := slices.ContainsFunc(st.DatameshTransitions, func(t v1.DatameshTransition) bool { return t.Type == v1.TransitionFormation })
	if !forming && st.DatameshRevision > 0 && len(st.Datamesh.Members) > 0 {
		return true, v1.ReasonFormed, "The first datamesh is in place"
	}
	return false, string(verdict.Phase), verdict.Message
}

// PhaseVerdict is the phase with the Ready condition's reason and message.
type PhaseVerdict struct {
	Phase   v1.VolumePhase
	Message string
}

// ComputePhase judges a volume. reporting(name) says whether the replica's agent is
// reporting (AgentReady not False); rvrs maps replica names to replicas.
func ComputePhase(rv *v1.ReplicatedVolume, rvrs map[string]*v1.ReplicatedVolumeReplica, reporting func(*v1.ReplicatedVolumeReplica) bool, pendingWhy string) PhaseVerdict {
	st := &rv.Status
	if rv.DeletionTimestamp != nil {
		return PhaseVerdict{Phase: v1.VolumePhaseDeleting, Message: "The volume is being deleted"}
	}
	if msg, ok := forming(st); ok {
		return PhaseVerdict{Phase: v1.VolumePhaseForming, Message: msg}
	}
	if st.Configuration == nil || len(st.Datamesh.Members) == 0 {
		if st.DatameshRevision > 0 && st.Configuration != nil {
			return PhaseVerdict{Phase: v1.VolumePhaseFailed, Message: "The datamesh has no members left: every copy was force-removed"}
		}
		if pendingWhy == "" {
			pendingWhy = "Waiting for the configuration and the first replicas"
		}
		return PhaseVerdict{Phase: v1.VolumePhasePending, Message: pendingWhy}
	}
	cfg := layout.Layout{FTT: int(st.Configuration.FailuresToTolerate), GMDR: int(st.Configuration.GuaranteedMinimumDataRedundancy)}
	need := cfg.DiskfulCount()
	h := judgeMembers(st.Datamesh.Members, rvrs, reporting, failedDiskNotes(rv, rvrs))
	detail := ""
	if len(h.problems) > 0 {
		detail = ": " + strings.Join(h.problems, "; ")
	}
	upToDate := strconv.Itoa(h.upToDate) + "/" + strconv.Itoa(need) + " Diskful UpToDate (layout " + cfg.String() + ")"
	switch {
	case !h.anyReporting:
		return PhaseVerdict{Phase: v1.VolumePhaseFailed, Message: "No replica's agent is reporting" + detail}
	case h.upToDate == 0:
		return PhaseVerdict{Phase: v1.VolumePhaseFailed, Message: "No UpToDate Diskful copy is reachable" + detail}
	case h.anyQuorumReport && !h.anyQuorate:
		return PhaseVerdict{Phase: v1.VolumePhaseFailed, Message: "No replica has quorum" + detail}
	case h.upToDate < need:
		return PhaseVerdict{Phase: v1.VolumePhaseDegraded, Message: upToDate + detail}
	case len(st.DatameshTransitions) > 0:
		return PhaseVerdict{Phase: v1.VolumePhaseReconfiguring, Message: "In flight: " + inFlight(st.DatameshTransitions)}
	}
	return PhaseVerdict{Phase: v1.VolumePhaseReady, Message: upToDate}
}

// forming: the Formation transition runs; msg names its first step not completed.
func forming(st *v1.ReplicatedVolumeStatus) (msg string, ok bool) {
	for i := range st.DatameshTransitions {
		t := &st.DatameshTransitions[i]
		if t.Type != v1.TransitionFormation {
			continue
		}
		msg := "Forming the datamesh"
		for _, s := range t.Steps {
			if s.Status != v1.StepCompleted {
				msg += ": " + s.Name
				if s.Message != "" {
					msg += ": " + s.Message
				}
				break
			}
		}
		return msg, true
	}
	return "", false
}

// memberHealth is what the members' replicas report, as the phase rules read it.
type memberHealth struct {
	upToDate int      // Diskful members whose disk is UpToDate
	problems []string // sorted, "r2: Inconsistent (syncing 40%)"
	// anyQuorumReport: some member that takes part in quorum reports it; anyQuorate: one
	// reports it has quorum.
	anyQuorumReport, anyQuorate bool
	anyReporting                bool // some member's agent reports
}

// notes (may be nil) adds what is done about a member's state, by name.
func judgeMembers(members []v1.DatameshMember, rvrs map[string]*v1.ReplicatedVolumeReplica, reporting func(*v1.ReplicatedVolumeReplica) bool, notes map[string]string) memberHealth {
	var h memberHealth
	for _, m := range members {
		r := rvrs[m.Name]
		switch {
		case r == nil:
			if m.Type.IsVoter() {
				h.problems = append(h.problems, m.Name+": replica object is gone")
			}
			continue
		case !reporting(r):
			h.problems = append(h.problems, m.Name+": agent on "+m.NodeName+" is not reporting")
			continue
		}
		h.anyReporting = true
		if r.Status.Quorum != nil && (m.Type.IsVoter() || m.Type == v1.MemberTypeTieBreaker || m.Type == v1.MemberTypeAccess) {
			h.anyQuorumReport = true
			h.anyQuorate = h.anyQuorate || *r.Status.Quorum
		}
		if m.Type != v1.MemberTypeDiskful {
			if m.Type == v1.MemberTypeLiminalDiskful {
				h.problems = append(h.problems, m.Name+": joining as Diskful")
			}
			continue
		}
		if r.Status.DiskState == v1.DiskStateUpToDate {
			h.upToDate++
			continue
		}
		p := m.Name + ": " + string(orUnknown(r.Status.DiskState))
		if pct, ok := resyncPercent(r); ok {
			p += " (syncing " + strconv.Itoa(int(pct)) + "%)"
		}
		h.problems = append(h.problems, p+notes[m.Name])
	}
	sort.Strings(h.problems)
	return h
}

// failedDiskNotes says, for each Diskful member whose disk failed after formation, what
// the engine does about it (datamesh.FailedDisk; docs/datamesh.md, "A disk that fails
// after formation"): it is replaced, or it is not, because it may hold the only current
// copy. A replacement placement cannot place says why (the Scheduled condition).
func failedDiskNotes(rv *v1.ReplicatedVolume, rvrs map[string]*v1.ReplicatedVolumeReplica) map[string]string {
	list := make([]*v1.ReplicatedVolumeReplica, 0, len(rvrs))
	for _, r := range rvrs {
		list = append(list, r)
	}
	var notes map[string]string
	for _, m := range rv.Status.Datamesh.Members {
		note := ""
		switch datamesh.FailedDisk(rv, list, m.Name) {
		case datamesh.DiskFailedReplacing:
			note = " (its disk failed: replacing it)"
			if c := meta.FindStatusCondition(rv.Status.Conditions, v1.ConditionScheduled); c != nil && meta.IsStatusConditionFalse(rv.Status.Conditions, v1.ConditionScheduled) {
				note = " (its disk failed: replacing it once a node fits: " + c.Message + ")"
			}
		case datamesh.DiskFailedLastCopy:
			note = " " + lastCopyDiskNote
		default:
			continue
		}
		if notes == nil {
			notes = map[string]string{}
		}
		notes[m.Name] = note
	}
	return notes
}

// lastCopyDiskNote follows a member whose disk failed while no other Diskful connected
// to it is UpToDate: it is neither replaced nor removed.
const lastCopyDiskNote = "(its disk failed and is not replaced: no other Diskful connected to it is UpToDate, so it may hold the only current copy; " +
	"attach its disk again, or bring another copy UpToDate)"

// lastCopyDiskEvents are the Warning events for the members whose failed disk the Ready
// condition newly says is not replaced (lastCopyDiskNote): a person is the one who can
// attach the disk again or bring another copy back, and the condition alone reaches
// nobody (docs/controller.md, "Write budget": Events only where a person needs them, so
// one per failure, when the condition first says it).
func lastCopyDiskEvents(old, work *v1.ReplicatedVolume, rvrs map[string]*v1.ReplicatedVolumeReplica) []datamesh.Event {
	before := ""
	if c := meta.FindStatusCondition(old.Status.Conditions, v1.ConditionReady); c != nil {
		before = c.Message
	}
	var out []datamesh.Event
	notes := failedDiskNotes(work, rvrs)
	for _, m := range work.Status.Datamesh.Members {
		if notes[m.Name] != " "+lastCopyDiskNote {
			continue
		}
		r := rvrs[m.Name]
		if strings.Contains(before, m.Name+": "+string(v1.DiskStateDiskless)+" "+lastCopyDiskNote) ||
			strings.Contains(before, m.Name+": "+string(v1.DiskStateFailed)+" "+lastCopyDiskNote) {
			continue // said already, whichever of the two the agent reported then
		}
		out = append(out, datamesh.Event{Type: datamesh.EventWarning, Reason: EventDiskFailedNotReplaced,
			Message: "The disk of " + m.Name + " on node " + m.NodeName + " failed (it reports " + string(r.Status.DiskState) + ") and it is not replaced: " +
				"no other Diskful connected to it is UpToDate, so it may hold the only current copy; attach its disk again, or bring another copy UpToDate"})
	}
	return out
}

// inFlight names the transitions, "Attach r1, Formation".
func inFlight(ts []v1.DatameshTransition) string {
	names := make([]string, 0, len(ts))
	for _, t := range ts {
		n := string(t.Type)
		if t.ReplicaName != "" {
			n += " " + t.ReplicaName
		}
		names = append(names, n)
	}
	return strings.Join(names, ", ")
}

func orUnknown(d v1.DiskState) v1.DiskState {
	if d == "" {
		return "no disk state reported"
	}
	return d
}

// resyncPercent is the least progress among the replica's resyncs.
func resyncPercent(r *v1.ReplicatedVolumeReplica) (int32, bool) {
	best, ok := int32(101), false
	for _, p := range r.Status.Peers {
		if p.Resync != nil && p.Resync.PercentDone < best {
			best, ok = p.Resync.PercentDone, true
		}
	}
	return best, ok
}

// LayoutString describes the members for `kubectl get rv`: "3D", "2D+1TB", "2D+1TB+1A".
func LayoutString(ms []v1.DatameshMember) string {
	counts := map[string]int{}
	for _, m := range ms {
		switch m.Type {
		case v1.MemberTypeDiskful, v1.MemberTypeLiminalDiskful:
			counts["D"]++
		case v1.MemberTypeShadowDiskful, v1.MemberTypeLiminalShadowDiskful:
			counts["sD"]++
		case v1.MemberTypeTieBreaker:
			counts["TB"]++
		case v1.MemberTypeAccess:
			counts["A"]++
		}
	}
	var parts []string
	for _, k := range []string{"D", "sD", "TB", "A"} {
		if counts[k] > 0 {
			parts = append(parts, strconv.Itoa(counts[k])+k)
		}
	}
	return strings.Join(parts, "+")
}

// ReadyMembers is "<in sync>/<members>": a Diskful member is in sync when UpToDate, any
// other when its agent reports having applied some revision.
func ReadyMembers(ms []v1.DatameshMember, rvrs map[string]*v1.ReplicatedVolumeReplica, reporting func(*v1.ReplicatedVolumeReplica) bool) string {
	n := 0
	for _, m := range ms {
		r := rvrs[m.Name]
		if r == nil || !reporting(r) {
			continue
		}
		if m.Type.HasDisk() {
			if r.Status.DiskState == v1.DiskStateUpToDate {
				n++
			}
		} else if r.Status.DatameshRevision > 0 {
			n++
		}
	}
	return strconv.Itoa(n) + "/" + strconv.Itoa(len(ms))
}

// SyncProgress is the least-synced Diskful member's progress: "100%" when all are
// UpToDate, "" before any member exists.
func SyncProgress(ms []v1.DatameshMember, rvrs map[string]*v1.ReplicatedVolumeReplica) string {
	if len(ms) == 0 {
		return ""
	}
	least := int32(100)
	for _, m := range ms {
		if !m.Type.HasDisk() {
			continue
		}
		r := rvrs[m.Name]
		if r == nil || r.Status.DiskState == v1.DiskStateUpToDate {
			continue
		}
		pct, ok := resyncPercent(r)
		if !ok {
			pct = 0
		}
		least = min(least, pct)
	}
	return strconv.Itoa(int(least)) + "%"
}

// ConditionFaultTolerance is the RV condition that says whether the datamesh gives the
// protection the configuration asks for: True when the effective layout (what q and
// qmr are computed from) equals the configured FTT and GMDR, False with what is traded
// and until when otherwise — after a confirmed loss, the layout lowers q so that the
// survivors keep writing (2D+1TB's lone survivor writes with q=1, docs/layouts.md §5,
// "After a confirmed loss").
const ConditionFaultTolerance = "FaultTolerance"

// Reasons of the FaultTolerance condition.
const (
	ReasonAsConfigured       = "AsConfigured"
	ReasonBelowConfiguration = "BelowConfiguration"
)

// FaultTolerance is the FaultTolerance condition's status, reason and message; ok is
// false with an empty reason before the first datamesh (nothing to say yet).
func FaultTolerance(st *v1.ReplicatedVolumeStatus) (ok bool, reason, msg string) {
	if st.Configuration == nil || st.EffectiveLayout == nil || len(st.Datamesh.Members) == 0 {
		return false, "", ""
	}
	eff, cfg := st.EffectiveLayout, st.Configuration
	dm := &st.Datamesh
	voters, tb := 0, 0
	for _, m := range dm.Members {
		switch {
		case m.Type.IsVoter():
			voters++
		case m.Type == v1.MemberTypeTieBreaker:
			tb++
		}
	}
	want := layout.Layout{FTT: int(cfg.FailuresToTolerate), GMDR: int(cfg.GuaranteedMinimumDataRedundancy)}
	now := strconv.Itoa(voters) + " Diskful voter(s)"
	if tb > 0 {
		now += " + " + strconv.Itoa(tb) + " TieBreaker"
	}
	now += ", q=" + strconv.Itoa(int(dm.Quorum)) + ", qmr=" + strconv.Itoa(int(dm.QuorumMinimumRedundancy))
	if eff.FailuresToTolerate >= cfg.FailuresToTolerate && eff.GuaranteedMinimumDataRedundancy >= cfg.GuaranteedMinimumDataRedundancy {
		return true, ReasonAsConfigured, "Tolerates FTT=" + strconv.Itoa(int(eff.FailuresToTolerate)) + " failure(s) with GMDR=" +
			strconv.Itoa(int(eff.GuaranteedMinimumDataRedundancy)) + " extra copy(ies), as configured (" + now + ")"
	}
	msg = "Tolerates FTT=" + strconv.Itoa(int(eff.FailuresToTolerate)) + ", GMDR=" + strconv.Itoa(int(eff.GuaranteedMinimumDataRedundancy)) +
		" where the configuration asks for FTT=" + strconv.Itoa(want.FTT) + ", GMDR=" + strconv.Itoa(want.GMDR) + " (" + now + ")"
	if eff.FailuresToTolerate == 0 {
		msg += ": the datamesh keeps writing with the members it has, and one more failure stops IO"
		if voters == 1 {
			msg += "; the one Diskful holds the only copy"
		}
	}
	return false, ReasonBelowConfiguration, msg + ". Restored when the layout's " + want.String() +
		" members have joined again (q and qmr rise with them)"
}
