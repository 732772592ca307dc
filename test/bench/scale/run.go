package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/localcluster"
	"github.com/meshvol/meshvol/internal/testenv"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// classes are the layouts measured: failures to tolerate and guaranteed
// minimum data redundancy of the storage class.
var classes = map[string][2]int32{"1D": {0, 0}, "3D": {1, 1}}

// runConfig is one measurement: N volumes of a class on a fresh cluster.
type runConfig struct {
	Class     string
	N         int
	Meshvol   string        // the meshvol binary
	Idle      time.Duration // the steady period measured after formation
	Timeout   time.Duration // for formation, and again for deletion
	Parallel  int           // concurrent creates and deletes
	LogDir    string        // the controller's log and the profiles
	ExtraArgs []string      // more `meshvol controller` flags
	// LoopDevices backs each replica with a loop device over its file, as the
	// file pool of `meshvol node` does; without it the pools are of plain
	// files (localcluster.Options.PlainFiles), so that a run's replicas are
	// not bounded by the loop devices one machine can hold.
	LoopDevices bool
	// AgentProcesses runs each node's agent as `meshvol node` (Meshvol), a
	// process of its own, through the drbd-utils stand-ins (agents.go); its
	// pools are the production file pool's, loop devices.
	AgentProcesses bool
	// Hold leaves the volumes in place at the end instead of deleting them
	// and measuring the deletion: the cluster goes with them. It measures
	// what holding N volumes costs (formation, idle, memory, a restart) in
	// less time than a run with the deletion.
	Hold bool
	// ControllerMemoryLimit, when positive, runs the controller in a memory
	// cgroup of that many bytes (cgroup.go), as the chart's limit of its
	// container; ControllerMemoryLimitText is the quantity as given.
	ControllerMemoryLimit     int64
	ControllerMemoryLimitText string
}

// backing names the replicas' backing disks of a run, as the results show it.
func (c runConfig) backing() string {
	if c.LoopDevices || c.AgentProcesses {
		return backingLoop
	}
	return backingPlain
}

const (
	backingLoop  = "loop devices"
	backingPlain = "plain files"
)

