package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshvol/meshvol/internal/drbdsimd"
	"github.com/meshvol/meshvol/internal/localcluster"
	"github.com/meshvol/meshvol/internal/testenv"
	"github.com/meshvol/meshvol/pkg/storage/file"
)

// The agents as processes of their own (-agent-processes): each node's agent
// is the production `meshvol node` (the binary `make build` makes), with its
// production ExecDriver running drbdadm, drbdsetup and drbdmeta — the
// drbd-utils stand-ins of internal/drbdsimd, which reach the node's
// simulated kernel through a socket — and its production file pool, a loop
// device over each backing file. drbdsim (internal/drbdsimd's service) stays
// in the benchmark's process, as it is the machine's kernel in the sandbox
// (internal/sandbox), so each agent's resident memory, heap and CPU time are
// its own: what one node's agent costs, which the in-process agents, three in
// one process with the simulator, cannot show (docs/scale.md, "One agent on
// its own").
//
// Each agent runs in a mount namespace of its own, as a node pod has:
// /var/lib/meshvol is the node's own directory (the File pool's directory is
// the same path on every node), and /sys/module lists the DRBD module and its
// TCP transport so that the agent's prerequisite check passes, as the
// sandbox's nodes do.

// agentUser is the agents' user in the audit log (anything but the
// controller's and the load's counts as the agents').
const agentUser = "meshvol-agent"

// nodeStateDir is the directory every node's File pools live under (see
// localcluster.CreatePool) and that each agent's mount namespace gives the
// node's own.
const nodeStateDir = "/var/lib/meshvol"

type agentProc struct {
	node        *localcluster.Node
	cmd         *exec.Cmd
	metricsAddr string
	pprofAddr   string
	done        chan error
}

// agentProcs are the three nodes' agent processes and the service of their
// simulated kernels.
type agentProcs struct {
	lc    *localcluster.Cluster
	simd  *drbdsimd.Service
	procs []*agentProc
	// madeStateDir: the benchmark made nodeStateDir (the agents' mount
	// point) and removes it at the end.
	madeStateDir bool
}

// startAgents builds the drbd-utils stand-ins, serves each node's simulated
// kernel on a socket and starts `meshvol node` for each node of lc (started
// with localcluster.Options.ExternalAgents).
func startAgents(ctx context.Context, env *testenv.Env, lc *localcluster.Cluster, bin, dir, logDir, tag string) (a *agentProcs, err error) {
	a = &agentProcs{lc: lc, simd: drbdsimd.New(lc.Sim)}
	defer func() {
		if err != nil {
			a.stop()
			a = nil
		}
	}()
	if _, err := os.Stat(nodeStateDir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(nodeStateDir, 0o755); err != nil {
			return a, err
		}
		a.madeStateDir = true
	}
	root, err := repoRoot()
	if err != nil {
		return a, err
	}
	standIns, err := drbdsimd.BuildStandIns(ctx, root, dir)
	if err != nil {
		return a, err
	}
	kc, err := env.KubeConfig(agentUser, "system:masters")
	if err != nil {
		return a, err
	}
	kcPath := filepath.Join(dir, "agent.kubeconfig")
	if err := os.WriteFile(kcPath, kc, 0o600); err != nil {
		return a, err
	}
	bin, err = filepath.Abs(bin)
	if err != nil {
		return a, err
	}
	for _, n := range lc.Nodes {
		p, err := a.startOne(n, bin, standIns, kcPath, dir, filepath.Join(logDir, "agent-"+tag+"-"+n.Name+".log"))
		if err != nil {
			return a, fmt.Errorf("agent %s: %w", n.Name, err)
		}
		a.procs = append(a.procs, p)
	}
	return a, nil
}

// namespaceScript prepares an agent's mount namespace (unshare's private
// one) and executes the agent: $1 is the node's state directory, the rest the
// agent's command line.
const namespaceScript = `set -e
mount --bind "$1" ` + nodeStateDir + `
mount -t tmpfs -o mode=0755 drbdsim-modules /sys/module
mkdir -p /sys/module/drbd /sys/module/drbd_transport_tcp
echo 9.2.18 > /sys/module/drbd/version
shift
exec "$@"`

