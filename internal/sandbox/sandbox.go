// Package sandbox puts meshvol on a real Kubernetes cluster on one machine
// (internal/kubecluster's control plane and kubelet nodes), in one of two
// ways. Installed (Options.Image, installed.go): as users install it, `helm
// install` of charts/meshvol with the image `make image` builds, on nodes
// with namespaces of their own, drbdsim serving every node's DRBD through
// drbd-utils stand-ins; `meshvol-sandbox` and the e2e suite (test/e2e) run
// on it. In process: internal/localcluster's meshvol controller and node
// agents on drbdsim nodes (the agents named after the kubelet nodes,
// sharing their Node objects), the CSI controller service behind the real
// external-provisioner and external-attacher, and a CSI node service per
// kubelet node registered with that kubelet through its plugin registration
// socket (`meshvol-sandbox -in-process`).
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/meshvol/meshvol/internal/drbdsimd"
	"github.com/meshvol/meshvol/internal/goproc"
	"github.com/meshvol/meshvol/internal/kubecluster"
	"github.com/meshvol/meshvol/internal/localcluster"
	"github.com/meshvol/meshvol/pkg/agent"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
	"github.com/meshvol/meshvol/pkg/csi"
	"github.com/meshvol/meshvol/pkg/drbd/drbdsim"
	"github.com/meshvol/meshvol/pkg/pluginreg"
)

// The sandbox's node-loss timings (see Start).
const (
	AgentLeaseDuration = 6 * time.Second
	AgentRenewInterval = 2 * time.Second
	AgentGracePeriod   = 3 * time.Second
)

// Options shape a sandbox.
type Options struct {
	// Dir holds everything (short: unix sockets live beneath it).
	Dir string
	// Nodes is the number of nodes, each in its own zone. Default 3.
	Nodes int
	// BinDir holds the Kubernetes binaries and sidecars; empty means bin/k8s.
	BinDir string
	// PauseBinary is the static pause program (kubecluster.BuildPause).
	PauseBinary string
	// WaitForLock waits for another cluster on the machine to end instead
	// of failing with kubecluster.ErrBusy.
	WaitForLock bool
	// TaintLostNodes turns on the controller's out-of-service taint of lost
	// nodes, which lets Kubernetes move their pods at once.
	TaintLostNodes bool
	// Progress receives a line per stage; nil discards.
	Progress io.Writer
	// Log receives the meshvol components' logs; the zero Logger discards.
	Log logr.Logger
	// Image is the meshvol image (the OCI archive `make image` builds):
	// set, the sandbox installs meshvol with `helm install` of the chart
	// on nodes with namespaces of their own (installed.go); empty, it runs
	// meshvol's components in this process (internal/localcluster).
	Image string
	// StandIns is the static drbd-utils stand-in program
	// (internal/drbdsimd/drbdutils) the installed sandbox gives every node.
	StandIns string
	// Chart is the chart's directory; empty means charts/meshvol.
	Chart string
	// Images are more OCI archives imported into every node's containerd,
	// for pods other than meshvol's (the upstream test images of
	// `make conformance`).
	Images []string
}

// Sandbox is a running sandbox.
type Sandbox struct {
	Kube *kubecluster.Cluster
	// Mesh is the in-process meshvol (Options.Image empty); nil when
	// installed.
	Mesh *localcluster.Cluster
	// Sim is the machine's simulated DRBD: every node's kernel module.
	Sim *drbdsim.Cluster
	// Namespace holds meshvol's Secrets, Leases and CSIStorageCapacity
	// objects.
	Namespace string
	// Client is an uncached client of the apiserver.
	Client client.Client
	// ControllerSocket is the CSI controller service's socket.
	ControllerSocket string

	opts     Options
	ctx      context.Context
	cancel   context.CancelFunc
	ctrlCSI  *goproc.Proc
	nodes    map[string]*nodeServices
	sidecars []*sidecar
	simd     *drbdsimd.Service
	// resizerDone closes when the sandbox's resizer (resizer.go) ended.
	resizerDone <-chan struct{}
	// stopClock stops the simulator's real-time clock and waits for it.
	stopClock func()
	clockDone chan struct{}
	stopOnce  sync.Once
	stopErr   error
	// logFile is the log FromTree opened; closed last at Stop.
	logFile *os.File
}

// nodeServices are what runs for one kubelet node in the sandbox process
// beside its agent: the CSI node service and the registration socket.
type nodeServices struct {
	Socket string
	csi    *goproc.Proc
	reg    *goproc.Proc
}

func (s *Sandbox) progress(format string, args ...any) {
	if s.opts.Progress != nil {
		fmt.Fprintf(s.opts.Progress, format+"\n", args...)
	}
}

