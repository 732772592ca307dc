//go:build vmtest

// Package drbd_test runs pkg/drbd on real DRBD 9.2.18: three qemu guests
// booted by hack/vm-test-drbd.sh (test/vm/README.md), each with Debian's 6.1
// kernel, DRBD built from LINBIT's source and Debian's drbd-utils, on a
// private network inside a network namespace of their own.
//
// The same test binary plays both parts. In each guest, started by the
// guest's init with MESHVOL_VM_DRBD_AGENT=<node>, it serves that node's
// drbd.ExecDriver over HTTP (agent_test.go). On the host, inside the
// namespace, with MESHVOL_VM_DRBD=node1=10.99.0.1,..., it runs the tests:
// pkg/drbd/contract through a Harness whose drivers are the guests' (every
// method runs in the guest, as the node agent would run it), and the checks
// of checks_test.go. Without either variable every test skips.
//
// The files carry the build tag vmtest, so `go test ./...`, `go vet ./...`
// and `make test` do not see this package.
package drbd_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/contract"
)

// backing is the guests' disk: a fresh sparse file of contract.BackingSize
// that qemu gives the diskful guests as virtio /dev/vda.
const backing = "/dev/vda"

// The peers authenticate as the node agent renders it (and as on the
// recorded machines): cram-hmac-alg with a shared secret.
const secret = "vm-tier_S3cret-4f9Q"

// cl is the running cluster on the host; nil anywhere else.
var cl *cluster

func TestMain(m *testing.M) {
	if node := os.Getenv("MESHVOL_VM_DRBD_AGENT"); node != "" {
		os.Exit(runAgent(node))
	}
	if spec := os.Getenv("MESHVOL_VM_DRBD"); spec != "" && os.Getenv("MESHVOL_VM_PRODUCT") != "" {
		os.Exit(runProductTier(m, spec, os.Getenv("MESHVOL_VM_DRBD_OUT"), os.Getenv("MESHVOL_VM_PRODUCT")))
	}
	if spec := os.Getenv("MESHVOL_VM_DRBD"); spec != "" {
		var err error
		if cl, err = startCluster(spec, os.Getenv("MESHVOL_VM_DRBD_OUT")); err != nil {
			fmt.Fprintf(os.Stderr, "real-DRBD setup: %v\n", err)
			os.Exit(2)
		}
	}
	code := m.Run()
	if cl != nil {
		cl.finish()
	}
	os.Exit(code)
}

// cluster is the three guests as the host sees them.
type cluster struct {
	nodes map[string]*remote
	out   string // where the raw event streams and kernel logs go

	// hmacAlg and verifyAlg are negotiated over the guests' /proc/crypto,
	// as the node agent does over its nodes'.
	hmacAlg, verifyAlg string

	recCancel context.CancelFunc
	recWG     sync.WaitGroup
}

// startCluster waits for the three agents (the guests boot under software
// emulation: up to MESHVOL_VM_BOOT_TIMEOUT seconds, default 600) and starts
// recording each node's raw events2 stream for the whole run.
func startCluster(spec, out string) (*cluster, error) {
	c := &cluster{nodes: map[string]*remote{}, out: out}
	for _, kv := range strings.Split(spec, ",") {
		node, ip, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("MESHVOL_VM_DRBD: %q is not node=ip", kv)
		}
		c.nodes[node] = newRemote(node, ip)
	}
	for _, n := range contract.Nodes {
		if c.nodes[n] == nil {
			return nil, fmt.Errorf("MESHVOL_VM_DRBD: no address for %s", n)
		}
	}
	wait := 600 * time.Second
	if s := os.Getenv("MESHVOL_VM_BOOT_TIMEOUT"); s != "" {
		secs, err := strconv.Atoi(s)
		if err != nil {
			return nil, fmt.Errorf("MESHVOL_VM_BOOT_TIMEOUT: %w", err)
		}
		wait = time.Duration(secs) * time.Second
	}
	start := time.Now()
	for _, n := range contract.Nodes {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := c.nodes[n].Ping(ctx)
			cancel()
			if err == nil {
				break
			}
			if time.Since(start) > wait {
				return nil, fmt.Errorf("%s: agent not answering after %s: %v", n, wait, err)
			}
			time.Sleep(time.Second)
		}
	}
	fmt.Printf("drbd-vm: all three agents answer, %s after the test binary started\n", time.Since(start).Round(time.Second))
	var offered [][]string
	for _, n := range contract.Nodes {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		algs, err := c.nodes[n].KernelHashAlgorithms(ctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n, err)
		}
		offered = append(offered, algs)
	}
	c.hmacAlg = drbd.Negotiate(drbd.HMACAlgPreference, offered...)
	c.verifyAlg = drbd.Negotiate(drbd.VerifyAlgPreference, offered...)
	fmt.Printf("drbd-vm: negotiated cram-hmac-alg %q, verify-alg %q over the guests' /proc/crypto\n", c.hmacAlg, c.verifyAlg)
	if c.hmacAlg == "" || c.verifyAlg == "" {
		return nil, fmt.Errorf("no common hash algorithm in the guests' /proc/crypto: %q", offered)
	}
	if out != "" {
		ctx, cancel := context.WithCancel(context.Background())
		c.recCancel = cancel
		for _, n := range contract.Nodes {
			rc, err := c.nodes[n].Events(ctx)
			if err != nil {
				cancel()
				return nil, err
			}
			f, err := os.Create(filepath.Join(out, n+".events2.txt"))
			if err != nil {
				cancel()
				return nil, err
			}
			c.recWG.Add(1)
			go func() {
				defer c.recWG.Done()
				defer f.Close()
				defer rc.Close()
				io.Copy(f, rc)
			}()
		}
	}
	return c, nil
}

// finish stops the recordings, saves each guest's kernel log and powers the
// guests off.
func (c *cluster) finish() {
	if c.recCancel != nil {
		c.recCancel()
		c.recWG.Wait()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, n := range contract.Nodes {
		if c.out != "" {
			if res, err := c.nodes[n].Exec(ctx, "dmesg"); err == nil {
				os.WriteFile(filepath.Join(c.out, n+".dmesg.txt"), res.Stdout, 0o644)
			}
		}
		c.nodes[n].Poweroff(ctx)
	}
}

// tap is the host side of node's network interface (hack/vm-test-drbd.sh
// names them so).
func tap(node string) string { return "tap-" + node }

// link cuts (add) or restores the network between a and b in both
// directions: the bridge drops every frame from one's tap to the other's,
// as a broken cable would. Traffic to the host is not touched.
func link(add bool, a, b string) {
	op := "-D"
	if add {
		op = "-A"
	}
	for _, p := range [][2]string{{a, b}, {b, a}} {
		out, err := exec.Command("ebtables", op, "FORWARD", "-i", tap(p[0]), "-o", tap(p[1]), "-j", "DROP").CombinedOutput()
		if err != nil {
			// The harness cannot return an error; a network that cannot
			// be cut makes every later result meaningless.
			panic(fmt.Sprintf("ebtables %s %s->%s: %v: %s", op, p[0], p[1], err, out))
		}
	}
}

// healAll removes every cut.
func healAll() error {
	out, err := exec.Command("ebtables", "-F", "FORWARD").CombinedOutput()
	if err != nil {
		return fmt.Errorf("ebtables -F FORWARD: %v: %s", err, out)
	}
	return nil
}

func needCluster(t *testing.T) {
	t.Helper()
	if cl == nil {
		t.Skip("needs the VM tier: run make test-drbd-vm (MESHVOL_VM_DRBD is set by hack/vm-test-drbd.sh)")
	}
}