func (a *agentProcs) startOne(n *localcluster.Node, bin, standIns, kubeconfig, dir, logPath string) (*agentProc, error) {
	own := filepath.Join(dir, "agent-"+n.Name)
	tools := filepath.Join(own, "bin")
	state := filepath.Join(n.Root, nodeStateDir)
	for _, d := range []string{tools, state, filepath.Join(own, "drbd.d")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	for _, prog := range []string{"drbdadm", "drbdsetup", "drbdmeta"} {
		if err := os.Symlink(standIns, filepath.Join(tools, prog)); err != nil {
			return nil, err
		}
	}
	sock := filepath.Join(own, "drbdsim.sock")
	if err := a.simd.Listen(n.Name, sock); err != nil {
		return nil, err
	}
	var addrs [2]string
	for i := range addrs {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		addrs[i] = addr
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	args := []string{"--mount", "--propagation", "private", "--", "sh", "-c", namespaceScript, "sh", state,
		bin, "node", "--node-name", n.Name, "--address", n.Address.String(), "--kubeconfig", kubeconfig,
		"--drbd-conf-dir", filepath.Join(own, "drbd.d"), "--metrics-bind-address", addrs[0], "--pprof-bind-address", addrs[1]}
	cmd := exec.Command("unshare", args...)
	cmd.Env = append(os.Environ(), "PATH="+tools+":"+os.Getenv("PATH"), "DRBDSIM_SOCKET="+sock)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &agentProc{node: n, cmd: cmd, metricsAddr: addrs[0], pprofAddr: addrs[1], done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait(); logf.Close() }()
	return p, nil
}

// pids are the agents' processes (unshare and sh exec the agent, so the
// started process is the agent).
func (a *agentProcs) pids() []int {
	var out []int
	for _, p := range a.procs {
		out = append(out, p.cmd.Process.Pid)
	}
	return out
}

// cpu is the CPU time the agents used, with their children's (the
// stand-ins each DRBD command runs, which the agent waits for).
func (a *agentProcs) cpu() time.Duration {
	var sum time.Duration
	for _, pid := range a.pids() {
		d, _ := procCPUWithChildren(pid)
		sum += d
	}
	return sum
}

// writes is every non-GET request the agents' client-go made
// (rest_client_requests_total on each agent's metrics), Lease renewals
// included: the processes' own count of their writes.
func (a *agentProcs) writes(ctx context.Context) (int, error) {
	sum := 0
	for _, p := range a.procs {
		m, err := scrape(ctx, p.metricsAddr)
		if err != nil {
			return 0, fmt.Errorf("agent %s metrics: %w", p.node.Name, err)
		}
		sum += int(m.writes)
	}
	return sum, nil
}

// memory is each agent's resident memory and Go heap now, and writes each
// one's heap profile (after a collection: what is live) to
// profile-TAG-heap-agent-NODE.pprof in logDir.
func (a *agentProcs) memory(ctx context.Context, logDir, tag string) []AgentMemory {
	var out []AgentMemory
	for _, p := range a.procs {
		m := AgentMemory{Node: p.node.Name}
		m.RSS, m.Peak, _ = procMem(p.cmd.Process.Pid)
		if s, err := scrape(ctx, p.metricsAddr); err == nil {
			m.HeapInuse, m.HeapAlloc, m.GoSys = s.heapInuse, s.heapAlloc, s.sys
		}
		if rs, err := p.node.Resources(ctx); err == nil {
			m.Resources = len(rs)
		}
		(&profiler{}).fetch(ctx, http.DefaultClient, "http://"+p.pprofAddr, "heap?gc=1",
			filepath.Join(logDir, "profile-"+tag+"-heap-agent-"+p.node.Name+".pprof"))
		out = append(out, m)
	}
	return out
}

// stop ends the agents (SIGTERM, SIGKILL after 30 s), then takes every node's
// simulated DRBD down and deletes what the agents' pools hold, detaching their
// loop devices, so that the cluster's Stop finds nothing left.
func (a *agentProcs) stop() error {
	var errs []error
	for _, p := range a.procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range a.procs {
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
			errs = append(errs, fmt.Errorf("agent %s did not stop within 30 s of SIGTERM: killed", p.node.Name))
		}
	}
	a.simd.Close()
	for _, n := range a.lc.Nodes {
		// A crash closes every backing device the simulator holds; the
		// pools can then detach their loop devices.
		n.Sim.Crash()
		dirs, _ := filepath.Glob(filepath.Join(n.Root, nodeStateDir, "*"))
		for _, d := range dirs {
			if st, err := os.Stat(d); err != nil || !st.IsDir() {
				continue
			}
			if err := deletePool(d); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", n.Name, err))
			}
		}
	}
	if a.madeStateDir {
		_ = os.Remove(nodeStateDir)
	}
	return errors.Join(errs...)
}

