package modelcheck

import (
	"sync"
	"testing"

	"github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh"
)

// TestMaintenanceUnderFaults spends each run's requests on node maintenance only
// (Input.ExtraFTT: docs/operating.md, "Node maintenance" copies a volume elsewhere
// before its node goes): a maintenance starts, and may end, while nodes are lost,
// return behind a partition and agents restart, and every invariant of
// docs/modelcheck.md holds on every state and every drained leaf. TestModelCheck
// explores maintenance among every other request; this spends the whole budget on it,
// so that the raise (layout.Layout.RaisedForMaintenance: 1D and 2D+1TB → 3D, 2D → 3D,
// 3D → 4D+1TB) and the removal back are reached at depth
// within the CI's time. It also checks that the search reached the raised layout —
// more Diskful members than the configuration asks for — so that a checker change
// that stops passing ExtraFTT to the engine fails here, not silently.
// -modelcheck.depth=deep (make modelcheck-maintenance) goes to depth 16;
// -modelcheck.maxdepth and -modelcheck.requests override the bounds
// (docs/modelcheck-findings.md, M1 needs depth 18).
func TestMaintenanceUnderFaults(t *testing.T) {
	for _, tc := range []struct {
		layout StartLayout
		topo   v1alpha1.Topology
		// raised: the Diskful members of the raised layout.
		raised int
	}{
		{StartLayouts[0], v1alpha1.TopologyZonal, 3},      // 1D → 3D
		{StartLayouts[1], v1alpha1.TopologyTransZonal, 3}, // 2D → 3D
		{StartLayouts[2], v1alpha1.TopologyZonal, 3},      // 2D+1TB → 3D
		{StartLayouts[3], v1alpha1.TopologyZonal, 4},      // 3D → 4D+1TB
	} {
		t.Run(tc.layout.Name, func(t *testing.T) {
			t.Parallel()
			// Three requests: a maintenance starts, ends and starts again (M2 needs
			// the third).
			b := Bounds{Depth: 14, Requests: 3, Losses: 1, Returns: 1, Restarts: 1, Spare: 2, MaxStates: 400000}
			if *depthFlag == "deep" {
				b.Depth, b.MaxStates = 16, 2000000
			}
			if *maxDepthFlag > 0 {
				b.Depth = *maxDepthFlag
			}
			if *requestsFlag >= 0 {
				b.Requests = int8(*requestsFlag)
			}
			s := NewScenario(tc.layout, false, tc.topo, b)
			s.Only = 1 << ReqMaintenance
			s.Name = "maintenance: " + s.Name
			eng := &diskfulCounter{p: datamesh.NewEngine(nil, datamesh.Features{})}
			c := NewChecker(s, eng)
			err := c.Run()
			t.Logf("%s: states=%d actions=%d capped=%v, at most %d Diskful members under maintenance", s.Name, c.Stats.States, c.Stats.Transitions, c.Stats.Capped, eng.max)
			if err != nil {
				for _, f := range c.Failures {
					t.Error(f)
				}
			}
			if eng.max < tc.raised {
				t.Errorf("%s: the search never reached the raised layout's %d Diskful members under maintenance (at most %d)", s.Name, tc.raised, eng.max)
			}
		})
	}
}

// diskfulCounter is the engine, noting the most Diskful members a datamesh had while
// Input.ExtraFTT was set.
type diskfulCounter struct {
	p   Processor
	mu  sync.Mutex
	max int
}

func (d *diskfulCounter) Process(in *datamesh.Input) (datamesh.Result, error) {
	res, err := d.p.Process(in)
	if err == nil && in.ExtraFTT > 0 {
		n := 0
		for _, m := range in.RV.Status.Datamesh.Members {
			if m.Type == v1alpha1.MemberTypeDiskful {
				n++
			}
		}
		d.mu.Lock()
		d.max = max(d.max, n)
		d.mu.Unlock()
	}
	return res, err
}
