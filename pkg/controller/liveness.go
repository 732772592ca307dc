package controller

import (
	"context"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/pkg/agentlease"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/finalizer"
)

// judge is node's agent liveness as this reconcile of v sees it: its Lease, within
// the fleet of every agent's (agentlease.Fleet, "Every agent silent at once").
func (c *Controller) judge(v *volume, node string) agentlease.Liveness {
	return v.fleet.Judge(v.leases[node], v.now, c.opts.AgentGracePeriod)
}

// agentVerdict is the AgentReady condition a replica on node should carry.
func (c *Controller) agentVerdict(v *volume, node string) (metav1.Condition, agentlease.Liveness) {
	lv := c.judge(v, node)
	if lv.Lost {
		return metav1.Condition{Type: v1.ConditionAgentReady, Status: metav1.ConditionFalse, Reason: lv.Reason, Message: lv.Message}, lv
	}
	return metav1.Condition{Type: v1.ConditionAgentReady, Status: metav1.ConditionTrue, Reason: v1.ReasonAgentLeaseValid,
		Message: "The agent of node " + node + " renews its Lease"}, lv
}

// markLiveness writes AgentReady on the volume's replicas where the verdict changed and
// returns the replicas as the engine must see them (deep copies carrying the verdict,
// and the node's addresses from its live agent's Lease for a replica that has not
// reported its own yet), and when to look again because a Lease in its grace period
// will have expired.
//
// The addresses: a replica's are its node's, which the agent publishes on its Lease
// (docs/contract.md, "Node facts and liveness"), so a new replica joins the datamesh
// without waiting for a report of its own — a write per replica of every volume
// formed, saved (docs/controller.md, "Write budget").
//
// A replica without the condition counts as ready, so a healthy replica costs no write:
// the condition is written False when its node is lost, and True again only over a
// False.
func (c *Controller) markLiveness(ctx context.Context, v *volume) ([]*v1.ReplicatedVolumeReplica, time.Duration, error) {
	var requeue time.Duration
	out := make([]*v1.ReplicatedVolumeReplica, 0, len(v.rvrs))
	for _, r := range v.rvrs {
		cp := r.DeepCopy()
		out = append(out, cp)
		if r.Spec.NodeName == "" {
			continue
		}
		want, lv := c.agentVerdict(v, r.Spec.NodeName)
		if len(cp.Status.Addresses) == 0 && lv.Live {
			cp.Status.Addresses = agentlease.Addresses(v.leases[r.Spec.NodeName])
		}
		if !lv.Live && !lv.Lost && !lv.Next.IsZero() {
			if d := lv.Next.Sub(v.now) + 100*time.Millisecond; requeue == 0 || d < requeue {
				requeue = d
			}
		}
		have := meta.FindStatusCondition(r.Status.Conditions, v1.ConditionAgentReady)
		needWrite := false
		switch {
		case have == nil:
			needWrite = want.Status == metav1.ConditionFalse
		default:
			needWrite = have.Status != want.Status || have.Reason != want.Reason || have.Message != want.Message
		}
		want.ObservedGeneration = r.Generation
		want.LastTransitionTime = metav1.NewTime(v.now)
		if have != nil && have.Status == want.Status {
			want.LastTransitionTime = have.LastTransitionTime
		}
		if needWrite {
			if err := c.applyAgentReady(ctx, r.Name, want); err != nil && !apierrors.IsNotFound(err) {
				return nil, 0, fmt.Errorf("writing %s on replica %s: %w", v1.ConditionAgentReady, r.Name, err)
			}
		}
		meta.SetStatusCondition(&cp.Status.Conditions, want)
	}
	return out, requeue, nil
}

// applyAgentReady writes the one condition the controller owns on a replica.
func (c *Controller) applyAgentReady(ctx context.Context, name string, cond metav1.Condition) error {
	m, err := toMap(cond)
	if err != nil {
		return err
	}
	u := applyObject("ReplicatedVolumeReplica", "", name, "")
	u.Object["status"] = map[string]any{"conditions": []any{m}}
	return c.client.Status().Patch(ctx, u, client.Apply, applyStatusOpts()...)
}

