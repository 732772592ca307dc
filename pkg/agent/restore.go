package agent

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/storage"
)

// A volume with spec.dataSource starts from a snapshot (docs/snapshots.md, "Restore
// and clone"): until it is formed, its Diskful replica on dataSource.nodeName is created
// from that node's copy and made UpToDate by a forced promotion; every other replica is
// created empty and syncs from it. Nothing else ever starts from a copy: a replica that
// joins later, even on that node, is empty and resyncs.

// seeding: this member is the one the volume's data source seeds, and the volume is not
// formed yet.
func seeding(rv *v1.ReplicatedVolume, node string, t v1.MemberType) bool {
	ds := rv.Spec.DataSource
	return ds != nil && ds.NodeName == node && t == v1.MemberTypeDiskful &&
		!meta.IsStatusConditionTrue(rv.Status.Conditions, v1.ConditionFormed)
}

// seedSource is the Source a replica's new backing volume is created from: this node's
// copy of the data source, its data part only (DRBD's metadata of the origin is cut
// off), or nil for an empty volume.
func (a *Agent) seedSource(ctx context.Context, rvr *v1.ReplicatedVolumeReplica, rv *v1.ReplicatedVolume) (*storage.Source, error) {
	m := memberOf(rv, rvr.Name)
	if m == nil || !seeding(rv, a.cfg.NodeName, m.Type) {
		return nil, nil
	}
	ds := rv.Spec.DataSource
	rvs := &v1.ReplicatedVolumeSnapshot{}
	if err := a.cache.Get(ctx, types.NamespacedName{Name: ds.ReplicatedVolumeSnapshotName}, rvs); err != nil {
		return nil, fmt.Errorf("data source: snapshot %s: %w", ds.ReplicatedVolumeSnapshotName, err)
	}
	for _, e := range rvs.Status.Nodes {
		if e.NodeName != a.cfg.NodeName || e.Copy == nil {
			continue
		}
		if e.Copy.Pool != rvr.Spec.Storage.Pool {
			return nil, fmt.Errorf("data source: snapshot %s's copy on this node is in pool %q, the replica's pool is %q", rvs.Name, e.Copy.Pool, rvr.Spec.Storage.Pool)
		}
		return &storage.Source{Snapshot: e.Copy.Name, DataBytes: drbd.UsableBytes(e.Copy.SizeBytes, v1.DRBDMaxPeers)}, nil
	}
	return nil, fmt.Errorf("data source: snapshot %s has no copy on node %s", rvs.Name, a.cfg.NodeName)
}

// seed makes the seeded replica's disk UpToDate once DRBD runs it: its data is the
// snapshot's, and its fresh metadata calls it Inconsistent. A forced promotion is DRBD's
// way to say "this disk is the data"; the peers then sync from it, and applyRole demotes
// it again unless it is attached.
func (a *Agent) seed(ctx context.Context, rv *v1.ReplicatedVolume, self *v1.DatameshMember) bool {
	if !seeding(rv, self.NodeName, self.Type) {
		return false
	}
	s, ok := a.obs.Snapshot(rv.Name)
	if !ok {
		return false
	}
	if d := s.Devices[drbd.VolumeNumber]; d == nil || d.DiskState != "Inconsistent" {
		return false
	}
	why := drbd.ForceReason(fmt.Sprintf("restore: the disk holds snapshot %s's data", rv.Spec.DataSource.ReplicatedVolumeSnapshotName))
	if err := a.drv.Primary(ctx, rv.Name, why); err != nil {
		a.log.Error(err, "seeding the restored volume (primary --force)", "volume", rv.Name)
		return false
	}
	a.log.Info("restored volume seeded: this replica's disk is UpToDate, the others sync from it", "volume", rv.Name)
	return true
}
