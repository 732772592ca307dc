package modelcheck

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh"
)

// Processor is the engine as the checker drives it: *datamesh.Engine.
// (The checker's own tests also run it against deliberately broken engines
// to show that each invariant catches what it is meant to catch.)
type Processor interface {
	Process(in *datamesh.Input) (datamesh.Result, error)
}

// ActKind is what happens in one step of a run.
type ActKind uint8

const (
	// ActProcess: the controller reconciles (engine Process; deterministic).
	ActProcess ActKind = iota
	// ActApply: a replica's agent applies the latest published datamesh (the
	// confirmation). A disk attached by it starts Inconsistent.
	ActApply
	// ActResync: a replica's attached disk finishes syncing from a connected
	// UpToDate peer.
	ActResync
	// ActRestart: a replica's agent stops reporting (AgentReady=False); the
	// kernel keeps what it runs.
	ActRestart
	// ActRecover: the agent reports again.
	ActRecover
	// ActLose: the node is lost for good.
	ActLose
	// ActForceLeave: node lifecycle declares the lost node's replica gone: the
	// controller names it in Input.ForceLeave while it is a member or a transition
	// names it, and deletes it once neither holds (inDatamesh, lostReplicas).
	ActForceLeave
	// ActPlace: placement does one thing the engine asked for (Wanted).
	ActPlace
	// ActRequest: a person or a CSI call asks for something.
	ActRequest
	// ActReturn: a lost node comes back alive behind a partition (Returned).
	ActReturn
	// ActRejoin: the agent of a node that came back (Returned) reports again, so
	// node lifecycle no longer names its replica (Input.ForceLeave drops it): the
	// engine withdraws a ForceLeave whose removal has not started
	// (docs/datamesh.md, "A lost node that comes back"). Until it applies the
	// latest datamesh its kernel runs the one it ran while lost.
	ActRejoin
	// ActDiskFail: the disk of a replica that runs one fails, and DRBD detaches it
	// (on-io-error detach): the replica runs diskless from then on, still a member
	// of the type the datamesh gives it, and its agent reports Diskless
	// (docs/datamesh.md, "A disk that fails after formation").
	ActDiskFail
)

// ReqKind is a request a run may inject.
type ReqKind uint8

const (
	ReqAttach ReqKind = iota
	ReqDetach
	ReqAdd
	ReqRemove
	ReqRetype
	ReqConfig
	ReqMaxAttach
	// ReqMaintenance starts a node maintenance that copies the volume elsewhere
	// first (Input.ExtraFTT = 1), or ends the one running (ExtraFTT = 0).
	ReqMaintenance
)

// Action is one step. For ActRequest, Req/Type/FTT/GMDR say what is asked.
type Action struct {
	Kind      ActKind
	Slot      int8
	Arg       int8 // ActPlace: index into Wanted
	Req       ReqKind
	Type      v1alpha1.ReplicaType
	FTT, GMDR int8
}

func (a Action) String(s *Scenario) string {
	name := func() string {
		if a.Slot >= 0 && int(a.Slot) < len(s.Slots) {
			return s.Slots[a.Slot].Name
		}
		return "?"
	}
	switch a.Kind {
	case ActProcess:
		return "Process"
	case ActApply:
		return "apply " + name()
	case ActResync:
		return "resync " + name()
	case ActRestart:
		return "agent restart " + name()
	case ActRecover:
		return "agent back " + name()
	case ActLose:
		return "LOSE node of " + name()
	case ActForceLeave:
		return "force-leave " + name()
	case ActReturn:
		return "lost node of " + name() + " RETURNS behind a partition"
	case ActRejoin:
		return "agent of the returned node of " + name() + " reports again"
	case ActPlace:
		return fmt.Sprintf("placement wanted[%d]", a.Arg)
	case ActDiskFail:
		return "DISK FAILS on " + name()
	}
	switch a.Req {
	case ReqAttach:
		return "request attach on " + s.Slots[a.Slot].Node
	case ReqDetach:
		return "request detach from " + s.Slots[a.Slot].Node
	case ReqAdd:
		return fmt.Sprintf("request add %s %s", a.Type, name())
	case ReqRemove:
		return "request remove " + name()
	case ReqRetype:
		return fmt.Sprintf("request retype %s to %s", name(), a.Type)
	case ReqConfig:
		return fmt.Sprintf("request configuration FTT=%d GMDR=%d", a.FTT, a.GMDR)
	case ReqMaxAttach:
		return fmt.Sprintf("request maxAttachments=%d", a.Arg)
	case ReqMaintenance:
		if a.Arg > 0 {
			return "node maintenance starts (ExtraFTT=1)"
		}
		return "node maintenance ends (ExtraFTT=0)"
	}
	return "?"
}

