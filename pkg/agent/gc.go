package agent

import (
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/storage"
)

// runGC looks for DRBD resources and backing volumes that no replica of this
// node owns any more and removes them: a node that comes back after the
// controller force-removed its replicas finds them gone (docs/contract.md
// "Node that is gone") and must never reuse their stale data. A backing volume
// is owned by its key (backingKey), so the volume of a force-removed replica
// goes even when a new replica of the same name is already placed here.
//
// It runs only with a synced cache and a synced Observer: an empty cache
// must never read as "nothing is ours" (kubelet's reconstruct.go: unknown
// never means delete).
func (a *Agent) runGC(ctx context.Context) error {
	if !a.cache.WaitForCacheSync(ctx) {
		return nil
	}
	t := time.NewTicker(a.cfg.GCInterval)
	defer t.Stop()
	for {
		if a.obs.Synced() {
			a.collect(ctx)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// collect is one pass. The kernel and the pools are listed before the
// replicas: whatever the agent created was for a replica already in the
// cache, so a replica created meanwhile is never mistaken for a missing one.
func (a *Agent) collect(ctx context.Context) {
	// The event stream's view of the kernel, not `drbdsetup status all`: the
	// collector runs only while the Observer is synced, and a resource the
	// stream has not shown yet was created for a replica already in the cache.
	resources := a.obs.Resources()
	type poolVols struct {
		name string
		vols []string
	}
	var pools []poolVols
	var rsps v1.ReplicatedStoragePoolList
	if err := a.cache.List(ctx, &rsps); err != nil {
		return
	}
	for i := range rsps.Items {
		p, err := a.providerFor(&rsps.Items[i])
		if err != nil {
			continue
		}
		names, err := volumeNames(ctx, p)
		if err != nil {
			a.log.Error(err, "gc: listing pool", "pool", rsps.Items[i].Name)
			continue
		}
		pools = append(pools, poolVols{name: rsps.Items[i].Name, vols: names})
	}
	var rvrs v1.ReplicatedVolumeReplicaList
	// Read only, without copies: the sweep reads every replica of the node.
	if err := a.cache.List(ctx, &rvrs, client.MatchingLabels{v1.LabelNode: a.cfg.NodeName}, client.UnsafeDisableDeepCopy); err != nil {
		return
	}
	volumes, replicas := map[string]bool{}, map[string]bool{}
	for i := range rvrs.Items {
		volumes[rvrs.Items[i].Spec.ReplicatedVolumeName] = true
		replicas[backingKey(&rvrs.Items[i])] = true
	}
	for _, r := range resources {
		if volumes[r] {
			continue
		}
		a.log.Info("gc: no replica of this node owns DRBD resource; taking it down", "resource", r)
		if err := a.takeDown(ctx, r); err != nil {
			a.log.Error(err, "gc: taking down", "resource", r)
		}
	}
	for _, pv := range pools {
		for _, replica := range pv.vols {
			if replicas[replica] {
				continue
			}
			p, err := a.provider(ctx, pv.name)
			if err != nil {
				continue
			}
			a.log.Info("gc: no replica owns backing volume; deleting it", "pool", pv.name, "replica", replica)
			if err := p.Delete(ctx, replica); err != nil {
				a.log.Error(err, "gc: deleting backing volume", "replica", replica)
				continue
			}
			a.markCapacity()
		}
	}
}

// namesLister is a provider that lists its volumes' names more cheaply than List,
// which resolves each volume's device (the file pool checks every loop device's
// status): the collector needs only the names.
type namesLister interface {
	Names(ctx context.Context) ([]string, error)
}

// volumeNames lists the names of p's volumes.
func volumeNames(ctx context.Context, p storage.Provider) ([]string, error) {
	if n, ok := p.(namesLister); ok {
		return n.Names(ctx)
	}
	vols, err := p.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(vols))
	for _, v := range vols {
		out = append(out, v.Replica)
	}
	return out, nil
}
