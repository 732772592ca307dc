package drbdsimd

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/contract"
	"github.com/meshvol/meshvol/pkg/drbd/drbdsim"
)

// buildStandIns builds the drbd-utils stand-in once per node directory:
// dir/<node>/{drbdutils, drbdadm, drbdsetup, drbdmeta}, the socket beside
// them, as the sandbox lays them out for a node's pods.
func buildStandIns(t *testing.T, dir string, nodes []string) {
	t.Helper()
	bin := filepath.Join(dir, "drbdutils")
	cmd := exec.Command("go", "build", "-o", bin, "./drbdutils")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the stand-ins: %v\n%s", err, out)
	}
	for _, n := range nodes {
		nd := filepath.Join(dir, n)
		if err := os.MkdirAll(nd, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Link(bin, filepath.Join(nd, "drbdutils")); err != nil {
			t.Fatal(err)
		}
		for _, prog := range []string{"drbdadm", "drbdsetup", "drbdmeta"} {
			if err := os.Symlink("drbdutils", filepath.Join(nd, prog)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// execHarness runs the contract suite on pkg/drbd's ExecDriver — the
// production driver, its command lines and parsers — whose drbd-utils are
// the stand-ins, served by one simulated cluster.
type execHarness struct {
	c       *drbdsim.Cluster
	drivers map[string]drbd.Driver
	backing func(node string) string
}

func newExecHarness(t *testing.T) *execHarness {
	dir := t.TempDir()
	buildStandIns(t, dir, contract.Nodes)
	h := &execHarness{
		c:       drbdsim.NewCluster(drbdsim.Options{Dir: dir, Seed: 7}),
		drivers: map[string]drbd.Driver{},
		backing: contract.SparseBackingFiles(t, dir),
	}
	svc := New(h.c)
	t.Cleanup(func() { _ = svc.Close() })
	for _, n := range contract.Nodes {
		nd := filepath.Join(dir, n)
		if err := svc.Listen(n, filepath.Join(nd, "drbdsim.sock")); err != nil {
			t.Fatal(err)
		}
		h.drivers[n] = drbd.NewExecDriver(drbd.ExecConfig{
			NodeName:  n,
			ConfDir:   filepath.Join(nd, "drbd.d"),
			Drbdadm:   filepath.Join(nd, "drbdadm"),
			Drbdsetup: filepath.Join(nd, "drbdsetup"),
			Drbdmeta:  filepath.Join(nd, "drbdmeta"),
			Timeout:   20 * time.Second,
		})
	}
	return h
}

func (h *execHarness) Driver(node string) drbd.Driver { return h.drivers[node] }

func (h *execHarness) Resource(node string) *drbd.Resource {
	return contract.CapturedResource(node, h.backing(node), nil)
}

func (h *execHarness) Write(ctx context.Context, node string, off int64, data []byte) error {
	return h.c.Node(node).Write(ctx, contract.Resource, off, data)
}

func (h *execHarness) Read(ctx context.Context, node string, off int64, n int) ([]byte, error) {
	return h.c.Node(node).Read(ctx, contract.Resource, off, n)
}

func (h *execHarness) Cut(a, b string)                     { h.c.Cut(a, b) }
func (h *execHarness) Connect(a, b string)                 { h.c.Connect(a, b) }
func (h *execHarness) Advance(d time.Duration)             { h.c.Advance(d) }
func (h *execHarness) LostAckedWrites(res string) []string { return h.c.LostAckedWrites(res) }

// TestContractThroughStandIns runs the DRBD contract suite (the captured
// scenarios of real DRBD 9.2.18) through ExecDriver and the stand-ins: every
// command line ExecDriver runs reaches the simulated kernel, and everything
// it parses is what the stand-ins printed.
func TestContractThroughStandIns(t *testing.T) {
	contract.Run(t, newExecHarness(t))
}
