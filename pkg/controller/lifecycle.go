package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
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

	"github.com/meshvol/meshvol/pkg/agentlease"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Node lifecycle: one reconcile per agent Lease. An agent's Lease expires by the clock,
// with no event, so this reconciler looks again when the verdict will change
// (agentlease.Liveness.Next) and then wakes the node's volumes (which mark AgentReady=False and
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

// TaintLost keeps new pods off a node whose pods DeleteLostPods frees: until Kubernetes
// marks the node NotReady (tens of seconds later) the scheduler would place a freed
// pod's replacement right back on it.
var TaintLost = corev1.Taint{Key: "storage.meshvol.io/lost", Effect: corev1.TaintEffectNoSchedule}

// nodeTaints are the taints the controller manages on lost nodes, by option.
func (c *Controller) nodeTaints() []corev1.Taint {
	var ts []corev1.Taint
	if c.opts.DeleteLostPods {
		ts = append(ts, TaintLost)
	}
	if c.opts.TaintLostNodes {
		ts = append(ts, TaintOutOfService)
	}
	return ts
}

func (c *Controller) setupLifecycle(mgr ctrl.Manager) error {
	agentLease := predicate.NewPredicateFuncs(func(o client.Object) bool {
		l, ok := o.(*coordinationv1.Lease)
		return ok && l.Namespace == c.opts.Namespace && agentlease.NodeName(l) != ""
	})
	b := ctrl.NewControllerManagedBy(mgr).
		Named("node-lifecycle").
		For(&coordinationv1.Lease{}, builder.WithPredicates(agentLease))
	if len(c.nodeTaints()) > 0 {
		b = b.Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: c.opts.Namespace, Name: v1.AgentLeasePrefix + o.GetName()}}}
		}))
	}
	return b.Complete(reconcile.Func(c.reconcileNode))
}

func (c *Controller) reconcileNode(ctx context.Context, req reconcile.Request) (ctrl.Result, error) {
	node := agentlease.NodeName(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: req.Name}})
	if node == "" {
		return ctrl.Result{}, nil
	}
	now := c.opts.Now()
	own := &coordinationv1.Lease{}
	if err := c.reader.Get(ctx, req.NamespacedName, own); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		own = nil
	}
	lv := agentlease.Judge(own, now, c.opts.AgentGracePeriod)
	var fleet agentlease.Fleet
	if lv.Live {
		fleet = c.disrupt.liveSeen(now) // a live Lease is judged the same within any fleet
	} else {
		// Only a Lease that is not live needs the others: whether every agent is
		// silent at once decides how this one is judged.
		leases, err := c.leasesByNode(ctx)
		if err != nil {
			return ctrl.Result{}, err
		}
		fleet = c.disrupt.observe(leases, now)
		lv = fleet.Judge(own, now, c.opts.AgentGracePeriod)
	}
	if !lv.Live {
		for _, r := range c.volumesOnNode(ctx, node, false) {
			c.wakeVolume(r.Name)
		}
		select {
		case c.pools <- event.GenericEvent{Object: &v1.ReplicatedStoragePool{}}:
		default:
		}
	}
	if fleet.Disrupted && !lv.Live && !lv.Lost {
		// Every agent is silent: nothing is decided until one renews, and that renewal
		// wakes only its own node; look again, so that this one gets its fresh grace
		// period (agentlease.Fleet) once the disruption has ended.
		return ctrl.Result{RequeueAfter: max(c.opts.AgentGracePeriod, time.Second)}, nil
	}
	if res, err := c.actOnLostNode(ctx, node, lv); err != nil || !res.IsZero() {
		return res, err
	}
	if !lv.Next.IsZero() {
		return ctrl.Result{RequeueAfter: lv.Next.Sub(now) + 100*time.Millisecond}, nil
	}
	return ctrl.Result{}, nil
}

