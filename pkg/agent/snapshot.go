package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/storage"
)

// This node's part in snapshots (docs/snapshots.md, "How a snapshot is taken"): while
// a snapshot's attempt holds (Suspending or Snapshotting, before its deadline) a
// participant suspends IO on the volume and a Diskful one takes its copy; at any other
// time IO is resumed and only a ready snapshot's copy is kept. Each step is reported in
// this node's entry of status.nodes.

// reconcileSnapshot converges this node's part in one snapshot.
func (a *Agent) reconcileSnapshot(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	rvs := &v1.ReplicatedVolumeSnapshot{}
	if err := a.cache.Get(ctx, req.NamespacedName, rvs); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var cur v1.SnapshotNodeStatus
	found := false
	for _, e := range rvs.Status.Nodes {
		if e.NodeName == a.cfg.NodeName {
			cur, found = e, true
		}
	}
	want := *cur.DeepCopy()
	want.NodeName = a.cfg.NodeName
	want.Message = ""
	var retry time.Duration
	if p := a.participant(rvs); p != nil && holding(rvs, time.Now()) {
		retry = a.holdForSnapshot(ctx, rvs, p, &want)
	} else {
		a.releaseSnapshot(ctx, rvs, &want)
	}
	gone := rvs.DeletionTimestamp != nil && !want.Suspended && want.Copy == nil && want.Message == ""
	idle := !found && !want.Suspended && want.Copy == nil && want.Message == ""
	if idle || (found && !gone && sameEntry(want, cur)) || (gone && !found) {
		return ctrl.Result{RequeueAfter: retry}, nil
	}
	if err := a.writeSnapshotEntry(ctx, rvs.Name, want, gone); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: retry}, nil
}

func sameEntry(a, b v1.SnapshotNodeStatus) bool {
	ca, cb := a.Copy, b.Copy
	a.Copy, b.Copy = nil, nil
	return a == b && (ca == nil) == (cb == nil) && (ca == nil || *ca == *cb)
}

// holding: the snapshot's current attempt may hold IO suspended now.
func holding(rvs *v1.ReplicatedVolumeSnapshot, now time.Time) bool {
	st := &rvs.Status
	return rvs.DeletionTimestamp == nil &&
		(st.Phase == v1.SnapshotSuspending || st.Phase == v1.SnapshotSnapshotting) &&
		st.SuspendDeadline != nil && now.Before(st.SuspendDeadline.Time)
}

func (a *Agent) participant(rvs *v1.ReplicatedVolumeSnapshot) *v1.SnapshotParticipant {
	for i := range rvs.Status.Participants {
		if p := &rvs.Status.Participants[i]; p.NodeName == a.cfg.NodeName {
			return p
		}
	}
	return nil
}

// holdForSnapshot suspends IO for the attempt and, in Snapshotting, takes this node's
// copy. It returns when to look again: at the deadline, to resume on our own.
func (a *Agent) holdForSnapshot(ctx context.Context, rvs *v1.ReplicatedVolumeSnapshot, p *v1.SnapshotParticipant, want *v1.SnapshotNodeStatus) time.Duration {
	st := &rvs.Status
	volume := rvs.Spec.ReplicatedVolumeName
	if (!want.Suspended || want.Attempt != st.Attempt) && !a.userSuspended(volume) {
		if err := a.drv.SuspendIO(ctx, volume); err != nil {
			want.Message = "suspend-io: " + drbd.RedactSecrets(err.Error())
			return a.cfg.RetryInterval
		}
		a.log.Info("IO suspended for a snapshot", "snapshot", rvs.Name, "volume", volume, "attempt", st.Attempt)
	}
	want.Suspended, want.Attempt = true, st.Attempt
	if st.Phase == v1.SnapshotSnapshotting && p.Diskful && (want.Copy == nil || want.Copy.Attempt != st.Attempt) {
		if err := a.dropCopy(ctx, want); err != nil {
			want.Message = err.Error()
			return a.cfg.RetryInterval
		}
		c, err := a.takeCopy(ctx, rvs, p)
		if err != nil {
			want.Message = err.Error()
			return a.cfg.RetryInterval
		}
		want.Copy = c
	}
	return max(time.Until(st.SuspendDeadline.Time), 10*time.Millisecond)
}

// takeCopy snapshots the participant's backing volume under the attempt's name.
func (a *Agent) takeCopy(ctx context.Context, rvs *v1.ReplicatedVolumeSnapshot, p *v1.SnapshotParticipant) (*v1.SnapshotCopy, error) {
	rvr := &v1.ReplicatedVolumeReplica{}
	if err := a.cache.Get(ctx, types.NamespacedName{Name: p.ReplicaName}, rvr); err != nil {
		return nil, fmt.Errorf("replica %s: %w", p.ReplicaName, err)
	}
	if rvr.Spec.Storage == nil {
		return nil, fmt.Errorf("replica %s has no spec.storage", p.ReplicaName)
	}
	snap, err := a.snapshotter(ctx, rvr.Spec.Storage.Pool)
	if err != nil {
		return nil, err
	}
	name := v1.SnapshotCopyName(rvs.Name, rvs.Status.Attempt)
	s, err := snap.CreateSnapshot(ctx, storage.SnapshotRequest{Name: name, Replica: backingKey(rvr)})
	if err != nil {
		return nil, fmt.Errorf("snapshot of %s: %w", rvr.Name, err)
	}
	a.log.Info("snapshot copy taken", "snapshot", rvs.Name, "copy", name, "bytes", s.SizeBytes)
	return &v1.SnapshotCopy{Attempt: rvs.Status.Attempt, Pool: rvr.Spec.Storage.Pool, Name: name, SizeBytes: s.SizeBytes}, nil
}

