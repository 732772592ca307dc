package kubecluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshvol/meshvol/internal/mountinfo"
)

// What a cluster touches outside its own directory, and how it leaves the
// machine as it found it.
//
// Some of the host is shared by every kubelet and containerd whatever their
// configuration: the kubelet's device plugin socket
// (/var/lib/kubelet/device-plugins/kubelet.sock), its legacy log links in
// /var/log/containers, the runc shims' sockets in /run/containerd/s and runc's
// state in /run/containerd/runc, network namespaces in /run/netns, the kernel
// settings the kubelet enforces (vm.overcommit_memory, kernel.panic, ...) and
// the cgroup hierarchies. Two clusters on one machine would fight over these,
// so one cluster runs at a time (hostLock), and the host's state before the
// cluster started is saved in hostStateDir: a cluster whose process was
// killed is cleaned up by the next one from that record.

// hostStateDir holds the machine-wide lock and the saved host state.
const hostStateDir = "/run/meshvol-kubecluster"

// cgroupParent is the cgroup (in every hierarchy) under which each node has
// its own: /meshvol-kubecluster/<node>, the node's kubelet cgroupRoot.
const cgroupParent = "meshvol-kubecluster"

// The kernel settings the kubelet sets at start (its
// setupKernelTunables), restored at teardown.
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// Host paths the kubelet or containerd create whatever they are told.
var sharedPaths = []string{
	"/var/lib/kubelet/device-plugins/kubelet.sock",
	"/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint",
	"/var/lib/kubelet/device-plugins",
	"/var/lib/kubelet",
	// The mount point of the nodes' own /var/lib/meshvol (netns.go).
	"/var/lib/meshvol",
	"/var/log/containers",
	"/run/containerd/s",
	"/run/containerd/runc/k8s.io",
	"/run/containerd/runc",
	"/run/containerd",
	"/run/netns",
}

// hostState is what the machine looked like before the cluster started.
type hostState struct {
	Dir     string            // the cluster's directory
	PID     int               // the process that started it
	Sysctls map[string]string // path under /proc/sys → value
	Existed map[string]bool   // sharedPaths that existed
	// Entries of the shared directories before the start: only new ones
	// are the cluster's.
	Entries map[string][]string
	// Links are the machine's network interfaces before the start. The
	// nodes' loopback-only CNI adds none; a new CNI bridge or veth would
	// be the cluster's and is reported as left behind.
	Links []string
	// Bridge says the cluster created the nodes' bridge (netns.go).
	Bridge bool
}

// lockPoll is how often hostLock tries the lock again while it waits.
const lockPoll = 500 * time.Millisecond

var sharedDirs = []string{"/run/containerd/s", "/run/containerd/runc/k8s.io", "/run/netns", "/var/log/containers"}

