//go:build vmtest

package drbd_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// The guest's half of the product tier (product_test.go): the agent starts
// and stops the real `meshvol node` (the binary hack/vm-test-drbd.sh packs
// beside the test binary) and forwards a TCP port on the guest's address to
// that process's CSI socket, so that the host reaches the node service over
// the bridge as a kubelet reaches it over the socket.
const (
	meshvolBinary  = "/meshvol/meshvol"
	guestRunDir    = "/run/meshvol"
	guestCSISocket = guestRunDir + "/csi.sock"
	csiProxyPort   = 7998
)

// nodeProc is the running `meshvol node`, nil when none runs.
type nodeProc struct {
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	// stops counts nodeStop's calls: a restart after an exit of its own is
	// called off when a stop came meanwhile.
	stops int
}

var meshvolNode nodeProc

func (a *agent) productRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /node/start", a.nodeStart)
	mux.HandleFunc("POST /node/stop", a.nodeStop)
	go serveCSIProxy(a.log)
}

// nodeStart starts `meshvol node --node-name ?name=` with the request body as
// its kubeconfig; its log goes where the agent's does (the second serial port).
func (a *agent) nodeStart(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("name")
	kc, err := io.ReadAll(r.Body)
	if err == nil {
		err = os.MkdirAll(guestRunDir, 0o755)
	}
	kcPath := filepath.Join(guestRunDir, "kubeconfig")
	if err == nil {
		err = os.WriteFile(kcPath, kc, 0o600)
	}
	if err == nil {
		err = meshvolNode.start(name, kcPath)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	fmt.Fprintln(w, "started")
}

// The guests' agent Leases as the chart sets them (deploy/meshvol.yaml:
// --lease-duration 6s, --lease-renew-interval 2s), and the controller's grace
// after them (product_test.go, startController).
const (
	productLease = 6 * time.Second
	productRenew = 2 * time.Second
	productGrace = 10 * time.Second
)

func (p *nodeProc) start(name, kubeconfig string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("meshvol node already runs (pid %d)", p.cmd.Process.Pid)
	}
	_ = os.Remove(guestCSISocket)
	// The prerequisite check every 10 s, not the default minute: what
	// TestProductNodeCheck waits for once the module is loaded.
	cmd := exec.Command(meshvolBinary, "node", "--node-name", name, "--kubeconfig", kubeconfig,
		"--csi-endpoint", "unix://"+guestCSISocket, "--metrics-bind-address", "0", "-v", "1",
		"--prerequisite-check-interval", productCheckInterval.String(),
		"--lease-duration", productLease.String(), "--lease-renew-interval", productRenew.String())
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func(done chan struct{}) {
		err := cmd.Wait()
		close(done)
		p.restartIfExited(cmd, err, name, kubeconfig)
	}(p.done)
	return nil
}

// restartIfExited starts `meshvol node` again when cmd, the running one, ended
// by itself rather than by nodeStop, as the kubelet restarts the node agent's
// container (the chart's DaemonSet: restartPolicy Always): under emulation on a
// loaded machine its start-up gave up once on a TLS handshake to the apiserver
// that timed out, and the tier waited ten minutes for that node's pool
// capacity (test/vm/README.md, the runs of the 27th's late evening).
func (p *nodeProc) restartIfExited(cmd *exec.Cmd, err error, name, kubeconfig string) {
	p.mu.Lock()
	exited, stops := p.cmd == cmd, p.stops
	if exited {
		p.cmd = nil
	}
	p.mu.Unlock()
	if !exited {
		return // nodeStop ended it
	}
	fmt.Fprintf(os.Stderr, "meshvol-vm: meshvol node exited by itself (%v); starting it again in 2 s\n", err)
	time.Sleep(2 * time.Second)
	p.mu.Lock()
	stopped := p.stops != stops
	p.mu.Unlock()
	if stopped {
		return
	}
	if err := p.start(name, kubeconfig); err != nil {
		fmt.Fprintf(os.Stderr, "meshvol-vm: starting meshvol node again: %v\n", err)
	}
}

// nodeStop ends `meshvol node` with ?signal=KILL (a crash of the agent alone)
// or TERM (a graceful stop) and waits until it has exited.
func (a *agent) nodeStop(w http.ResponseWriter, r *http.Request) {
	sig := syscall.SIGTERM
	if r.URL.Query().Get("signal") == "KILL" {
		sig = syscall.SIGKILL
	}
	meshvolNode.mu.Lock()
	cmd, done := meshvolNode.cmd, meshvolNode.done
	meshvolNode.cmd = nil
	meshvolNode.stops++
	meshvolNode.mu.Unlock()
	if cmd == nil {
		fmt.Fprintln(w, "not running")
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
		fmt.Fprintln(w, "stopped")
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		<-done
		http.Error(w, "meshvol node did not stop within a minute; killed", http.StatusInternalServerError)
	}
}

// serveCSIProxy forwards every connection on csiProxyPort to the node
// service's socket, byte for byte (gRPC over HTTP/2 either way).
func serveCSIProxy(log *slog.Logger) {
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", csiProxyPort))
	if err != nil {
		log.Error("csi proxy", "err", err)
		return
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Error("csi proxy", "err", err)
			return
		}
		go func() {
			defer c.Close()
			u, err := net.Dial("unix", guestCSISocket)
			if err != nil {
				return // the client sees the connection close and retries
			}
			defer u.Close()
			pipe(c, u)
		}()
	}
}

// pipe copies both ways until either side closes.
func pipe(a, b net.Conn) {
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(a, b); done <- struct{}{} }()
	go func() { _, _ = io.Copy(b, a); done <- struct{}{} }()
	<-done
}

// startNode asks the guest's agent to start `meshvol node` as name with kubeconfig.
func (r *remote) startNode(ctx context.Context, name string, kubeconfig []byte) error {
	return r.plain(ctx, "/node/start?name="+name, kubeconfig)
}

// stopNode asks the guest's agent to end `meshvol node` with SIGKILL (kill)
// or SIGTERM.
func (r *remote) stopNode(ctx context.Context, kill bool) error {
	sig := "TERM"
	if kill {
		sig = "KILL"
	}
	return r.plain(ctx, "/node/stop?signal="+sig, nil)
}

func (r *remote) plain(ctx context.Context, path string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s: agent: %w", r.node, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: agent: %s: %s", r.node, resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}
