package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh"
	"github.com/meshvol/meshvol/pkg/placement"
)

// place carries out what the engine wants: Diskful and TieBreaker replicas through Place
// (all or none), Access replicas on their attachment's node, deletions and retypes. It
// sets the Scheduled condition on work and returns the refusal message, if any.
func (c *Controller) place(ctx context.Context, v *volume, work *v1.ReplicatedVolume, wanted []datamesh.WantedReplica, accessRefused map[string]string) (string, error) {
	rv := v.rv
	byName := map[string]*v1.ReplicatedVolumeReplica{}
	for _, r := range v.rvrs {
		byName[r.Name] = r
	}
	var created, deleted []string
	var needD, needTB int
	var reasons []string
	for _, w := range wanted {
		switch w.Action {
		case datamesh.WantCreate:
			switch w.Type {
			case v1.ReplicaTypeDiskful:
				needD++
				reasons = append(reasons, w.Reason)
			case v1.ReplicaTypeTieBreaker:
				needTB++
				reasons = append(reasons, w.Reason)
			case v1.ReplicaTypeAccess:
				nodes, err := c.placementNodes(ctx, v, work)
				if err != nil {
					return "", err
				}
				if err := placement.CheckAccess(w.NodeName, existingReplicas(v), nodes); err != nil {
					accessRefused[w.NodeName] = err.Error()
					placementFailures.WithLabelValues(placement.ConstraintAccessNode).Inc()
					continue
				}
				if err := c.applyRVR(ctx, rv, w.NodeName, v1.ReplicaTypeAccess, nil, ""); err != nil {
					return "", fmt.Errorf("creating Access replica on %s: %w", w.NodeName, err)
				}
				created = append(created, v1.ReplicaName(rv.Name, w.NodeName))
				c.recorder.Eventf(rv, corev1.EventTypeNormal, EventReplicaPlaced, "Placed Access replica %s on node %s: %s",
					v1.ReplicaName(rv.Name, w.NodeName), w.NodeName, w.Reason)
			}
		case datamesh.WantDelete:
			r := byName[w.Replica]
			if r == nil || r.DeletionTimestamp != nil {
				continue
			}
			if err := c.client.Delete(ctx, r, client.Preconditions{UID: &r.UID}); err != nil && !apierrors.IsNotFound(err) {
				return "", fmt.Errorf("deleting replica %s: %w", r.Name, err)
			}
			deleted = append(deleted, r.Name)
			c.recorder.Eventf(rv, corev1.EventTypeNormal, EventReplicaDeleted, "Deleting replica %s: %s", r.Name, w.Reason)
		case datamesh.WantRetype:
			r := byName[w.Replica]
			if r == nil || r.DeletionTimestamp != nil || r.Spec.Type == w.Type {
				continue
			}
			var storage *v1.ReplicaStorage
			if v.rsp != nil {
				storage = storageFor(v.rsp, r.Spec.NodeName)
			}
			if err := ignoreStale(c.applyRVR(ctx, rv, r.Spec.NodeName, w.Type, storage, r.ResourceVersion)); err != nil {
				return "", fmt.Errorf("retyping replica %s to %s: %w", r.Name, w.Type, err)
			}
		}
	}
	// A replica that never joined, on a node that is lost, will never join: delete it so
	// the engine asks for one elsewhere (nothing of the datamesh is on it).
	for _, r := range v.rvrs {
		if r.DeletionTimestamp != nil || r.Spec.NodeName == "" || inDatamesh(work, r.Name) ||
			!LeaseLiveness(v.leases[r.Spec.NodeName], v.now, c.opts.AgentGracePeriod).Lost {
			continue
		}
		if err := c.client.Delete(ctx, r, client.Preconditions{UID: &r.UID}); err != nil && !apierrors.IsNotFound(err) {
			return "", fmt.Errorf("deleting replica %s on lost node: %w", r.Name, err)
		}
		deleted = append(deleted, r.Name)
		c.recorder.Eventf(rv, corev1.EventTypeWarning, EventReplicaDeleted, "Deleting replica %s: node %s is lost and the replica never joined", r.Name, r.Spec.NodeName)
	}

	refusal := ""
	gen := rv.Generation
	if needD+needTB > 0 {
		if work.Status.Configuration == nil || v.rsp == nil {
			refusal = "Waiting for the configuration and its storage pool"
			if v.configWhy != "" {
				refusal = v.configWhy
			}
			setCondChanged(&work.Status.Conditions, v1.ConditionScheduled, false, placement.ConstraintNoEligibleNodes, refusal, gen, v.now)
		} else {
			nodes, err := c.placementNodes(ctx, v, work)
			if err != nil {
				return "", err
			}
			in := placement.Input{Config: *work.Status.Configuration, Size: v.rv.Spec.Size, Existing: existingReplicas(v),
				Diskful: needD, TieBreaker: needTB, Nodes: nodes}
			for _, a := range v.rvas {
				if a.DeletionTimestamp == nil {
					in.AttachNodes = append(in.AttachNodes, a.Spec.NodeName)
				}
			}
			if h := v.rv.Spec.PlacementHints; h != nil {
				in.Requisite, in.Preferred = h.Requisite, h.Preferred
			}
			placed, err := placement.Place(in)
			var pe *placement.Error
			switch {
			case errors.As(err, &pe):
				refusal = pe.Message
				placementFailures.WithLabelValues(pe.Constraint).Inc()
				if setCondChanged(&work.Status.Conditions, v1.ConditionScheduled, false, pe.Constraint, pe.Message, gen, v.now) {
					c.recorder.Event(rv, corev1.EventTypeWarning, EventPlacementFailed, pe.Message)
				}
			case err != nil:
				return "", err
			default:
				for _, p := range placed {
					var storage *v1.ReplicaStorage
					if p.Type == v1.ReplicaTypeDiskful {
						storage = storageFor(v.rsp, p.Node)
					}
					if err := c.applyRVR(ctx, rv, p.Node, p.Type, storage, ""); err != nil {
						return "", fmt.Errorf("creating %s replica on %s: %w", p.Type, p.Node, err)
					}
					created = append(created, v1.ReplicaName(rv.Name, p.Node))
					why := ""
					if len(reasons) > 0 {
						why = ": " + reasons[0]
					}
					c.recorder.Eventf(rv, corev1.EventTypeNormal, EventReplicaPlaced, "Placed %s replica %s on node %s%s",
						p.Type, v1.ReplicaName(rv.Name, p.Node), p.Node, why)
				}
				setCondChanged(&work.Status.Conditions, v1.ConditionScheduled, true, reasonPlaced,
					fmt.Sprintf("Placed %d Diskful and %d TieBreaker replica(s)", needD, needTB), gen, v.now)
			}
		}
	}
	if needD+needTB == 0 {
		if sc := meta.FindStatusCondition(work.Status.Conditions, v1.ConditionScheduled); sc != nil && sc.Status == metav1.ConditionFalse {
			setCondChanged(&work.Status.Conditions, v1.ConditionScheduled, true, reasonPlaced, "Every wanted replica is placed", gen, v.now)
		}
		if len(wanted) == 0 && len(work.Status.DatameshTransitions) == 0 {
			name, err := c.eventuallyLocal(ctx, v, work)
			if err != nil {
				return "", err
			}
			if name != "" {
				created = append(created, name)
			}
		}
	}
	c.waitForCache(ctx, created, true)
	c.waitForCache(ctx, deleted, false)
	return refusal, nil
}

