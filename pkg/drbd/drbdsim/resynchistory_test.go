package drbdsim

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/contract"
)

// threeDiskful is r0 with node3 diskful too (the captured rig's node3 is diskless)
// and quorum off, so that one node writes on its own; node3's metadata is not created
// yet: it joins later, as a replacement replica does.
func threeDiskful(t *testing.T) *rig {
	t.Helper()
	dir := t.TempDir()
	rg := &rig{t: t, c: NewCluster(Options{Dir: dir, Seed: 1}), dir: dir, ctx: context.Background()}
	contract.SparseBackingFiles(t, dir)
	img := filepath.Join(dir, "node3.img")
	f, err := os.Create(img)
	rg.must(err)
	rg.must(f.Truncate(contract.BackingSize))
	rg.must(f.Close())
	for _, n := range []string{"node1", "node2", "node3"} {
		res := r0(dir, n, func(_ string, o *drbd.OptionSet) { o.Resource.Quorum = drbd.Ptr(drbd.QuorumOff) })
		for i := range res.Peers {
			res.Peers[i].Diskless = false
		}
		if n == "node3" {
			res.Disk = &drbd.Disk{BackingDevice: img, MetaDisk: drbd.MetaDiskInternal}
		}
		rg.must(rg.c.Node(n).WriteConfig(rg.ctx, res))
	}
	return rg
}

// A replica that joins later and is synced in full inherits its sync source's history
// (DRBD's drbd_uuid_resync_finished, drbd_main.c: the source's history UUIDs and its
// bitmap UUIDs go into the target's history). So a replica that fell behind before the
// newcomer existed is, to the newcomer, a peer that is behind: a resync, not a split
// brain. node2 is cut off, node1 writes alone (a new generation, node2's old one in its
// history and its bitmap towards node2), node3 joins and is synced from node1, then
// node2 meets node3 first: node3 must be its sync source.
func TestResyncTargetInheritsTheSourcesHistory(t *testing.T) {
	rg := threeDiskful(t)
	for _, n := range []string{"node1", "node2"} {
		rg.must(rg.c.Node(n).CreateMetadata(rg.ctx, "r0", 2))
		rg.must(rg.c.Node(n).Up(rg.ctx, "r0"))
	}
	rg.must(rg.c.Node("node1").NewCurrentUUIDClearBitmap(rg.ctx, "r0"))
	rg.wantDisk("node2", "UpToDate", "after the day-0 clear")

	rg.c.Cut("node1", "node2")
	rg.c.Cut("node2", "node3")
	n1 := rg.c.Node("node1")
	rg.must(n1.Primary(rg.ctx, "r0", drbd.NoForce))
	rg.must(rg.write("node1", 0, 8192))

	n3 := rg.c.Node("node3")
	rg.must(n3.CreateMetadata(rg.ctx, "r0", 2))
	rg.must(n3.Up(rg.ctx, "r0"))
	rg.c.Advance(30 * time.Second) // connect-int and the full resync from node1
	rg.wantDisk("node3", "UpToDate", "after its full resync from node1")

	rg.c.Connect("node2", "node3")
	rg.c.Advance(30 * time.Second)
	if bad, msgs := rg.c.Diverged("r0"); bad {
		t.Fatalf("node2, which only fell behind, and node3, synced from node1, were taken for a split brain: %v", msgs)
	}
	rg.wantDisk("node2", "UpToDate", "after its resync from node3")
	rg.noLostWrites()
}
