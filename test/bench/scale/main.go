// Command scale is meshvol's scale benchmark (`make bench-scale`): N volumes
// created at once on an in-process cluster (internal/localcluster: a real
// kube-apiserver and etcd, three nodes on drbdsim with file pools), with the
// controller as a process of its own (`meshvol controller`) so its CPU time and
// memory are measured apart from the agents and the simulator, which run in
// this process. For each class and N it measures the time from the first
// create to all Ready and each volume's own (p50, p95), the apiserver writes
// per volume (counted by the apiserver's audit log and by the processes' own
// counters, which must agree), the CPU used in an idle period after formation,
// resident memory, and the time and writes to delete them all.
//
// Results go to DIR/results.json (merged with the runs already there, keyed
// by label, class and N), DIR/results.md and SVG plots in DIR; docs/scale.md
// explains them. It needs root (loop devices, a tmpfs per run).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/resource"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// Result is one run's figures.
type Result struct {
	Label     string `json:"label"`
	Commit    string `json:"commit"`
	Date      string `json:"date"`
	LoadStart string `json:"loadStart"`
	LoadEnd   string `json:"loadEnd"`
	Class     string `json:"class"`
	N         int    `json:"n"`

	Ready         int     `json:"ready"`
	CreateSeconds float64 `json:"createSeconds"` // to make the N create calls
	ReadySeconds  float64 `json:"readySeconds"`  // first create → last Ready
	P50           float64 `json:"p50Seconds"`    // each volume's create → Ready
	P95           float64 `json:"p95Seconds"`
	Formation     Writes  `json:"formation"`
	// FormationCPU is the CPU time each part used during formation, in seconds:
	// the work formation cost, less dependent on the machine's load than its time.
	FormationCPU CPU `json:"formationCPUSeconds"`

	IdleSeconds float64 `json:"idleSeconds"`
	Idle        Writes  `json:"idle"`
	IdleCPU     CPU     `json:"idleCPU"`
	Memory      Memory  `json:"memory"`

	// Restart is the controller stopped and started again with every volume
	// formed and idle.
	Restart Restart `json:"restart"`

	// Held: the volumes were left in place at the end (-hold), so there are
	// no delete figures.
	Held          bool    `json:"held,omitempty"`
	DeleteSeconds float64 `json:"deleteSeconds"`
	Delete        Writes  `json:"delete"`
	// DeleteCPU is the CPU time each part used during the deletion, in seconds.
	DeleteCPU CPU `json:"deleteCPUSeconds"`
	// Whole is the run from the first create to the last volume gone: the
	// audit log and the processes' counters must agree on it.
	Whole Writes `json:"whole"`

	// Backing is what backs each replica: "plain files" (the pools' volumes
	// are their files) or "loop devices" (a loop device over each file, as
	// `meshvol node` runs the file pool); runs before it was recorded used
	// loop devices.
	Backing string `json:"backing,omitempty"`

	// AgentProcesses: each agent ran as a `meshvol node` process of its own
	// (-agent-processes); the agents+sim figures are then the agents'
	// processes and the simulator's together, and Memory.Agents each agent's.
	AgentProcesses bool `json:"agentProcesses,omitempty"`

	// ControllerArgs are the flags the run gave `meshvol controller` besides
	// the benchmark's own (kubeconfig, addresses, no leader election).
	ControllerArgs string `json:"controllerArgs,omitempty"`
	// ControllerMemoryLimit is the memory cgroup's limit the controller ran
	// in (-controller-memory-limit), and ControllerOOMKills how many times the
	// kernel killed it for going over it.
	ControllerMemoryLimit string `json:"controllerMemoryLimit,omitempty"`
	ControllerOOMKills    string `json:"controllerOOMKills,omitempty"`

	Error string `json:"error,omitempty"`
}

// Restart is a controller restart with every volume formed: from the new
// process's start to its caches synced (/readyz) and to every volume
// reconciled once, and what happened from the stop until restartSettle after
// that pass.
type Restart struct {
	SyncedSeconds float64 `json:"syncedSeconds"`
	PassSeconds   float64 `json:"passSeconds"`
	Writes        Writes  `json:"writes"`
	// RVUpdates are the RV updates the benchmark's watch saw, LeftReady the
	// times a Ready volume was seen otherwise (status flapping).
	RVUpdates int `json:"rvUpdates"`
	LeftReady int `json:"leftReady"`
}

