package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh"
	"github.com/meshvol/meshvol/pkg/placement"
)

// This file is the volume reconciler's replica step, the I/O side of placement: it
// creates, deletes and retypes RVRs to carry out what the engine wants. Where new
// replicas go is pkg/placement's to decide (Place, CheckAccess: pure, no client).

// replicaWrites are the replicas one placement step created and deleted: the next
// reconcile must find them in its cache (waitForCache).
type replicaWrites struct{ created, deleted []string }

// memberNeed counts the Diskful and TieBreaker replicas the engine wants created, with
// its reasons: Place puts them all or none.
type memberNeed struct {
	diskful, tieBreaker int
	reasons             []string
	// replaces are the replicas whose failed disks the new Diskful replace
	// (datamesh.WantedReplica.Replaces).
	replaces []string
}

// place carries out what the engine wants: Diskful and TieBreaker replicas through Place
// (all or none), Access replicas on their attachment's node, deletions and retypes. It
// sets the Scheduled condition on work and returns the refusal message, if any, and
// whether it created a replica that the cache already shows, with its other writes.
func (c *Controller) place(ctx context.Context, v *volume, work *v1.ReplicatedVolume, wanted []datamesh.WantedReplica, accessRefused map[string]string) (string, bool, error) {
	var w replicaWrites
	need, err := c.carryOut(ctx, v, work, wanted, accessRefused, &w)
	if err != nil {
		return "", false, err
	}
	if err := c.deleteNeverJoined(ctx, v, work, &w); err != nil {
		return "", false, err
	}
	refusal := ""
	if need.diskful+need.tieBreaker > 0 {
		refusal, err = c.placeMembers(ctx, v, work, need, &w)
	} else {
		err = c.nothingToPlace(ctx, v, work, wanted)
	}
	if err != nil {
		return "", false, err
	}
	seen := c.waitForCache(ctx, w.created, true)
	seen = c.waitForCache(ctx, w.deleted, false) && seen
	return refusal, len(w.created) > 0 && seen, nil
}

// carryOut creates the Access replicas, deletes and retypes what the engine wants, and
// counts the Diskful and TieBreaker replicas it wants created.
func (c *Controller) carryOut(ctx context.Context, v *volume, work *v1.ReplicatedVolume, wanted []datamesh.WantedReplica, accessRefused map[string]string, w *replicaWrites) (memberNeed, error) {
	byName := map[string]*v1.ReplicatedVolumeReplica{}
	for _, r := range v.rvrs {
		byName[r.Name] = r
	}
	var need memberNeed
	for _, want := range wanted {
		var err error
		switch want.Action {
		case datamesh.WantCreate:
			switch want.Type {
			case v1.ReplicaTypeDiskful:
				need.diskful++
				need.reasons = append(need.reasons, want.Reason)
				if want.Replaces != "" {
					need.replaces = append(need.replaces, want.Replaces)
				}
			case v1.ReplicaTypeTieBreaker:
				need.tieBreaker++
				need.reasons = append(need.reasons, want.Reason)
			case v1.ReplicaTypeAccess:
				err = c.createAccess(ctx, v, work, want, accessRefused, w)
			}
		case datamesh.WantDelete:
			err = c.deleteWanted(ctx, v.rv, byName[want.Replica], want.Reason, w)
		case datamesh.WantRetype:
			err = c.retype(ctx, v, byName[want.Replica], want.Type)
		}
		if err != nil {
			return memberNeed{}, err
		}
	}
	return need, nil
}

