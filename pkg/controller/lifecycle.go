package controller

import (
	"context"
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Node lifecycle: one reconcile per agent Lease. An agent's Lease expires by the clock,
// with no event, so this reconciler looks again when the verdict will change
// (Liveness.Next) and then wakes the node's volumes (which mark AgentReady=False and
// feed ForceDetach/ForceLeave to the engine) and the pools (which mark the node not
// ready). A Lease renewed after it expired passes the volume and pool watches' own
// predicate, so the way back needs nothing from here.
//
// With TaintLostNodes, a node decided lost (Lease expired past the grace period, and
// no live peer reports a connection to any of its replicas) gets the out-of-service
// taint; the taint goes once the agent is back and the node holds no replica being
// torn down (docs/controller.md, "--taint-lost-nodes").

// TaintOutOfService is the taint Kubernetes' non-graceful node shutdown reads.
var TaintOutOfService = corev1.Taint{Key: "node.kubernetes.io/out-of-service", Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}

func (c *Controller) setupLifecycle(mgr ctrl.Manager) error {
	agentLease := predicate.NewPredicateFuncs(func(o client.Object) bool {
		l, ok := o.(*coordinationv1.Lease)
		return ok && l.Namespace == c.opts.Namespace && NodeNameOfLease(l) != ""
	})
	b := ctrl.NewControllerManagedBy(mgr).
		Named("node-lifecycle").
		For(&coordinationv1.Lease{}, builder.WithPredicates(agentLease))
	if c.opts.TaintLostNodes {
		b = b.Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: c.opts.Namespace, Name: v1.AgentLeasePrefix + o.GetName()}}}
		}))
	}
	return b.Complete(reconcile.Func(c.reconcileNode))
}

func (c *Controller) reconcileNode(ctx context.Context, req reconcile.Request) (ctrl.Result, error) {
	node := NodeNameOfLease(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: req.Name}})
	if node == "" {
		return ctrl.Result{}, nil
	}
	var lease *coordinationv1.Lease
	l := &coordinationv1.Lease{}
	switch err := c.reader.Get(ctx, req.NamespacedName, l); {
	case err == nil:
		lease = l
	case !apierrors.IsNotFound(err):
		return ctrl.Result{}, err
	}
	now := c.opts.Now()
	lv := LeaseLiveness(lease, now, c.opts.AgentGracePeriod)
	if !lv.Live {
		for _, r := range c.volumesOnNode(ctx, node, false) {
			c.wakeVolume(r.Name)
		}
		select {
		case c.pools <- event.GenericEvent{Object: &v1.ReplicatedStoragePool{}}:
		default:
		}
	}
	var freed ctrl.Result
	if c.opts.DeleteLostPods && lv.Lost {
		settled, err := c.freeLostPods(ctx, node, lv)
		if err != nil {
			return ctrl.Result{}, err
		}
		// Not settled: a pod stays because a volume's survivors do not hold quorum
		// without the node yet, and their agents report within a second of DRBD
		// deciding. Settled: a pod bound to the node later, before Kubernetes marks it
		// unreachable, is found on the next look.
		freed.RequeueAfter = c.opts.AgentGracePeriod
		if !settled {
			freed.RequeueAfter = time.Second
		}
	}
	if c.opts.TaintLostNodes {
		settled, err := c.taint(ctx, node, lv)
		if err != nil {
			return ctrl.Result{}, err
		}
		if !settled && freed.IsZero() {
			// Lost but still reached by a peer, or back but not clean yet: the replicas'
			// reports decide, so look again (no write until it changes; freed, when
			// set, looks again as soon or sooner).
			return ctrl.Result{RequeueAfter: c.opts.AgentGracePeriod}, nil
		}
	}
	if !freed.IsZero() {
		return freed, nil
	}
	if !lv.Next.IsZero() {
		return ctrl.Result{RequeueAfter: lv.Next.Sub(now) + 100*time.Millisecond}, nil
	}
	return ctrl.Result{}, nil
}