// hostLock takes the machine-wide lock. With wait false it fails at once
// when another cluster holds it, naming that cluster's process; with wait
// true it tries again every lockPoll until ctx ends (a blocking flock would
// outlive a Ctrl-C).
func hostLock(ctx context.Context, wait bool, log func(string, ...any)) (*os.File, error) {
	if err := os.MkdirAll(hostStateDir, 0o755); err != nil {
		return nil, fmt.Errorf("kubecluster: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(hostStateDir, "lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("kubecluster: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(f.Name())
		if !wait {
			f.Close()
			return nil, fmt.Errorf("%w: held by %s (lock %s)", ErrBusy, strings.TrimSpace(string(holder)), f.Name())
		}
		log("waiting for the cluster of %s to end (machine-wide lock %s)", strings.TrimSpace(string(holder)), f.Name())
		for {
			err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			if err == nil {
				break
			}
			if !errors.Is(err, unix.EWOULDBLOCK) {
				f.Close()
				return nil, fmt.Errorf("kubecluster: lock %s: %w", f.Name(), err)
			}
			select {
			case <-ctx.Done():
				f.Close()
				return nil, fmt.Errorf("kubecluster: waiting for the machine-wide lock %s: %w", f.Name(), ctx.Err())
			case <-time.After(lockPoll):
			}
		}
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(fmt.Sprintf("pid %d (%s), since %s\n", os.Getpid(), filepath.Base(os.Args[0]), time.Now().Format(time.RFC3339))), 0)
	return f, nil
}

// ErrBusy is returned by Start when another cluster runs on this machine.
var ErrBusy = errors.New("another meshvol Kubernetes cluster (sandbox or e2e suite) is running on this machine")

func statePath() string { return filepath.Join(hostStateDir, "state.json") }

func captureHostState(dir string) (*hostState, error) {
	st := &hostState{Dir: dir, PID: os.Getpid(), Sysctls: map[string]string{}, Existed: map[string]bool{}, Entries: map[string][]string{}}
	for _, k := range kubeletSysctls {
		b, err := os.ReadFile(filepath.Join("/proc/sys", k))
		if err != nil {
			return nil, fmt.Errorf("kubecluster: reading the kernel setting %s: %w", k, err)
		}
		st.Sysctls[k] = strings.TrimSpace(string(b))
	}
	for _, p := range sharedPaths {
		_, err := os.Lstat(p)
		st.Existed[p] = err == nil
	}
	for _, d := range sharedDirs {
		st.Entries[d] = listDir(d)
	}
	st.Links = linkNames()
	return st, saveHostState(st)
}

func saveHostState(st *hostState) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(statePath(), b, 0o644); err != nil {
		return fmt.Errorf("kubecluster: saving the host state: %w", err)
	}
	return nil
}

func loadHostState() (*hostState, error) {
	b, err := os.ReadFile(statePath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var st hostState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("kubecluster: %s: %w", statePath(), err)
	}
	return &st, nil
}

func listDir(d string) []string {
	ents, _ := os.ReadDir(d)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// podNetnsPrefix begins the name of every network namespace containerd's CRI
// plugin makes for a pod ("cni-" and random hex, its pkg/netns).
const podNetnsPrefix = "cni-"

// podNetns lists the network namespaces in d (/run/netns) that the
// cluster's pods made: the new ones containerd named. Other programs on the
// machine make theirs there too while a cluster runs (test/vm's qemu guests,
// `ip netns add`), and those are not the cluster's to remove.
func podNetns(d string, before []string) []string {
	var pods []string
	for _, n := range newEntries(d, before) {
		if strings.HasPrefix(n, podNetnsPrefix) {
			pods = append(pods, n)
		}
	}
	return pods
}

func newEntries(d string, before []string) []string {
	old := map[string]bool{}
	for _, n := range before {
		old[n] = true
	}
	var added []string
	for _, n := range listDir(d) {
		if !old[n] {
			added = append(added, n)
		}
	}
	return added
}

// cleanHost puts the machine back as st recorded it: every process in the
// cluster's cgroups killed, every mount under its directory unmounted, the
// shared host paths it created removed, the kernel settings restored, its
// cgroups removed. It is what Stop does after stopping the components, and
// what Start does first when a killed cluster left a record behind. It goes
// on after an error and returns them all.
func cleanHost(st *hostState) error {
	var errs []error
	if err := killCgroupTree(cgroupParent); err != nil {
		errs = append(errs, err)
	}
	// Components outside the nodes' cgroups outlive a cluster whose process
	// was killed: the control plane (envtest starts it without a parent-
	// death signal) and the sidecars. They name the cluster's directory.
	if err := killProcessesWithRoot(st.Dir); err != nil {
		errs = append(errs, err)
	}
	if err := unmountUnder(st.Dir); err != nil {
		errs = append(errs, err)
	}
	if st.Bridge {
		// A dead node's network namespace goes asynchronously, and its
		// link with it: delete the links now (either end takes both).
		for _, l := range linkNames() {
			if strings.HasPrefix(l, vethPrefix) {
				_, _ = execOutput("ip", "link", "del", l)
			}
		}
		errs = appendErr(errs, deleteBridge())
	}
	// Sockets of shims that were killed: a live shim (another containerd's)
	// still accepts connections and is left alone.
	for _, n := range newEntries("/run/containerd/s", st.Entries["/run/containerd/s"]) {
		p := filepath.Join("/run/containerd/s", n)
		if c, err := net.DialTimeout("unix", p, time.Second); err == nil {
			c.Close()
			continue
		}
		errs = appendErr(errs, os.Remove(p))
	}
	// runc's state of the containers the cluster ran: only those whose
	// process is gone.
	for _, n := range newEntries("/run/containerd/runc/k8s.io", st.Entries["/run/containerd/runc/k8s.io"]) {
		p := filepath.Join("/run/containerd/runc/k8s.io", n)
		if runcAlive(p) {
			continue
		}
		errs = appendErr(errs, os.RemoveAll(p))
	}
	for _, n := range podNetns("/run/netns", st.Entries["/run/netns"]) {
		p := filepath.Join("/run/netns", n)
		_ = unix.Unmount(p, unix.MNT_DETACH)
		errs = appendErr(errs, os.Remove(p))
	}
	for _, n := range newEntries("/var/log/containers", st.Entries["/var/log/containers"]) {
		p := filepath.Join("/var/log/containers", n)
		if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, st.Dir+"/") {
			errs = appendErr(errs, os.Remove(p))
		}
	}
	// The shared paths the cluster created, files first, then directories
	// if they are empty (something else may have put files there since).
	for _, p := range sharedPaths {
		if st.Existed[p] {
			continue
		}
		fi, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if fi.IsDir() {
			if err := os.Remove(p); err != nil && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		errs = appendErr(errs, os.Remove(p))
	}
	for k, v := range st.Sysctls {
		p := filepath.Join("/proc/sys", k)
		if cur, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(cur)) == v {
			continue
		}
		errs = appendErr(errs, os.WriteFile(p, []byte(v), 0o644))
	}
	errs = appendErr(errs, removeCgroupTree(cgroupParent))
	return errors.Join(errs...)
}

func appendErr(errs []error, err error) []error {
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errs
}

// runcAlive says whether the init process runc recorded in a container's
// state directory still runs.
func runcAlive(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		return false
	}
	var s struct {
		Pid int `json:"init_process_pid"`
	}
	if json.Unmarshal(b, &s) != nil || s.Pid <= 0 {
		return false
	}
	// Not kill(pid, 0): a container killed with its shim is a zombie until
	// init reaps it, and kill(2) still finds a zombie.
	return processAlive(s.Pid)
}