// Start brings the sandbox up; on failure it tears down what it started.
func Start(ctx context.Context, opts Options) (s *Sandbox, err error) {
	if opts.Nodes <= 0 {
		opts.Nodes = 3
	}
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	// The controller and agents log through controller-runtime's logger,
	// which is process-wide and takes only the first one it is given.
	ctrllog.SetLogger(opts.Log)
	s = &Sandbox{opts: opts, nodes: map[string]*nodeServices{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			if stopErr := s.Stop(); stopErr != nil {
				err = fmt.Errorf("%w (and tearing down: %v)", err, stopErr)
			}
			s = nil
		}
	}()

	var specs []kubecluster.NodeSpec
	for i := 1; i <= opts.Nodes; i++ {
		specs = append(specs, kubecluster.NodeSpec{Name: fmt.Sprintf("node-%d", i), Zone: "zone-" + string(rune('a'+i-1))})
	}
	if opts.Image != "" {
		s.Namespace = ReleaseNamespace
		return s, s.startInstalled(ctx, specs)
	}
	began := time.Now()
	s.Kube, err = kubecluster.Start(ctx, s.clusterOptions(specs))
	if err != nil {
		return s, err
	}
	s.Client = s.Kube.Env.Client
	s.progress("sandbox: Kubernetes up (control plane, kube-controller-manager, kube-scheduler, %d kubelets Ready) in %s",
		len(specs), (time.Since(began) - s.Kube.LockWait).Round(time.Millisecond))

	began = time.Now()
	taint := opts.TaintLostNodes
	log := opts.Log
	s.Mesh, err = localcluster.Start(ctx, localcluster.Options{
		Nodes:        opts.Nodes,
		NamePrefix:   "node",
		Zones:        opts.Nodes,
		Env:          s.Kube.Env,
		Dir:          filepath.Join(opts.Dir, "mesh"),
		KubeletNodes: true,
		// A Primary's device is a real block device whose writes reach
		// its peers before they complete: what the pods mount.
		LoopDevices: true,
		// Node loss decided as the chart's defaults decide it (a 6 s
		// Lease renewed every 2 s, a 3 s grace period: docs/controller.md,
		// "Detection"), and the lost node's pods freed at once.
		Controller: localcluster.Controller(controller.Options{TaintLostNodes: taint, DeleteLostPods: true, AgentGracePeriod: AgentGracePeriod}),
		Agent: func(c *agent.Config) {
			c.LeaseDuration, c.RenewInterval = AgentLeaseDuration, AgentRenewInterval
		},
		Log: log,
	})
	if err != nil {
		return s, err
	}
	s.Namespace, s.Sim = s.Mesh.Namespace, s.Mesh.Sim
	// The pool first, so its free space is reported by the time
	// external-provisioner first asks GetCapacity (else it publishes
	// zeros and corrects them only at its next poll).
	if _, err := s.Mesh.CreatePool(ctx, PoolName); err != nil {
		return s, err
	}
	if err := createObjects(ctx, s.Client); err != nil {
		return s, err
	}
	s.progress("sandbox: meshvol controller and %d agents on drbdsim nodes up in %s", opts.Nodes, time.Since(began).Round(time.Millisecond))

	began = time.Now()
	s.ControllerSocket = filepath.Join(opts.Dir, "csi-controller.sock")
	cfg := rest.CopyConfig(s.Kube.Env.Config)
	s.ctrlCSI = goproc.Start(s.ctx, func(ctx context.Context) error {
		return csi.RunController(ctx, csi.ControllerOptions{
			Endpoint:  "unix://" + s.ControllerSocket,
			Config:    cfg,
			Scheme:    s.Kube.Env.Scheme,
			Namespace: s.Mesh.Namespace,
			Log:       log,
		})
	})
	for _, n := range s.Kube.Nodes {
		if err := s.startNodeServices(n); err != nil {
			return s, err
		}
	}
	if err := s.waitCSINodes(ctx); err != nil {
		return s, err
	}
	if err := s.startResizerFor(s.ctx); err != nil {
		return s, err
	}
	s.progress("sandbox: CSI node services registered with every kubelet in %s", time.Since(began).Round(time.Millisecond))

	began = time.Now()
	if err := s.waitPoolCapacity(ctx); err != nil {
		return s, err
	}
	kc, err := s.Kube.WriteKubeconfig("csi-sidecars.kubeconfig", "system:serviceaccount:meshvol-system:csi-sidecars", "system:masters")
	if err != nil {
		return s, err
	}
	if s.sidecars, err = startSidecars(s.Kube.BinDir, kc, s.ControllerSocket, filepath.Join(opts.Dir, "logs"), s.Mesh.Namespace); err != nil {
		return s, err
	}
	time.Sleep(time.Second)
	if sc := exitedSidecar(ctx, s.sidecars); sc != nil {
		return s, fmt.Errorf("sandbox: %s exited at start; see %s", sc.name, filepath.Join(opts.Dir, "logs", sc.name+".log"))
	}
	s.progress("sandbox: CSIDriver %s, storage classes %s; external-provisioner and external-attacher running in %s",
		v1.CSIDriverName, strings.Join(classNames(), ", "), time.Since(began).Round(time.Millisecond))
	began = time.Now()
	caps, err := s.waitCapacities(ctx)
	if err != nil {
		if sc := exitedSidecar(ctx, s.sidecars); sc != nil {
			err = fmt.Errorf("%w (%s exited)", err, sc.name)
		}
		return s, err
	}
	s.progress("sandbox: storage capacity published (the largest volume the scheduler admits per node) in %s: %s",
		time.Since(began).Round(time.Millisecond), describeCapacities(caps))
	return s, nil
}

