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

// TestLoneResourceThroughStandIns: a resource with no peer (a 1D volume's
// only replica) has no connection, so its file names no address of this
// host; it comes up through ExecDriver and the stand-ins, is Primary, and
// connects once an adjust adds a peer.
func TestLoneResourceThroughStandIns(t *testing.T) {
	h := newExecHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lone := h.Resource("node1")
	lone.Peers = nil
	lone.Options.Resource.Quorum = drbd.QuorumCount(1) // as meshvol renders a 1D volume
	d := h.Driver("node1")
	steps := []struct {
		name string
		do   func() error
	}{
		{"write-config", func() error { return d.WriteConfig(ctx, lone) }},
		{"create-md", func() error { return d.CreateMetadata(ctx, lone.Name, 7) }},
		{"up", func() error { return d.Up(ctx, lone.Name) }},
		{"new-current-uuid", func() error { return d.NewCurrentUUIDClearBitmap(ctx, lone.Name) }},
		{"primary", func() error { return d.Primary(ctx, lone.Name, drbd.NoForce) }},
		// The agent's recompute of a stale quorum (two resource-options --quorum
		// changes), as the installed image's stand-ins must serve it.
		{"recompute-quorum", func() error { return d.RecomputeQuorum(ctx, lone.Name, lone.Options.Resource.Quorum) }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s of a resource without peers: %v", s.name, err)
		}
	}
	if err := h.Write(ctx, "node1", 0, []byte("lone")); err != nil {
		t.Fatalf("writing to the lone Primary: %v", err)
	}
	// A peer joins: node1's adjust brings its real address and the path.
	withPeer := h.Resource("node1")
	withPeer.Peers = withPeer.Peers[:1]
	if err := d.WriteConfig(ctx, withPeer); err != nil {
		t.Fatal(err)
	}
	if err := d.Adjust(ctx, withPeer.Name); err != nil {
		t.Fatalf("adjust adding a peer: %v", err)
	}
	show, err := d.Show(ctx, withPeer.Name)
	if err != nil {
		t.Fatal(err)
	}
	if len(show) != 1 || len(show[0].Connections) != 1 || show[0].Connections[0].Path == nil ||
		show[0].Connections[0].Path.ThisHost != withPeer.Self.Address.ShowString() {
		t.Fatalf("after the adjust, show: %+v; want one connection whose path's this host is %s", show, withPeer.Self.Address.ShowString())
	}
}
