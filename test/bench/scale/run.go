package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/localcluster"
	"github.com/meshvol/meshvol/internal/loopdev"
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
}

// run measures one configuration. A run that does not reach all Ready still
// returns what it measured, with Error saying so.
func run(ctx context.Context, cfg runConfig) (res Result, err error) {
	res = Result{Class: cfg.Class, N: cfg.N, Date: time.Now().UTC().Format(time.RFC3339), LoadStart: loadAvg()}
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
	env, err := testenv.Start(testenv.Options{Log: os.Stderr, APIServerArgs: map[string][]string{
		"audit-policy-file": {policy}, "audit-log-path": {auditLog}, "audit-log-maxsize": {"0"},
	}})
	if err != nil {
		return res, err
	}
	defer func() { err = joinErr(err, env.Stop()) }()
	lc, err := localcluster.Start(ctx, localcluster.Options{Env: env, Nodes: 3, Dir: filepath.Join(dir, "cluster")})
	if err != nil {
		return res, err
	}
	defer func() { err = joinErr(err, lc.Stop()) }()
	tag := fmt.Sprintf("%s-%d", cfg.Class, cfg.N)
	ctrl, err := startController(env, cfg.Meshvol, dir, filepath.Join(cfg.LogDir, "controller-"+tag+".log"), cfg.ExtraArgs)
	if err != nil {
		return res, err
	}
	defer func() {
		if serr := ctrl.stop(); serr != nil {
			err = joinErr(err, fmt.Errorf("meshvol controller: %w", serr))
		}
	}()
	apiserver := childNamed(os.Getpid(), "kube-apiserver")

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

	m := meter{audit: auditLog, ctrl: ctrl, lc: lc}
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
	formationCPU := cpuOf(ctrl.pid(), os.Getpid(), apiserver)
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
	if cpu := cpuOf(ctrl.pid(), os.Getpid(), apiserver); len(cpu) == 3 {
		res.FormationCPU = CPU{Controller: (cpu[0] - formationCPU[0]).Seconds(), Agents: (cpu[1] - formationCPU[1]).Seconds(),
			APIServer: (cpu[2] - formationCPU[2]).Seconds()}
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
	cpu0 := cpuOf(ctrl.pid(), os.Getpid(), apiserver)
	stopProfile := profile(filepath.Join(cfg.LogDir, "profile-"+tag+"-idle.pprof"))
	idleStart := time.Now()
	time.Sleep(cfg.Idle)
	stopProfile()
	cpu1 := cpuOf(ctrl.pid(), os.Getpid(), apiserver)
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
	if apiserver != 0 {
		res.Memory.APIServerRSS, _, _ = procMem(apiserver)
	}

	// Deletion: every volume at once, until nothing of them is left.
	before, err = m.read(ctx)
	if err != nil {
		return res, err
	}
	start = time.Now()
	parallel(cfg.Parallel, names, func(name string) error {
		err := cl.Delete(ctx, &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: name}})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
	left, gone := waitGone(ctx, cl, lc.Dir, cfg.Timeout)
	res.DeleteSeconds = time.Since(start).Seconds()
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
}

func newReadyWatch() *readyWatch {
	return &readyWatch{at: map[string]time.Time{}, moved: make(chan struct{}, 1)}
}

func (w *readyWatch) run(ctx context.Context, cl client.WithWatch) {
	for ctx.Err() == nil {
		var list v1.ReplicatedVolumeList
		if err := cl.List(ctx, &list); err != nil {
			time.Sleep(time.Second)
			continue
		}
		for i := range list.Items {
			w.see(&list.Items[i])
		}
		wi, err := cl.Watch(ctx, &v1.ReplicatedVolumeList{}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
		if err != nil {
			time.Sleep(time.Second)
			continue
		}
		for ev := range wi.ResultChan() {
			if rv, ok := ev.Object.(*v1.ReplicatedVolume); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				w.see(rv)
			}
		}
		wi.Stop()
	}
}

func (w *readyWatch) see(rv *v1.ReplicatedVolume) {
	if rv.Status.Phase != v1.VolumePhaseReady || len(rv.Status.DatameshTransitions) > 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, seen := w.at[rv.Name]; !seen {
		w.at[rv.Name] = time.Now()
		select {
		case w.moved <- struct{}{}:
		default:
		}
	}
}

// waitAll waits until every name was Ready, or timeout; it returns when
// each that was became Ready.
func (w *readyWatch) waitAll(ctx context.Context, names []string, timeout time.Duration) map[string]time.Time {
	deadline := time.After(timeout)
	for {
		w.mu.Lock()
		out := map[string]time.Time{}
		for _, n := range names {
			if at, ok := w.at[n]; ok {
				out[n] = at
			}
		}
		w.mu.Unlock()
		if len(out) == len(names) {
			return out
		}
		select {
		case <-w.moved:
		case <-deadline:
			return out
		case <-ctx.Done():
			return out
		}
	}
}

// waitGone waits until no RV or RVR exists and no loop device is left over a
// file under dir; it says what is left when it times out.
func waitGone(ctx context.Context, cl client.Client, dir string, timeout time.Duration) (string, bool) {
	deadline := time.Now().Add(timeout)
	left := ""
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var rvs v1.ReplicatedVolumeList
		var rvrs v1.ReplicatedVolumeReplicaList
		if err := cl.List(ctx, &rvs); err != nil {
			left = err.Error()
		} else if err := cl.List(ctx, &rvrs); err != nil {
			left = err.Error()
		} else if loops := loopdev.Under(dir); len(rvs.Items)+len(rvrs.Items)+len(loops) > 0 {
			left = fmt.Sprintf("%d RVs, %d RVRs, %d loop devices left", len(rvs.Items), len(rvrs.Items), len(loops))
		} else {
			return "", true
		}
		time.Sleep(500 * time.Millisecond)
	}
	return left, false
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
