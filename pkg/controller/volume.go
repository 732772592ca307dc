package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/meshvol/meshvol/pkg/agentlease"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh"
)

// Event reasons of the controller's own (the engine's come with Result.Events).
const (
	EventReplicaPlaced     = "ReplicaPlaced"
	EventPlacementFailed   = "PlacementFailed"
	EventReplicaDeleted    = "ReplicaDeleted"
	EventNodeLost          = "NodeLost"
	EventConfigurationBad  = "InvalidConfiguration"
	EventAllocationFailed  = "AllocationFailed"
	EventPhaseChanged      = "PhaseChanged"
	reasonPlaced           = "Placed"
	reasonResolved         = "Resolved"
	reasonClassNotFound    = "StorageClassNotFound"
	reasonPoolNotFound     = "StoragePoolNotFound"
	reasonInvalidInput     = "InvalidInput"
	reasonAllocated        = "Allocated"
	reasonWaitingForDetach = "WaitingForDetach"
	reasonWaitingReplicas  = "WaitingForReplicas"
)

// EventDiskFailedNotReplaced: a Diskful member's disk failed and the member may hold the
// only current copy, so nothing replaces it (phase.go lastCopyDiskEvents).
const EventDiskFailedNotReplaced = "DiskFailedNotReplaced"

// SecretName is the name of a volume's own shared-secret Secret: volumes formed before
// the cluster key have one (docs/controller.md, "Allocation and the shared secret").
func SecretName(rv string) string { return "drbd-" + rv }

func (c *Controller) setupVolume(mgr ctrl.Manager) error {
	c.recorder = mgr.GetEventRecorderFor(v1.FieldManagerController)
	return ctrl.NewControllerManagedBy(mgr).
		Named("volume").
		For(&v1.ReplicatedVolume{}).
		Watches(&v1.ReplicatedVolumeReplica{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return volumeRequest(o.(*v1.ReplicatedVolumeReplica).Spec.ReplicatedVolumeName)
		})).
		Watches(&v1.ReplicatedVolumeAttachment{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return volumeRequest(o.(*v1.ReplicatedVolumeAttachment).Spec.ReplicatedVolumeName)
		})).
		Watches(&v1.ReplicatedStorageClass{}, handler.EnqueueRequestsFromMapFunc(c.volumesOfClass)).
		Watches(&v1.ReplicatedStoragePool{}, handler.EnqueueRequestsFromMapFunc(c.volumesOfPool),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(c.volumesOfNode), builder.WithPredicates(nodeFactsChanged())).
		Watches(&coordinationv1.Lease{}, c.leaseHandler(), builder.WithPredicates(c.leaseFactsChanged())).
		// A maintenance's copied volumes tolerate one more failure while it lasts
		// (maintenanceView): an update maps its old and new lists, a deletion its last.
		Watches(&v1.ReplicatedNodeMaintenance{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			var out []reconcile.Request
			for _, name := range o.(*v1.ReplicatedNodeMaintenance).Status.CopiedVolumes {
				out = append(out, volumeRequest(name)...)
			}
			return out
		})).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(c.volumesOfSecret)).
		WatchesRawSource(source.Channel(c.volumes, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: c.opts.Workers}).
		Complete(reconcile.Func(c.reconcileVolume))
}

// volumesOfSecret maps a Secret to the volumes it concerns: a volume's own Secret to
// its volume; the cluster key's to the volumes whose allocation waits for it (drbdKey),
// so that a key restored or created by hand lets them form at once.
func (c *Controller) volumesOfSecret(ctx context.Context, o client.Object) []reconcile.Request {
	if o.GetName() != v1.SecretDRBDKey {
		return volumeRequest(o.GetLabels()[v1.LabelVolume])
	}
	var rvs v1.ReplicatedVolumeList
	if err := c.reader.List(ctx, &rvs, client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range rvs.Items {
		if cond := meta.FindStatusCondition(rvs.Items[i].Status.Conditions, v1.ConditionAllocated); cond != nil && cond.Reason == reasonNoKey {
			out = append(out, volumeRequest(rvs.Items[i].Name)...)
		}
	}
	return out
}

func volumeRequest(name string) []reconcile.Request {
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: name}}}
}

