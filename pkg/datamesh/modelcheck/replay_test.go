package modelcheck

import (
	"fmt"
	"testing"

	"github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh"
)

// TestFoundTracesKeepTheirInvariants replays, action by action, the traces of
// docs/modelcheck-findings.md that only the deep run reached, on the real engine, and
// checks every invariant after every action and on the drained end (I5 included) —
// the same checks as the search, on one path. What the engine answers to them is
// otherwise pinned only by scenario files' expected output, which a -rewrite run
// accepts; an engine change that brings a finding back fails here by what it breaks
// (a split, a transition that never ends), in milliseconds. An action the engine's
// answer makes impossible (the trace went elsewhere once fixed) is skipped, as a
// search would not take it.
func TestFoundTracesKeepTheirInvariants(t *testing.T) {
	for _, tc := range []struct {
		name   string
		layout StartLayout
		topo   v1alpha1.Topology
		shadow bool
		steps  []replayStep
	}{
		// D4 (I1w): a lost TieBreaker's removal cancelled before every member applied
		// it; an Access or D∅ join right after gives each side of a cut its own
		// tiebreaker majority.
		{"D4", StartLayouts[2], v1alpha1.TopologyZonal, false, []replayStep{
			act(ActRestart, 0), act(ActLose, 2), act(ActRecover, 0), act(ActReturn, 2),
			request(Action{Req: ReqConfig, Slot: -1, FTT: 0, GMDR: 0}), process(), place("Delete", 2), process(),
			act(ActApply, 0), act(ActForceLeave, 2), request(Action{Req: ReqAdd, Slot: 3, Type: v1alpha1.ReplicaTypeDiskful}),
			process(), act(ActApply, 0), act(ActApply, 3),
		}},
		// D2 (I5): a TieBreaker join waits for a lost voter whose removal waits for a
		// replacement no free node can host.
		{"D2", StartLayouts[2], v1alpha1.TopologyTransZonal, false, []replayStep{
			act(ActRestart, 0), act(ActLose, 1), act(ActRecover, 0), act(ActReturn, 1),
			request(Action{Req: ReqRemove, Slot: 2}), process(), place("Create", -1), process(),
			act(ActApply, 0), act(ActForceLeave, 1), process(), request(Action{Req: ReqAdd, Slot: 3, Type: v1alpha1.ReplicaTypeAccess}),
		}},
		// M1 (I5): a join lost at its last step (the hold's q↓), whose force removal
		// waits for a replacement no free node can host: the join ends without it.
		{"M1", StartLayouts[0], v1alpha1.TopologyZonal, false, []replayStep{
			request(Action{Req: ReqMaintenance, Slot: -1, Arg: 1}), process(), placeWanted(1), process(),
			act(ActApply, 0), act(ActApply, 1), process(), placeWanted(0), process(),
			act(ActApply, 0), act(ActApply, 2), process(), act(ActApply, 0), act(ActApply, 1), act(ActApply, 2),
			process(), act(ActApply, 2), act(ActLose, 2),
		}},
		// M3 (R-ratchet): a leaving D lost after its D∅ → A was published is
		// force-removed as an Access member; the q↓ after the removal must wait for the
		// TieBreaker, which still runs the lost member as a D.
		{"M3", StartLayouts[2], v1alpha1.TopologyZonal, false, []replayStep{
			act(ActRestart, 0), request(Action{Req: ReqConfig, Slot: -1, FTT: 0, GMDR: 0}), process(), act(ActRecover, 0),
			place("Delete", 1), process(), act(ActApply, 0), act(ActApply, 1), act(ActLose, 1), act(ActForceLeave, 1),
			request(Action{Req: ReqConfig, Slot: -1, FTT: 1, GMDR: 0}), process(), act(ActApply, 0),
		}},
		// D6 (R-zone-guard): a lost D returns and reports again, its replacement joins;
		// then in one reconcile the returned D steps down to shadow (D → sD, its zone
		// guards passed on the members they saw) and an Access replica joins in the
		// other D's zone, which takes the TieBreaker's diskless majority from that zone's
		// loss. The join waits for the leave (zone_guard_diskless_join.txt).
		{"D6", StartLayouts[2], v1alpha1.TopologyTransZonal, true, []replayStep{
			act(ActRestart, 0), act(ActLose, 0), act(ActForceLeave, 0), process(), act(ActReturn, 0), act(ActRejoin, 0),
			process(), act(ActApply, 0), act(ActApply, 1), act(ActApply, 2),
			request(Action{Req: ReqRetype, Slot: 0, Type: v1alpha1.ReplicaTypeShadowDiskful}), process(), placeWanted(0),
			request(Action{Req: ReqAdd, Slot: 4, Type: v1alpha1.ReplicaTypeAccess}),
		}},
		// D7 (R-ratchet, the checker's rule): 3D (1,1) lowered to FTT 0 starts removing
		// a D (D → D∅ applied, its copy given up); the configuration is raised back to
		// FTT 1 before D∅ → ✕. The removal finishes, the effective FTT falls to what the
		// two D provide, and the replacement the layout asks for brings it back
		// (ratchet_raise_mid_removal.txt; wantEffectiveFTT below).
		{"D7", StartLayouts[3], v1alpha1.TopologyZonal, false, []replayStep{
			request(Action{Req: ReqConfig, Slot: -1, FTT: 0, GMDR: 1}), process(), placeWanted(0), process(), act(ActApply, 2),
			request(Action{Req: ReqConfig, Slot: -1, FTT: 1, GMDR: 1}), process(), act(ActApply, 0), act(ActApply, 1), act(ActApply, 2),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewScenario(tc.layout, tc.shadow, tc.topo, Bounds{Depth: 64, Requests: 4, Losses: 1, Returns: 1, Restarts: 1, Spare: 2})
			c := NewChecker(s, datamesh.NewEngine(nil, datamesh.Features{ShadowDiskful: tc.shadow}))
			w, err := c.Initial()
			if err != nil {
				t.Fatal(err)
			}
			var trace []string
			report := func(when string, vs []Violation, w *World) {
				for _, v := range vs {
					t.Errorf("%s: %s: %s\ntrace:\n  %v\nstate:\n%s", when, v.Invariant, v.Detail, trace, w.String(s))
				}
			}
			for _, st := range tc.steps {
				a, ok := st(c, w)
				if !ok {
					trace = append(trace, "(skipped)")
					continue
				}
				trace = append(trace, a.String(s))
				nw, _, vs := c.do(w, a)
				report("after "+a.String(s), vs, nw)
				report("after "+a.String(s), checkDataPlane(s, &c.an, &nw.DP), nw)
				w = nw
			}
			end, vs := c.drain(w, false)
			report("drained", vs, end)
			if want, ok := wantEffectiveFTT[tc.name]; ok {
				if el := end.RV.Status.EffectiveLayout; el == nil || el.FailuresToTolerate != want {
					t.Errorf("drained: effective layout %+v, want FTT %d (the replacement restores it)\n%s", el, want, end.String(s))
				}
			}
			t.Logf("%s: %d actions replayed:\n  %v\nend:\n%s", tc.name, len(trace), trace, end.String(s))
		})
	}
}