// run measures one configuration. A run that does not reach all Ready still
// returns what it measured, with Error saying so.
func run(ctx context.Context, cfg runConfig) (res Result, err error) {
	res = Result{Class: cfg.Class, N: cfg.N, Date: time.Now().UTC().Format(time.RFC3339), LoadStart: loadAvg(), Backing: cfg.backing(),
		AgentProcesses: cfg.AgentProcesses}
	dir, err := os.MkdirTemp("", "meshvol-bench-scale-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	// A tmpfs of the run's own: the file pools report their file system's
	// free space, so on a shared disk every other process's writes would
	// change the pools' status and count as writes.
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=32g,mode=0755"); err != nil {
		return res, fmt.Errorf("tmpfs for the cluster's files: %w", err)
	}
	defer func() {
		if uerr := unix.Unmount(dir, 0); uerr != nil {
			_ = unix.Unmount(dir, unix.MNT_DETACH)
			err = joinErr(err, fmt.Errorf("unmount the run's tmpfs (something still holds it): %w", uerr))
		}
	}()
	auditLog := filepath.Join(dir, "audit.log")
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		return res, err
	}
	// The audit log must not rotate: readAudit reads the one file.
	// kube-apiserver 1.33 hands --audit-log-maxsize to its log writer
	// (lumberjack), which takes 0 as its default of 100 MB, not as no limit,
	// and a formation of 10,000 3D volumes logs more (docs/scale.md, "Seventh
	// pass: 10,000 3D volumes held"). 1 TiB is beyond any run.
	env, err := testenv.Start(testenv.Options{Log: os.Stderr, APIServerArgs: map[string][]string{
		"audit-policy-file": {policy}, "audit-log-path": {auditLog}, "audit-log-maxsize": {"1048576"},
	}})
	if err != nil {
		return res, err
	}
	defer func() { err = joinErr(err, env.Stop()) }()
	lc, err := localcluster.Start(ctx, localcluster.Options{Env: env, Nodes: 3, Dir: filepath.Join(dir, "cluster"), PlainFiles: cfg.backing() == backingPlain,
		ExternalAgents: cfg.AgentProcesses})
	if err != nil {
		return res, err
	}
	defer func() { err = joinErr(err, lc.Stop()) }()
	tag := fmt.Sprintf("%s-%d", cfg.Class, cfg.N)
	args := cfg.ExtraArgs
	if cfg.N > defaultPorts && !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(strings.TrimLeft(a, "-"), "port-range") }) {
		// A replica's DRBD port is unique on its node, so the default range
		// holds 1,000 replicas a node (docs/controller.md, "Allocation and the
		// shared secret"), and the run's three nodes hold up to N each (3D: one
		// of every volume): a larger run needs a wider one, as such nodes would.
		args = append(slices.Clone(args), "--port-range", fmt.Sprintf("7000-%d", 7000+cfg.N-1))
	}
	res.ControllerArgs = strings.Join(args, " ")
	var cg *memoryCgroup
	if cfg.ControllerMemoryLimit > 0 {
		if cg, err = newMemoryCgroup(cfg.ControllerMemoryLimit); err != nil {
			return res, err
		}
		res.ControllerMemoryLimit = cfg.ControllerMemoryLimitText
		defer func() {
			res.ControllerOOMKills = cg.oomKills()
			err = joinErr(err, cg.remove())
		}()
	}
	ctrl, err := startController(env, cfg.Meshvol, dir, filepath.Join(cfg.LogDir, "controller-"+tag+".log"), args, cg)
	if err != nil {
		return res, err
	}
	defer func() {
		if serr := ctrl.stop(); serr != nil {
			err = joinErr(err, fmt.Errorf("meshvol controller: %w", serr))
		}
	}()
	apiserver := childNamed(os.Getpid(), "kube-apiserver")
	var agents *agentProcs
	if cfg.AgentProcesses {
		if agents, err = startAgents(ctx, env, lc, cfg.Meshvol, dir, cfg.LogDir, tag); err != nil {
			return res, err
		}
		defer func() { err = joinErr(err, agents.stop()) }()
	}
	// cpuOf's figures of the controller, the agents and the simulator (this
	// process, and the agents' own when they are processes) and the apiserver.
	cpuNow := func() []time.Duration {
		c := cpuOf(ctrl.pid(), os.Getpid(), apiserver)
		if agents != nil {
			c[1] += agents.cpu()
		}
		return c
	}

	loadCfg := rest.CopyConfig(env.Config)
	loadCfg.UserAgent = loadUserAgent
	loadCfg.QPS, loadCfg.Burst = 1000, 2000
	cl, err := client.NewWithWatch(loadCfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		return res, err
	}
	if _, err := lc.CreatePool(ctx, "pool"); err != nil {
		return res, err
	}
	p := classes[cfg.Class]
	if _, err := lc.CreateClass(ctx, "bench", "pool", p[0], p[1], v1.TopologyIgnored); err != nil {
		return res, err
	}
	time.Sleep(3 * time.Second) // the controller's placement views see the pool and class

	m := meter{audit: auditLog, ctrl: ctrl, lc: lc, agents: agents}
	w := newReadyWatch()
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go w.run(wctx, cl)

	// Formation: N volumes created at once.
	apiHTTP, err := rest.HTTPClientFor(env.Config)
	if err != nil {
		return res, err
	}
	prof := startProfiler(cfg.LogDir, tag+"-formation", ctrl.pprofAddr, apiHTTP, strings.TrimSuffix(env.Config.Host, "/"), 5*time.Second)
	before, err := m.read(ctx)
	if err != nil {
		return res, err
	}
	formationCPU := cpuNow()
	first := before
	names := make([]string, cfg.N)
	for i := range names {
		names[i] = fmt.Sprintf("bench-%05d", i)
	}
	start := time.Now()
	created := parallel(cfg.Parallel, names, func(name string) error {
		rv := &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.ReplicatedVolumeSpec{
			Size: resource.MustParse("64Mi"), ConfigurationMode: v1.ConfigurationModeAuto,
			ReplicatedStorageClassName: "bench", MaxAttachments: 1,
		}}
		return cl.Create(ctx, rv)
	})
	res.CreateSeconds = time.Since(start).Seconds()
	ready := w.waitAll(ctx, names, cfg.Timeout)
	prof.stop()
	if cpu := cpuNow(); len(cpu) == 3 {
		res.FormationCPU = CPU{Controller: (cpu[0] - formationCPU[0]).Seconds(), Agents: (cpu[1] - formationCPU[1]).Seconds(),
			APIServer: (cpu[2] - formationCPU[2]).Seconds()}
	}
	// The formation's writes include what it set off after the last volume was
	// Ready: the controller's Events, which its recorder sends one at a time behind
	// the reconciles, trail them by seconds at N in the thousands.
	if err := m.settle(ctx, 2*time.Second, time.Minute); err != nil {
		return res, err
	}
	after, err := m.read(ctx)
	if err != nil {
		return res, err
	}
	res.Ready = len(ready)
	var lat []float64
	var last time.Time
	for name, at := range ready {
		lat = append(lat, at.Sub(created[name]).Seconds())
		if at.After(last) {
			last = at
		}
	}
	if len(ready) > 0 {
		res.ReadySeconds = last.Sub(start).Seconds()
		res.P50, res.P95 = percentile(lat, 50), percentile(lat, 95)
	}
	res.Formation = after.since(before, cfg.N)
	if len(ready) < cfg.N {
		res.Error = fmt.Sprintf("%d of %d Ready after %s", len(ready), cfg.N, cfg.Timeout)
	}

	// The idle period: nothing changes; what runs, polls.
	time.Sleep(5 * time.Second)
	before, err = m.read(ctx)
	if err != nil {
		return res, err
	}
	cpu0 := cpuNow()
	stopProfile := profile(filepath.Join(cfg.LogDir, "profile-"+tag+"-idle.pprof"))
	idleStart := time.Now()
	time.Sleep(cfg.Idle)
	stopProfile()
	cpu1 := cpuNow()
	idle := time.Since(idleStart)
	after, err = m.read(ctx)
	if err != nil {
		return res, err
	}
	res.IdleSeconds = idle.Seconds()
	res.Idle = after.since(before, cfg.N)
	res.IdleCPU = CPU{
		Controller: 100 * (cpu1[0] - cpu0[0]).Seconds() / idle.Seconds(),
		Agents:     100 * (cpu1[1] - cpu0[1]).Seconds() / idle.Seconds(),
		APIServer:  100 * (cpu1[2] - cpu0[2]).Seconds() / idle.Seconds(),
	}
	res.Memory.ControllerRSS, res.Memory.ControllerPeak, _ = procMem(ctrl.pid())
	res.Memory.AgentsRSS, res.Memory.AgentsPeak, _ = procMem(os.Getpid())
	if agents != nil {
		res.Memory.Agents = agents.memory(ctx, cfg.LogDir, tag)
	}
	if apiserver != 0 {
		res.Memory.APIServerRSS, _, _ = procMem(apiserver)
	}

	// Where the memory is: the heap of this process (the agents and the
	// simulator, apart by package) and the controller's, after a collection
	// (gc=1: what is live, not what the last collection left), taken after the
	// resident memory above so that the collection does not lower it.
	writeHeap(filepath.Join(cfg.LogDir, "profile-"+tag+"-heap-bench.pprof"))
	prof.fetch(ctx, http.DefaultClient, "http://"+ctrl.pprofAddr, "heap?gc=1", filepath.Join(cfg.LogDir, "profile-"+tag+"-heap-controller.pprof"))

	// A controller restart with every volume formed (restartController).
	if ctrl, err = restartController(ctx, &res, ctrl, &m, w, cfg, tag); err != nil {
		return res, err
	}
	if cfg.Hold {
		res.Held = true
		after, err = m.read(ctx)
		if err != nil {
			return res, err
		}
		res.Whole = after.since(first, cfg.N)
		res.LoadEnd = loadAvg()
		return res, nil
	}

	// Deletion: every volume at once, until nothing of them is left. The watch of
	// every RV has served its purpose (Ready times, the restart's updates) and goes
	// first: it decoded each RV event of the deletion in this process, whose CPU
	// is counted as the agents' and the simulator's, and on the same two cores.
	stopWatch()
	before, err = m.read(ctx)
	if err != nil {
		return res, err
	}
	deleteCPU := cpuNow()
	prof = startProfiler(cfg.LogDir, tag+"-delete", ctrl.pprofAddr, apiHTTP, strings.TrimSuffix(env.Config.Host, "/"), 5*time.Second)
	start = time.Now()
	parallel(cfg.Parallel, names, func(name string) error {
		err := cl.Delete(ctx, &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: name}})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
	left, gone := waitGone(ctx, cl, lc, cfg.Timeout)
	res.DeleteSeconds = time.Since(start).Seconds()
	prof.stop()
	if cpu := cpuNow(); len(cpu) == 3 {
		res.DeleteCPU = CPU{Controller: (cpu[0] - deleteCPU[0]).Seconds(), Agents: (cpu[1] - deleteCPU[1]).Seconds(),
			APIServer: (cpu[2] - deleteCPU[2]).Seconds()}
	}
	if !gone {
		res.Error = joinMsg(res.Error, "deletion: "+left)
	}
	after, err = m.read(ctx)
	if err != nil {
		return res, err
	}
	res.Delete = after.since(before, cfg.N)
	res.Whole = after.since(first, cfg.N)
	res.LoadEnd = loadAvg()
	return res, nil
}

