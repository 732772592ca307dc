package controller

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Deleting a volume (finalizer storage.meshvol.io/controller):
//
//  1. While any attachment exists or a member is attached, the volume waits (condition
//     Deleting, reason WaitingForDetach) and the engine runs as usual, so the
//     attachments being deleted detach.
//  2. Then the datamesh is torn down in one published change: no members, no
//     transitions, one new revision. The data is being destroyed, so no membership
//     guard applies; nothing is attached, so no IO is in flight. Agents see they are no
//     longer members and take DRBD down.
//  3. Every replica is deleted; each agent removes its finalizer once DRBD is down and the
//     backing volume is gone (for a lost node the controller removes it).
//  4. When no replica is left: the Secret, the port and minor, and the finalizer.

func (c *Controller) readyToTearDown(v *volume) bool {
	if len(v.rvas) > 0 {
		return false
	}
	st := &v.rv.Status
	for _, m := range st.Datamesh.Members {
		if m.Attached {
			return false
		}
	}
	for _, t := range st.DatameshTransitions {
		switch t.Type {
		case v1.TransitionAttach, v1.TransitionDetach, v1.TransitionForceDetach:
			return false
		}
	}
	return true
}

func (c *Controller) deletionCondition(v *volume, work *v1.ReplicatedVolume) {
	var names []string
	for _, a := range v.rvas {
		names = append(names, a.Name+" (node "+a.Spec.NodeName+")")
	}
	sort.Strings(names)
	msg := "Waiting for the volume to be detached"
	if len(names) > 0 {
		msg = "Waiting for attachments to be removed: " + strings.Join(names, ", ")
	}
	v.setCondition(work, v1.ConditionDeleting, true, reasonWaitingForDetach, msg)
}

// tearDown runs steps 2 to 4 above once nothing is attached.
func (c *Controller) tearDown(ctx context.Context, v *volume, work *v1.ReplicatedVolume) (ctrl.Result, error) {
	c.tearDownDatamesh(work)
	var pending []string
	for _, r := range v.rvrs {
		pending = append(pending, r.Name)
	}
	sort.Strings(pending)
	if len(pending) > 0 {
		v.setCondition(work, v1.ConditionDeleting, true, reasonWaitingReplicas,
			"Waiting for "+strconv.Itoa(len(pending))+" replica(s) to be torn down by their agents: "+strings.Join(pending, ", "))
	}
	c.summarize(v, work, v.rvrs, "")
	var requeue time.Duration
	if wait := progressWait(v.rv, work, v.now); wait > 0 {
		// Only a message moved (one replica fewer to wait for), and the last status
		// write is recent: the teardown revision is written, and the replicas usually
		// go within seconds, so the volume is gone before the message would matter;
		// a deletion that is stuck shows its message within progressInterval
		// (docs/controller.md, "Write budget").
		requeue = wait
	} else if retry, err := c.publishStatus(ctx, v.rv, work); err != nil {
		return ctrl.Result{}, err
	} else if retry {
		return ctrl.Result{RequeueAfter: conflictRetry}, nil
	}
	// Only once the teardown revision is written do the replicas go: an agent must see
	// its replica out of the datamesh before it sees the replica deleted.
	if err := c.deleteReplicas(ctx, v); err != nil {
		return ctrl.Result{}, err
	}
	if err := c.releaseLostFinalizers(ctx, v, work); err != nil {
		return ctrl.Result{}, err
	}
	if len(pending) > 0 {
		return ctrl.Result{RequeueAfter: requeue}, nil // the replicas' deletion brings the next reconcile
	}
	return ctrl.Result{}, c.releaseVolume(ctx, v.rv)
}

// tearDownDatamesh is step 2 on work: no members, no transitions, one new revision.
func (c *Controller) tearDownDatamesh(work *v1.ReplicatedVolume) {
	st := &work.Status
	if len(st.Datamesh.Members) == 0 && len(st.DatameshTransitions) == 0 && len(st.DatameshReplicaRequests) == 0 {
		return
	}
	st.Datamesh.Members = nil
	st.Datamesh.Quorum, st.Datamesh.QuorumMinimumRedundancy = 0, 0
	st.Datamesh.Multiattach = false
	st.DatameshTransitions = nil
	st.DatameshReplicaRequests = nil
	st.DatameshRevision++
	// No Event: the volume goes within seconds, taking nothing a person acts on, and a
	// deletion that waits says what for in its Deleting condition (docs/controller.md,
	// "Write budget").
}

// deleteReplicas is step 3: every replica not yet being deleted is.
func (c *Controller) deleteReplicas(ctx context.Context, v *volume) error {
	var deleted []string
	for _, r := range v.rvrs {
		if r.DeletionTimestamp != nil {
			continue
		}
		if err := c.deleteReplica(ctx, r); err != nil {
			return fmt.Errorf("deleting replica %s: %w", r.Name, err)
		}
		deleted = append(deleted, r.Name)
	}
	c.waitForCache(ctx, deleted, false)
	return nil
}

// releaseVolume is step 4, once no replica is left: the Secret, the port and minor,
// then the finalizer.
func (c *Controller) releaseVolume(ctx context.Context, rv *v1.ReplicatedVolume) error {
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: c.opts.Namespace, Name: SecretName(rv.Name)}}
	if err := c.reader.Get(ctx, client.ObjectKeyFromObject(secret), &corev1.Secret{}); err == nil {
		if err := c.client.Delete(ctx, secret); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting Secret %s/%s: %s", c.opts.Namespace, secret.Name, apierrors.ReasonForError(err))
		}
	}
	c.alloc.Release(rv.Name)
	if slices.Contains(rv.Finalizers, v1.FinalizerController) {
		if err := ignoreStale(applyFinalizer(ctx, c.client, "ReplicatedVolume", rv.Name, rv.ResourceVersion, false, rv.Finalizers)); err != nil {
			return fmt.Errorf("removing finalizer: %w", err)
		}
	}
	return nil
}
