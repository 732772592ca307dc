package lvm

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/storage"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

func cmd(name string, args ...string) []string {
	return append([]string{name, "--config", cfg}, args...)
}

// tagsDontChangeOutput is the reason for replaying an untagged recorded
// lvcreate as the answer to our tagged one: 25 and 25b are the same lvcreate
// without and with --addtag, and print the same lines.
const tagsDontChangeOutput = "--addtag does not change lvcreate's output (compare 25 and 25b)"

func newThick(t *testing.T, vg string, steps ...step) *Thick {
	t.Helper()
	p, err := NewThick(vg, Options{Runner: newReplay(t, steps...)})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newThin(t *testing.T, steps ...step) *Thin {
	t.Helper()
	p, err := NewThin("vg0", "tp", Options{Runner: newReplay(t, steps...)})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func wantKind(t *testing.T, err, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("error = %v, want kind %v", err, kind)
	}
	var se *storage.Error
	if !errors.As(err, &se) {
		t.Fatalf("error %v is not a *storage.Error", err)
	}
}

var ctx = context.Background()

func TestThickCreate(t *testing.T) {
	p := newThick(t, "vg0",
		step{argv: cmd("lvcreate", "-y", "-n", "rvr-a", "-L", "100m", "--addtag", "meshvol.io/owner=rvr-a", "vg0"), capture: "07-lvcreate-thick.txt"},
		step{argv: lvsArgv, capture: "08-lvs-json.txt"},
	)
	v, err := p.Create(ctx, storage.CreateRequest{Replica: "rvr-a", SizeBytes: 100 * mib})
	if err != nil {
		t.Fatal(err)
	}
	want := storage.Volume{Replica: "rvr-a", Name: "rvr-a", Pool: "vg0", SizeBytes: 104857600, DevicePath: "/dev/vg0/rvr-a"}
	if v != want {
		t.Fatalf("got %+v\nwant %+v", v, want)
	}
}

// 10001 KiB is not a whole number of 4 MiB extents: lvm2 rounds up to 12 MiB
// (10, "Rounding up size to full physical extent" on stdout) and the provider
// reports the real 12582912 bytes from lvs, not the request.
func TestThickCreateOddSizeReportsRoundedSize(t *testing.T) {
	p := newThick(t, "vg0",
		step{argv: cmd("lvcreate", "-y", "-n", "rvr-odd", "-L", "10001k", "--addtag", "meshvol.io/owner=rvr-odd", "vg0"),
			capture: "10-lvcreate-odd-size.txt", added: []string{"--addtag", "meshvol.io/owner=rvr-odd"}, why: tagsDontChangeOutput},
		// 13's recorded line appends blockdev's output to lvs's; only lvs's JSON is replayed.
		step{argv: lvsArgv, capture: "13-lvs-json-after-extend.txt", inner: "lvs --reportformat json --units b --nosuffix -o lv_name,vg_name,lv_size,lv_attr,lv_tags,lv_path,lv_uuid,pool_lv,data_percent,metadata_percent", innerExit: 0, cut: "213909504"},
	)
	v, err := p.Create(ctx, storage.CreateRequest{Replica: "rvr-odd", SizeBytes: 10001 * 1024})
	if err != nil {
		t.Fatal(err)
	}
	if v.SizeBytes != 12582912 || v.DevicePath != "/dev/vg0/rvr-odd" {
		t.Fatalf("got %+v, want 12582912 bytes at /dev/vg0/rvr-odd", v)
	}
}

func TestThickCreateExistingOursIsIdempotent(t *testing.T) {
	p := newThick(t, "vg0",
		step{argv: cmd("lvcreate", "-y", "-n", "rvr-a", "-L", "100m", "--addtag", "meshvol.io/owner=rvr-a", "vg0"), capture: "14-lvcreate-name-exists.txt"},
		step{argv: lvsArgv, capture: "13-lvs-json-after-extend.txt", inner: lvsInner, innerExit: 0, cut: "213909504"},
	)
	v, err := p.Create(ctx, storage.CreateRequest{Replica: "rvr-a", SizeBytes: 100 * mib})
	if err != nil {
		t.Fatal(err)
	}
	if v.SizeBytes != 213909504 || v.Replica != "rvr-a" {
		t.Fatalf("got %+v, want the existing 204 MiB rvr-a", v)
	}
}

// The existing volume is ours but smaller than asked: not silently accepted.
func TestThickCreateExistingOursTooSmall(t *testing.T) {
	p := newThick(t, "vg0",
		step{argv: cmd("lvcreate", "-y", "-n", "rvr-a", "-L", "1g", "--addtag", "meshvol.io/owner=rvr-a", "vg0"), capture: "14-lvcreate-name-exists.txt",
			// The recorded clash was for -L 100m; lvm2 reports a name clash
			// before it looks at the size, so the answer is the same for 1g.
			rename: map[string]string{"-L 100m": "-L 1g"}},
		step{argv: lvsArgv, capture: "08-lvs-json.txt"},
	)
	_, err := p.Create(ctx, storage.CreateRequest{Replica: "rvr-a", SizeBytes: gib})
	wantKind(t, err, storage.ErrAlreadyExists)
	if !strings.Contains(err.Error(), "resize it instead") {
		t.Fatalf("message does not say what to do: %v", err)
	}
}

func TestThickCreateRefusesVolumeNotOurs(t *testing.T) {
	t.Run("no tag", func(t *testing.T) {
		// rvr-odd exists without tags (13). The provider must refuse and run
		// nothing after lvs: no lvremove, no lvextend.
		p := newThick(t, "vg0",
			step{argv: cmd("lvcreate", "-y", "-n", "rvr-odd", "-L", "100m", "--addtag", "meshvol.io/owner=rvr-odd", "vg0"),
				capture: "14-lvcreate-name-exists.txt", rename: map[string]string{"rvr-a": "rvr-odd"}},
			step{argv: lvsArgv, capture: "13-lvs-json-after-extend.txt", inner: lvsInner, innerExit: 0, cut: "213909504"},
		)
		_, err := p.Create(ctx, storage.CreateRequest{Replica: "rvr-odd", SizeBytes: 100 * mib})
		wantKind(t, err, storage.ErrNotOwned)
		if !strings.Contains(err.Error(), "refusing") {
			t.Fatalf("unclear message: %v", err)
		}
	})
	t.Run("other owner", func(t *testing.T) {
		// thin-b carries meshvol.io/owner=rvr-b (26): it belongs to another replica.
		p := newThick(t, "vg0",
			step{argv: cmd("lvcreate", "-y", "-n", "thin-b", "-L", "100m", "--addtag", "meshvol.io/owner=thin-b", "vg0"),
				capture: "14-lvcreate-name-exists.txt", rename: map[string]string{"rvr-a": "thin-b"}},
			step{argv: lvsArgv, capture: "26-lvs-json-thin.txt"},
		)
		_, err := p.Create(ctx, storage.CreateRequest{Replica: "thin-b", SizeBytes: 100 * mib})
		wantKind(t, err, storage.ErrNotOwned)
		if !strings.Contains(err.Error(), "meshvol.io/owner=rvr-b") {
			t.Fatalf("message does not show the foreign tag: %v", err)
		}
	})
}

func TestThickCreateInsufficientSpace(t *testing.T) {
	p := newThick(t, "vg0",
		step{argv: cmd("lvcreate", "-y", "-n", "rvr-big", "-L", "2g", "--addtag", "meshvol.io/owner=rvr-big", "vg0"),
			capture: "15-lvcreate-insufficient-space.txt", added: []string{"--addtag", "meshvol.io/owner=rvr-big"}, why: tagsDontChangeOutput},
	)
	_, err := p.Create(ctx, storage.CreateRequest{Replica: "rvr-big", SizeBytes: 2 * gib})
	wantKind(t, err, storage.ErrInsufficientSpace)
	if !strings.Contains(err.Error(), `Volume group "vg0" has insufficient free space (201 extents): 512 required.`) {
		t.Fatalf("lvm2's message is lost: %v", err)
	}
}

func TestThickCreateMissingVG(t *testing.T) {
	p := newThick(t, "vgmissing",
		step{argv: cmd("lvcreate", "-y", "-n", "rvr-x", "-L", "4m", "--addtag", "meshvol.io/owner=rvr-x", "vgmissing"),
			capture: "16f-lvcreate-missing-vg.txt", added: []string{"--addtag", "meshvol.io/owner=rvr-x"}, why: tagsDontChangeOutput},
	)
	_, err := p.Create(ctx, storage.CreateRequest{Replica: "rvr-x", SizeBytes: 4 * mib})
	wantKind(t, err, storage.ErrPoolNotFound)
}

func TestCreateRejectsBadInputWithoutRunningLVM(t *testing.T) {
	p := newThick(t, "vg0") // no steps: any command fails the test
	for _, tc := range []struct {
		req  storage.CreateRequest
		kind error
		want string
	}{
		{storage.CreateRequest{Replica: "rvr a", SizeBytes: mib}, storage.ErrInvalidName, "character ' '"},
		{storage.CreateRequest{Replica: "snapshot-1", SizeBytes: mib}, storage.ErrInvalidName, `reserves names starting with "snapshot"`},
		{storage.CreateRequest{Replica: "rvr_tdata", SizeBytes: mib}, storage.ErrInvalidName, `"_tdata"`},
		{storage.CreateRequest{Replica: "", SizeBytes: mib}, storage.ErrInvalidName, "replica is empty"},
		{storage.CreateRequest{Replica: strings.Repeat("a", 130), SizeBytes: mib}, storage.ErrInvalidName, "device-mapper name"},
		{storage.CreateRequest{Replica: "rvr-a", SizeBytes: 0}, storage.ErrInvalidArgument, "sizeBytes 0"},
		{storage.CreateRequest{Replica: "rvr-a", SizeBytes: -1}, storage.ErrInvalidArgument, "sizeBytes -1"},
	} {
		_, err := p.Create(ctx, tc.req)
		wantKind(t, err, tc.kind)
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Create(%+v) = %v, want it to mention %q", tc.req, err, tc.want)
		}
	}
}

