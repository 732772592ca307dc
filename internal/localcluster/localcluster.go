// Package localcluster runs a whole meshvol cluster in one process: a real
// kube-apiserver and etcd (internal/testenv), meshvol's CRDs, the controller, and
// N node agents, each with its own drbdsim node on one simulated network and
// its own file pool on loop devices under a temporary directory. The
// integration suite, csi-sanity, the sandbox and the scale benchmark build on
// it.
//
//	c, err := localcluster.Start(ctx, localcluster.Options{Nodes: 3, Zones: 3})
//	defer c.Stop()
//	pool, _ := c.CreatePool(ctx, "pool")
//	...
//	c.CrashNode("node-2") // fault hooks: crash, restart, partition, heal, fail a disk
//
// Stop leaves nothing behind: no process, no loop device, no mount, no file.
//
// Each node's file pool lives at <Dir>/<node>/<directory of the RSP>, so one
// File RSP (whose directory is the same on every node, as on a real cluster)
// maps to a private directory per simulated node.
package localcluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/testenv"
	"github.com/meshvol/meshvol/pkg/agent"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/drbdsim"
	"github.com/meshvol/meshvol/pkg/storage"
	"github.com/meshvol/meshvol/pkg/storage/file"

	"github.com/meshvol/meshvol/internal/backingclaim"
	"github.com/meshvol/meshvol/internal/goproc"
	"github.com/meshvol/meshvol/internal/loopdev"
	"github.com/meshvol/meshvol/internal/mountinfo"
)

// ControllerFunc runs the meshvol controller against cfg until ctx is done.
type ControllerFunc func(ctx context.Context, cfg *rest.Config) error

// Options shape a cluster. The zero value is three nodes (node-1 … node-3)
// without zones and no controller.
type Options struct {
	// Nodes is the number of nodes. Default 3.
	Nodes int
	// NamePrefix names the nodes <prefix>-1 … <prefix>-N; default "node".
	// Clusters sharing one control plane (Env) need different prefixes.
	NamePrefix string
	// Zones spreads the nodes round-robin over zone-a, zone-b, …; 0 means no
	// zone label at all.
	Zones int
	// Controller starts the controller. Nil runs none: the caller drives RV
	// status itself, as the agent's tests do.
	Controller ControllerFunc
	// ControllerReplicas is how many controllers run side by side (default 1);
	// with more, Controller must elect a leader (ElectedController).
	ControllerReplicas int
	// Env is a control plane to use (shared by a test package); nil starts
	// one that Stop stops.
	Env *testenv.Env
	// Dir holds the pools and drbdsim's scratch files; default a new
	// temporary directory that Stop removes.
	Dir string
	// LoopDevices makes a Primary's device a real loop device (drbdsim).
	LoopDevices bool
	// PlainFiles makes the nodes' file pools pools of plain files
	// (file.NewFiles): a replica's backing disk is its file, with no loop
	// device, which drbdsim opens as it opens a loop device. A machine then
	// holds as many replicas as files, not as many as it can have loop
	// devices (the scale benchmark, docs/scale.md); the pools' own loop
	// devices go untested.
	PlainFiles bool
	// KubeletNodes says the Node objects belong to real kubelets (the
	// sandbox): they exist already, named and zoned as this cluster's
	// nodes, and their status is the kubelets' to write. Without it the
	// cluster creates each Node and marks it Ready itself.
	KubeletNodes bool
	// ExternalAgents starts no agent: the caller runs each node's agent
	// itself, as a process of its own on the node's simulated kernel (the
	// scale benchmark's -agent-processes, docs/scale.md). Writes then counts
	// no agent's writes.
	ExternalAgents bool
	// Agent adjusts every agent's configuration (timeouts, intervals).
	Agent func(*agent.Config)
	// Log receives the agents' and controller's logs; default discard.
	Log logr.Logger
}

