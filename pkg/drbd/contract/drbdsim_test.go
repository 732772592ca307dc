package contract_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/contract"
	"github.com/meshvol/meshvol/pkg/drbd/drbdsim"
)

// simHarness runs the contract on drbdsim: three nodes in one process,
// 128 MiB sparse files as backing devices, a virtual clock.
type simHarness struct {
	c   *drbdsim.Cluster
	dir string
}

func newSimHarness(t *testing.T) *simHarness {
	dir := t.TempDir()
	for _, n := range []string{"node1", "node2"} {
		f, err := os.Create(filepath.Join(dir, n+".img"))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(128 << 20); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	return &simHarness{c: drbdsim.NewCluster(drbdsim.Options{Dir: dir, Seed: 7}), dir: dir}
}

func (h *simHarness) Driver(node string) drbd.Driver { return h.c.Node(node) }

func (h *simHarness) Resource(node string) *drbd.Resource {
	ids := map[string]int{"node1": 0, "node2": 1, "node3": 2}
	host := func(n string) drbd.Host {
		return drbd.Host{Name: n, NodeID: ids[n],
			Address: drbd.Address{IP: netip.AddrFrom4([4]byte{10, 99, 0, byte(ids[n] + 1)}), Port: 7000}}
	}
	r := &drbd.Resource{Name: contract.Resource, Self: host(node), Minor: 0,
		Options: drbd.Resolve(drbd.DefaultOptions(), drbd.OptionSet{Resource: drbd.ResourceOptionSet{
			Quorum: drbd.Ptr(drbd.QuorumMajority), OnNoQuorum: drbd.Ptr(drbd.OnNoQuorumIOError)}})}
	for _, p := range contract.Nodes {
		if p != node {
			h := host(p)
			r.Peers = append(r.Peers, drbd.Peer{Name: p, NodeID: h.NodeID, Address: h.Address, Diskless: p == "node3"})
		}
	}
	if node != "node3" {
		r.Disk = &drbd.Disk{BackingDevice: filepath.Join(h.dir, node+".img"), MetaDisk: drbd.MetaDiskInternal}
	}
	return r
}

func (h *simHarness) Write(ctx context.Context, node string, off int64, data []byte) error {
	return h.c.Node(node).Write(ctx, contract.Resource, off, data)
}

func (h *simHarness) Read(ctx context.Context, node string, off int64, n int) ([]byte, error) {
	return h.c.Node(node).Read(ctx, contract.Resource, off, n)
}

func (h *simHarness) Cut(a, b string)                     { h.c.Cut(a, b) }
func (h *simHarness) Connect(a, b string)                 { h.c.Connect(a, b) }
func (h *simHarness) Advance(d time.Duration)             { h.c.Advance(d) }
func (h *simHarness) LostAckedWrites(res string) []string { return h.c.LostAckedWrites(res) }

func TestContractOnDrbdsim(t *testing.T) {
	contract.Run(t, newSimHarness(t))
}
