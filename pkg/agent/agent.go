// Package agent is meshvol's node agent: it turns each volume's datamesh
// (RV status, written by the controller) into DRBD configuration on its own
// node, and reports what the kernel really runs in the status of its node's
// replicas (RVR status). docs/contract.md says who writes what.
//
// The agent drives DRBD only through drbd.Driver and backing volumes only
// through storage.Provider; it cannot tell drbd.ExecDriver from drbdsim, nor
// an LVM pool from a file pool.
//
// One Agent per node. Its pieces:
//
//   - a reconciler per RVR of its node (an informer selected by the
//     storage.meshvol.io/node label), woken by the RVR, its RV, and the events2
//     Observer: backing volume, render, apply (create-md/up/adjust), read-back,
//     day-0 sync skip, promote/demote, status;
//   - the Lease of its node with the node's facts on annotations (lease.go);
//   - a collector of DRBD resources and backing volumes that no RVR of this
//     node owns any more (gc.go).
//
// Restart is invisible to IO: nothing is taken down at start. The reconciler
// reads the kernel (show) and only adjusts what differs from the datamesh.
package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/crdschema"
	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/storage"
)

// PoolFactory returns the storage provider of a pool on this node, or
// (nil, nil) when this node does not serve the pool. Production maps an
// RSP's type to the LVM or file provider; the in-process cluster gives each
// node a file pool of its own.
type PoolFactory func(rsp *v1.ReplicatedStoragePool) (storage.Provider, error)

// Config is one node agent.
type Config struct {
	// NodeName is the node (RVR spec.nodeName, the DRBD host name).
	NodeName string
	// Zone is the node's topology zone ("" when the cluster has none).
	Zone string
	// Addresses are the node's DRBD replication addresses. Required.
	Addresses []netip.Addr
	// Namespace holds the per-volume Secrets and the agents' Leases.
	Namespace string
	// Driver is DRBD on this node.
	Driver drbd.Driver
	// Features is what the DRBD in use supports.
	Features drbd.Features
	// Pools maps a ReplicatedStoragePool to its provider on this node.
	Pools PoolFactory
	// Prerequisites, when set, returns the node prerequisites that are missing
	// (pkg/nodecheck) for the kinds of pool the node serves, published on the Lease
	// (AnnotationPrerequisites) so the controller reports the node not ready with the
	// reason. Nil: nothing checked (drbdsim nodes).
	Prerequisites func(served PoolTypes) []string
	// HMACAlgorithms and VerifyAlgorithms are what the node's kernel offers,
	// published on the Lease for the controller's choice.
	HMACAlgorithms   []string
	VerifyAlgorithms []string
	// Version is the agent's build version, published on the Lease.
	Version string

	// CommandTimeout bounds every driver call but create-md and resize.
	// Default 30 s.
	CommandTimeout time.Duration
	// SlowCommandTimeout bounds create-md and resize, whose time grows with
	// the device. Default 5 min, pkg/drbd's ExecConfig.SlowTimeout; never
	// less than CommandTimeout.
	SlowCommandTimeout time.Duration
	// LeaseDuration and RenewInterval: default 10 s and 3 s (docs/contract.md).
	LeaseDuration time.Duration
	RenewInterval time.Duration
	// ProgressInterval is the least time between two status writes that change
	// nothing but resync progress. Default 5 s.
	ProgressInterval time.Duration
	// RetryInterval is how soon a failed step (a refused demote, a failed
	// command) is tried again. Default 2 s.
	RetryInterval time.Duration
	// AttachStallTimeout is how long a disk may stay Negotiating before the
	// attach-stall watchdog cycles a connection (attachstall.go). Default 10 s.
	AttachStallTimeout time.Duration
	// StandAloneRetryInterval is how often a connection DRBD left StandAlone
	// (a refused connect, a failed authentication, a split brain) is tried
	// again with adjust. Default 30 s.
	StandAloneRetryInterval time.Duration
	// GCInterval is how often orphaned resources and volumes are looked for.
	// Default 1 min. A pass is skipped while nothing it reads has changed since
	// a pass that found nothing (runGC), up to GCFullInterval (default 10 min).
	GCInterval     time.Duration
	GCFullInterval time.Duration
	// MetricsAddr serves Prometheus metrics; "" or "0" disables them.
	MetricsAddr string
	// PprofAddr serves Go's /debug/pprof/ ("" turns it off, the default), as
	// the controller's does: docs/scale.md reads an agent's heap from it.
	PprofAddr string

	Log logr.Logger
}