// defaultPorts is how many replicas a node holds with `meshvol controller`'s
// default --port-range (7000-7999).
const defaultPorts = 1000

// restartController stops the controller of a formed, idle cluster and starts
// it again, as an upgrade or a rescheduled pod does, and records in res how
// long the new process took to sync its caches (/readyz) and to reconcile every
// volume once, and what it wrote meanwhile (nothing should change: every
// volume is formed and idle, so any write is beyond the budget, and any RV
// update a status flapping). It returns the new process.
func restartController(ctx context.Context, res *Result, ctrl *controllerProc, m *meter, w *readyWatch, cfg runConfig, tag string) (*controllerProc, error) {
	before, err := m.read(ctx)
	if err != nil {
		return ctrl, err
	}
	seen := w.counts()
	next, err := ctrl.restart(ctx, filepath.Join(cfg.LogDir, "controller-"+tag+"-restarted.log"))
	if err != nil {
		return ctrl, err
	}
	m.ctrl = next
	synced, err := next.waitReady(ctx, cfg.Timeout)
	if err != nil {
		res.Error = joinMsg(res.Error, "restart: "+err.Error())
		return next, nil
	}
	res.Restart.SyncedSeconds = synced.Sub(next.started).Seconds()
	passed, err := next.waitReconciled(ctx, cfg.N, cfg.Timeout)
	if err != nil {
		res.Error = joinMsg(res.Error, "restart: "+err.Error())
		return next, nil
	}
	res.Restart.PassSeconds = passed.Sub(next.started).Seconds()
	// A write the first pass queued for later (a requeue, a paced status) would
	// come within seconds: the window stays open a while after the pass.
	time.Sleep(restartSettle)
	after, err := m.read(ctx)
	if err != nil {
		return next, err
	}
	res.Restart.Writes = after.since(before, cfg.N)
	now := w.counts()
	res.Restart.RVUpdates, res.Restart.LeftReady = now.updates-seen.updates, now.leftReady-seen.leftReady
	return next, nil
}

