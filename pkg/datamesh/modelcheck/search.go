package modelcheck

import (
	"fmt"
	"sort"

	"github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// statusHash hashes what of a status the engine acts on: the datamesh, the
// transitions with their steps, the requests, the configuration and the
// effective layout. Messages and timestamps are left out: they are output
// for people (the engine decides nothing on them), and they carry counters
// that would make equal states look different.
func statusHash(st *v1alpha1.ReplicatedVolumeStatus) uint64 {
	var h hasher
	h.init()
	h.i64(st.DatameshRevision)
	if c := st.Configuration; c != nil {
		h.i64(int64(c.FailuresToTolerate))
		h.i64(int64(c.GuaranteedMinimumDataRedundancy))
		h.str(string(c.Topology))
		h.str(string(c.VolumeAccess))
	} else {
		h.str("nocfg")
	}
	if e := st.EffectiveLayout; e != nil {
		h.i64(int64(e.FailuresToTolerate))
		h.i64(int64(e.GuaranteedMinimumDataRedundancy))
	} else {
		h.str("noeff")
	}
	dm := &st.Datamesh
	h.i64(int64(dm.Quorum))
	h.i64(int64(dm.QuorumMinimumRedundancy))
	h.bool(dm.Multiattach)
	idx := make([]int, len(dm.Members))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return dm.Members[idx[a]].Name < dm.Members[idx[b]].Name })
	for _, i := range idx {
		m := &dm.Members[i]
		h.str(m.Name)
		h.str(string(m.Type))
		h.str(m.Zone)
		h.i64(int64(m.NodeID))
		h.bool(m.Attached)
	}
	for i := range st.DatameshTransitions {
		t := &st.DatameshTransitions[i]
		h.str(string(t.Type))
		h.str(t.ReplicaName)
		h.str(string(t.FromType))
		h.str(string(t.ToType))
		h.str(t.PlanID)
		h.i64(int64(t.PlanVersion))
		for j := range t.Steps {
			h.str(t.Steps[j].Name)
			h.str(string(t.Steps[j].Status))
			h.i64(t.Steps[j].DatameshRevision)
		}
	}
	h.str("requests")
	for i := range st.DatameshReplicaRequests {
		r := &st.DatameshReplicaRequests[i]
		h.str(r.Name)
		h.str(string(r.Operation))
		h.str(string(r.Type))
	}
	for i := range st.Conditions {
		h.str(st.Conditions[i].Type)
		h.str(string(st.Conditions[i].Status))
		h.str(st.Conditions[i].Reason)
	}
	return h.sum()
}

// dpHash hashes the data plane: enough to memoise the partition analysis.
func dpHash(dp *DataPlane) uint64 {
	var h hasher
	h.init()
	for i := 0; i < dp.N; i++ {
		r := &dp.Replicas[i]
		h.bool(r.Alive)
		h.bool(r.Returned)
		h.bool(r.Rejoined)
		h.bool(r.UpToDate)
		h.bool(r.DiskFailed)
		if r.Applied != nil {
			h.i64(int64(r.Applied.hash))
		} else {
			h.i64(0)
		}
		h.i64(int64(dp.Seen[i]))
	}
	return h.sum()
}

func (c *Checker) worldHash(w *World) uint64 {
	var h hasher
	h.init()
	h.i64(int64(w.statusHash()))
	cfg := w.RV.Spec.ManualConfiguration
	h.i64(int64(cfg.FailuresToTolerate))
	h.i64(int64(cfg.GuaranteedMinimumDataRedundancy))
	h.i64(int64(w.RV.Spec.MaxAttachments))
	h.i64(int64(w.Floor.FailuresToTolerate))
	h.i64(int64(w.Floor.GuaranteedMinimumDataRedundancy))
	h.i64(int64(dpHash(&w.DP)))
	for i := 0; i < w.DP.N; i++ {
		r := &w.DP.Replicas[i]
		h.bool(r.Exists)
		h.bool(r.Gone)
		h.str(string(r.SpecType))
		h.bool(r.Deleting)
		h.bool(r.AgentReady)
	}
	h.i64(int64(w.RVA))
	h.i64(int64(w.ForceLeave))
	h.i64(int64(w.ExtraFTT))
	for _, x := range w.Wanted {
		h.str(x.Action)
		h.str(string(x.Type))
		h.i64(int64(x.Slot))
	}
	return h.sum()
}