// wantEffectiveFTT is the effective FTT a replayed trace must end with, where the
// finding was about the protection the volume returns to.
var wantEffectiveFTT = map[string]int32{"D7": 1}

// replayStep picks the next action in world w, or reports that the trace's action is
// not possible there.
type replayStep func(c *Checker, w *World) (Action, bool)

func act(k ActKind, slot int) replayStep {
	return func(c *Checker, w *World) (Action, bool) {
		a := Action{Kind: k, Slot: int8(slot)}
		return a, possible(c, w, a)
	}
}

func request(a Action) replayStep {
	a.Kind = ActRequest
	return func(c *Checker, w *World) (Action, bool) { return a, possible(c, w, a) }
}

func process() replayStep {
	return func(*Checker, *World) (Action, bool) { return Action{Kind: ActProcess, Slot: -1}, true }
}

// place does the engine's wish of that action on that slot (-1: any slot).
func place(action string, slot int) replayStep {
	return func(c *Checker, w *World) (Action, bool) {
		for k, x := range w.Wanted {
			if x.Action == action && (slot < 0 || x.Slot == slot) && c.placeSlot(w, x) >= 0 {
				return Action{Kind: ActPlace, Slot: -1, Arg: int8(k)}, true
			}
		}
		return Action{}, false
	}
}