// restartSettle is how long the restart's window stays open after the first pass.
const restartSettle = 10 * time.Second

// cpuOf reads the CPU time of the controller, this process (the agents and
// the simulator) and the apiserver.
func cpuOf(pids ...int) []time.Duration {
	out := make([]time.Duration, len(pids))
	for i, pid := range pids {
		if pid != 0 {
			out[i], _ = procCPU(pid)
		}
	}
	return out
}

// writeHeap writes this process's heap profile (after a collection, so that
// it shows what is live) to path.
func writeHeap(path string) {
	runtime.GC()
	f, err := os.Create(path)
	if err != nil {
		return
	}
	defer f.Close()
	_ = pprof.WriteHeapProfile(f)
}

// profile starts a CPU profile of this process into path; the returned
// function stops it.
func profile(path string) func() {
	f, err := os.Create(path)
	if err != nil {
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return func() {}
	}
	return func() { pprof.StopCPUProfile(); f.Close() }
}

// parallel runs f for every name on workers goroutines and returns when each
// call was made, with the time each began. A failed call is retried until it
// succeeds: a create or delete refused under load must still happen.
func parallel(workers int, names []string, f func(string) error) map[string]time.Time {
	var mu sync.Mutex
	began := make(map[string]time.Time, len(names))
	ch := make(chan string)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range ch {
				t := time.Now()
				mu.Lock()
				began[name] = t
				mu.Unlock()
				for attempt := 0; f(name) != nil && attempt < 20; attempt++ {
					time.Sleep(time.Second)
				}
			}
		}()
	}
	for _, n := range names {
		ch <- n
	}
	close(ch)
	wg.Wait()
	return began
}

