package controller

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/meshvol/meshvol/pkg/agentlease"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// The pool reconciler writes status.eligibleNodes of every ReplicatedStoragePool from the
// Nodes and the agents' Leases, and a Ready condition. It rewrites the status only when
// EligibleChanged says a person or placement would notice: a capacity drift below the
// threshold keeps the old figures (placement reads the fresh ones from the Leases).

func (c *Controller) setupPool(mgr ctrl.Manager) error {
	all := handler.EnqueueRequestsFromMapFunc(c.allPools)
	return ctrl.NewControllerManagedBy(mgr).
		Named("pool").
		For(&v1.ReplicatedStoragePool{}).
		Watches(&corev1.Node{}, all, builder.WithPredicates(nodeFactsChanged())).
		Watches(&coordinationv1.Lease{}, all, builder.WithPredicates(c.leaseFactsChanged())).
		WatchesRawSource(source.Channel(c.pools, all)).
		Complete(reconcile.Func(c.reconcilePool))
}

func (c *Controller) allPools(ctx context.Context, _ client.Object) []reconcile.Request {
	var list v1.ReplicatedStoragePoolList
	if err := c.reader.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}

func (c *Controller) reconcilePool(ctx context.Context, req reconcile.Request) (ctrl.Result, error) {
	rsp := &v1.ReplicatedStoragePool{}
	if err := c.reader.Get(ctx, req.NamespacedName, rsp); err != nil {
		if apierrors.IsNotFound(err) {
			c.poolWrites.forget(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if c.poolWrites.behind(rsp.Name, rsp.ResourceVersion) {
		return ctrl.Result{RequeueAfter: conflictRetry}, nil
	}
	var nodes corev1.NodeList
	if err := c.reader.List(ctx, &nodes); err != nil {
		return ctrl.Result{}, err
	}
	var leases coordinationv1.LeaseList
	if err := c.reader.List(ctx, &leases, client.InNamespace(c.opts.Namespace)); err != nil {
		return ctrl.Result{}, err
	}
	byNode := map[string]*coordinationv1.Lease{}
	for i := range leases.Items {
		if n := agentlease.NodeName(&leases.Items[i]); n != "" {
			byNode[n] = &leases.Items[i]
		}
	}
	now := c.opts.Now()
	want := rsp.Status.DeepCopy()
	want.ObservedGeneration = rsp.Generation
	eligible, err := EligibleNodes(rsp, nodes.Items, byNode, now, c.opts.AgentGracePeriod)
	cond := metav1.Condition{Type: v1.ConditionReady, ObservedGeneration: rsp.Generation, LastTransitionTime: metav1.NewTime(now)}
	switch {
	case err != nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "InvalidSpec", err.Error()
	default:
		if EligibleChanged(rsp.Status.EligibleNodes, eligible) {
			want.EligibleNodes = eligible
		}
		ready := 0
		for _, e := range eligible {
			if e.Ready && !e.Unschedulable {
				ready++
			}
		}
		switch {
		case len(eligible) == 0:
			cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "NoEligibleNodes",
				"No node matches the pool's nodeSelector, zones and volumeGroups"
		case ready == 0:
			cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "NoReadyNodes",
				fmt.Sprintf("None of the %d eligible nodes has a live agent that reports the pool's capacity and is not cordoned", len(eligible))
		default:
			cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, "Ready",
				strconv.Itoa(ready)+" of "+strconv.Itoa(len(eligible))+" eligible nodes can take replicas"
		}
		cond.Message += missingPrerequisites(eligible, byNode)
	}
	meta.SetStatusCondition(&want.Conditions, cond)
	if equality.Semantic.DeepEqual(&rsp.Status, want) {
		return ctrl.Result{}, nil
	}
	// Conditional on what the cache showed, so that a reconcile on a cache that has not
	// seen the last write fails instead of sending the same status again.
	if err := applyStatus(ctx, c.client, "ReplicatedStoragePool", rsp.Name, rsp.ResourceVersion, want); err != nil {
		return ctrl.Result{}, ignoreStale(err)
	}
	c.poolWrites.wrote(rsp.Name, rsp.ResourceVersion)
	return ctrl.Result{}, nil
}

// missingPrerequisites names the eligible nodes whose agent reports missing node
// prerequisites, with what is missing, for the pool's Ready message.
func missingPrerequisites(eligible []v1.EligibleNode, leases map[string]*coordinationv1.Lease) string {
	var b strings.Builder
	for _, e := range eligible {
		if l := leases[e.NodeName]; l != nil {
			if m := l.Annotations[v1.AnnotationPrerequisites]; m != "" {
				fmt.Fprintf(&b, "; node %s is missing prerequisites: %s", e.NodeName, m)
			}
		}
	}
	return b.String()
}
