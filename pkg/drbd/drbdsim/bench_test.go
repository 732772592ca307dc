package drbdsim

import (
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// BenchmarkWrite4K is one replicated 4 KiB write on a three-node cluster
// (two diskful replicas, protocol C).
func BenchmarkWrite4K(b *testing.B) {
	rg := formed(b, nil)
	rg.must(rg.c.Node("node1").Primary(rg.ctx, "r0", drbd.NoForce))
	data := make([]byte, 4096)
	n := rg.c.Node("node1")
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if err := n.Write(rg.ctx, "r0", int64(i%1024)*4096, data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPartitionHeal is a partition and its heal: two settles with
// connection loss, quorum recomputation, reconnect and handshake.
func BenchmarkPartitionHeal(b *testing.B) {
	rg := formed(b, nil)
	for b.Loop() {
		rg.c.Partition("node1")
		rg.c.Heal()
		rg.c.Advance(10 * time.Second) // connect-int: the link is used at the next attempt
	}
}
