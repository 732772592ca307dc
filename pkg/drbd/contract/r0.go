package contract

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// BackingSize is the size of the captured backing devices. Sizes in status
// and events2 (size:131028, the bitmap, resync amounts) equal the
// captured ones only with backing devices of this size.
const BackingSize = 128 << 20

// diskless is the captures' diskless client (a tiebreaker for quorum).
const diskless = "node3"

// CapturedResource is r0 as node sees it in the captures: node-id i for
// Nodes[i] at 10.99.0.(i+1) port 7000, node3 diskless, minor 0, quorum
// majority and on-no-quorum io-error over DRBD's defaults. backing is the
// backing device of node (ignored for node3). tune, when not nil, changes
// the options before they are resolved, for tests that depart from the
// captured configuration.
func CapturedResource(node, backing string, tune func(*drbd.OptionSet)) *drbd.Resource {
	set := drbd.OptionSet{Resource: drbd.ResourceOptionSet{
		Quorum:     drbd.Ptr(drbd.QuorumMajority),
		OnNoQuorum: drbd.Ptr(drbd.OnNoQuorumIOError),
	}}
	if tune != nil {
		tune(&set)
	}
	r := &drbd.Resource{Name: Resource, Minor: 0, Options: drbd.Resolve(drbd.DefaultOptions(), set)}
	for i, n := range Nodes {
		addr := drbd.Address{IP: netip.AddrFrom4([4]byte{10, 99, 0, byte(i + 1)}), Port: 7000}
		if n == node {
			r.Self = drbd.Host{Name: n, NodeID: i, Address: addr}
			continue
		}
		r.Peers = append(r.Peers, drbd.Peer{Name: n, NodeID: i, Address: addr, Diskless: n == diskless})
	}
	if node != diskless {
		r.Disk = &drbd.Disk{BackingDevice: backing, MetaDisk: drbd.MetaDiskInternal}
	}
	return r
}

// SparseBackingFiles creates dir/NODE.img, a sparse file of BackingSize,
// for each diskful node, and returns the path it made for a node. A
// simulator needs nothing more: its block device is a plain file.
func SparseBackingFiles(t testing.TB, dir string) func(node string) string {
	t.Helper()
	path := func(node string) string { return filepath.Join(dir, node+".img") }
	for _, n := range Nodes {
		if n == diskless {
			continue
		}
		f, err := os.Create(path(n))
		if err != nil {
			t.Fatal(err)
		}
		err = f.Truncate(BackingSize)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return path
}