func (c *Config) defaults() error {
	if c.NodeName == "" {
		return errors.New("agent: NodeName is required")
	}
	if len(c.Addresses) == 0 {
		return errors.New("agent: at least one replication address is required")
	}
	if c.Driver == nil || c.Pools == nil {
		return errors.New("agent: Driver and Pools are required")
	}
	if c.Namespace == "" {
		c.Namespace = v1.DefaultNamespace
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.CommandTimeout, 30*time.Second)
	def(&c.SlowCommandTimeout, 5*time.Minute)
	c.SlowCommandTimeout = max(c.SlowCommandTimeout, c.CommandTimeout)
	def(&c.LeaseDuration, 10*time.Second)
	def(&c.RenewInterval, 3*time.Second)
	def(&c.ProgressInterval, 5*time.Second)
	def(&c.RetryInterval, 2*time.Second)
	def(&c.GCInterval, time.Minute)
	def(&c.GCFullInterval, 10*time.Minute)
	def(&c.StandAloneRetryInterval, 30*time.Second)
	def(&c.AttachStallTimeout, defaultAttachStallTimeout)
	if c.MetricsAddr == "" {
		c.MetricsAddr = "0"
	}
	return nil
}

// Agent is a running node agent.
type Agent struct {
	cfg    Config
	log    logr.Logger
	drv    drbd.Driver // with a deadline on every call
	obs    *drbd.Observer
	client client.Client
	reader client.Reader // uncached: Secrets (get only), the Lease, a volume on a peer's departure (peerLeft)
	cache  cache.Cache

	mu      sync.Mutex
	written map[types.UID]writtenStatus
	// secrets: each volume's shared secret, by volume name, until its
	// replica here is released.
	secrets map[string]volumeSecret
	// key: the cluster key last read, which the volumes whose secret is derived
	// share (read once, not once a volume; read again when a volume names another
	// fingerprint: drbdKey).
	key     *clusterKey
	pools   map[string]poolEntry
	volumes map[types.UID]storage.Volume
	// freed: replicas retyped to a diskless type whose backing volume this agent
	// has deleted (freeBacking), so that it is not asked for again.
	freed    map[types.UID]bool
	capDirty bool // a backing volume was created or deleted since the last Lease
	// standAloneTried: when each resource's StandAlone connections were last
	// tried again (reconnectStandAlone).
	standAloneTried map[string]time.Time
	// staleQuorum: the resources whose diskless member shows quorum:no beside
	// an UpToDate peer, and when it is recomputed next (recomputeStaleQuorum).
	staleQuorum map[string]*staleQuorum
	// attachStalls: the resources whose disk is Negotiating, and what the
	// attach-stall watchdog did about it (attachstall.go); attachWake wakes it.
	attachStalls map[string]*attachStall
	attachWake   chan struct{}
	// unconfirmed: why each member that holds its volume's revision
	// unconfirmed does so, as last logged (sayUnconfirmed).
	unconfirmed *reasonLog
	// held: the replicas whose report is held back, and what it says (holdBack).
	held map[types.UID]heldReport
	// released: by name, the replicas this agent took down and released
	// (releaseReplica), until a while after the cache shows them gone (gc.go,
	// released); releasedSwept: when the marks of those gone were last forgotten.
	released      map[string]released
	releasedSwept time.Time

	// downs spaces out the take-downs refused while a device is held open.
	downs *takeDownGate
	// collectNow asks the collector for a pass now: a replica of this node
	// is gone, and what it ran may be left to take down.
	collectNow chan struct{}
	// changes counts what may leave something for the collector: the kernel's
	// changes, the reconciles of replicas, backing volumes created or deleted
	// (runGC skips a pass while it stands still).
	changes atomic.Uint64

	poolMetrics poolStats // the pools' last measured capacity, for metrics.go
}

// heldReport: since when a report of what was held back (holdBack).
type heldReport struct {
	what  string
	since time.Time
}