// clusterOptions are the Kubernetes cluster's options for the given nodes,
// both ways: the installed sandbox adds the nodes' namespaces, their
// preparation and the images to them.
func (s *Sandbox) clusterOptions(specs []kubecluster.NodeSpec) kubecluster.Options {
	return kubecluster.Options{
		Dir:         s.opts.Dir,
		Nodes:       specs,
		BinDir:      s.opts.BinDir,
		PauseBinary: s.opts.PauseBinary,
		WaitForLock: s.opts.WaitForLock,
		Log:         s.opts.Progress,
		Images:      s.opts.Images,
	}
}

func classNames() []string {
	var n []string
	for _, sc := range storageClasses {
		n = append(n, sc.name)
	}
	return n
}

// startNodeServices starts the CSI node service of kubelet node n on the
// socket a DaemonSet would use (<kubelet root>/plugins/<driver>/csi.sock),
// and registers it with that kubelet.
func (s *Sandbox) startNodeServices(n *kubecluster.Node) error {
	dir := n.PluginDir(v1.CSIDriverName)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	ns := &nodeServices{Socket: filepath.Join(dir, "csi.sock")}
	cfg := rest.CopyConfig(s.Kube.Env.Config)
	zone, name := n.Zone, n.Name
	ns.csi = goproc.Start(s.ctx, func(ctx context.Context) error {
		return csi.RunNode(ctx, csi.NodeOptions{
			Endpoint: "unix://" + ns.Socket,
			Config:   cfg,
			Scheme:   s.Kube.Env.Scheme,
			NodeName: name,
			Zone:     zone,
			Log:      s.opts.Log.WithValues("node", name),
		})
	})
	// The kubelet calls NodeGetInfo as soon as the registration socket
	// appears: register once the CSI socket answers.
	if err := waitSocket(s.ctx, ns.Socket, ns.csi); err != nil {
		return fmt.Errorf("sandbox: the CSI node service of %s: %w", name, err)
	}
	reg, err := pluginreg.Listen(pluginreg.Options{Dir: n.PluginsRegistryDir(), DriverName: v1.CSIDriverName, Endpoint: ns.Socket})
	if err != nil {
		return err
	}
	ns.reg = goproc.Start(s.ctx, reg.Serve)
	s.nodes[n.Name] = ns
	return nil
}

