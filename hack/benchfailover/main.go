// Command benchfailover measures failover on the installed sandbox
// (internal/sandbox: real kubelets, the chart-installed meshvol, drbdsim as
// every node's DRBD): repeated faults of a writer pod's node — crashes, and
// partitions (the node cut off from its DRBD peers and the control plane
// while it runs) — alternating the nodes and the 2D+1TB and 3D classes. For
// each run it times the fault → the node declared lost → the old pod
// deleted → its VolumeAttachment deleted → meshvol's Primary on the new
// node → the new VolumeAttachment attached → the new pod Running → its
// first acknowledged write, and checks that the counter the new pod found
// is at least the old pod's last acknowledged one (the writer fsyncs every
// write: internal/sandbox/failover.go). A crashed node is booted again
// after its run; a partition is healed, and the old pod must be killed,
// its DRBD resource taken down, and no write of the new pod lost.
//
// `make bench-failover` runs it (root); it writes docs/failover-bench.md
// (the runs, min/median/p95/max, the commit, date and machine load) and
// docs/failover-bench.svg (a stacked bar per run). Exit status 1 when a
// run fails a check or misses the goal (every run under -goal).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/meshvol/meshvol/internal/sandbox"
	"github.com/meshvol/meshvol/internal/testenv"
)

func main() {
	crashes := flag.Int("crashes", 10, "node crashes")
	partitions := flag.Int("partitions", 5, "node partitions (cut off from DRBD peers and the control plane)")
	classes := flag.String("classes", "meshvol-2d-1tb,meshvol-3d", "storage classes, alternated")
	taint := flag.Bool("taint-lost-nodes", true, "the chart's controller.taintLostNodes")
	goal := flag.Duration("goal", 15*time.Second, "every run's fault → first write must be under this")
	out := flag.String("out", "", "the results' base path, .md and .svg added (default <repo>/docs/failover-bench)")
	logs := flag.String("logs", "", "where each run's container logs of the release go, in a directory per run (default a new /tmp/benchfailover-logs-*)")
	flag.Parse()
	os.Exit(bench(*crashes, *partitions, strings.Split(*classes, ","), *taint, *goal, *out, *logs))
}

func bench(crashes, partitions int, classes []string, taint bool, goal time.Duration, out, logs string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root, err := testenv.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if out == "" {
		out = filepath.Join(root, "docs", "failover-bench")
	}
	dir, err := os.MkdirTemp("/tmp", "benchfo-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if logs == "" {
		if logs, err = os.MkdirTemp("/tmp", "benchfailover-logs-"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	// Every run's logs of the release's containers (the controllers, agents and
	// sidecars of every node, the faulted one's included), copied right after the
	// failover: a crashed node's go when it boots again, and a slow run is explained
	// from them (which confirmation or decision came late).
	fmt.Fprintf(os.Stderr, "benchfailover: each run's release logs go to %s/<run>\n", logs)
	keep := false
	defer func() {
		if !keep {
			os.RemoveAll(dir)
		}
	}()
	sb, err := sandbox.FromTree(ctx, root, dir, taint, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	rep := &report{Started: time.Now().UTC(), Goal: goal, TaintLostNodes: taint, Commit: commit(root), CPUs: runtime.NumCPU(),
		LeaderElection: chartLeaderElection(root)}
	// How the leader elections' holders renew their Leases meanwhile: the
	// margin of the chart's controller.leaderElection on this machine.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	leases, err := sb.WatchLeaderLeases(wctx)
	var agents func() []sandbox.LeaderRenewals
	if err == nil {
		agents, err = sb.WatchAgentLeases(wctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		if err := sb.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL: teardown:", err)
		}
		return 1
	}
	failed := false
	total := crashes + partitions
	for i := 0; i < total && ctx.Err() == nil; i++ {
		fault := sandbox.FaultCrash
		// Partitions spread among the crashes: every third run while any are left.
		if partitions > 0 && (i%3 == 2 || total-i <= partitions) {
			fault = sandbox.FaultPartition
			partitions--
		}
		o := sandbox.FailoverOptions{
			Name:  fmt.Sprintf("fo-%02d", i+1),
			Class: classes[i%len(classes)],
			Node:  sb.Kube.Nodes[i%len(sb.Kube.Nodes)].Name,
			Fault: fault,
		}
		rr, err := runOnce(ctx, sb, o, filepath.Join(logs, o.Name))
		if err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: run %s: %v\n", o.Name, err)
			failed = true
			if rr == nil {
				rr = &run{Name: o.Name, Class: o.Class, Fault: fault}
			}
			rr.Error = err.Error()
			rep.Runs = append(rep.Runs, *rr)
			// Put the node back for the next run; if that fails too, stop.
			if err := recoverNode(ctx, sb, rr); err != nil {
				fmt.Fprintf(os.Stderr, "FAIL: after run %s: %v\n", o.Name, err)
				break
			}
			continue
		}
		rep.Runs = append(rep.Runs, *rr)
		fmt.Fprintf(os.Stderr, "benchfailover: %s %-9s %-15s %s → %s: %5.2fs (detected %.2f, pod deleted %.2f, detached %.2f, Primary %.2f, attached %.2f, Running %.2f; load %s)\n",
			o.Name, fault, o.Class, rr.From, rr.To, rr.Total.Seconds(), rr.Detected.Seconds(), rr.PodDeleted.Seconds(),
			rr.Detached.Seconds(), rr.Primary.Seconds(), rr.Attached.Seconds(), rr.Running.Seconds(), rr.Load)
		if rr.Total >= goal {
			failed = true
		}
	}
	rep.Finished = time.Now().UTC()
	rep.Leases = leases()
	rep.AgentLeases = agents()
	// An open watch holds the apiserver's shutdown up.
	stopWatch()
	if err := rep.write(out); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: writing the results:", err)
		failed = true
	} else {
		fmt.Fprintf(os.Stderr, "benchfailover: %s\nbenchfailover: results in %s.md and %s.svg\n", rep.summary(), out, out)
	}
	if failed {
		keep = true
		fmt.Fprintf(os.Stderr, "benchfailover: logs kept in %s\n", dir)
	}
	if err := sb.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: teardown:", err)
		return 1
	}
	if failed {
		return 1
	}
	return 0
}

