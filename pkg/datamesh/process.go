package datamesh

import (
	"errors"
	"slices"
	"strings"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh/layout"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// scratch is the per-call state of Process. Its slices keep their capacity between calls,
// which is what makes a steady reconcile allocation-free.
type scratch struct {
	in  *Input
	st  *v1.ReplicatedVolumeStatus
	now metav1.Time

	cfg    layout.Layout // target layout (status.configuration)
	hasCfg bool

	rvaMember []int   // RVA index → member on its node, -1 when none
	memState  []State // member index → its state (cached: MemberType is a string)
	rvrState  []State // RVR index → the state its spec.type settles in (numStates: invalid)
	memberRVR []int   // member index → RVR index, -1 when the member has no RVR
	rvrMember []int   // RVR index → member index, -1 when not a member

	wanted []WantedReplica
	atts   []AttachmentStatus
	events []Event
	zones  []layout.ZoneCount
	rvaOrd []int

	buf         []byte
	cnt         counts // counts(), valid while countsValid
	countsValid bool
	arena       *callArena // this call's timestamps and node-ids (allocated on first use)

	// Name lookups. Members and requests are kept sorted by name (the engine inserts them
	// in place), rvrOrd is the RVRs' order by name (the identity when the caller passes
	// them sorted, which costs one comparison per RVR to check). So matching members and
	// requests to RVRs is a merge, and finding one a binary search: no hashing, no maps,
	// and in the steady state every "guess" (same position) hits.
	rvrOrd        []int
	membersSorted bool
	nodeTab       memberIndex // members by node name

	changed      bool
	waiting      bool
	quorumBusy   bool   // a ChangeQuorum is in flight or waiting to start
	anyForce     bool   // some replica request is a ForceLeave
	openRequests bool   // some replica asks for something not done yet
	liveMembers  uint64 // members (by index) on a node some live RVA asks for
	overrideLive bool   // spec.quorumOverride is what the datamesh runs (pin keeps it)
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
// case the status is untouched.
func (e *Engine) Process(in *Input) (Result, error) {
	if in == nil || in.RV == nil {
		return Result{}, errors.New("input.RV: must not be nil")
	}
	for i, r := range in.RVRs {
		if r == nil {
			return Result{}, errors.New("input.RVRs[" + itoa(i) + "]: must not be nil")
		}
	}
	for i, a := range in.RVAs {
		if a == nil {
			return Result{}, errors.New("input.RVAs[" + itoa(i) + "]: must not be nil")
		}
	}
	if cq := in.ChangeQuorum; cq != nil {
		if cq.Quorum < 0 || cq.Quorum > 32 {
			return Result{}, errors.New("input.changeQuorum.quorum: must be 0 (keep) or 1..32, got " + itoa(int(cq.Quorum)))
		}
		if cq.QuorumMinimumRedundancy < 0 || cq.QuorumMinimumRedundancy > 32 {
			return Result{}, errors.New("input.changeQuorum.quorumMinimumRedundancy: must be 0 (keep) or 1..32, got " + itoa(int(cq.QuorumMinimumRedundancy)))
		}
	}
	s := &e.s
	e.reset(in)
	if err := e.resolveConfiguration(); err != nil {
		return Result{}, err
	}
	e.sortRVRs()
	e.index()
	e.syncRequests()
	e.backward()
	if e.formationActive() || e.maybeStartFormation() {
		e.formation()
	} else if s.hasCfg && len(s.st.Datamesh.Members) > 0 {
		e.emergency()
		e.changeQuorum()
		e.membership()
		e.attachment()
		e.settleLayout()
	} else {
		if s.hasCfg && s.st.DatameshRevision > 0 && len(s.st.Datamesh.Members) == 0 {
			e.lostDatamesh()
		}
		e.attachment()
	}
	sortWanted(s.wanted)
	res := Result{
		Changed:     s.changed,
		Revision:    s.st.DatameshRevision,
		Waiting:     s.waiting || len(s.st.DatameshTransitions) > 0,
		Wanted:      s.wanted,
		Attachments: s.atts,
		Events:      s.events,
	}
	return res, nil
}

// reset clears the per-call state field by field: the buffers keep their storage (that
// is the point of the scratch), and copying a whole zeroed struct costs more than this.
func (e *Engine) reset(in *Input) {
	s := &e.s
	s.in, s.st, s.now = in, &in.RV.Status, metav1.Time{Time: in.Now}
	s.cfg, s.hasCfg = layout.Layout{}, false
	s.wanted, s.atts, s.events = s.wanted[:0], s.atts[:0], s.events[:0]
	s.zones, s.rvaOrd, s.buf, s.rvrOrd = s.zones[:0], s.rvaOrd[:0], s.buf[:0], s.rvrOrd[:0]
	s.nodeTab.valid, s.membersSorted = false, false
	s.changed, s.waiting, s.quorumBusy, s.anyForce, s.openRequests = false, false, false, false, false
	s.liveMembers = 0
	s.overrideLive = false
	if oq, oqmr := e.override(); oq > 0 || oqmr > 0 {
		dm := &s.st.Datamesh
		s.overrideLive = (oq == 0 || int(dm.Quorum) == oq) && (oqmr == 0 || int(dm.QuorumMinimumRedundancy) == oqmr)
	}
	s.arena = nil // the previous call's block now belongs to the status it was written to
	s.countsValid = false
}

func (e *Engine) markChanged() { e.s.changed = true }

func (e *Engine) event(t EventType, reason, msg string) {
	e.s.events = append(e.s.events, Event{Type: t, Reason: reason, Message: msg})
}

// bump publishes a change: one published change, one revision.
func (e *Engine) bump() int64 {
	e.s.st.DatameshRevision++
	e.s.changed = true
	return e.s.st.DatameshRevision
}

// sortRVRs computes rvrOrd, the RVRs by name.
func (e *Engine) sortRVRs() {
	s := &e.s
	rvrs := s.in.RVRs
	ord := s.rvrOrd[:0]
	st := s.rvrState[:0]
	sorted := true
	for j := range rvrs {
		ord = append(ord, j)
		rs, ok := StateOfReplicaType(rvrs[j].Spec.Type)
		if !ok {
			rs = numStates
		}
		st = append(st, rs)
		if j > 0 && rvrs[j-1].Name > rvrs[j].Name {
			sorted = false
		}
	}
	if !sorted {
		// Insertion sort: a volume has at most a few dozen replicas, and it needs neither
		// a closure nor an allocation.
		for i := 1; i < len(ord); i++ {
			for k := i; k > 0 && rvrs[ord[k]].Name < rvrs[ord[k-1]].Name; k-- {
				ord[k], ord[k-1] = ord[k-1], ord[k]
			}
		}
	}
	s.rvrOrd = ord
	s.rvrState = st
}

// index maps members to RVRs and back (a merge of two name-sorted lists; a binary search
// per member when the members are not sorted, as in a status written by someone else).
func (e *Engine) index() {
	s := &e.s
	ms := s.st.Datamesh.Members
	rvrs := s.in.RVRs
	s.nodeTab.valid, s.countsValid = false, false
	s.memberRVR = resizeInts(s.memberRVR, len(ms))
	s.rvrMember = resizeInts(s.rvrMember, len(rvrs))
	for i := range s.rvrMember {
		s.rvrMember[i] = -1
	}
	s.memState = s.memState[:0]
	for i := range ms {
		s.memState = append(s.memState, StateOfMember(ms[i].Type))
	}
	s.membersSorted = true
	for i := 1; i < len(ms); i++ {
		if ms[i-1].Name >= ms[i].Name {
			s.membersSorted = false
			break
		}
	}
	if s.membersSorted {
		k := 0
		for i := range ms {
			j := -1
			for k < len(s.rvrOrd) {
				// Equality first: in the steady state every member has its RVR, and an
				// equal comparison is cheaper than an ordering one.
				rn := rvrs[s.rvrOrd[k]].Name
				if rn == ms[i].Name {
					j = s.rvrOrd[k]
					k++
					break
				}
				if rn > ms[i].Name {
					break
				}
				k++
			}
			s.memberRVR[i] = j
			if j >= 0 {
				s.rvrMember[j] = i
			}
		}
		return
	}
	for i := range ms {
		j := e.findRVR(ms[i].Name, i)
		s.memberRVR[i] = j
		if j >= 0 {
			s.rvrMember[j] = i
		}
	}
}

func resizeInts(b []int, n int) []int {
	if cap(b) < n {
		return make([]int, n)
	}
	return b[:n]
}

// findRVR returns the index of the RVR called name, trying guess first.
func (e *Engine) findRVR(name string, guess int) int {
	s := &e.s
	rvrs := s.in.RVRs
	if guess >= 0 && guess < len(rvrs) && rvrs[guess].Name == name {
		return guess
	}
	lo, hi := 0, len(s.rvrOrd)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if rvrs[s.rvrOrd[m]].Name < name {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(s.rvrOrd) && rvrs[s.rvrOrd[lo]].Name == name {
		return s.rvrOrd[lo]
	}
	return -1
}

// memberIndex returns the index of the member called name, or -1.
func (e *Engine) memberIndex(name string) int { return e.memberIndexGuess(name, -1) }

// memberIndexGuess is memberIndex trying position guess first.
func (e *Engine) memberIndexGuess(name string, guess int) int {
	s := &e.s
	ms := s.st.Datamesh.Members
	if guess >= 0 && guess < len(ms) && ms[guess].Name == name {
		return guess
	}
	if !s.membersSorted || len(ms) < 4 {
		for i := range ms {
			if ms[i].Name == name {
				return i
			}
		}
		return -1
	}
	lo, hi := 0, len(ms)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if ms[m].Name < name {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(ms) && ms[lo].Name == name {
		return lo
	}
	return -1
}

// memberInsertAt is where a member called name goes to keep the members sorted.
func (e *Engine) memberInsertAt(name string) int {
	ms := e.s.st.Datamesh.Members
	if !e.s.membersSorted {
		return len(ms)
	}
	i, _ := slices.BinarySearchFunc(ms, name, func(m v1.DatameshMember, n string) int { return strings.Compare(m.Name, n) })
	return i
}

// mstate is member mi's state.
func (e *Engine) mstate(mi int) State {
	if mi >= 0 && mi < len(e.s.memState) {
		return e.s.memState[mi]
	}
	return StateOfMember(e.s.st.Datamesh.Members[mi].Type)
}

// rstate is the member state RVR j's spec.type asks for, and whether it is a valid type.
func (e *Engine) rstate(j int) (State, bool) {
	st := e.s.rvrState[j]
	return st, st < numStates
}

func (e *Engine) rvrOfMember(mi int) *v1.ReplicatedVolumeReplica {
	if mi < 0 || mi >= len(e.s.memberRVR) || e.s.memberRVR[mi] < 0 {
		return nil
	}
	return e.s.in.RVRs[e.s.memberRVR[mi]]
}

func (e *Engine) rvrByName(name string) *v1.ReplicatedVolumeReplica {
	if j := e.findRVR(name, -1); j >= 0 {
		return e.s.in.RVRs[j]
	}
	return nil
}

// counts are the membership facts the guards and q/qmr need.
type counts struct {
	voters, d, upToDateD, tb int
}

// counts returns the membership counts, computed once per member change (index and
// applyMember invalidate them): the guards, q/qmr and the layout diff all ask.
func (e *Engine) counts() counts {
	if !e.s.countsValid {
		e.s.cnt, e.s.countsValid = e.countMembers(), true
	}
	return e.s.cnt
}

func (e *Engine) countMembers() counts {
	var c counts
	for i := range e.s.st.Datamesh.Members {
		switch e.mstate(i) {
		case StateD:
			c.voters++
			c.d++
			if upToDate(e.rvrOfMember(i)) {
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

func (e *Engine) effective() layout.Layout {
	if el := e.s.st.EffectiveLayout; el != nil {
		return layout.Layout{FTT: int(el.FailuresToTolerate), GMDR: int(el.GuaranteedMinimumDataRedundancy)}
	}
	return layout.Layout{}
}

func (e *Engine) setEffective(l layout.Layout) {
	st := e.s.st
	if st.EffectiveLayout == nil {
		st.EffectiveLayout = &v1.Layout{}
		e.markChanged()
	}
	f, g := int32(l.FTT), int32(l.GMDR)
	if st.EffectiveLayout.FailuresToTolerate != f || st.EffectiveLayout.GuaranteedMinimumDataRedundancy != g {
		st.EffectiveLayout.FailuresToTolerate, st.EffectiveLayout.GuaranteedMinimumDataRedundancy = f, g
		e.markChanged()
	}
}

// afterMembershipChange ratchets the effective FTT and recomputes q after a step that
// changed members (layout.AfterMembershipChange is idempotent, so it runs after every
// member step, not only the ones named q↑/q↓).
func (e *Engine) afterMembershipChange() {
	c := e.counts()
	eff := e.effective().AfterMembershipChange(e.s.cfg, c.voters, c.tb)
	e.setEffective(eff)
	e.s.st.Datamesh.Quorum = int32(layout.Quorum(c.voters, eff))
	e.pin()
}

// setQMR publishes qmr and moves the effective layout with it.
func (e *Engine) setQMR(qmr int) {
	c := e.counts()
	eff := e.effective().AfterQMRChange(e.s.cfg, qmr, c.voters, c.tb)
	e.setEffective(eff)
	e.s.st.Datamesh.QuorumMinimumRedundancy = int32(qmr)
	e.s.st.Datamesh.Quorum = int32(layout.Quorum(c.voters, eff))
	e.pin()
}

// now returns the call's timestamp for startedAt/completedAt. Every stamp of one call is
// the same instant, so they share one value, allocated once per call together with the
// node-ids the call records (nodeID): one allocation however many steps move. The
// engine never writes through these pointers, it only replaces them.
func (e *Engine) now() *metav1.Time {
	return &e.arena().now
}

// nodeID returns a pointer to a call-owned copy of id (DatameshTransition.replicaNodeID).
func (e *Engine) nodeID(id int32) *int32 {
	a := e.arena()
	if a.n == len(a.ids) {
		e.s.arena = nil // full: the next one gets a fresh block
		a = e.arena()
	}
	a.ids[a.n] = id
	a.n++
	return &a.ids[a.n-1]
}

// callArena is the storage behind the pointers one Process call writes into the status.
type callArena struct {
	now metav1.Time
	ids [4]int32
	n   int
}

func (e *Engine) arena() *callArena {
	if e.s.arena == nil {
		e.s.arena = &callArena{now: e.s.now}
	}
	return e.s.arena
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
	// Insertion sort: a handful of entries, and no allocation.
	for i := 1; i < len(w); i++ {
		for j := i; j > 0 && rank(w[j].Action) < rank(w[j-1].Action); j-- {
			w[j], w[j-1] = w[j-1], w[j]
		}
	}
}

// lostDatamesh explains why nothing joins a formed datamesh that has no members left:
// every copy was force-removed. Forming it again would let agents skip the initial sync
// over data that may still exist somewhere, so that is a person's decision.
func (e *Engine) lostDatamesh() {
	s := &e.s
	for i := range s.st.DatameshReplicaRequests {
		r := &s.st.DatameshReplicaRequests[i]
		if r.Operation != v1.ReplicaOperationJoin {
			continue
		}
		s.waiting = true
		e.setRequestMessageString(r.Name, msgLostDatamesh)
	}
}

const msgLostDatamesh = "The datamesh has no members left (its last copy was force-removed); it is not formed again automatically"