// deletePool deletes every volume of the file pool in dir, detaching its
// loop device (the pool finds each by the file's device and inode, whatever
// path the agent's namespace attached it by).
func deletePool(dir string) error {
	p, err := file.New(context.Background(), dir)
	if err != nil {
		return err
	}
	vols, err := p.List(context.Background())
	if err != nil {
		return err
	}
	var errs []error
	for _, v := range vols {
		if err := p.Delete(context.Background(), v.Replica); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// loopsOver counts the loop devices bound to a regular file under dir, by
// the file's device and inode: an agent attached them through the bind mount
// of its namespace, so the path sysfs shows is not under dir.
func loopsOver(dir string) int {
	type key struct{ dev, ino uint64 }
	files := map[key]bool{}
	_ = filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil || !info.Mode().IsRegular() {
			return nil
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			files[key{st.Dev, st.Ino}] = true
		}
		return nil
	})
	if len(files) == 0 {
		return 0
	}
	n := 0
	devs, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range devs {
		name := filepath.Base(filepath.Dir(filepath.Dir(f)))
		fd, err := unix.Open("/dev/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		info, err := unix.IoctlLoopGetStatus64(fd)
		unix.Close(fd)
		if err == nil && files[key{info.Device, info.Inode}] {
			n++
		}
	}
	return n
}

// procCPUWithChildren is procCPU with the CPU time of the process's waited-for
// children (cutime and cstime, the 16th and 17th fields of /proc/PID/stat).
func procCPUWithChildren(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(data)
	rest := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(rest) < 15 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the name, want at least 15", pid, len(rest))
	}
	var ticks int64
	for _, f := range rest[11:15] {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %q", pid, f)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// repoRoot is the repository's top directory (the stand-ins are built from it).
func repoRoot() (string, error) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("the repository's root (git rev-parse): %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// AgentMemory is one agent process's memory after the idle period.
type AgentMemory struct {
	Node string `json:"node"`
	// Resources is how many DRBD resources the node's kernel ran: the agent's
	// replicas.
	Resources int   `json:"resources"`
	RSS       int64 `json:"rss"`
	Peak      int64 `json:"peak"`
	// The Go runtime's own figures (go_memstats_* on the agent's metrics):
	// the heap's spans in use, the live and not yet collected objects, and
	// everything the runtime took from the system.
	HeapInuse int64 `json:"heapInuse"`
	HeapAlloc int64 `json:"heapAlloc"`
	GoSys     int64 `json:"goSys"`
}

// agentMetrics are the figures read from an agent's metrics endpoint.
type agentMetrics struct {
	writes                    float64
	heapInuse, heapAlloc, sys int64
}

func scrape(ctx context.Context, addr string) (agentMetrics, error) {
	var m agentMetrics
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return m, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return m, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 || strings.HasPrefix(line, "#") {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		name := line[:sp]
		switch {
		case strings.HasPrefix(name, "rest_client_requests_total{") && !strings.Contains(name, `method="GET"`):
			m.writes += v
		case name == "go_memstats_heap_inuse_bytes":
			m.heapInuse = int64(v)
		case name == "go_memstats_heap_alloc_bytes":
			m.heapAlloc = int64(v)
		case name == "go_memstats_sys_bytes":
			m.sys = int64(v)
		}
	}
	return m, sc.Err()
}

// agentsSummary is the agents' processes' memory for the run's summary line.
func agentsSummary(r Result) string {
	if len(r.Memory.Agents) == 0 {
		return ""
	}
	var parts []string
	for _, m := range r.Memory.Agents {
		parts = append(parts, fmt.Sprintf("%s %d resources RSS %d MB (peak %d) heap in use %d MB", m.Node, m.Resources, m.RSS>>20, m.Peak>>20, m.HeapInuse>>20))
	}
	return ", agent processes: " + strings.Join(parts, "; ")
}

// renderAgents writes results.md's section of the runs whose agents were
// processes of their own.
func renderAgents(b *strings.Builder, rs []Result) {
	var runs []Result
	for _, r := range rs {
		if len(r.Memory.Agents) > 0 {
			runs = append(runs, r)
		}
	}
	if len(runs) == 0 {
		return
	}
	b.WriteString("\n## Each agent as a process of its own (-agent-processes)\n\n")
	b.WriteString("Each node's agent the production `meshvol node`, its DRBD driver running the drbd-utils stand-ins against the simulator (in the benchmark's process, whose RSS is the table's *agents+sim* column for these runs), its file pool on loop devices. After the idle period: each agent's resident memory (peak) and the Go runtime's heap in use, allocated (live and not yet collected) and memory from the system (its metrics), and the DRBD resources its node ran.\n\n")
	b.WriteString("| label | commit | class | N | load start → end | node | resources | RSS (peak) | heap in use | heap allocated (live and not yet collected) | Go sys | RSS per resource |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		for _, m := range r.Memory.Agents {
			per := "-"
			if m.Resources > 0 {
				per = fmt.Sprintf("%.1f KB", float64(m.RSS)/1024/float64(m.Resources))
			}
			fmt.Fprintf(b, "| %s | %s | %s | %d | %s → %s | %s | %d | %d (%d) MB | %d MB | %d MB | %d MB | %s |\n",
				r.Label, r.Commit, r.Class, r.N, r.LoadStart, r.LoadEnd, m.Node, m.Resources, m.RSS>>20, m.Peak>>20,
				m.HeapInuse>>20, m.HeapAlloc>>20, m.GoSys>>20, per)
		}
	}
}