// Stats counts what a run did.
type Stats struct {
	States      int // distinct states explored
	Transitions int // actions applied
	Process     int // engine calls
	Leaves      int // states whose liveness was checked by draining
	MaxDepth    int
	Capped      bool // the search stopped at the state cap
}

// Failure is a violation with the run that led to it.
type Failure struct {
	Violation
	Scenario string
	Trace    []string
	State    string
}

func (f *Failure) Error() string {
	return fmt.Sprintf("%s: %s\nscenario %s\ntrace:\n  %s\nstate:\n%s", f.Invariant, f.Detail, f.Scenario,
		strings.Join(f.Trace, "\n  "), f.State)
}

// Checker explores one scenario.
type Checker struct {
	S        *Scenario
	Eng      Processor
	Stats    Stats
	Failures []*Failure
	// MaxFailures stops the run after that many failures. Failures are
	// kept once per invariant, and a state that breaks one is not explored
	// further, so by default the run covers everything else.
	MaxFailures int
	// SkipQuorumSplit turns I1 (quorum-level) into a non-fatal count
	// (QuorumSplits) for documented cases; I1w always fails the run.
	QuorumSplits int

	snaps      *snapshotTable
	an         Analyzer
	visited    map[uint64][]budget
	dpMemo     map[uint64][]Violation
	trace      []Action
	drainTrace []string
	seenInv    map[string]bool
	drainOK    map[uint64]bool
}

// NewChecker prepares a checker for s.
func NewChecker(s *Scenario, eng Processor) *Checker {
	s.slotByName = make(map[string]int, len(s.Slots))
	for i := range s.Slots {
		s.slotByName[s.Slots[i].Name] = i
	}
	return &Checker{S: s, Eng: eng, MaxFailures: 1 << 20, snaps: newSnapshotTable(),
		visited: make(map[uint64][]budget), dpMemo: make(map[uint64][]Violation), seenInv: map[string]bool{}, drainOK: map[uint64]bool{}}
}

// process runs the engine on w's inputs and returns the world after it.
// The old RV is left untouched (worlds share RVs; they are immutable).
func (c *Checker) process(w *World) (nw *World, changed bool, vs []Violation) {
	s := c.S
	c.Stats.Process++
	nw = w.Clone()
	nw.setRV(w.RV.DeepCopy())
	in := &datamesh.Input{RV: nw.RV, Now: epoch, Pool: c.pool(w), ExtraFTT: int(w.ExtraFTT)}
	for i := 0; i < w.DP.N; i++ {
		if w.DP.Replicas[i].Exists {
			in.RVRs = append(in.RVRs, w.RVR(s, i))
		}
		if w.RVA&(1<<i) != 0 {
			in.RVAs = append(in.RVAs, s.RVA(i))
		}
		if w.ForceLeave&(1<<i) != 0 && inDatamesh(&w.RV.Status, s.Slots[i].Name) {
			in.ForceLeave = append(in.ForceLeave, s.Slots[i].Name)
		}
	}
	res, err := c.safeProcess(in)
	if err != nil {
		return w, false, []Violation{{InvEngineFailure, err.Error()}}
	}
	nw.Attachments = append([]datamesh.AttachmentStatus(nil), res.Attachments...)
	nw.Wanted = nw.Wanted[:0]
	for _, wr := range res.Wanted {
		x := WantedReplica{Action: string(wr.Action), Type: wr.Type, Slot: -1}
		switch wr.Action {
		case datamesh.WantCreate:
			if wr.NodeName != "" {
				x.Slot = s.slotOfNode(wr.NodeName)
			}
		default:
			x.Slot = s.slotOf(wr.Replica)
		}
		nw.Wanted = append(nw.Wanted, x)
	}
	prev, next := &w.RV.Status, &nw.RV.Status
	vs = append(vs, CheckStatus(prev, next)...)
	vs = append(vs, checkGMDR(s, w, prev, next)...)
	vs = append(vs, checkRules(s, w, w.Floor, prev, next, w.ForceLeave|forceRemovedSlots(s, next))...)
	for i := range next.Datamesh.Members {
		if s.slotOf(next.Datamesh.Members[i].Name) < 0 {
			vs = append(vs, Violation{InvUnknownMember, "member " + next.Datamesh.Members[i].Name + " is no replica of the volume"})
		}
	}
	c.lostReplicas(nw)
	c.gc(nw)
	changed = nw.statusHash() != w.statusHash() || !sameWanted(w.Wanted, nw.Wanted) || nw.gcChanged(w)
	return nw, changed, vs
}