// Writes are the apiserver writes of a period.
type Writes struct {
	// Per volume, from the audit log, Lease renewals left out.
	PerVolume           float64 `json:"perVolume"`
	ControllerPerVolume float64 `json:"controllerPerVolume"`
	AgentsPerVolume     float64 `json:"agentsPerVolume"`
	// Totals: the audit log's, Lease renewals included.
	AuditController int `json:"auditController"`
	AuditAgents     int `json:"auditAgents"`
	Leases          int `json:"leases"`
	// Totals: the processes' own counts. ControllerHTTP is every non-GET
	// request of the controller's client-go (rest_client_requests_total),
	// ControllerReconciler the writes its reconcilers made and the apiserver
	// accepted (meshvol_controller_writes_total; Events are not among them),
	// AgentsHTTP localcluster's count at the agents' HTTP transport (Lease
	// renewals left out).
	ControllerHTTP       int  `json:"controllerHTTP"`
	ControllerReconciler int  `json:"controllerReconciler"`
	AgentsHTTP           int  `json:"agentsHTTP"`
	Agree                bool `json:"agree"`
	// VolumeReconciles is how many times the controller reconciled a volume.
	VolumeReconciles int `json:"volumeReconciles"`
	// The audit log's writes by component, verb and resource.
	ByResource map[string]int `json:"byResource,omitempty"`
}

// CPU is the percentage of one core each part used (or, for FormationCPU, seconds).
type CPU struct {
	Controller float64 `json:"controller"`
	Agents     float64 `json:"agents"` // the benchmark process: agents, drbdsim, the load's watch
	APIServer  float64 `json:"apiserver"`
}

// Memory is resident memory in bytes.
type Memory struct {
	ControllerRSS  int64 `json:"controllerRSS"`
	ControllerPeak int64 `json:"controllerPeak"`
	AgentsRSS      int64 `json:"agentsRSS"`
	AgentsPeak     int64 `json:"agentsPeak"`
	APIServerRSS   int64 `json:"apiserverRSS"`
	// Agents is each agent's process (-agent-processes); AgentsRSS is then
	// the benchmark's process, the simulator's.
	Agents []AgentMemory `json:"agents,omitempty"`
}

func main() {
	var (
		ns         = flag.String("n", "100,500,1000,2000", "volume counts, comma separated")
		cls        = flag.String("classes", "1D,3D", "classes, comma separated (1D, 3D)")
		label      = flag.String("label", "current", "the series these runs belong to (e.g. before, after)")
		out        = flag.String("out", "docs/scale", "directory of results.json, results.md and the plots")
		logDir     = flag.String("logs", "_output/bench-scale", "directory of the controller's logs and the CPU profiles")
		meshvol    = flag.String("meshvol", "bin/meshvol", "the meshvol binary run as the controller")
		idle       = flag.Duration("idle", time.Minute, "the idle period measured after formation")
		timeout    = flag.Duration("timeout", 10*time.Minute, "how long formation (and again deletion) may take")
		par        = flag.Int("parallel", 16, "concurrent creates and deletes")
		extra      = flag.String("controller-args", "", "more `meshvol controller` flags, space separated")
		plotOnly   = flag.Bool("plot", false, "only render results.md and the plots from results.json")
		hold       = flag.Bool("hold", false, "leave the volumes at the end instead of deleting them (no delete figures): what holding N volumes costs, in less time")
		plotLabels = flag.String("plot-labels", "", "plot only the runs whose label starts with one of these, comma separated (results.md keeps every run)")
		agentProcs = flag.Bool("agent-processes", false, "run each node's agent as a `meshvol node` process of its own (-meshvol), with its production DRBD driver through the drbd-utils stand-ins (internal/drbdsimd) and its production file pool (loop devices), so that one agent's memory and CPU are its own")
		memLimit   = flag.String("controller-memory-limit", "", "run the controller in a memory cgroup of this size (e.g. 512Mi, the chart's limit), as in its container (root)")
		loops      = flag.Bool("loop-devices", false, "back each replica with a loop device over its file, as `meshvol node` does, instead of the file itself (one machine holds far fewer loop devices than files)")
	)
	flag.Parse()
	// The agents run in this process and log through controller-runtime;
	// their logs are not the benchmark's output.
	ctrllog.SetLogger(logr.Discard())
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fail(err)
	}
	resultsPath := filepath.Join(*out, "results.json")
	results, err := load(resultsPath)
	if err != nil {
		fail(err)
	}
	if !*plotOnly {
		if os.Geteuid() != 0 {
			fail(errors.New("the cluster's file pools need loop devices and a tmpfs: run as root"))
		}
		if err := os.MkdirAll(*logDir, 0o755); err != nil {
			fail(err)
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		commit := gitCommit()
		var memBytes int64
		if *memLimit != "" {
			q, err := resource.ParseQuantity(*memLimit)
			if err != nil || q.Value() <= 0 {
				fail(fmt.Errorf("-controller-memory-limit: %q is not a positive quantity (e.g. 512Mi)", *memLimit))
			}
			memBytes = q.Value()
		}
		for _, c := range strings.Split(*cls, ",") {
			if _, ok := classes[c]; !ok {
				fail(fmt.Errorf("-classes: unknown class %q (1D, 3D)", c))
			}
			for _, s := range strings.Split(*ns, ",") {
				n, err := strconv.Atoi(s)
				if err != nil || n <= 0 {
					fail(fmt.Errorf("-n: %q is not a positive number", s))
				}
				fmt.Fprintf(os.Stderr, "bench-scale: %s N=%d (load %s)\n", c, n, loadAvg())
				r, err := run(ctx, runConfig{Class: c, N: n, Meshvol: *meshvol, Idle: *idle, Timeout: *timeout,
					Parallel: *par, LogDir: *logDir, ExtraArgs: strings.Fields(*extra), LoopDevices: *loops, Hold: *hold, AgentProcesses: *agentProcs,
					ControllerMemoryLimit: memBytes, ControllerMemoryLimitText: *memLimit})
				r.Label, r.Commit = *label, commit
				if err != nil {
					r.Error = joinMsg(r.Error, err.Error())
				}
				fmt.Fprintf(os.Stderr, "bench-scale: %s\n", summary(r))
				results = merge(results, r)
				if err := save(resultsPath, results); err != nil {
					fail(err)
				}
				if ctx.Err() != nil {
					fail(ctx.Err())
				}
			}
		}
	}
	if err := render(*out, results, strings.Split(*plotLabels, ",")); err != nil {
		fail(err)
	}
}