// leftovers lists what of the cluster is still on the machine after
// cleanHost: the check that teardown left nothing behind.
func leftovers(st *hostState) []string {
	var left []string
	for _, h := range cgroupHierarchies() {
		if _, err := os.Stat(filepath.Join(h, cgroupParent)); err == nil {
			left = append(left, "cgroup "+filepath.Join(h, cgroupParent))
		}
	}
	for _, m := range mountsUnder(st.Dir) {
		left = append(left, "mount "+m)
	}
	for _, d := range sharedDirs {
		for _, n := range newEntries(d, st.Entries[d]) {
			p := filepath.Join(d, n)
			switch d {
			case "/run/netns":
				if !strings.HasPrefix(n, podNetnsPrefix) {
					continue // another program's namespace
				}
			case "/run/containerd/s":
				if c, err := net.DialTimeout("unix", p, time.Second); err == nil {
					c.Close()
					continue // a live shim of another containerd
				}
			case "/run/containerd/runc/k8s.io":
				if runcAlive(p) {
					continue
				}
			case "/var/log/containers":
				if target, err := os.Readlink(p); err != nil || !strings.HasPrefix(target, st.Dir+"/") {
					continue
				}
			}
			left = append(left, "file "+p)
		}
	}
	for _, p := range sharedPaths {
		if _, err := os.Lstat(p); err == nil && !st.Existed[p] {
			left = append(left, "file "+p)
		}
	}
	for k, v := range st.Sysctls {
		if cur, err := os.ReadFile(filepath.Join("/proc/sys", k)); err == nil && strings.TrimSpace(string(cur)) != v {
			left = append(left, fmt.Sprintf("sysctl %s=%s (was %s)", strings.ReplaceAll(k, "/", "."), strings.TrimSpace(string(cur)), v))
		}
	}
	for _, pid := range processesWithRoot(st.Dir) {
		if !processAlive(pid) {
			continue
		}
		left = append(left, fmt.Sprintf("process %d (%s)", pid, procName(pid)))
	}
	before := map[string]bool{}
	for _, l := range st.Links {
		before[l] = true
	}
	for _, l := range linkNames() {
		// Only what CNI's bridge and ptp plugins would have made: other
		// work on the machine may add links of its own meanwhile.
		if !before[l] && (strings.HasPrefix(l, "cni") || strings.HasPrefix(l, "veth") || strings.HasPrefix(l, vethPrefix) || l == bridgeName) {
			left = append(left, "network interface "+l)
		}
	}
	if out, err := iptablesKubeChains(); err == nil && len(out) > 0 {
		left = append(left, "iptables chains "+strings.Join(out, " "))
	}
	sort.Strings(left)
	return left
}