// readyWatch records when each volume was first Ready with no transition
// under way, from a watch of every RV.
type readyWatch struct {
	mu    sync.Mutex
	at    map[string]time.Time
	moved chan struct{}
	// seen counts the RV updates the watch delivered and the times a volume
	// that had been Ready was seen otherwise.
	seen watchCounts
}

type watchCounts struct{ updates, leftReady int }

func newReadyWatch() *readyWatch {
	return &readyWatch{at: map[string]time.Time{}, moved: make(chan struct{}, 1)}
}

func (w *readyWatch) counts() watchCounts {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen
}

func (w *readyWatch) run(ctx context.Context, cl client.WithWatch) {
	for ctx.Err() == nil {
		var list v1.ReplicatedVolumeList
		if err := cl.List(ctx, &list); err != nil {
			time.Sleep(time.Second)
			continue
		}
		for i := range list.Items {
			w.see(&list.Items[i], false)
		}
		wi, err := cl.Watch(ctx, &v1.ReplicatedVolumeList{}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
		if err != nil {
			time.Sleep(time.Second)
			continue
		}
		for ev := range wi.ResultChan() {
			if rv, ok := ev.Object.(*v1.ReplicatedVolume); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				w.see(rv, ev.Type == watch.Modified)
			}
		}
		wi.Stop()
	}
}

func (w *readyWatch) see(rv *v1.ReplicatedVolume, update bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if update {
		w.seen.updates++
	}
	_, wasReady := w.at[rv.Name]
	if rv.Status.Phase != v1.VolumePhaseReady || len(rv.Status.DatameshTransitions) > 0 {
		if wasReady && rv.DeletionTimestamp == nil {
			w.seen.leftReady++
		}
		return
	}
	if !wasReady {
		w.at[rv.Name] = time.Now()
		select {
		case w.moved <- struct{}{}:
		default:
		}
	}
}

// waitAll waits until every name was Ready, or timeout; it returns when
// each that was became Ready. The cluster holds the run's volumes only, so
// the count of volumes seen Ready says when all are: the map of names is
// built once, not at every volume that becomes Ready (10,000 times 10,000).
func (w *readyWatch) waitAll(ctx context.Context, names []string, timeout time.Duration) map[string]time.Time {
	deadline := time.After(timeout)
	for {
		w.mu.Lock()
		all := len(w.at) >= len(names)
		w.mu.Unlock()
		if all {
			return w.readyOf(names)
		}
		select {
		case <-w.moved:
		case <-deadline:
			return w.readyOf(names)
		case <-ctx.Done():
			return w.readyOf(names)
		}
	}
}