// wakeVolume asks for a reconcile of the volume from outside a watch.
func (c *Controller) wakeVolume(name string) {
	select {
	case c.volumes <- event.GenericEvent{Object: &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: name}}}:
	default:
		// The channel is full: a burst is under way and every volume in it will be
		// reconciled; the periodic resync of controller-runtime catches the rest.
	}
}

// volume is what one reconcile of a volume read from the caches.
type volume struct {
	rv       *v1.ReplicatedVolume
	rsc      *v1.ReplicatedStorageClass
	rsp      *v1.ReplicatedStoragePool
	poolName string
	// configWhy is why the configuration source does not resolve ("" when it does),
	// configReason the condition reason.
	configWhy, configReason string
	rvrs                    []*v1.ReplicatedVolumeReplica
	rvas                    []*v1.ReplicatedVolumeAttachment
	nodes                   map[string]*corev1.Node
	leases                  map[string]*coordinationv1.Lease
	// fleet: whether every agent is silent at once, or was until lately: each node's
	// Lease is judged within it (agentlease.Fleet).
	fleet agentlease.Fleet
	// away are the nodes taken down for maintenance (ReadyForMaintenance or
	// Returning): their members are never force-removed.
	away map[string]bool
	// copied: a node maintenance copies the volume elsewhere before its node goes
	// (maintenanceView): the engine is asked for one more failure to tolerate.
	copied   bool
	eligible []v1.EligibleNode
	now      time.Time
}

func (v *volume) liveness(node string) agentlease.Liveness {
	return agentlease.Judge(v.leases[node], v.now, 0)
}