// Cluster is a running in-process cluster.
type Cluster struct {
	Env *testenv.Env
	// Client is an uncached client of the apiserver.
	Client client.Client
	// Sim is the simulated DRBD of every node and the network between them.
	Sim *drbdsim.Cluster
	// Namespace holds the controller's Secrets and the agents' Leases.
	Namespace string
	// Dir is the root of every node's files.
	Dir   string
	Nodes []*Node
	// Writes counts every apiserver write of the controller and the agents.
	Writes *Writes

	opts    Options
	ownEnv  bool
	ownDir  bool
	ctx     context.Context
	cancel  context.CancelFunc
	clockWG sync.WaitGroup

	mu          sync.Mutex
	controllers []*controllerReplica
}

// controllerReplica is one running controller; elected is set once it leads
// (ElectedController).
type controllerReplica struct {
	proc    *goproc.Proc
	elected atomic.Bool
}

// replicaKey carries a controller's *controllerReplica in its context.
type replicaKey struct{}

// Node is one simulated machine.
type Node struct {
	Name    string
	Zone    string
	Address netip.Addr
	// Sim is the node's DRBD.
	Sim *drbdsim.Node
	// Root is the node's private directory; pools live under it.
	Root string

	c     *Cluster
	agent *goproc.Proc
	pools sync.Map // pool name → *file.Pool
	// api is the agent's connection to the control plane (CutOff).
	api *apiGate
}

// Start brings a cluster up: control plane, namespace, Nodes, agents (and
// their Leases), and the controller when Options.Controller is set.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if opts.Nodes <= 0 {
		opts.Nodes = 3
	}
	if opts.NamePrefix == "" {
		opts.NamePrefix = "node"
	}
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	c = &Cluster{opts: opts, Namespace: v1.DefaultNamespace, Env: opts.Env, Dir: opts.Dir, Writes: &Writes{}}
	started := c // the returns below set c to nil on an error: stop what had started
	defer func() {
		if err != nil {
			_ = started.Stop()
		}
	}()
	if c.Dir == "" {
		if c.Dir, err = os.MkdirTemp("", "meshvol-localcluster-"); err != nil {
			return nil, err
		}
		c.ownDir = true
	}
	if c.Env == nil {
		if c.Env, err = testenv.Start(testenv.Options{Log: nopWriter{}}); err != nil {
			return nil, err
		}
		c.ownEnv = true
	}
	c.Client = c.Env.Client
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.Sim = drbdsim.NewCluster(drbdsim.Options{Dir: filepath.Join(c.Dir, "drbdsim"), LoopDevices: opts.LoopDevices})
	// Agents run in real time, so the simulator's clock must too (resync
	// progress is virtual-time based).
	c.clockWG.Add(1)
	go func() {
		defer c.clockWG.Done()
		c.Sim.RunClock(c.ctx, 20*time.Millisecond)
	}()

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.Namespace}}
	if err := c.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	for i := 1; i <= opts.Nodes; i++ {
		n := &Node{
			Name:    fmt.Sprintf("%s-%d", opts.NamePrefix, i),
			Address: netip.AddrFrom4([4]byte{10, 99, 0, byte(i)}),
			c:       c,
			api:     newAPIGate(),
		}
		if opts.Zones > 0 {
			n.Zone = "zone-" + string(rune('a'+(i-1)%opts.Zones))
		}
		n.Root = filepath.Join(c.Dir, n.Name)
		if err := os.MkdirAll(n.Root, 0o755); err != nil {
			return nil, err
		}
		n.Sim = c.Sim.Node(n.Name)
		if !opts.KubeletNodes {
			if err := c.createNode(ctx, n); err != nil {
				return nil, err
			}
		}
		c.Nodes = append(c.Nodes, n)
	}
	for _, n := range c.Nodes {
		if !opts.ExternalAgents {
			n.startAgent()
		}
	}
	if opts.Controller != nil {
		c.StartController()
	}
	return c, nil
}

// createNode registers the Kubernetes Node object, Ready, with its zone label.
func (c *Cluster) createNode(ctx context.Context, n *Node) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{"kubernetes.io/hostname": n.Name}}}
	if n.Zone != "" {
		node.Labels[v1.LabelZone] = n.Zone
	}
	if err := c.Client.Create(ctx, node); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			return err
		}
		if err := c.Client.Get(ctx, client.ObjectKeyFromObject(node), node); err != nil {
			return err
		}
	}
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.Address.String()}}
	return c.Client.Status().Update(ctx, node)
}

