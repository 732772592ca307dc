//go:build vmtest

package drbd_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/contract"
)

// harness runs pkg/drbd/contract on the guests.
type harness struct {
	c    *cluster
	tune func(*drbd.OptionSet)
	run  int // which TestContract run, for Record's file names
}

var _ contract.Harness = (*harness)(nil)

func (h *harness) Driver(node string) drbd.Driver { return h.c.nodes[node] }

func (h *harness) Resource(node string) *drbd.Resource {
	return contract.CapturedResource(node, backing, func(o *drbd.OptionSet) {
		o.Net.CramHMACAlg = drbd.Ptr(h.c.hmacAlg)
		o.Net.SharedSecret = drbd.Ptr(secret)
		o.Net.VerifyAlg = drbd.Ptr(h.c.verifyAlg)
		if h.tune != nil {
			h.tune(o)
		}
	})
}

func (h *harness) Write(ctx context.Context, node string, off int64, data []byte) error {
	return h.c.nodes[node].Write(ctx, contract.Resource, off, data)
}

func (h *harness) Read(ctx context.Context, node string, off int64, n int) ([]byte, error) {
	return h.c.nodes[node].Read(ctx, contract.Resource, off, n)
}

// Record saves what the suite saw on node's events2 stream, normalized as
// the suite compares it, as bin/vm/drbd/run/contract-real.<node>.run<N>.seq:
// the format of the recordings that drbdsim's contract test compares with
// (contract.Recorder, called once the suite has passed).
func (h *harness) Record(node string, changes []string) {
	if h.c.out == "" {
		return
	}
	name := filepath.Join(h.c.out, fmt.Sprintf("contract-real.%s.run%d.seq", node, h.run))
	if err := os.WriteFile(name, []byte(strings.Join(changes, "\n")+"\n"), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "record %s: %v\n", name, err)
	}
}

func (h *harness) Cut(a, b string)         { link(true, a, b) }
func (h *harness) Connect(a, b string)     { link(false, a, b) }
func (h *harness) Advance(d time.Duration) { time.Sleep(d) }

// reset takes r0 down everywhere, removes its configuration, wipes the
// metadata and heals the network: the state of freshly booted guests, so
// that the contract suite can run again.
func (c *cluster) reset(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := healAll(); err != nil {
		t.Fatal(err)
	}
	h := &harness{c: c}
	for _, n := range contract.Nodes {
		r := c.nodes[n]
		// down needs the configuration file (without one drbdadm cannot
		// open it), and a fresh guest has none.
		if err := r.WriteConfig(ctx, h.Resource(n)); err != nil {
			t.Fatalf("%s: write config: %v", n, err)
		}
		if err := r.Down(ctx, contract.Resource); err != nil {
			t.Fatalf("%s: down: %v", n, err)
		}
		has := false
		if n != "node3" {
			var err error
			if has, err = r.HasMetadata(ctx, contract.Resource); err != nil {
				t.Fatalf("%s: has metadata: %v", n, err)
			}
		}
		if err := r.RemoveConfig(ctx, contract.Resource); err != nil {
			t.Fatalf("%s: remove config: %v", n, err)
		}
		if !has {
			continue
		}
		// drbdmeta's own wipe (the driver has none): minor 0, internal
		// metadata on the backing disk.
		res, err := r.Exec(ctx, "drbdmeta", "--force", "0", "v09", backing, "internal", "wipe-md")
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%s: wipe-md: %v exit %d: %s", n, err, res.ExitCode, res.Stderr)
		}
	}
}

// TestContract runs pkg/drbd/contract, unchanged, on the three guests:
// MESHVOL_VM_CONTRACT_RUNS times in a row (default 1), from freshly wiped
// metadata each time.
func TestContract(t *testing.T) {
	needCluster(t)
	runs := 1
	if s := os.Getenv("MESHVOL_VM_CONTRACT_RUNS"); s != "" {
		var err error
		if runs, err = strconv.Atoi(s); err != nil || runs < 1 {
			t.Fatalf("MESHVOL_VM_CONTRACT_RUNS=%q: want a count >= 1", s)
		}
	}
	for i := 1; i <= runs; i++ {
		ok := t.Run(fmt.Sprintf("run%d", i), func(t *testing.T) {
			cl.reset(t)
			start := time.Now()
			contract.Run(t, &harness{c: cl, run: i})
			t.Logf("contract run %d took %s", i, time.Since(start).Round(time.Second))
		})
		if !ok {
			break
		}
	}
}
