package datamesh

import (
	"errors"
	"slices"
	"strings"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh/layout"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// reconcile is one Process call: the input, the status it writes, and what the call
// derived from them (the configuration, the replicas' name order). It lives for the
// call only; nothing of it is kept between calls. Members and replicas are found by
// name with a scan: a datamesh has at most 32 members, and there is no index to keep
// in step with the member list.
type reconcile struct {
	reg      *Registry
	features Features

	in    *Input
	st    *v1.ReplicatedVolumeStatus
	stamp metav1.Time // startedAt/completedAt of every step this call moves

	cfg layout.Layout // target layout (status.configuration, raised by Input.ExtraFTT)
	// baseCfg is status.configuration's layout without Input.ExtraFTT's raise.
	baseCfg layout.Layout
	hasCfg  bool

	rvrOrd []int // RVR indexes in name order

	overrideLive bool // spec.quorumOverride is what the datamesh ran when the call began (pin keeps it)

	// What the call reports besides the status and what the passes return: the events
	// worth showing a person, and whether something waits for replicas or guards.
	events  []Event
	waiting bool
}

// Process runs one reconcile of the volume:
//
//  1. resolve status.configuration (frozen during formation) and index members ↔ RVRs;
//  2. turn RVR presence, deletion and type (and Input.ForceLeave) into replica requests;
//  3. backward pass: confirm the active step of every transition, advance to the next
//     step or complete the transition;
//  4. formation, emergency (ForceDetach, ForceRemoveReplica), ChangeQuorum;
//  5. membership forward pass: start transitions for replica requests, guards first;
//  6. attachment forward pass: Attach, Detach, Enable/DisableMultiattach;
//  7. the layout diff: what replicas placement should create, delete or retype.
//
// It mutates in.RV.Status in place and returns an error only for bad input, in which
// case the status is untouched. See doc.go for the whole contract.
func (e *Engine) Process(in *Input) (Result, error) {
	if err := validateInput(in); err != nil {
		return Result{}, err
	}
	before := in.RV.Status.DeepCopy()
	rc := e.newReconcile(in)
	if err := rc.resolveConfiguration(); err != nil {
		return Result{}, err
	}
	open, anyForce := rc.syncRequests()
	rc.backward()
	var wanted []WantedReplica
	var atts []AttachmentStatus
	switch {
	case rc.formationActive() || rc.maybeStartFormation():
		wanted = rc.formation()
	case rc.hasCfg && len(rc.st.Datamesh.Members) > 0:
		rc.withdrawAttaches()
		rc.emergency(anyForce)
		quorumBusy := rc.changeQuorum()
		rc.membership(open, quorumBusy)
		atts, wanted = rc.attachment(quorumBusy)
		wanted = rc.settleLayout(anyForce, wanted)
	default:
		if rc.hasCfg && rc.st.DatameshRevision > 0 {
			rc.lostDatamesh()
		}
		atts, wanted = rc.attachment(false)
	}
	sortWanted(wanted)
	return Result{
		Changed:     !sameStatus(before, &in.RV.Status),
		Revision:    rc.st.DatameshRevision,
		Waiting:     rc.waiting || len(rc.st.DatameshTransitions) > 0,
		Wanted:      wanted,
		Attachments: atts,
		Events:      rc.events,
	}, nil
}

// validateInput refuses what Process cannot work from, naming the field and the rule.
func validateInput(in *Input) error {
	if in == nil || in.RV == nil {
		return errors.New("input.RV: must not be nil")
	}
	for i, r := range in.RVRs {
		if r == nil {
			return errors.New("input.RVRs[" + itoa(i) + "]: must not be nil")
		}
	}
	for i, a := range in.RVAs {
		if a == nil {
			return errors.New("input.RVAs[" + itoa(i) + "]: must not be nil")
		}
	}
	if cq := in.ChangeQuorum; cq != nil {
		if cq.Quorum < 0 || cq.Quorum > 32 {
			return errors.New("input.changeQuorum.quorum: must be 0 (keep) or 1..32, got " + itoa(int(cq.Quorum)))
		}
		if cq.QuorumMinimumRedundancy < 0 || cq.QuorumMinimumRedundancy > 32 {
			return errors.New("input.changeQuorum.quorumMinimumRedundancy: must be 0 (keep) or 1..32, got " + itoa(int(cq.QuorumMinimumRedundancy)))
		}
	}
	return nil
}

// newReconcile starts a call on in: the RVRs by name, and whether the datamesh already
// runs spec.quorumOverride (pin keeps it then).
func (e *Engine) newReconcile(in *Input) *reconcile {
	rc := &reconcile{reg: e.reg, features: e.features, in: in, st: &in.RV.Status, stamp: metav1.Time{Time: in.Now}}
	rc.rvrOrd = make([]int, len(in.RVRs))
	for j := range rc.rvrOrd {
		rc.rvrOrd[j] = j
	}
	slices.SortStableFunc(rc.rvrOrd, func(a, b int) int { return strings.Compare(in.RVRs[a].Name, in.RVRs[b].Name) })
	if oq, oqmr := rc.override(); oq > 0 || oqmr > 0 {
		dm := &rc.st.Datamesh
		rc.overrideLive = (oq == 0 || int(dm.Quorum) == oq) && (oqmr == 0 || int(dm.QuorumMinimumRedundancy) == oqmr)
	}
	return rc
}

func (rc *reconcile) event(t EventType, reason, msg string) {
	rc.events = append(rc.events, Event{Type: t, Reason: reason, Message: msg})
}

// bump publishes a change: one published change, one revision.
func (rc *reconcile) bump() int64 {
	rc.st.DatameshRevision++
	return rc.st.DatameshRevision
}

// rvrIndex returns the index of the first RVR called name, or -1.
func (rc *reconcile) rvrIndex(name string) int {
	return slices.IndexFunc(rc.in.RVRs, func(r *v1.ReplicatedVolumeReplica) bool { return r.Name == name })
}

// memberIndex returns the index of the first member called name, or -1.
func (rc *reconcile) memberIndex(name string) int {
	return slices.IndexFunc(rc.st.Datamesh.Members, func(m v1.DatameshMember) bool { return m.Name == name })
}

// memberOfRVR returns the index of the member RVR j is, or -1.
func (rc *reconcile) memberOfRVR(j int) int { return rc.memberIndex(rc.in.RVRs[j].Name) }

// memberInsertAt is where a member called name goes: in name order when the members
// are in name order (as the engine keeps them), else at the end (a status written by
// someone else keeps its order).
func (rc *reconcile) memberInsertAt(name string) int {
	ms := rc.st.Datamesh.Members
	for i := 1; i < len(ms); i++ {
		if ms[i-1].Name >= ms[i].Name {
			return len(ms)
		}
	}
	i, _ := slices.BinarySearchFunc(ms, name, func(m v1.DatameshMember, n string) int { return strings.Compare(m.Name, n) })
	return i
}

// mstate is member mi's state.
func (rc *reconcile) mstate(mi int) State {
	return StateOfMember(rc.st.Datamesh.Members[mi].Type)
}

// rstate is the member state RVR j's spec.type asks for, and whether it is a valid type.
func (rc *reconcile) rstate(j int) (State, bool) {
	return StateOfReplicaType(rc.in.RVRs[j].Spec.Type)
}

// rvrOfMember returns member mi's RVR, or nil when it has none.
func (rc *reconcile) rvrOfMember(mi int) *v1.ReplicatedVolumeReplica {
	if mi < 0 || mi >= len(rc.st.Datamesh.Members) {
		return nil
	}
	return rc.rvrNamed(rc.st.Datamesh.Members[mi].Name)
}

func (rc *reconcile) rvrNamed(name string) *v1.ReplicatedVolumeReplica {
	if j := rc.rvrIndex(name); j >= 0 {
		return rc.in.RVRs[j]
	}
	return nil
}

// counts are the membership facts the guards and q/qmr need.
type counts struct {
	voters, d, upToDateD, tb int
}

// counts counts the members the guards, q/qmr and the layout diff ask about.
func (rc *reconcile) counts() counts {
	var c counts
	for i := range rc.st.Datamesh.Members {
		switch rc.mstate(i) {
		case StateD:
			c.voters++
			c.d++
			if upToDate(rc.rvrOfMember(i)) {
				c.upToDateD++
			}
		case StateDL:
			c.voters++
		case StateTB:
			c.tb++
		}
	}
	return c
}

func (rc *reconcile) effective() layout.Layout {
	if el := rc.st.EffectiveLayout; el != nil {
		return layout.Layout{FTT: int(el.FailuresToTolerate), GMDR: int(el.GuaranteedMinimumDataRedundancy)}
	}
	return layout.Layout{}
}

func (rc *reconcile) setEffective(l layout.Layout) {
	st := rc.st
	if st.EffectiveLayout == nil {
		st.EffectiveLayout = &v1.Layout{}
	}
	st.EffectiveLayout.FailuresToTolerate, st.EffectiveLayout.GuaranteedMinimumDataRedundancy = int32(l.FTT), int32(l.GMDR)
}

// afterMembershipChange ratchets the effective FTT and recomputes q after a step that
// changed members (layout.AfterMembershipChange is idempotent, so it runs after every
// member step, not only the ones named q↑/q↓).
func (rc *reconcile) afterMembershipChange() {
	c := rc.counts()
	eff := rc.effective().AfterMembershipChange(rc.cfg, c.voters, c.tb)
	rc.setEffective(eff)
	rc.st.Datamesh.Quorum = int32(layout.Quorum(c.voters, eff))
	rc.pin()
}

// setQMR publishes qmr and moves the effective layout with it.
func (rc *reconcile) setQMR(qmr int) {
	c := rc.counts()
	eff := rc.effective().AfterQMRChange(rc.cfg, qmr, c.voters, c.tb)
	rc.setEffective(eff)
	rc.st.Datamesh.QuorumMinimumRedundancy = int32(qmr)
	rc.st.Datamesh.Quorum = int32(layout.Quorum(c.voters, eff))
	rc.pin()
}

// now returns the call's timestamp for startedAt/completedAt: Input.Now, never a clock.
func (rc *reconcile) now() *metav1.Time {
	t := rc.stamp
	return &t
}

// sortWanted orders Result.Wanted add-before-remove: creates, then retypes, then deletes
// (stable within each kind).
func sortWanted(w []WantedReplica) {
	rank := func(a WantAction) int {
		switch a {
		case WantCreate:
			return 0
		case WantRetype:
			return 1
		}
		return 2
	}
	slices.SortStableFunc(w, func(a, b WantedReplica) int { return rank(a.Action) - rank(b.Action) })
}

// lostDatamesh explains why nothing joins a formed datamesh that has no members left:
// every copy was force-removed. Forming it again would let agents skip the initial sync
// over data that may still exist somewhere, so that is a person's decision.
func (rc *reconcile) lostDatamesh() {
	for i := range rc.st.DatameshReplicaRequests {
		r := &rc.st.DatameshReplicaRequests[i]
		if r.Operation != v1.ReplicaOperationJoin {
			continue
		}
		rc.waiting = true
		rc.setRequestMessage(r.Name, msgLostDatamesh)
	}
}

const msgLostDatamesh = "The datamesh has no members left (its last copy was force-removed); it is not formed again automatically"
