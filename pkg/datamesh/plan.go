package datamesh

import (
	"fmt"
	"sort"
	"strings"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Change is the direction of a q or qmr change carried by a step.
type Change int8

const (
	NoChange Change = 0
	Up       Change = 1
	Down     Change = -1
)

// StepKind says what a step publishes.
type StepKind uint8

const (
	// StepMember changes the affected member's state From → To (✦ joins, ✕ leaves),
	// with the q change in Q published in the same revision.
	StepMember StepKind = iota
	// StepQMR publishes qmr↑/qmr↓ toward the target GMDR (embedded in AddReplica(D) and
	// RemoveReplica(D)).
	StepQMR
	// StepQuorum publishes a standalone ChangeQuorum.
	StepQuorum
	// StepAttach / StepDetach set the member's attached flag.
	StepAttach
	StepDetach
	// StepMultiattach sets datamesh.multiattach to the plan's direction (Up on, Down off).
	StepMultiattach
	// StepFormationPublish publishes every member of the configured layout at once.
	StepFormationPublish
	// StepQ publishes q = Quorum(voters, effective) again: the "q↓" that ends a
	// tiebreaker hold (see PathParams.TBHold).
	StepQ
	// StepFormationSync waits for every Diskful member to be UpToDate; it publishes
	// nothing (the agent decides the day-0 sync skip).
	StepFormationSync
)

// ConfirmGroup is who must confirm a step (docs/datamesh-spec.md "Step confirmation rules").
type ConfirmGroup uint8

const (
	// ConfirmAffected: the affected replica only (disk attach/detach).
	ConfirmAffected ConfirmGroup = iota
	// ConfirmFullMeshAffected: full-mesh members + the affected replica (star changes).
	ConfirmFullMeshAffected
	// ConfirmAll: every member + the affected replica.
	ConfirmAll
	// ConfirmVoters: D + D∅ (a q-only ChangeQuorum).
	ConfirmVoters
	// ConfirmDiskful: every D must be UpToDate (formation sync); no revision involved.
	ConfirmDiskful
)

var confirmGroupNames = [...]string{"affected", "fm+affected", "all", "voters", "diskful-uptodate"}

func (g ConfirmGroup) String() string {
	if int(g) < len(confirmGroupNames) {
		return confirmGroupNames[g]
	}
	return "?"
}

// Step is one published change of a plan: the unit a DatameshRevision confirms.
type Step struct {
	// Name is the specification's notation, e.g. "A → D∅ + q↑".
	Name string
	Kind StepKind
	// From, To: the affected member's state before and after (StepMember).
	From, To State
	// Q: the q change published with the member change; QMR: for StepQMR/StepQuorum.
	Q, QMR Change
	// Confirm is the step's own wait set; a q change adds D + D∅ to it (union).
	Confirm ConfirmGroup
	// Force: the affected (dead) member is excluded from the wait set.
	Force bool
	// HoldQ: the step changes the voter count next to a TieBreaker, so it publishes
	// q = max(q before, q after) + 1 until a later StepQ lowers it (PathParams.TBHold).
	HoldQ bool
}

// Plan is a registered sequence of steps. Its ID and Version are persisted with every
// transition that runs it, so a controller restart or upgrade resumes the same steps.
type Plan struct {
	ID       string
	Version  int32
	Type     v1.TransitionType
	Group    v1.TransitionGroup
	From, To State
	Steps    []Step
}

// Path is the plan's steps joined the way docs/datamesh-spec.md writes them, with ✦/✕ endpoints:
// "✦ → A → D∅ + q↑ → D → qmr↑".
func (p *Plan) Path() string { return PathString(p.Steps) }

// PathString renders steps in the specification's notation.
func PathString(steps []Step) string {
	var b strings.Builder
	prevMember := false
	for i, s := range steps {
		if i > 0 {
			b.WriteString(" → ")
		}
		switch s.Kind {
		case StepMember:
			if !prevMember {
				// The path names the member's state before its first step: "qmr↓ → D → D∅".
				b.WriteString(s.From.String())
				b.WriteString(" → ")
			}
			b.WriteString(s.To.String())
			if s.Q == Up {
				b.WriteString(" + q↑")
			} else if s.Q == Down {
				b.WriteString(" + q↓")
			}
			if s.HoldQ {
				b.WriteString(" + q⇡") // q held one above both configurations
			}
			prevMember = true
		default:
			b.WriteString(s.Name)
			prevMember = false
		}
	}
	return b.String()
}

// PathParams are the facts a membership path depends on besides (from, to).
type PathParams struct {
	// VotersOdd: the number of voters (D + D∅) before the transition is odd.
	VotersOdd bool
	// Shadow: Features.ShadowDiskful.
	Shadow bool
	// QMRUp: effective GMDR < target GMDR (appends qmr↑ to AddReplica(D)).
	QMRUp bool
	// QMRDown: effective GMDR > target GMDR (prepends qmr↓ to RemoveReplica(D)).
	QMRDown bool
	// Force: ForceRemoveReplica (one step, the dead member excluded).
	Force bool
	// TBHold: the datamesh has a TieBreaker. DRBD's tiebreaker lets half of an even
	// voter set plus the TB keep quorum (docs/drbd-quorum.md), so while a step that changes
	// the voter count is half applied, a quorum of the new configuration and a quorum of
	// the old one (tiebreaker quorums included) could be disjoint — the split the model
	// checker found for 2D+1TB → 3D (docs/modelcheck-findings.md F4). The voter-changing
	// step therefore publishes a q one above both configurations' q, and a final "q↓"
	// step, once every member runs the new voter set, brings q back to the formula. The
	// specification's paths are those with TBHold false.
	//
	// F4's split needs DRBD to count a D∅ as a present voter. With D∅ and sD∅ rendered
	// `disk none` (docs/layouts.md §8.4) it does not, and a member starts voting only at
	// its own D∅ → D step; the hold is kept because it is never less safe (a higher q
	// over the same voters grants no quorum the formula's q would not), until the model
	// checker, modelling that rendering, shows it can go (docs/datamesh.md "TieBreaker
	// hold").
	TBHold bool
}

func (p PathParams) bits() int {
	b := 0
	for i, f := range [...]bool{p.VotersOdd, p.Shadow, p.QMRUp, p.QMRDown, p.Force, p.TBHold} {
		if f {
			b |= 1 << i
		}
	}
	return b
}

// derivedIDs[from][to][params] caches DerivePlan's plan ID ("" when it is not a
// transition), so the engine picks a plan without deriving it again on every admission.
const numPathParams = 64

func pathParamsOf(bits int) PathParams {
	return PathParams{VotersOdd: bits&1 != 0, Shadow: bits&2 != 0, QMRUp: bits&4 != 0, QMRDown: bits&8 != 0, Force: bits&16 != 0, TBHold: bits&32 != 0}
}

var derivedIDs = func() (t [numStates][numStates][numPathParams]string) {
	for from := State(0); from < numStates; from++ {
		for to := State(0); to < numStates; to++ {
			for bits := 0; bits < numPathParams; bits++ {
				p := pathParamsOf(bits)
				if pl, err := DerivePlan(from, to, p); err == nil {
					t[from][to][bits] = pl.ID
				}
			}
		}
	}
	return t
}()

// DerivedPlanID is DerivePlan(from, to, p).ID without building the plan.
func DerivedPlanID(from, to State, p PathParams) (string, error) {
	if from < numStates && to < numStates {
		if id := derivedIDs[from][to][p.bits()]; id != "" {
			return id, nil
		}
	}
	_, err := DerivePlan(from, to, p)
	if err == nil {
		err = fmt.Errorf("%s → %s: no plan", from, to)
	}
	return "", err
}

// DerivePlan derives the membership plan for from → to from a few rules instead of a
// table (docs/datamesh-spec.md's tables are its test vectors):
//
//   - A voter joins or leaves at D∅ (full mesh, no disk): the disk is attached or
//     detached in a step of its own, confirmed by the member alone.
//   - q changes exactly when the voter count crosses odd → even (q↑) or even → odd
//     (q↓), atomically with the step that adds or removes the voter, and only from or
//     to a member that is already connected: so a new replica enters through the
//     A vestibule (✦ → A → D∅ + q↑) and a leaving one exits through it (D∅ → A + q↓ → ✕).
//   - With shadow support a diskful replica syncs as a non-voter (sD∅ → sD) first and
//     becomes a voter from sD: directly when q stays, through sD∅ → D∅ + q↑ when q rises.
//     Stepping down D → sD is direct when q stays, else D → D∅ → sD∅ + q↓ → sD.
//   - qmr↑ is appended to AddReplica(D), qmr↓ prepended to RemoveReplica(D).
//   - Star members (A, TB) change in one step.
//
// It returns an error for pairs that are not transitions (liminal endpoints, sD without
// shadow support, from == to).
func DerivePlan(from, to State, p PathParams) (Plan, error) {
	if from == to {
		return Plan{}, fmt.Errorf("from and to are both %s: nothing to do", from)
	}
	if from == StateGone || to == StateNew || from >= numStates || to >= numStates {
		return Plan{}, fmt.Errorf("%s → %s is not a transition", from, to)
	}
	if p.Force {
		return forceRemovePlan(from, to, p)
	}
	if from.IsLiminal() || to.IsLiminal() {
		return Plan{}, fmt.Errorf("%s → %s: liminal states are only passed through", from, to)
	}
	if (from.IsShadow() || to.IsShadow()) && !p.Shadow {
		return Plan{}, fmt.Errorf("%s → %s needs ShadowDiskful support (DRBD non-voting option)", from, to)
	}
	addsVoter := !from.IsVoter() && to.IsVoter()
	removesVoter := from.IsVoter() && !to.IsVoter()
	var steps []Step
	if removesVoter && to == StateGone && p.QMRDown {
		steps = append(steps, qmrStep(Down))
	}
	steps = append(steps, memberSteps(from, to, p.Shadow, addsVoter && p.VotersOdd, removesVoter && !p.VotersOdd)...)
	if to == StateD && from == StateNew && p.QMRUp {
		steps = append(steps, qmrStep(Up))
	}
	if p.TBHold && (addsVoter || removesVoter) {
		steps = holdQ(steps)
	}
	pl := Plan{From: from, To: to, Steps: steps}
	switch {
	case from == StateNew:
		pl.Type = v1.TransitionAddReplica
	case to == StateGone:
		pl.Type = v1.TransitionRemoveReplica
	default:
		pl.Type = v1.TransitionChangeReplicaType
	}
	pl.Group = v1.GroupNonVotingMembership
	if from.IsVoter() || to.IsVoter() {
		pl.Group = v1.GroupVotingMembership
	}
	pl.ID = planID(pl)
	return pl, nil
}

// forceRemovePlan is ForceRemoveReplica: one step from whatever state the member is in
// to ✕, with q↓ when it leaves an odd number of voters, the dead member excluded.
func forceRemovePlan(from, to State, p PathParams) (Plan, error) {
	if !from.IsMember() || to != StateGone {
		return Plan{}, fmt.Errorf("ForceRemoveReplica needs a member and ✕, got %s → %s", from, to)
	}
	if from.IsShadow() && !p.Shadow {
		return Plan{}, fmt.Errorf("%s needs ShadowDiskful support", from)
	}
	q := NoChange
	if from.IsVoter() && !p.VotersOdd {
		q = Down
	}
	st := memberStep(from, StateGone, q)
	st.Force = true
	// Every survivor confirms a force removal, a star member's too (docs/datamesh.md,
	// "Departures from the specification"): a survivor may still run the member as the
	// type it had before a step nobody confirmed (a leaving D's D∅ → A, published and
	// then cancelled by this removal), under which it still connects to the member.
	// The q↓ that follows the removal and lowers the effective FTT waits for the
	// removal, so it waits until no survivor is left with a link to the lost member
	// (model checker, M3: a TieBreaker still running the lost member as a D when q fell
	// to 1).
	st.Confirm = ConfirmAll
	pl := Plan{Type: v1.TransitionForceRemoveReplica, Group: v1.GroupEmergency, From: from, To: to, Steps: []Step{st}}
	pl.ID = planID(pl)
	return pl, nil
}

// memberSteps are the member steps from → to (DerivePlan's rules): a voter joins or
// leaves at D∅, its disk in a step of its own; q changes (qUp, qDown) with the step that
// adds or removes the voter; with shadow support a diskful replica syncs as sD first.
func memberSteps(from, to State, shadow, qUp, qDown bool) []Step {
	var steps []Step
	add := func(f, t State, q Change) { steps = append(steps, memberStep(f, t, q)) }
	switch {
	case to == StateD && shadow:
		if from != StateSD {
			add(from, StateSDL, NoChange)
			add(StateSDL, StateSD, NoChange)
		}
		if !qUp {
			add(StateSD, StateD, NoChange)
		} else {
			add(StateSD, StateSDL, NoChange)
			add(StateSDL, StateDL, Up)
			add(StateDL, StateD, NoChange)
		}
	case to == StateD:
		cur := from
		if !qUp {
			add(cur, StateDL, NoChange)
		} else {
			if cur == StateNew {
				add(StateNew, StateA, NoChange)
				cur = StateA
			}
			add(cur, StateDL, Up)
		}
		add(StateDL, StateD, NoChange)
	case from == StateD && to == StateSD:
		if !qDown {
			add(StateD, StateSD, NoChange)
		} else {
			add(StateD, StateDL, NoChange)
			add(StateDL, StateSDL, Down)
			add(StateSDL, StateSD, NoChange)
		}
	case from == StateD:
		add(StateD, StateDL, NoChange)
		switch {
		case to != StateGone:
			add(StateDL, to, boolChange(qDown, Down))
		case !qDown:
			add(StateDL, StateGone, NoChange)
		default:
			add(StateDL, StateA, Down)
			add(StateA, StateGone, NoChange)
		}
	case to == StateSD:
		add(from, StateSDL, NoChange)
		add(StateSDL, StateSD, NoChange)
	case from == StateSD:
		add(StateSD, StateSDL, NoChange)
		add(StateSDL, to, NoChange)
	default:
		add(from, to, NoChange)
	}
	return steps
}

// holdQ marks the step that changes the voter count as HoldQ and adds the "q↓" that ends
// the hold: after the disk attach that follows a voter's arrival (so the new D is
// complete first), or at the end, and always before a trailing qmr↑.
func holdQ(steps []Step) []Step {
	at := -1
	for i, s := range steps {
		if s.Kind == StepMember && s.From.IsVoter() != s.To.IsVoter() {
			steps[i].HoldQ = true
			steps[i].Name += " + q⇡"
			at = i
			break
		}
	}
	if at < 0 {
		return steps
	}
	end := len(steps)
	if end > 0 && steps[end-1].Kind == StepQMR && steps[end-1].QMR == Up {
		end--
	}
	qdown := Step{Name: "q↓", Kind: StepQ, Q: Down, Confirm: ConfirmVoters}
	return append(steps[:end], append([]Step{qdown}, steps[end:]...)...)
}

func boolChange(b bool, c Change) Change {
	if b {
		return c
	}
	return NoChange
}

// memberStep builds a member step with the specification's confirmation group for (from, to).
func memberStep(from, to State, q Change) Step {
	s := Step{Kind: StepMember, From: from, To: to, Q: q, Confirm: ConfirmGroupOf(from, to)}
	s.Name = from.String() + " → " + to.String()
	if q == Up {
		s.Name += " + q↑"
	} else if q == Down {
		s.Name += " + q↓"
	}
	return s
}

func qmrStep(c Change) Step {
	name := "qmr↑"
	if c == Down {
		name = "qmr↓"
	}
	return Step{Name: name, Kind: StepQMR, QMR: c, Confirm: ConfirmAll}
}

// ConfirmGroupOf is docs/datamesh-spec.md's confirmation group of a member step:
//   - a disk attach/detach (D∅ ↔ D, sD∅ ↔ sD) changes nothing on peers: the member alone;
//   - a star member joining, leaving or changing role (✦/A/TB → A/TB/✕) changes only the
//     full-mesh members' connections to it: full mesh + the member;
//   - everything else changes the full mesh or the voters: all members.
func ConfirmGroupOf(from, to State) ConfirmGroup {
	switch {
	case (from == StateDL && to == StateD) || (from == StateD && to == StateDL) ||
		(from == StateSDL && to == StateSD) || (from == StateSD && to == StateSDL):
		return ConfirmAffected
	case (from == StateNew || from.IsStar()) && (to == StateGone || to.IsStar()):
		return ConfirmFullMeshAffected
	}
	return ConfirmAll
}

var stateASCII = [numStates]string{"new", "a", "tb", "dl", "d", "sdl", "sd", "gone"}

// planID names a derived plan: "<type>-<from>-<to>[-via-sd][-q-up|-q-down][-qmr-up|-qmr-down]".
func planID(pl Plan) string {
	var b strings.Builder
	switch pl.Type {
	case v1.TransitionAddReplica:
		b.WriteString("add-" + stateASCII[pl.To])
	case v1.TransitionRemoveReplica:
		b.WriteString("remove-" + stateASCII[pl.From])
	case v1.TransitionForceRemoveReplica:
		b.WriteString("force-remove-" + stateASCII[pl.From])
	default:
		b.WriteString("change-" + stateASCII[pl.From] + "-" + stateASCII[pl.To])
	}
	via, qmr := false, NoChange
	for _, s := range pl.Steps {
		if s.Kind == StepMember && s.To == StateSD && pl.To == StateD {
			via = true
		}
		if s.Kind == StepQMR {
			qmr = s.QMR
		}
	}
	if via {
		b.WriteString("-via-sd")
	}
	for _, s := range pl.Steps {
		if s.Kind != StepMember {
			continue
		}
		if s.Q == Up {
			b.WriteString("-q-up")
		} else if s.Q == Down {
			b.WriteString("-q-down")
		}
	}
	for _, s := range pl.Steps {
		if s.HoldQ {
			b.WriteString("-tb-hold")
		}
	}
	switch qmr {
	case Up:
		b.WriteString("-qmr-up")
	case Down:
		b.WriteString("-qmr-down")
	}
	return b.String()
}

// Registry holds every plan by ID and version. Old versions stay registered so a
// transition persisted at an old version keeps running the steps it started with. Build
// it once at startup; it is read-only afterwards and safe to share.
type Registry struct {
	plans  map[planKey]*Plan
	latest map[string]*Plan
}

type planKey struct {
	id      string
	version int32
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{plans: map[planKey]*Plan{}, latest: map[string]*Plan{}}
}

// Register adds a plan. A plan whose steps change must get a new Version; registering
// an existing (ID, Version) is an error.
func (r *Registry) Register(p Plan) error {
	if p.ID == "" {
		return fmt.Errorf("plan.ID: must not be empty")
	}
	if p.Version < 1 {
		return fmt.Errorf("plan %s: Version must be ≥ 1, got %d", p.ID, p.Version)
	}
	if len(p.Steps) == 0 || len(p.Steps) > 16 {
		return fmt.Errorf("plan %s/v%d: needs 1..16 steps (API limit), got %d", p.ID, p.Version, len(p.Steps))
	}
	k := planKey{p.ID, p.Version}
	if _, ok := r.plans[k]; ok {
		return fmt.Errorf("plan %s/v%d is already registered", p.ID, p.Version)
	}
	pp := p
	pp.Steps = append([]Step(nil), p.Steps...)
	r.plans[k] = &pp
	if cur, ok := r.latest[p.ID]; !ok || cur.Version < p.Version {
		r.latest[p.ID] = &pp
	}
	return nil
}

// Lookup returns plan id at version.
func (r *Registry) Lookup(id string, version int32) (*Plan, bool) {
	p, ok := r.plans[planKey{id, version}]
	return p, ok
}

// Latest returns the newest version of plan id: the one new transitions start with.
func (r *Registry) Latest(id string) (*Plan, bool) {
	p, ok := r.latest[id]
	return p, ok
}

// IDs lists the registered plan IDs, sorted.
func (r *Registry) IDs() []string {
	ids := make([]string, 0, len(r.latest))
	for id := range r.latest {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Fixed plan IDs of the non-membership transitions.
const (
	PlanFormation          = "formation"
	PlanAttach             = "attach"
	PlanDetach             = "detach"
	PlanForceDetach        = "force-detach"
	PlanEnableMultiattach  = "enable-multiattach"
	PlanDisableMultiattach = "disable-multiattach"
	PlanChangeQuorumQ      = "change-quorum-q"
	PlanChangeQuorumQMR    = "change-quorum-qmr"
)

// DefaultRegistry registers, at version 1, every plan DerivePlan can produce plus the
// fixed plans of formation, attachment, multiattach and ChangeQuorum.
func DefaultRegistry() *Registry {
	r := NewRegistry()
	must := func(err error) {
		if err != nil {
			panic("datamesh: default registry: " + err.Error())
		}
	}
	seen := map[string]bool{}
	states := []State{StateNew, StateA, StateTB, StateD, StateSD, StateSDL, StateDL, StateGone}
	for _, from := range states {
		for _, to := range states {
			for bits := 0; bits < numPathParams; bits++ {
				pl, err := DerivePlan(from, to, pathParamsOf(bits))
				if err != nil || seen[pl.ID] {
					continue
				}
				seen[pl.ID] = true
				pl.Version = 1
				must(r.Register(pl))
			}
		}
	}
	one := func(id string, t v1.TransitionType, g v1.TransitionGroup, steps ...Step) {
		must(r.Register(Plan{ID: id, Version: 1, Type: t, Group: g, Steps: steps}))
	}
	one(PlanFormation, v1.TransitionFormation, v1.GroupFormation,
		Step{Name: "✦ → layout", Kind: StepFormationPublish, Confirm: ConfirmAll},
		Step{Name: "D → UpToDate", Kind: StepFormationSync, Confirm: ConfirmDiskful})
	one(PlanAttach, v1.TransitionAttach, v1.GroupAttachment, Step{Name: "attach", Kind: StepAttach, Confirm: ConfirmAffected})
	one(PlanDetach, v1.TransitionDetach, v1.GroupAttachment, Step{Name: "detach", Kind: StepDetach, Confirm: ConfirmAffected})
	one(PlanForceDetach, v1.TransitionForceDetach, v1.GroupEmergency, Step{Name: "force-detach", Kind: StepDetach, Confirm: ConfirmAll, Force: true})
	one(PlanEnableMultiattach, v1.TransitionEnableMultiattach, v1.GroupMultiattach, Step{Name: "multiattach on", Kind: StepMultiattach, QMR: Up, Confirm: ConfirmAll})
	one(PlanDisableMultiattach, v1.TransitionDisableMultiattach, v1.GroupMultiattach, Step{Name: "multiattach off", Kind: StepMultiattach, QMR: Down, Confirm: ConfirmAll})
	one(PlanChangeQuorumQ, v1.TransitionChangeQuorum, v1.GroupQuorum, Step{Name: "q", Kind: StepQuorum, Confirm: ConfirmVoters})
	one(PlanChangeQuorumQMR, v1.TransitionChangeQuorum, v1.GroupQuorum, Step{Name: "q/qmr", Kind: StepQuorum, Confirm: ConfirmAll})
	return r
}
