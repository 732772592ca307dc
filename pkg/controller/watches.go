package controller

import (
	"context"
	"maps"
	"slices"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
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
		var rvs v1.ReplicatedVolumeList
		if err := c.reader.List(ctx, &rvs, client.UnsafeDisableDeepCopy); err == nil {
			for i := range rvs.Items {
				if waitsForNodes(&rvs.Items[i]) {
					set[rvs.Items[i].Name] = true
				}
			}
		}
	}
	var out []reconcile.Request
	for _, n := range slices.Sorted(maps.Keys(set)) {
		out = append(out, volumeRequest(n)...)
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

func (c *Controller) volumesOfLease(ctx context.Context, o client.Object) []reconcile.Request {
	l, ok := o.(*coordinationv1.Lease)
	if !ok {
		return nil
	}
	n := agentlease.NodeName(l)
	if n == "" {
		return nil
	}
	return c.volumesOnNode(ctx, n, true)
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
