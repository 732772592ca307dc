package modelcheck

import (
	"testing"

	"github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// TestLossesUnderMembershipChanges reaches, within the CI's time, two findings that
// only the deep run reached (docs/modelcheck-findings.md, "Deep run of 2026-11-26", D1
// and D3). Each case spends its whole budget on the requests that start the membership
// change (TestModelCheck's bounds spend it on every kind) and checks every invariant of
// docs/modelcheck.md on every state and every drained leaf. The engine's answers to
// these findings are otherwise pinned only by scenario files' expected output, which a
// -rewrite run accepts (docs/modelcheck.md, "Mutation check"); an engine change that
// takes one away fails here by what it breaks — a split, an effective FTT below the
// configuration — whatever line it touches.
func TestLossesUnderMembershipChanges(t *testing.T) {
	for _, tc := range []struct {
		name   string
		layout StartLayout
		topo   v1alpha1.Topology
		only   uint32
		b      Bounds
	}{
		// D1 (a split): an AddReplica in flight publishes D∅ → D and q↓ while a lost
		// voter's removal is unconfirmed (docs/datamesh.md "A voter lost under a
		// transition in flight": it pauses).
		{"voter lost under a join", StartLayouts[2], v1alpha1.TopologyTransZonal, 1 << ReqAdd,
			Bounds{Depth: 14, Requests: 1, Losses: 1, Returns: 1, Restarts: 1, Spare: 2, MaxStates: 400000}},
		// D3 (the effective FTT below the configuration): a D retyped away leaves two
		// voters without the TieBreaker the configuration needs (a voter leaves only
		// with it: membership.go leavingDGuards).
		{"voter leaves before the tiebreaker", StartLayouts[0], v1alpha1.TopologyZonal, 1<<ReqRetype | 1<<ReqConfig | 1<<ReqAdd,
			Bounds{Depth: 14, Requests: 3, Spare: 2, MaxStates: 400000}},
	} {
		tc := tc
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := NewScenario(tc.layout, false, tc.topo, tc.b)
			s.Only = tc.only
			s.Name = tc.name + ": " + s.Name
			checkScenario(t, s)
		})
	}
}
