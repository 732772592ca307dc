package controller

import (
	"context"
	"maps"
	"slices"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/meshvol/meshvol/pkg/agentlease"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Mappers from the objects a volume depends on to the volumes. Each is an index lookup.

func (c *Controller) volumesOfClass(ctx context.Context, o client.Object) []reconcile.Request {
	var rvs v1.ReplicatedVolumeList
	if err := c.reader.List(ctx, &rvs, client.MatchingFields{indexClass: o.GetName()}, client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	return rvRequests(rvs.Items)
}

// volumesOfPool: the volumes that use the pool, and those of classes that name it (they
// may not have resolved their configuration yet).
func (c *Controller) volumesOfPool(ctx context.Context, o client.Object) []reconcile.Request {
	var rvs v1.ReplicatedVolumeList
	if err := c.reader.List(ctx, &rvs, client.MatchingFields{indexPool: o.GetName()}, client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	out := rvRequests(rvs.Items)
	var classes v1.ReplicatedStorageClassList
	if err := c.reader.List(ctx, &classes, client.UnsafeDisableDeepCopy); err == nil {
		for i := range classes.Items {
			if classes.Items[i].Spec.StoragePool == o.GetName() {
				out = append(out, c.volumesOfClass(ctx, &classes.Items[i])...)
			}
		}
	}
	return out
}

// volumesOfNode: volumes with a replica or an attachment on the node, and volumes that
// wait for placement (a node that changes may be the one they wait for).
func (c *Controller) volumesOfNode(ctx context.Context, o client.Object) []reconcile.Request {
	return c.volumesOnNode(ctx, o.GetName(), true)
}

func (c *Controller) volumesOnNode(ctx context.Context, node string, waiting bool) []reconcile.Request {
	set := map[string]bool{}
	var rvrs v1.ReplicatedVolumeReplicaList
	if err := c.reader.List(ctx, &rvrs, client.MatchingFields{indexNode: node}, client.UnsafeDisableDeepCopy); err == nil {
		for i := range rvrs.Items {
			set[rvrs.Items[i].Spec.ReplicatedVolumeName] = true
		}
	}
	var rvas v1.ReplicatedVolumeAttachmentList
	if err := c.reader.List(ctx, &rvas, client.MatchingFields{indexNodeRVA: node}, client.UnsafeDisableDeepCopy); err == nil {
		for i := range rvas.Items {
			set[rvas.Items[i].Spec.ReplicatedVolumeName] = true
		}
	}
	if waiting {
		c.addWaiting(ctx, set, waitingNodes)
	}
	return requestsOf(set)
}

// addWaiting adds the volumes that wait as why says (the index indexWaiting) to set.
func (c *Controller) addWaiting(ctx context.Context, set map[string]bool, why string) {
	var rvs v1.ReplicatedVolumeList
	if err := c.reader.List(ctx, &rvs, client.MatchingFields{indexWaiting: why}, client.UnsafeDisableDeepCopy); err == nil {
		for i := range rvs.Items {
			set[rvs.Items[i].Name] = true
		}
	}
}

func requestsOf(set map[string]bool) []reconcile.Request {
	var out []reconcile.Request
	for _, n := range slices.Sorted(maps.Keys(set)) {
		out = append(out, volumeRequest(n)...)
	}
	return out
}

// What a volume waits for, the values of indexWaiting: waitingNodes, any change of
// the nodes (placement or allocation refused, or not formed yet); waitingRoom, room
// on a node (placement refused).
const (
	waitingNodes = "nodes"
	waitingRoom  = "room"
)

// waitingFor is what the volume waits for (indexWaiting).
func waitingFor(rv *v1.ReplicatedVolume) []string {
	var out []string
	if waitsForNodes(rv) {
		out = append(out, waitingNodes)
	}
	if c := meta.FindStatusCondition(rv.Status.Conditions, v1.ConditionScheduled); c != nil && c.Status == metav1.ConditionFalse {
		out = append(out, waitingRoom)
	}
	return out
}

// waitsForNodes: placement or allocation refused, or the volume is not formed yet.
func waitsForNodes(rv *v1.ReplicatedVolume) bool {
	if c := meta.FindStatusCondition(rv.Status.Conditions, v1.ConditionScheduled); c != nil && c.Status == metav1.ConditionFalse {
		return true
	}
	if c := meta.FindStatusCondition(rv.Status.Conditions, v1.ConditionAllocated); c != nil && c.Status == metav1.ConditionFalse {
		return true
	}
	return rv.Status.Phase == v1.VolumePhasePending || rv.Status.Phase == v1.VolumePhaseForming
}

// leaseHandler maps an agent Lease's events (those leaseFactsChanged passes) to the
// volumes they concern. A change of the node's pool capacity alone — the agent reports
// it after each backing volume it creates or deletes, so every few seconds on every
// node while volumes form — concerns only the volumes placement refused for want of
// room: waking every volume of the node on it made each formation cost a reconcile of
// every other volume. Any other change (liveness, addresses, zone, algorithms,
// prerequisites, a pool reported for the first time) concerns the node's volumes and
// those waiting for nodes.
func (c *Controller) leaseHandler() handler.EventHandler {
	enqueue := func(q workqueue.TypedRateLimitingInterface[reconcile.Request], rs []reconcile.Request) {
		for _, r := range rs {
			q.Add(r)
		}
	}
	whole := func(ctx context.Context, o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		l, ok := o.(*coordinationv1.Lease)
		if !ok {
			return
		}
		if n := agentlease.NodeName(l); n != "" {
			enqueue(q, c.volumesOnNode(ctx, n, true))
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			whole(ctx, e.Object, q)
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			whole(ctx, e.Object, q)
		},
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			whole(ctx, e.Object, q)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			o, okOld := e.ObjectOld.(*coordinationv1.Lease)
			n, okNew := e.ObjectNew.(*coordinationv1.Lease)
			if okOld && okNew && c.onlyCapacityChanged(o, n) {
				set := map[string]bool{}
				c.addWaiting(ctx, set, waitingRoom)
				enqueue(q, requestsOf(set))
				return
			}
			whole(ctx, e.ObjectNew, q)
		},
	}
}

// onlyCapacityChanged: between o and n, only the figures of pool capacity annotations
// changed, and the liveness verdict did not. A pool's capacity annotation that appears
// or goes is more than a figure: a node is ready in a pool only once its agent reports
// the pool (EligibleNodes), so the first report is what a replica waiting to join on
// that node, or an attachment there, waits for.
func (c *Controller) onlyCapacityChanged(o, n *coordinationv1.Lease) bool {
	now := c.opts.Now()
	lo, ln := agentlease.Judge(o, now, c.opts.AgentGracePeriod), agentlease.Judge(n, now, c.opts.AgentGracePeriod)
	if lo.Live != ln.Live || lo.Lost != ln.Lost {
		return false
	}
	return maps.Equal(withoutCapacityFigures(o.Annotations), withoutCapacityFigures(n.Annotations))
}

// withoutCapacityFigures is a Lease's annotations with the figures of the pools'
// capacity blanked: which pools it reports stays.
func withoutCapacityFigures(ann map[string]string) map[string]string {
	out := make(map[string]string, len(ann))
	for k, v := range ann {
		if strings.HasPrefix(k, v1.AnnotationPoolCapacityPrefix) {
			v = ""
		}
		out[k] = v
	}
	return out
}

func rvRequests(rvs []v1.ReplicatedVolume) []reconcile.Request {
	out := make([]reconcile.Request, 0, len(rvs))
	for i := range rvs {
		out = append(out, volumeRequest(rvs[i].Name)...)
	}
	return out
}

// nodeFactsChanged passes Node events that matter to placement: creation, deletion, and
// changes of labels (zone, cordon, pool selectors) or spec.unschedulable. The kubelet's
// status heartbeats do not pass.
func nodeFactsChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
			return !maps.Equal(o.Labels, n.Labels) || o.Spec.Unschedulable != n.Spec.Unschedulable
		},
	}
}

// leaseFactsChanged passes agent Lease events that change a fact or the liveness
// verdict: creation, deletion, annotation changes, and a renewal of a Lease that had
// expired. A plain renewal of a live Lease (every 3 s per node) does not pass; the
// expiry of a Lease is a matter of time, which the node lifecycle reconciler watches.
func (c *Controller) leaseFactsChanged() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool { return agentlease.NodeName(e.Object.(*coordinationv1.Lease)) != "" },
		DeleteFunc: func(e event.DeleteEvent) bool { return agentlease.NodeName(e.Object.(*coordinationv1.Lease)) != "" },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.(*coordinationv1.Lease), e.ObjectNew.(*coordinationv1.Lease)
			if agentlease.NodeName(n) == "" {
				return false
			}
			if !maps.Equal(o.Annotations, n.Annotations) {
				return true
			}
			now := c.opts.Now()
			lo, ln := agentlease.Judge(o, now, c.opts.AgentGracePeriod), agentlease.Judge(n, now, c.opts.AgentGracePeriod)
			return lo.Live != ln.Live || lo.Lost != ln.Lost
		},
		GenericFunc: func(event.GenericEvent) bool { return true },
	}
}
