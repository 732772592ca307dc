package drbdsim

import (
	"slices"
	"testing"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// A replica that misses many acknowledged blocks is reported with the
// lowest of them, every time: the message does not depend on map order.
// (With ~40 blocks, choosing one in map order gave a different block on
// almost every call.)
func TestLackingReportsLowestBlockDeterministically(t *testing.T) {
	rg := formed(t, qmr2)
	rg.must(rg.c.Node("node1").Primary(rg.ctx, "r0", drbd.NoForce))
	rg.c.Cut("node1", "node2")
	rg.c.Cut("node2", "node3")
	// Written from the top down so that the lowest block is not also the
	// first one remembered.
	for blk := int64(42); blk >= 3; blk-- {
		rg.must(rg.write("node1", blk*blockSize, blockSize))
	}
	rg.noLostWrites()
	want := []string{"node2: block 3 (offset 12288) lacks an acknowledged write"}
	for i := range 50 {
		if got := rg.c.StaleUpToDate("r0"); !slices.Equal(got, want) {
			t.Fatalf("call %d: StaleUpToDate = %q, want %q", i, got, want)
		}
	}
}