// AgentConfig is the configuration the cluster gives the node's agent.
func (n *Node) AgentConfig() agent.Config {
	cfg := agent.Config{
		NodeName:         n.Name,
		Zone:             n.Zone,
		Addresses:        []netip.Addr{n.Address},
		Namespace:        n.c.Namespace,
		Driver:           n.Sim,
		Pools:            n.pool,
		HMACAlgorithms:   []string{"sha256", "sha1", "md5"},
		VerifyAlgorithms: []string{"crc32c", "sha256"},
		Version:          "localcluster",
		CommandTimeout:   10 * time.Second,
		RetryInterval:    500 * time.Millisecond,
		ProgressInterval: 2 * time.Second,
		GCInterval:       5 * time.Second,
		Log:              n.c.opts.Log.WithName("agent"),
	}
	if n.c.opts.Agent != nil {
		n.c.opts.Agent(&cfg)
	}
	return cfg
}

// pool is the node's PoolFactory: a File RSP's directory under the node's root.
func (n *Node) pool(ctx context.Context, rsp *v1.ReplicatedStoragePool) (storage.Provider, error) {
	if rsp.Spec.Type != v1.PoolTypeFile || rsp.Spec.File == nil {
		return nil, nil // only file pools exist in a local cluster
	}
	if n.c.ctx.Err() != nil {
		// Stopped: a goroutine of an agent that outlived its manager's
		// graceful-shutdown timeout must not recreate a pool directory
		// after Stop removed the tree.
		return nil, errors.New("localcluster: the cluster is stopped")
	}
	if p, ok := n.pools.Load(rsp.Name); ok {
		return p.(*file.Pool), nil
	}
	dir := n.PoolDir(rsp)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	newPool := file.New
	if n.c.opts.PlainFiles {
		newPool = file.NewFiles
	}
	p, err := newPool(ctx, dir)
	if err != nil {
		return nil, err
	}
	n.pools.Store(rsp.Name, p)
	return p, nil
}

// PoolDir is where the node keeps the backing files of a File pool.
func (n *Node) PoolDir(rsp *v1.ReplicatedStoragePool) string {
	return filepath.Join(n.Root, filepath.Clean("/"+rsp.Spec.File.Directory))
}

func (n *Node) startAgent() {
	cfg := n.AgentConfig()
	restCfg := n.api.wrap(n.c.Writes.counted(n.c.Env.Config, "agent"))
	if restCfg.QPS == 0 {
		// The client-side rate limit `meshvol node` runs with (cmd/meshvol,
		// restConfig), not client-go's default of 5 requests per second: with
		// that, the agents' reports, not meshvol, set the pace of forming a
		// few hundred volumes at once (docs/scale.md).
		restCfg.QPS, restCfg.Burst = 50, 100
	}
	n.agent = goproc.Start(n.c.ctx, func(ctx context.Context) error {
		return agent.Run(ctx, restCfg, n.c.Env.Scheme, cfg)
	})
}

// Node returns the node called name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// named is Node for the fault methods: an unknown name is an error.
func (c *Cluster) named(name string) (*Node, error) {
	if n := c.Node(name); n != nil {
		return n, nil
	}
	return nil, fmt.Errorf("localcluster: no node %q", name)
}

// StartController starts the controllers (Options.Controller, ControllerReplicas of
// them) that are not running, and replaces any that has returned (a leader that lost
// its Lease exits, as `meshvol controller` does, and Kubernetes would restart it).
func (c *Cluster) StartController() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.opts.Controller == nil {
		return
	}
	for i, r := range c.controllers {
		if r.proc.Exited() {
			c.controllers[i] = c.startReplica()
		}
	}
	for len(c.controllers) < max(c.opts.ControllerReplicas, 1) {
		c.controllers = append(c.controllers, c.startReplica())
	}
}