// actOnLostNode applies the node taints the options ask for (TaintLost first, so no
// replacement lands on the node) and frees the lost node's pods. A zero result: nothing
// to look at again sooner than the Lease's own next change.
func (c *Controller) actOnLostNode(ctx context.Context, node string, lv agentlease.Liveness) (ctrl.Result, error) {
	var res ctrl.Result
	if lv.Reason == v1.ReasonAgentLeaseMissing {
		// No agent ever held a Lease for this node: meshvol does not run there (the
		// DaemonSet does not select it), or not yet (a cluster starting, whose agents
		// are slow to their first Lease). There is nothing of meshvol to fence, and the
		// out-of-service taint would evict every pod of a node that is up.
		lv.Lost = false
	}
	if ts := c.nodeTaints(); len(ts) > 0 {
		settled, err := c.taint(ctx, node, lv, ts)
		if err != nil {
			return ctrl.Result{}, err
		}
		if !settled {
			// Lost but still reached by a peer, or back but not clean yet: the replicas'
			// reports decide, so look again (no write until it changes); pods are freed
			// only from a node already tainted.
			res.RequeueAfter = c.opts.AgentGracePeriod
			if c.opts.DeleteLostPods && lv.Lost {
				res.RequeueAfter = time.Second
			}
			return res, nil
		}
	}
	if c.opts.DeleteLostPods && lv.Lost {
		settled, err := c.freeLostPods(ctx, node, lv)
		if err != nil {
			return ctrl.Result{}, err
		}
		// Not settled: a pod stays because a volume's survivors do not hold quorum
		// without the node yet, and their agents report within a second of DRBD
		// deciding. Settled: a pod bound to the node later is found on the next look.
		res.RequeueAfter = c.opts.AgentGracePeriod
		if !settled {
			res.RequeueAfter = time.Second
		}
	}
	return res, nil
}

// taint applies the taints ts to node when it is lost and no live peer reaches it, and
// removes them once its agent is back and the node clean, in one patch each way.
// settled=false: the taints should change but the replicas' state does not allow it yet.
func (c *Controller) taint(ctx context.Context, node string, lv agentlease.Liveness, ts []corev1.Taint) (settled bool, err error) {
	n := &corev1.Node{}
	if err := c.reader.Get(ctx, types.NamespacedName{Name: node}, n); err != nil {
		return true, client.IgnoreNotFound(err)
	}
	ours := func(t corev1.Taint) bool {
		return slices.ContainsFunc(ts, func(o corev1.Taint) bool { return o.Key == t.Key })
	}
	var missing []corev1.Taint
	for _, t := range ts {
		if !slices.ContainsFunc(n.Spec.Taints, func(h corev1.Taint) bool { return h.Key == t.Key }) {
			missing = append(missing, t)
		}
	}
	has := slices.ContainsFunc(n.Spec.Taints, ours)
	patched := n.DeepCopy()
	switch {
	case len(missing) > 0 && lv.Lost:
		reachable, err := c.nodeReachable(ctx, node)
		if err != nil || reachable {
			return false, err
		}
		var names []string
		for _, t := range missing {
			t.TimeAdded = &metav1.Time{Time: c.opts.Now()}
			patched.Spec.Taints = append(patched.Spec.Taints, t)
			names = append(names, t.ToString())
		}
		if err := c.client.Patch(ctx, patched, client.MergeFromWithOptions(n, client.MergeFromWithOptimisticLock{}), client.FieldOwner(v1.FieldManagerController)); err != nil {
			return false, fmt.Errorf("tainting lost node %s: %w", node, err)
		}
		c.recorder.Eventf(n, corev1.EventTypeWarning, EventNodeLost, "meshvol decided node %s is lost (%s; no live peer reaches its replicas): tainted %s", node, lv.Message, strings.Join(names, ", "))
	case has && lv.Live:
		clean, err := c.nodeClean(ctx, node)
		if err != nil || !clean {
			return false, err
		}
		patched.Spec.Taints = slices.DeleteFunc(patched.Spec.Taints, ours)
		if err := c.client.Patch(ctx, patched, client.MergeFromWithOptions(n, client.MergeFromWithOptimisticLock{}), client.FieldOwner(v1.FieldManagerController)); err != nil {
			return false, fmt.Errorf("removing meshvol's taints from node %s: %w", node, err)
		}
		c.recorder.Eventf(n, corev1.EventTypeNormal, "NodeBack", "The meshvol agent of node %s is back and the node holds no stale replica: removed meshvol's taints", node)
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
	fleet := c.disrupt.observe(byNode, now)
	for i := range on.Items {
		r := &on.Items[i]
		var peers v1.ReplicatedVolumeReplicaList
		if err := c.reader.List(ctx, &peers, client.MatchingFields{indexVolume: r.Spec.ReplicatedVolumeName}); err != nil {
			return false, err
		}
		for j := range peers.Items {
			p := &peers.Items[j]
			if p.Spec.NodeName == node || fleet.Judge(byNode[p.Spec.NodeName], now, c.opts.AgentGracePeriod).Lost {
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
