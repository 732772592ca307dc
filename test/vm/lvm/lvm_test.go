//go:build vmtest

// Package lvm_test runs pkg/storage/lvm's Thick and Thin providers against
// real lvm2 and a real device-mapper, inside the VM that hack/vm-test-lvm.sh
// boots (test/vm/README.md). The unit tests in pkg/storage/lvm replay recorded
// lvm2 output; these issue the same commands to lvm2 itself, so a divergence
// between the recording and today's lvm2, kernel or /dev handling shows up
// here and not on a node.
//
// The files carry the build tag vmtest, so `go test ./...`, `go vet ./...`
// and `make test` do not see this package at all; hack/vm-test-lvm.sh builds
// it with `-tags vmtest`. (Without the tag it used to compile everywhere and
// add a skipped test per function to every `make test`.)
//
// They are destructive: TestMain turns the whole disk named by MESHVOL_VM_PV
// into volume group vg0. That variable, which only the VM's init sets, is the
// second guard: built with the tag but run without it, every test skips.
package lvm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/storage"
	"github.com/meshvol/meshvol/pkg/storage/lvm"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30

	vg   = "vg0"
	pool = "tp"
	// extent is vgcreate's default extent size, which the size assertions
	// below rely on; TestMain checks that the VG really has it.
	extent = 4 * mib
	// poolSize is small against the 1 GiB disk so that thin volumes of 1 GiB
	// overcommit it, as in captures 25-27.
	poolSize = 256 * mib
)

// setupConfig is what the setup commands (pvcreate, vgcreate, the pool's
// lvcreate) pass to lvm2. It is the provider's own udev setting: the guest has
// no udev, and the image's lvm.conf is Debian's unchanged default, so the
// provider's --config is the only thing standing between it and the "device
// not cleared" failure of capture 06a. The setup needs it for the same reason.
const setupConfig = "activation { udev_sync = 0 udev_rules = 0 }"

// pv is the disk given to the VG; empty outside the VM.
var pv = os.Getenv("MESHVOL_VM_PV")

func TestMain(m *testing.M) {
	if pv != "" {
		if err := setup(); err != nil {
			fmt.Fprintf(os.Stderr, "real-LVM setup on %s failed: %v\n", pv, err)
			os.Exit(2)
		}
	}
	os.Exit(m.Run())
}

