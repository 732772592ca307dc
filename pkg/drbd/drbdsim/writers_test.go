package drbdsim

import (
	"strings"
	"testing"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// The two-writer record sees what quorum prevents: with quorum off, both halves of
// a partition promote and could write, and the record names them; with quorum (the
// captured configuration), the minority's promotion is refused and nothing is
// recorded.
func TestTwoWritersRecorded(t *testing.T) {
	off := formed(t, func(_ string, o *drbd.OptionSet) { o.Resource.Quorum = drbd.Ptr(drbd.QuorumOff) })
	off.c.Partition("node1")
	off.must(off.c.Node("node1").Primary(off.ctx, "r0", drbd.NoForce))
	off.must(off.c.Node("node2").Primary(off.ctx, "r0", drbd.NoForce))
	got := off.c.TwoWriters("r0")
	if len(got) != 1 || !strings.Contains(got[0], "node1 and node2 both Primary") {
		t.Fatalf("quorum off, both sides Primary: TwoWriters = %q, want one record of node1 and node2", got)
	}

	on := formed(t, nil)
	on.c.Partition("node1")
	on.must(on.c.Node("node2").Primary(on.ctx, "r0", drbd.NoForce))
	if err := on.c.Node("node1").Primary(on.ctx, "r0", drbd.NoForce); err == nil {
		t.Fatal("node1 alone promoted with quorum on")
	}
	if got := on.c.TwoWriters("r0"); len(got) > 0 {
		t.Fatalf("quorum on: TwoWriters = %q, want none", got)
	}
}