func existingReplicas(v *volume) []placement.Replica {
	out := make([]placement.Replica, 0, len(v.rvrs))
	for _, r := range v.rvrs {
		if r.Spec.NodeName != "" {
			out = append(out, placement.Replica{Node: r.Spec.NodeName, Type: r.Spec.Type, Deleting: r.DeletionTimestamp != nil})
		}
	}
	return out
}

// placementNodes builds placement's view of every node the cluster knows (a Node object
// or an agent Lease): pool membership and capacity from the pool's eligible nodes, the
// load from the replica index, and the capacity of replicas placed but not yet backed
// taken off the reported free space (the agent reports it only once it created them).
func (c *Controller) placementNodes(ctx context.Context, v *volume, work *v1.ReplicatedVolume) ([]placement.Node, error) {
	alg := ""
	if ss := work.Status.Datamesh.SharedSecret; ss != nil {
		alg = ss.Algorithm
	}
	eligible := map[string]v1.EligibleNode{}
	for _, e := range v.eligible {
		eligible[e.NodeName] = e
	}
	names := map[string]bool{}
	for n := range v.nodes {
		names[n] = true
	}
	for n := range v.leases {
		names[n] = true
	}
	sizes := map[string]int64{} // RV name → size, read once per reconcile
	var out []placement.Node
	for n := range names {
		pn := placement.Node{Name: n, Zone: nodeZone(v.nodes[n], v.leases[n]), AgentLive: v.liveness(n).Live, HMACOK: offersAlgorithm(v, n, alg),
			Cordoned: Cordoned(v.nodes[n])}
		if e, ok := eligible[n]; ok {
			pn.InPool, pn.PoolReady, pn.Zone = true, e.Ready, e.Zone
			pn.Cordoned = pn.Cordoned || e.Unschedulable
			if e.FreeCapacity != nil {
				pn.Free, pn.HasFree = e.FreeCapacity.Value(), true
			}
		}
		var onNode v1.ReplicatedVolumeReplicaList
		if err := c.reader.List(ctx, &onNode, client.MatchingFields{indexNode: n}, client.UnsafeDisableDeepCopy); err != nil {
			return nil, err
		}
		pn.Replicas = len(onNode.Items)
		if pn.InPool {
			for i := range onNode.Items {
				r := &onNode.Items[i]
				if r.Spec.Type != v1.ReplicaTypeDiskful || r.Status.BackingVolume != nil || r.DeletionTimestamp != nil ||
					r.Spec.Storage == nil || r.Spec.Storage.Pool != v.rsp.Name {
					continue
				}
				size, ok := sizes[r.Spec.ReplicatedVolumeName]
				if !ok {
					other := &v1.ReplicatedVolume{}
					if err := c.reader.Get(ctx, types.NamespacedName{Name: r.Spec.ReplicatedVolumeName}, other); err == nil {
						size = other.Spec.Size.Value()
					}
					sizes[r.Spec.ReplicatedVolumeName] = size
				}
				pn.Free -= placement.BackingBytes(size)
			}
		}
		out = append(out, pn)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// eventuallyLocal serves volumeAccess=EventuallyLocal: once a volume is attached through
// an Access replica and nothing else is in flight, that replica is retyped to Diskful
// (when its node is a ready node of the pool with room). The engine then runs
// ChangeReplicaType A → D and, the layout having one Diskful too many, asks to remove
// one that is not attached: the data has moved to where it is used. One at a time.
// It returns the retyped replica's name.
func (c *Controller) eventuallyLocal(ctx context.Context, v *volume, work *v1.ReplicatedVolume) (string, error) {
	cfg := work.Status.Configuration
	if cfg == nil || cfg.VolumeAccess != v1.VolumeAccessEventuallyLocal || v.rsp == nil {
		return "", nil
	}
	for _, m := range work.Status.Datamesh.Members {
		if !m.Attached || m.Type != v1.MemberTypeAccess {
			continue
		}
		var r *v1.ReplicatedVolumeReplica
		for _, x := range v.rvrs {
			if x.Name == m.Name {
				r = x
			}
		}
		if r == nil || r.DeletionTimestamp != nil || r.Spec.Type != v1.ReplicaTypeAccess {
			continue
		}
		nodes, err := c.placementNodes(ctx, v, work)
		if err != nil {
			return "", err
		}
		ok := false
		for _, n := range nodes {
			if n.Name == m.NodeName {
				ok = n.InPool && n.PoolReady && n.AgentLive && !n.Cordoned && n.HasFree && placement.Fits(n.Free, v.rv.Spec.Size.Value()) &&
					(len(cfg.Zones) == 0 || slices.Contains(cfg.Zones, n.Zone))
			}
		}
		if !ok {
			continue
		}
		if err := ignoreStale(c.applyRVR(ctx, v.rv, m.NodeName, v1.ReplicaTypeDiskful, storageFor(v.rsp, m.NodeName), r.ResourceVersion)); err != nil {
			return "", fmt.Errorf("retyping %s to Diskful (volumeAccess=EventuallyLocal): %w", r.Name, err)
		}
		c.recorder.Eventf(v.rv, corev1.EventTypeNormal, EventReplicaPlaced,
			"volumeAccess=EventuallyLocal: replica %s on attached node %s becomes Diskful", r.Name, m.NodeName)
		return "", nil
	}
	return "", nil
}