// setup makes vg0 on the whole PV and the thin pool vg0/tp, as captures 02,
// 03 and 23 did.
func setup() error {
	for _, argv := range [][]string{
		{"pvcreate", "-y", pv},
		{"vgcreate", vg, pv},
		{"lvcreate", "-y", "--type", "thin-pool", "-L", fmt.Sprintf("%db", poolSize), "-n", pool, vg},
	} {
		if out, err := lvmCmd(argv...); err != nil {
			return fmt.Errorf("%s: %v\n%s", strings.Join(argv, " "), err, out)
		}
	}
	out, err := lvmCmd("vgs", "--noheadings", "--units", "b", "--nosuffix", "-o", "vg_extent_size", vg)
	if err != nil {
		return fmt.Errorf("vgs: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(out); got != fmt.Sprint(extent) {
		return fmt.Errorf("vg0 has extent size %s, the tests assume %d", got, extent)
	}
	return nil
}

// lvmCmd runs an lvm2 command for setup or for an independent look at the
// state, outside the provider.
func lvmCmd(argv ...string) (string, error) {
	args := append([]string{"--config", setupConfig}, argv[1:]...)
	cmd := exec.Command(argv[0], args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func needVM(t *testing.T) {
	t.Helper()
	if pv == "" {
		t.Skip("MESHVOL_VM_PV is not set: these tests need real lvm2 and device-mapper; run `make test-lvm-vm` (test/vm/README.md)")
	}
}

// transcript is a real lvm.ExecRunner that logs every command the provider
// issues with its exit status and stderr, so a failing run shows exactly what
// lvm2 said, in the format of the recorded captures.
type transcript struct {
	t     *testing.T
	inner lvm.Runner
}

func (r transcript) Run(ctx context.Context, name string, args ...string) ([]byte, []byte, error) {
	start := time.Now()
	stdout, stderr, err := r.inner.Run(ctx, name, args...)
	exit := 0
	var ce *lvm.CommandError
	if errors.As(err, &ce) {
		exit = ce.ExitCode
	}
	line := fmt.Sprintf("$ %s %s  # exit %d, %v", name, strings.Join(args, " "), exit, time.Since(start).Round(time.Millisecond))
	if name != "lvs" && name != "vgs" && len(bytes.TrimSpace(stdout)) > 0 {
		line += "\n  stdout: " + strings.TrimSpace(string(stdout))
	}
	if s := strings.TrimSpace(string(stderr)); s != "" {
		line += "\n  stderr: " + s
	}
	r.t.Log(line)
	return stdout, stderr, err
}

func opts(t *testing.T) lvm.Options {
	return lvm.Options{Runner: transcript{t: t, inner: lvm.NewExecRunner()}}
}

func thick(t *testing.T) *lvm.Thick {
	t.Helper()
	needVM(t)
	p, err := lvm.NewThick(vg, opts(t))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func thin(t *testing.T) *lvm.Thin {
	t.Helper()
	needVM(t)
	p, err := lvm.NewThin(vg, pool, opts(t))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var ctx = context.Background()

func wantKind(t *testing.T, err, kind error, mention string) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("error = %v, want kind %v", err, kind)
	}
	var se *storage.Error
	if !errors.As(err, &se) {
		t.Fatalf("error %v is not a *storage.Error", err)
	}
	if !strings.Contains(err.Error(), mention) {
		t.Fatalf("error %q does not mention %q", err, mention)
	}
}

// deviceSize reads the size of the block device at path from the kernel, not
// from lvm2: it proves the /dev node exists and maps what lvs reports.
func deviceSize(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer f.Close()
	n, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		t.Fatalf("size of %s: %v", path, err)
	}
	return n
}

func wantGone(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s still exists after delete (err %v): lvm2 left a stale node, as with udev_rules=1 in capture 06g", path, err)
	}
}

// lvExists asks lvm2 directly, not through the provider.
func lvExists(t *testing.T, name string) bool {
	t.Helper()
	out, err := lvmCmd("lvs", "--noheadings", "-o", "lv_name", vg)
	if err != nil {
		t.Fatalf("lvs: %v\n%s", err, out)
	}
	return slices.Contains(strings.Fields(out), name)
}

// foreignLV creates an LV the provider did not make, with the given extra
// lvcreate arguments (tags, thin), and removes it when the test ends.
func foreignLV(t *testing.T, name string, args ...string) {
	t.Helper()
	argv := append([]string{"lvcreate", "-y", "-n", name}, args...)
	if out, err := lvmCmd(argv...); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	t.Cleanup(func() {
		if out, err := lvmCmd("lvremove", "-y", vg+"/"+name); err != nil {
			t.Errorf("cleanup lvremove %s: %v\n%s", name, err, out)
		}
	})
}

func TestThickLifecycle(t *testing.T) {
	p := thick(t)
	v, err := p.Create(ctx, storage.CreateRequest{Replica: "rvr-a", SizeBytes: 100 * mib})
	if err != nil {
		t.Fatal(err)
	}
	want := storage.Volume{Replica: "rvr-a", Name: "rvr-a", Pool: vg, SizeBytes: 100 * mib, DevicePath: "/dev/vg0/rvr-a"}
	if v != want {
		t.Fatalf("Create = %+v\nwant %+v", v, want)
	}
	if n := deviceSize(t, v.DevicePath); n != v.SizeBytes {
		t.Fatalf("%s is %d bytes, provider says %d", v.DevicePath, n, v.SizeBytes)
	}
	if got, err := p.Get(ctx, "rvr-a"); err != nil || got != want {
		t.Fatalf("Get = %+v, %v; want %+v", got, err, want)
	}

	// An agent that restarts repeats its Create: same volume, nothing changed.
	if got, err := p.Create(ctx, storage.CreateRequest{Replica: "rvr-a", SizeBytes: 100 * mib}); err != nil || got != want {
		t.Fatalf("repeated Create = %+v, %v; want %+v", got, err, want)
	}
	_, err = p.Create(ctx, storage.CreateRequest{Replica: "rvr-a", SizeBytes: 200 * mib})
	wantKind(t, err, storage.ErrAlreadyExists, "resize it instead")

	v, err = p.Resize(ctx, "rvr-a", 200*mib)
	if err != nil {
		t.Fatal(err)
	}
	if v.SizeBytes != 200*mib || deviceSize(t, v.DevicePath) != 200*mib {
		t.Fatalf("Resize(200 MiB) = %+v, device %d bytes", v, deviceSize(t, v.DevicePath))
	}
	// 199 MiB + 1 byte rounds up to the same 50 extents: lvm2's "matches
	// existing size" (12b), which Resize reports as success.
	if v, err = p.Resize(ctx, "rvr-a", 199*mib+1); err != nil || v.SizeBytes != 200*mib {
		t.Fatalf("Resize to the current extent count = %+v, %v", v, err)
	}
	_, err = p.Resize(ctx, "rvr-a", 150*mib)
	wantKind(t, err, storage.ErrShrinkNotSupported, "not larger than existing size")
	_, err = p.Resize(ctx, "rvr-a", 2*gib)
	wantKind(t, err, storage.ErrInsufficientSpace, "Insufficient free space")
	if n := deviceSize(t, v.DevicePath); n != 200*mib {
		t.Fatalf("refused resizes changed the device to %d bytes", n)
	}

	if err := p.Delete(ctx, "rvr-a"); err != nil {
		t.Fatal(err)
	}
	wantGone(t, "/dev/vg0/rvr-a")
	wantGone(t, "/dev/mapper/vg0-rvr-a")
	_, err = p.Get(ctx, "rvr-a")
	wantKind(t, err, storage.ErrNotFound, "no LV vg0/rvr-a")
	if err := p.Delete(ctx, "rvr-a"); err != nil {
		t.Fatalf("Delete of a deleted volume: %v", err)
	}
	_, err = p.Resize(ctx, "rvr-a", 200*mib)
	wantKind(t, err, storage.ErrNotFound, "no LV")
}

// lvm2 rounds sizes up to whole extents (10, 12d); the provider reports what
// lvs says afterwards, never the request.
func TestThickSizeRounding(t *testing.T) {
	p := thick(t)
	for _, tc := range []struct {
		replica string
		req     int64
		want    int64
	}{
		{"rvr-odd", 10001 * 1024, 12 * mib}, // "10001k", capture 10
		{"rvr-byte", 1, extent},             // "512b": sizeArg's byte unit
		{"rvr-513", 513, extent},            // rounded to 1024 bytes first: lvm2 refuses non-multiples of 512 (10b)
		{"rvr-exact", 8 * mib, 8 * mib},
	} {
		v, err := p.Create(ctx, storage.CreateRequest{Replica: tc.replica, SizeBytes: tc.req})
		if err != nil {
			t.Fatalf("Create(%d bytes): %v", tc.req, err)
		}
		if v.SizeBytes != tc.want || deviceSize(t, v.DevicePath) != tc.want {
			t.Errorf("Create(%d bytes) = %d bytes (device %d), want %d", tc.req, v.SizeBytes, deviceSize(t, v.DevicePath), tc.want)
		}
		// A grow by less than an extent still grows by a whole one (12d).
		r, err := p.Resize(ctx, tc.replica, tc.want+1)
		if err != nil || r.SizeBytes != tc.want+extent {
			t.Errorf("Resize(%d) = %+v, %v; want %d bytes", tc.want+1, r, err, tc.want+extent)
		}
		if err := p.Delete(ctx, tc.replica); err != nil {
			t.Fatal(err)
		}
	}
}

func TestThickRefusesVolumesNotOurs(t *testing.T) {
	p := thick(t)
	foreignLV(t, "rvr-untagged", "-L", "8m", vg)
	foreignLV(t, "rvr-other", "-L", "8m", "--addtag", "meshvol.io/owner=rvr-b", vg)
	for _, tc := range []struct{ name, mention string }{
		{"rvr-untagged", `has no tag "meshvol.io/owner=rvr-untagged"`},
		{"rvr-other", "meshvol.io/owner=rvr-b"},
	} {
		_, err := p.Create(ctx, storage.CreateRequest{Replica: tc.name, SizeBytes: 8 * mib})
		wantKind(t, err, storage.ErrNotOwned, tc.mention)
		_, err = p.Get(ctx, tc.name)
		wantKind(t, err, storage.ErrNotOwned, tc.mention)
		_, err = p.Resize(ctx, tc.name, 16*mib)
		wantKind(t, err, storage.ErrNotOwned, "refusing")
		wantKind(t, p.Delete(ctx, tc.name), storage.ErrNotOwned, "refusing")
		if !lvExists(t, tc.name) {
			t.Fatalf("%s was removed", tc.name)
		}
		if n := deviceSize(t, "/dev/vg0/"+tc.name); n != 8*mib {
			t.Fatalf("%s was changed to %d bytes", tc.name, n)
		}
	}
	// The thin pool has no owner tag: neither provider removes it, whatever
	// the name asked (lvremove -y of a pool takes every thin LV with it, 31b).
	wantKind(t, p.Delete(ctx, pool), storage.ErrNotOwned, "refusing")
	wantKind(t, thin(t).Delete(ctx, pool), storage.ErrNotOwned, "refusing")
	if !lvExists(t, pool) {
		t.Fatal("the thin pool was removed")
	}
}

func TestThickInsufficientSpace(t *testing.T) {
	p := thick(t)
	_, err := p.Create(ctx, storage.CreateRequest{Replica: "rvr-big", SizeBytes: 2 * gib})
	wantKind(t, err, storage.ErrInsufficientSpace, `Volume group "vg0" has insufficient free space`)
	if lvExists(t, "rvr-big") {
		t.Fatal("a refused create left an LV behind")
	}
}

func TestMissingVolumeGroup(t *testing.T) {
	needVM(t)
	p, err := lvm.NewThick("vgmissing", opts(t))
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Create(ctx, storage.CreateRequest{Replica: "rvr-x", SizeBytes: 4 * mib})
	wantKind(t, err, storage.ErrPoolNotFound, "vgmissing")
	_, err = p.Capacity(ctx)
	wantKind(t, err, storage.ErrPoolNotFound, "vgmissing")
	q, err := lvm.NewThin(vg, "tpmissing", opts(t))
	if err != nil {
		t.Fatal(err)
	}
	_, err = q.Capacity(ctx)
	wantKind(t, err, storage.ErrPoolNotFound, "tpmissing")
}

// An open LV (DRBD attached, mounted) is never removed: lvremove refuses with
// "in use" (21f) and the provider says ErrInUse.
func TestThickDeleteOpenVolume(t *testing.T) {
	p := thick(t)
	v, err := p.Create(ctx, storage.CreateRequest{Replica: "rvr-open", SizeBytes: 8 * mib})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(v.DevicePath)
	if err != nil {
		t.Fatal(err)
	}
	err = p.Delete(ctx, "rvr-open")
	f.Close()
	wantKind(t, err, storage.ErrInUse, "in use")
	if strings.Contains(err.Error(), "File descriptor") {
		t.Fatalf("fd-leak noise in the message: %v", err)
	}
	if !lvExists(t, "rvr-open") {
		t.Fatal("an open volume was removed")
	}
	if err := p.Delete(ctx, "rvr-open"); err != nil {
		t.Fatalf("Delete after close: %v", err)
	}
}

func TestThickCapacityTracksAllocations(t *testing.T) {
	p := thick(t)
	before, err := p.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// 1 GiB disk, 1 MiB of PV metadata, 4 MiB extents: 255 extents (22).
	if before.Pool != vg || before.TotalBytes != 255*extent || before.FreeBytes+before.ProvisionedBytes != before.TotalBytes {
		t.Fatalf("Capacity = %+v, want 255 extents of 4 MiB in vg0", before)
	}
	if _, err := p.Create(ctx, storage.CreateRequest{Replica: "rvr-cap", SizeBytes: 40 * mib}); err != nil {
		t.Fatal(err)
	}
	after, err := p.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if before.FreeBytes-after.FreeBytes != 40*mib {
		t.Fatalf("free space went from %d to %d after a 40 MiB volume", before.FreeBytes, after.FreeBytes)
	}
	if err := p.Delete(ctx, "rvr-cap"); err != nil {
		t.Fatal(err)
	}
	if again, err := p.Capacity(ctx); err != nil || again != before {
		t.Fatalf("Capacity after delete = %+v, %v; want %+v", again, err, before)
	}
}

func TestListSeparatesProviders(t *testing.T) {
	tk, tn := thick(t), thin(t)
	if _, err := tk.Create(ctx, storage.CreateRequest{Replica: "rvr-list-thick", SizeBytes: 8 * mib}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tk.Delete(ctx, "rvr-list-thick") })
	if _, err := tn.Create(ctx, storage.CreateRequest{Replica: "rvr-list-thin", SizeBytes: 64 * mib}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tn.Delete(ctx, "rvr-list-thin") })
	if _, err := tn.CreateSnapshot(ctx, storage.SnapshotRequest{Name: "snap-list", Replica: "rvr-list-thin"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tn.DeleteSnapshot(ctx, "snap-list") })
	foreignLV(t, "rvr-list-foreign", "-L", "8m", vg)

	names := func(vols []storage.Volume, err error) []string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, v := range vols {
			out = append(out, v.Replica+"@"+v.Pool)
		}
		return out
	}
	if got := names(tk.List(ctx)); !slices.Equal(got, []string{"rvr-list-thick@vg0"}) {
		t.Errorf("thick List = %q, want only rvr-list-thick (not the thin volume, snapshot, pool or untagged LV)", got)
	}
	if got := names(tn.List(ctx)); !slices.Equal(got, []string{"rvr-list-thin@vg0/tp"}) {
		t.Errorf("thin List = %q, want only rvr-list-thin (not its snapshot)", got)
	}
	// The thick provider never hands out a thin volume, even one tagged for
	// the replica asked.
	_, err := tk.Get(ctx, "rvr-list-thin")
	wantKind(t, err, storage.ErrAlreadyExists, "not a volume of vg0")
	_, err = tn.Get(ctx, "rvr-list-thick")
	wantKind(t, err, storage.ErrAlreadyExists, "not a volume of vg0/tp")
}

