package controller

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/pkg/agentlease"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Deleting a volume (finalizer storage.meshvol.io/controller):
//
//  1. While any attachment exists or a member is attached, the volume waits (condition
//     Deleting, reason WaitingForDetach) and the engine runs as usual, so the
//     attachments being deleted detach.
//  2. Then every replica goes. An agent takes DRBD down when it sees the volume marked
//     with nothing attached and no Attach or Detach in flight (no Attach starts once the
//     volume is marked), and removes its finalizer once DRBD is down and the backing
//     volume is gone; the controller deletes each replica once its agent released it,
//     a deletion that ends it at once. A replica whose agent does not announce that it
//     does so (CapabilityTearDownWithVolume), whose node is lost, or which is still held
//     after teardownUnpublished is deleted at once, and its agent (for a lost node the
//     controller) releases it then. The data is being destroyed, so no membership guard
//     applies; nothing is attached, so no IO is in flight.
//  3. The datamesh torn down (no members, no transitions, one new revision) is published
//     only when the replicas take longer than teardownUnpublished, with the replicas the
//     deletion waits for; agents that see it take DRBD down as they would anyway.
//  4. When no replica is left: the volume's own Secret if it has one, the port and
//     minor, and the finalizer.

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
	if len(v.rvrs) == 0 {
		// No replica is left, so no agent reads the datamesh, and the volume goes with
		// its finalizer: a status written now (the replicas gone from its summary) would
		// go with it, and would move the resourceVersion that the finalizer's release is
		// conditional on, failing it once more (docs/controller.md, "Write budget").
		return ctrl.Result{}, c.releaseVolume(ctx, v.rv)
	}
	c.tearDownDatamesh(work)
	began := c.teardownBegan(v)
	var pending []string
	for _, r := range v.rvrs {
		pending = append(pending, r.Name)
	}
	sort.Strings(pending)
	v.setCondition(work, v1.ConditionDeleting, true, reasonWaitingReplicas,
		"Waiting for "+strconv.Itoa(len(pending))+" replica(s) to be torn down by their agents: "+strings.Join(pending, ", "))
	c.summarize(v, work, v.rvrs, "")
	var requeue time.Duration
	if wait := unpublishedTeardown(v, began); wait > 0 {
		// The replicas go without a teardown revision first: nothing is attached and no
		// Attach can start on a volume being deleted, so each agent takes its replica
		// down once it sees the volume go (docs/contract.md, "Deleting a volume"). The
		// revision would be one more write of the volume, and one more
		// event for every agent, per volume deleted; it is published, with the replicas
		// the deletion waits for, only when they take longer than teardownUnpublished.
		requeue = wait
	} else if wait := progressWait(v.rv, work, v.now, c.volumeStatusAt.last(v.rv.Name)); wait > 0 {
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
	if err := c.deleteReplicas(ctx, v, began); err != nil {
		return ctrl.Result{}, err
	}
	if err := c.releaseLostFinalizers(ctx, v, work); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: requeue}, nil // the replicas' deletion brings the next reconcile
}

// teardownBegan is when the volume's teardown began: the first pass of this controller
// that found it ready to tear down, or the deletion of one of its replicas if earlier
// (a replica deleted by an earlier controller process, or before its volume went).
func (c *Controller) teardownBegan(v *volume) time.Time {
	began := c.teardowns.began(v.rv.Name, v.now)
	for _, r := range v.rvrs {
		if r.DeletionTimestamp != nil && r.DeletionTimestamp.Time.Before(began) {
			began = r.DeletionTimestamp.Time
		}
	}
	return began
}

// unpublishedTeardown is how long the teardown may stay unpublished: until
// teardownUnpublished after it began, as long as the published datamesh still has its
// members (once the teardown is published, it is kept up to date as any status).
func unpublishedTeardown(v *volume, began time.Time) time.Duration {
	if len(v.rv.Status.Datamesh.Members) == 0 {
		return 0
	}
	return max(teardownUnpublished-v.now.Sub(began), 0)
}

// teardownUnpublished is how long a detached volume's replicas may take to go before
// the controller publishes the teardown, and with it the replicas the deletion waits
// for, and deletes those it waited for their agents to release. Longer than
// progressInterval: when thousands of volumes are deleted at once an agent gets to a
// volume seconds after its mark while it makes progress, and the revision would then
// be written for most of them, when the apiserver is busiest, for a message no one
// needs; a deletion that is stuck still says so within it
// (docs/controller.md, "Deletion").
const teardownUnpublished = 30 * time.Second

// tearDownDatamesh is step 3 on work: no members, no transitions, one new revision.
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

