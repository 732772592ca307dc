package drbdsim

import (
	"context"
	"slices"
	"testing"
	"time"

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

// The acknowledged-write check reads every acknowledged block of every
// UpToDate replica; it must not hold the cluster lock for all of it, or a
// device request waits behind it (on a loaded machine past the device
// watchdog, which then fails every device: docs/soak.md, Findings). Between
// batches a write through the Primary goes through, and the check still
// names exactly the block the cut-off replica lacks, and nothing the
// Primary holds.
func TestLackingReleasesTheLockBetweenBatches(t *testing.T) {
	rg, _ := formedWithPrimary(t)
	const blocks = 3 * lackingBatch
	for blk := int64(0); blk < blocks; blk++ {
		rg.must(rg.write("node1", blk*blockSize, blockSize))
	}
	rg.c.Cut("node1", "node2")
	rg.c.Cut("node2", "node3")
	last := int64(blocks - 1)
	rg.must(rg.c.Node("node1").Write(rg.ctx, "r0", last*blockSize, pattern(7, blockSize)))

	between := 0
	rg.c.afterLackingBatch = func() {
		between++
		// A device request: it needs the cluster lock, which the check
		// must have released.
		ctx, cancel := context.WithTimeout(rg.ctx, 10*time.Second)
		defer cancel()
		rg.must(rg.c.Node("node1").Write(ctx, "r0", last*blockSize, pattern(byte(between), blockSize)))
	}

	want := []string{"node2: block 767 (offset 3141632) lacks an acknowledged write"}
	if got := rg.c.StaleUpToDate("r0"); !slices.Equal(got, want) {
		t.Fatalf("StaleUpToDate = %q, want %q", got, want)
	}
	// node1: three batches, two pauses; node2 the same (its lacking block is
	// in the last batch).
	if between != 4 {
		t.Fatalf("the check paused %d times between batches, want 4 (2 replicas × 3 batches of %d)", between, lackingBatch)
	}
	rg.noLostWrites()
}
