package scenario

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/localcluster"
	"github.com/meshvol/meshvol/internal/mountinfo"
	"github.com/meshvol/meshvol/internal/testenv"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
	"github.com/meshvol/meshvol/pkg/csi"
	"github.com/meshvol/meshvol/pkg/drbd"
)

// Local is the drbdsim backend: internal/localcluster's three nodes in three
// zones (a real apiserver, the controller, an agent per node on drbdsim,
// file pools on loop devices, a Primary's device a real loop device), the
// CSI controller service and a node service per node on unix sockets, as
// `meshvol controller --csi-endpoint` and `meshvol node --csi-endpoint` serve
// them. It needs root (loop devices, mounts).
type Local struct {
	Cluster *localcluster.Cluster
	dir     string
	ctrl    csipb.ControllerClient
	nodes   map[string]csipb.NodeClient
	conns   []*grpc.ClientConn
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	errs    chan error
	// partitioned are the nodes Partition cut off, until Heal.
	partitioned []string
}

var _ Backend = (*Local)(nil)

const localPool = "pool"

// StartLocal brings the drbdsim backend up on env (nil starts a control
// plane of its own); Stop takes it down.
func StartLocal(ctx context.Context, env *testenv.Env, log logr.Logger) (_ *Local, err error) {
	// The cleanup holds its own reference: every failing return below
	// returns nil, which would leave the deferred Stop a nil receiver.
	l := &Local{nodes: map[string]csipb.NodeClient{}, errs: make(chan error, 8)}
	defer func() {
		if err != nil {
			err = errors.Join(err, l.Stop())
		}
	}()
	if l.dir, err = os.MkdirTemp("", "meshvol-scenario-"); err != nil {
		return nil, err
	}
	if l.Cluster, err = localcluster.Start(ctx, localcluster.Options{
		Env: env, Nodes: 3, Zones: 3, LoopDevices: true, Log: log,
		Controller: localcluster.Controller(controller.Options{}),
	}); err != nil {
		return nil, err
	}
	if _, err := l.Cluster.CreatePool(ctx, localPool); err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	cfg, scheme := l.Cluster.Env.Config, l.Cluster.Env.Scheme
	sock := filepath.Join(l.dir, "controller.sock")
	l.serve(func() error {
		return csi.RunController(runCtx, csi.ControllerOptions{Endpoint: "unix://" + sock, Config: cfg, Scheme: scheme,
			Namespace: l.Cluster.Namespace, Log: log})
	})
	cc, err := l.dial(sock)
	if err != nil {
		return nil, err
	}
	l.ctrl = csipb.NewControllerClient(cc)
	for _, n := range l.Cluster.Nodes {
		sock := filepath.Join(l.dir, n.Name+".sock")
		l.serve(func() error {
			return csi.RunNode(runCtx, csi.NodeOptions{Endpoint: "unix://" + sock, Config: cfg, Scheme: scheme,
				NodeName: n.Name, Zone: n.Zone, Log: log})
		})
		cc, err := l.dial(sock)
		if err != nil {
			return nil, err
		}
		l.nodes[n.Name] = csipb.NewNodeClient(cc)
		if err := os.MkdirAll(l.Dir(n.Name), 0o755); err != nil {
			return nil, err
		}
	}
	return l, WaitPool(ctx, l, time.Minute)
}

func (l *Local) serve(run func() error) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		if err := run(); err != nil && !errors.Is(err, context.Canceled) {
			l.errs <- err
		}
	}()
}

// dial waits for the socket and connects to it.
func (l *Local) dial(sock string) (*grpc.ClientConn, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		select {
		case err := <-l.errs:
			return nil, err
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s did not appear within a minute", sock)
		}
	}
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	l.conns = append(l.conns, cc)
	return cc, nil
}