// deleteReplicas is step 2: every replica not yet being deleted is, once it may be
// (deletesNow, or teardownUnpublished after the teardown began), each by its own
// request, by name and UID (deleteReplica), so that a replica created again under the
// same name is not taken.
//
// Not one deletecollection by the volume's label: the apiserver indexes no label of a
// custom resource, so it matched that label against every replica of the cluster for
// each volume deleted, a cost quadratic in the volumes deleted at once (docs/scale.md,
// "Eighth pass"). Two requests more per 3D volume cost about as much CPU as that scan
// when 500 to 2,000 volumes go at once; the requests grow as the volumes deleted, the
// scan as their square. And a deletion by name never depends on labels a person may
// edit (docs/controller.md, "Deletion").
//
// A replica this controller deleted and the cache still shows is not deleted again
// (teardowns): the replicas of a volume are released one by one, each release
// a reconcile of the volume, and the cache may show one deleted in the reconcile before
// only a moment later. Waiting for the cache in each reconcile instead held one of the
// workers for the watch's round trip per replica (docs/scale.md, "Tenth pass").
func (c *Controller) deleteReplicas(ctx context.Context, v *volume, began time.Time) error {
	waited := v.now.Sub(began) >= teardownUnpublished
	for _, r := range v.rvrs {
		if r.DeletionTimestamp != nil || c.teardowns.deleted(v.rv.Name, r.UID) || !waited && !c.deletesNow(v, r) {
			continue
		}
		if err := c.deleteReplica(ctx, r); err != nil {
			return fmt.Errorf("deleting replica %s: %w", r.Name, err)
		}
		c.teardowns.markDeleted(v.rv.Name, r.UID, v.now)
	}
	return nil
}

// teardowns remembers, per volume being torn down and until it is gone, what this
// controller alone knows of it: when it first found the volume ready to tear down
// (teardownBegan), and the replicas (by UID) it deleted — the cache may show a replica
// for a moment after its deletion, and a reconcile then would delete it again, a
// request refused for nothing. A controller that started since knows none of it: the
// teardown's clock starts again, and a replica may be deleted once more.
type teardowns struct {
	mu  sync.Mutex
	all map[string]*teardown // volume name →
}

type teardown struct {
	began   time.Time
	deleted map[types.UID]bool
}

// of is name's teardown, begun at now when there is none yet; the caller holds mu.
func (t *teardowns) of(name string, now time.Time) *teardown {
	if t.all == nil {
		t.all = map[string]*teardown{}
	}
	if t.all[name] == nil {
		t.all[name] = &teardown{began: now, deleted: map[types.UID]bool{}}
	}
	return t.all[name]
}

// began is when name's teardown began: now, the first time it is asked.
func (t *teardowns) began(name string, now time.Time) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.of(name, now).began
}

func (t *teardowns) markDeleted(name string, uid types.UID, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.of(name, now).deleted[uid] = true
}

func (t *teardowns) deleted(name string, uid types.UID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.all[name] != nil && t.all[name].deleted[uid]
}

// forget drops what is remembered of name (the volume is gone).
func (t *teardowns) forget(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.all, name)
}

// deletesNow: the replica of a volume being torn down is deleted now, rather than once
// its agent released it. An agent that announces CapabilityTearDownWithVolume takes its
// replicas of a volume that goes down and releases them by itself, and a replica deleted
// without a finalizer goes at once: one request of the apiserver's fewer than marking it
// deleted for the agent to release, and the decoding of the stored replica that a
// release of the last finalizer of a marked object costs (docs/scale.md, "Tenth pass").
// A replica the agent released, or whose agent does not announce it (an earlier agent,
// which tears down on its replica's deletion; no agent Lease at all), or whose node is
// lost (the controller releases it, releaseLostFinalizers, once it is marked), is
// deleted now.
func (c *Controller) deletesNow(v *volume, r *v1.ReplicatedVolumeReplica) bool {
	if !slices.Contains(r.Finalizers, v1.FinalizerAgent) {
		return true
	}
	node := r.Spec.NodeName
	return node == "" || !agentlease.Announces(v.leases[node], v1.CapabilityTearDownWithVolume) || c.judge(v, node).Lost
}

// releaseVolume is step 4, once no replica is left: the volume's own Secret, the port
// and minor, then the finalizer. Only volumes formed before the cluster key have a
// Secret of their own; the cache says so, so a volume whose secret is derived costs no
// Secret request (docs/controller.md, "Allocation and the shared secret").
func (c *Controller) releaseVolume(ctx context.Context, rv *v1.ReplicatedVolume) error {
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: c.opts.Namespace, Name: SecretName(rv.Name)}}
	if err := c.reader.Get(ctx, client.ObjectKeyFromObject(secret), &corev1.Secret{}); err == nil {
		if err := c.client.Delete(ctx, secret); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting Secret %s/%s: %s", c.opts.Namespace, secret.Name, apierrors.ReasonForError(err))
		}
	}
	c.alloc.Release(rv.Name)
	if slices.Contains(rv.Finalizers, v1.FinalizerController) {
		err := releaseFinalizer(ctx, c.client, "ReplicatedVolume", rv)
		if err == nil {
			// Reconciles queued meanwhile (the replicas' and the Secret's deletions)
			// would find the RV still in the cache and release it again, a request
			// refused for nothing: they wait for the cache (volumeWrites).
			c.volumeWrites.wrote(rv.Name, rv.ResourceVersion)
		}
		if err := ignoreStale(err); err != nil {
			return fmt.Errorf("removing finalizer: %w", err)
		}
	}
	return nil
}
