package drbdsim

import (
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// productQuorum is how meshvol's agent renders a 2D+1TB volume: the Diskful
// node1 and node2 at quorum 2, the TieBreaker node3 at quorum 32, quorate
// only through a connected UpToDate peer that reports quorum.
func productQuorum(node string, o *drbd.OptionSet) {
	q := 2
	if node == "node3" {
		q = 32
	}
	o.Resource.Quorum = drbd.Ptr(drbd.QuorumCount(q))
}

// A diskless node that connects to UpToDate peers while they have no quorum,
// and whose peers then regain it by connecting to each other, keeps showing
// quorum:no: the peers' reports of their new quorum change nothing else on
// it, and DRBD 9.2.18 computes quorum only in a state change that does
// (test/vm/FINDINGS.md, "The product on real DRBD", 13: a TieBreaker stayed so
// for ten minutes). RecomputeQuorum, a change of the quorum option and back,
// makes it compute afresh, and it shows quorum:yes.
func TestDisklessQuorumStaysStaleUntilRecomputed(t *testing.T) {
	rg := formed(t, productQuorum)
	rg.wantQuorum("node3", true)

	// As in the VM run: the TieBreaker drops out, then the Diskful nodes lose
	// each other (each has one vote of quorum 2 and no tiebreaker in reach).
	rg.c.Partition("node3")
	rg.c.Advance(2 * time.Second)
	rg.wantQuorum("node3", false)
	rg.wantQuorum("node1", true)
	rg.c.Cut("node1", "node2")
	rg.c.Advance(2 * time.Second)
	rg.wantQuorum("node1", false)
	rg.wantQuorum("node2", false)

	// The TieBreaker comes back first: its peers report no quorum.
	rg.c.Connect("node3", "node1")
	rg.c.Connect("node3", "node2")
	rg.c.Advance(15 * time.Second)
	rg.wantQuorum("node3", false)
	// Then the Diskful nodes find each other again and are quorate.
	rg.c.Heal()
	rg.c.Advance(15 * time.Second)
	rg.wantQuorum("node1", true)
	rg.wantQuorum("node2", true)
	st := rg.state("node3")
	for _, peer := range []string{"node1", "node2"} {
		if cs := connState(st, peer); cs != "Connected" {
			t.Fatalf("node3 → %s: %s, want Connected", peer, cs)
		}
	}
	rg.c.Advance(time.Minute)
	rg.wantQuorum("node3", false)

	rg.must(rg.c.Node("node3").RecomputeQuorum(rg.ctx, "r0", drbd.QuorumCount(32)))
	rg.wantQuorum("node3", true)
	if q := rg.c.Node("node3").res["r0"].cfg.Options.Resource.Quorum; q != drbd.QuorumCount(32) {
		t.Fatalf("node3 runs quorum %s after RecomputeQuorum, want 32", q)
	}
}

// RecomputeQuorum toggles an explicit count; a resource at quorum majority
// has no neutral neighbour, and the call says so instead of changing it.
func TestRecomputeQuorumNeedsACount(t *testing.T) {
	rg := formed(t, productQuorum)
	if err := rg.c.Node("node1").RecomputeQuorum(rg.ctx, "r0", drbd.QuorumMajority); err == nil {
		t.Fatal("RecomputeQuorum with quorum majority succeeded, want an error: it needs an explicit count")
	}
	if q := rg.c.Node("node1").res["r0"].cfg.Options.Resource.Quorum; q != drbd.QuorumCount(2) {
		t.Fatalf("node1 runs quorum %s after a refused RecomputeQuorum, want 2", q)
	}
}