// WaitPool waits until every node of the backend is a Ready eligible node of
// its pool with free space reported: CreateVolume refuses what the reported
// free space cannot hold.
func WaitPool(ctx context.Context, b Backend, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		var rsp v1.ReplicatedStoragePool
		ready := 0
		msg := ""
		if err := b.Client().Get(ctx, client.ObjectKey{Name: b.Pool()}, &rsp); err == nil {
			for _, n := range rsp.Status.EligibleNodes {
				if n.Ready && n.FreeCapacity != nil && !n.FreeCapacity.IsZero() {
					ready++
				}
			}
			for _, c := range rsp.Status.Conditions {
				msg += fmt.Sprintf(" %s=%s: %s;", c.Type, c.Status, c.Message)
			}
		}
		if ready == len(b.Nodes()) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pool %s has %d of %d nodes ready with capacity after %s:%s", b.Pool(), ready, len(b.Nodes()), d, msg)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (l *Local) Name() string                             { return "drbdsim" }
func (l *Local) Client() client.Client                    { return l.Cluster.Client }
func (l *Local) Namespace() string                        { return l.Cluster.Namespace }
func (l *Local) Pool() string                             { return localPool }
func (l *Local) Controller() csipb.ControllerClient       { return l.ctrl }
func (l *Local) NodeService(node string) csipb.NodeClient { return l.nodes[node] }
func (l *Local) Dir(node string) string                   { return filepath.Join(l.dir, "kubelet", node) }
func (l *Local) DRBD(node string) drbd.Driver             { return l.Cluster.Node(node).Sim }

func (l *Local) Nodes() []string {
	var out []string
	for _, n := range l.Cluster.Nodes {
		out = append(out, n.Name)
	}
	return out
}

// Shell runs the script on this machine: the simulated nodes share it.
func (l *Local) Shell(ctx context.Context, _ string, script string) (string, error) {
	cmd := exec.CommandContext(ctx, "sh", "-c", script)
	// A child blocked in the kernel (IO on a frozen device) keeps the
	// output pipe open after ctx killed the shell: stop waiting for it.
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
	}
	return string(out), err
}

// Leftovers lists the volume's backing files in the node's pools.
func (l *Local) Leftovers(_ context.Context, node, volume string) ([]string, error) {
	var out []string
	for _, f := range l.Cluster.Node(node).Files() {
		if strings.Contains(f, "/"+volume+"-") {
			out = append(out, "backing file "+f)
		}
	}
	return out, nil
}

// Crash crashes the simulated node: its agent stops, its DRBD vanishes.
func (l *Local) Crash(_ context.Context, node string) error { return l.Cluster.CrashNode(node) }

// RestartAgent stops the node's agent and starts a new one.
func (l *Local) RestartAgent(_ context.Context, node string) error {
	return l.Cluster.RestartAgent(node)
}

// Partition cuts the node's simulated links to every other node and stops
// its agent: an agent that cannot reach the apiserver renews nothing and
// changes nothing, which a stopped one models.
func (l *Local) Partition(_ context.Context, node string) error {
	l.Cluster.Partition(node)
	l.partitioned = append(l.partitioned, node)
	return l.Cluster.StopAgent(node)
}

// Heal restores every link and starts the partitioned nodes' agents again,
// as an agent reconnecting to the apiserver resumes from a fresh list.
func (l *Local) Heal(_ context.Context) error {
	l.Cluster.Heal()
	var errs []error
	for _, n := range l.partitioned {
		errs = append(errs, l.Cluster.RestartAgent(n))
	}
	l.partitioned = nil
	return errors.Join(errs...)
}

// Stop stops the CSI services and the cluster and removes the directory.
func (l *Local) Stop() error {
	var errs []error
	for _, cc := range l.conns {
		_ = cc.Close()
	}
	if l.cancel != nil {
		l.cancel()
	}
	l.wg.Wait()
	// What is still mounted under the kubelet directories — a crashed
	// node's volumes (no NodeUnstage reaches a dead node), a failed
	// scenario's — the deepest first (a publish's bind mount before its
	// staging mount), before the cluster detaches the devices under them.
	ms, err := mountinfo.Read()
	errs = append(errs, err)
	under := mountinfo.Under(ms, l.dir)
	// A plain unmount first: it returns once the file system has written
	// its last blocks and closed the device, so the cluster finds the loop
	// device free. A lazy one returns at once and leaves that writeback to
	// the kernel, which under load can outlast the cluster's wait for its
	// devices; it is only the fallback for a mount something still holds.
	for i := len(under) - 1; i >= 0; i-- {
		if err := unix.Unmount(under[i], 0); err != nil {
			errs = append(errs, unix.Unmount(under[i], unix.MNT_DETACH))
		}
	}
	if l.Cluster != nil {
		errs = append(errs, l.Cluster.Stop())
	}
	if l.dir != "" {
		errs = append(errs, os.RemoveAll(l.dir))
	}
	return errors.Join(errs...)
}