// volumeSecret is a volume's shared secret as read from its Secret: the
// volume's UID too, since a volume deleted and created again under the same
// name has a new Secret under the same name.
type volumeSecret struct {
	uid         types.UID
	secretName  string
	fingerprint string // of the key it is derived from; "" for a Secret of its own
	sharedValue string
}

// clusterKey is the cluster key as read from its Secret, with its fingerprint.
type clusterKey struct {
	secretName, dataKey string
	key                 []byte
	fingerprint         string
}

type writtenStatus struct {
	status v1.ReplicatedVolumeReplicaStatus
	at     time.Time
}

type poolEntry struct {
	generation int64
	p          storage.Provider
}

// Run runs the agent until ctx is done. Every piece (reconcilers, Observer,
// Lease, collector) stops when ctx is done; Run returns once the manager has
// stopped them, waiting at most 5 s for a driver call still in flight.
func Run(ctx context.Context, restCfg *rest.Config, scheme *runtime.Scheme, cfg Config) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	a := &Agent{
		cfg:     cfg,
		log:     cfg.Log.WithValues("node", cfg.NodeName),
		drv:     deadlineDriver{d: timedDriver{d: cfg.Driver}, timeout: cfg.CommandTimeout, slow: cfg.SlowCommandTimeout},
		written: map[types.UID]writtenStatus{},
		secrets: map[string]volumeSecret{},
		pools:   map[string]poolEntry{},
		volumes: map[types.UID]storage.Volume{},
		freed:   map[types.UID]bool{},
		// From a quarter of the retry interval, doubling, up to four times it:
		// the first retries catch a mount that goes soon, the later ones cost
		// a few commands a minute.
		downs:      newTakeDownGate(cfg.RetryInterval/4, 4*cfg.RetryInterval),
		collectNow: make(chan struct{}, 1),

		standAloneTried: map[string]time.Time{},
		staleQuorum:     map[string]*staleQuorum{},
		attachStalls:    map[string]*attachStall{},
		attachWake:      make(chan struct{}, 1),
		unconfirmed:     newReasonLog(),
		held:            map[types.UID]heldReport{},
		released:        map[string]released{},
	}
	mgr, err := newManager(restCfg, scheme, cfg, a.log)
	if err != nil {
		return err
	}
	// The agent applies its replicas' status whole and reads it back (a backing
	// volume's name, the revision DRBD runs), and writes its entries of snapshot status:
	// on an earlier CRD that lacks one of their fields the apiserver would drop it
	// without an error. It refuses to start so, before it writes anything
	// (docs/install.md, "Upgrading"); nothing of the manager runs yet.
	checkCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = crdschema.Check(checkCtx, mgr.GetAPIReader(), crdschema.Agent)
	cancel()
	if err != nil {
		return err
	}
	a.client = mgr.GetClient()
	a.reader = mgr.GetAPIReader()
	a.cache = mgr.GetCache()
	a.obs = drbd.NewObserver(a.cfg.Driver.Events, drbd.ObserverOptions{Log: nil, OnError: func(err error) {
		a.log.V(1).Info("events2", "err", err.Error())
	}})
	if err := a.addRunnables(mgr); err != nil {
		return err
	}
	col := newNodeCollector(cfg.NodeName, a.cacheSource, &a.poolMetrics, func(err error) { a.log.V(1).Info("metrics", "err", err.Error()) })
	// Metrics are no reason to leave a node's volumes unmanaged: an agent whose series
	// cannot be registered (another agent of the same node name in this process) runs
	// without them and says so.
	if err := metrics.Registry.Register(col); err != nil {
		a.log.Error(err, "node metrics not served")
	} else {
		defer metrics.Registry.Unregister(col)
	}
	a.log.Info("node agent starting", "addresses", cfg.Addresses, "zone", cfg.Zone)
	return mgr.Start(ctx)
}

