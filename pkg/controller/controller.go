// Package controller is meshvol's control plane: the reconcilers `meshvol controller`
// runs, thin adapters around the datamesh engine on controller-runtime.
//
//   - volume (volume.go): per RV, read the RV, its RVRs and RVAs, the class, the pool
//     and the nodes from the informer caches, run datamesh.Engine.Process, write the RV
//     status when it changed, act on Result.Wanted through placement, write each RVA's
//     status; allocation, the shared Secret, liveness marks and deletion live beside it.
//   - pool (pool.go): per RSP, status.eligibleNodes from Nodes and agent Leases.
//   - node lifecycle (lifecycle.go): per node, wakes the volumes and pools when an agent
//     Lease expires, and (opt-in) taints a lost node out-of-service.
//
// In a process of your own (the sandbox, an integration test):
//
//	err := controller.Run(ctx, cfg, controller.Options{Namespace: ns}) // until ctx ends
//
// or controller.NewManager(cfg, opts, controller.ManagerOptions{...}) for a manager to
// start yourself,
// or, with a manager you built (its cache must restrict Secrets and Leases to the
// namespace: use CacheOptions), controller.Setup(mgr, opts), after CheckCRDs (the
// managers of Run and NewManager check the installed CRDs before they start).
package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	goruntime "runtime"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh"
)

// Options configure the reconcilers. The zero value of each field means its default.
type Options struct {
	// Namespace holds the cluster key's Secret (and the Secrets of volumes formed
	// before it), and the agents' Leases
	// (default v1alpha1.DefaultNamespace).
	Namespace string
	// AgentGracePeriod is how long past its expiry an agent Lease may stay unrenewed
	// before the node's replicas are marked AgentReady=False and may be force-removed
	// (default 10 s).
	AgentGracePeriod time.Duration
	// PortMin..PortMax is the DRBD TCP port range (default 7000-7999), MinorMin..MinorMax
	// the device minor range (default 1000-1048575). A port is unique on its node (one per
	// member), a minor across the cluster (one per volume).
	PortMin, PortMax   int32
	MinorMin, MinorMax int32
	// HMACAlgorithms is the preference list for DRBD's cram-hmac-alg (default sha256,
	// sha1, md5): a volume gets the first that the pool's nodes offer.
	HMACAlgorithms []string
	// TaintLostNodes applies node.kubernetes.io/out-of-service=nodeshutdown:NoExecute to
	// a node meshvol decided is lost, and removes it once the node is back and clean
	// (docs/controller.md, "--taint-lost-nodes": read the safety argument first).
	TaintLostNodes bool
	// DeleteLostPods force-deletes, on a node meshvol decided is lost, the pods that use
	// meshvol volumes and the node's meshvol VolumeAttachments, once every such volume's
	// survivors hold quorum without the node (docs/controller.md, "--delete-lost-pods").
	DeleteLostPods bool
	// SnapshotSuspendTimeout bounds how long a snapshot attempt may hold a volume's IO
	// suspended (default 10 s; docs/snapshots.md, "The guarantee").
	SnapshotSuspendTimeout time.Duration
	// Workers is the number of concurrent volume reconciles (default 4 here;
	// `meshvol controller` and the chart default to 16: docs/scale.md, "Tenth pass").
	Workers int
	// Features are the DRBD features the engine may use.
	Features datamesh.Features
	// Now is the clock (default time.Now); tests move it.
	Now func() time.Time
	// OnWrite, when set, is called after every apiserver write the reconcilers make
	// (tests count them; the meshvol_controller_writes_total metric counts them always).
	OnWrite func(Write)
}

