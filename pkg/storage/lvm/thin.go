package lvm

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/meshvol/meshvol/pkg/storage"
)

// Thin provides thin volumes and thin snapshots in one thin pool.
//
// Thin pool facts this provider is built on (captures 27-31):
//   - The pool itself is never created, resized or removed here; an
//     administrator (or a later issue) owns it. lvremove -y of a pool removes
//     every thin LV in it without asking (31b), so lvremove is only ever given
//     the exact name of an LV whose tag we checked.
//   - Removing a thin origin leaves its thin snapshots in place (30e, 30f):
//     snapshots outlive the volume they were taken from, as CSI expects.
//   - A thin snapshot is created with the activation-skip flag (27b, "k" in
//     lv_attr) and stays inactive until activated with -K (28, 28c); it holds
//     no device node until a clone or restore needs it.
//   - An old-style COW snapshot (-s -L) of a thin origin blocks lvextend of the
//     origin (29); this provider never creates one.
type Thin struct {
	core
}

var (
	_ storage.Provider    = (*Thin)(nil)
	_ storage.Snapshotter = (*Thin)(nil)
)

// NewThin returns a provider for thin pool pool in volume group vg.
func NewThin(vg, pool string, opts Options) (*Thin, error) {
	if err := validateName("thin pool", pool); err != nil {
		return nil, &storage.Error{Op: "configure", Pool: vg + "/" + pool, Kind: storage.ErrInvalidName, Detail: err.Error()}
	}
	c, err := newCore(vg, pool, opts)
	if err != nil {
		return nil, err
	}
	return &Thin{core: c}, nil
}

// Create implements storage.Provider with
//
//	lvcreate -y -V <size> -T <vg>/<pool> -n <replica> --addtag meshvol.io/owner=<replica>
//
// (25b). lvm2 warns on stderr when the pool is overcommitted (25); that is a
// warning, not a failure, and capacity planning is the controller's job.
func (t *Thin) Create(ctx context.Context, req storage.CreateRequest) (storage.Volume, error) {
	if req.Source != nil {
		// An empty volume in its place would be made UpToDate by the restore's
		// forced promotion: refuse rather than hand out zeros as the data.
		return storage.Volume{}, &storage.Error{Op: "create", Pool: t.poolName(), Name: req.Replica, Kind: storage.ErrFailedPrecondition,
			Detail: fmt.Sprintf("creating a volume from snapshot %q is not built for LVM thin pools (docs/snapshots.md, \"Pools\")", req.Source.Snapshot)}
	}
	return t.create(ctx, req, []string{"-y", "-V", sizeArg(req.SizeBytes), "-T", t.vg + "/" + t.pool, "-n", req.Replica, "--addtag", ownerTag(req.Replica)})
}

// Capacity implements storage.Provider from the pool's lvs row: lv_size is
// the pool's data size and data_percent its used share (26b). lvm2 prints the
// percentage with two decimals, so FreeBytes is exact to 0.01% of the pool.
// ProvisionedBytes adds up the virtual sizes of all thin LVs in the pool,
// snapshots included, as lvm2's own overcommit warning does (27).
func (t *Thin) Capacity(ctx context.Context) (storage.Capacity, error) {
	const op = "capacity"
	lvs, err := t.lvs(ctx, op, "")
	if err != nil {
		return storage.Capacity{}, err
	}
	var pool *LV
	var provisioned int64
	for i, lv := range lvs {
		if lv.VG != t.vg {
			continue
		}
		if lv.Name == t.pool && lv.IsThinPool() {
			pool = &lvs[i]
		}
		if lv.Pool == t.pool {
			provisioned += lv.Size
		}
	}
	if pool == nil {
		return storage.Capacity{}, &storage.Error{Op: op, Pool: t.poolName(), Kind: storage.ErrPoolNotFound,
			Detail: fmt.Sprintf("lvs does not list thin pool %s/%s", t.vg, t.pool)}
	}
	if !pool.HasData {
		// An inactive pool reports no usage; guessing "all free" would let
		// placement overfill it.
		return storage.Capacity{}, &storage.Error{Op: op, Pool: t.poolName(), Kind: storage.ErrFailedPrecondition,
			Detail: fmt.Sprintf("thin pool %s/%s reports no data_percent (attr %q): is it active?", t.vg, t.pool, pool.Attr)}
	}
	used := int64(math.Ceil(float64(pool.Size) * pool.DataPercent / 100))
	if used > pool.Size {
		used = pool.Size
	}
	return storage.Capacity{
		Pool:             t.poolName(),
		TotalBytes:       pool.Size,
		FreeBytes:        pool.Size - used,
		ProvisionedBytes: provisioned,
		MetadataPercent:  pool.MetadataPercent,
	}, nil
}