// runOnce runs one failover, keeps the release's logs in logs, and puts the
// sandbox back for the next: the writer and its volume deleted, a crashed node
// booted again, a partition healed (with its checks).
func runOnce(ctx context.Context, sb *sandbox.Sandbox, o sandbox.FailoverOptions, logs string) (*run, error) {
	r, err := sb.StartWriter(ctx, o)
	if err != nil {
		return nil, err
	}
	rr := &run{Load: loadavg(), result: r}
	leaders, err := sb.LeaderNodes(ctx)
	if err != nil {
		return rr, err
	}
	for lease, node := range leaders {
		if node == r.From {
			rr.Leaders = append(rr.Leaders, leaderRole(lease))
		}
	}
	slices.Sort(rr.Leaders)
	faultAt := time.Now().UTC() // Failover injects the fault first
	ferr := sb.Failover(ctx, r, 2*time.Minute)
	rr.fill(r)
	if err := keepLogs(sb, logs, faultAt, r); err != nil {
		fmt.Fprintf(os.Stderr, "benchfailover: %s: keeping the logs: %v\n", o.Name, err)
	}
	if ferr != nil {
		return rr, ferr
	}
	switch o.Fault {
	case sandbox.FaultPartition:
		h, err := sb.AfterHeal(ctx, r)
		if h != nil {
			rr.Heal = h
		}
		if err != nil {
			return rr, err
		}
		if err := sb.DeleteWriter(ctx, r, 3*time.Minute); err != nil {
			return rr, err
		}
	case sandbox.FaultCrash:
		// The node first: the volume's member there is force-removed, and
		// its deletion goes faster with every node back.
		if err := sb.RestartNode(ctx, r.From); err != nil {
			return rr, err
		}
		if err := sb.DeleteWriter(ctx, r, 3*time.Minute); err != nil {
			return rr, err
		}
	}
	return rr, nil
}

// keepLogs copies the release's container logs into dir, with run.txt: when the
// fault came (this machine's clock, which the logs' stamps share) and the run's
// milestones, to lay the logs against.
func keepLogs(sb *sandbox.Sandbox, dir string, faultAt time.Time, r *sandbox.FailoverResult) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := sb.CopyReleaseLogs(dir); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "fault %s %s on %s, class %s, to %s\n", faultAt.Format(time.RFC3339Nano), r.Fault, r.From, r.Class, r.To)
	for _, st := range r.Steps {
		fmt.Fprintln(&b, st)
	}
	return os.WriteFile(filepath.Join(dir, "run.txt"), []byte(b.String()), 0o644)
}

// recoverNode puts a failed run's node back: healed or booted again, the
// writer and its volume deleted.
func recoverNode(ctx context.Context, sb *sandbox.Sandbox, rr *run) error {
	if rr.From == "" {
		return nil
	}
	switch rr.Fault {
	case sandbox.FaultPartition:
		if err := sb.Heal(rr.From); err != nil {
			return err
		}
		if err := sb.WaitNodeBack(ctx, rr.From, 3*time.Minute); err != nil {
			return err
		}
	case sandbox.FaultCrash:
		if sb.Kube.Node(rr.From).Crashed() {
			if err := sb.RestartNode(ctx, rr.From); err != nil {
				return err
			}
		}
	}
	return sb.DeleteWriter(ctx, rr.result, 3*time.Minute)
}

func commit(root string) string {
	out, err := exec.Command("git", "-C", root, "describe", "--always", "--dirty").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// chartLeaderElection is the chart's default controller.leaderElection,
// which the sandbox installs: "leaseDuration/renewDeadline/retryPeriod".
func chartLeaderElection(root string) string {
	b, err := os.ReadFile(filepath.Join(root, "charts", "meshvol", "values.yaml"))
	if err != nil {
		return "?"
	}
	var v struct {
		Controller struct {
			LeaderElection struct{ LeaseDuration, RenewDeadline, RetryPeriod string }
		}
	}
	if err := yaml.Unmarshal(b, &v); err != nil {
		return "?"
	}
	le := v.Controller.LeaderElection
	return le.LeaseDuration + "/" + le.RenewDeadline + "/" + le.RetryPeriod
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