// taint applies or removes the out-of-service taint on node. settled=false: the taint
// should change but the replicas' state does not allow it yet.
func (c *Controller) taint(ctx context.Context, node string, lv Liveness) (settled bool, err error) {
	n := &corev1.Node{}
	if err := c.reader.Get(ctx, types.NamespacedName{Name: node}, n); err != nil {
		return true, client.IgnoreNotFound(err)
	}
	has := slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == TaintOutOfService.Key })
	switch {
	case !has && lv.Lost:
		reachable, err := c.nodeReachable(ctx, node)
		if err != nil || reachable {
			return false, err
		}
		patched := n.DeepCopy()
		t := TaintOutOfService
		t.TimeAdded = &metav1.Time{Time: c.opts.Now()}
		patched.Spec.Taints = append(patched.Spec.Taints, t)
		if err := c.client.Patch(ctx, patched, client.MergeFromWithOptions(n, client.MergeFromWithOptimisticLock{}), client.FieldOwner(v1.FieldManagerController)); err != nil {
			return false, fmt.Errorf("tainting lost node %s: %w", node, err)
		}
		c.recorder.Eventf(n, corev1.EventTypeWarning, EventNodeLost, "meshvol decided node %s is lost (%s; no live peer reaches its replicas): tainted %s", node, lv.Message, TaintOutOfService.ToString())
	case has && lv.Live:
		clean, err := c.nodeClean(ctx, node)
		if err != nil || !clean {
			return false, err
		}
		patched := n.DeepCopy()
		patched.Spec.Taints = slices.DeleteFunc(patched.Spec.Taints, func(t corev1.Taint) bool { return t.Key == TaintOutOfService.Key })
		if err := c.client.Patch(ctx, patched, client.MergeFromWithOptions(n, client.MergeFromWithOptimisticLock{}), client.FieldOwner(v1.FieldManagerController)); err != nil {
			return false, fmt.Errorf("removing the out-of-service taint from node %s: %w", node, err)
		}
		c.recorder.Eventf(n, corev1.EventTypeNormal, "NodeBack", "The meshvol agent of node %s is back and the node holds no stale replica: removed %s", node, TaintOutOfService.ToString())
	}
	return true, nil
}

// nodeReachable: some replica on a live node reports a Connected connection to a
// replica on node.
func (c *Controller) nodeReachable(ctx context.Context, node string) (bool, error) {
	var on v1.ReplicatedVolumeReplicaList
	if err := c.reader.List(ctx, &on, client.MatchingFields{indexNode: node}); err != nil {
		return false, err
	}
	byNode, err := c.leasesByNode(ctx)
	if err != nil {
		return false, err
	}
	now := c.opts.Now()
	for i := range on.Items {
		r := &on.Items[i]
		var peers v1.ReplicatedVolumeReplicaList
		if err := c.reader.List(ctx, &peers, client.MatchingFields{indexVolume: r.Spec.ReplicatedVolumeName}); err != nil {
			return false, err
		}
		for j := range peers.Items {
			p := &peers.Items[j]
			if p.Spec.NodeName == node || LeaseLiveness(byNode[p.Spec.NodeName], now, c.opts.AgentGracePeriod).Lost {
				continue
			}
			for _, ps := range p.Status.Peers {
				if ps.Name == r.Name && ps.ConnectionState == "Connected" {
					return true, nil
				}
			}
		}
	}
	return false, nil
}

// nodeClean: no replica on node is being torn down, and none is force-leaving its
// volume: what the node held while it was lost is gone.
func (c *Controller) nodeClean(ctx context.Context, node string) (bool, error) {
	var on v1.ReplicatedVolumeReplicaList
	if err := c.reader.List(ctx, &on, client.MatchingFields{indexNode: node}); err != nil {
		return false, err
	}
	for i := range on.Items {
		r := &on.Items[i]
		if r.DeletionTimestamp != nil {
			return false, nil
		}
		rv := &v1.ReplicatedVolume{}
		if err := c.reader.Get(ctx, types.NamespacedName{Name: r.Spec.ReplicatedVolumeName}, rv); err != nil {
			continue
		}
		for _, q := range rv.Status.DatameshReplicaRequests {
			if q.Name == r.Name && q.Operation == v1.ReplicaOperationForceLeave {
				return false, nil
			}
		}
	}
	return true, nil
}
