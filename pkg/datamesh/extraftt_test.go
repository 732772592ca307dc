package datamesh

import (
	"testing"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// TestExtraFTT: Input.ExtraFTT (a node maintenance copying a volume elsewhere first)
// raises a formed volume to the layout that keeps quorum while one of its Diskful
// nodes is away, after DRBD's lost-peer agreement (layout.Layout.RaisedForMaintenance),
// through the ordinary adds and removals, without touching status.configuration; and
// clearing it takes the volume back to its configured layout. 1D becomes 3D (2D+1TB
// would lose quorum once the node is away), 2D+1TB becomes 3D (its TieBreaker goes
// once the third Diskful is in), and 5D, with no layout above it, stays.
func TestExtraFTT(t *testing.T) {
	var w *world
	converge := func(what string) {
		for i := 0; i < 30; i++ {
			if _, err := w.process(t); err != nil {
				t.Fatal(err)
			}
			w.place()
			w.settleAll(t)
		}
		t.Logf("%s:\n%s", what, w.status(false))
	}
	check := func(what string, d, tb, q, qmr int) {
		t.Helper()
		var gotD, gotTB int
		for _, m := range w.rv.Status.Datamesh.Members {
			switch m.Type {
			case v1.MemberTypeDiskful:
				gotD++
			case v1.MemberTypeTieBreaker:
				gotTB++
			}
		}
		dm := w.rv.Status.Datamesh
		if gotD != d || gotTB != tb || int(dm.Quorum) != q || int(dm.QuorumMinimumRedundancy) != qmr || len(w.rv.Status.DatameshTransitions) > 0 {
			t.Fatalf("%s: %dD+%dTB q=%d qmr=%d, %d transitions; want %dD+%dTB q=%d qmr=%d, none\n%s", what, gotD, gotTB,
				dm.Quorum, dm.QuorumMinimumRedundancy, len(w.rv.Status.DatameshTransitions), d, tb, q, qmr, w.status(true))
		}
	}
	for _, c := range []struct {
		ftt, gmdr                   int
		d, tb, q, qmr               int // configured
		raisedD, raisedTB, rq, rqmr int
	}{
		{0, 0, 1, 0, 1, 1, 3, 0, 2, 2},
		{1, 0, 2, 1, 2, 1, 3, 0, 2, 2},
		{2, 2, 5, 0, 3, 3, 5, 0, 3, 3},
	} {
		w = steadyWorld(t, c.ftt, c.gmdr, 0)
		check("formed", c.d, c.tb, c.q, c.qmr)
		w.extraFTT = 1
		converge("raised")
		check("raised", c.raisedD, c.raisedTB, c.rq, c.rqmr)
		if cfg := w.rv.Status.Configuration; int(cfg.FailuresToTolerate) != c.ftt || int(cfg.GuaranteedMinimumDataRedundancy) != c.gmdr {
			t.Fatalf("status.configuration changed: %+v", cfg)
		}
		w.extraFTT = 0
		converge("back")
		check("back", c.d, c.tb, c.q, c.qmr)
	}
}
