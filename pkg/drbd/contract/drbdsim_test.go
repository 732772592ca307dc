package contract_test

import (
	"context"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/contract"
	"github.com/meshvol/meshvol/pkg/drbd/drbdsim"
)

// simHarness runs the contract on drbdsim: three nodes in one process,
// sparse files as backing devices, a virtual clock.
type simHarness struct {
	c       *drbdsim.Cluster
	backing func(node string) string
}

func newSimHarness(t *testing.T) *simHarness {
	dir := t.TempDir()
	return &simHarness{
		c:       drbdsim.NewCluster(drbdsim.Options{Dir: dir, Seed: 7}),
		backing: contract.SparseBackingFiles(t, dir),
	}
}

func (h *simHarness) Driver(node string) drbd.Driver { return h.c.Node(node) }

func (h *simHarness) Resource(node string) *drbd.Resource {
	return contract.CapturedResource(node, h.backing(node), nil)
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