func (o *Options) defaults() {
	if o.Namespace == "" {
		o.Namespace = v1.DefaultNamespace
	}
	if o.AgentGracePeriod == 0 {
		o.AgentGracePeriod = 10 * time.Second
	}
	if o.PortMin == 0 && o.PortMax == 0 {
		o.PortMin, o.PortMax = 7000, 7999
	}
	if o.MinorMin == 0 && o.MinorMax == 0 {
		o.MinorMin, o.MinorMax = 1000, 1048575
	}
	if len(o.HMACAlgorithms) == 0 {
		o.HMACAlgorithms = []string{"sha256", "sha1", "md5"}
	}
	if o.Workers <= 0 {
		o.Workers = 4
	}
	if o.SnapshotSuspendTimeout <= 0 {
		o.SnapshotSuspendTimeout = 10 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Validate checks the options a person sets with flags.
func (o Options) Validate() error {
	o.defaults()
	var errs []error
	if o.AgentGracePeriod < 0 {
		errs = append(errs, fmt.Errorf("agent grace period: must not be negative, got %s", o.AgentGracePeriod))
	}
	if o.PortMin < 1 || o.PortMax > 65535 || o.PortMin > o.PortMax {
		errs = append(errs, fmt.Errorf("port range %d-%d: must be within 1-65535, low end first", o.PortMin, o.PortMax))
	}
	if o.MinorMin < 0 || o.MinorMax > 1048575 || o.MinorMin > o.MinorMax {
		errs = append(errs, fmt.Errorf("minor range %d-%d: must be within 0-1048575, low end first", o.MinorMin, o.MinorMax))
	}
	for _, a := range o.HMACAlgorithms {
		switch a {
		case "sha256", "sha1", "md5":
		default:
			errs = append(errs, fmt.Errorf("HMAC algorithm %q: must be one of sha256, sha1, md5 (the values status.datamesh.sharedSecret.algorithm accepts)", a))
		}
	}
	return errors.Join(errs...)
}

// ManagerOptions are the process-level settings NewManager passes to controller-runtime.
type ManagerOptions struct {
	Scheme *runtime.Scheme
	// MetricsAddr serves Prometheus metrics ("0" turns it off, the default here).
	MetricsAddr string
	// ProbeAddr serves /healthz and /readyz ("" turns it off).
	ProbeAddr string
	// PprofAddr serves Go's /debug/pprof/ ("" turns it off, the default), with the
	// block and mutex profiles sampling: docs/scale.md profiles the controller so.
	PprofAddr string
	// LeaderElection elects one active controller through a Lease named
	// LeaderElectionID in Options.Namespace.
	LeaderElection   bool
	LeaderElectionID string
	// LeaseDuration, RenewDeadline and RetryPeriod time the election (zero:
	// controller-runtime's 15 s, 10 s and 2 s). A new leader takes over
	// LeaseDuration to LeaseDuration + 4.4 RetryPeriod after the old one's last
	// renewal (client-go's candidates try RetryPeriod to 2.2 RetryPeriod apart,
	// once to see that renewal and once to find the Lease expired); the old one
	// stops leading at most RetryPeriod + RenewDeadline after its last renewal,
	// before the Lease can pass on (docs/controller.md, "Detection").
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// KeepLeaseOnStop keeps the Lease when the manager's context ends, as a
	// crashed leader does: the next leader waits for it to expire. Without it the
	// leader steps down at once (a SIGTERM). Tests of a leader's crash set it.
	KeepLeaseOnStop bool
}

// LeaderElectionID is the default name of the controller's leader-election Lease.
const LeaderElectionID = "meshvol-controller"

// nonZero is d's address, or nil (controller-runtime's default) for zero.
func nonZero(d time.Duration) *time.Duration {
	if d == 0 {
		return nil
	}
	return &d
}

// CacheOptions restricts the cache's Secrets and Leases to the controller's namespace:
// the controller reads no other Secret, and every agent Lease lives there. The cache
// keeps no managedFields (every write is an apply or a patch built afresh, never an
// object read back, but for the update that releases a deleted object's last finalizer,
// which the apiserver gives the stored managedFields, and which deletes the object:
// finalizer.Release), and of a Node only what the controller reads: its metadata and
// spec (labels, cordon, taints), not the status a kubelet fills with images and
// conditions — the largest objects in a cluster, and one per node. Of a Secret it keeps
// the data only for the cluster key's (secretMetaExceptKey).
func CacheOptions(namespace string) cache.Options {
	if namespace == "" {
		namespace = v1.DefaultNamespace
	}
	only := map[string]cache.Config{namespace: {}}
	return cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}:        {Namespaces: only, Transform: secretMetaExceptKey},
			&coordinationv1.Lease{}: {Namespaces: only},
			&corev1.Node{}:          {Transform: nodeMetaAndSpec},
		},
	}
}

// secretMetaExceptKey is the cache's transform of a Secret: managedFields dropped, and
// the data of every Secret but the cluster key's. The controller reads only whether a
// volume's own Secret exists (to delete it with its volume), and nothing of the other
// Secrets of the namespace (Helm's releases, anyone's): it keeps no copy of a secret it
// does not need, and the memory they took (docs/scale.md, "Eighth pass: one key, no
// Secret per volume").
func secretMetaExceptKey(o any) (any, error) {
	if s, ok := o.(*corev1.Secret); ok {
		s.ManagedFields = nil
		if s.Name != v1.SecretDRBDKey {
			s.Data, s.StringData = nil, nil
		}
	}
	return o, nil
}

// nodeMetaAndSpec is the cache's transform of a Node: managedFields and status dropped.
func nodeMetaAndSpec(o any) (any, error) {
	if n, ok := o.(*corev1.Node); ok {
		n.ManagedFields = nil
		n.Status = corev1.NodeStatus{}
	}
	return o, nil
}

