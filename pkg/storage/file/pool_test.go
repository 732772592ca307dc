package file

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/meshvol/meshvol/pkg/storage"
)

// These tests use real loop devices: they need root and /dev/loop-control.
// Every loop device bound to a file under the test's directory is detached in
// t.Cleanup, whatever the test did, and the directory is removed by t.TempDir.

const mib = int64(1) << 20

var ctx = context.Background()

func newPool(t *testing.T) *Pool {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loop devices need root")
	}
	if _, err := os.Stat(loopControl); err != nil {
		t.Skipf("no %s: %v", loopControl, err)
	}
	dir := t.TempDir()
	p, err := New(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { detachAllUnder(t, p.dir) })
	return p
}

func detachAllUnder(t *testing.T, dir string) {
	devs, err := backingFiles(context.Background())
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	for path, d := range devs {
		if strings.HasPrefix(path, dir+"/") {
			exec.Command("umount", d.path).Run() // a test that failed mid-mount
			if err := detach(d); err != nil {
				t.Errorf("cleanup: detach %s (%s): %v", d.path, path, err)
			}
		}
	}
}

// findLoop scans every loop device of the machine for the one bound to path:
// the truth a test checks the pool's index against.
func findLoop(path string) (loopDev, bool, error) {
	devs, err := backingFiles(context.Background())
	if err != nil {
		return loopDev{}, false, err
	}
	d, ok := devs[path]
	if !ok {
		return loopDev{}, false, nil
	}
	bound, err := boundTo(d, path)
	return d, bound && err == nil, err
}

func wantKind(t *testing.T, err, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("error = %v, want kind %v", err, kind)
	}
}

func mustCreate(t *testing.T, p *Pool, replica string, size int64) storage.Volume {
	t.Helper()
	v, err := p.Create(ctx, storage.CreateRequest{Replica: replica, SizeBytes: size})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestCreateAttachesSparseMarkedFile(t *testing.T) {
	p := newPool(t)
	v := mustCreate(t, p, "rvr-a", 10*mib+1) // rounds up to 11 MiB
	if v.SizeBytes != 11*mib || !strings.HasPrefix(v.DevicePath, "/dev/loop") || v.Replica != "rvr-a" || v.Name != "rvr-a.img" {
		t.Fatalf("got %+v", v)
	}
	path := filepath.Join(p.dir, "rvr-a.img")
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 >= st.Size {
		t.Fatalf("file is not sparse: %d bytes allocated for %d", st.Blocks*512, st.Size)
	}
	if got, _ := owner(path); got != "rvr-a" {
		t.Fatalf("owner xattr %q", got)
	}
	d, found, err := findLoop(path)
	if err != nil || !found || d.path != v.DevicePath {
		t.Fatalf("findLoop = %+v %v %v", d, found, err)
	}
	// No temporary files left behind.
	entries, _ := os.ReadDir(p.dir)
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries, want 1", len(entries))
	}
}

func TestCreateIsIdempotentAndRestartSafe(t *testing.T) {
	p := newPool(t)
	v1 := mustCreate(t, p, "rvr-a", 8*mib)
	v2 := mustCreate(t, p, "rvr-a", 8*mib)
	if v1 != v2 {
		t.Fatalf("second create %+v differs from first %+v", v2, v1)
	}
	// A restarted agent: a new Pool on the same directory finds the device.
	q, err := New(context.Background(), p.dir)
	if err != nil {
		t.Fatal(err)
	}
	g, err := q.Get(ctx, "rvr-a")
	if err != nil || g != v1 {
		t.Fatalf("Get after restart = %+v, %v; want %+v", g, err, v1)
	}
	if v3 := mustCreate(t, q, "rvr-a", 4*mib); v3 != v1 {
		t.Fatalf("create after restart = %+v, want the same device %+v", v3, v1)
	}
	_, err = q.Create(ctx, storage.CreateRequest{Replica: "rvr-a", SizeBytes: 9 * mib})
	wantKind(t, err, storage.ErrAlreadyExists)

	// After a reboot the loop device is gone: Get says so, Create re-attaches.
	d, _, _ := findLoop(filepath.Join(p.dir, "rvr-a.img"))
	if err := detach(d); err != nil {
		t.Fatal(err)
	}
	g, err = q.Get(ctx, "rvr-a")
	if err != nil || g.DevicePath != "" || g.SizeBytes != 8*mib {
		t.Fatalf("Get while detached = %+v, %v", g, err)
	}
	if v4 := mustCreate(t, q, "rvr-a", 8*mib); v4.DevicePath == "" || v4.SizeBytes != 8*mib {
		t.Fatalf("re-attach = %+v", v4)
	}
}

