package drbdsim

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// After an online grow the replicas hold the same bytes over the whole new size, as
// DRBD's resync of the grown area leaves them: each backing device had its internal
// metadata (its own signature) at its old end, which is now inside the data area.
func TestGrownAreaIsSynced(t *testing.T) {
	rg := formed(t, nil)
	rg.must(rg.c.Node("node1").Primary(rg.ctx, "r0", drbd.NoForce))
	rg.must(rg.c.Node("node1").Write(rg.ctx, "r0", 0, bytes.Repeat([]byte{9}, 4096)))
	for _, n := range []string{"node1", "node2"} {
		st, err := os.Stat(filepath.Join(rg.dir, n+".img"))
		rg.must(err)
		rg.must(os.Truncate(filepath.Join(rg.dir, n+".img"), st.Size()+64<<20))
	}
	before := rg.c.nodes["node1"].res["r0"].md.sizeBytes
	rg.must(rg.c.Node("node2").Resize(rg.ctx, "r0"))
	size := rg.c.nodes["node1"].res["r0"].md.sizeBytes
	if size <= before {
		t.Fatalf("the resize did not grow the device: %d bytes, was %d", size, before)
	}
	read := func(n string) []byte {
		f, err := os.Open(filepath.Join(rg.dir, n+".img"))
		rg.must(err)
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, size))
		rg.must(err)
		return b
	}
	a, b := read("node1"), read("node2")
	if !bytes.Equal(a, b) {
		for off := 0; off < len(a); off += 4096 {
			if !bytes.Equal(a[off:off+4096], b[off:off+4096]) {
				t.Fatalf("after the grow to %d bytes the replicas differ at offset %d", size, off)
			}
		}
	}
}

// A node cut off from a configured diskful peer does not grow past it, as DRBD
// without --assume-peer-has-space does not; once they reconnect, the resize grows
// both and the grown area is the same on both.
func TestNoGrowPastUnreachablePeer(t *testing.T) {
	rg := formed(t, nil)
	for _, n := range []string{"node1", "node2"} {
		st, err := os.Stat(filepath.Join(rg.dir, n+".img"))
		rg.must(err)
		rg.must(os.Truncate(filepath.Join(rg.dir, n+".img"), st.Size()+64<<20))
	}
	before := rg.c.nodes["node1"].res["r0"].md.sizeBytes
	rg.c.Partition("node1")
	rg.must(rg.c.Node("node1").Resize(rg.ctx, "r0"))
	rg.must(rg.c.Node("node2").Resize(rg.ctx, "r0"))
	for _, n := range []string{"node1", "node2"} {
		if got := rg.c.nodes[n].res["r0"].md.sizeBytes; got != before {
			t.Fatalf("%s grew to %d bytes while its peer was unreachable (was %d)", n, got, before)
		}
	}
	rg.c.Heal()
	rg.c.Advance(11 * time.Second) // the next connect attempt
	rg.must(rg.c.Node("node1").Resize(rg.ctx, "r0"))
	if got := rg.c.nodes["node2"].res["r0"].md.sizeBytes; got <= before {
		t.Fatalf("node2 did not grow once connected: %d bytes", got)
	}
}