// readyOf returns when each of names that was Ready became so.
func (w *readyWatch) readyOf(names []string) map[string]time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]time.Time{}
	for _, n := range names {
		if at, ok := w.at[n]; ok {
			out[n] = at
		}
	}
	return out
}

// waitGone waits until nothing of the run's volumes is left: no RV, RVR or
// Secret of the controller's, no DRBD resource on any node, no backing volume
// (a file in a node's pools, a loop device over one); it says what is left
// when it times out.
func waitGone(ctx context.Context, cl client.Client, lc *localcluster.Cluster, timeout time.Duration) (string, bool) {
	deadline := time.Now().Add(timeout)
	left := ""
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if left = leftOver(ctx, cl, lc); left == "" {
			return "", true
		}
		time.Sleep(500 * time.Millisecond)
	}
	return left, false
}

// leftOver says what of the run's volumes is still there, "" when nothing is.
// The objects are counted first, the resources and the files only once they
// are gone.
func leftOver(ctx context.Context, cl client.Client, lc *localcluster.Cluster) string {
	var counts [3]int
	kinds := []struct {
		name, kind string
		opts       []client.ListOption
	}{
		{"RVs", "ReplicatedVolume", nil},
		{"RVRs", "ReplicatedVolumeReplica", nil},
		// A volume's own Secret carries its label; the cluster key's Secret,
		// which every volume's derived secret names, stays (docs/contract.md,
		// "The shared secret").
		{"Secrets", "Secret", []client.ListOption{client.InNamespace(lc.Namespace), client.HasLabels{v1.LabelVolume}}},
	}
	for i, k := range kinds {
		n, err := count(ctx, cl, k.kind, k.opts...)
		if err != nil {
			return fmt.Sprintf("%s: %v", k.name, err)
		}
		counts[i] = n
	}
	if counts[0]+counts[1]+counts[2] > 0 {
		return fmt.Sprintf("%d RVs, %d RVRs, %d Secrets left", counts[0], counts[1], counts[2])
	}
	resources, files := 0, 0
	for _, n := range lc.Nodes {
		rs, err := n.Resources(ctx)
		if err != nil {
			return fmt.Sprintf("%s: DRBD resources: %v", n.Name, err)
		}
		resources += len(rs)
		files += len(n.Files())
	}
	// By the files' device and inode: an agent process attaches its loop
	// devices through its own mount namespace (agents.go), whose paths sysfs
	// does not show under the cluster's directory.
	loops := loopsOver(lc.Dir)
	if resources+files+loops > 0 {
		return fmt.Sprintf("%d DRBD resources, %d backing files, %d loop devices left", resources, files, loops)
	}
	return ""
}

// count is how many objects of kind there are, from a list of their metadata
// cut to one item, for which the apiserver says how many remain: a poll costs
// the same with thousands left as with one (a whole list of 6,000 replicas
// every half second was a load of its own on the apiserver).
func count(ctx context.Context, cl client.Client, kind string, opts ...client.ListOption) (int, error) {
	list := &metav1.PartialObjectMetadataList{}
	gv := v1.SchemeGroupVersion
	if kind == "Secret" {
		gv = corev1.SchemeGroupVersion
	}
	list.SetGroupVersionKind(gv.WithKind(kind + "List"))
	if err := cl.List(ctx, list, append(opts, client.Limit(1))...); err != nil {
		return 0, err
	}
	n := len(list.Items)
	if list.RemainingItemCount != nil {
		n += int(*list.RemainingItemCount)
	}
	return n, nil
}

func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}

func joinErr(a, b error) error {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return fmt.Errorf("%w; %v", a, b)
}

func joinMsg(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
