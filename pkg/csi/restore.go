package csi

import (
	"context"
	"slices"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/pkg/agentlease"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/placement"
)

// Restores and clones (docs/snapshots.md, "Restore and clone"): a volume created from a
// snapshot gets spec.dataSource, naming the snapshot and the node whose copy seeds its
// first Diskful replica; a clone restores a snapshot CreateVolume takes of the source
// volume for it.

// cloneSnapshotName is the snapshot a clone into volume rv is made from.
func cloneSnapshotName(rv string) (name, csiName string, hashed bool) {
	csiName = "clone-" + rv
	name, hashed = rvNameFor(csiName)
	return name, csiName, hashed
}

// resolveSource turns r.source into r.dataSource and the volume's size: the snapshot
// (for a clone, one taken now of the source volume, waited for), its pool checked
// against the class's, the size at least the snapshot's, and the seeding node one of
// its copies in the requested topology.
func (c *Controller) resolveSource(ctx context.Context, r *createRequest, rsc *v1.ReplicatedStorageClass, cr *csipb.CapacityRange) error {
	if r.source == nil {
		return nil
	}
	id := r.source.snapshot
	if vol := r.source.volume; vol != "" {
		name, csiName, hashed := cloneSnapshotName(r.rvName)
		rvs, err := c.snapshotFor(ctx, name, csiName, hashed, vol, map[string]string{LabelCloneOf: vol})
		if err != nil {
			if status.Code(err) == codes.NotFound {
				return status.Errorf(codes.NotFound, "volume_content_source.volume.volume_id: volume %q does not exist", vol)
			}
			return err
		}
		id = rvs.Name
		if _, err := c.waitSnapshotReady(ctx, id); err != nil {
			return err
		}
	}
	rvs, err := c.getRVS(ctx, id)
	if err != nil {
		return err
	}
	if rvs == nil || rvs.DeletionTimestamp != nil {
		return status.Errorf(codes.NotFound, "volume_content_source.snapshot.snapshot_id: snapshot %q does not exist", id)
	}
	if !rvs.Status.ReadyToUse {
		return status.Errorf(codes.Unavailable, "volume_content_source.snapshot.snapshot_id: snapshot %q is not ready (%s: %s); retry", id, rvs.Status.Phase, rvs.Status.Message)
	}
	if rvs.Status.StoragePool != rsc.Spec.StoragePool {
		return invalid("volume_content_source: snapshot %q lives in storage pool %q, and ReplicatedStorageClass %q places volumes in %q; a restore stays in the snapshot's pool",
			id, rvs.Status.StoragePool, rsc.Name, rsc.Spec.StoragePool)
	}
	if err := restoreSize(r, rvs, cr); err != nil {
		return err
	}
	live, err := c.liveAgents(ctx)
	if err != nil {
		return err
	}
	node, err := seedNode(rvs, r.hints, live)
	if err != nil {
		return err
	}
	r.dataSource = &v1.VolumeDataSource{ReplicatedVolumeSnapshotName: rvs.Name, NodeName: node}
	return nil
}

// restoreSize: a restore holds the whole snapshot. A capacity_range that asks for less is
// OUT_OF_RANGE, as the CSI specification says; no capacity_range means the snapshot's size.
func restoreSize(r *createRequest, rvs *v1.ReplicatedVolumeSnapshot, cr *csipb.CapacityRange) error {
	if rvs.Status.Size == nil {
		return nil
	}
	snap := rvs.Status.Size.Value()
	if cr == nil || cr.GetRequiredBytes() == 0 && cr.GetLimitBytes() == 0 {
		r.size = max(snap, sizeAlign)
		return nil
	}
	if req := cr.GetRequiredBytes(); req > 0 && req < snap {
		return status.Errorf(codes.OutOfRange, "capacity_range.required_bytes: %d is smaller than snapshot %q (%d bytes)", req, rvs.Name, snap)
	}
	if lim := cr.GetLimitBytes(); lim > 0 && lim < snap {
		return status.Errorf(codes.OutOfRange, "capacity_range.limit_bytes: %d is smaller than snapshot %q (%d bytes)", lim, rvs.Name, snap)
	}
	r.size = max(r.size, snap)
	return nil
}

