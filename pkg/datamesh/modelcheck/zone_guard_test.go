package modelcheck

import (
	"testing"

	"github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// TestZoneGuardsWithASpareDiskful reaches what TestModelCheck's bounds do not: a
// TransZonal 3D volume that first gains a fourth Diskful (placed in the zone with the
// fewest replicas, so two share a zone) and then loses one by request. Only with the
// spare D does the FTT guard let a removal through, so only then do the zone guards
// decide: removing a D from a zone of its own leaves two copies in one zone, whose
// loss would leave no more than GMDR UpToDate copies. R-zone-guard states that rule
// by its meaning (rules.go); an engine change that skips or weakens the zone guards
// fails here. Two requests of any kind, no node loss, every confirmation order.
func TestZoneGuardsWithASpareDiskful(t *testing.T) {
	b := Bounds{Depth: 12, Requests: 2, Spare: 2, MaxStates: 200000}
	for _, l := range []StartLayout{StartLayouts[3]} { // 3D: FTT 1, GMDR 1
		s := NewScenario(l, false, v1alpha1.TopologyTransZonal, b)
		checkScenario(t, s)
	}
}
