//go:build vmtest

package drbd_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/contract"
)

// TestReconnect is drbd.Driver's Reconnect (`drbdsetup disconnect` then
// `connect` of one peer: pkg/agent's attach-stall watchdog, test/vm/FINDINGS.md,
// "The product on real DRBD", 16) on real DRBD, with the quorum meshvol renders
// for 2D+1TB (node1 and node2 quorum 2, the diskless node3 quorum 32), node1
// Primary under on-no-quorum suspend-io and written all along:
//
//   - node2 cycles its connection to node3, a Secondary: it goes through and
//     comes back Connected;
//   - node2's unforced disconnect of node1, the Primary, is refused, with the
//     TieBreaker connected and without it: a Secondary that disconnects from a
//     Primary proposes to outdate itself, and node1 would lose quorum by it
//     (seen first in this tier: "No quorum (-25)" on node1);
//   - forced, it goes through, node2 is Connected to node1 again, and no write
//     of node1 failed: without the TieBreaker node1 loses quorum until node2 is
//     back, and suspend-io holds its writes meanwhile (the longest write is
//     logged).
func TestReconnect(t *testing.T) {
	h := healthy(t)
	h.tune = func(o *drbd.OptionSet) { o.Resource.OnNoQuorum = drbd.Ptr(drbd.OnNoQuorumSuspendIO) }
	defer func() {
		_ = healAll()
		_ = cl.nodes["node1"].Secondary(bg, r0)
	}()
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
	n1, n2 := cl.nodes["node1"], cl.nodes["node2"]
	if err := n1.Primary(bg, r0, drbd.NoForce); err != nil {
		t.Fatalf("node1: primary: %v", err)
	}
	connected := func(what, peer string) {
		t.Helper()
		waitFor(t, time.Minute, what, func() (bool, string) {
			s1, s2 := st(t, "node1"), st(t, "node2")
			c := conn(s2, peer)
			return c != nil && c.ConnectionState == "Connected" && s1.Devices[0].Quorum, line(s1) + " / " + line(s2)
		})
	}
	connected("node2 connected to node1, node1 quorate", "node1")
	connected("node2 connected to node3", "node3")
	s2 := st(t, "node2")
	node1ID, node3ID := conn(s2, "node1").PeerNodeID, conn(s2, "node3").PeerNodeID

	// node1's writer: 4 KiB every 20 ms; every write must complete.
	ctx, stop := context.WithCancel(bg)
	var mu sync.Mutex
	var writes int
	var longest time.Duration
	var failed error
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			began := time.Now()
			err := n1.Write(bg, r0, int64(i%64)*4096, bytes.Repeat([]byte{byte(i)}, 4096))
			mu.Lock()
			writes++
			longest = max(longest, time.Since(began))
			if err != nil && failed == nil {
				failed = err
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	defer func() {
		stop()
		select {
		case <-done:
		case <-time.After(30 * time.Second): // a write held for ever: the failure says so
		}
	}()
	checkWrites := func(when string) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		if failed != nil {
			t.Fatalf("node1's write failed %s: %v", when, failed)
		}
		t.Logf("%s: %d writes so far, none failed, the longest %s", when, writes, longest.Round(time.Millisecond))
		longest = 0
	}

	start := time.Now()
	if err := n2.Reconnect(bg, r0, node3ID, drbd.NoForce); err != nil {
		t.Fatalf("node2: reconnect node3 (a Secondary): %v", err)
	}
	connected("node2 connected to node3 again", "node3")
	t.Logf("node2 → node3 cycled and Connected again in %s", time.Since(start).Round(time.Millisecond))

	refused := func(when string) {
		t.Helper()
		err := n2.Reconnect(bg, r0, node1ID, drbd.NoForce)
		t.Logf("node2: unforced Reconnect of node1 %s: %v", when, err)
		if !errors.Is(err, drbd.ErrStateChangeRefused) && !errors.Is(err, drbd.ErrNoQuorum) {
			t.Fatalf("node2's unforced disconnect of the Primary %s: %v, want it refused", when, err)
		}
		connected("node2 still connected to node1 after the refusal "+when, "node1")
	}
	forced := func(when string) {
		t.Helper()
		start := time.Now()
		if err := n2.Reconnect(bg, r0, node1ID, "test: the Primary refused it"); err != nil {
			t.Fatalf("node2: forced Reconnect of node1 %s: %v", when, err)
		}
		connected("node2 connected to node1 again after the forced cycle "+when, "node1")
		t.Logf("node2 → node1 forced cycle %s: Connected again, node1 quorate, %s after it began", when, time.Since(start).Round(time.Millisecond))
		time.Sleep(time.Second)
		checkWrites("after the forced cycle " + when)
	}
	refused("with the TieBreaker connected")
	forced("with the TieBreaker connected")

	link(true, "node3", "node1")
	link(true, "node3", "node2")
	waitFor(t, 2*time.Minute, "node3 cut off from node1 and node2", func() (bool, string) {
		s := st(t, "node1")
		c := conn(s, "node3")
		return c != nil && c.ConnectionState != "Connected", line(s)
	})
	connected("node1 quorate with node2 alone", "node1")
	checkWrites("with node3 cut off")
	refused("with node3 cut off")
	forced("with node3 cut off")
}
