package drbdsim

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// peerID is node's node-id as from's resource r0 knows it.
func (rg *rig) peerID(from, node string) int {
	rg.t.Helper()
	for id, k := range rg.c.Node(from).res["r0"].conns {
		if k.peer.Name == node {
			return id
		}
	}
	rg.t.Fatalf("%s has no connection to %s", from, node)
	return -1
}

// reattachFresh detaches node2's disk (its configuration without one), gives
// the backing device fresh metadata and arms a lost handshake with node1 for
// the attach that follows, as DRBD 9.2.18 loses one now and then when a fresh
// disk is attached beside connected diskful peers (test/vm/FINDINGS.md, "The
// product on real DRBD", 16).
func reattachFresh(rg *rig) {
	rg.t.Helper()
	n2 := rg.c.Node("node2")
	withDisk := r0(rg.dir, "node2", nil)
	diskless := *withDisk
	diskless.Disk = nil
	rg.must(n2.WriteConfig(rg.ctx, &diskless))
	rg.must(n2.Adjust(rg.ctx, "r0"))
	rg.wantDisk("node2", "Diskless", "after the detach")
	rg.must(n2.WriteConfig(rg.ctx, withDisk))
	rg.must(n2.CreateMetadata(rg.ctx, "r0", 2))
	n2.LoseAttachHandshake("r0", "node1")
}

// An attach that lost the Primary's handshake stays Negotiating however long
// the connection stays up, and its adjust does not return (DRBD's attach waits
// for the negotiation) — until it is killed, the disk left as it is; the
// Primary writes meanwhile. A disconnect of that peer ends it at once:
// Negotiating -> Inconsistent, and once connected again the handshake runs as
// usual, the resync brings the disk UpToDate, and it holds every write.
func TestLostAttachHandshakeEndsWithTheConnection(t *testing.T) {
	rg, _ := formedWithPrimary(t)
	reattachFresh(rg)
	n2 := rg.c.Node("node2")

	ctx, cancel := context.WithTimeout(rg.ctx, 100*time.Millisecond)
	err := n2.Adjust(ctx, "r0")
	cancel()
	if !errors.Is(err, drbd.ErrTimeout) {
		t.Fatalf("adjust of the stalled attach returned %v, want drbd.ErrTimeout once its context ended", err)
	}
	rg.wantDisk("node2", "Negotiating", "after the attach lost node1's handshake")
	for i := range 8 {
		rg.must(rg.write("node1", int64(i)*4096, 4096))
	}
	rg.c.Advance(2 * time.Minute)
	rg.wantDisk("node2", "Negotiating", "two minutes later, node1 still connected")
	if cs := connState(rg.state("node2"), "node1"); cs != "Connected" {
		t.Fatalf("node2 → node1: %s during the stall, want Connected", cs)
	}

	// A second adjust finds the disk attached and returns (the kernel's
	// adm_mutex is free while the first attach waits).
	rg.must(n2.Adjust(rg.ctx, "r0"))
	// An adjust that waits returns once the stall ends.
	waited := make(chan error, 1)
	go func() {
		n2.c.mu.Lock()
		r := n2.res["r0"]
		err := n2.waitNegotiation(rg.ctx, r)
		n2.c.mu.Unlock()
		waited <- err
	}()
	select {
	case err := <-waited:
		t.Fatalf("the wait for the negotiation returned %v while node2 is still Negotiating", err)
	case <-time.After(50 * time.Millisecond):
	}

	rg.must(n2.Reconnect(rg.ctx, "r0", rg.peerID("node2", "node1"), drbd.NoForce))
	if err := <-waited; err != nil {
		t.Fatalf("the wait for the negotiation: %v after the disconnect", err)
	}
	if d := rg.state("node2").Devices[0].DiskState; d == "Negotiating" {
		t.Fatalf("node2 still Negotiating after the disconnect of node1")
	}
	rg.c.Advance(time.Minute)
	rg.wantDisk("node2", "UpToDate", "after the reconnect and the resync")
	if cs := connState(rg.state("node2"), "node1"); cs != "Connected" {
		t.Fatalf("node2 → node1: %s after the reconnect, want Connected", cs)
	}
	rg.noLostWrites()
}

// A cut of the stalled peer's link ends the stall too (DRBD's own way out, when
// the peer's ko-count or a ping timeout drops the connection); an attach
// beside no connected diskful peer loses nothing (the fault stays armed).
func TestLostAttachHandshakeEndsOnACut(t *testing.T) {
	rg, _ := formedWithPrimary(t)
	reattachFresh(rg)
	n2 := rg.c.Node("node2")
	ctx, cancel := context.WithTimeout(rg.ctx, 50*time.Millisecond)
	_ = n2.Adjust(ctx, "r0")
	cancel()
	rg.wantDisk("node2", "Negotiating", "after the attach lost node1's handshake")
	rg.c.Cut("node1", "node2")
	rg.c.Advance(time.Second)
	rg.wantDisk("node2", "Inconsistent", "after the link to node1 was cut (no UpToDate peer left to sync from)")
	rg.c.Heal()
	rg.c.Advance(time.Minute)
	rg.wantDisk("node2", "UpToDate", "after the heal and the resync")
	rg.noLostWrites()
}

// A Secondary's unforced disconnect from a Primary that would lose its quorum
// without it is refused, as DRBD 9.2.18 refused it on the guests for 2D+1TB
// with the TieBreaker connected (test/vm/drbd TestReconnect): the Secondary
// proposes to outdate itself, and the Primary alone is one vote short of
// quorum 2. Forced, it goes through, and the connection comes back. Its
// disconnect from the diskless TieBreaker, a Secondary, goes through unforced.
func TestDisconnectFromAPrimaryThatWouldLoseQuorumIsRefused(t *testing.T) {
	rg := formed(t, productQuorum)
	n1, n2 := rg.c.Node("node1"), rg.c.Node("node2")
	rg.must(n1.Primary(rg.ctx, "r0", drbd.NoForce))
	primary := rg.peerID("node2", "node1")
	err := n2.Reconnect(rg.ctx, "r0", primary, drbd.NoForce)
	if !errors.Is(err, drbd.ErrStateChangeRefused) {
		t.Fatalf("node2's unforced disconnect of the Primary: %v, want it refused (ErrStateChangeRefused)", err)
	}
	if cs := connState(rg.state("node2"), "node1"); cs != "Connected" {
		t.Fatalf("node2 → node1: %s after the refusal, want Connected", cs)
	}
	rg.must(n2.Reconnect(rg.ctx, "r0", rg.peerID("node2", "node3"), drbd.NoForce))
	rg.must(n2.Reconnect(rg.ctx, "r0", primary, "test: the Primary refused it"))
	rg.c.Advance(time.Second)
	if cs := connState(rg.state("node2"), "node1"); cs != "Connected" {
		t.Fatalf("node2 → node1: %s after the forced cycle, want Connected", cs)
	}
	rg.wantQuorum("node1", true)
	rg.must(rg.write("node1", 0, 4096))
	rg.noLostWrites()
}