// NewManager builds a controller-runtime manager for cfg with the controller's
// reconcilers set up. Its Start checks first that the installed CRDs keep every field
// of this tree's, and returns that check's error (CheckCRDs) before the leader election
// or any write.
func NewManager(cfg *rest.Config, o Options, mo ManagerOptions) (ctrl.Manager, error) {
	o.defaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	scheme := mo.Scheme
	if scheme == nil {
		scheme = Scheme()
	}
	if mo.MetricsAddr == "" {
		mo.MetricsAddr = "0"
	}
	if mo.LeaderElectionID == "" {
		mo.LeaderElectionID = LeaderElectionID
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   CacheOptions(o.Namespace),
		Metrics:                 metricsserver.Options{BindAddress: mo.MetricsAddr},
		HealthProbeBindAddress:  mo.ProbeAddr,
		PprofBindAddress:        mo.PprofAddr,
		LeaderElection:          mo.LeaderElection,
		LeaderElectionID:        mo.LeaderElectionID,
		LeaderElectionNamespace: o.Namespace,
		LeaseDuration:           nonZero(mo.LeaseDuration),
		RenewDeadline:           nonZero(mo.RenewDeadline),
		RetryPeriod:             nonZero(mo.RetryPeriod),
		// Step down cleanly on SIGTERM so the next controller starts at once.
		LeaderElectionReleaseOnCancel: !mo.KeepLeaseOnStop,
		// Tests and the sandbox run a controller again in the same process (a restart);
		// controller-runtime would refuse the second manager's controller names.
		Controller: config.Controller{SkipNameValidation: &skipNameValidation},
	})
	if err != nil {
		return nil, err
	}
	if mo.PprofAddr != "" {
		// One blocking event in about every 10 µs blocked and one contended lock in
		// 100: cheap enough to leave on while profiling, enough to see a queue.
		goruntime.SetBlockProfileRate(10_000)
		goruntime.SetMutexProfileFraction(100)
	}
	if mo.ProbeAddr != "" {
		if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
			return nil, err
		}
		if err := mgr.AddReadyzCheck("caches", func(req *http.Request) error {
			if !mgr.GetCache().WaitForCacheSync(req.Context()) {
				return errors.New("informer caches not synced")
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	if _, err := Setup(mgr, o); err != nil {
		return nil, err
	}
	return checkedManager{mgr}, nil
}

var skipNameValidation = true

// Run builds a manager for cfg (no metrics or probe endpoints, no leader election) and
// runs the controller until ctx ends: the one-call form for a process that runs the
// controller beside other things (internal/localcluster's ControllerFunc, the sandbox).
func Run(ctx context.Context, cfg *rest.Config, o Options) error {
	mgr, err := NewManager(cfg, o, ManagerOptions{})
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// Controller is the set of reconcilers Setup registered.
type Controller struct {
	opts      Options
	client    client.Client // writes counted; reads from the manager's cache
	reader    client.Reader
	api       client.Reader // uncached: pods are read only for a lost node, never watched
	alloc     *Allocator
	volumes   chan event.GenericEvent
	pools     chan event.GenericEvent
	engine    *datamesh.Engine // keeps nothing between calls: shared by every worker
	allocOnce onceErr
	recorder  record.EventRecorder
	// volumeWrites and poolWrites: the status writes the caches have not shown yet
	// (and, for a volume, the release of its finalizer).
	volumeWrites ownWrites
	poolWrites   ownWrites
	// volumeStatusAt: when this controller last wrote each volume's status, which
	// paces a status that moves only progress (progressWait).
	volumeStatusAt statusTimes
	// teardowns: of each volume being torn down, when this controller began and the
	// replicas it deleted (teardownBegan, deleteReplicas).
	teardowns teardowns
	// disrupt: every agent silent at once, now or last (agentlease.Fleet).
	disrupt disruption
	// load: the replicas on each node, for placement (nodeLoads).
	load *nodeLoads
}

// Setup registers the field indexes and the reconcilers with mgr.
func Setup(mgr ctrl.Manager, o Options) (*Controller, error) {
	o.defaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	c := &Controller{
		opts:    o,
		client:  &countingClient{Client: mgr.GetClient(), scheme: mgr.GetScheme(), onWrite: o.OnWrite},
		reader:  mgr.GetClient(),
		api:     mgr.GetAPIReader(),
		alloc:   NewAllocator(o.PortMin, o.PortMax, o.MinorMin, o.MinorMax),
		volumes: make(chan event.GenericEvent, 1024),
		pools:   make(chan event.GenericEvent, 64),
		engine:  datamesh.NewEngine(nil, o.Features),
		load:    newNodeLoads(),
	}
	if err := setupIndexes(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return nil, err
	}
	if err := c.load.register(context.Background(), mgr.GetCache()); err != nil {
		return nil, err
	}
	if err := c.setupVolume(mgr); err != nil {
		return nil, err
	}
	if err := c.setupPool(mgr); err != nil {
		return nil, err
	}
	if err := c.setupLifecycle(mgr); err != nil {
		return nil, err
	}
	if err := c.setupMaintenance(mgr); err != nil {
		return nil, err
	}
	if err := c.setupStateMetrics(mgr); err != nil {
		return nil, err
	}
	if err := c.setupSnapshot(mgr); err != nil {
		return nil, err
	}
	// The cluster key is made once the controller leads (a RunnableFunc waits for
	// the election) and its caches are synced, so that a formation does not pay for
	// it; allocation makes it too if it is missing then (drbdKey).
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		if _, why, err := c.drbdKey(ctx); err != nil || why != "" {
			mgr.GetLogger().Info("the DRBD cluster key is not available yet; each new volume's allocation tries again", "why", why, "err", err)
		}
		return nil
	})); err != nil {
		return nil, err
	}
	return c, nil
}