// budget is what a run may still do from a state. A state visited with a
// budget at least as large in every dimension has already explored
// everything this visit could: the visit is dominated and skipped.
type budget struct {
	losses, restarts, requests, attach, returns, diskFails int8
	depth                                                  int16
}

// covers: b can do everything o can. An attach request left is worth less than a
// general one (a general request may be an attach), so o's attach budget may be
// paid from b's general requests left over.
func (b budget) covers(o budget) bool {
	spare := b.requests - o.requests
	return b.losses >= o.losses && b.restarts >= o.restarts && b.returns >= o.returns && b.diskFails >= o.diskFails && spare >= 0 &&
		b.attach+spare >= o.attach && b.depth >= o.depth
}

// visit records a visit of state h with budget b; false if dominated.
func (c *Checker) visit(h uint64, b budget) bool {
	seen, ok := c.visited[h]
	if !ok {
		c.Stats.States++
	}
	for _, e := range seen {
		if e.covers(b) {
			return false
		}
	}
	kept := seen[:0]
	for _, e := range seen {
		if !b.covers(e) {
			kept = append(kept, e)
		}
	}
	c.visited[h] = append(kept, b)
	return true
}

// Initial builds the starting world: the scenario's replicas are created
// and the engine forms the datamesh with every replica confirming at once
// (formation skips the initial sync: every disk starts UpToDate).
func (c *Checker) Initial() (*World, error) {
	s := c.S
	w := &World{RV: s.newRV(), LossesLeft: s.Losses, RestartsLeft: s.Restarts, RequestsLeft: s.Requests, AttachLeft: s.AttachRequests, ReturnsLeft: s.Returns, DiskFailsLeft: s.DiskFailures,
		Floor: v1alpha1.Layout{FailuresToTolerate: s.Config.FailuresToTolerate, GuaranteedMinimumDataRedundancy: s.Config.GuaranteedMinimumDataRedundancy}}
	w.DP.N = len(s.Slots)
	w.DP.Shadow = s.Shadow
	for i := range s.Slots {
		w.DP.Replicas[i] = Replica{Alive: true, AgentReady: true}
	}
	for i, t := range s.Initial {
		w.DP.Replicas[i].Exists = true
		w.DP.Replicas[i].SpecType = t
	}
	nw, vs := c.drain(w, true)
	if len(vs) > 0 {
		return nil, fmt.Errorf("formation of %s: %v\n%s", s.Name, vs, nw.String(s))
	}
	if s.AttachFirst {
		// Start with the volume in use on the first replica's node: a
		// Primary exists, so detach, attach-elsewhere, removal of an
		// attached member and force-detach of a lost one are all in reach
		// of a single request or loss.
		nw.RVA |= 1
		nw, vs = c.drain(nw, false)
		if len(vs) > 0 {
			return nil, fmt.Errorf("first attach of %s: %v\n%s", s.Name, vs, nw.String(s))
		}
	}
	nw.Wanted = nil
	return nw, nil
}

