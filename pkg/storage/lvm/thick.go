package lvm

import (
	"context"
	"fmt"

	"github.com/meshvol/meshvol/pkg/storage"
)

// Thick provides fully allocated linear LVs in one volume group.
type Thick struct {
	core
}

var _ storage.Provider = (*Thick)(nil)

// NewThick returns a provider for volume group vg.
func NewThick(vg string, opts Options) (*Thick, error) {
	c, err := newCore(vg, "", opts)
	if err != nil {
		return nil, err
	}
	return &Thick{core: c}, nil
}

// Create implements storage.Provider with
//
//	lvcreate -y -n <replica> -L <size> --addtag meshvol.io/owner=<replica> <vg>
//
// (07). -y answers lvm2's "wipe signature?" prompt: a new LV may land on
// extents that held an old filesystem, and stdin is not a terminal.
func (t *Thick) Create(ctx context.Context, req storage.CreateRequest) (storage.Volume, error) {
	return t.create(ctx, req, []string{"-y", "-n", req.Replica, "-L", sizeArg(req.SizeBytes), "--addtag", ownerTag(req.Replica), t.vg})
}

// Capacity implements storage.Provider from vgs: vg_free is what the next
// linear LV can get (22).
func (t *Thick) Capacity(ctx context.Context) (storage.Capacity, error) {
	const op = "capacity"
	out, _, err := t.lvm(ctx, "vgs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o", vgsFields)
	if err != nil {
		return storage.Capacity{}, t.fail(op, "", err)
	}
	vgs, err := ParseVGs(out)
	if err != nil {
		return storage.Capacity{}, &storage.Error{Op: op, Pool: t.vg, Detail: err.Error(), Err: err}
	}
	for _, vg := range vgs {
		if vg.Name == t.vg {
			return storage.Capacity{Pool: t.vg, TotalBytes: vg.Size, FreeBytes: vg.Free, ProvisionedBytes: vg.Size - vg.Free}, nil
		}
	}
	return storage.Capacity{}, &storage.Error{Op: op, Pool: t.vg, Kind: storage.ErrPoolNotFound,
		Detail: fmt.Sprintf("vgs does not list volume group %q", t.vg)}
}