func TestThinLifecycle(t *testing.T) {
	p := thin(t)
	capBefore, err := p.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if capBefore.Pool != "vg0/tp" || capBefore.TotalBytes != poolSize || capBefore.MetadataPercent <= 0 {
		t.Fatalf("Capacity = %+v, want the 256 MiB pool vg0/tp with some metadata in use", capBefore)
	}

	// 1 GiB on a 256 MiB pool: lvm2 warns about overcommit (25) and creates it.
	v, err := p.Create(ctx, storage.CreateRequest{Replica: "rvr-t", SizeBytes: gib})
	if err != nil {
		t.Fatalf("overcommitting Create: %v", err)
	}
	want := storage.Volume{Replica: "rvr-t", Name: "rvr-t", Pool: "vg0/tp", SizeBytes: gib, DevicePath: "/dev/vg0/rvr-t"}
	if v != want {
		t.Fatalf("Create = %+v\nwant %+v", v, want)
	}
	if n := deviceSize(t, v.DevicePath); n != gib {
		t.Fatalf("%s is %d bytes", v.DevicePath, n)
	}
	if got, err := p.Create(ctx, storage.CreateRequest{Replica: "rvr-t", SizeBytes: gib}); err != nil || got != want {
		t.Fatalf("repeated Create = %+v, %v", got, err)
	}

	// Writing maps pool blocks: free space must drop by at least what was
	// written (64 KiB chunks, so exactly 16 MiB here, up to lvm2's 0.01%).
	writeData(t, v.DevicePath, 16*mib)
	capAfter, err := p.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if used := capBefore.FreeBytes - capAfter.FreeBytes; used < 16*mib || used > 16*mib+poolSize/10000+1 {
		t.Fatalf("free space dropped by %d bytes after writing 16 MiB (before %+v, after %+v)", used, capBefore, capAfter)
	}
	if capAfter.ProvisionedBytes != capBefore.ProvisionedBytes+gib {
		t.Fatalf("provisioned %d -> %d, want +1 GiB", capBefore.ProvisionedBytes, capAfter.ProvisionedBytes)
	}

	if v, err = p.Resize(ctx, "rvr-t", 2*gib); err != nil || v.SizeBytes != 2*gib || deviceSize(t, v.DevicePath) != 2*gib {
		t.Fatalf("Resize(2 GiB) = %+v, %v", v, err)
	}
	if _, err = p.Resize(ctx, "rvr-t", 2*gib); err != nil {
		t.Fatalf("Resize to the current size: %v", err)
	}
	_, err = p.Resize(ctx, "rvr-t", gib)
	wantKind(t, err, storage.ErrShrinkNotSupported, "not larger than existing size")

	// Snapshots: create, idempotent repeat, list, and survival of the origin.
	s, err := p.CreateSnapshot(ctx, storage.SnapshotRequest{Name: "snap-t", Replica: "rvr-t"})
	wantSnap := storage.Snapshot{Name: "snap-t", Replica: "rvr-t", Pool: "vg0/tp", SizeBytes: 2 * gib}
	if err != nil || s != wantSnap {
		t.Fatalf("CreateSnapshot = %+v, %v; want %+v", s, err, wantSnap)
	}
	if s, err = p.CreateSnapshot(ctx, storage.SnapshotRequest{Name: "snap-t", Replica: "rvr-t"}); err != nil || s != wantSnap {
		t.Fatalf("repeated CreateSnapshot = %+v, %v", s, err)
	}
	if _, err := p.Create(ctx, storage.CreateRequest{Replica: "rvr-t2", SizeBytes: 64 * mib}); err != nil {
		t.Fatal(err)
	}
	_, err = p.CreateSnapshot(ctx, storage.SnapshotRequest{Name: "snap-t", Replica: "rvr-t2"})
	wantKind(t, err, storage.ErrAlreadyExists, `taken of replica "rvr-t"`)
	for _, replica := range []string{"rvr-t", ""} {
		if got, err := p.ListSnapshots(ctx, replica); err != nil || !slices.Equal(got, []storage.Snapshot{wantSnap}) {
			t.Fatalf("ListSnapshots(%q) = %+v, %v; want [%+v]", replica, got, err, wantSnap)
		}
	}
	if got, err := p.ListSnapshots(ctx, "rvr-t2"); err != nil || len(got) != 0 {
		t.Fatalf("ListSnapshots(rvr-t2) = %+v, %v; want none", got, err)
	}
	// A thin snapshot is not an old-style COW snapshot: the origin still grows (29 vs 30d).
	if v, err = p.Resize(ctx, "rvr-t", 3*gib); err != nil || v.SizeBytes != 3*gib {
		t.Fatalf("Resize of an origin with a thin snapshot = %+v, %v", v, err)
	}

	// Removing the origin leaves the snapshot (30e, 30f), still attributed.
	if err := p.Delete(ctx, "rvr-t"); err != nil {
		t.Fatal(err)
	}
	wantGone(t, "/dev/vg0/rvr-t")
	if got, err := p.ListSnapshots(ctx, ""); err != nil || !slices.Equal(got, []storage.Snapshot{wantSnap}) {
		t.Fatalf("ListSnapshots after the origin was deleted = %+v, %v; want [%+v]", got, err, wantSnap)
	}
	// A snapshot name is not a volume: Delete of it as a replica is refused.
	wantKind(t, p.Delete(ctx, "snap-t"), storage.ErrNotOwned, "refusing")
	if err := p.DeleteSnapshot(ctx, "snap-t"); err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteSnapshot(ctx, "snap-t"); err != nil {
		t.Fatalf("DeleteSnapshot of a deleted snapshot: %v", err)
	}
	if lvExists(t, "snap-t") {
		t.Fatal("snap-t still exists")
	}
	if err := p.Delete(ctx, "rvr-t2"); err != nil {
		t.Fatal(err)
	}
	capEnd, err := p.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if capEnd.ProvisionedBytes != capBefore.ProvisionedBytes || capEnd.FreeBytes != capBefore.FreeBytes {
		t.Fatalf("Capacity after removing everything = %+v, want %+v", capEnd, capBefore)
	}
}

