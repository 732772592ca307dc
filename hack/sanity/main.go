// Command sanity runs the real csi-sanity binary (csi-test v5.6.0, built into
// bin/k8s by `make k8s`) against meshvol's CSI controller and node services, once per
// layout, each through --csi.testvolumeparameters naming its ReplicatedStorageClass.
// The cluster is test/sanity's harness (the one the in-process suite uses too): a real
// kube-apiserver and etcd, three node agents on drbdsim with loop devices, real mkfs
// and mount. The controller and its CSI controller service run as a real
// `meshvol controller --csi-endpoint` process (bin/meshvol, --meshvol); node-1's node
// service runs in this process, because `meshvol node` drives real DRBD.
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
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/meshvol/meshvol/internal/testenv"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/test/sanity"
)

func main() {
	bin := flag.String("csi-sanity", "", "the csi-sanity binary (default <repo>/bin/k8s/csi-sanity)")
	meshvol := flag.String("meshvol", "", "the meshvol binary whose `controller` subcommand serves the controller service (default <repo>/bin/meshvol); \"-\" serves it in this process instead")
	which := flag.String("layouts", "1d,2d-1tb,3d", "layouts to run, comma-separated: 1d, 2d-1tb, 3d")
	focus := flag.String("focus", "", "passed to csi-sanity as --ginkgo.focus")
	skip := flag.String("skip", "", "passed to csi-sanity as --ginkgo.skip")
	logDir := flag.String("log-dir", "", "where each layout's csi-sanity output and the controller's log go (default <repo>/_output/sanity, <repo>/_output/sanity/installed with -installed)")
	installed := flag.Bool("installed", false, "run against the chart-installed driver of a sandbox (the node pod of node-1 and a controller pod, from bin/image/meshvol.oci.tar) instead of the in-process harness")
	flag.Parse()
	if *installed {
		os.Exit(runInstalled(*bin, *which, *focus, *skip, *logDir))
	}
	os.Exit(run(*bin, *meshvol, *which, *focus, *skip, *logDir))
}

// layoutsOf parses -layouts.
func layoutsOf(which string) ([]sanity.Layout, error) {
	var layouts []sanity.Layout
	for _, name := range strings.Split(which, ",") {
		l, ok := sanity.LayoutByName(name)
		if !ok {
			return nil, fmt.Errorf("sanity: unknown layout %q", name)
		}
		layouts = append(layouts, l)
	}
	return layouts, nil
}

// runLayouts runs csi-sanity against h once per layout; false when one
// failed.
func runLayouts(ctx context.Context, h target, layouts []sanity.Layout, bin, focus, skip, logDir string) (bool, error) {
	failed := false
	for _, l := range layouts {
		if ctx.Err() != nil {
			break
		}
		ok, err := runLayout(ctx, h, l, bin, focus, skip, logDir)
		if err != nil {
			return false, fmt.Errorf("sanity %s: %w", l.Name, err)
		}
		failed = failed || !ok
	}
	return !failed && ctx.Err() == nil, nil
}

func run(bin, meshvol, which, focus, skip, logDir string) int {
	root, err := testenv.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if bin == "" {
		bin = filepath.Join(root, "bin", "k8s", "csi-sanity")
	}
	switch meshvol {
	case "":
		meshvol = filepath.Join(root, "bin", "meshvol")
	case "-":
		meshvol = ""
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
	if meshvol != "" {
		if _, err := os.Stat(meshvol); err != nil {
			fmt.Fprintf(os.Stderr, "sanity: %v: run `make build` first\n", err)
			return 1
		}
	}
	layouts, err := layoutsOf(which)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}

	// The agents' logs would drown csi-sanity's; they are not needed to read a
	// failure, which csi-sanity's log names with the RPC's error message.
	ctrllog.SetLogger(logr.Discard())
	// Ctrl-C stops csi-sanity and still tears the cluster down (loop devices, mounts).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	opts := sanity.Options{ControllerBinary: meshvol}
	if meshvol != "" {
		f, err := os.Create(filepath.Join(logDir, "controller.log"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer f.Close()
		opts.ControllerOutput = f
	}
	startCtx, cancelStart := context.WithTimeout(ctx, 3*time.Minute)
	h, err := sanity.Start(startCtx, opts)
	cancelStart()
	if err != nil {
		fmt.Fprintf(os.Stderr, "sanity: %v\n", err)
		return 1
	}
	defer func() {
		if err := h.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "sanity: stopping: %v\n", err)
		}
	}()
	where := "in this process"
	if meshvol != "" {
		where = "in `" + meshvol + " controller` (log " + filepath.Join(logDir, "controller.log") + ")"
	}
	fmt.Printf("sanity: cluster up in %v (3 nodes, drbdsim on loop devices); controller service %s, node service of %s in this process\n",
		time.Since(start).Round(time.Millisecond), where, h.Node.Name)

	return exitCode(runLayouts(ctx, inProcess{h}, layouts, bin, focus, skip, logDir))
}

// exitCode is the process's exit code for runLayouts' outcome.
func exitCode(ok bool, err error) int {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if !ok {
		return 1
	}
	return 0
}