// read fills a volume from the caches: its replicas and attachments, its configuration
// source and pool, the nodes and the agents' Leases, and the pool's eligible nodes.
func (c *Controller) read(ctx context.Context, rv *v1.ReplicatedVolume) (*volume, error) {
	v := &volume{rv: rv, now: c.opts.Now(), nodes: map[string]*corev1.Node{}, leases: map[string]*coordinationv1.Lease{}}
	if err := c.readReplicas(ctx, v); err != nil {
		return nil, err
	}
	var rvas v1.ReplicatedVolumeAttachmentList
	if err := c.reader.List(ctx, &rvas, client.MatchingFields{indexVolume: rv.Name}); err != nil {
		return nil, err
	}
	for i := range rvas.Items {
		v.rvas = append(v.rvas, &rvas.Items[i])
	}
	slices.SortFunc(v.rvas, func(a, b *v1.ReplicatedVolumeAttachment) int { return strings.Compare(a.Name, b.Name) })
	if err := c.readConfiguration(ctx, v); err != nil {
		return nil, err
	}
	// Every node and Lease, read in place from the cache (never modified): a pass of
	// one volume must not copy the whole cluster's nodes.
	var nodes corev1.NodeList
	if err := c.reader.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	for i := range nodes.Items {
		v.nodes[nodes.Items[i].Name] = &nodes.Items[i]
	}
	var leases coordinationv1.LeaseList
	if err := c.reader.List(ctx, &leases, client.InNamespace(c.opts.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	for i := range leases.Items {
		if n := agentlease.NodeName(&leases.Items[i]); n != "" {
			v.leases[n] = &leases.Items[i]
		}
	}
	v.fleet = c.disrupt.observe(v.leases, v.now)
	away, copied, err := c.maintenanceView(ctx)
	if err != nil {
		return nil, err
	}
	v.away, v.copied = away, copied[rv.Name]
	if v.rsp != nil {
		if v.eligible, err = EligibleNodes(v.rsp, nodes.Items, v.leases, v.now, c.opts.AgentGracePeriod); err != nil {
			v.configWhy = fmt.Sprintf("storage pool %s: %v", v.rsp.Name, err)
			v.configReason = reasonInvalidInput
		}
	}
	return v, nil
}

// readReplicas reads the volume's replicas from the cache, by name.
func (c *Controller) readReplicas(ctx context.Context, v *volume) error {
	var rvrs v1.ReplicatedVolumeReplicaList
	if err := c.reader.List(ctx, &rvrs, client.MatchingFields{indexVolume: v.rv.Name}); err != nil {
		return err
	}
	v.rvrs = nil
	for i := range rvrs.Items {
		v.rvrs = append(v.rvrs, &rvrs.Items[i])
	}
	slices.SortFunc(v.rvrs, func(a, b *v1.ReplicatedVolumeReplica) int { return strings.Compare(a.Name, b.Name) })
	return nil
}

// readConfiguration reads the volume's configuration source (its storage class unless
// it is configured by hand) and its storage pool: the published configuration's pool,
// else the manual configuration's, else the class's. One that does not exist is the
// volume's configWhy, naming the field.
func (c *Controller) readConfiguration(ctx context.Context, v *volume) error {
	rv := v.rv
	if rv.Spec.ConfigurationMode != v1.ConfigurationModeManual && rv.Spec.ReplicatedStorageClassName != "" {
		rsc := &v1.ReplicatedStorageClass{}
		switch err := c.reader.Get(ctx, types.NamespacedName{Name: rv.Spec.ReplicatedStorageClassName}, rsc); {
		case apierrors.IsNotFound(err):
			v.configWhy = fmt.Sprintf("spec.replicatedStorageClassName: storage class %q does not exist", rv.Spec.ReplicatedStorageClassName)
			v.configReason = reasonClassNotFound
		case err != nil:
			return err
		default:
			v.rsc = rsc
		}
	}
	switch {
	case rv.Status.Configuration != nil:
		v.poolName = rv.Status.Configuration.StoragePool
	case rv.Spec.ConfigurationMode == v1.ConfigurationModeManual && rv.Spec.ManualConfiguration != nil:
		v.poolName = rv.Spec.ManualConfiguration.StoragePool
	case v.rsc != nil:
		v.poolName = v.rsc.Spec.StoragePool
	}
	if v.poolName == "" {
		return nil
	}
	rsp := &v1.ReplicatedStoragePool{}
	switch err := c.reader.Get(ctx, types.NamespacedName{Name: v.poolName}, rsp); {
	case apierrors.IsNotFound(err):
		field := "spec.manualConfiguration.storagePool"
		if v.rsc != nil {
			field = "storage class " + v.rsc.Name + " spec.storagePool"
		}
		v.configWhy = fmt.Sprintf("%s: storage pool %q does not exist", field, v.poolName)
		v.configReason = reasonPoolNotFound
	case err != nil:
		return err
	default:
		v.rsp = rsp
	}
	return nil
}

// reconcileVolume is one reconcile of a volume, in the order docs/controller.md gives:
// read it and what it refers to from the caches, make sure of the finalizers, mark the
// replicas' liveness, then compute the status — the configuration, the allocation, the
// engine's step and the placement of what it wants — and publish it with the
// attachments' statuses and the lost nodes' finalizers.
func (c *Controller) reconcileVolume(ctx context.Context, req reconcile.Request) (ctrl.Result, error) {
	v, err := c.observe(ctx, req.Name)
	if v == nil || err != nil {
		return ctrl.Result{}, err
	}
	if c.volumeWrites.behind(v.rv.Name, v.rv.ResourceVersion) {
		return ctrl.Result{RequeueAfter: conflictRetry}, nil
	}
	if done, err := c.ensureFinalizers(ctx, v); done || err != nil {
		return ctrl.Result{}, err
	}
	// Liveness: AgentReady on every replica, and the engine's copies carry it.
	engineRVRs, requeue, err := c.markLiveness(ctx, v)
	if err != nil {
		return ctrl.Result{}, err
	}
	work := v.rv.DeepCopy()
	v.configuredCondition(work)
	if v.deleting() && c.readyToTearDown(v) {
		return c.tearDown(ctx, v, work)
	}
	pendingWhy, allocated, err := c.allocation(ctx, v, work)
	if err != nil {
		return ctrl.Result{}, err
	}
	var out engineOutput
	for pass := 0; pass < enginePasses && (allocated || work.Status.DatameshRevision > 0); pass++ {
		before := withoutProgress(work.Status)
		o, err := c.runEngine(ctx, v, work, engineRVRs)
		if err != nil {
			return ctrl.Result{}, c.refuseInput(ctx, v, err)
		}
		o.events = append(out.events, o.events...)
		out = o
		if v.deleting() {
			break
		}
		// Placement acts on what the engine wants.
		why, created, err := c.place(ctx, v, work, out.wanted, out.accessRefused)
		if err != nil {
			return ctrl.Result{}, err
		}
		if pendingWhy == "" {
			pendingWhy = why
		}
		// The engine runs again on what this pass made, as the next reconcile would,
		// so that one status write carries every step the inputs allow
		// (docs/controller.md, "Write budget"): after placement created replicas
		// (they are in the cache: place waited for them), or after the engine moved
		// on and wants nothing placed.
		advanced := len(out.wanted) == 0 && !equality.Semantic.DeepEqual(before, withoutProgress(work.Status))
		if !created && !advanced {
			break
		}
		if created {
			if err := c.readReplicas(ctx, v); err != nil {
				return ctrl.Result{}, err
			}
			if engineRVRs, requeue, err = c.markLiveness(ctx, v); err != nil {
				return ctrl.Result{}, err
			}
		}
	}
	if v.deleting() {
		c.deletionCondition(v, work)
	}
	c.summarize(v, work, engineRVRs, pendingWhy)
	out.events = append(out.events, lastCopyDiskEvents(v.rv, work, replicasByName(engineRVRs))...)
	return c.publish(ctx, v, work, out, requeue)
}

// observe reads the volume named name and what it refers to (volume), having rebuilt
// the allocation tables once after a start. A volume that is gone releases its minor
// and its members' ports and returns nil.
func (c *Controller) observe(ctx context.Context, name string) (*volume, error) {
	rv := &v1.ReplicatedVolume{}
	if err := c.reader.Get(ctx, types.NamespacedName{Name: name}, rv); err != nil {
		if apierrors.IsNotFound(err) {
			c.alloc.Release(name)
			c.volumeWrites.forget(name)
			c.volumeStatusAt.forget(name)
			c.teardowns.forget(name)
			return nil, nil
		}
		return nil, err
	}
	if err := c.ensureAllocations(ctx); err != nil {
		return nil, err
	}
	return c.read(ctx, rv)
}

// ensureFinalizers adds the controller's finalizer to the volume and its attachments.
// done: the reconcile ends here — the finalizer was just added (its write brings the
// next reconcile, which works from the new resourceVersion: a status written now would
// only conflict), or the volume is being deleted and is no longer ours.
func (c *Controller) ensureFinalizers(ctx context.Context, v *volume) (done bool, err error) {
	rv := v.rv
	if !slices.Contains(rv.Finalizers, v1.FinalizerController) {
		if v.deleting() {
			return true, nil
		}
		if err := ignoreStale(applyFinalizer(ctx, c.client, "ReplicatedVolume", rv.Name, rv.ResourceVersion)); err != nil {
			return true, fmt.Errorf("adding finalizer: %w", err)
		}
		return true, nil
	}
	for _, a := range v.rvas {
		if a.DeletionTimestamp == nil && !slices.Contains(a.Finalizers, v1.FinalizerController) {
			if err := ignoreStale(applyFinalizer(ctx, c.client, "ReplicatedVolumeAttachment", a.Name, a.ResourceVersion)); err != nil {
				return true, fmt.Errorf("adding finalizer to attachment %s: %w", a.Name, err)
			}
		}
	}
	return false, nil
}

// configuredCondition says whether the configuration source and its pool resolve.
func (v *volume) configuredCondition(work *v1.ReplicatedVolume) {
	if v.configWhy != "" {
		v.setCondition(work, v1.ConditionConfigured, false, v.configReason, v.configWhy)
	} else if v.poolName != "" {
		v.setCondition(work, v1.ConditionConfigured, true, reasonResolved, "Configuration resolves; storage pool "+v.poolName)
	}
}

// allocation gives the volume its minor, Secret and size before its first member
// joins (allocate), and sets the Allocated condition. allocated is false, with why, when
// something blocks it; a volume being deleted or without a resolved pool allocates
// nothing and is not held back here.
func (c *Controller) allocation(ctx context.Context, v *volume, work *v1.ReplicatedVolume) (why string, allocated bool, err error) {
	if v.poolName == "" || v.rsp == nil || v.deleting() {
		return "", true, nil
	}
	why, reason, err := c.allocate(ctx, v, work)
	if err != nil {
		return "", false, err
	}
	if why != "" {
		if v.setCondition(work, v1.ConditionAllocated, false, reason, why) {
			c.recorder.Event(v.rv, corev1.EventTypeWarning, EventAllocationFailed, why)
		}
		return why, false, nil
	}
	dm := &work.Status.Datamesh
	v.setCondition(work, v1.ConditionAllocated, true, reasonAllocated, fmt.Sprintf("DRBD minor %d, %s; each member's port on its node",
		dm.Minor, c.secretSource(dm.SharedSecret)))
	return "", true, nil
}

// secretSource says where the volume's shared secret comes from, for a person.
func (c *Controller) secretSource(ref *v1.SharedSecretReference) string {
	if ref.Derivation != "" {
		return fmt.Sprintf("shared secret derived from the key in Secret %s/%s (fingerprint %s; %s)", c.opts.Namespace, ref.SecretName, ref.KeyFingerprint, ref.Algorithm)
	}
	return fmt.Sprintf("shared secret in Secret %s/%s (%s)", c.opts.Namespace, ref.SecretName, ref.Algorithm)
}

// engineOutput is what the reconcile keeps of the engine's Result (copies: the Result's
// slices belong to the engine), and what placement adds for the attachments.
type engineOutput struct {
	wanted      []datamesh.WantedReplica
	attachments []datamesh.AttachmentStatus
	events      []datamesh.Event
	// accessRefused: node → why placement put no Access replica there.
	accessRefused map[string]string
	// lost: the members the controller fed the engine as ForceLeave (their node lost
	// and no live replica reaching them), for writeAttachments.
	lost []string
}

// invalidInputError is the engine's refusal of its input (a status written by someone
// else).
type invalidInputError struct{ err error }

func (e *invalidInputError) Error() string { return e.err.Error() }

// runEngine runs the engine's step on work, feeding it the members of lost nodes to
// force out.
func (c *Controller) runEngine(ctx context.Context, v *volume, work *v1.ReplicatedVolume, engineRVRs []*v1.ReplicatedVolumeReplica) (engineOutput, error) {
	forceLeave, forceDetach := c.lostMembers(v, engineRVRs)
	res, err := c.engine.Process(&datamesh.Input{
		RV: work, RSC: v.rsc, RVRs: engineRVRs, RVAs: v.rvas, Pool: c.enginePool(v), Now: v.now,
		ForceLeave: forceLeave, ForceDetach: forceDetach, ExtraFTT: v.extraFTT(),
	})
	if err != nil {
		return engineOutput{}, &invalidInputError{err}
	}
	log := ctrl.LoggerFrom(ctx).WithValues("rv", v.rv.Name)
	for _, n := range forceLeave {
		log.Info("replica's node is lost: force-leave", "rvr", n)
	}
	return engineOutput{wanted: res.Wanted, attachments: res.Attachments,
		events: res.Events, accessRefused: map[string]string{}, lost: forceLeave}, nil
}

// refuseInput publishes the engine's refusal of its input as Configured=False on the
// cached status (nothing else of this reconcile is written) and waits for a change.
// Other errors it returns as they are.
func (c *Controller) refuseInput(ctx context.Context, v *volume, err error) error {
	var bad *invalidInputError
	if !errors.As(err, &bad) {
		return err
	}
	work := v.rv.DeepCopy()
	if v.setCondition(work, v1.ConditionConfigured, false, reasonInvalidInput, bad.Error()) {
		c.recorder.Event(v.rv, corev1.EventTypeWarning, EventConfigurationBad, bad.Error())
	}
	return c.writeStatus(ctx, v.rv, work)
}

// publish writes the status computed for the volume (only when it changed), then the
// engine's events, the attachments' statuses and the lost nodes' finalizers.
func (c *Controller) publish(ctx context.Context, v *volume, work *v1.ReplicatedVolume, out engineOutput, requeue time.Duration) (ctrl.Result, error) {
	if wait := progressWait(v.rv, work, v.now, c.volumeStatusAt.last(v.rv.Name)); wait > 0 && len(out.events) == 0 {
		// Only progress moved, and the last status write is recent: the new
		// messages go out with the next change, or in wait.
		if requeue == 0 || wait < requeue {
			requeue = wait
		}
	} else if retry, err := c.publishStatus(ctx, v.rv, work); err != nil {
		return ctrl.Result{}, err
	} else if retry {
		return ctrl.Result{RequeueAfter: conflictRetry}, nil
	}
	if work.Status.Phase != v.rv.Status.Phase {
		phaseChanges.WithLabelValues(string(work.Status.Phase)).Inc()
		c.recordPVCEvent(ctx, work)
	}
	for _, e := range out.events {
		c.recorder.Event(v.rv, string(e.Type), e.Reason, e.Message)
	}
	if err := c.writeAttachments(ctx, v, work, out); err != nil {
		return ctrl.Result{}, err
	}
	if err := c.releaseLostFinalizers(ctx, v, work); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// publishStatus writes work's status (writeStatus). retry: the RV changed since the
// cache showed it, so the status computed here may rest on a stale revision; it is
// dropped and computed again from the new one, soon (conflictRetry).
func (c *Controller) publishStatus(ctx context.Context, rv, work *v1.ReplicatedVolume) (retry bool, err error) {
	err = c.writeStatus(ctx, rv, work)
	if apierrors.IsConflict(err) {
		return true, nil
	}
	return false, err
}

// setCondition sets condition t of the volume's status — the one way every condition of
// an RV is set — and reports whether its status, reason or message changed (events go
// out on a change, not on every reconcile).
func (v *volume) setCondition(work *v1.ReplicatedVolume, t string, ok bool, reason, msg string) bool {
	conds := &work.Status.Conditions
	old := meta.FindStatusCondition(*conds, t)
	s := boolStatus(ok)
	changed := old == nil || old.Status != s || old.Reason != reason || old.Message != msg
	meta.SetStatusCondition(conds, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg,
		ObservedGeneration: work.Generation, LastTransitionTime: metav1.NewTime(v.now)})
	return changed
}

// extraFTT: a volume copied for a node maintenance is raised, until the maintenance
// ends, to a layout that keeps quorum while one of its Diskful nodes is away
// (layout.Layout.RaisedForMaintenance; docs/operating.md, "Copying a volume elsewhere
// before its node goes").
func (v *volume) extraFTT() int {
	if v.copied {
		return 1
	}
	return 0
}

func (v *volume) deleting() bool { return v.rv.DeletionTimestamp != nil }

// memberPorts gives every member of work's datamesh its DRBD port on its node before the
// status is written, so no agent ever reads a member without one (docs/controller.md,
// "Allocation and the shared secret"). A member published before members had ports
// keeps port 0 and listens on status.datamesh.port; so does a new member that was given
// that same port. The ports of members that are in neither the status read nor the one
// written are freed. A node with no free port fails the write (placement keeps new
// replicas off such nodes, so only a race with another volume gets here): the volume
// waits, with a Warning Event that names the node and what lifts the limit.
func (c *Controller) memberPorts(rv, work *v1.ReplicatedVolume) error {
	dm := &work.Status.Datamesh
	for i := range dm.Members {
		m := &dm.Members[i]
		if m.NodeName == "" {
			continue
		}
		port, err := c.alloc.Port(rv.Name, m.Name, m.NodeName, m.Port, dm.Port)
		if err != nil {
			c.recorder.Event(rv, corev1.EventTypeWarning, EventAllocationFailed, err.Error())
			return err
		}
		if port != dm.Port {
			m.Port = port
		}
	}
	published := func(ms []v1.DatameshMember, name string) bool {
		return slices.ContainsFunc(ms, func(m v1.DatameshMember) bool { return m.Name == name })
	}
	c.alloc.RetainMembers(rv.Name, func(member string) bool {
		return published(dm.Members, member) || published(rv.Status.Datamesh.Members, member)
	})
	return nil
}

// writeStatus applies work's status if it differs from what rv (the cache) holds. The
// apply carries rv's resourceVersion: a status computed from a stale read fails with a
// Conflict instead of overwriting a newer one (two reconciles of one volume on stale
// caches must never publish two different datameshes under one revision).
func (c *Controller) writeStatus(ctx context.Context, rv, work *v1.ReplicatedVolume) error {
	if err := c.memberPorts(rv, work); err != nil {
		return err
	}
	work.Status.ObservedGeneration = rv.Generation
	if equality.Semantic.DeepEqual(rv.Status, work.Status) {
		return nil
	}
	if err := applyStatus(ctx, c.client, "ReplicatedVolume", rv.Name, rv.ResourceVersion, &work.Status); err != nil {
		return err
	}
	c.volumeWrites.wrote(rv.Name, rv.ResourceVersion)
	c.volumeStatusAt.wrote(rv.Name, c.opts.Now())
	return nil
}

// summarize computes the phase, the Ready condition and the kubectl columns.
func (c *Controller) summarize(v *volume, work *v1.ReplicatedVolume, engineRVRs []*v1.ReplicatedVolumeReplica, pendingWhy string) {
	byName := replicasByName(engineRVRs)
	if pendingWhy == "" && v.configWhy != "" {
		pendingWhy = v.configWhy
	}
	verdict := ComputePhase(work, byName, reportingAgent, pendingWhy)
	st := &work.Status
	st.Phase = verdict.Phase
	v.setCondition(work, v1.ConditionReady, verdict.Phase == v1.VolumePhaseReady, string(verdict.Phase), verdict.Message)
	formed, reason, msg := Formed(st, verdict)
	v.setCondition(work, v1.ConditionFormed, formed, reason, msg)
	st.Layout = LayoutString(st.Datamesh.Members)
	st.ReadyMembers = ReadyMembers(st.Datamesh.Members, byName, reportingAgent)
	st.SyncProgress = SyncProgress(st.Datamesh.Members, byName)
	if ok, reason, msg := FaultTolerance(st); reason != "" {
		v.setCondition(work, ConditionFaultTolerance, ok, reason, msg)
	}
}

func replicasByName(rvrs []*v1.ReplicatedVolumeReplica) map[string]*v1.ReplicatedVolumeReplica {
	byName := make(map[string]*v1.ReplicatedVolumeReplica, len(rvrs))
	for _, r := range rvrs {
		byName[r.Name] = r
	}
	return byName
}

func boolStatus(b bool) metav1.ConditionStatus {
	if b {
		return metav1.ConditionTrue
	}
	return metav1.ConditionFalse
}

// reportingAgent: the replica's AgentReady is not False.
func reportingAgent(r *v1.ReplicatedVolumeReplica) bool {
	c := meta.FindStatusCondition(r.Status.Conditions, v1.ConditionAgentReady)
	return c == nil || c.Status != metav1.ConditionFalse
}

// enginePool is the engine's view of the pool: the eligible nodes, plus the nodes of the
// volume's diskless replicas outside the pool (an Access replica goes where a workload
// runs, which need not be a storage node), ready when their agent is live.
func (c *Controller) enginePool(v *volume) *datamesh.Pool {
	if v.rsp == nil {
		return nil
	}
	p := &datamesh.Pool{Name: v.rsp.Name, Nodes: slices.Clone(v.eligible)}
	for _, e := range v.eligible {
		p.Available = p.Available || e.Ready
	}
	for _, r := range v.rvrs {
		if r.Spec.NodeName == "" || r.Spec.Type == v1.ReplicaTypeDiskful || r.Spec.Type == v1.ReplicaTypeShadowDiskful || p.FindNode(r.Spec.NodeName) != nil {
			continue
		}
		p.Nodes = append(p.Nodes, v1.EligibleNode{NodeName: r.Spec.NodeName, Zone: nodeZone(v.nodes[r.Spec.NodeName], v.leases[r.Spec.NodeName]),
			Ready: v.liveness(r.Spec.NodeName).Live})
	}
	return p
}

// applyRVR creates or updates a replica with every field the controller owns on it:
// labels, the agent's finalizer, the owner reference and the spec. The same function
// serves create and retype, so an apply never drops a field the controller set before.
// A retype passes the replica's resourceVersion, so it never recreates a replica that is
// gone. storage is applied as given: nil for a new diskless replica, the storage it had
// for a Diskful one retyped to a diskless type.
func (c *Controller) applyRVR(ctx context.Context, rv *v1.ReplicatedVolume, node string, t v1.ReplicaType, storage *v1.ReplicaStorage, resourceVersion string) error {
	u := applyObject("ReplicatedVolumeReplica", "", v1.ReplicaName(rv.Name, node), resourceVersion)
	u.SetLabels(map[string]string{v1.LabelVolume: rv.Name, v1.LabelNode: node})
	u.SetFinalizers([]string{v1.FinalizerAgent})
	u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: v1.SchemeGroupVersion.String(), Kind: "ReplicatedVolume", Name: rv.Name, UID: rv.UID}})
	spec := map[string]any{"replicatedVolumeName": rv.Name, "nodeName": node, "type": string(t)}
	if storage != nil {
		m, err := toMap(storage)
		if err != nil {
			return err
		}
		spec["storage"] = m
	}
	u.Object["spec"] = spec
	return c.client.Patch(ctx, u, client.Apply, applyOpts...)
}