// newManager is the agent's controller-runtime manager: a cache of this node's
// replicas only, Secrets and Leases read directly.
func newManager(restCfg *rest.Config, scheme *runtime.Scheme, cfg Config, log logr.Logger) (manager.Manager, error) {
	// On shutdown the agent lets a reconcile in flight finish its DRBD command and its
	// status write, which take seconds on a loaded node, rather than abandon them and exit
	// with an error: 20 s, inside the 30 s a pod is given to terminate by default.
	grace := 20 * time.Second
	mgr, err := ctrl.NewManager(restCfg, manager.Options{
		Scheme: scheme,
		Logger: log,
		Cache: cache.Options{
			// The agent reads no managedFields (its writes are applies and patches built
			// afresh, never an object read back), and they are a good part of each cached
			// RV and replica: an agent caches every RV of the cluster.
			DefaultTransform: cache.TransformStripManagedFields(),
			ByObject: map[client.Object]cache.ByObject{
				// Only this node's replicas (docs/contract.md: by label, never by name).
				&v1.ReplicatedVolumeReplica{}: {Label: labels.SelectorFromSet(labels.Set{v1.LabelNode: cfg.NodeName}), Transform: agentReplica},
				&v1.ReplicatedVolume{}:        {Transform: agentVolume},
			},
		},
		Client: client.Options{Cache: &client.CacheOptions{
			// Secrets and Leases are read directly: the agent may only get
			// Secrets, and caching every Secret of the namespace is not its
			// business.
			DisableFor: []client.Object{&corev1.Secret{}, &coordinationv1.Lease{}},
		}},
		Metrics:                 metricsserver.Options{BindAddress: cfg.MetricsAddr},
		PprofBindAddress:        cfg.PprofAddr,
		HealthProbeBindAddress:  "0",
		GracefulShutdownTimeout: &grace,
		Controller:              config.Controller{SkipNameValidation: drbd.Ptr(true)},
	})
	if err != nil {
		return nil, fmt.Errorf("agent: manager: %w", err)
	}
	return mgr, nil
}

// agentVolume is the cache's transform of a ReplicatedVolume: what the agent
// reads of it, and nothing else. An agent caches every volume of the cluster
// (docs/scale.md, "One agent on its own"), and of each it reads the spec, the
// datamesh, its revision and transitions, and whether it was ever Formed
// (seeding); the controller's summaries for people and tools (phase, layout,
// configuration, the replica requests, the other conditions), the annotations
// and the managedFields are never read, so they are not kept.
func agentVolume(o any) (any, error) {
	rv, ok := o.(*v1.ReplicatedVolume)
	if !ok {
		return o, nil
	}
	rv.ManagedFields = nil
	rv.Annotations = nil
	formed := meta.FindStatusCondition(rv.Status.Conditions, v1.ConditionFormed)
	rv.Status = v1.ReplicatedVolumeStatus{
		Datamesh:            rv.Status.Datamesh,
		DatameshRevision:    rv.Status.DatameshRevision,
		DatameshTransitions: rv.Status.DatameshTransitions,
	}
	if formed != nil {
		rv.Status.Conditions = []metav1.Condition{{Type: formed.Type, Status: formed.Status}}
	}
	return rv, nil
}

// agentReplica is the cache's transform of this node's replicas: the
// managedFields and the other writers' conditions (the controller's) go,
// which the agent never reads (its status comparison and its conditions'
// transition times are of its own conditions, ownedStatus).
func agentReplica(o any) (any, error) {
	rvr, ok := o.(*v1.ReplicatedVolumeReplica)
	if !ok {
		return o, nil
	}
	rvr.ManagedFields = nil
	rvr.Status.Conditions = slices.DeleteFunc(rvr.Status.Conditions, func(c metav1.Condition) bool {
		return !slices.Contains(ownedConditions, c.Type)
	})
	return rvr, nil
}