// Field indexes: every lookup from a volume to its parts, and from a node or class
// to its volumes, is an index, never a scan or a parsed name.
const (
	indexVolume  = "spec.replicatedVolumeName"
	indexNode    = "spec.nodeName"
	indexClass   = "spec.replicatedStorageClassName"
	indexPool    = "meshvol.pool" // the pool a volume uses (resolved or manual)
	indexNodeRVA = "spec.nodeName"
	indexWaiting = "meshvol.waiting" // what a volume waits for (waitingFor)
)

func setupIndexes(ctx context.Context, fi client.FieldIndexer) error {
	idx := []struct {
		obj   client.Object
		field string
		fn    client.IndexerFunc
	}{
		{&v1.ReplicatedVolumeReplica{}, indexVolume, func(o client.Object) []string {
			return []string{o.(*v1.ReplicatedVolumeReplica).Spec.ReplicatedVolumeName}
		}},
		{&v1.ReplicatedVolumeReplica{}, indexNode, func(o client.Object) []string {
			if n := o.(*v1.ReplicatedVolumeReplica).Spec.NodeName; n != "" {
				return []string{n}
			}
			return nil
		}},
		{&v1.ReplicatedVolumeAttachment{}, indexVolume, func(o client.Object) []string {
			return []string{o.(*v1.ReplicatedVolumeAttachment).Spec.ReplicatedVolumeName}
		}},
		{&v1.ReplicatedVolumeSnapshot{}, indexVolume, func(o client.Object) []string {
			return []string{o.(*v1.ReplicatedVolumeSnapshot).Spec.ReplicatedVolumeName}
		}},
		{&v1.ReplicatedVolumeAttachment{}, indexNodeRVA, func(o client.Object) []string {
			return []string{o.(*v1.ReplicatedVolumeAttachment).Spec.NodeName}
		}},
		{&v1.ReplicatedVolume{}, indexClass, func(o client.Object) []string {
			if n := o.(*v1.ReplicatedVolume).Spec.ReplicatedStorageClassName; n != "" {
				return []string{n}
			}
			return nil
		}},
		{&v1.ReplicatedVolume{}, indexWaiting, func(o client.Object) []string {
			return waitingFor(o.(*v1.ReplicatedVolume))
		}},
		{&v1.ReplicatedVolume{}, indexPool, func(o client.Object) []string {
			rv := o.(*v1.ReplicatedVolume)
			switch {
			case rv.Status.Configuration != nil:
				return []string{rv.Status.Configuration.StoragePool}
			case rv.Spec.ManualConfiguration != nil:
				return []string{rv.Spec.ManualConfiguration.StoragePool}
			}
			return nil
		}},
	}
	for _, i := range idx {
		if err := fi.IndexField(ctx, i.obj, i.field, i.fn); err != nil {
			return fmt.Errorf("indexing %T by %s: %w", i.obj, i.field, err)
		}
	}
	return nil
}

// ensureAllocations loads the allocation tables from the cache once, before the first
// allocation: a restarted controller never hands out a value a volume already holds.
func (c *Controller) ensureAllocations(ctx context.Context) error {
	return c.allocOnce.do(func() error {
		var list v1.ReplicatedVolumeList
		if err := c.reader.List(ctx, &list); err != nil {
			return fmt.Errorf("loading port and minor allocations: %w", err)
		}
		for _, msg := range c.alloc.Load(list.Items) {
			ctrl.Log.WithName("allocation").Info("conflicting allocation in status", "conflict", msg)
		}
		return nil
	})
}