func TestThinSnapshotsNotOursRefused(t *testing.T) {
	p := thin(t)
	foreignLV(t, "thin-foreign", "-V", "64m", "-T", vg+"/"+pool)
	// An untagged thin snapshot, as an administrator would take it (27).
	if out, err := lvmCmd("lvcreate", "-y", "-s", "-n", "snap-foreign", vg+"/thin-foreign"); err != nil {
		t.Fatalf("lvcreate snapshot: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = lvmCmd("lvremove", "-y", vg+"/snap-foreign") })

	_, err := p.CreateSnapshot(ctx, storage.SnapshotRequest{Name: "snap-x", Replica: "thin-foreign"})
	wantKind(t, err, storage.ErrNotOwned, "refusing")
	wantKind(t, p.DeleteSnapshot(ctx, "snap-foreign"), storage.ErrNotOwned, "refusing")
	if got, err := p.ListSnapshots(ctx, ""); err != nil || len(got) != 0 {
		t.Fatalf("ListSnapshots = %+v, %v; want none of ours", got, err)
	}
	if !lvExists(t, "snap-foreign") || lvExists(t, "snap-x") {
		t.Fatal("the foreign snapshot was touched, or a snapshot of a foreign volume was taken")
	}
}

func writeData(t *testing.T, path string, n int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := bytes.Repeat([]byte{0xa5}, int(mib))
	for off := int64(0); off < n; off += mib {
		if _, err := f.Write(buf); err != nil {
			t.Fatalf("write %s at %d: %v", path, off, err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync %s: %v", path, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// An inactive pool reports no data_percent; Capacity must refuse to guess
// rather than call it empty. Runs last: it deactivates the shared pool.
func TestThinCapacityOfInactivePool(t *testing.T) {
	p := thin(t)
	if vols, err := p.List(ctx); err != nil || len(vols) != 0 {
		t.Fatalf("thin volumes left by earlier tests keep the pool active: %+v, %v", vols, err)
	}
	if out, err := lvmCmd("lvchange", "-an", vg+"/"+pool); err != nil {
		t.Fatalf("lvchange -an: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := lvmCmd("lvchange", "-ay", vg+"/"+pool); err != nil {
			t.Errorf("lvchange -ay: %v\n%s", err, out)
		}
	})
	_, err := p.Capacity(ctx)
	wantKind(t, err, storage.ErrFailedPrecondition, "is it active?")
}