// waitSocket waits until a unix socket accepts connections, or its server
// ended.
func waitSocket(ctx context.Context, path string, server *goproc.Proc) error {
	deadline := time.Now().Add(time.Minute)
	for {
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil
		}
		if server.Exited() {
			return fmt.Errorf("ended before serving %s: %v", path, server.Err())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s does not accept connections after a minute", path)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// NodeSocket is the CSI node service socket of a node.
func (s *Sandbox) NodeSocket(node string) string {
	if ns := s.nodes[node]; ns != nil {
		return ns.Socket
	}
	if kn := s.Kube.Node(node); kn != nil && s.simd != nil {
		// The node pod's socket, in the node's kubelet directory.
		return filepath.Join(kn.PluginDir(v1.CSIDriverName), "csi.sock")
	}
	return ""
}

// waitCSINodes waits until every kubelet lists the driver in its CSINode.
func (s *Sandbox) waitCSINodes(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		missing := []string{}
		for _, n := range s.Kube.Nodes {
			var cn storagev1.CSINode
			ok := false
			if err := s.Client.Get(ctx, client.ObjectKey{Name: n.Name}, &cn); err == nil {
				for _, d := range cn.Spec.Drivers {
					ok = ok || d.Name == v1.CSIDriverName
				}
			}
			if !ok {
				missing = append(missing, n.Name)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		for name, ns := range s.nodes {
			if ns.csi.Exited() {
				return fmt.Errorf("sandbox: the CSI node service of %s ended: %v", name, ns.csi.Err())
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox: the kubelets of %v did not register %s within 2 minutes (see their logs under %s)", missing, v1.CSIDriverName, s.opts.Dir)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// CrashNode crashes a node as a power loss would: its kubelet, containerd,
// shims and containers (kubecluster), its CSI node service and
// registration socket, its agent and its drbdsim node (localcluster), all
// at once.
func (s *Sandbox) CrashNode(name string) error {
	kn := s.Kube.Node(name)
	if kn == nil {
		return fmt.Errorf("sandbox: no node %q", name)
	}
	var wg sync.WaitGroup
	var kubeErr, meshErr error
	wg.Add(2)
	go func() { defer wg.Done(); kubeErr = kn.Crash() }()
	go func() {
		defer wg.Done()
		if s.Mesh != nil {
			meshErr = s.Mesh.CrashNode(name)
			return
		}
		// Its kernel goes with it: the socket first, so nothing on the
		// node reaches it meanwhile.
		s.simd.Stop(name)
		s.Sim.Node(name).Crash()
	}()
	if ns := s.nodes[name]; ns != nil {
		_ = ns.csi.Stop()
		_ = ns.reg.Stop()
	}
	wg.Wait()
	return errors.Join(kubeErr, meshErr)
}

// Stop tears everything down in the order that leaves nothing behind: the
// kubelets and their containers first (nothing uses a volume any more, and
// their mounts are undone), then the sidecars and CSI services, then
// meshvol's controller, agents and simulated devices (loop devices, files),
// then the control plane and the host clean-up, which checks that nothing
// is left.
func (s *Sandbox) Stop() error {
	s.stopOnce.Do(func() { s.stopErr = s.stop() })
	return s.stopErr
}

func (s *Sandbox) stop() error {
	var errs []error
	if s.Kube != nil {
		errs = append(errs, s.Kube.StopNodes())
	}
	stopSidecars(s.sidecars)
	for _, ns := range s.nodes {
		errs = append(errs, ns.reg.Stop())
		ns.csi.Cancel()
	}
	// A CSI node call can be stuck in the kernel on a simulated DRBD
	// device (an fsync while the Primary has no quorum and suspends I/O),
	// and its service waits for it. The kubelets are gone and the
	// volumes' users with them: crashing the simulated nodes fails such
	// I/O as a dead disk would, so the teardown goes on.
	deadline := time.After(10 * time.Second)
	for name, ns := range s.nodes {
		select {
		case <-ns.csi.Done():
			continue
		case <-deadline:
		}
		s.progress("sandbox: the CSI node service of %s is stuck in a call at teardown; crashing every drbdsim node to end its I/O", name)
		if s.Mesh != nil {
			for _, n := range s.Mesh.Nodes {
				n.Sim.Crash()
			}
		}
		break
	}
	for _, ns := range s.nodes {
		errs = append(errs, ns.csi.Stop())
	}
	if s.ctrlCSI != nil {
		errs = append(errs, s.ctrlCSI.Stop())
	}
	if s.simd != nil {
		// The node pods are gone with the kubelets (and their mounts with
		// the nodes' namespaces): the simulated kernels go next, as the
		// machines' power would take them — crashed first, so a device
		// request still waiting in the simulator (I/O suspended without
		// quorum) fails with EIO instead of holding the FUSE server, whose
		// unmount waits for it.
		if s.Kube != nil {
			for _, n := range s.Kube.Nodes {
				s.Sim.Node(n.Name).Crash()
			}
		}
		errs = append(errs, s.simd.Close())
		s.stopClock()
		errs = append(errs, s.Sim.Close())
		errs = append(errs, s.detachPoolLoops())
	}
	if s.Mesh != nil {
		errs = append(errs, s.Mesh.Stop())
		if left := s.Mesh.Leftovers(); len(left) > 0 {
			errs = append(errs, fmt.Errorf("sandbox: left behind: %s", strings.Join(left, "; ")))
		}
	}
	s.cancel()
	if s.resizerDone != nil {
		<-s.resizerDone
	}
	if s.Kube != nil {
		errs = append(errs, s.Kube.Stop())
	}
	if s.logFile != nil {
		errs = append(errs, s.logFile.Close())
	}
	return errors.Join(errs...)
}
