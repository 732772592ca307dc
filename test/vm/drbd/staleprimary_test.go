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

// TestStalePrimaryDoesNotRejoin is drbdsim's TestStalePrimaryDoesNotRejoin on
// real DRBD, in both node-id orders: the stale node Primary under on-no-quorum
// suspend-io is isolated, its write suspends; the other diskful node keeps quorum
// through the diskless node3, is promoted and writes. After the heal the stale node
// must not rejoin: every connection of it ends StandAlone on both ends (its connect
// to the other diskful node would make a Primary the SyncTarget, the one to node3
// would put two Primaries in one cluster), it stays without quorum and the other
// keeps it. node1, the lower node-id, initiates its connects: stale, it learns of
// node2's newer data while its IO is suspended, goes Outdated and its suspended
// write fails with EIO. node2 stale does not initiate the connect to node1: it
// stays UpToDate and its write stays suspended until on-no-quorum io-error, set on
// the running resource, fails it with EIO (what meshvol's agent does).
// Demoted and adjusted everywhere, the stale node resyncs and holds the other's
// write.
func TestStalePrimaryDoesNotRejoin(t *testing.T) {
	for _, tc := range []struct {
		stale, other string
		outdated     bool
	}{
		{"node1", "node2", true},
		{"node2", "node1", false},
	} {
		t.Run("stale "+tc.stale, func(t *testing.T) { stalePrimary(t, tc.stale, tc.other, tc.outdated) })
	}
}

func stalePrimary(t *testing.T, staleNode, otherNode string, outdated bool) {
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
	n1, n2 := cl.nodes[staleNode], cl.nodes[otherNode]
	if err := n1.Primary(bg, r0, drbd.NoForce); err != nil {
		t.Fatalf("%s: primary: %v", staleNode, err)
	}
	if err := n1.Write(bg, r0, 0, bytes.Repeat([]byte{0x11}, 4096)); err != nil {
		t.Fatalf("%s: write before the partition: %v", staleNode, err)
	}

	link(true, staleNode, otherNode)
	link(true, staleNode, "node3")
	waitFor(t, 2*time.Minute, staleNode+" without quorum, "+otherNode+" without it", func() (bool, string) {
		s1, s2 := st(t, staleNode), st(t, otherNode)
		c := conn(s2, staleNode)
		return !s1.Devices[0].Quorum && c != nil && c.ConnectionState != "Connected", line(s1) + " / " + line(s2)
	})
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	stale := bytes.Repeat([]byte{0xaa}, 4096)
	pending := make(chan error, 1)
	go func() { pending <- n1.Write(ctx, r0, 4096, stale) }()
	select {
	case err := <-pending:
		t.Fatalf("%s's write without quorum returned %v, want it suspended (on-no-quorum suspend-io)", staleNode, err)
	case <-time.After(3 * time.Second):
	}

	if s := st(t, otherNode); !s.Devices[0].Quorum {
		t.Fatalf("%s lost quorum with node3 still connected: %s", otherNode, line(s))
	}
	if err := n2.Primary(bg, r0, drbd.NoForce); err != nil {
		t.Fatalf("%s: primary while %s is cut off: %v", otherNode, staleNode, err)
	}
	newer := bytes.Repeat([]byte{0x55}, 4096)
	if err := n2.Write(bg, r0, 8192, newer); err != nil {
		t.Fatalf("%s: write: %v", otherNode, err)
	}

	if err := healAll(); err != nil {
		t.Fatal(err)
	}
	ends := [][2]string{{staleNode, otherNode}, {otherNode, staleNode}, {staleNode, "node3"}, {"node3", staleNode}}
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
		return ok, why + "| " + staleNode + " " + line(st(t, staleNode))
	}
	waitFor(t, 2*time.Minute, "every connection of "+staleNode+" StandAlone on both ends", standalone)
	if outdated {
		select {
		case err := <-pending:
			if !errors.Is(err, syscall.EIO) {
				t.Fatalf("%s's suspended write returned %v, want EIO", staleNode, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s's suspended write still pending a minute after the heal: %s", staleNode, line(st(t, staleNode)))
		}
	}
	// connect-int is 10 s: a retry would have happened by then.
	time.Sleep(25 * time.Second)
	if ok, why := standalone(); !ok {
		t.Fatalf("25 s later, no longer all StandAlone: %s", why)
	}
	s1, s2 := st(t, staleNode), st(t, otherNode)
	t.Logf("after the heal: %s %s; %s %s", staleNode, line(s1), otherNode, line(s2))
	wantDisk := "UpToDate"
	if outdated {
		wantDisk = "Outdated"
	}
	if s1.Role != "Primary" || s1.Devices[0].DiskState != wantDisk || s1.Devices[0].Quorum {
		t.Errorf("%s after the heal: %s, want Primary, %s, quorum:false", staleNode, line(s1), wantDisk)
	}
	if !s2.Devices[0].Quorum || s2.Role != "Primary" {
		t.Errorf("%s after the heal: %s, want Primary with quorum", otherNode, line(s2))
	}

	// Recovery: the stale node demoted (with --force while a write is suspended:
	// it fails that write), every node adjusted; the stale node resyncs.
	if outdated {
		if err := n1.Secondary(bg, r0); err != nil {
			t.Fatalf("%s: secondary: %v", staleNode, err)
		}
	} else {
		select {
		case err := <-pending:
			t.Fatalf("%s's suspended write returned %v after the heal, want it still suspended", staleNode, err)
		default:
		}
		// What the agent does to a stale Primary whose member was removed
		// (docs/controller.md, "--delete-lost-pods"): on-no-quorum io-error
		// on the running resource fails the suspended write with EIO, and
		// every later request; then it demotes without force.
		if err := n1.FailIOWithoutQuorum(bg, r0); err != nil {
			t.Fatalf("%s: drbdsetup resource-options --on-no-quorum=io-error: %v", staleNode, err)
		}
		select {
		case err := <-pending:
			if !errors.Is(err, syscall.EIO) {
				t.Fatalf("%s's suspended write returned %v after on-no-quorum io-error, want EIO", staleNode, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s's suspended write still pending a minute after on-no-quorum io-error: %s", staleNode, line(st(t, staleNode)))
		}
		if err := n1.Write(bg, r0, 4096, stale); !errors.Is(err, syscall.EIO) {
			t.Fatalf("%s: a write after on-no-quorum io-error returned %v, want EIO", staleNode, err)
		}
		if s := st(t, staleNode); s.Suspended || s.Role != "Primary" {
			t.Fatalf("%s after on-no-quorum io-error: %s, want a Primary not suspended", staleNode, line(s))
		}
		if err := n1.Secondary(bg, r0); err != nil {
			t.Fatalf("%s: secondary after on-no-quorum io-error: %v", staleNode, err)
		}
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
		t.Fatalf("%s: secondary: %v", otherNode, err)
	}
	if err := n1.Primary(bg, r0, drbd.NoForce); err != nil {
		t.Fatalf("%s: primary after the resync: %v", staleNode, err)
	}
	got, err := n1.Read(bg, r0, 4096, 8192)
	if err != nil {
		t.Fatalf("%s: read: %v", staleNode, err)
	}
	if bytes.Equal(got[:4096], stale) {
		t.Errorf("%s holds its stale write that failed", staleNode)
	}
	if !bytes.Equal(got[4096:], newer) {
		t.Errorf("%s does not hold %s's write after its resync", staleNode, otherNode)
	}
}