func (c *Checker) safeProcess(in *datamesh.Input) (res datamesh.Result, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v\n%s", r, debug.Stack())
		}
	}()
	return c.Eng.Process(in)
}

func (w *World) gcChanged(old *World) bool {
	for i := 0; i < w.DP.N; i++ {
		if w.DP.Replicas[i].Exists != old.DP.Replicas[i].Exists || w.DP.Replicas[i].Deleting != old.DP.Replicas[i].Deleting {
			return true
		}
	}
	return false
}

func sameWanted(a, b []WantedReplica) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// lostReplicas deletes, as the controller does, the replicas of nodes declared lost
// (w.ForceLeave) that are no member of the datamesh and that no transition names:
// one that never joined at once, a force-removed member once its ForceRemoveReplica
// is confirmed (pkg/controller deleteNeverJoined; the engine asks for the same with
// WantDelete, settle.go). A member's replica stays while it is force-removed: the
// controller only names it in Input.ForceLeave (lostMembers), so a node that comes
// back before the removal starts finds its replica still there and the request
// withdrawn (ActRejoin).
func (c *Checker) lostReplicas(w *World) {
	st := &w.RV.Status
	for i := 0; i < w.DP.N; i++ {
		r := &w.DP.Replicas[i]
		if !r.Exists || r.Deleting || w.ForceLeave&(1<<i) == 0 {
			continue
		}
		if !inDatamesh(st, c.S.Slots[i].Name) {
			r.Deleting = true
		}
	}
}

// inDatamesh: name is a member, or a transition still names it (a leave whose last
// step is published): the replicas the controller names in Input.ForceLeave when
// their node is lost (pkg/controller lostMembers, inDatamesh).
func inDatamesh(st *v1alpha1.ReplicatedVolumeStatus, name string) bool {
	if memberOf(st, name) {
		return true
	}
	for j := range st.DatameshTransitions {
		if st.DatameshTransitions[j].ReplicaName == name {
			return true
		}
	}
	return false
}

// gc removes the RVR of a deleting replica once nothing refers to it any
// more (the controller drops its finalizer): not a member, no transition
// or request names it.
func (c *Checker) gc(w *World) {
	st := &w.RV.Status
	for i := 0; i < w.DP.N; i++ {
		r := &w.DP.Replicas[i]
		if !r.Exists || !r.Deleting {
			continue
		}
		name := c.S.Slots[i].Name
		used := false
		for j := range st.Datamesh.Members {
			used = used || st.Datamesh.Members[j].Name == name
		}
		for j := range st.DatameshTransitions {
			used = used || st.DatameshTransitions[j].ReplicaName == name
		}
		for j := range st.DatameshReplicaRequests {
			used = used || st.DatameshReplicaRequests[j].Name == name
		}
		if !used {
			r.Exists, r.Gone = false, true
		}
	}
}

func (c *Checker) pool(w *World) *datamesh.Pool {
	p := &datamesh.Pool{Name: c.S.Config.StoragePool, Available: true}
	for i := range c.S.Slots {
		p.Nodes = append(p.Nodes, v1alpha1.EligibleNode{NodeName: c.S.Slots[i].Node, Zone: c.S.Slots[i].Zone, Ready: w.DP.Replicas[i].Alive && !w.DP.Replicas[i].Returned})
	}
	return p
}

