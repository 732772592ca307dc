package file

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/meshvol/meshvol/pkg/storage"
)

// A pool of plain files (NewFiles) gives each volume its file as its device and
// attaches no loop device; a volume whose file is locked, as drbdsim locks the
// backing file it has attached, is in use: Delete refuses it and leaves the file.
func TestPlainFilesPool(t *testing.T) {
	dir := t.TempDir()
	p, err := NewFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	v := mustCreate(t, p, "rvr-a", 3*mib+1)
	path := filepath.Join(p.dir, "rvr-a.img")
	if v.DevicePath != path || v.SizeBytes != 4*mib {
		t.Fatalf("Create = %+v, want the file %s as its device, %d bytes", v, path, 4*mib)
	}
	if os.Geteuid() == 0 {
		if _, bound, err := findLoop(path); err != nil || bound {
			t.Fatalf("a loop device is bound to %s (%v)", path, err)
		}
	}
	if g, err := p.Get(ctx, "rvr-a"); err != nil || g.DevicePath != path {
		t.Fatalf("Get = %+v, %v", g, err)
	}
	if r, err := p.Resize(ctx, "rvr-a", 6*mib); err != nil || r.SizeBytes != 6*mib || r.DevicePath != path {
		t.Fatalf("Resize = %+v, %v", r, err)
	}
	if vols, err := p.List(ctx); err != nil || len(vols) != 1 || vols[0].DevicePath != path {
		t.Fatalf("List = %+v, %v", vols, err)
	}

	fd, err := unix.Open(path, unix.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	wantKind(t, p.Delete(ctx, "rvr-a"), storage.ErrInUse)
	unix.Close(fd)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("file removed while locked: %v", err)
	}
	if err := p.Delete(ctx, "rvr-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("file still there after Delete: %v", err)
	}

	// One directory is one kind of pool in a process.
	if _, err := New(dir); !errors.Is(err, storage.ErrFailedPrecondition) {
		t.Fatalf("New of a directory NewFiles made a pool of: %v, want %v", err, storage.ErrFailedPrecondition)
	}
}