// placeWanted does the engine's k-th wish, as the search's "placement wanted[k]".
func placeWanted(k int) replayStep {
	return func(c *Checker, w *World) (Action, bool) {
		if k >= len(w.Wanted) || c.placeSlot(w, w.Wanted[k]) < 0 {
			return Action{}, false
		}
		return Action{Kind: ActPlace, Slot: -1, Arg: int8(k)}, true
	}
}

// possible: the search could take a in w (it is among the actions it lists).
func possible(c *Checker, w *World, a Action) bool {
	for _, x := range c.actions(w, nil) {
		if fmt.Sprint(x) == fmt.Sprint(a) {
			return true
		}
	}
	return false
}

// A lost node whose agent reports again before its member's force removal started
// (ActRejoin) keeps its membership: the engine withdraws the ForceLeave
// (docs/datamesh.md, "A lost node that comes back"), and every invariant holds on the
// way and on the drained end. 3D, the removal held by another member's silent agent
// (staleAgent), which lets the lost node come back first.
func TestRejoinedNodeKeepsItsMembership(t *testing.T) {
	s := NewScenario(StartLayouts[3], false, v1alpha1.TopologyZonal, Bounds{Depth: 64, Requests: 4, Losses: 1, Returns: 1, Restarts: 1, Spare: 2})
	c := NewChecker(s, datamesh.NewEngine(nil, datamesh.Features{}))
	w, err := c.Initial()
	if err != nil {
		t.Fatal(err)
	}
	var trace []string
	check := func(when string, vs []Violation, w *World) {
		t.Helper()
		for _, v := range vs {
			t.Errorf("%s: %s: %s\ntrace:\n  %v\nstate:\n%s", when, v.Invariant, v.Detail, trace, w.String(s))
		}
	}
	forceLeaveRequest := func(w *World) string {
		for _, r := range w.RV.Status.DatameshReplicaRequests {
			if r.Name == "r0" && r.Operation == v1alpha1.ReplicaOperationForceLeave {
				return r.Message
			}
		}
		return ""
	}
	steps := []replayStep{act(ActRestart, 1), act(ActLose, 0), act(ActForceLeave, 0), process(), act(ActReturn, 0)}
	run := func(steps []replayStep) {
		for _, st := range steps {
			a, ok := st(c, w)
			if !ok {
				t.Fatalf("action not possible after %v\nstate:\n%s", trace, w.String(s))
			}
			trace = append(trace, a.String(s))
			nw, _, vs := c.do(w, a)
			check("after "+a.String(s), vs, nw)
			check("after "+a.String(s), checkDataPlane(s, &c.an, &nw.DP), nw)
			w = nw
		}
	}
	run(steps)
	if msg := forceLeaveRequest(w); msg == "" || !memberOf(&w.RV.Status, "r0") {
		t.Fatalf("before the return: want r0 a member with a blocked ForceLeave, got request %q\nstate:\n%s", msg, w.String(s))
	}
	run([]replayStep{act(ActRejoin, 0), act(ActRecover, 1), process()})
	if msg := forceLeaveRequest(w); msg != "" || !memberOf(&w.RV.Status, "r0") {
		t.Fatalf("after r0's agent reports again: want r0 a member without a ForceLeave, got request %q\nstate:\n%s", msg, w.String(s))
	}
	// The checker deletes a force-left replica's RVR at once (ActForceLeave; the
	// controller does so only once the member is out), so r0 then leaves, by an
	// ordinary RemoveReplica that waits for it, not by force.
	end, vs := c.drain(w, false)
	check("drained", vs, end)
	for _, r := range end.RV.Status.DatameshReplicaRequests {
		if r.Name == "r0" && (r.Operation != v1alpha1.ReplicaOperationLeave || r.Message != "Left datamesh successfully") {
			t.Fatalf("drained: r0's request is %s %q, want an ordinary Leave\n%s", r.Operation, r.Message, end.String(s))
		}
	}
}
