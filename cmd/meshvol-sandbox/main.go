// Command meshvol-sandbox runs a real Kubernetes cluster with meshvol on this
// machine, a demonstration, then stays up until Ctrl-C (`make sandbox`). It is
// a binary of its own so that the product binary, cmd/meshvol, links none of
// the harness it needs (envtest, kubelets, drbdsim).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/meshvol/meshvol/internal/kubecluster"
	"github.com/meshvol/meshvol/internal/sandbox"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is meshvol-sandbox with its arguments; it returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("meshvol-sandbox", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "/var/tmp/meshvol-sandbox", "directory for the cluster's state and logs (kept after teardown, with the logs)")
	nodes := fs.Int("nodes", 3, "number of nodes, each in a zone of its own")
	demo := fs.Bool("demo", true, "run the demonstration (PVC, pod, node crash, pod back elsewhere) once the cluster is up")
	demoClass := fs.String("demo-class", sandbox.DemoStorageClass, "the storage class of the demonstration's volume")
	binDir := fs.String("bin-dir", "", "directory of the Kubernetes binaries and CSI sidecars (default: bin/k8s of the source tree, as `make k8s` builds it)")
	exe, _ := os.Executable()
	pause := fs.String("pause-binary", filepath.Join(filepath.Dir(exe), "meshvol-pause"), "the static pause program the pause image is built from (`make sandbox` builds it)")
	taint := fs.Bool("taint-lost-nodes", true, "let the controller taint lost nodes out-of-service, so their pods move at once")
	exitAfterDemo := fs.Bool("exit-after-demo", false, "tear down after the demonstration instead of waiting for Ctrl-C")
	image := fs.String("image", filepath.Join(filepath.Dir(exe), "image", "meshvol.oci.tar"), "the meshvol image (`make image`), installed with `helm install` of the chart")
	standIns := fs.String("stand-ins", filepath.Join(filepath.Dir(exe), "drbdsim-utils"), "the drbd-utils stand-ins (internal/drbdsimd/drbdutils, static; `make sandbox` builds it) through which the node pods reach the simulated DRBD")
	inProcess := fs.Bool("in-process", false, "run meshvol's controller, agents and CSI services in this process instead of installing the chart and the image")
	var images []string
	fs.Func("images", "more OCI image archives, comma-separated, imported into every node's containerd (`make conformance` gives the upstream test images)", func(v string) error {
		for _, a := range strings.Split(v, ",") {
			if a = strings.TrimSpace(a); a != "" {
				images = append(images, a)
			}
		}
		return nil
	})
	wait := fs.Bool("wait", false, "wait for another sandbox or e2e run on this machine to end instead of exiting (one runs at a time)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "meshvol-sandbox: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *nodes < 2 {
		fmt.Fprintln(stderr, "meshvol-sandbox: -nodes must be at least 2: the demonstration moves a pod to another node")
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := os.MkdirAll(filepath.Join(*dir, "logs"), 0o755); err != nil {
		fmt.Fprintln(stderr, "meshvol-sandbox:", err)
		return 1
	}
	logPath := filepath.Join(*dir, "logs", "meshvol.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		fmt.Fprintln(stderr, "meshvol-sandbox:", err)
		return 1
	}
	defer logFile.Close()
	log := funcr.New(func(prefix, args string) {
		fmt.Fprintln(logFile, time.Now().Format("15:04:05.000"), prefix, args)
	}, funcr.Options{Verbosity: 1})

	began := time.Now()
	fmt.Fprintf(stdout, "meshvol-sandbox: starting %d nodes in %s (meshvol's log: %s)\n", *nodes, *dir, logPath)
	if *inProcess {
		*image = ""
	}
	sb, err := sandbox.Start(ctx, sandbox.Options{
		Image:          *image,
		StandIns:       *standIns,
		Dir:            *dir,
		Nodes:          *nodes,
		BinDir:         *binDir,
		PauseBinary:    *pause,
		TaintLostNodes: *taint,
		WaitForLock:    *wait,
		Images:         images,
		Progress:       stdout,
		Log:            log,
	})
	if errors.Is(err, kubecluster.ErrBusy) {
		fmt.Fprintf(stderr, "meshvol-sandbox: %v\nOnly one runs at a time; stop the other one (Ctrl-C in its terminal) first, or wait for it with -wait.\n", err)
		return 1
	}
	if err != nil {
		fmt.Fprintln(stderr, "meshvol-sandbox:", err)
		return 1
	}
	fmt.Fprintf(stdout, "meshvol-sandbox: up in %s\n", (time.Since(began) - sb.Kube.LockWait).Round(100*time.Millisecond))
	code := 0
	if *image != "" {
		// The controller's leader hand-over, when its pod is deleted and
		// when its process crashes.
		for _, crash := range []bool{false, true} {
			h, err := sb.LeaderHandover(ctx, crash)
			if err != nil {
				fmt.Fprintln(stderr, "meshvol-sandbox: the controller's leader hand-over:", err)
				code = 1
				break
			}
			how := "pod deleted"
			if crash {
				how = "process killed (SIGKILL)"
			}
			fmt.Fprintf(stdout, "meshvol-sandbox: leader hand-over, %s: %s → %s in %s\n", how, h.OldLeader, h.NewLeader, h.Took.Round(100*time.Millisecond))
		}
	}
	if *demo && code == 0 {
		res, err := sb.Demo(ctx, stdout, *demoClass)
		if err != nil {
			fmt.Fprintln(stderr, "meshvol-sandbox: the demonstration failed:", err)
			code = 1
		} else {
			fmt.Fprintf(stdout, "\nmeshvol-sandbox: crash of %s → pod Running on %s with the same data in %s\n",
				res.FirstNode, res.SecondNode, res.CrashToReady.Round(100*time.Millisecond))
		}
	}
	if !*exitAfterDemo && ctx.Err() == nil {
		kubectl := filepath.Join(sb.Kube.BinDir, "kubectl")
		fmt.Fprintf(stdout, `
meshvol-sandbox: the cluster is up until Ctrl-C. Try:

  export KUBECONFIG=%[1]s
  %[2]s get nodes -o wide
  %[2]s get storageclass
  %[2]s get rv,rvr,rva,pvc,pv,pod -o wide
  %[2]s describe rv

Each node has its own address; pods have a network of their own (each
node's pod subnet, routed between the nodes; with -in-process, the host
network only) but no Services: there is no kube-proxy. The image %[3]s
is on every node.
`, sb.Kube.Kubeconfig, kubectl, kubecluster.BusyboxImage)
		<-ctx.Done()
	}
	stop() // a second Ctrl-C during the teardown kills the process
	fmt.Fprintln(stdout, "\nmeshvol-sandbox: tearing down")
	began = time.Now()
	if err := sb.Stop(); err != nil {
		fmt.Fprintln(stderr, "meshvol-sandbox: teardown:", err)
		return 1
	}
	fmt.Fprintf(stdout, "meshvol-sandbox: torn down in %s; nothing left on the machine (logs kept in %s)\n",
		time.Since(began).Round(100*time.Millisecond), filepath.Join(*dir, "logs"))
	return code
}