// linkNames lists the machine's network interfaces (of this network
// namespace: the one the kubelets and host-network pods share).
func linkNames() []string {
	ifs, _ := net.Interfaces()
	var names []string
	for _, i := range ifs {
		names = append(names, i.Name)
	}
	return names
}

// processesWithRoot lists processes whose command line mentions dir: the
// cluster's components and their shims name their directories in their
// arguments.
func processesWithRoot(dir string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.Contains(string(b), dir+"/") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killProcessesWithRoot kills the processes whose command line mentions
// dir, and the etcd of a kube-apiserver among them (etcd's own arguments
// name only its data directory, elsewhere), and waits until they are gone.
func killProcessesWithRoot(dir string) error {
	var pids []int
	for _, pid := range processesWithRoot(dir) {
		// Only the cluster's own components: a person's `tail -f` of a
		// log in dir is not the cluster's to kill.
		if componentNames[procName(pid)] {
			pids = append(pids, pid)
		}
	}
	for _, pid := range pids {
		if url := argValue(pid, "--etcd-servers="); url != "" {
			pids = append(pids, processesWithArg("--listen-client-urls="+url)...)
		}
	}
	for _, pid := range pids {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for processAlive(pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("kubecluster: process %d (%s) survived SIGKILL for 10 s", pid, procName(pid))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// componentNames are the command names (comm, at most 15 bytes) of what a
// cluster runs outside its nodes' cgroups.
var componentNames = map[string]bool{
	"kube-apiserver": true, "etcd": true, "kube-controller": true, "kube-scheduler": true,
	"csi-provisioner": true, "csi-attacher": true, "kubelet": true, "containerd": true,
}

// processAlive says whether pid runs (a zombie, dead but not yet reaped by
// a parent that is not this process, does not).
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}

func cmdline(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// argValue is the value of the process's argument that starts with prefix.
func argValue(pid int, prefix string) string {
	for _, a := range cmdline(pid) {
		if v, ok := strings.CutPrefix(a, prefix); ok {
			return v
		}
	}
	return ""
}

// processesWithArg lists the processes with exactly that argument.
func processesWithArg(arg string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		for _, a := range cmdline(pid) {
			if a == arg {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

func procName(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// iptablesKubeChains lists KUBE-* chains in the filter, nat and mangle
// tables. The nodes run with makeIPTablesUtilChains off, so the kubelet
// creates none; a chain found here is a regression worth a loud test
// failure, since it would change the host's firewall.
func iptablesKubeChains() ([]string, error) {
	var chains []string
	for _, table := range []string{"filter", "nat", "mangle"} {
		out, err := execOutput("iptables", "-w", "-t", table, "-S")
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "-N" && strings.HasPrefix(f[1], "KUBE-") {
				chains = append(chains, table+"/"+f[1])
			}
		}
	}
	return chains, nil
}

// cgroupHierarchies lists the mount points of the cgroup (v1) and cgroup2
// hierarchies.
func cgroupHierarchies() []string {
	ms, _ := mountinfo.Read()
	var hs []string
	for _, m := range ms {
		if m.FsType == "cgroup" || m.FsType == "cgroup2" {
			hs = append(hs, m.MountPoint)
		}
	}
	return hs
}

// makeCgroup creates path (relative to each hierarchy's root) in every
// hierarchy, with cpuset's cpus and mems copied from the parent (a new
// cpuset cgroup has none, and no process could run in it).
func makeCgroup(path string) error {
	for _, h := range cgroupHierarchies() {
		dir := h
		for _, elem := range strings.Split(path, "/") {
			parent := dir
			dir = filepath.Join(dir, elem)
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return fmt.Errorf("kubecluster: creating cgroup %s: %w", dir, err)
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
					continue
				}
				if cur, _ := os.ReadFile(filepath.Join(dir, f)); len(strings.TrimSpace(string(cur))) > 0 {
					continue
				}
				v, err := os.ReadFile(filepath.Join(parent, f))
				if err != nil {
					return fmt.Errorf("kubecluster: %w", err)
				}
				if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
					return fmt.Errorf("kubecluster: %s: %w", filepath.Join(dir, f), err)
				}
			}
		}
	}
	return nil
}

// cgroupProcsFiles are the cgroup.procs files of path in every hierarchy,
// for a process to write its own PID to before it execs a component.
func cgroupProcsFiles(path string) []string {
	var fs []string
	for _, h := range cgroupHierarchies() {
		fs = append(fs, filepath.Join(h, path, "cgroup.procs"))
	}
	return fs
}

// killCgroupTree kills every process in path and below, at once, and waits
// until they are gone. The unified hierarchy's cgroup.kill does it
// atomically (no process can fork away meanwhile); without it, the
// processes are killed until none is left.
func killCgroupTree(path string) error {
	hs := cgroupHierarchies()
	for _, h := range hs {
		kill := filepath.Join(h, path, "cgroup.kill")
		if _, err := os.Stat(kill); err == nil {
			if err := os.WriteFile(kill, []byte("1"), 0o644); err != nil {
				return fmt.Errorf("kubecluster: %s: %w", kill, err)
			}
			break
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids := cgroupTreePIDs(path)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kubecluster: processes %v in cgroup %s survived SIGKILL for 30 s", pids, path)
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cgroupTreePIDs lists the processes in path and below, in any hierarchy.
func cgroupTreePIDs(path string) []int {
	seen := map[int]bool{}
	for _, h := range cgroupHierarchies() {
		root := filepath.Join(h, path)
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			if err != nil {
				return nil
			}
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					seen[pid] = true
				}
			}
			return nil
		})
	}
	pids := make([]int, 0, len(seen))
	for pid := range seen {
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	return pids
}

// removeCgroupTree removes path and every cgroup below it, deepest first,
// in every hierarchy. The cgroups must be empty of processes.
func removeCgroupTree(path string) error {
	var errs []error
	for _, h := range cgroupHierarchies() {
		root := filepath.Join(h, path)
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			// A cgroup whose last process just died may be busy a moment.
			var err error
			for try := 0; try < 50; try++ {
				if err = unix.Rmdir(dirs[i]); err == nil || errors.Is(err, unix.ENOENT) {
					err = nil
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("kubecluster: removing cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// mountsUnder lists the mount points under dir, deepest first.
func mountsUnder(dir string) []string {
	all, _ := mountinfo.Read()
	ms := mountinfo.Under(all, dir)
	sort.Slice(ms, func(i, j int) bool { return len(ms[i]) > len(ms[j]) })
	return ms
}

// unmountUnder detaches every mount under dir, deepest first, until none is
// left (one mount point can be stacked several times).
func unmountUnder(dir string) error {
	for try := 0; try < 10; try++ {
		ms := mountsUnder(dir)
		if len(ms) == 0 {
			return nil
		}
		for _, m := range ms {
			_ = unix.Unmount(m, unix.MNT_DETACH)
		}
	}
	if ms := mountsUnder(dir); len(ms) > 0 {
		return fmt.Errorf("kubecluster: could not unmount %v", ms)
	}
	return nil
}