// drain lets the system settle with nothing going wrong: lost nodes are
// declared, agents come back, placement does what the engine wants, every
// live replica applies and resyncs, and the controller reconciles, until
// nothing changes. It then checks I5: no transition is left, and every
// request and attachment that is not done says why.
func (c *Checker) drain(w *World, formation bool) (*World, []Violation) {
	c.drainTrace = c.drainTrace[:0]
	note := func(f string, a ...any) {
		if len(c.drainTrace) < 400 {
			c.drainTrace = append(c.drainTrace, fmt.Sprintf(f, a...))
		}
	}
	w = w.Clone()
	var path []uint64
	const rounds = 64
	for round := 0; round < rounds; round++ {
		for i := 0; i < w.DP.N; i++ {
			r := &w.DP.Replicas[i]
			if r.Exists && (!r.Alive || r.Returned) && w.ForceLeave&(1<<i) == 0 {
				w.ForceLeave |= 1 << i
				c.lostReplicas(w)
				note("force-leave %s", c.S.Slots[i].Name)
			}
			if r.Alive && !r.Returned && r.Exists && !r.AgentReady {
				r.AgentReady = true
				note("agent back %s", c.S.Slots[i].Name)
			}
		}
		h := c.worldHash(w)
		if formation {
			// Formation marks disks UpToDate on apply: another drain
			// from the same state would not, so it neither uses nor
			// feeds the memo.
			h = 0
		}
		if h != 0 && c.drainOK[h] {
			c.markDrained(path)
			return w, nil
		}
		path = append(path, h)
		nw, _, vs := c.process(w)
		changed := nw.statusHash() != w.statusHash() || nw.gcChanged(w)
		note("Process → %s", compact(nw))
		if len(vs) > 0 {
			return nw, vs
		}
		w = nw
		for len(w.Wanted) > 0 {
			wr := w.Wanted[0]
			if j := c.placeSlot(w, wr); j >= 0 {
				note("placement %s %s %s", wr.Action, wr.Type, c.S.Slots[j].Name)
				x, _, _ := c.do(w, Action{Kind: ActPlace, Slot: -1, Arg: 0})
				w = x
				changed = true
			} else {
				w.Wanted = w.Wanted[1:]
			}
		}
		for i := 0; i < w.DP.N; i++ {
			if c.canApply(w, i) {
				c.apply(w, i)
				note("apply %s", c.S.Slots[i].Name)
				changed = true
				if formation {
					w.DP.Replicas[i].UpToDate = true
				}
			}
		}
		for again := true; again; {
			again = false
			for i := 0; i < w.DP.N; i++ {
				if c.canResync(w, i) {
					note("resync %s", c.S.Slots[i].Name)
					w.DP.Replicas[i].UpToDate = true
					again, changed = true, true
				}
			}
		}
		if !changed {
			vs := c.settled(w)
			if len(vs) == 0 {
				c.markDrained(path)
			}
			return w, vs
		}
	}
	return w, []Violation{{InvLiveness, fmt.Sprintf("no fixpoint after %d rounds of reconcile with every replica confirming", rounds)}}
}

// markDrained remembers that draining from these states ends well: a later
// drain that reaches one of them stops there.
func (c *Checker) markDrained(path []uint64) {
	for _, h := range path {
		if h != 0 {
			c.drainOK[h] = true
		}
	}
}

// settled is I5 on a fixpoint.
func (c *Checker) settled(w *World) []Violation {
	var out []Violation
	st := &w.RV.Status
	// With no live UpToDate disk left (a 1D volume lost its node) the data
	// is gone: a step that waits for UpToDate data waits for ever, rightly.
	// Then only the message is required.
	dataLeft := false
	for i := 0; i < w.DP.N; i++ {
		r := &w.DP.Replicas[i]
		if w.DP.configured(i) && !r.Returned && r.UpToDate && r.Applied.Member(i).Type.HasDisk() {
			dataLeft = true
		}
	}
	for _, t := range st.DatameshTransitions {
		msg := ""
		for _, sp := range t.Steps {
			if sp.Status != v1alpha1.StepCompleted && msg == "" {
				msg = sp.Message
			}
		}
		switch {
		case dataLeft:
			out = append(out, Violation{InvLiveness, fmt.Sprintf("transition %s %s never completes although every live replica confirmed (step message %q)", t.Type, t.ReplicaName, msg)})
		case msg == "":
			out = append(out, Violation{InvMessage, fmt.Sprintf("transition %s %s waits (no UpToDate data left) without a message", t.Type, t.ReplicaName)})
		}
	}
	for _, a := range w.Attachments {
		if !a.Attached && a.Message == "" {
			out = append(out, Violation{InvMessage, fmt.Sprintf("attachment %s on %s is %s without a message", a.Name, a.NodeName, a.Phase)})
		}
	}
	for _, r := range st.DatameshReplicaRequests {
		if r.Message == "" {
			out = append(out, Violation{InvMessage, fmt.Sprintf("request %s %s %s waits without a message", r.Operation, r.Name, r.Type)})
		}
	}
	return out
}