// createAccess creates an Access replica on the node of its attachment, unless that node
// cannot take one (placement.CheckAccess): then accessRefused says why, for the RVA's condition.
func (c *Controller) createAccess(ctx context.Context, v *volume, work *v1.ReplicatedVolume, want datamesh.WantedReplica, accessRefused map[string]string, w *replicaWrites) error {
	nodes, err := c.placementNodes(ctx, v, work)
	if err != nil {
		return err
	}
	if err := placement.CheckAccess(want.NodeName, existingReplicas(v, nil), nodes); err != nil {
		accessRefused[want.NodeName] = err.Error()
		placementFailures.WithLabelValues(placement.ConstraintAccessNode).Inc()
		return nil
	}
	if err := c.applyRVR(ctx, v.rv, want.NodeName, v1.ReplicaTypeAccess, nil, ""); err != nil {
		return fmt.Errorf("creating Access replica on %s: %w", want.NodeName, err)
	}
	name := v1.ReplicaName(v.rv.Name, want.NodeName)
	w.created = append(w.created, name)
	c.recorder.Eventf(v.rv, corev1.EventTypeNormal, EventReplicaPlaced, "Placed Access replica %s on node %s: %s", name, want.NodeName, want.Reason)
	return nil
}

// deleteWanted deletes replica r (when it exists and is not already being deleted).
func (c *Controller) deleteWanted(ctx context.Context, rv *v1.ReplicatedVolume, r *v1.ReplicatedVolumeReplica, reason string, w *replicaWrites) error {
	if r == nil || r.DeletionTimestamp != nil {
		return nil
	}
	if err := c.deleteReplica(ctx, r); err != nil {
		return fmt.Errorf("deleting replica %s: %w", r.Name, err)
	}
	w.deleted = append(w.deleted, r.Name)
	c.recorder.Eventf(rv, corev1.EventTypeNormal, EventReplicaDeleted, "Deleting replica %s: %s", r.Name, reason)
	return nil
}

// retype changes replica r's type to t, never recreating a replica that is gone.
func (c *Controller) retype(ctx context.Context, v *volume, r *v1.ReplicatedVolumeReplica, t v1.ReplicaType) error {
	if r == nil || r.DeletionTimestamp != nil || r.Spec.Type == t {
		return nil
	}
	// A replica retyped to Access or TieBreaker keeps its storage: its member stays
	// Diskful until the engine's retype has detached the disk, and its agent needs the
	// storage to run it until then and to free the backing volume after
	// (docs/controller.md, "Retyping a replica").
	storage := r.Spec.Storage
	if (t == v1.ReplicaTypeDiskful || t == v1.ReplicaTypeShadowDiskful) && v.rsp != nil {
		storage = storageFor(v.rsp, r.Spec.NodeName)
	}
	if err := ignoreStale(c.applyRVR(ctx, v.rv, r.Spec.NodeName, t, storage, r.ResourceVersion)); err != nil {
		return fmt.Errorf("retyping replica %s to %s: %w", r.Name, t, err)
	}
	return nil
}

// deleteNeverJoined deletes the replicas that never joined, on nodes that are lost: they
// will never join, and nothing of the datamesh is on them, so the engine may ask for
// one elsewhere.
func (c *Controller) deleteNeverJoined(ctx context.Context, v *volume, work *v1.ReplicatedVolume, w *replicaWrites) error {
	for _, r := range v.rvrs {
		if r.DeletionTimestamp != nil || r.Spec.NodeName == "" || inDatamesh(work, r.Name) ||
			!c.judge(v, r.Spec.NodeName).Lost {
			continue
		}
		if err := c.deleteReplica(ctx, r); err != nil {
			return fmt.Errorf("deleting replica %s on lost node: %w", r.Name, err)
		}
		w.deleted = append(w.deleted, r.Name)
		c.recorder.Eventf(v.rv, corev1.EventTypeWarning, EventReplicaDeleted, "Deleting replica %s: node %s is lost and the replica never joined", r.Name, r.Spec.NodeName)
	}
	return nil
}

