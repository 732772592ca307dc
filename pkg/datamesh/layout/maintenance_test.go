package layout

import "testing"

// TestRaisedForMaintenance: every allowed layout, whether it keeps quorum while one
// of its D is away once DRBD's lost-peer agreement has run, and what a node
// maintenance raises it to (docs/operating.md, "Copying a volume elsewhere before its
// node goes").
func TestRaisedForMaintenance(t *testing.T) {
	for _, c := range []struct {
		l      Layout
		keeps  bool
		raised string // "" when nothing is above it
	}{
		{Layout{0, 0}, false, "3D"},
		{Layout{0, 1}, false, "3D"},
		{Layout{0, 2}, false, "4D"},
		{Layout{1, 0}, false, "3D"},
		{Layout{1, 1}, true, "4D+1TB"},
		{Layout{1, 2}, true, "5D"},
		{Layout{2, 1}, true, "5D"},
		{Layout{2, 2}, true, ""},
	} {
		if got := c.l.KeepsQuorumWithoutOneD(); got != c.keeps {
			t.Errorf("%v (FTT=%d, GMDR=%d): keeps quorum without one D after the agreement: %v, want %v", c.l, c.l.FTT, c.l.GMDR, got, c.keeps)
		}
		r, ok := c.l.RaisedForMaintenance()
		switch {
		case c.raised == "" && ok:
			t.Errorf("%v raised to %v, want nothing above it", c.l, r)
		case c.raised != "" && (!ok || r.String() != c.raised):
			t.Errorf("%v raised to %v (ok=%v), want %s", c.l, r, ok, c.raised)
		case ok && (!r.KeepsQuorumWithoutOneD() || r.FTT < c.l.FTT || r.GMDR < c.l.GMDR):
			t.Errorf("%v raised to %v, which does not keep quorum without one D or lowers a level", c.l, r)
		}
	}
	if (Layout{2, 0}).KeepsQuorumWithoutOneD() {
		t.Error("an invalid layout (FTT=2, GMDR=0) keeps quorum")
	}
	l := Layout{1, 0}
	if n := testing.AllocsPerRun(100, func() { var r Layout; r, sinkBool = l.RaisedForMaintenance(); sinkInt = r.FTT }); n != 0 {
		t.Errorf("RaisedForMaintenance: %v allocations per call, want 0", n)
	}
}