// CreateSnapshot implements storage.Snapshotter with
//
//	lvcreate -y -s -n <name> --addtag meshvol.io/snapshot=<name> --addtag meshvol.io/origin=<replica> <vg>/<origin>
//
// (27, plus our tags). No size: a thin snapshot shares the pool. The origin
// must be our thin volume. A name clash is success only if the existing LV is
// our snapshot of the same replica.
func (t *Thin) CreateSnapshot(ctx context.Context, req storage.SnapshotRequest) (storage.Snapshot, error) {
	const op = "snapshot"
	if err := validateLVName("snapshot name", t.vg, req.Name); err != nil {
		return storage.Snapshot{}, &storage.Error{Op: op, Pool: t.poolName(), Name: req.Name, Kind: storage.ErrInvalidName, Detail: err.Error()}
	}
	if err := t.validateReplica(op, req.Replica); err != nil {
		return storage.Snapshot{}, err
	}
	origin, err := t.owned(ctx, op, req.Replica)
	if err != nil {
		return storage.Snapshot{}, err
	}
	_, _, err = t.lvm(ctx, "lvcreate", "-y", "-s", "-n", req.Name,
		"--addtag", snapshotTag(req.Name), "--addtag", originTag(req.Replica), t.vg+"/"+origin.Name)
	if err == nil {
		// A thin snapshot has its origin's virtual size at the time it is taken
		// (27b), which is the origin row we just read.
		return storage.Snapshot{Name: req.Name, Replica: req.Replica, Pool: t.poolName(), SizeBytes: origin.Size}, nil
	}
	serr := t.fail(op, req.Name, err)
	if !errors.Is(serr.Kind, storage.ErrAlreadyExists) {
		return storage.Snapshot{}, serr
	}
	lv, found, ferr := t.find(ctx, op, req.Name)
	if ferr != nil {
		return storage.Snapshot{}, ferr
	}
	if !found {
		return storage.Snapshot{}, serr
	}
	if err := t.checkSnapshot(op, req.Name, lv); err != nil {
		return storage.Snapshot{}, err
	}
	if got := tagValue(lv, originKey); got != req.Replica {
		return storage.Snapshot{}, &storage.Error{Op: op, Pool: t.poolName(), Name: req.Name, Kind: storage.ErrAlreadyExists,
			Detail: fmt.Sprintf("snapshot %s/%s exists but was taken of replica %q, not %q", t.vg, lv.Name, got, req.Replica)}
	}
	return t.snapshot(lv), nil
}

// DeleteSnapshot implements storage.Snapshotter.
func (t *Thin) DeleteSnapshot(ctx context.Context, name string) error {
	const op = "delete snapshot"
	if err := validateLVName("snapshot name", t.vg, name); err != nil {
		return &storage.Error{Op: op, Pool: t.poolName(), Name: name, Kind: storage.ErrInvalidName, Detail: err.Error()}
	}
	lv, found, err := t.find(ctx, op, name)
	if err != nil {
		return err
	}
	if !found {
		return nil
	}
	if err := t.checkSnapshot(op, name, lv); err != nil {
		return err
	}
	return t.remove(ctx, op, name, lv.Name)
}

// ListSnapshots implements storage.Snapshotter.
func (t *Thin) ListSnapshots(ctx context.Context, replica string) ([]storage.Snapshot, error) {
	const op = "list snapshots"
	lvs, err := t.lvs(ctx, op, replica)
	if err != nil {
		return nil, err
	}
	var out []storage.Snapshot
	for _, lv := range lvs {
		if lv.VG != t.vg || lv.Pool != t.pool {
			continue
		}
		name := tagValue(lv, snapshotKey)
		if name == "" || name != lv.Name {
			continue
		}
		if replica != "" && tagValue(lv, originKey) != replica {
			continue
		}
		out = append(out, t.snapshot(lv))
	}
	return out, nil
}

func (t *Thin) checkSnapshot(op, name string, lv LV) error {
	if !lv.HasTag(snapshotTag(name)) || lv.Pool != t.pool {
		return &storage.Error{Op: op, Pool: t.poolName(), Name: name, Kind: storage.ErrNotOwned,
			Detail: fmt.Sprintf("%s/%s is not a snapshot of ours in pool %s (tags %q, pool %q); refusing to use or remove it", t.vg, lv.Name, t.pool, lv.Tags, lv.Pool)}
	}
	return nil
}

func (t *Thin) snapshot(lv LV) storage.Snapshot {
	return storage.Snapshot{Name: lv.Name, Replica: tagValue(lv, originKey), Pool: t.poolName(), SizeBytes: lv.Size}
}