func summary(r Result) string {
	s := fmt.Sprintf("%s %s N=%d: %d Ready, all in %.1f s, p95 %.1f s, CPU s controller %.1f agents+sim %.1f apiserver %.1f, %.1f writes/volume (controller %.1f, agents %.1f; counters agree over the run: %v), delete %.1f s %.1f writes/volume (CPU s controller %.1f agents+sim %.1f apiserver %.1f), idle CPU controller %.1f %% agents %.1f %%, RSS controller %d MB agents %d MB",
		r.Label, r.Class, r.N, r.Ready, r.ReadySeconds, r.P95, r.FormationCPU.Controller, r.FormationCPU.Agents, r.FormationCPU.APIServer, r.Formation.PerVolume, r.Formation.ControllerPerVolume, r.Formation.AgentsPerVolume,
		r.Whole.Agree, r.DeleteSeconds, r.Delete.PerVolume, r.DeleteCPU.Controller, r.DeleteCPU.Agents, r.DeleteCPU.APIServer, r.IdleCPU.Controller, r.IdleCPU.Agents, r.Memory.ControllerRSS>>20, r.Memory.AgentsRSS>>20)
	if r.Held {
		s = strings.Replace(s, fmt.Sprintf(", delete %.1f s %.1f writes/volume (CPU s controller %.1f agents+sim %.1f apiserver %.1f)", r.DeleteSeconds, r.Delete.PerVolume, r.DeleteCPU.Controller, r.DeleteCPU.Agents, r.DeleteCPU.APIServer), ", held (not deleted)", 1)
	}
	rs := r.Restart
	s += fmt.Sprintf(", controller restart: caches synced in %.1f s, every volume reconciled in %.1f s, %d writes besides Leases, %d RV updates, %d left Ready",
		rs.SyncedSeconds, rs.PassSeconds, rs.Writes.AuditController+rs.Writes.AuditAgents-rs.Writes.Leases, rs.RVUpdates, rs.LeftReady)
	s += agentsSummary(r)
	if r.Error != "" {
		s += "; " + r.Error
	}
	return s
}

func load(path string) ([]Result, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rs []Result
	if err := json.Unmarshal(data, &rs); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rs, nil
}

func save(path string, rs []Result) error {
	data, err := json.MarshalIndent(rs, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// merge replaces the run of the same label, class and N, or adds r.
func merge(rs []Result, r Result) []Result {
	for i := range rs {
		if rs[i].Label == r.Label && rs[i].Class == r.Class && rs[i].N == r.N {
			rs[i] = r
			return rs
		}
	}
	return append(rs, r)
}

func gitCommit() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench-scale:", err)
	os.Exit(1)
}
