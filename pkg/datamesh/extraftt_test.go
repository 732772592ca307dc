package datamesh

import (
	"testing"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// TestExtraFTT: Input.ExtraFTT (a node maintenance copying a volume elsewhere first)
// takes a formed 1D volume to 2D+1TB through the ordinary adds — the TieBreaker is
// what lets the copy keep quorum once the first node goes — without touching
// status.configuration, and clearing it takes the volume back to 1D through the
// ordinary removals.
func TestExtraFTT(t *testing.T) {
	w := steadyWorld(t, 0, 0, 0)
	converge := func(what string) {
		for i := 0; i < 20; i++ {
			if _, err := w.process(t); err != nil {
				t.Fatal(err)
			}
			w.place()
			w.settleAll(t)
		}
		t.Logf("%s:\n%s", what, w.status(false))
	}
	shape := func() (d, tb int) {
		for _, m := range w.rv.Status.Datamesh.Members {
			switch m.Type {
			case v1.MemberTypeDiskful:
				d++
			case v1.MemberTypeTieBreaker:
				tb++
			}
		}
		return d, tb
	}
	if d, tb := shape(); d != 1 || tb != 0 {
		t.Fatalf("formed: %dD+%dTB, want 1D", d, tb)
	}
	w.extraFTT = 1
	converge("raised")
	if d, tb := shape(); d != 2 || tb != 1 || w.rv.Status.Datamesh.Quorum != 2 || w.rv.Status.Datamesh.QuorumMinimumRedundancy != 1 {
		t.Fatalf("raised: %dD+%dTB q=%d qmr=%d, want 2D+1TB q=2 qmr=1\n%s", d, tb,
			w.rv.Status.Datamesh.Quorum, w.rv.Status.Datamesh.QuorumMinimumRedundancy, w.status(true))
	}
	if c := w.rv.Status.Configuration; c.FailuresToTolerate != 0 || c.GuaranteedMinimumDataRedundancy != 0 {
		t.Fatalf("status.configuration changed: %+v", c)
	}
	w.extraFTT = 0
	converge("back")
	if d, tb := shape(); d != 1 || tb != 0 || w.rv.Status.Datamesh.Quorum != 1 {
		t.Fatalf("back: %dD+%dTB q=%d, want 1D q=1\n%s", d, tb, w.rv.Status.Datamesh.Quorum, w.status(true))
	}
	// A raise the layout rules refuse (2D+1TB is FTT 1, GMDR 0: FTT 2 needs GMDR 1) is
	// ignored.
	w = steadyWorld(t, 1, 0, 0)
	w.extraFTT = 1
	converge("refused raise")
	if d, tb := shape(); d != 2 || tb != 1 {
		t.Fatalf("refused raise: %dD+%dTB, want 2D+1TB", d, tb)
	}
}