// apply makes slot i's kernel run the published datamesh.
func (c *Checker) apply(w *World, i int) {
	r := &w.DP.Replicas[i]
	snap := c.published(w)
	hadDisk := false
	if m := r.Applied.Member(i); m != nil {
		hadDisk = m.Type.HasDisk()
	}
	hasDisk := false
	if m := snap.Member(i); m != nil {
		hasDisk = m.Type.HasDisk()
	}
	if hasDisk != hadDisk {
		// A disk just attached starts Inconsistent and must resync; a
		// detached one no longer holds current data.
		r.UpToDate = false
		if hasDisk {
			r.DiskFailed = false // a disk attached again: a new backing volume
		}
	}
	r.Applied = snap
	r.Rejoined = false
	w.DP.noteConnections(i)
}

func (c *Checker) published(w *World) *Snapshot {
	if w.pub == nil {
		w.pub = c.snaps.intern(&w.RV.Status, c.S.slotOf)
	}
	return w.pub
}

// canApply: the agent would apply something new.
func (c *Checker) canApply(w *World, i int) bool {
	r := &w.DP.Replicas[i]
	if !r.Alive || r.Returned || !r.AgentReady || !r.Exists {
		return false
	}
	pub := c.published(w)
	if r.Applied == pub {
		return false
	}
	// A replica that neither is nor was a member has nothing to do.
	return pub.Member(i) != nil || r.Applied.Member(i) != nil
}

func (c *Checker) canResync(w *World, i int) bool {
	dp := &w.DP
	r := &dp.Replicas[i]
	if !dp.configured(i) || r.Returned || r.UpToDate || r.DiskFailed || !r.Applied.Member(i).Type.HasDisk() {
		return false
	}
	for j := 0; j < dp.N; j++ {
		if j != i && dp.Connected(i, j, ^uint32(0)) {
			rj := &dp.Replicas[j]
			if rj.UpToDate && !rj.Returned && rj.Applied.Member(j).Type.HasDisk() {
				return true
			}
		}
	}
	return false
}

// actions lists what may happen next in w.
func (c *Checker) actions(w *World, buf []Action) []Action {
	s := c.S
	buf = append(buf[:0], Action{Kind: ActProcess, Slot: -1})
	for i := 0; i < w.DP.N; i++ {
		r := &w.DP.Replicas[i]
		sl := int8(i)
		if c.canApply(w, i) {
			buf = append(buf, Action{Kind: ActApply, Slot: sl})
		}
		if c.canResync(w, i) {
			buf = append(buf, Action{Kind: ActResync, Slot: sl})
		}
		up := r.Alive && !r.Returned
		if up && r.Exists && r.AgentReady && w.RestartsLeft > 0 {
			buf = append(buf, Action{Kind: ActRestart, Slot: sl})
		}
		if up && r.Exists && !r.AgentReady {
			buf = append(buf, Action{Kind: ActRecover, Slot: sl})
		}
		if up && r.Exists && w.LossesLeft > 0 {
			buf = append(buf, Action{Kind: ActLose, Slot: sl})
		}
		if !up && r.Exists && w.ForceLeave&(1<<i) == 0 {
			buf = append(buf, Action{Kind: ActForceLeave, Slot: sl})
		}
		if !r.Alive && r.Applied != nil && w.ReturnsLeft > 0 {
			buf = append(buf, Action{Kind: ActReturn, Slot: sl})
		}
		if r.Returned && r.Exists {
			buf = append(buf, Action{Kind: ActRejoin, Slot: sl})
		}
		if up && w.DiskFailsLeft > 0 && w.DP.configured(i) && !r.DiskFailed && r.Applied.Member(i).Type.HasDisk() {
			buf = append(buf, Action{Kind: ActDiskFail, Slot: sl})
		}
	}
	for k := range w.Wanted {
		if c.placeSlot(w, w.Wanted[k]) >= 0 {
			buf = append(buf, Action{Kind: ActPlace, Slot: -1, Arg: int8(k)})
		}
	}
	if w.RequestsLeft > 0 || w.AttachLeft > 0 {
		n := len(buf)
		buf = c.requests(w, buf)
		only := s.Only
		if w.RequestsLeft == 0 {
			only = attachKinds
			if s.Only != 0 {
				only &= s.Only
			}
		}
		if only != 0 {
			k := n
			for _, a := range buf[n:] {
				if only&(1<<a.Req) != 0 {
					buf[k] = a
					k++
				}
			}
			buf = buf[:k]
		}
	}
	return buf
}