// Run explores every state reachable within the scenario's bounds.
func (c *Checker) Run() error {
	w0, err := c.Initial()
	if err != nil {
		return err
	}
	c.dfs(w0, c.S.MaxDepth)
	if len(c.Failures) > 0 {
		return c.Failures[0]
	}
	return nil
}

func (c *Checker) fail(w *World, v Violation) {
	key := v.Invariant
	if c.seenInv[key] || len(c.Failures) >= c.MaxFailures {
		return
	}
	c.seenInv[key] = true
	f := &Failure{Violation: v, Scenario: c.S.Name, State: w.String(c.S)}
	for _, a := range c.trace {
		f.Trace = append(f.Trace, a.String(c.S))
	}
	c.Failures = append(c.Failures, f)
}

func (c *Checker) dfs(w *World, depth int) {
	if len(c.Failures) >= c.MaxFailures || c.Stats.Capped {
		return
	}
	if c.S.MaxStates > 0 && c.Stats.States >= c.S.MaxStates {
		c.Stats.Capped = true
		return
	}
	if !c.visit(c.worldHash(w), budget{w.LossesLeft, w.RestartsLeft, w.RequestsLeft, w.AttachLeft, w.ReturnsLeft, w.DiskFailsLeft, int16(depth)}) {
		return
	}
	if n := c.S.MaxDepth - depth; n > c.Stats.MaxDepth {
		c.Stats.MaxDepth = n
	}

	// Data-plane invariants, memoised: many states share one data plane.
	dh := dpHash(&w.DP)
	vs, ok := c.dpMemo[dh]
	if !ok {
		vs = checkDataPlane(c.S, &c.an, &w.DP)
		c.dpMemo[dh] = vs
	}
	for _, v := range vs {
		c.fail(w, v)
	}
	if len(vs) > 0 {
		return
	}

	if depth == 0 {
		c.leaf(w)
		return
	}
	var buf [64]Action
	acts := c.actions(w, buf[:0])
	moved := false
	for _, a := range acts {
		nw, changed, vs := c.do(w, a)
		if !changed && len(vs) == 0 {
			continue
		}
		moved = true
		c.trace = append(c.trace, a)
		for _, v := range vs {
			c.fail(nw, v)
		}
		if len(vs) == 0 {
			c.dfs(nw, depth-1)
		}
		c.trace = c.trace[:len(c.trace)-1]
	}
	if !moved {
		// Nothing can happen any more: a final state. Check liveness here
		// as at the depth bound.
		c.leaf(w)
	}
}

// leaf drains w and reports what the drain finds, with the drain's own
// steps appended to the trace.
func (c *Checker) leaf(w *World) {
	c.Stats.Leaves++
	end, lv := c.drain(w, false)
	if len(lv) == 0 {
		return
	}
	n := len(c.trace)
	for _, v := range lv {
		if c.seenInv[v.Invariant] || len(c.Failures) >= c.MaxFailures {
			continue
		}
		c.fail(end, v)
		f := c.Failures[len(c.Failures)-1]
		f.Trace = append(f.Trace, "--- drain (every replica confirms) ---")
		f.Trace = append(f.Trace, c.drainTrace...)
	}
	c.trace = c.trace[:n]
}

// compact is a one-line summary of the published datamesh for drain traces.
func compact(w *World) string {
	st := &w.RV.Status
	out := fmt.Sprintf("rev=%d q=%d qmr=%d [", st.DatameshRevision, st.Datamesh.Quorum, st.Datamesh.QuorumMinimumRedundancy)
	for i, m := range st.Datamesh.Members {
		if i > 0 {
			out += " "
		}
		out += m.Name + ":" + shortType(m.Type)
		if m.Attached {
			out += "*"
		}
	}
	out += "]"
	for _, t := range st.DatameshTransitions {
		step := ""
		for _, sp := range t.Steps {
			if sp.Status == v1alpha1.StepActive {
				step = sp.Name
			}
		}
		out += fmt.Sprintf(" %s(%s %s)", t.Type, t.ReplicaName, step)
	}
	for _, x := range w.Wanted {
		out += fmt.Sprintf(" want:%s/%s", x.Action, x.Type)
	}
	return out
}