// target is what csi-sanity runs against: the in-process harness
// (inProcess) or the chart-installed driver of a sandbox (installed.go).
type target interface {
	// Endpoints are the node and controller services' sockets, unix:///….
	Endpoints() (node, controller string)
	// Dir holds the layouts' parameter files.
	Dir() string
	// Paths are the layout's target and staging paths as the node service
	// sees them; PathArgs what csi-sanity needs to create, check and
	// remove them there.
	Paths(l sanity.Layout) (target, staging string, err error)
	PathArgs() []string
	// Leftovers lists the volumes and attachments left in the cluster.
	Leftovers(ctx context.Context) ([]string, error)
	// Err is the error of a part that stopped on its own.
	Err() error
	// ResetRPCs forgets the CSI calls recorded; RPCTable is their table
	// ("" when the calls are not recorded).
	ResetRPCs()
	RPCTable() string
}

// inProcess is the test/sanity harness as a target.
type inProcess struct{ *sanity.Harness }

func (h inProcess) Endpoints() (string, string) { return h.NodeEndpoint, h.ControllerEndpoint }
func (h inProcess) Dir() string                 { return h.Harness.Dir }
func (h inProcess) PathArgs() []string          { return nil }
func (h inProcess) ResetRPCs()                  { h.RPCs.Reset() }
func (h inProcess) RPCTable() string            { return h.RPCs.Table() }

func runLayout(ctx context.Context, h target, l sanity.Layout, bin, focus, skip, logDir string) (bool, error) {
	target, staging, err := h.Paths(l)
	if err != nil {
		return false, err
	}
	params := filepath.Join(h.Dir(), l.Name+".yaml")
	if err := os.WriteFile(params, []byte(v1.CSIParameterStorageClass+": "+l.Class()+"\n"), 0o644); err != nil {
		return false, err
	}
	nodeEndpoint, controllerEndpoint := h.Endpoints()
	args := []string{
		"--csi.endpoint=" + nodeEndpoint,
		"--csi.controllerendpoint=" + controllerEndpoint,
		"--csi.mountdir=" + target,
		"--csi.stagingdir=" + staging,
		"--csi.testvolumeparameters=" + params,
		fmt.Sprintf("--csi.testvolumesize=%d", sanity.VolumeSize),
		fmt.Sprintf("--csi.testvolumeexpandsize=%d", sanity.ExpandSize),
		// The attach-limit spec then skips only because meshvol sets no max_volumes_per_node.
		"--csi.testnodevolumeattachlimit",
		"--ginkgo.v",
		"--ginkgo.no-color",
		"--ginkgo.timeout=40m",
	}
	args = append(args, h.PathArgs()...)
	if focus != "" {
		args = append(args, "--ginkgo.focus="+focus)
	}
	if skip != "" {
		args = append(args, "--ginkgo.skip="+skip)
	}
	logFile := filepath.Join(logDir, l.Name+".log")
	out, err := os.Create(logFile)
	if err != nil {
		return false, err
	}
	h.ResetRPCs()
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	runErr := cmd.Run()
	out.Close()
	took := time.Since(t0).Round(time.Second)
	b, err := os.ReadFile(logFile)
	if err != nil {
		return false, err
	}
	fmt.Printf("\nsanity %s: %s in %v (log %s)\n", l.Name, summarize(b), took, logFile)
	ok := runErr == nil
	for _, s := range skipped(b) {
		fmt.Printf("  skipped: %s: %s\n", s.spec, s.reason)
		if !sanity.AllowedSkip(s.reason) {
			ok = false
			fmt.Printf("sanity %s: the spec above skipped for a reason other than a capability meshvol does not advertise\n", l.Name)
		}
	}
	if table := h.RPCTable(); table != "" {
		fmt.Printf("CSI calls of layout %s, by slowest call:\n%s", l.Name, table)
	}
	if runErr != nil {
		fmt.Printf("sanity %s: csi-sanity: %v\n", l.Name, runErr)
	}
	if left, err := h.Leftovers(ctx); err != nil {
		return false, err
	} else if len(left) > 0 {
		ok = false
		fmt.Printf("sanity %s: left behind: %s\n", l.Name, strings.Join(left, ", "))
	}
	if err := h.Err(); err != nil {
		return false, err
	}
	return ok, nil
}

var ranRE = regexp.MustCompile(`Ran \d+ of \d+ Specs|\d+ Passed \| \d+ Failed \| \d+ Pending \| \d+ Skipped`)

// summarize pulls Ginkgo's "Ran N of M Specs" and counts lines out of a log.
func summarize(b []byte) string {
	return strings.Join(ranRE.FindAllString(string(b), -1), ", ")
}

// skip is a spec that skipped itself and the reason it gave.
type skip struct{ spec, reason string }

// skipped lists the specs that skipped themselves, with the reason each gave: with
// --ginkgo.v Ginkgo prints "S [SKIPPED] [t]" then the spec's path and text, then the
// reason on a line "[SKIPPED] <reason>".
func skipped(b []byte) []skip {
	lines := strings.Split(string(b), "\n")
	var out []skip
	for i := 0; i < len(lines); i++ {
		if !strings.HasPrefix(lines[i], "S [SKIPPED]") {
			continue
		}
		var s skip
		for j := i + 1; j < len(lines) && j < i+40; j++ {
			l := strings.TrimSpace(lines[j])
			if s.spec == "" && l != "" && !strings.HasPrefix(l, "github.com/") {
				s.spec = l
			}
			if r, ok := strings.CutPrefix(l, "[SKIPPED] "); ok {
				s.reason = r
				break
			}
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].spec < out[j].spec })
	return out
}