// freeSlot is the slot placement uses for a new replica: the node's slot
// when the engine named one, else a never used slot on a live node, in
// TransZonal in the zone with the fewest replicas.
func (c *Checker) freeSlot(w *World, node int) int {
	if node >= 0 {
		r := &w.DP.Replicas[node]
		if r.Exists || r.Gone || !r.Alive {
			return -1
		}
		return node
	}
	best, bestN := -1, 1<<30
	for i := 0; i < w.DP.N; i++ {
		r := &w.DP.Replicas[i]
		if r.Exists || r.Gone || !r.Alive {
			continue
		}
		n := 0
		if c.S.Config.Topology == v1alpha1.TopologyTransZonal {
			for j := 0; j < w.DP.N; j++ {
				if w.DP.Replicas[j].Exists && w.DP.Replicas[j].Alive && !w.DP.Replicas[j].Returned && c.S.Slots[j].Zone == c.S.Slots[i].Zone {
					n++
				}
			}
		}
		if n < bestN {
			best, bestN = i, n
		}
	}
	return best
}

func (c *Checker) placeSlot(w *World, wr WantedReplica) int {
	switch wr.Action {
	case string(datamesh.WantCreate):
		return c.freeSlot(w, wr.Slot)
	case string(datamesh.WantDelete):
		if wr.Slot >= 0 && w.DP.Replicas[wr.Slot].Exists && !w.DP.Replicas[wr.Slot].Deleting {
			return wr.Slot
		}
	case string(datamesh.WantRetype):
		if wr.Slot >= 0 && w.DP.Replicas[wr.Slot].Exists && w.DP.Replicas[wr.Slot].SpecType != wr.Type {
			return wr.Slot
		}
	}
	return -1
}

// attachKinds are the requests Scenario.AttachRequests pays for.
const attachKinds = 1<<ReqAttach | 1<<ReqDetach

var configLayouts = [][2]int8{{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}, {1, 2}, {2, 1}, {2, 2}}

func (c *Checker) requests(w *World, buf []Action) []Action {
	s := c.S
	types := []v1alpha1.ReplicaType{v1alpha1.ReplicaTypeDiskful, v1alpha1.ReplicaTypeAccess, v1alpha1.ReplicaTypeTieBreaker}
	if s.Shadow {
		types = append(types, v1alpha1.ReplicaTypeShadowDiskful)
	}
	rvas := 0
	for i := 0; i < w.DP.N; i++ {
		if w.RVA&(1<<i) != 0 {
			rvas++
		}
	}
	freeAdded := false
	for i := 0; i < w.DP.N; i++ {
		r := &w.DP.Replicas[i]
		sl := int8(i)
		if w.RVA&(1<<i) != 0 {
			buf = append(buf, Action{Kind: ActRequest, Req: ReqDetach, Slot: sl})
		} else if r.Alive && !r.Returned && rvas < 2 && (r.Exists || (!r.Gone && !freeAdded)) {
			buf = append(buf, Action{Kind: ActRequest, Req: ReqAttach, Slot: sl})
		}
		if r.Exists && !r.Deleting && r.Alive && !r.Returned {
			buf = append(buf, Action{Kind: ActRequest, Req: ReqRemove, Slot: sl})
			for _, t := range types {
				if t != r.SpecType {
					buf = append(buf, Action{Kind: ActRequest, Req: ReqRetype, Slot: sl, Type: t})
				}
			}
		}
		if !r.Exists && !r.Gone && r.Alive && !freeAdded {
			freeAdded = true
			for _, t := range types {
				buf = append(buf, Action{Kind: ActRequest, Req: ReqAdd, Slot: sl, Type: t})
			}
		}
	}
	cfg := w.RV.Spec.ManualConfiguration
	for _, l := range configLayouts {
		df, dg := int(l[0])-int(cfg.FailuresToTolerate), int(l[1])-int(cfg.GuaranteedMinimumDataRedundancy)
		if df*df+dg*dg == 1 {
			buf = append(buf, Action{Kind: ActRequest, Req: ReqConfig, Slot: -1, FTT: l[0], GMDR: l[1]})
		}
	}
	if w.RV.Spec.MaxAttachments <= 1 {
		buf = append(buf, Action{Kind: ActRequest, Req: ReqMaxAttach, Slot: -1, Arg: 2})
	} else {
		buf = append(buf, Action{Kind: ActRequest, Req: ReqMaxAttach, Slot: -1, Arg: 1})
	}
	// A node maintenance (docs/operating.md, "Node maintenance") starts, or the
	// running one ends.
	buf = append(buf, Action{Kind: ActRequest, Req: ReqMaintenance, Slot: -1, Arg: 1 - w.ExtraFTT})
	return buf
}