// RestartExitedControllers replaces every controller whose run has returned on its own
// — a leader that lost its Lease exits, as `meshvol controller` does, and Kubernetes
// restarts the container — and returns what each returned. Unlike StartController it
// starts none where StopController left none.
func (c *Cluster) RestartExitedControllers() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var exits []error
	for i, r := range c.controllers {
		if r.proc.Exited() {
			err := r.proc.Err()
			if err == nil {
				err = errors.New("returned without an error")
			}
			exits = append(exits, err)
			c.controllers[i] = c.startReplica()
		}
	}
	return exits
}

// startReplica starts one controller; c.mu is held.
func (c *Cluster) startReplica() *controllerReplica {
	restCfg := c.Writes.counted(c.Env.Config, "controller")
	run := c.opts.Controller
	r := &controllerReplica{}
	ctx := context.WithValue(c.ctx, replicaKey{}, r)
	r.proc = goproc.Start(ctx, func(ctx context.Context) error { return run(ctx, restCfg) })
	return r
}

// StopController stops every controller and waits until they have returned.
func (c *Cluster) StopController() error {
	c.mu.Lock()
	rs := c.controllers
	c.controllers = nil
	c.mu.Unlock()
	var errs []error
	for _, r := range rs {
		errs = append(errs, r.proc.Stop())
	}
	return errors.Join(errs...)
}

// KillLeader stops the controller that leads (ElectedController) as a crash does —
// its Lease stays until it expires — and starts a new standby in its place, as
// Kubernetes restarts a crashed pod. It fails when no controller leads yet.
func (c *Cluster) KillLeader() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, r := range c.controllers {
		if r.elected.Load() {
			err := r.proc.Stop()
			c.controllers[i] = c.startReplica()
			return err
		}
	}
	return errors.New("localcluster: no controller leads (yet)")
}

// RestartAgent stops the node's agent and starts a new one; DRBD keeps
// running (the agent must adopt it).
func (c *Cluster) RestartAgent(node string) error {
	n, err := c.named(node)
	if err != nil {
		return err
	}
	err = n.agent.Stop()
	n.startAgent()
	return err
}

// StopAgent stops the node's agent; DRBD keeps running and its Lease expires.
func (c *Cluster) StopAgent(node string) error {
	n, err := c.named(node)
	if err != nil {
		return err
	}
	err = n.agent.Stop()
	n.agent = nil
	return err
}

// CrashNode stops the node hard: its agent stops and its DRBD vanishes
// without a goodbye (peers see NetworkFailure). Disks and metadata stay.
func (c *Cluster) CrashNode(node string) error {
	n, err := c.named(node)
	if err != nil {
		return err
	}
	err = n.agent.Stop()
	n.agent = nil
	n.Sim.Crash()
	return err
}

// RestartNode boots a crashed (or agent-stopped) node: DRBD starts empty,
// and a new agent brings back what the datamesh says.
func (c *Cluster) RestartNode(node string) error {
	n, err := c.named(node)
	if err != nil {
		return err
	}
	err = n.agent.Stop()
	n.Sim.Restart()
	n.startAgent()
	return err
}

// Partition cuts every link between the named nodes and the rest.
func (c *Cluster) Partition(nodes ...string) { c.Sim.Partition(nodes...) }

// Heal restores every link.
func (c *Cluster) Heal() { c.Sim.Heal() }

// FailDisk makes the backing disk of volume fail on node.
func (c *Cluster) FailDisk(node, volume string) error {
	n, err := c.named(node)
	if err != nil {
		return err
	}
	return n.Sim.FailDisk(volume)
}

// CreatePool creates a File ReplicatedStoragePool named name (directory
// /var/lib/meshvol/<name> on every node, i.e. <node root>/var/lib/meshvol/<name>).
func (c *Cluster) CreatePool(ctx context.Context, name string) (*v1.ReplicatedStoragePool, error) {
	rsp := &v1.ReplicatedStoragePool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.ReplicatedStoragePoolSpec{
			Type: v1.PoolTypeFile,
			File: &v1.FilePool{Directory: "/var/lib/meshvol/" + name},
		},
	}
	if err := c.Client.Create(ctx, rsp); err != nil {
		return nil, err
	}
	return rsp, nil
}

