package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/meshvol/meshvol/internal/testenv"
)

// controllerProc is `meshvol controller` running as a process of its own, so
// its CPU time and memory are its own.
type controllerProc struct {
	cmd         *exec.Cmd
	metricsAddr string
	pprofAddr   string
	probeAddr   string
	done        chan error
	started     time.Time
	// bin, kubeconfig, extra and cgroup start it again (restart).
	bin, kubeconfig string
	extra           []string
	cgroup          *memoryCgroup // nil: none of its own
	// base is what the processes before this one counted (restart): the
	// counters of a run continue across a restart.
	base controllerCounters

	stopOnce sync.Once
	stopErr  error
}

// startController runs bin as `meshvol controller` against env, as the user
// controllerUser, without leader election (one replica), its metrics, health
// probes and profiles on free local ports, its log in logPath; in cg, a memory
// cgroup, unless nil.
func startController(env *testenv.Env, bin, dir, logPath string, extra []string, cg *memoryCgroup) (*controllerProc, error) {
	kc, err := env.KubeConfig(controllerUser, "system:masters")
	if err != nil {
		return nil, err
	}
	kcPath := filepath.Join(dir, "controller.kubeconfig")
	if err := os.WriteFile(kcPath, kc, 0o600); err != nil {
		return nil, err
	}
	return launch(bin, kcPath, logPath, extra, cg, controllerCounters{})
}

func launch(bin, kubeconfig, logPath string, extra []string, cg *memoryCgroup, base controllerCounters) (*controllerProc, error) {
	var addrs [3]string
	for i := range addrs {
		a, err := freeAddr()
		if err != nil {
			return nil, err
		}
		addrs[i] = a
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	args := append([]string{"controller", "--kubeconfig", kubeconfig, "--leader-elect=false",
		"--metrics-bind-address", addrs[0], "--health-probe-bind-address", addrs[1],
		"--pprof-bind-address", addrs[2]}, extra...)
	name := bin
	if cg != nil {
		name, args = cg.wrap(bin, args)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &controllerProc{cmd: cmd, metricsAddr: addrs[0], probeAddr: addrs[1], pprofAddr: addrs[2], done: make(chan error, 1),
		started: time.Now(), bin: bin, kubeconfig: kubeconfig, extra: extra, cgroup: cg, base: base}
	go func() { p.done <- cmd.Wait(); logf.Close() }()
	return p, nil
}

// restart stops the controller (SIGTERM) and starts it again with the same
// flags, its log in logPath. The new process's counters continue this one's,
// read just before it stops (nothing writes in between: the run is idle).
func (p *controllerProc) restart(ctx context.Context, logPath string) (*controllerProc, error) {
	last, err := p.counters(ctx)
	if err != nil {
		return nil, err
	}
	if err := p.stop(); err != nil {
		return nil, err
	}
	return launch(p.bin, p.kubeconfig, logPath, p.extra, p.cgroup, last)
}

// waitReady polls /readyz until it answers 200 (the controller's caches are
// synced) and returns when it did.
func (p *controllerProc) waitReady(ctx context.Context, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.probeAddr+"/readyz", nil)
		if err != nil {
			return time.Time{}, err
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Now(), nil
			}
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return time.Time{}, fmt.Errorf("meshvol controller not ready (/readyz) within %s of its start", timeout)
}

// waitReconciled polls the volume reconciler's count until it reconciled n
// volumes since this process started (its first pass over every volume, which
// the informers' initial list queues) and returns when it had.
func (p *controllerProc) waitReconciled(ctx context.Context, n int, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if c, err := p.counters(ctx); err == nil && c.VolumeReconciles-p.base.VolumeReconciles >= n {
			return time.Now(), nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return time.Time{}, fmt.Errorf("meshvol controller did not reconcile %d volumes within %s of its start", n, timeout)
}

func (p *controllerProc) pid() int { return p.cmd.Process.Pid }

// stop ends the controller with SIGTERM (its graceful shutdown), SIGKILL after 30 s.
// A second call returns the first's answer.
func (p *controllerProc) stop() error {
	p.stopOnce.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case p.stopErr = <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			p.stopErr = fmt.Errorf("meshvol controller did not stop within 30 s of SIGTERM: killed")
		}
	})
	return p.stopErr
}

// controllerCounters are the controller's own counts of its writes, from its
// metrics endpoint: every non-GET HTTP request client-go made
// (rest_client_requests_total, Events included) and the writes its reconcilers
// made and the apiserver accepted (meshvol_controller_writes_total).
type controllerCounters struct {
	HTTPWrites       int
	ReconcilerWrites int
	// VolumeReconciles counts the volume reconciler's runs
	// (controller_runtime_reconcile_total{controller="volume"}).
	VolumeReconciles int
}

func (p *controllerProc) counters(ctx context.Context) (controllerCounters, error) {
	var c controllerCounters
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.metricsAddr+"/metrics", nil)
	if err != nil {
		return c, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return c, err
	}
	defer resp.Body.Close()
	if c, err = parseCounters(resp.Body); err != nil {
		return c, err
	}
	c.HTTPWrites += p.base.HTTPWrites
	c.ReconcilerWrites += p.base.ReconcilerWrites
	c.VolumeReconciles += p.base.VolumeReconciles
	return c, nil
}

// parseCounters reads the two counters from Prometheus' text format.
func parseCounters(r io.Reader) (controllerCounters, error) {
	var c controllerCounters
	sc := bufio.NewScanner(r)
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
		switch {
		case strings.HasPrefix(line, "rest_client_requests_total{") && !strings.Contains(line, `method="GET"`):
			c.HTTPWrites += int(v)
		case strings.HasPrefix(line, "meshvol_controller_writes_total{"):
			c.ReconcilerWrites += int(v)
		case strings.HasPrefix(line, "controller_runtime_reconcile_total{") && strings.Contains(line, `controller="volume"`):
			c.VolumeReconciles += int(v)
		}
	}
	return c, sc.Err()
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
