package controller

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// The snapshot reconciler drives a ReplicatedVolumeSnapshot through its phases
// (docs/snapshots.md, "How a snapshot is taken"): it chooses the participants, opens an
// attempt with a deadline, moves on when every agent has reported its part, and aborts
// an attempt that outlives its deadline. The agents do the work on their nodes.

func (c *Controller) setupSnapshot(mgr ctrl.Manager) error {
	byVolume := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		name := o.GetName()
		if rvr, ok := o.(*v1.ReplicatedVolumeReplica); ok {
			name = rvr.Spec.ReplicatedVolumeName
		}
		return c.snapshotsOf(ctx, name)
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("snapshot").
		For(&v1.ReplicatedVolumeSnapshot{}).
		Watches(&v1.ReplicatedVolume{}, byVolume).
		Watches(&v1.ReplicatedVolumeReplica{}, byVolume).
		Complete(reconcile.Func(c.reconcileSnapshot))
}

// snapshotsOf lists the snapshots of a volume that are not settled yet (a settled one
// does not read its volume any more).
func (c *Controller) snapshotsOf(ctx context.Context, volume string) []reconcile.Request {
	var list v1.ReplicatedVolumeSnapshotList
	if err := c.reader.List(ctx, &list, client.MatchingFields{indexVolume: volume}, client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		if s := &list.Items[i]; s.DeletionTimestamp != nil || !snapshotSettled(s.Status.Phase) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(s)})
		}
	}
	return out
}

func snapshotSettled(p v1.SnapshotPhase) bool {
	return p == v1.SnapshotReady || p == v1.SnapshotFailed
}