// CreateClass creates a ReplicatedStorageClass on pool with the given
// protection and topology.
func (c *Cluster) CreateClass(ctx context.Context, name, pool string, ftt, gmdr int32, topology v1.Topology) (*v1.ReplicatedStorageClass, error) {
	rsc := &v1.ReplicatedStorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
	rsc.Spec.StoragePool = pool
	ft, gm := ftt, gmdr
	rsc.Spec.FailuresToTolerate = &ft
	rsc.Spec.GuaranteedMinimumDataRedundancy = &gm
	rsc.Spec.Topology = topology
	if err := c.Client.Create(ctx, rsc); err != nil {
		return nil, err
	}
	return rsc, nil
}

// Stop stops the controller and every agent, takes every simulated DRBD
// resource down, deletes every backing volume (detaching its loop device),
// stops the control plane it started and removes the directory it created.
// It returns what it could not clean.
func (c *Cluster) Stop() error {
	var errs []error
	if err := c.StopController(); err != nil {
		errs = append(errs, fmt.Errorf("controller: %w", err))
	}
	for _, n := range c.Nodes {
		if err := n.agent.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("agent %s: %w", n.Name, err))
		}
		n.agent = nil
	}
	if c.cancel != nil {
		c.cancel()
	}
	c.clockWG.Wait()
	if c.Sim != nil {
		// Unmounts what a test left mounted on the Primaries' devices,
		// detaches their loop devices and stops the FUSE server.
		if err := c.Sim.Close(); err != nil {
			errs = append(errs, fmt.Errorf("drbdsim devices: %w", err))
		}
	}
	for _, n := range c.Nodes {
		// A crash closes every backing device and loop device the simulator
		// holds; the pools can then detach theirs.
		n.Sim.Crash()
		n.pools.Range(func(_, v any) bool {
			p := v.(*file.Pool)
			vols, err := p.List(context.Background())
			if err != nil {
				errs = append(errs, err)
				return true
			}
			for _, vol := range vols {
				if err := p.Delete(context.Background(), vol.Replica); err != nil {
					errs = append(errs, err)
				}
			}
			return true
		})
	}
	if left := c.Leftovers(); len(left) > 0 {
		errs = append(errs, fmt.Errorf("localcluster: left behind: %s", strings.Join(left, "; ")))
	}
	if c.ownEnv && c.Env != nil {
		if err := c.Env.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.ownDir && c.Dir != "" {
		if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Leftovers lists loop devices whose backing file is under the cluster's
// directory, and mounts under it: what a clean teardown must not leave.
func (c *Cluster) Leftovers() []string {
	var out []string
	for _, l := range loopdev.Under(c.Dir) {
		out = append(out, fmt.Sprintf("loop device %s over %s", filepath.Base(l.Dev), l.Backing))
	}
	ms, _ := mountinfo.Read()
	for _, p := range mountinfo.Under(ms, c.Dir) {
		out = append(out, "mount "+p)
	}
	sort.Strings(out)
	return out
}

// Files lists the regular files under the node's pools (backing volumes),
// without a pool of plain files' lock file of its claims, which stays
// (internal/backingclaim).
func (n *Node) Files() []string {
	var out []string
	_ = filepath.Walk(n.Root, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() && info.Name() != backingclaim.LockFile {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// Resources lists the DRBD resources the node's simulated kernel runs.
func (n *Node) Resources(ctx context.Context) ([]string, error) {
	st, err := n.Sim.Status(ctx, "all")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range st {
		out = append(out, r.Name)
	}
	return out, nil
}

// Show is the node's running configuration of a resource, nil when it does
// not run.
func (n *Node) Show(ctx context.Context, res string) (*drbd.ShowResource, error) {
	shown, err := n.Sim.Show(ctx, res)
	if errors.Is(err, drbd.ErrUnknownResource) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for i := range shown {
		if shown[i].Resource == res {
			return &shown[i], nil
		}
	}
	return nil, nil
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }
