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
			t.Logf("%s: %d actions replayed:\n  %v\nend:\n%s", tc.name, len(trace), trace, end.String(s))
		})
	}
}

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
