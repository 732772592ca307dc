package csi

import (
	"context"
	"errors"
	"math"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh/layout"
	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/placement"
)

// eligibleNodes are the eligible nodes of pool as the controller reports them in the
// pool's status (none when the pool does not exist).
func (c *Controller) eligibleNodes(ctx context.Context, pool string) ([]v1.EligibleNode, error) {
	rsp := &v1.ReplicatedStoragePool{}
	if err := c.Client.Get(ctx, client.ObjectKey{Name: pool}, rsp); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, internal("reading ReplicatedStoragePool "+pool, err)
	}
	return rsp.Status.EligibleNodes, nil
}

// poolNode is one eligible node of a pool with what a volume could use there.
type poolNode struct {
	name, zone string
	usable     int64 // after DRBD metadata
	known      bool  // the controller reported free capacity
}

// poolNodes lists the ready, schedulable nodes of the class's pool inside its zones.
func (c *Controller) poolNodes(ctx context.Context, rsc *v1.ReplicatedStorageClass) ([]poolNode, error) {
	eligible, err := c.eligibleNodes(ctx, rsc.Spec.StoragePool)
	if err != nil {
		return nil, err
	}
	var out []poolNode
	for _, n := range eligible {
		if !n.Ready || n.Unschedulable {
			continue
		}
		if len(rsc.Spec.Zones) > 0 && !slices.Contains(rsc.Spec.Zones, n.Zone) {
			continue
		}
		p := poolNode{name: n.NodeName, zone: n.Zone}
		if n.FreeCapacity != nil {
			p.known = true
			p.usable = drbd.UsableBytes(n.FreeCapacity.Value(), v1.DRBDMaxPeers)
		}
		out = append(out, p)
	}
	return out, nil
}

// checkCapacity refuses, with ResourceExhausted, a volume the pool as it is cannot
// place. It asks placement (pkg/placement), the rule the controller places replicas
// by, for the layout's Diskful and TieBreaker replicas on the pool's eligible nodes,
// with the class's topology, zones and volumeAccess and the request's accessibility
// requirements. What the CSI service cannot know yet counts in the volume's favour:
// a node whose free space the controller has not reported counts as having room, and
// every node as offering the shared-secret algorithm (chosen once members exist).
// Only what is known not to fit is refused; placement decides the rest once the
// volume exists.
func (c *Controller) checkCapacity(ctx context.Context, rsc *v1.ReplicatedStorageClass, l layout.Layout, r createRequest) error {
	eligible, err := c.eligibleNodes(ctx, rsc.Spec.StoragePool)
	if err != nil {
		return err
	}
	in := placement.Input{
		Config: v1.ReplicatedVolumeConfiguration{StoragePool: rsc.Spec.StoragePool, FailuresToTolerate: int32(l.FTT),
			GuaranteedMinimumDataRedundancy: int32(l.GMDR), Topology: rsc.Spec.Topology, Zones: rsc.Spec.Zones,
			VolumeAccess: rsc.Spec.VolumeAccess},
		Size:       *resource.NewQuantity(r.size, resource.BinarySI),
		Diskful:    l.DiskfulCount(),
		TieBreaker: layout.TieBreakerMin(l.DiskfulCount(), l.FTT),
	}
	if r.hints != nil {
		in.Requisite, in.Preferred = r.hints.Requisite, r.hints.Preferred
	}
	for _, e := range eligible {
		n := placement.Node{Name: e.NodeName, Zone: e.Zone, InPool: true, PoolReady: e.Ready, AgentLive: e.Ready,
			Cordoned: e.Unschedulable, HMACOK: true, Free: math.MaxInt64, HasFree: true}
		if e.FreeCapacity != nil {
			n.Free = e.FreeCapacity.Value()
		}
		in.Nodes = append(in.Nodes, n)
	}
	_, err = placement.Place(in)
	var refused *placement.Error
	if !errors.As(err, &refused) {
		return err
	}
	field := "capacity_range"
	if refused.Constraint == placement.ConstraintRequisite {
		field = "accessibility_requirements.requisite"
	}
	return status.Errorf(codes.ResourceExhausted, "%s: a %s volume of ReplicatedStorageClass %q (layout %s) does not fit: %s",
		field, in.Size.String(), rsc.Name, l, refused.Message)
}

// checkGrowth refuses, with ResourceExhausted and before spec.size changes (it
// never shrinks again), a size that a diskful replica's node is known not to have
// room for: its backing volume grows to placement.BackingBytes(want) from what it has,
// out of the pool's free space on that node (RSP status), the rule CreateVolume's
// checkCapacity applies. A node or a backing volume not reported yet counts as
// fitting; the agent then says what it cannot do.
func (c *Controller) checkGrowth(ctx context.Context, rv *v1.ReplicatedVolume, want int64) error {
	cfg := rv.Status.Configuration
	if cfg == nil || cfg.StoragePool == "" {
		return nil
	}
	rsp := &v1.ReplicatedStoragePool{}
	if err := c.Client.Get(ctx, client.ObjectKey{Name: cfg.StoragePool}, rsp); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return internal("reading ReplicatedStoragePool "+cfg.StoragePool, err)
	}
	free := map[string]int64{}
	for _, n := range rsp.Status.EligibleNodes {
		if n.FreeCapacity != nil {
			free[n.NodeName] = n.FreeCapacity.Value()
		}
	}
	need := placement.BackingBytes(want)
	for _, m := range rv.Status.Datamesh.Members {
		f, known := free[m.NodeName]
		if !m.Type.HasDisk() || !known {
			continue
		}
		var r v1.ReplicatedVolumeReplica
		if err := c.Client.Get(ctx, client.ObjectKey{Name: m.Name}, &r); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return internal("reading ReplicatedVolumeReplica "+m.Name, err)
		}
		b := r.Status.BackingVolume
		if b == nil {
			continue
		}
		if more := need - b.Size.Value(); more > f {
			return status.Errorf(codes.ResourceExhausted,
				"capacity_range.required_bytes: growing to %d bytes needs %d more bytes of storage pool %q on node %s (replica %s's backing volume from %d to %d bytes, DRBD metadata included); it has %d free",
				want, more, cfg.StoragePool, m.NodeName, m.Name, b.Size.Value(), need, f)
		}
	}
	return nil
}