// deleteReplica deletes r if it is still the object the cache showed (same UID); one
// already gone is not an error.
func (c *Controller) deleteReplica(ctx context.Context, r *v1.ReplicatedVolumeReplica) error {
	if err := c.client.Delete(ctx, r, client.Preconditions{UID: &r.UID}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// placeMembers places the Diskful and TieBreaker replicas the engine wants, all or none
// (Place), sets the Scheduled condition and returns placement's refusal, if any.
func (c *Controller) placeMembers(ctx context.Context, v *volume, work *v1.ReplicatedVolume, need memberNeed, w *replicaWrites) (string, error) {
	if work.Status.Configuration == nil || v.rsp == nil {
		refusal := "Waiting for the configuration and its storage pool"
		if v.configWhy != "" {
			refusal = v.configWhy
		}
		v.setCondition(work, v1.ConditionScheduled, false, placement.ConstraintNoEligibleNodes, refusal)
		return refusal, nil
	}
	in, err := c.placementInput(ctx, v, work, need)
	if err != nil {
		return "", err
	}
	placed, err := placement.Place(in)
	var pe *placement.Error
	if errors.As(err, &pe) {
		placementFailures.WithLabelValues(pe.Constraint).Inc()
		if v.setCondition(work, v1.ConditionScheduled, false, pe.Constraint, pe.Message) {
			c.recorder.Event(v.rv, corev1.EventTypeWarning, EventPlacementFailed, pe.Message)
		}
		return pe.Message, nil
	}
	if err != nil {
		return "", err
	}
	if err := c.createPlaced(ctx, v, placed, need.reasons, w); err != nil {
		return "", err
	}
	v.setCondition(work, v1.ConditionScheduled, true, reasonPlaced,
		fmt.Sprintf("Placed %d Diskful and %d TieBreaker replica(s)", need.diskful, need.tieBreaker))
	return "", nil
}

// placementInput is what Place needs to know about the volume and the cluster.
func (c *Controller) placementInput(ctx context.Context, v *volume, work *v1.ReplicatedVolume, need memberNeed) (placement.Input, error) {
	nodes, err := c.placementNodes(ctx, v, work)
	if err != nil {
		return placement.Input{}, err
	}
	in := placement.Input{Config: *work.Status.Configuration, Size: v.rv.Spec.Size, Existing: existingReplicas(v, need.replaces),
		Diskful: need.diskful, TieBreaker: need.tieBreaker, Nodes: nodes}
	for _, a := range v.rvas {
		if a.DeletionTimestamp == nil {
			in.AttachNodes = append(in.AttachNodes, a.Spec.NodeName)
		}
	}
	if h := v.rv.Spec.PlacementHints; h != nil {
		in.Requisite, in.Preferred = h.Requisite, h.Preferred
	}
	if ds := v.rv.Spec.DataSource; ds != nil && !meta.IsStatusConditionTrue(work.Status.Conditions, v1.ConditionFormed) {
		in.SeedNode = ds.NodeName // only the first replicas start from the source's copy
	}
	return in, nil
}

// createPlaced creates the replicas Place chose and says so in one Event for the
// decision, not one per replica (docs/controller.md, "Write budget"), with the engine's
// first reason.
func (c *Controller) createPlaced(ctx context.Context, v *volume, placed []placement.Choice, reasons []string, w *replicaWrites) error {
	var done []string
	defer func() {
		if len(done) == 0 {
			return
		}
		why := ""
		if len(reasons) > 0 {
			why = ": " + reasons[0]
		}
		c.recorder.Eventf(v.rv, corev1.EventTypeNormal, EventReplicaPlaced, "Placed %s%s", strings.Join(done, ", "), why)
	}()
	for _, p := range placed {
		var storage *v1.ReplicaStorage
		if p.Type == v1.ReplicaTypeDiskful {
			storage = storageFor(v.rsp, p.Node)
		}
		if err := c.applyRVR(ctx, v.rv, p.Node, p.Type, storage, ""); err != nil {
			return fmt.Errorf("creating %s replica on %s: %w", p.Type, p.Node, err)
		}
		name := v1.ReplicaName(v.rv.Name, p.Node)
		w.created = append(w.created, name)
		done = append(done, fmt.Sprintf("%s replica %s on node %s", p.Type, name, p.Node))
	}
	return nil
}

// nothingToPlace: the engine wants no Diskful or TieBreaker replica. A Scheduled=False
// left by an earlier refusal turns True; with nothing wanted and nothing in flight,
// volumeAccess=EventuallyLocal may move data to where it is used (eventuallyLocal).
func (c *Controller) nothingToPlace(ctx context.Context, v *volume, work *v1.ReplicatedVolume, wanted []datamesh.WantedReplica) error {
	if sc := meta.FindStatusCondition(work.Status.Conditions, v1.ConditionScheduled); sc != nil && sc.Status == metav1.ConditionFalse {
		v.setCondition(work, v1.ConditionScheduled, true, reasonPlaced, "Every wanted replica is placed")
	}
	if len(wanted) == 0 && len(work.Status.DatameshTransitions) == 0 {
		return c.eventuallyLocal(ctx, v, work)
	}
	return nil
}

// existingReplicas are the volume's replicas for placement. Those named in replaced
// (their failed disk is what the Diskful placed now replaces: datamesh.WantedReplica.
// Replaces) count as going, as a deleted one does: the zone rules fill their zone
// again rather than count it full, and their node, still holding them, stays taken.
func existingReplicas(v *volume, replaced []string) []placement.Replica {
	out := make([]placement.Replica, 0, len(v.rvrs))
	for _, r := range v.rvrs {
		if r.Spec.NodeName != "" {
			out = append(out, placement.Replica{Node: r.Spec.NodeName, Type: r.Spec.Type,
				Deleting: r.DeletionTimestamp != nil || slices.Contains(replaced, r.Name)})
		}
	}
	return out
}

// placementNodes builds placement's view of every node the cluster knows (a Node object
// or an agent Lease): pool membership and capacity from the pool's eligible nodes, the
// load from the replicas counted on each node, and the capacity of replicas placed but
// not yet backed taken off the reported free space (the agent reports it only once it
// created them). The counts are kept as the cache's events come (nodeLoads): a
// placement reads no replica and no other volume, so it costs O(nodes).
func (c *Controller) placementNodes(ctx context.Context, v *volume, work *v1.ReplicatedVolume) ([]placement.Node, error) {
	if err := c.load.waitSynced(ctx); err != nil {
		return nil, err
	}
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
	pool := ""
	if v.rsp != nil {
		pool = v.rsp.Name
	}
	var out []placement.Node
	for n := range names {
		pn := placement.Node{Name: n, Zone: nodeZone(v.nodes[n], v.leases[n]), AgentLive: v.liveness(n).Live, HMACOK: offersAlgorithm(v, n, alg),
			Cordoned: Cordoned(v.nodes[n]), PortsFull: c.alloc.NodeFull(n)}
		if e, ok := eligible[n]; ok {
			pn.InPool, pn.PoolReady, pn.Zone = true, e.Ready, e.Zone
			pn.Cordoned = pn.Cordoned || e.Unschedulable
			if e.FreeCapacity != nil {
				pn.Free, pn.HasFree = e.FreeCapacity.Value(), true
			}
		}
		replicas, unbacked := c.load.load(n, pool)
		pn.Replicas = replicas
		if pn.InPool {
			pn.Free -= unbacked
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
func (c *Controller) eventuallyLocal(ctx context.Context, v *volume, work *v1.ReplicatedVolume) error {
	cfg := work.Status.Configuration
	if cfg == nil || cfg.VolumeAccess != v1.VolumeAccessEventuallyLocal || v.rsp == nil {
		return nil
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
			return err
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
			return fmt.Errorf("retyping %s to Diskful (volumeAccess=EventuallyLocal): %w", r.Name, err)
		}
		c.recorder.Eventf(v.rv, corev1.EventTypeNormal, EventReplicaPlaced,
			"volumeAccess=EventuallyLocal: replica %s on attached node %s becomes Diskful", r.Name, m.NodeName)
		return nil
	}
	return nil
}