// seedNode picks the copy that seeds the restore among the copies on nodes whose agent
// is live (a copy on a lost node cannot seed anything; the snapshot lives on every
// diskful replica's node so that another copy can, docs/snapshots.md "Where snapshots
// live"): those in a requisite segment first, and among them the first preferred
// segment's, else the first by name; then the same among the others. A copy outside the requisite topology still seeds: the requested node
// uses the volume through a replica of its own that syncs from the seed (a provisioner
// with strict topology asks for the scheduler's node alone, which need not hold a copy;
// for volumeAccess Local placement adds a Diskful replica there). Segments are matched
// by node name; a zone-only segment is not narrowed here (placement honours it).
func seedNode(rvs *v1.ReplicatedVolumeSnapshot, hints *v1.PlacementHints, live map[string]bool) (string, error) {
	copies := slices.DeleteFunc(slices.Sorted(slices.Values(rvs.Status.Copies)), func(n string) bool { return !live[n] })
	if len(copies) == 0 {
		return "", status.Errorf(codes.Unavailable,
			"volume_content_source: every copy of snapshot %q, on %v, is on a node whose meshvol agent is not live; retry once one is back",
			rvs.Name, rvs.Status.Copies)
	}
	var req, pref []v1.TopologySegment
	if hints != nil {
		req, pref = hints.Requisite, hints.Preferred
	}
	inReq := func(n string) bool {
		return len(req) == 0 || slices.ContainsFunc(req, func(s v1.TopologySegment) bool { return placement.SegmentMatches(s, n, s.Zone) })
	}
	inside := slices.DeleteFunc(slices.Clone(copies), func(n string) bool { return !inReq(n) })
	outside := slices.DeleteFunc(copies, inReq)
	for _, tier := range [][]string{inside, outside} {
		for _, s := range pref {
			for _, n := range tier {
				if placement.SegmentMatches(s, n, s.Zone) {
					return n, nil
				}
			}
		}
		if len(tier) > 0 {
			return tier[0], nil
		}
	}
	return copies[0], nil // unreachable: copies is not empty
}

// liveAgents are the nodes whose agent holds an unexpired Lease.
func (c *Controller) liveAgents(ctx context.Context) (map[string]bool, error) {
	var l coordinationv1.LeaseList
	if err := c.Client.List(ctx, &l, client.InNamespace(c.Namespace)); err != nil {
		return nil, internal("listing agent Leases", err)
	}
	now := time.Now()
	live := map[string]bool{}
	for i := range l.Items {
		if n := agentlease.NodeName(&l.Items[i]); n != "" && agentlease.Judge(&l.Items[i], now, 0).Live {
			live[n] = true
		}
	}
	return live, nil
}

// sourceCompatible: a repeated CreateVolume names the same source.
func sourceCompatible(rv *v1.ReplicatedVolume, r createRequest) error {
	want := ""
	switch {
	case r.source == nil:
	case r.source.snapshot != "":
		want = r.source.snapshot
	default:
		want, _, _ = cloneSnapshotName(r.rvName)
	}
	got := ""
	if ds := rv.Spec.DataSource; ds != nil {
		got = ds.ReplicatedVolumeSnapshotName
	}
	if got != want {
		return status.Errorf(codes.AlreadyExists, "volume_content_source: volume %q exists with data source %q, not %q", rv.Name, got, want)
	}
	return nil
}

// dropCloneSnapshot deletes the snapshot a clone was made from once the clone is
// formed: its first replica holds the data then.
func (c *Controller) dropCloneSnapshot(ctx context.Context, r createRequest) error {
	if r.source == nil || r.source.volume == "" {
		return nil
	}
	name, _, _ := cloneSnapshotName(r.rvName)
	rvs, err := c.getRVS(ctx, name)
	if err != nil || rvs == nil || rvs.DeletionTimestamp != nil {
		return err
	}
	if err := c.Client.Delete(ctx, rvs); err != nil {
		return internal("deleting the clone's snapshot "+name, err)
	}
	return nil
}
