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
	done        chan error
}

// startController runs bin as `meshvol controller` against env, as the user
// controllerUser, without leader election (one replica), its metrics on a free
// local port, its log in logPath.
func startController(env *testenv.Env, bin, dir, logPath string, extra []string) (*controllerProc, error) {
	kc, err := env.KubeConfig(controllerUser, "system:masters")
	if err != nil {
		return nil, err
	}
	kcPath := filepath.Join(dir, "controller.kubeconfig")
	if err := os.WriteFile(kcPath, kc, 0o600); err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	pprofAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	args := append([]string{"controller", "--kubeconfig", kcPath, "--leader-elect=false",
		"--metrics-bind-address", addr, "--health-probe-bind-address", "",
		"--pprof-bind-address", pprofAddr}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &controllerProc{cmd: cmd, metricsAddr: addr, pprofAddr: pprofAddr, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait(); logf.Close() }()
	return p, nil
}

func (p *controllerProc) pid() int { return p.cmd.Process.Pid }

// stop ends the controller with SIGTERM (its graceful shutdown), SIGKILL after 30 s.
func (p *controllerProc) stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		return err
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		return fmt.Errorf("meshvol controller did not stop within 30 s of SIGTERM: killed")
	}
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
	return parseCounters(resp.Body)
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