// lostMembers are the members whose node is lost (Lease expired past the grace period)
// and to which no replica on a live node reports a connection: ForceLeave for each,
// ForceDetach for those attached. A member some live peer still reaches is not lost,
// whatever its Lease says (its agent may just be restarting); the engine checks the
// same again (MemberUnreachable) before it removes anything. A node taken down for
// maintenance is away, not lost: its members stay (docs/operating.md, "Node
// maintenance").
func (c *Controller) lostMembers(v *volume, rvrs []*v1.ReplicatedVolumeReplica) (forceLeave, forceDetach []string) {
	members := map[string]v1.DatameshMember{}
	for _, m := range v.rv.Status.Datamesh.Members {
		members[m.Name] = m
	}
	for _, r := range rvrs {
		m, ok := members[r.Name]
		// A replica that already left the member list while its transition still
		// waits for it (a RemoveReplica's last step published) is named too: the
		// engine then stops waiting for it (docs/datamesh.md, "A voter lost under a
		// transition in flight"); otherwise that transition would wait for ever.
		if !inDatamesh(v.rv, r.Name) || r.Spec.NodeName == "" || v.away[r.Spec.NodeName] || !c.judge(v, r.Spec.NodeName).Lost {
			continue
		}
		if c.reachedByLivePeer(v, rvrs, r.Name) {
			continue
		}
		forceLeave = append(forceLeave, r.Name)
		if ok && m.Attached {
			forceDetach = append(forceDetach, r.Name)
		}
	}
	return forceLeave, forceDetach
}

func (c *Controller) reachedByLivePeer(v *volume, rvrs []*v1.ReplicatedVolumeReplica, name string) bool {
	for _, p := range rvrs {
		if p.Name == name || p.Spec.NodeName == "" || c.judge(v, p.Spec.NodeName).Lost {
			continue
		}
		for _, peer := range p.Status.Peers {
			if peer.Name == name && peer.ConnectionState == "Connected" {
				return true
			}
		}
	}
	return false
}

// releaseLostFinalizers removes the agent's finalizer from deleted replicas whose node is
// lost and which are out of the datamesh: no agent will ever do it (docs/contract.md,
// "Node that is gone"). A node that comes back finds the replica gone and tears down
// what it still holds.
func (c *Controller) releaseLostFinalizers(ctx context.Context, v *volume, work *v1.ReplicatedVolume) error {
	for _, r := range v.rvrs {
		if r.DeletionTimestamp == nil || !slices.Contains(r.Finalizers, v1.FinalizerAgent) || r.Spec.NodeName != "" &&
			!c.judge(v, r.Spec.NodeName).Lost {
			continue
		}
		if inDatamesh(work, r.Name) {
			continue
		}
		if err := c.removeAgentFinalizer(ctx, r); err != nil {
			return err
		}
	}
	return nil
}

// inDatamesh: name is a member or the subject of a transition.
func inDatamesh(rv *v1.ReplicatedVolume, name string) bool {
	for _, m := range rv.Status.Datamesh.Members {
		if m.Name == name {
			return true
		}
	}
	for _, t := range rv.Status.DatameshTransitions {
		if t.ReplicaName == name {
			return true
		}
	}
	return false
}

// removeAgentFinalizer releases the agent's finalizer in the agent's stead: when it is
// the replica's last, by the update that deletes the replica (finalizer.Release), which
// a replica changed since the cache showed it refuses with a Conflict; otherwise by a
// merge patch under the object's resourceVersion (finalizers are a list a merge patch
// replaces whole: the lock makes sure no one else's entry is lost).
func (c *Controller) removeAgentFinalizer(ctx context.Context, r *v1.ReplicatedVolumeReplica) error {
	err := finalizer.Release(ctx, c.client, r, v1.FinalizerAgent, v1.FieldManagerController, func() error {
		patched := r.DeepCopy()
		patched.Finalizers = slices.DeleteFunc(patched.Finalizers, func(f string) bool { return f == v1.FinalizerAgent })
		return c.client.Patch(ctx, patched, client.MergeFromWithOptions(r, client.MergeFromWithOptimisticLock{}), client.FieldOwner(v1.FieldManagerController))
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