// lvsInner is the lvs command inside compound recorded lines (13 and 29d: lvs
// then blockdev, whose output is cut off). Both commands succeeded: the line's
// exit code is 0.
const lvsInner = "lvs --reportformat json --units b --nosuffix -o lv_name,vg_name,lv_size,lv_attr,lv_tags,lv_path,lv_uuid,pool_lv,data_percent,metadata_percent"

func TestResize(t *testing.T) {
	t.Run("bigger", func(t *testing.T) {
		p := newThick(t, "vg0",
			step{argv: lvsArgv, capture: "08-lvs-json.txt"},
			step{argv: cmd("lvextend", "-L", "200m", "vg0/rvr-a"), capture: "12-lvextend.txt"},
			// No lvs was recorded right after 12; 13 was recorded after 12d's
			// further +4 MiB. The provider reports what lvs says, not the request.
			step{argv: lvsArgv, capture: "13-lvs-json-after-extend.txt", inner: lvsInner, innerExit: 0, cut: "213909504"},
		)
		v, err := p.Resize(ctx, "rvr-a", 200*mib)
		if err != nil {
			t.Fatal(err)
		}
		if v.SizeBytes != 213909504 {
			t.Fatalf("size %d, want lvs's 213909504", v.SizeBytes)
		}
	})
	t.Run("same size is success", func(t *testing.T) {
		p := newThick(t, "vg0",
			step{argv: lvsArgv, capture: "13-lvs-json-after-extend.txt", inner: lvsInner, innerExit: 0, cut: "213909504"},
			step{argv: cmd("lvextend", "-L", "200m", "vg0/rvr-a"), capture: "12b-lvextend-same-size.txt"},
			step{argv: lvsArgv, capture: "13-lvs-json-after-extend.txt", inner: lvsInner, innerExit: 0, cut: "213909504"},
		)
		if _, err := p.Resize(ctx, "rvr-a", 200*mib); err != nil {
			t.Fatalf("resize to the current size: %v", err)
		}
	})
	t.Run("smaller is refused", func(t *testing.T) {
		p := newThick(t, "vg0",
			step{argv: lvsArgv, capture: "13-lvs-json-after-extend.txt", inner: lvsInner, innerExit: 0, cut: "213909504"},
			step{argv: cmd("lvextend", "-L", "150m", "vg0/rvr-a"), capture: "12c-lvextend-smaller.txt"},
		)
		_, err := p.Resize(ctx, "rvr-a", 150*mib)
		wantKind(t, err, storage.ErrShrinkNotSupported)
		if !strings.Contains(err.Error(), "New size given (38 extents) not larger than existing size (50 extents)") {
			t.Fatalf("lvm2's message is lost: %v", err)
		}
	})
	t.Run("insufficient space", func(t *testing.T) {
		p := newThick(t, "vg0",
			step{argv: lvsArgv, capture: "08-lvs-json.txt"},
			step{argv: cmd("lvextend", "-L", "2g", "vg0/rvr-a"), capture: "15c-lvextend-insufficient-space.txt"},
		)
		_, err := p.Resize(ctx, "rvr-a", 2*gib)
		wantKind(t, err, storage.ErrInsufficientSpace)
	})
	t.Run("missing", func(t *testing.T) {
		p := newThick(t, "vg0", step{argv: lvsArgv, capture: "26-lvs-json-thin.txt"})
		_, err := p.Resize(ctx, "rvr-odd", 200*mib)
		wantKind(t, err, storage.ErrNotFound)
	})
	t.Run("not ours", func(t *testing.T) {
		p := newThick(t, "vg0", step{argv: lvsArgv, capture: "13-lvs-json-after-extend.txt", inner: lvsInner, innerExit: 0, cut: "213909504"})
		_, err := p.Resize(ctx, "rvr-odd", 200*mib)
		wantKind(t, err, storage.ErrNotOwned)
	})
}