// addRunnables wires the agent's pieces into mgr: the replica reconciler
// (triggered by RVR and RV changes and by the kernel's events), the events2
// Observer, the Lease and the garbage collector of backing volumes.
func (a *Agent) addRunnables(mgr manager.Manager) error {
	// A volume's replicas are found by an index: a label selector scans every
	// replica of the node, once per event of every volume.
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1.ReplicatedVolumeReplica{}, indexVolume,
		func(o client.Object) []string {
			return []string{o.(*v1.ReplicatedVolumeReplica).Spec.ReplicatedVolumeName}
		}); err != nil {
		return fmt.Errorf("agent: indexing replicas by volume: %w", err)
	}
	kernel := make(chan event.TypedGenericEvent[string], 64)
	byVolume := handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, volume string) []reconcile.Request {
		return a.replicasOf(ctx, volume)
	})
	err := ctrl.NewControllerManagedBy(mgr).
		Named("meshvol-agent").
		For(&v1.ReplicatedVolumeReplica{}).
		Watches(&v1.ReplicatedVolume{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return a.replicasOf(ctx, o.GetName())
		}), builder.WithPredicates(predicate.TypedFuncs[client.Object]{UpdateFunc: func(e event.UpdateEvent) bool {
			return volumeUpdateWakesReplicas(e.ObjectOld, e.ObjectNew)
		}})).
		WatchesRawSource(source.Channel(kernel, byVolume)).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(reconcile.Func(a.reconcile))
	if err != nil {
		return fmt.Errorf("agent: controller: %w", err)
	}
	err = ctrl.NewControllerManagedBy(mgr).
		Named("meshvol-agent-snapshot").
		For(&v1.ReplicatedVolumeSnapshot{}).
		Complete(reconcile.Func(a.reconcileSnapshot))
	if err != nil {
		return fmt.Errorf("agent: snapshot controller: %w", err)
	}
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		return a.runObserver(ctx, kernel)
	})); err != nil {
		return err
	}
	if err := mgr.Add(manager.RunnableFunc(a.runLease)); err != nil {
		return err
	}
	if err := mgr.Add(manager.RunnableFunc(a.runAttachWatch)); err != nil {
		return err
	}
	return mgr.Add(manager.RunnableFunc(a.runGC))
}

// volumeUpdateWakesReplicas: an update of a volume reconciles its replicas on this node,
// but for a deletion mark alone of a volume that does not go (deletionMarkOnly).
func volumeUpdateWakesReplicas(old, updated client.Object) bool {
	rv, _ := updated.(*v1.ReplicatedVolume)
	return !deletionMarkOnly(old, updated) || volumeGoes(rv)
}

// deletionMarkOnly: the update of a volume only marked it deleted (its spec and the
// status the agent keeps, agentVolume, are the same). Such a mark matters to the
// volume's replicas here only when the volume goes (volumeGoes): they are taken down
// and released then, and the caller wakes them. Otherwise a member runs its revision
// until it is no longer a member or the volume goes, which a later status says, and
// only the pacing of a report reads the mark (goingAway), which the replica's next
// reconcile reads from the cache. Every agent sees every volume's mark, and a mark of
// a volume still attached somewhere wakes no replica for nothing (docs/scale.md,
// "Seventh pass").
func deletionMarkOnly(old, updated client.Object) bool {
	o, ok1 := old.(*v1.ReplicatedVolume)
	n, ok2 := updated.(*v1.ReplicatedVolume)
	if !ok1 || !ok2 || o.DeletionTimestamp != nil || n.DeletionTimestamp == nil {
		return false
	}
	return equality.Semantic.DeepEqual(o.Spec, n.Spec) && equality.Semantic.DeepEqual(o.Status, n.Status)
}

// runObserver runs the events2 Observer and turns each change into a
// reconcile of the replica of that volume.
func (a *Agent) runObserver(ctx context.Context, kernel chan<- event.TypedGenericEvent[string]) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range a.obs.Changes() {
			a.changes.Add(1)
			a.noteNegotiating(c)
			select {
			case kernel <- event.TypedGenericEvent[string]{Object: c.Resource}:
			case <-ctx.Done():
			}
		}
	}()
	err := a.obs.Run(ctx)
	<-done
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// indexVolume indexes the cached replicas by their volume.
const indexVolume = "spec.replicatedVolumeName"

// replicasOf maps a volume (RV name = DRBD resource name) to the replicas of
// this node that belong to it.
func (a *Agent) replicasOf(ctx context.Context, volume string) []reconcile.Request {
	var list v1.ReplicatedVolumeReplicaList
	if err := a.cache.List(ctx, &list, client.MatchingFields{indexVolume: volume}, client.UnsafeDisableDeepCopy); err != nil {
		a.log.Error(err, "listing replicas", "volume", volume)
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: list.Items[i].Name}})
	}
	return out
}