// storageFor is where a Diskful replica on node keeps its backing volume.
func storageFor(rsp *v1.ReplicatedStoragePool, node string) *v1.ReplicaStorage {
	s := &v1.ReplicaStorage{Pool: rsp.Name}
	switch rsp.Spec.Type {
	case v1.PoolTypeFile:
		if rsp.Spec.File != nil {
			s.Directory = rsp.Spec.File.Directory
		}
	default:
		for _, g := range rsp.Spec.VolumeGroups {
			if g.NodeName == node {
				s.VolumeGroup, s.ThinPool = g.Name, g.ThinPool
			}
		}
	}
	return s
}

// waitForCache waits until the cache shows every replica in want (present) or shows it
// gone or deleting: the next reconcile must not act on a view without this one's
// writes (it would place a second replica for the same want). It reports whether the
// cache did within its deadline. It asks placement's node counts, which the informer
// updates after its store (nodeLoads): once they show a replica, so does the store,
// and the next placement counts it.
func (c *Controller) waitForCache(ctx context.Context, names []string, present bool) bool {
	deadline := time.Now().Add(5 * time.Second)
	for _, n := range names {
		for {
			seen, deleting := c.load.seen(n)
			if present && seen || !present && (!seen || deleting) {
				break
			}
			if !time.Now().Before(deadline) {
				return false
			}
			select {
			case <-ctx.Done():
				return false
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return true
}

// enginePasses bounds the engine's runs in one reconcile (reconcileVolume).
const enginePasses = 3

// progressInterval is the least time between two status writes of a volume that change
// nothing but its progress: the messages of its conditions, transition steps and
// replica requests, readyMembers and syncProgress. Each agent report moves a forming
// volume's messages ("1/3 replicas confirmed revision 1"), and writing each cost a write
// per replica of every volume formed, for text a person reads when a volume is stuck
// (docs/controller.md, "Write budget"); the agents pace their resync progress so too
// (docs/contract.md).
const progressInterval = 5 * time.Second

// progressWait is how long to hold back work's status: zero unless it differs from
// rv's only in progress and this controller wrote rv's status less than
// progressInterval before now (last, statusTimes; zero when it has not since it
// started).
func progressWait(rv, work *v1.ReplicatedVolume, now, last time.Time) time.Duration {
	if last.IsZero() || equality.Semantic.DeepEqual(rv.Status, work.Status) ||
		!equality.Semantic.DeepEqual(withoutProgress(rv.Status), withoutProgress(work.Status)) {
		return 0
	}
	wait := progressInterval - now.Sub(last)
	return min(max(wait, 0), progressInterval)
}

// withoutProgress is st with its progress blanked (progressWait).
func withoutProgress(st v1.ReplicatedVolumeStatus) v1.ReplicatedVolumeStatus {
	st = *st.DeepCopy()
	st.ReadyMembers, st.SyncProgress = "", ""
	for i := range st.Conditions {
		st.Conditions[i].Message = ""
	}
	for i := range st.DatameshTransitions {
		for j := range st.DatameshTransitions[i].Steps {
			st.DatameshTransitions[i].Steps[j].Message = ""
		}
	}
	for i := range st.DatameshReplicaRequests {
		st.DatameshReplicaRequests[i].Message = ""
	}
	return st
}

// conflictRetry is how soon a reconcile whose status write met a newer RV runs again.
// The watch event of that newer RV usually comes first; this is the fallback.
const conflictRetry = 100 * time.Millisecond