func TestDelete(t *testing.T) {
	t.Run("ours", func(t *testing.T) {
		p := newThick(t, "vg0",
			step{argv: lvsArgv, capture: "26-lvs-json-thin.txt"},
			step{argv: cmd("lvremove", "-y", "vg0/rvr-a"), capture: "34-lvremove-thick.txt"},
		)
		if err := p.Delete(ctx, "rvr-a"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("missing is success", func(t *testing.T) {
		p := newThick(t, "vg0", step{argv: lvsArgv, capture: "26-lvs-json-thin.txt"})
		if err := p.Delete(ctx, "rvr-odd"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("removed between lvs and lvremove is success", func(t *testing.T) {
		p := newThick(t, "vg0",
			step{argv: lvsArgv, capture: "08-lvs-json.txt"},
			step{argv: cmd("lvremove", "-y", "vg0/rvr-a"), capture: "21-lvremove-missing.txt", rename: map[string]string{"rvr-odd": "rvr-a"}},
		)
		if err := p.Delete(ctx, "rvr-a"); err != nil {
			t.Fatal(err)
		}
	})
	for _, capture := range []string{"21f-lvremove-active-open.txt", "21g-lvremove-open-suppress-fd-warn.txt"} {
		t.Run("open "+capture, func(t *testing.T) {
			p := newThick(t, "vg0",
				step{argv: lvsArgv, capture: "08-lvs-json.txt"},
				step{argv: cmd("lvremove", "-y", "vg0/rvr-a"), capture: capture, inner: "lvremove -y vg0/rvr-a", innerExit: 5, cut: "lvremove exit:"},
			)
			err := p.Delete(ctx, "rvr-a")
			wantKind(t, err, storage.ErrInUse)
			if strings.Contains(err.Error(), "File descriptor") {
				t.Fatalf("fd-leak noise in the message: %v", err)
			}
		})
	}
	t.Run("not ours is refused untouched", func(t *testing.T) {
		p := newThick(t, "vg0", step{argv: lvsArgv, capture: "13-lvs-json-after-extend.txt", inner: lvsInner, innerExit: 0, cut: "213909504"})
		wantKind(t, p.Delete(ctx, "rvr-odd"), storage.ErrNotOwned)
	})
	t.Run("thin pool is never removed", func(t *testing.T) {
		// lvremove -y of a pool takes every thin LV with it (31b). The pool
		// has no owner tag, so the provider stops at the lvs.
		p := newThin(t, step{argv: lvsArgv, capture: "26-lvs-json-thin.txt"})
		wantKind(t, p.Delete(ctx, "tp"), storage.ErrNotOwned)
	})
}

func TestList(t *testing.T) {
	thick := newThick(t, "vg0", step{argv: lvsArgv, capture: "26-lvs-json-thin.txt"})
	vols, err := thick.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// thin-a has no tag; thin-b is ours but thin; tp is a pool.
	if len(vols) != 1 || vols[0].Replica != "rvr-a" || vols[0].SizeBytes != 213909504 {
		t.Fatalf("thick List = %+v, want only rvr-a", vols)
	}
	thin := newThin(t, step{argv: lvsArgv, capture: "26-lvs-json-thin.txt"})
	vols, err = thin.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := storage.Volume{Replica: "rvr-b", Name: "thin-b", Pool: "vg0/tp", SizeBytes: 1073741824, DevicePath: "/dev/vg0/thin-b"}
	if len(vols) != 1 || vols[0] != want {
		t.Fatalf("thin List = %+v, want [%+v]", vols, want)
	}
}

func TestThickCapacity(t *testing.T) {
	p := newThick(t, "vg0", step{argv: vgsArgv, capture: "22-vgs-before-thin.txt"})
	c, err := p.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := storage.Capacity{Pool: "vg0", TotalBytes: 1069547520, FreeBytes: 855638016, ProvisionedBytes: 1069547520 - 855638016}
	if c != want {
		t.Fatalf("got %+v want %+v", c, want)
	}
	missing := newThick(t, "vgmissing", step{argv: vgsArgv, capture: "04-vgs-json.txt"})
	_, err = missing.Capacity(ctx)
	wantKind(t, err, storage.ErrPoolNotFound)
}

func TestThinCreate(t *testing.T) {
	// The recorded run called this LV thin-b with owner tag rvr-b; our naming
	// calls it after its replica. The rename is applied to 25b's command line
	// and to both outputs.
	rn := map[string]string{"thin-b": "rvr-b"}
	p := newThin(t,
		step{argv: cmd("lvcreate", "-y", "-V", "1g", "-T", "vg0/tp", "-n", "rvr-b", "--addtag", "meshvol.io/owner=rvr-b"),
			capture: "25b-lvcreate-thin-addtag.txt", rename: rn},
		step{argv: lvsArgv, capture: "26-lvs-json-thin.txt", rename: rn},
	)
	v, err := p.Create(ctx, storage.CreateRequest{Replica: "rvr-b", SizeBytes: gib})
	if err != nil {
		t.Fatalf("overcommit warnings must not fail a thin create: %v", err)
	}
	want := storage.Volume{Replica: "rvr-b", Name: "rvr-b", Pool: "vg0/tp", SizeBytes: gib, DevicePath: "/dev/vg0/rvr-b"}
	if v != want {
		t.Fatalf("got %+v want %+v", v, want)
	}
}

func TestThinCapacityFromPoolRow(t *testing.T) {
	// 26b's line runs dd first; its stdout starts with dd's summary line. That
	// line is not lvs output, so this test replays 29d instead, where the pool
	// has 16.67% of 600 MiB in use after being extended (29c).
	p := newThin(t, step{argv: lvsArgv, capture: "29d-lvs-json-after-thin-extend.txt", inner: lvsInner, innerExit: 0, cut: "1073741824"})
	c, err := p.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// used = ceil(629145600 * 16.67%) = 104878572; provisioned = snap-a +
	// thin-a + thin-b (snap-old is a COW snapshot outside the pool).
	want := storage.Capacity{Pool: "vg0/tp", TotalBytes: 629145600, FreeBytes: 629145600 - 104878572,
		ProvisionedBytes: 1073741824 + 1073741824 + 1077936128, MetadataPercent: 11.72}
	if c != want {
		t.Fatalf("got %+v\nwant %+v", c, want)
	}
	missing := newThin(t, step{argv: lvsArgv, capture: "08-lvs-json.txt"})
	_, err = missing.Capacity(ctx)
	wantKind(t, err, storage.ErrPoolNotFound)
}

func TestThinResizeBlockedByCOWSnapshot(t *testing.T) {
	p := newThin(t,
		step{argv: lvsArgv, capture: "26-lvs-json-thin.txt", rename: map[string]string{"thin-b": "rvr-b"}},
		step{argv: cmd("lvextend", "-L", "2g", "vg0/rvr-b"), capture: "29-lvextend-thin.txt", rename: map[string]string{"thin-a": "rvr-b"}},
	)
	_, err := p.Resize(ctx, "rvr-b", 2*gib)
	wantKind(t, err, storage.ErrFailedPrecondition)
}

func TestThinSnapshotCreate(t *testing.T) {
	p := newThin(t,
		step{argv: lvsArgv, capture: "26-lvs-json-thin.txt", rename: map[string]string{"thin-b": "rvr-b"}},
		step{argv: cmd("lvcreate", "-y", "-s", "-n", "snap-a", "--addtag", "meshvol.io/snapshot=snap-a", "--addtag", "meshvol.io/origin=rvr-b", "vg0/rvr-b"),
			capture: "27-lvcreate-thin-snapshot.txt", rename: map[string]string{"thin-a": "rvr-b"},
			added: []string{"--addtag", "meshvol.io/snapshot=snap-a", "--addtag", "meshvol.io/origin=rvr-b"}, why: tagsDontChangeOutput},
	)
	s, err := p.CreateSnapshot(ctx, storage.SnapshotRequest{Name: "snap-a", Replica: "rvr-b"})
	if err != nil {
		t.Fatal(err)
	}
	want := storage.Snapshot{Name: "snap-a", Replica: "rvr-b", Pool: "vg0/tp", SizeBytes: gib}
	if s != want {
		t.Fatalf("got %+v want %+v", s, want)
	}
}

// On a node whose kernel has no dm_snapshot and whose agent cannot load it,
// every snapshot fails, thin ones included (vm-36, recorded by the VM tier).
// That is the node's fault: FailedPrecondition, with lvm2's words and what to
// do about it, and no second look for an existing snapshot.
func TestThinSnapshotWithoutDMSnapshotModule(t *testing.T) {
	p := newThin(t,
		step{argv: lvsArgv, capture: "26-lvs-json-thin.txt", rename: map[string]string{"thin-b": "rvr-b"}},
		// The VM's origin was rvr-t; 26's is rvr-b (owner tag from 25b).
		step{argv: cmd("lvcreate", "-y", "-s", "-n", "snap-t", "--addtag", "meshvol.io/snapshot=snap-t", "--addtag", "meshvol.io/origin=rvr-b", "vg0/rvr-b"),
			capture: "vm-36-lvcreate-thin-snapshot-no-dm-snapshot.txt", rename: map[string]string{"rvr-t": "rvr-b"}},
	)
	_, err := p.CreateSnapshot(ctx, storage.SnapshotRequest{Name: "snap-t", Replica: "rvr-b"})
	wantKind(t, err, storage.ErrFailedPrecondition)
	msg := err.Error()
	for _, want := range []string{
		`snapshot "snap-t" in vg0/tp`,
		"Module dm-snapshot not found",
		"snapshot: Required device-mapper target(s) not detected in your kernel.",
		"load dm_snapshot (snapshots, thin ones included) and dm_thin_pool (thin volumes) on the node",
		"/etc/modules-load.d",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
}

func TestThinSnapshotOfForeignVolumeRefused(t *testing.T) {
	p := newThin(t, step{argv: lvsArgv, capture: "26-lvs-json-thin.txt"})
	_, err := p.CreateSnapshot(ctx, storage.SnapshotRequest{Name: "snap-a", Replica: "thin-a"})
	wantKind(t, err, storage.ErrNotOwned)
}

func TestThinSnapshotDeleteForeignRefused(t *testing.T) {
	// snap-a in 29d is a real thin snapshot, but not tagged by us.
	p := newThin(t, step{argv: lvsArgv, capture: "29d-lvs-json-after-thin-extend.txt", inner: lvsInner, innerExit: 0, cut: "1073741824"})
	wantKind(t, p.DeleteSnapshot(ctx, "snap-a"), storage.ErrNotOwned)
	q := newThin(t, step{argv: lvsArgv, capture: "29d-lvs-json-after-thin-extend.txt", inner: lvsInner, innerExit: 0, cut: "1073741824"})
	snaps, err := q.ListSnapshots(ctx, "")
	if err != nil || len(snaps) != 0 {
		t.Fatalf("ListSnapshots = %+v, %v; want none (no tagged snapshot in 29d)", snaps, err)
	}
}

// The tests below use the hand-written report of testdata/synthetic (no
// recorded run has a tagged snapshot); the lvremove answer is real.
const synthFrom = "29d with snap-a tagged by us and thin-b renamed rvr-b"

func synthLVs() step {
	return step{argv: lvsArgv, synthetic: synthFrom, synthStdoutFile: "lvs-tagged-snapshot.json"}
}

func TestThinSnapshotListAndDelete(t *testing.T) {
	p := newThin(t, synthLVs(), synthLVs(),
		synthLVs(),
		step{argv: cmd("lvremove", "-y", "vg0/snap-a"), capture: "30c-lvremove-cow-snap.txt", rename: map[string]string{"snap-old": "snap-a"}},
	)
	snaps, err := p.ListSnapshots(ctx, "rvr-b")
	if err != nil {
		t.Fatal(err)
	}
	want := storage.Snapshot{Name: "snap-a", Replica: "rvr-b", Pool: "vg0/tp", SizeBytes: gib}
	if len(snaps) != 1 || snaps[0] != want {
		t.Fatalf("ListSnapshots(rvr-b) = %+v, want [%+v]", snaps, want)
	}
	if snaps, err := p.ListSnapshots(ctx, "rvr-a"); err != nil || len(snaps) != 0 {
		t.Fatalf("ListSnapshots(rvr-a) = %+v, %v; want none", snaps, err)
	}
	if err := p.DeleteSnapshot(ctx, "snap-a"); err != nil {
		t.Fatal(err)
	}
}

func TestThinSnapshotCreateIsIdempotent(t *testing.T) {
	argv := cmd("lvcreate", "-y", "-s", "-n", "snap-a", "--addtag", "meshvol.io/snapshot=snap-a", "--addtag", "meshvol.io/origin=rvr-b", "vg0/rvr-b")
	clash := step{argv: argv, synthetic: "14's message for snap-a", synthExit: 5,
		synthStderr: "  Logical Volume \"snap-a\" already exists in volume group \"vg0\"\n"}
	p := newThin(t, synthLVs(), clash, synthLVs())
	s, err := p.CreateSnapshot(ctx, storage.SnapshotRequest{Name: "snap-a", Replica: "rvr-b"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "snap-a" || s.Replica != "rvr-b" {
		t.Fatalf("got %+v", s)
	}
	// rvr-a is ours but thick: the thin provider does not snapshot it, and
	// says why instead of running lvcreate.
	_, err = newThin(t, synthLVs()).CreateSnapshot(ctx, storage.SnapshotRequest{Name: "snap-b", Replica: "rvr-a"})
	wantKind(t, err, storage.ErrAlreadyExists)
}

func TestCommandTimeout(t *testing.T) {
	p, err := NewThick("vg0", Options{Runner: newReplay(t, step{argv: lvsArgv, hang: true}), CommandTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Get(ctx, "rvr-a")
	wantKind(t, err, storage.ErrTimeout)
	if !strings.Contains(err.Error(), "lvs") {
		t.Fatalf("timeout does not name the command: %v", err)
	}
}

// A restore into a thin pool is refused before lvm2 runs (the replay has no
// step: any command would fail the test), never answered with an empty volume.
func TestThinCreateFromSnapshotRefused(t *testing.T) {
	p := newThin(t)
	_, err := p.Create(context.Background(), storage.CreateRequest{Replica: "pvc-a-node-1", SizeBytes: 1 << 30,
		Source: &storage.Source{Snapshot: "snap-1", DataBytes: 1 << 30}})
	wantKind(t, err, storage.ErrFailedPrecondition)
	if !strings.Contains(err.Error(), "snap-1") {
		t.Fatalf("error %q does not name the snapshot", err)
	}
}