// do applies a to w and returns the next world and the violations found in
// the step itself (those of Process). ok is false when the action turned
// out to change nothing.
func (c *Checker) do(w *World, a Action) (nw *World, ok bool, vs []Violation) {
	c.Stats.Transitions++
	if a.Kind == ActProcess {
		return c.process(w)
	}
	nw = w.Clone()
	i := int(a.Slot)
	var r *Replica
	if i >= 0 {
		r = &nw.DP.Replicas[i]
	}
	switch a.Kind {
	case ActApply:
		c.apply(nw, i)
	case ActResync:
		r.UpToDate = true
	case ActRestart:
		r.AgentReady = false
		nw.RestartsLeft--
	case ActRecover:
		r.AgentReady = true
	case ActLose:
		r.Alive, r.AgentReady = false, false
		nw.LossesLeft--
	case ActReturn:
		r.Alive, r.Returned = true, true
		nw.ReturnsLeft--
	case ActRejoin:
		r.Returned, r.Rejoined, r.AgentReady = false, true, true
		nw.ForceLeave &^= 1 << i
	case ActDiskFail:
		r.DiskFailed, r.UpToDate = true, false
		nw.DiskFailsLeft--
	case ActForceLeave:
		nw.ForceLeave |= 1 << i
		c.lostReplicas(nw)
	case ActPlace:
		wr := w.Wanted[a.Arg]
		j := c.placeSlot(w, wr)
		rj := &nw.DP.Replicas[j]
		switch wr.Action {
		case string(datamesh.WantCreate):
			*rj = Replica{Exists: true, SpecType: wr.Type, Alive: true, AgentReady: true}
		case string(datamesh.WantDelete):
			rj.Deleting = true
		case string(datamesh.WantRetype):
			rj.SpecType = wr.Type
		}
		nw.Wanted = append(nw.Wanted[:a.Arg:a.Arg], w.Wanted[a.Arg+1:]...)
	case ActRequest:
		if attachKinds&(1<<a.Req) != 0 && nw.AttachLeft > 0 {
			nw.AttachLeft--
		} else {
			nw.RequestsLeft--
		}
		switch a.Req {
		case ReqAttach:
			nw.RVA |= 1 << i
		case ReqDetach:
			nw.RVA &^= 1 << i
		case ReqAdd:
			*r = Replica{Exists: true, SpecType: a.Type, Alive: true, AgentReady: true}
		case ReqRemove:
			r.Deleting = true
		case ReqRetype:
			r.SpecType = a.Type
		case ReqConfig:
			nw.setRV(w.RV.DeepCopy())
			nw.RV.Generation++
			nw.RV.Spec.ManualConfiguration.FailuresToTolerate = int32(a.FTT)
			nw.RV.Spec.ManualConfiguration.GuaranteedMinimumDataRedundancy = int32(a.GMDR)
			nw.Floor.FailuresToTolerate = min(nw.Floor.FailuresToTolerate, int32(a.FTT))
			nw.Floor.GuaranteedMinimumDataRedundancy = min(nw.Floor.GuaranteedMinimumDataRedundancy, int32(a.GMDR))
		case ReqMaxAttach:
			nw.setRV(w.RV.DeepCopy())
			nw.RV.Generation++
			nw.RV.Spec.MaxAttachments = int32(a.Arg)
		case ReqMaintenance:
			nw.ExtraFTT = a.Arg
		}
	}
	return nw, true, nil
}