func (c *Controller) reconcileSnapshot(ctx context.Context, req reconcile.Request) (ctrl.Result, error) {
	rvs := &v1.ReplicatedVolumeSnapshot{}
	if err := c.reader.Get(ctx, req.NamespacedName, rvs); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if rvs.DeletionTimestamp != nil {
		return ctrl.Result{}, c.releaseSnapshot(ctx, rvs)
	}
	if !controllerutil.ContainsFinalizer(rvs, v1.FinalizerController) {
		err := applyFinalizer(ctx, c.client, "ReplicatedVolumeSnapshot", rvs.Name, rvs.ResourceVersion)
		return ctrl.Result{}, ignoreStale(err)
	}
	now := c.opts.Now()
	st := rvs.Status.DeepCopy()
	st.Nodes = nil // the agents' entries: never written by this manager
	var retry time.Duration
	var err error
	switch st.Phase {
	case "", v1.SnapshotPending:
		retry, err = c.startAttempt(ctx, rvs, st, now)
	case v1.SnapshotSuspending, v1.SnapshotSnapshotting:
		retry = advanceAttempt(rvs, st, now, c.opts.SnapshotSuspendTimeout)
	case v1.SnapshotAborting:
		retry = finishAbort(rvs, st, now, c.opts.SnapshotSuspendTimeout)
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	mine := rvs.Status.DeepCopy()
	mine.Nodes = nil
	if !equality.Semantic.DeepEqual(mine, st) {
		if err := applyStatus(ctx, c.client, "ReplicatedVolumeSnapshot", rvs.Name, rvs.ResourceVersion, st); err != nil {
			return ctrl.Result{}, ignoreStale(err)
		}
	}
	return ctrl.Result{RequeueAfter: retry}, nil
}

// startAttempt opens the next attempt once the volume has an UpToDate Diskful replica
// and no datamesh transition in flight (a member joining or attaching mid-snapshot would
// not be suspended); or fails the snapshot for good when it cannot be taken.
func (c *Controller) startAttempt(ctx context.Context, rvs *v1.ReplicatedVolumeSnapshot, st *v1.ReplicatedVolumeSnapshotStatus, now time.Time) (time.Duration, error) {
	const wait = 2 * time.Second
	st.Phase = v1.SnapshotPending
	rv := &v1.ReplicatedVolume{}
	if err := c.reader.Get(ctx, client.ObjectKey{Name: rvs.Spec.ReplicatedVolumeName}, rv); err != nil {
		if !kerrors.IsNotFound(err) {
			return 0, err
		}
		st.Phase, st.Message = v1.SnapshotFailed, fmt.Sprintf("volume %q does not exist", rvs.Spec.ReplicatedVolumeName)
		return 0, nil
	}
	if rv.DeletionTimestamp != nil {
		st.Phase, st.Message = v1.SnapshotFailed, fmt.Sprintf("volume %q is being deleted", rv.Name)
		return 0, nil
	}
	cfg := rv.Status.Configuration
	if cfg == nil {
		st.Message = "waiting for the volume's configuration"
		return wait, nil
	}
	rsp := &v1.ReplicatedStoragePool{}
	if err := c.reader.Get(ctx, client.ObjectKey{Name: cfg.StoragePool}, rsp); err != nil {
		if !kerrors.IsNotFound(err) {
			return 0, err
		}
		st.Message = fmt.Sprintf("waiting for storage pool %q", cfg.StoragePool)
		return wait, nil
	}
	if why := v1.SnapshotUnsupported(rsp.Spec.Type); why != "" {
		st.Phase = v1.SnapshotFailed
		st.Message = fmt.Sprintf("storage pool %q is of type %s, %s (docs/snapshots.md, \"Pools\")", rsp.Name, rsp.Spec.Type, why)
		return 0, nil
	}
	if n := len(rv.Status.DatameshTransitions); n > 0 {
		st.Message = fmt.Sprintf("waiting for %d datamesh transition(s) to finish (%s first)", n, rv.Status.DatameshTransitions[0].Type)
		return wait, nil
	}
	parts, err := c.participants(ctx, rv)
	if err != nil {
		return 0, err
	}
	if !slices.ContainsFunc(parts, func(p v1.SnapshotParticipant) bool { return p.Diskful }) {
		st.Message = "waiting for an UpToDate Diskful replica"
		return wait, nil
	}
	deadline := metav1.NewTime(now.Add(c.opts.SnapshotSuspendTimeout))
	st.Phase = v1.SnapshotSuspending
	st.Attempt++
	st.Participants = parts
	st.SuspendDeadline = &deadline
	st.CreationTime = nil
	size := rv.Spec.Size.DeepCopy()
	st.Size = &size
	st.StoragePool = cfg.StoragePool
	st.ReadyToUse = false
	st.Copies = nil
	st.Message = fmt.Sprintf("attempt %d: suspending IO on %d node(s)", st.Attempt, len(parts))
	return c.opts.SnapshotSuspendTimeout, nil
}

// participants are the volume's datamesh members; the UpToDate Diskful ones take a copy.
func (c *Controller) participants(ctx context.Context, rv *v1.ReplicatedVolume) ([]v1.SnapshotParticipant, error) {
	var out []v1.SnapshotParticipant
	for _, m := range rv.Status.Datamesh.Members {
		p := v1.SnapshotParticipant{NodeName: m.NodeName, ReplicaName: m.Name}
		if m.Type == v1.MemberTypeDiskful {
			rvr := &v1.ReplicatedVolumeReplica{}
			if err := c.reader.Get(ctx, client.ObjectKey{Name: m.Name}, rvr); err != nil && !kerrors.IsNotFound(err) {
				return nil, err
			}
			p.Diskful = rvr.Status.DiskState == v1.DiskStateUpToDate
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].NodeName < out[j].NodeName })
	return out, nil
}

