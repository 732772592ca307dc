package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// CapacityPollInterval is how often external-provisioner asks GetCapacity
// again for every storage class and topology segment.
const CapacityPollInterval = 10 * time.Second

// sidecar is one of the CSI sidecars from bin/k8s, run as a process against
// the controller's CSI socket.
type sidecar struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// startSidecars starts external-provisioner (topology on, so
// WaitForFirstConsumer passes the selected node to CreateVolume; capacity
// tracking on, so the scheduler places a pod only where its claim fits)
// and external-attacher, with their logs in logDir. namespace holds the
// CSIStorageCapacity objects the provisioner publishes.
func startSidecars(binDir, kubeconfig, csiSocket, logDir, namespace string) ([]*sidecar, error) {
	specs := []struct {
		name string
		args []string
		env  []string
	}{
		{"csi-provisioner", []string{
			"--csi-address=" + csiSocket,
			"--kubeconfig=" + kubeconfig,
			"--leader-election=false",
			"--feature-gates=Topology=true",
			// The node the scheduler picked is the one that must get a
			// replica (or be reachable from one): the CSI controller
			// service reads it from the preferred topology.
			"--strict-topology=true",
			"--timeout=60s",
			"--retry-interval-start=1s",
			"--retry-interval-max=10s",
			"--worker-threads=10",
			// One CSIStorageCapacity per storage class and topology
			// segment (a node with its zone), from GetCapacity. The
			// provisioner runs as a process, not in a pod: its objects
			// have no owner (level -1), and NAMESPACE alone says where
			// they go. The poll interval bounds how stale they are after
			// a change the provisioner did not cause itself (its own
			// CreateVolume and DeleteVolume refresh them at once).
			"--enable-capacity",
			"--capacity-ownerref-level=-1",
			"--capacity-poll-interval=" + CapacityPollInterval.String(),
			// Its default of 1 write a second (burst 5) takes 5 s to
			// create the first 9 objects (3 classes on 3 nodes).
			"--kube-api-capacity-qps=20",
			"--kube-api-capacity-burst=20",
			"--v=2",
		}, []string{"NAMESPACE=" + namespace}},
		{"csi-attacher", []string{
			"--csi-address=" + csiSocket,
			"--kubeconfig=" + kubeconfig,
			"--leader-election=false",
			"--timeout=60s",
			"--retry-interval-start=1s",
			"--retry-interval-max=10s",
			"--v=2",
		}, nil},
	}
	var started []*sidecar
	for _, s := range specs {
		sc, err := startSidecar(filepath.Join(binDir, s.name), s.name, logDir, s.args, s.env)
		if err != nil {
			stopSidecars(started)
			return nil, err
		}
		started = append(started, sc)
	}
	return started, nil
}

func startSidecar(bin, name, logDir string, args, env []string) (*sidecar, error) {
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(filepath.Join(logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("sandbox: starting %s: %w (run `make k8s`)", name, err)
	}
	s := &sidecar{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(s.done)
	}()
	return s, nil
}

func stopSidecars(ss []*sidecar) {
	for _, s := range ss {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, s := range ss {
		select {
		case <-s.done:
		case <-time.After(5 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	}
}

// exitedSidecar returns the first sidecar that has exited, if any: a
// sidecar that cannot reach its socket or the apiserver ends at start.
func exitedSidecar(ctx context.Context, ss []*sidecar) *sidecar {
	for _, s := range ss {
		select {
		case <-s.done:
			return s
		default:
		}
	}
	return nil
}
