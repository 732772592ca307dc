//go:build vmtest

package drbd_test

import (
	"bytes"
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/contract"
)

// TestStalePrimaryDoesNotRejoin is drbdsim's TestStalePrimaryDoesNotRejoin
// ("stale node1") on real DRBD: node1 Primary under on-no-quorum
// suspend-io is isolated, its write suspends; node2 keeps quorum through
// the diskless node3, is promoted and writes. After the heal node1 must
// not rejoin: every connection of node1 ends StandAlone on both ends (its
// connect to node2 would make a Primary the SyncTarget, the one to node3
// would put two Primaries in one cluster), node1 goes Outdated (it
// initiates the connect to node2, lower node-id, and learns of node2's
// newer data while its IO is suspended), its suspended write fails with
// EIO, it stays without quorum and node2 keeps it. Demoted and adjusted
// everywhere, node1 resyncs and holds node2's write.
func TestStalePrimaryDoesNotRejoin(t *testing.T) {
	h := healthy(t)
	h.tune = func(o *drbd.OptionSet) { o.Resource.OnNoQuorum = drbd.Ptr(drbd.OnNoQuorumSuspendIO) }
	defer func() {
		_ = healAll()
		for _, n := range contract.Nodes {
			_ = cl.nodes[n].Secondary(bg, r0)
		}
	}()
	for _, n := range contract.Nodes {
		if err := cl.nodes[n].WriteConfig(bg, h.Resource(n)); err != nil {
			t.Fatalf("%s: write config: %v", n, err)
		}
		if err := cl.nodes[n].Adjust(bg, r0); err != nil {
			t.Fatalf("%s: adjust: %v", n, err)
		}
	}
	n1, n2 := cl.nodes["node1"], cl.nodes["node2"]
	if err := n1.Primary(bg, r0, drbd.NoForce); err != nil {
		t.Fatalf("node1: primary: %v", err)
	}
	if err := n1.Write(bg, r0, 0, bytes.Repeat([]byte{0x11}, 4096)); err != nil {
		t.Fatalf("node1: write before the partition: %v", err)
	}

	link(true, "node1", "node2")
	link(true, "node1", "node3")
	waitFor(t, 2*time.Minute, "node1 without quorum, node2 without node1", func() (bool, string) {
		s1, s2 := st(t, "node1"), st(t, "node2")
		c := conn(s2, "node1")
		return !s1.Devices[0].Quorum && c != nil && c.ConnectionState != "Connected", line(s1) + " / " + line(s2)
	})
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	stale := bytes.Repeat([]byte{0xaa}, 4096)
	pending := make(chan error, 1)
	go func() { pending <- n1.Write(ctx, r0, 4096, stale) }()
	select {
	case err := <-pending:
		t.Fatalf("node1's write without quorum returned %v, want it suspended (on-no-quorum suspend-io)", err)
	case <-time.After(3 * time.Second):
	}

	if s := st(t, "node2"); !s.Devices[0].Quorum {
		t.Fatalf("node2 lost quorum with node3 still connected: %s", line(s))
	}
	if err := n2.Primary(bg, r0, drbd.NoForce); err != nil {
		t.Fatalf("node2: primary while node1 is cut off: %v", err)
	}
	newer := bytes.Repeat([]byte{0x55}, 4096)
	if err := n2.Write(bg, r0, 8192, newer); err != nil {
		t.Fatalf("node2: write: %v", err)
	}

	if err := healAll(); err != nil {
		t.Fatal(err)
	}
	ends := [][2]string{{"node1", "node2"}, {"node2", "node1"}, {"node1", "node3"}, {"node3", "node1"}}
	standalone := func() (bool, string) {
		ok, why := true, ""
		for _, e := range ends {
			s := st(t, e[0])
			state := "none"
			if c := conn(s, e[1]); c != nil {
				state = c.ConnectionState
			}
			why += e[0] + "->" + e[1] + ":" + state + " "
			ok = ok && state == "StandAlone"
		}
		return ok, why + "| node1 " + line(st(t, "node1"))
	}
	waitFor(t, 2*time.Minute, "every connection of node1 StandAlone on both ends", standalone)
	select {
	case err := <-pending:
		if !errors.Is(err, syscall.EIO) {
			t.Fatalf("node1's suspended write returned %v, want EIO", err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("node1's suspended write still pending a minute after the heal: %s", line(st(t, "node1")))
	}
	// connect-int is 10 s: a retry would have happened by then.
	time.Sleep(25 * time.Second)
	if ok, why := standalone(); !ok {
		t.Fatalf("25 s later, no longer all StandAlone: %s", why)
	}
	s1, s2 := st(t, "node1"), st(t, "node2")
	t.Logf("after the heal: node1 %s; node2 %s", line(s1), line(s2))
	if s1.Role != "Primary" || s1.Devices[0].DiskState != "Outdated" || s1.Devices[0].Quorum {
		t.Errorf("node1 after the heal: %s, want Primary, Outdated, quorum:false", line(s1))
	}
	if !s2.Devices[0].Quorum || s2.Role != "Primary" {
		t.Errorf("node2 after the heal: %s, want Primary with quorum", line(s2))
	}

	// Recovery: node1 demoted, every node adjusted; node1 resyncs.
	if err := n1.Secondary(bg, r0); err != nil {
		t.Fatalf("node1: secondary: %v", err)
	}
	for _, n := range contract.Nodes {
		if err := cl.nodes[n].Adjust(bg, r0); err != nil {
			t.Fatalf("%s: adjust: %v", n, err)
		}
	}
	for _, n := range contract.Nodes {
		waitFor(t, 3*time.Minute, n+" reconnected and in sync", func() (bool, string) { return settled(n, st(t, n)) })
	}
	if err := n2.Secondary(bg, r0); err != nil {
		t.Fatalf("node2: secondary: %v", err)
	}
	if err := n1.Primary(bg, r0, drbd.NoForce); err != nil {
		t.Fatalf("node1: primary after the resync: %v", err)
	}
	got, err := n1.Read(bg, r0, 4096, 8192)
	if err != nil {
		t.Fatalf("node1: read: %v", err)
	}
	if bytes.Equal(got[:4096], stale) {
		t.Error("node1 holds its stale write that failed")
	}
	if !bytes.Equal(got[4096:], newer) {
		t.Error("node1 does not hold node2's write after its resync")
	}
}
