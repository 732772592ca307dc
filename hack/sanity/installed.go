package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshvol/meshvol/internal/kubecluster"
	"github.com/meshvol/meshvol/internal/sandbox"
	"github.com/meshvol/meshvol/internal/testenv"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/test/sanity"
)

// installed is the chart-installed driver of a sandbox as csi-sanity's
// target (-installed): `helm install` of charts/meshvol with the image
// `make image` built, on nodes with namespaces of their own. csi-sanity
// calls the node service of node-1's node pod through its socket in
// node-1's kubelet plugin directory, and the controller service of a Ready
// controller pod through its socket in the pod's emptyDir. The node
// service works in node-1's mount namespace, so the target and staging
// paths are node-1's (under its /var/lib/kubelet, where the node pod's
// mounts propagate): csi-sanity creates, checks and removes them through
// commands that enter node-1's namespaces (--csi.createmountpathcmd and
// the others).
type installed struct {
	sb     *sandbox.Sandbox
	dir    string
	logDir string
	node   *kubecluster.Node
	args   []string
}

// nodePathsRoot is where the layouts' paths live on node-1, as its node
// pod sees them.
const nodePathsRoot = "/var/lib/kubelet/plugins/sanity"

func (h *installed) Endpoints() (string, string) {
	return "unix://" + h.sb.NodeSocket(h.node.Name), "unix://" + h.sb.ControllerSocket
}
func (h *installed) Dir() string        { return h.dir }
func (h *installed) PathArgs() []string { return h.args }
func (h *installed) ResetRPCs()         {}

// RPCTable: the calls are served in the pods, whose logs do not time them
// at the chart's verbosity.
func (h *installed) RPCTable() string { return "" }

func (h *installed) Paths(l sanity.Layout) (string, string, error) {
	return filepath.Join(nodePathsRoot, l.Name, "target"), filepath.Join(nodePathsRoot, l.Name, "staging"), nil
}

func (h *installed) Leftovers(ctx context.Context) ([]string, error) {
	return sanity.Leftovers(ctx, h.sb.Client)
}

// Err reports a container of the release that restarted or logged a
// refused request.
func (h *installed) Err() error {
	rep, err := h.sb.ReleaseReport(context.Background())
	if err != nil {
		return err
	}
	var bad []string
	for _, r := range rep {
		if r.Restarts > 0 {
			bad = append(bad, fmt.Sprintf("%s/%s restarted %d times", r.Pod, r.Container, r.Restarts))
		}
		for _, l := range r.Forbidden {
			bad = append(bad, fmt.Sprintf("%s/%s logged a refused request: %s", r.Pod, r.Container, l))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("the release: %s", strings.Join(bad, "; "))
	}
	return nil
}

// writePathCommands writes csi-sanity's path commands, each running a
// script in node-1's namespaces with the path as $1.
func (h *installed) writePathCommands() error {
	scripts := map[string]string{
		"create": `mkdir -p "$1" && echo "$1"`,
		"remove": `rm -rf --one-file-system "$1"`,
		"check":  `if [ ! -e "$1" ]; then echo not_found; elif [ -d "$1" ]; then echo directory; elif [ -f "$1" ]; then echo file; else echo other; fi`,
	}
	enter := strings.Join(h.node.Nsenter(), " ")
	paths := map[string]string{}
	for name, script := range scripts {
		p := filepath.Join(h.dir, name+"-path.sh")
		body := fmt.Sprintf("#!/bin/sh\n# csi-sanity's %s path command, in the namespaces of %s.\nexec %s /bin/sh -c '%s' sh \"$1\"\n", name, h.node.Name, enter, script)
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			return err
		}
		paths[name] = p
	}
	h.args = []string{
		"--csi.createmountpathcmd=" + paths["create"], "--csi.createstagingpathcmd=" + paths["create"],
		"--csi.removemountpathcmd=" + paths["remove"], "--csi.removestagingpathcmd=" + paths["remove"],
		"--csi.checkpathcmd=" + paths["check"],
	}
	return nil
}

// runInstalled is run for -installed.
func runInstalled(bin, which, focus, skip, logDir string) int {
	root, err := testenv.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if bin == "" {
		bin = filepath.Join(root, "bin", "k8s", "csi-sanity")
	}
	if logDir == "" {
		logDir = filepath.Join(root, "_output", "sanity", "installed")
	}
	layouts, err := layoutsOf(which)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	h, err := startInstalled(ctx, root, logDir, layouts)
	if h != nil {
		defer func() {
			began := time.Now()
			// meshvol's log in the sandbox's directory, which goes.
			if b, err := os.ReadFile(filepath.Join(h.dir, "meshvol.log")); err == nil {
				_ = os.WriteFile(filepath.Join(h.logDir, "sandbox.log"), b, 0o644)
			}
			if err := h.sb.Stop(); err != nil {
				fmt.Fprintf(os.Stderr, "sanity: stopping the sandbox: %v\n", err)
			} else {
				fmt.Printf("sanity: sandbox torn down in %s, nothing left on the machine\n", time.Since(began).Round(time.Millisecond))
			}
			os.RemoveAll(h.dir)
		}()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "sanity: %v\n", err)
		return 1
	}
	return exitCode(runLayouts(ctx, h, layouts, bin, focus, skip, logDir))
}

// startInstalled starts the sandbox with the chart-installed driver and a
// ReplicatedStorageClass per layout on its pool. A non-nil installed is to
// be stopped, even with an error.
func startInstalled(ctx context.Context, root, logDir string, layouts []sanity.Layout) (*installed, error) {
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(root, "bin", "k8s", "csi-sanity")); err != nil {
		return nil, fmt.Errorf("%w: run `make k8s` first", err)
	}
	// Short: unix sockets live beneath it.
	dir, err := os.MkdirTemp("/tmp", "sanity-")
	if err != nil {
		return nil, err
	}
	began := time.Now()
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Minute) // waiting for another cluster included
	defer cancel()
	// The image must be this tree's build: FromTree checks it and rebuilds
	// it when it is not (`make sanity` builds it first).
	sb, err := sandbox.FromTree(startCtx, root, dir, false, os.Stdout)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	h := &installed{sb: sb, dir: dir, logDir: logDir, node: sb.Kube.Nodes[0]}
	for _, l := range layouts {
		ftt, gmdr := l.FTT, l.GMDR
		rsc := &v1.ReplicatedStorageClass{ObjectMeta: metav1.ObjectMeta{Name: l.Class()},
			Spec: v1.ReplicatedStorageClassSpec{StoragePool: sandbox.PoolName, FailuresToTolerate: &ftt,
				GuaranteedMinimumDataRedundancy: &gmdr, Topology: v1.TopologyIgnored}}
		if err := sb.Client.Create(ctx, rsc); err != nil {
			return h, err
		}
	}
	if err := h.writePathCommands(); err != nil {
		return h, err
	}
	fmt.Printf("sanity: sandbox up in %s (chart-installed driver, 3 nodes); node service of %s's node pod, controller service of a controller pod\n",
		(time.Since(began) - sb.Kube.LockWait).Round(time.Millisecond), h.node.Name)
	return h, nil
}