// TestRestartFindsDevicesAttachedThroughAnotherMount: an agent in a pod
// attaches through the pod's mount of the pool; once that pod is gone, sysfs
// names the backing file relative to that unreachable mount. The next
// agent, on the pool's own directory, still finds the device DRBD holds.
func TestRestartFindsDevicesAttachedThroughAnotherMount(t *testing.T) {
	// The pool in a directory of its own, below newPool's: New indexes a
	// directory once per process, and the next agent's index must be made
	// after the device exists, as in its own process.
	p := newPool(t)
	dir := filepath.Join(p.dir, "pool")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	podMount := t.TempDir()
	if out, err := exec.Command("mount", "--bind", dir, podMount).CombinedOutput(); err != nil {
		t.Skipf("bind mount: %v: %s", err, out)
	}
	unmounted := false
	t.Cleanup(func() {
		if !unmounted {
			exec.Command("umount", "-l", podMount).Run()
		}
	})
	old, err := New(context.Background(), podMount)
	if err != nil {
		t.Fatal(err)
	}
	v := mustCreate(t, old, "rvr-a", 8*mib)
	t.Cleanup(func() {
		if d := (loopDev{path: v.DevicePath}); d.path != "" {
			fmt.Sscanf(strings.TrimPrefix(d.path, "/dev/loop"), "%d", &d.index)
			if err := detach(d); err != nil {
				t.Errorf("cleanup: detach %s: %v", d.path, err)
			}
		}
	})
	if out, err := exec.Command("umount", "-l", podMount).CombinedOutput(); err != nil {
		t.Fatalf("umount -l %s: %v: %s", podMount, err, out)
	}
	unmounted = true
	shown, err := os.ReadFile("/sys/block/" + strings.TrimPrefix(v.DevicePath, "/dev/") + "/loop/backing_file")
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(string(shown), dir+"/") {
		t.Fatalf("sysfs names the file %q, inside the pool's own directory: the case is not made", shown)
	}
	q, err := New(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	g, err := q.Get(ctx, "rvr-a")
	if err != nil || g.DevicePath != v.DevicePath {
		t.Fatalf("Get by the next agent (sysfs names the file %q) = %+v, %v; want device %s", strings.TrimSpace(string(shown)), g, err, v.DevicePath)
	}
	if c := mustCreate(t, q, "rvr-a", 8*mib); c.DevicePath != v.DevicePath {
		t.Fatalf("Create by the next agent attached %s again; DRBD holds %s", c.DevicePath, v.DevicePath)
	}
}

func TestFilesNotOursAreRefusedUntouched(t *testing.T) {
	p := newPool(t)
	foreign := filepath.Join(p.dir, "rvr-x.img")
	if err := os.WriteFile(foreign, []byte("someone else's data"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(p.dir, "rvr-y.img")
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(other, ownerXattr, []byte("rvr-z"), 0); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"rvr-x", "rvr-y"} {
		_, err := p.Create(ctx, storage.CreateRequest{Replica: name, SizeBytes: mib})
		wantKind(t, err, storage.ErrNotOwned)
		wantKind(t, p.Delete(ctx, name), storage.ErrNotOwned)
		_, err = p.Resize(ctx, name, 2*mib)
		wantKind(t, err, storage.ErrNotOwned)
		_, err = p.Get(ctx, name)
		wantKind(t, err, storage.ErrNotOwned)
	}
	if data, _ := os.ReadFile(foreign); string(data) != "someone else's data" {
		t.Fatal("foreign file changed")
	}
	if _, found, _ := findLoop(foreign); found {
		t.Fatal("foreign file attached")
	}
	if vols, err := p.List(ctx); err != nil || len(vols) != 0 {
		t.Fatalf("List = %+v, %v; want none", vols, err)
	}
}

func TestResize(t *testing.T) {
	p := newPool(t)
	mustCreate(t, p, "rvr-a", 8*mib)
	v, err := p.Resize(ctx, "rvr-a", 16*mib)
	if err != nil || v.SizeBytes != 16*mib {
		t.Fatalf("grow = %+v, %v", v, err)
	}
	if v, err = p.Resize(ctx, "rvr-a", 16*mib); err != nil || v.SizeBytes != 16*mib {
		t.Fatalf("same size = %+v, %v", v, err)
	}
	_, err = p.Resize(ctx, "rvr-a", 4*mib)
	wantKind(t, err, storage.ErrShrinkNotSupported)
	_, err = p.Resize(ctx, "rvr-b", 4*mib)
	wantKind(t, err, storage.ErrNotFound)
}

// mkfs.ext4 on the device works, and data written through a mounted file
// system survives growing the volume and the file system.
func TestExt4SurvivesResize(t *testing.T) {
	for _, tool := range []string{"mkfs.ext4", "resize2fs", "e2fsck", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	p := newPool(t)
	v := mustCreate(t, p, "rvr-fs", 32*mib)
	run(t, "mkfs.ext4", "-q", "-F", v.DevicePath)
	mnt := t.TempDir()
	run(t, "mount", v.DevicePath, mnt)
	mounted := true
	t.Cleanup(func() {
		if mounted {
			exec.Command("umount", mnt).Run()
		}
	})
	data := make([]byte, 3*mib)
	rand.Read(data)
	if err := os.WriteFile(filepath.Join(mnt, "data"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	// While mounted the device is held exclusively: Delete must refuse.
	wantKind(t, p.Delete(ctx, "rvr-fs"), storage.ErrInUse)
	run(t, "umount", mnt)
	mounted = false

	if _, err := p.Resize(ctx, "rvr-fs", 64*mib); err != nil {
		t.Fatal(err)
	}
	run(t, "e2fsck", "-f", "-y", v.DevicePath)
	run(t, "resize2fs", v.DevicePath)
	run(t, "mount", v.DevicePath, mnt)
	mounted = true
	got, err := os.ReadFile(filepath.Join(mnt, "data"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("data after resize: %d bytes, err %v, equal %v", len(got), err, bytes.Equal(got, data))
	}
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	if fsSize := int64(st.Blocks) * st.Bsize; fsSize <= 32*mib {
		t.Fatalf("file system is %d bytes after resize2fs, want more than 32 MiB", fsSize)
	}
	run(t, "umount", mnt)
	mounted = false
	if err := p.Delete(ctx, "rvr-fs"); err != nil {
		t.Fatal(err)
	}
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func TestDelete(t *testing.T) {
	p := newPool(t)
	v := mustCreate(t, p, "rvr-a", 4*mib)
	// Held exclusively, as DRBD holds its backing disk: refused, nothing changed.
	fd, err := unix.Open(v.DevicePath, unix.O_RDONLY|unix.O_EXCL, 0)
	if err != nil {
		t.Fatal(err)
	}
	wantKind(t, p.Delete(ctx, "rvr-a"), storage.ErrInUse)
	unix.Close(fd)
	if g, err := p.Get(ctx, "rvr-a"); err != nil || g.DevicePath != v.DevicePath {
		t.Fatalf("after refused delete: %+v, %v", g, err)
	}
	if err := p.Delete(ctx, "rvr-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(p.dir, "rvr-a.img")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("file still there: %v", err)
	}
	devs, _ := backingFiles(context.Background())
	for path := range devs {
		if strings.HasPrefix(path, p.dir) {
			t.Fatalf("loop device still bound to %s", path)
		}
	}
	if err := p.Delete(ctx, "rvr-a"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
}

func TestListAndCapacity(t *testing.T) {
	p := newPool(t)
	mustCreate(t, p, "rvr-b", 2*mib)
	mustCreate(t, p, "rvr-a", 3*mib)
	if err := os.WriteFile(filepath.Join(p.dir, "stray.img"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	vols, err := p.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(vols) != 2 || vols[0].Replica != "rvr-a" || vols[1].Replica != "rvr-b" || vols[0].DevicePath == "" || vols[0].SizeBytes != 3*mib {
		t.Fatalf("List = %+v", vols)
	}
	if names, err := p.Names(ctx); err != nil || strings.Join(names, ",") != "rvr-a,rvr-b" {
		t.Fatalf("Names = %v, %v; want List's replicas", names, err)
	}
	c, err := p.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(p.dir, &st); err != nil {
		t.Fatal(err)
	}
	if c.TotalBytes != int64(st.Blocks)*st.Bsize || c.FreeBytes <= 0 || c.FreeBytes > c.TotalBytes || c.ProvisionedBytes != 5*mib {
		t.Fatalf("Capacity = %+v", c)
	}
}

func TestBadInput(t *testing.T) {
	p := newPool(t)
	for _, tc := range []struct {
		req  storage.CreateRequest
		kind error
	}{
		{storage.CreateRequest{Replica: "../etc", SizeBytes: mib}, storage.ErrInvalidName},
		{storage.CreateRequest{Replica: ".hidden", SizeBytes: mib}, storage.ErrInvalidName},
		{storage.CreateRequest{Replica: "a/b", SizeBytes: mib}, storage.ErrInvalidName},
		{storage.CreateRequest{Replica: "", SizeBytes: mib}, storage.ErrInvalidName},
		{storage.CreateRequest{Replica: "rvr-a", SizeBytes: 0}, storage.ErrInvalidArgument},
	} {
		_, err := p.Create(ctx, tc.req)
		wantKind(t, err, tc.kind)
	}
	_, err := New(context.Background(), filepath.Join(p.dir, "missing"))
	wantKind(t, err, storage.ErrPoolNotFound)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = p.Create(cctx, storage.CreateRequest{Replica: "rvr-a", SizeBytes: mib})
	wantKind(t, err, storage.ErrTimeout)
}

// A plain (non-exclusive) opener makes the kernel defer the detach until it
// closes. Delete reports ErrInUse and keeps the file; once the opener is gone
// the device has detached itself and Delete finishes.
func TestDeleteWhileOpenIsDeferred(t *testing.T) {
	p := newPool(t)
	v := mustCreate(t, p, "rvr-a", 4*mib)
	fd, err := unix.Open(v.DevicePath, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = p.Delete(ctx, "rvr-a")
	unix.Close(fd)
	wantKind(t, err, storage.ErrInUse)
	if _, err := os.Stat(filepath.Join(p.dir, "rvr-a.img")); err != nil {
		t.Fatalf("file removed while its device was open: %v", err)
	}
	if err := p.Delete(ctx, "rvr-a"); err != nil {
		t.Fatal(err)
	}
	if _, found, _ := findLoop(filepath.Join(p.dir, "rvr-a.img")); found {
		t.Fatal("still attached")
	}
}

// Capacity keeps ProvisionedBytes from what the pool itself created, resized
// and deleted, without a scan of the directory between (a Lease renewal asks
// every few seconds).
func TestCapacityFollowsChanges(t *testing.T) {
	p := newPool(t)
	provisioned := func(want int64) {
		t.Helper()
		c, err := p.Capacity(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if c.ProvisionedBytes != want {
			t.Fatalf("ProvisionedBytes = %d, want %d", c.ProvisionedBytes, want)
		}
	}
	provisioned(0)
	mustCreate(t, p, "rvr-a", 2*mib)
	provisioned(2 * mib)
	if _, err := p.Resize(ctx, "rvr-a", 3*mib); err != nil {
		t.Fatal(err)
	}
	provisioned(3 * mib)
	mustCreate(t, p, "rvr-b", mib)
	provisioned(4 * mib)
	if err := p.Delete(ctx, "rvr-a"); err != nil {
		t.Fatal(err)
	}
	provisioned(mib)
	if err := p.Delete(ctx, "rvr-b"); err != nil {
		t.Fatal(err)
	}
}