// releaseSnapshot resumes IO this node suspended for the snapshot and deletes its copy
// unless the snapshot is ready with it.
func (a *Agent) releaseSnapshot(ctx context.Context, rvs *v1.ReplicatedVolumeSnapshot, want *v1.SnapshotNodeStatus) {
	if want.Suspended || a.userSuspended(rvs.Spec.ReplicatedVolumeName) {
		if err := a.resumeUnlessHeld(ctx, rvs.Spec.ReplicatedVolumeName); err != nil {
			want.Message = "resume-io: " + drbd.RedactSecrets(err.Error())
			return
		}
		want.Suspended = false
	}
	st := &rvs.Status
	keep := rvs.DeletionTimestamp == nil && want.Copy != nil && want.Copy.Attempt == st.Attempt &&
		(st.Phase == v1.SnapshotReady || st.Phase == v1.SnapshotSnapshotting)
	if want.Copy != nil && !keep {
		if err := a.dropCopy(ctx, want); err != nil {
			want.Message = err.Error()
		}
	}
}

// dropCopy deletes want's copy, if any, and forgets it.
func (a *Agent) dropCopy(ctx context.Context, want *v1.SnapshotNodeStatus) error {
	if want.Copy == nil {
		return nil
	}
	snap, err := a.snapshotter(ctx, want.Copy.Pool)
	if err == nil {
		err = snap.DeleteSnapshot(ctx, want.Copy.Name)
	}
	if err != nil {
		return fmt.Errorf("deleting copy %s: %w", want.Copy.Name, err)
	}
	a.log.Info("snapshot copy deleted", "copy", want.Copy.Name)
	want.Copy = nil
	return nil
}

func (a *Agent) snapshotter(ctx context.Context, pool string) (storage.Snapshotter, error) {
	p, err := a.provider(ctx, pool)
	if err != nil {
		return nil, err
	}
	s, ok := p.(storage.Snapshotter)
	if !ok {
		return nil, fmt.Errorf("storage pool %q cannot snapshot (docs/snapshots.md, \"Pools\")", pool)
	}
	return s, nil
}

// userSuspended: the kernel says IO on the volume is suspended by suspend-io.
func (a *Agent) userSuspended(volume string) bool {
	s, ok := a.obs.Snapshot(volume)
	return ok && slices.Contains(s.Suspended, "user")
}

// resumeUnlessHeld resumes IO on the volume unless a snapshot of it holds it right now.
// It is what makes every way out of a snapshot resume IO, a restarted agent's included.
func (a *Agent) resumeUnlessHeld(ctx context.Context, volume string) error {
	if a.snapshotHolds(ctx, volume) {
		return nil
	}
	if err := a.drv.ResumeIO(ctx, volume); err != nil && !errors.Is(err, drbd.ErrUnknownResource) {
		return err
	}
	a.log.Info("IO resumed", "volume", volume)
	return nil
}

// snapshotHolds: a snapshot of the volume in which this node participates holds its IO
// now. Promotion waits for it too: a member attached mid-snapshot would write unseen.
func (a *Agent) snapshotHolds(ctx context.Context, volume string) bool {
	var list v1.ReplicatedVolumeSnapshotList
	if err := a.cache.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return false
	}
	now := time.Now()
	for i := range list.Items {
		if s := &list.Items[i]; s.Spec.ReplicatedVolumeName == volume && holding(s, now) {
			return true
		}
	}
	return false
}

// writeSnapshotEntry applies this node's entry of the snapshot's status.nodes, with this
// node's own field manager; gone: the entry is removed (applied without it).
func (a *Agent) writeSnapshotEntry(ctx context.Context, name string, e v1.SnapshotNodeStatus, gone bool) error {
	status := map[string]any{}
	if !gone {
		status["nodes"] = []v1.SnapshotNodeStatus{e}
	}
	body, err := json.Marshal(map[string]any{
		"apiVersion": v1.SchemeGroupVersion.String(),
		"kind":       "ReplicatedVolumeSnapshot",
		"metadata":   map[string]any{"name": name},
		"status":     status,
	})
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(body); err != nil {
		return err
	}
	err = a.client.Status().Patch(ctx, u, client.Apply, client.FieldOwner(v1.FieldManagerAgentOf(a.cfg.NodeName)), client.ForceOwnership)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("snapshot %s status: %w", name, err)
	}
	return nil
}
