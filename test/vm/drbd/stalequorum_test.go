//go:build vmtest

package drbd_test

import (
	"regexp"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/contract"
)

// TestDisklessQuorumStaysStale is drbdsim's
// TestDisklessQuorumStaysStaleUntilRecomputed on real DRBD, with the quorum
// options meshvol renders for 2D+1TB (node1 and node2 quorum 2, the diskless
// node3 quorum 32, so quorate only through a connected UpToDate peer that
// reported quorum): node3 is cut off, node1 and node2 lose each other and
// their quorum, node3 connects to both again while they have none, then they
// connect to each other and regain it. node3 is Connected to two quorate
// UpToDate peers and shows quorum:no (test/vm/FINDINGS.md, "The product on
// real DRBD", 13) until drbd.Driver's RecomputeQuorum, after which it shows
// quorum:yes.
func TestDisklessQuorumStaysStale(t *testing.T) {
	h := healthy(t)
	h.tune = func(o *drbd.OptionSet) { o.Resource.OnNoQuorum = drbd.Ptr(drbd.OnNoQuorumSuspendIO) }
	defer func() { _ = healAll() }()
	for _, n := range contract.Nodes {
		q := 2
		if n == "node3" {
			q = 32
		}
		res := h.Resource(n)
		res.Options.Resource.Quorum = drbd.QuorumCount(q)
		if err := cl.nodes[n].WriteConfig(bg, res); err != nil {
			t.Fatalf("%s: write config: %v", n, err)
		}
		if err := cl.nodes[n].Adjust(bg, r0); err != nil {
			t.Fatalf("%s: adjust: %v", n, err)
		}
	}
	quorate := func(n string) bool { return st(t, n).Devices[0].Quorum }
	waitFor(t, time.Minute, "node3 quorate through its peers", func() (bool, string) {
		return quorate("node3"), line(st(t, "node3"))
	})

	link(true, "node3", "node1")
	link(true, "node3", "node2")
	waitFor(t, 2*time.Minute, "node3 cut off and without quorum", func() (bool, string) {
		s := st(t, "node3")
		return !s.Devices[0].Quorum && conn(s, "node1").ConnectionState != "Connected" && conn(s, "node2").ConnectionState != "Connected", line(s)
	})
	link(true, "node1", "node2")
	waitFor(t, 2*time.Minute, "node1 and node2 without quorum", func() (bool, string) {
		return !quorate("node1") && !quorate("node2"), line(st(t, "node1")) + " / " + line(st(t, "node2"))
	})

	link(false, "node3", "node1")
	link(false, "node3", "node2")
	connectedUpToDate := func(s drbd.StatusResource, peer string) bool {
		c := conn(s, peer)
		return c != nil && c.ConnectionState == "Connected" && len(c.PeerDevices) == 1 && c.PeerDevices[0].PeerDiskState == "UpToDate"
	}
	waitFor(t, 2*time.Minute, "node3 connected to UpToDate node1 and node2", func() (bool, string) {
		s := st(t, "node3")
		return connectedUpToDate(s, "node1") && connectedUpToDate(s, "node2"), line(s)
	})
	if quorate("node1") || quorate("node2") || quorate("node3") {
		t.Fatalf("quorum before node1 and node2 find each other: %s / %s / %s", line(st(t, "node1")), line(st(t, "node2")), line(st(t, "node3")))
	}

	link(false, "node1", "node2")
	waitFor(t, 2*time.Minute, "node1 and node2 connected and quorate", func() (bool, string) {
		return quorate("node1") && quorate("node2"), line(st(t, "node1")) + " / " + line(st(t, "node2"))
	})
	time.Sleep(20 * time.Second)
	s := st(t, "node3")
	t.Logf("node3 20 s after its peers regained quorum: %s", line(s))
	if !connectedUpToDate(s, "node1") || !connectedUpToDate(s, "node2") {
		t.Fatalf("node3 no longer connected to both UpToDate peers: %s", line(s))
	}
	if s.Devices[0].Quorum {
		t.Fatalf("node3 gained quorum by itself: DRBD did not leave it stale in this sequence: %s", line(s))
	}

	start := time.Now()
	if err := cl.nodes["node3"].RecomputeQuorum(bg, r0, drbd.QuorumCount(32)); err != nil {
		t.Fatalf("node3: recompute quorum: %v", err)
	}
	t.Logf("node3: RecomputeQuorum took %s", time.Since(start).Round(time.Millisecond))
	waitFor(t, 10*time.Second, "node3 quorate after RecomputeQuorum", func() (bool, string) {
		return quorate("node3"), line(st(t, "node3"))
	})
	res, err := cl.nodes["node3"].Exec(bg, "drbdsetup", "show", r0)
	if err != nil {
		t.Fatalf("node3: drbdsetup show: %v", err)
	}
	if !regexp.MustCompile(`\bquorum\s+32;`).Match(res.Stdout) {
		t.Errorf("node3 after RecomputeQuorum does not show quorum 32:\n%s", res.Stdout)
	}
}