// advanceAttempt moves Suspending to Snapshotting once every participant reports IO
// suspended, and Snapshotting to Ready once every Diskful participant reports its copy;
// past the deadline it aborts.
func advanceAttempt(rvs *v1.ReplicatedVolumeSnapshot, st *v1.ReplicatedVolumeSnapshotStatus, now time.Time, timeout time.Duration) time.Duration {
	entries := map[string]v1.SnapshotNodeStatus{}
	for _, e := range rvs.Status.Nodes {
		entries[e.NodeName] = e
	}
	var missing []string
	for _, p := range st.Participants {
		e := entries[p.NodeName]
		done := e.Attempt == st.Attempt && e.Suspended
		if st.Phase == v1.SnapshotSnapshotting {
			done = !p.Diskful || (e.Copy != nil && e.Copy.Attempt == st.Attempt)
		}
		if !done {
			missing = append(missing, p.NodeName)
		}
	}
	if len(missing) == 0 {
		if st.Phase == v1.SnapshotSuspending {
			t := metav1.NewTime(now)
			st.Phase, st.CreationTime = v1.SnapshotSnapshotting, &t
			st.Message = fmt.Sprintf("attempt %d: IO suspended everywhere; taking the copies", st.Attempt)
			return untilDeadline(st, now)
		}
		st.Phase, st.ReadyToUse = v1.SnapshotReady, true
		st.Copies = nil
		for _, p := range st.Participants {
			if p.Diskful {
				st.Copies = append(st.Copies, p.NodeName)
			}
		}
		st.SuspendDeadline = nil
		st.Message = fmt.Sprintf("%d copies", len(st.Copies))
		return 0
	}
	if st.SuspendDeadline != nil && !now.Before(st.SuspendDeadline.Time) {
		what := "suspend IO"
		if st.Phase == v1.SnapshotSnapshotting {
			what = "take a copy"
		}
		st.Phase = v1.SnapshotAborting
		st.Message = fmt.Sprintf("attempt %d aborted: %s did not %s within %s; resuming IO and deleting its copies before the next attempt",
			st.Attempt, strings.Join(missing, ", "), what, timeout)
		return timeout
	}
	return untilDeadline(st, now)
}

func untilDeadline(st *v1.ReplicatedVolumeSnapshotStatus, now time.Time) time.Duration {
	if st.SuspendDeadline == nil {
		return 0
	}
	return max(st.SuspendDeadline.Sub(now), 10*time.Millisecond)
}

// finishAbort starts the next attempt once every agent has resumed IO and deleted the
// aborted attempt's copy, or once the deadline is two timeouts past (an agent that is
// down cleans up when it returns: it resumes and deletes copies of attempts that are
// not current).
func finishAbort(rvs *v1.ReplicatedVolumeSnapshot, st *v1.ReplicatedVolumeSnapshotStatus, now time.Time, timeout time.Duration) time.Duration {
	busy := false
	for _, e := range rvs.Status.Nodes {
		if (e.Attempt == st.Attempt && e.Suspended) || (e.Copy != nil && e.Copy.Attempt == st.Attempt) {
			busy = true
		}
	}
	giveUp := st.SuspendDeadline == nil || !now.Before(st.SuspendDeadline.Add(2*timeout))
	if busy && !giveUp {
		return timeout
	}
	st.Phase = v1.SnapshotPending
	st.SuspendDeadline = nil
	return time.Millisecond
}

// releaseSnapshot removes the finalizer of a deleted snapshot once no node holds a copy
// of it or its IO suspended: each agent deletes its copy and removes its entry. The
// entry of a node that no longer exists is forgotten.
func (c *Controller) releaseSnapshot(ctx context.Context, rvs *v1.ReplicatedVolumeSnapshot) error {
	if !controllerutil.ContainsFinalizer(rvs, v1.FinalizerController) {
		return nil
	}
	for _, e := range rvs.Status.Nodes {
		if e.Copy == nil && !e.Suspended {
			continue
		}
		err := c.reader.Get(ctx, client.ObjectKey{Name: e.NodeName}, &corev1.Node{})
		if err == nil {
			return nil // that node's agent has not cleaned up yet; its status write brings us back
		}
		if !kerrors.IsNotFound(err) {
			return err
		}
	}
	err := releaseFinalizer(ctx, c.client, "ReplicatedVolumeSnapshot", rvs)
	return ignoreStale(err)
}
