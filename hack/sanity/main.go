// Command sanity runs the real csi-sanity binary (csi-test v5.6.0, built into
// bin/k8s by `make k8s`) against meshvol's CSI controller and node services on a
// whole cluster (pkg/localcluster: real kube-apiserver and etcd, the controller, three
// node agents on drbdsim with loop devices, real mkfs and mount), once per layout,
// each through --csi.testvolumeparameters naming its ReplicatedStorageClass. The
// controller service and node-1's node service listen on their own unix sockets, as
// `meshvol controller --csi-endpoint` and `meshvol node --csi-endpoint` do.
//
// `make sanity` runs it; it must run as root (loop devices, mounts) and leaves nothing
// behind. Exit status: 0 when every layout passes.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
	"github.com/meshvol/meshvol/pkg/csi"
	"github.com/meshvol/meshvol/pkg/localcluster"
	"github.com/meshvol/meshvol/pkg/testenv"
)

var layouts = map[string][2]int32{"1d": {0, 0}, "2d-1tb": {1, 0}, "3d": {1, 1}}

func main() {
	bin := flag.String("csi-sanity", "", "the csi-sanity binary (default <repo>/bin/k8s/csi-sanity)")
	which := flag.String("layouts", "1d,2d-1tb,3d", "layouts to run, comma-separated: 1d, 2d-1tb, 3d")
	focus := flag.String("focus", "", "passed to csi-sanity as --ginkgo.focus")
	skip := flag.String("skip", "", "passed to csi-sanity as --ginkgo.skip")
	logDir := flag.String("log-dir", "", "where each layout's full csi-sanity output goes (default <repo>/_output/sanity)")
	flag.Parse()
	os.Exit(run(*bin, *which, *focus, *skip, *logDir))
}

func run(bin, which, focus, skip, logDir string) int {
	root, err := testenv.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if bin == "" {
		bin = filepath.Join(root, "bin", "k8s", "csi-sanity")
	}
	if logDir == "" {
		logDir = filepath.Join(root, "_output", "sanity")
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := os.Stat(bin); err != nil {
		fmt.Fprintf(os.Stderr, "sanity: %v: run `make k8s` first\n", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "meshvol-sanity-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)

	// The controller's and agents' logs would drown csi-sanity's; they are not needed
	// to read a failure, which csi-sanity's log names with the RPC's error message.
	ctrllog.SetLogger(logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	lc, err := localcluster.Start(ctx, localcluster.Options{Nodes: 3, LoopDevices: true,
		Controller: localcluster.Controller(controller.Options{})})
	if err != nil {
		fmt.Fprintf(os.Stderr, "sanity: starting the cluster: %v\n", err)
		return 1
	}
	defer func() {
		cancel()
		if err := lc.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "sanity: stopping the cluster: %v\n", err)
		}
	}()
	fmt.Printf("sanity: cluster up in %v (3 nodes, drbdsim on loop devices)\n", time.Since(start).Round(time.Millisecond))
	if _, err := lc.CreatePool(ctx, "sanity"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// CreateVolume refuses what the pool's reported free space cannot hold: wait until
	// the controller has reported every node's capacity.
	for deadline := time.Now().Add(2 * time.Minute); ; {
		var rsp v1.ReplicatedStoragePool
		ready := 0
		if err := lc.Client.Get(ctx, client.ObjectKey{Name: "sanity"}, &rsp); err == nil {
			for _, n := range rsp.Status.EligibleNodes {
				if n.Ready && n.FreeCapacity != nil && !n.FreeCapacity.IsZero() {
					ready++
				}
			}
		}
		if ready == len(lc.Nodes) {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "sanity: pool sanity has %d of %d nodes ready with capacity after 2 minutes\n", ready, len(lc.Nodes))
			return 1
		}
		time.Sleep(100 * time.Millisecond)
	}
	ctrlSock, nodeSock := filepath.Join(dir, "controller.sock"), filepath.Join(dir, "node.sock")
	node := lc.Nodes[0]
	errs := make(chan error, 2)
	go func() {
		errs <- csi.RunController(ctx, csi.ControllerOptions{Endpoint: "unix://" + ctrlSock, Config: lc.Env.Config,
			Scheme: lc.Env.Scheme, Namespace: lc.Namespace, Log: logr.Discard()})
	}()
	go func() {
		errs <- csi.RunNode(ctx, csi.NodeOptions{Endpoint: "unix://" + nodeSock, Config: lc.Env.Config,
			Scheme: lc.Env.Scheme, NodeName: node.Name, Zone: node.Zone, Log: logr.Discard()})
	}()
	for _, s := range []string{ctrlSock, nodeSock} {
		for deadline := time.Now().Add(time.Minute); ; {
			if _, err := os.Stat(s); err == nil {
				break
			}
			select {
			case err := <-errs:
				fmt.Fprintf(os.Stderr, "sanity: a CSI service stopped: %v\n", err)
				return 1
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				fmt.Fprintf(os.Stderr, "sanity: %s did not appear\n", s)
				return 1
			}
		}
	}

	failed := false
	for _, name := range strings.Split(which, ",") {
		l, ok := layouts[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "sanity: unknown layout %q\n", name)
			return 2
		}
		rsc := "sanity-" + name
		if _, err := lc.CreateClass(ctx, rsc, "sanity", l[0], l[1], v1.TopologyIgnored); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		// csi-sanity makes target and staging itself, but not their parent.
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		params := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(params, []byte(v1.CSIParameterStorageClass+": "+rsc+"\n"), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		args := []string{
			"--csi.endpoint=unix://" + nodeSock,
			"--csi.controllerendpoint=unix://" + ctrlSock,
			"--csi.mountdir=" + filepath.Join(dir, name, "target"),
			"--csi.stagingdir=" + filepath.Join(dir, name, "staging"),
			"--csi.testvolumeparameters=" + params,
			"--csi.testvolumesize=67108864",
			"--csi.testvolumeexpandsize=100663296",
			"--ginkgo.v",
			"--ginkgo.timeout=40m",
		}
		if focus != "" {
			args = append(args, "--ginkgo.focus="+focus)
		}
		if skip != "" {
			args = append(args, "--ginkgo.skip="+skip)
		}
		logFile := filepath.Join(logDir, name+".log")
		out, err := os.Create(logFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		t0 := time.Now()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Stdout, cmd.Stderr = out, out
		runErr := cmd.Run()
		out.Close()
		summary := summarize(logFile)
		fmt.Printf("sanity %s: %s in %v (log %s)\n", name, summary, time.Since(t0).Round(time.Second), logFile)
		if runErr != nil {
			failed = true
			fmt.Printf("sanity %s: csi-sanity: %v\n", name, runErr)
		}
	}
	if failed {
		return 1
	}
	return 0
}

var ranRE = regexp.MustCompile(`Ran \d+ of \d+ Specs|\d+ Passed \| \d+ Failed \| \d+ Pending \| \d+ Skipped`)

// summarize pulls Ginkgo's "Ran N of M Specs" and counts lines out of a log.
func summarize(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return strings.Join(ranRE.FindAllString(string(b), -1), ", ")
}
